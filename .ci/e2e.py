#!/usr/bin/env python3
"""End-to-end: real Claude Code and Codex turns, offline, against a local mock model.

    make e2e                          # installs both harnesses, runs this, cleans up
    python3 .ci/e2e.py [--only NAME[,NAME...]] [--list] [--keep] [--npm-bin DIR] [-v]

Each case is SCENARIO/MODE, e.g. c-midturn-signal/codex-exec; --only matches any
part of it ("c-midturn", "claude-tui", "d-hold-once/claude-p").  Modes:
claude-p (claude -p, default permission mode), claude-tui (interactive claude
in tmux, its default mode: "auto" in 2.1.332), claude-tui-skip (the same with
--dangerously-skip-permissions), codex-exec (codex exec), codex-tui
(interactive codex in tmux).

Every harness run starts from what a user has: its own HOME, git repository
set up with `agents_room.py setup claude|codex --write`, CODEX_HOME and
AGENTS_ROOM_DB, and nothing else but what is about the mock (Claude Code's
onboarding done and its API key approved; Codex's model provider) and the
one-time steps the README tells a user, taken as a user takes them:
  * claude (TUI): "Yes, I trust this folder" in its trust dialog (and, with
    --dangerously-skip-permissions, "Yes, I accept" in the Bypass Permissions
    warning), driven through tmux; claude -p runs untrusted, setup alone;
  * codex (TUI): "Trust and continue" for the folder and "Trust all and
    continue" for the new hooks, through tmux; codex exec runs its hooks with
    --dangerously-bypass-hook-trust.
A TUI case fails on any dialog on screen after that start (the MCP server
approval, a held message from another session, a trust dialog again).  Each
talks only to .ci/mock_model.py on 127.0.0.1, which records each request body
(the assertions are on what the model was shown) and refuses to send a
scripted call of a tool the request did not offer.  A peer session (the CLI:
join, send, sent) plays the other agent.  Prints a PASS/FAIL table and the
E2E-ROW lines of the README's truth table (.ci/e2e_report.py); exits 1 on any
FAIL.  Standard library only; needs node, npm-installed `claude` and `codex`
on --npm-bin, git and tmux.

Scenarios (setup --autonomy in brackets):
  a-digest [0]            the SessionStart digest, with the session id, is in the first request
  b-mcp-session [0]       room_join and msg_recv over MCP act on the digest's session; `who`
                          shows no second (orphan) session; a peer's message comes framed
                          as other agents' words
  c-midturn-signal [0]    a message sent while the harness works shows up in a later request as
                          the one-line signal, never with its subject or body
  d-hold-once [1]         the end of a turn with unread mail is held once (the continuation
                          carries the signal), not again next turn; d-hold-ui: the hold is not
                          shown as an error and shows no hook command line
  e1/e2-wake-* [2]        (TUIs) a send wakes an idle session before / after its first turn
                          with exactly one model call, the delivery accepted once that turn
                          is seen; /exit then leaves no process; the latency is reported
  e3-wake-finished-run [2] a send to a finished codex exec run resumes it (codex exec resume)
                          with the agents-room tools; a finished claude -p run has no lever:
                          nothing runs, and its next --resume is told
  e4-wake-by-inbox [1->2] (claude TUI) autonomy raised in-session (room_join), so no rewake
                          waiter is installed: Claude Code's inbox socket wakes it, one call
  f-oneshot-exits [2]     claude -p / codex exec exit and print their result
  g-resume-keeps-rooms    a shared room joined in-session survives SessionEnd + resume
  h-sent-states [2]       the sender's delivery states: never undeliverable for a signalled
                          message, read after msg_recv, and no stale wake afterwards
  i-idle-watch [0]        a peer's notify-when idle, set while the session works, tells it
                          once when the turn ends (TUIs: not again after a second turn)
"""

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from mock_model import Call, MockModel, Reply  # noqa: E402

from e2e_common import (  # noqa: E402
    drop_ci_markers, Failure, SIGNAL_RE, Skip, check, file_sha, kill_group, one_line,
    signal_line)

drop_ci_markers()

AR = os.path.join(ROOT, "agents_room.py")
MODES = ("claude-p", "claude-tui", "codex-exec", "codex-tui")   # what most scenarios run
TUIS = {"claude-tui": "claude", "claude-tui-skip": "claude --dangerously-skip-permissions",
        "codex-tui": "codex"}
# Dialogs no user should meet once the one-time steps are done (a held message
# needs a person; Enter on the MCP dialog rejects the server for good).
DIALOGS = {"claude": ("New MCP server found", "new MCP servers found",
                      "Held message from another session", "Yes, I trust this folder",
                      "Bypass Permissions mode"),
           "codex": ("Trust this folder?", "Hooks need review")}
WAKE_QUIET_S = 4.0      # after a woken request, a second lever's turn would show by then
SHARED = "e2e-shared"
SECRET_SUBJECT = "E2E-SECRET-SUBJECT"
SECRET_BODY = "E2E-SECRET-BODY"
PEER_FRAME = "[agents-room: other agents' words"     # agents_room.PEER_TEXT_NOTE's start
VERBOSE = False


def log(text):
    if VERBOSE:
        sys.stderr.write("  . %s\n" % text)
        sys.stderr.flush()


def claude_mode(mode):
    return mode.startswith("claude")


def tui_mode(mode):
    return "-tui" in mode


# ---- the world of one case ---------------------------------------------------

class Box:
    """A temporary HOME, a git repository `proj`, a store, the harness configured
    by agents_room.py setup, a peer session, and the shared mock."""

    def __init__(self, suite, case, mode, autonomy=0):
        self.suite, self.mode, self.autonomy = suite, mode, autonomy
        self.name = re.sub(r"[^a-z0-9]+", "-", case.lower()).strip("-")
        self.dir = os.path.join(suite.root, self.name)
        self.home = os.path.join(self.dir, "home")
        self.repo = os.path.join(self.dir, "proj")
        self.db = os.path.join(self.dir, "store", "room.db")
        if suite.pg_url:
            # The same case on PostgreSQL: a schema of its own in --db's database.
            schema = "e2e_%s" % re.sub(r"[^a-z0-9]+", "_", self.name)
            admin = _agents_room().PgConnection(suite.pg_url)
            admin.simple("DROP SCHEMA IF EXISTS %s CASCADE; CREATE SCHEMA %s"
                         % (schema, schema))
            admin.close()
            self.db = suite.pg_url + ("&" if "?" in suite.pg_url else "?") + \
                "options=-csearch_path%3D" + schema
        self.codex_home = os.path.join(self.home, ".codex")
        self.tmux = None
        self.peer_sid = None
        self.notes = []
        self.dialogs_met = []       # the first-run dialogs accepted, in order
        self.dialog_seen = None     # (marker, screen) of a dialog after the start
        self.watching = None
        self.mock = suite.mock
        self.mock.reset()
        for path in (self.home, self.repo, self.codex_home):
            os.makedirs(path, exist_ok=True)
        self.env = self._env()
        git = ["git", "-c", "user.name=e2e", "-c", "user.email=e2e@localhost"]
        subprocess.run(git + ["init", "-q", self.repo], check=True)
        with open(os.path.join(self.repo, "README"), "w") as handle:
            handle.write("e2e\n")
        subprocess.run(git + ["-C", self.repo, "add", "README"], check=True)
        subprocess.run(git + ["-C", self.repo, "commit", "-qm", "init"], check=True)
        if claude_mode(mode):
            self._setup_claude()
        else:
            self._setup_codex()

    def _env(self):
        drop = ("CLAUDE", "CODEX_", "ANTHROPIC", "OPENAI", "AGENTS_ROOM", "TMUX")
        env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
        env.update({
            "HOME": self.home,
            "PATH": self.suite.npm_bin + os.pathsep + env.get("PATH", "/usr/bin:/bin"),
            "AGENTS_ROOM_DB": self.db,
            "AGENTS_ROOM_E2E_BOX": self.dir,      # marks every process of this case
            "CODEX_HOME": self.codex_home,
            "IS_SANDBOX": "1",
            "ANTHROPIC_BASE_URL": self.mock.url,
            "ANTHROPIC_API_KEY": "sk-ant-e2e-dummy-key-0000000000",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "TERM": "xterm-256color",
            "LANG": env.get("LANG", "C.UTF-8"),
        })
        return env

    def _setup_claude(self):
        # About the mock only: onboarding done, the dummy API key approved.  No
        # trust, no MCP approval, no bypass acceptance: setup writes its part,
        # the TUI cases take the README's one step through the TUI.
        key = self.env["ANTHROPIC_API_KEY"]
        state = {
            "hasCompletedOnboarding": True, "numStartups": 5, "autoUpdates": False,
            "theme": "dark",
            "customApiKeyResponses": {"approved": [key[-20:]], "rejected": []},
        }
        with open(os.path.join(self.home, ".claude.json"), "w") as handle:
            json.dump(state, handle)
        self.setup("claude")

    def _setup_codex(self):
        # The mock as the model provider; no folder or hook trust (the TUI
        # cases trust both in its dialogs, codex exec bypasses hook trust).
        with open(os.path.join(self.codex_home, "config.toml"), "w") as handle:
            handle.write(
                'model = "mock-model"\nmodel_provider = "mock"\n'
                'approval_policy = "never"\nsandbox_mode = "danger-full-access"\n\n'
                '[model_providers.mock]\nname = "Mock"\nbase_url = "%s/v1"\n'
                'wire_api = "responses"\nrequest_max_retries = 0\nstream_max_retries = 0\n'
                % self.mock.url)
        self.setup("codex")

    def setup(self, harness):
        argv = [sys.executable, AR, "setup", harness, "--write"]
        if self.autonomy:
            argv += ["--autonomy", str(self.autonomy)]
        done = subprocess.run(argv, cwd=self.repo, env=self.env, capture_output=True,
                              text=True, timeout=60)
        if done.returncode != 0:
            raise Failure("setup %s failed: %s" % (harness, done.stderr.strip()[-300:]))

    # -- agents-room CLI, as the peer or as an observer
    def ar(self, *args, check_rc=True):
        done = subprocess.run([sys.executable, AR] + list(args), cwd=self.dir, env=self.env,
                              capture_output=True, text=True, timeout=60)
        if check_rc and done.returncode != 0:
            raise Failure("agents_room.py %s failed: %s" % (" ".join(args[:2]),
                                                            done.stderr.strip()[-300:]))
        try:
            return json.loads(done.stdout)
        except ValueError:
            return done.stdout

    def peer(self):
        if self.peer_sid is None:
            joined = self.ar("join", "--room", "repo:proj", "--also", SHARED, "--label", "peer",
                             "--harness-key", "e2e-peer", "--json")
            self.peer_sid = joined["session_id"]
        return self.peer_sid

    def send(self, to):
        return self.ar("send", "--session", self.peer(), "--to", to, "--subject",
                       SECRET_SUBJECT, "--body", SECRET_BODY, "--json")

    def states(self):
        """The peer's view: [state] of every delivery it sent."""
        sent = self.ar("sent", "--session", self.peer(), "--json")
        return [d["state"] for m in sent.get("messages", []) for d in m.get("deliveries", [])]

    def sessions(self, room=None):
        """Sessions `who` lists (in a room), the peer left out."""
        args = ["who", "--json"] + (["--room", room] if room else [])
        found = self.ar(*args, check_rc=False)
        if not isinstance(found, dict):
            return []
        return [s for s in found.get("sessions", []) if s["session_id"] != self.peer_sid
                and s.get("label") != "peer"]

    def harness_key(self, sid):
        store = _agents_room().open_store(self.db)
        try:
            row = store.conn.execute("SELECT harness_key FROM sessions WHERE id=?",
                                     (sid,)).fetchone()
        finally:
            store.close()
        return row[0] if row else None

    def wake_events(self, session):
        """[(kind, lever)] of the session's wake events, oldest first: which
        lever was tried, armed, accepted (lever "turn": its turn was seen)."""
        store = _agents_room().open_store(self.db)
        try:
            rows = store.conn.execute(
                "SELECT kind, data FROM events WHERE session_id=? AND kind LIKE 'wake.%%' "
                "ORDER BY id", (session["session_id"],)).fetchall()
        finally:
            store.close()
        out = []
        for kind, data in rows:
            try:
                data = json.loads(data or "{}")
            except ValueError:
                data = {}
            out.append((kind, data.get("lever") if isinstance(data, dict) else None))
        return out

    def wait_session(self, timeout):
        """The harness's agents-room session (after SessionStart), or None."""
        end = time.time() + timeout
        while time.time() < end:
            if self.suite.pg_url or os.path.exists(self.db):
                found = self.sessions()
                if found:
                    return found[0]
            time.sleep(0.5)
        return None

    # -- one-shot runs: claude -p / codex exec
    def oneshot(self, prompt, resume=None, timeout=45, done=None, quiet=3.0):
        """Run a turn to completion.  Returns dict(rc, out, err, elapsed, hung, id).
        With done(): once done() holds and no request came for `quiet` s, a
        process still running is killed and reported hung."""
        if claude_mode(self.mode):
            # The default permission mode in a folder never trusted: setup's
            # allow rule (in the local settings) is what lets the tools run.
            argv = ["claude", "-p", prompt, "--output-format", "json"] + (
                ["--resume", resume] if resume else [])
        elif resume:
            argv = ["codex", "exec", "resume", "--dangerously-bypass-hook-trust", "--json",
                    resume, prompt]
        else:
            argv = ["codex", "exec", "--dangerously-bypass-hook-trust", "--json", prompt]
        log("run %s" % " ".join(argv[:4]))
        out_path = os.path.join(self.dir, "run-%d.out" % time.time_ns())
        with open(out_path, "w") as out, open(out_path + ".err", "w") as err:
            proc = subprocess.Popen(argv, cwd=self.repo, env=self.env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=err, start_new_session=True)
            start = time.time()
            hung = False
            while proc.poll() is None:
                now = time.time()
                if now - start > timeout:
                    hung = True
                    break
                if done is not None and done():
                    last = max([r.at for r in self.mock.model_calls(main_only=False)] or [start])
                    if now - last > quiet:
                        hung = True
                        break
                time.sleep(0.2)
            elapsed = time.time() - start
            if hung:
                kill_group(proc)
        with open(out_path) as handle:
            out_text = handle.read()
        with open(out_path + ".err") as handle:
            err_text = handle.read()
        return {"rc": proc.returncode, "out": out_text, "err": err_text, "elapsed": elapsed,
                "hung": hung, "id": self._run_id(out_text)}

    def _run_id(self, out):
        for line in out.splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if isinstance(item, dict):
                if item.get("type") == "result" and item.get("session_id"):
                    return item["session_id"]
                if item.get("type") == "thread.started":
                    return item.get("thread_id")
        return None

    # -- interactive runs in tmux
    def tui_start(self):
        """Start the TUI and take the README's one-time steps in its own
        dialogs, as a user would; fail on a dialog no user should meet.
        Then watch the screen until the case ends."""
        self.tmux = "e2e-%s" % self.name[-40:]
        envfile = os.path.join(self.dir, "env.sh")
        with open(envfile, "w") as handle:
            for key, value in sorted(self.env.items()):
                handle.write("export %s=%s\n" % (key, shlex.quote(value)))
        command = "bash --norc --noprofile -c %s" % shlex.quote(
            ". %s; cd %s && exec %s" % (shlex.quote(envfile), shlex.quote(self.repo),
                                        TUIS[self.mode]))
        self.suite.tmux("new-session", "-d", "-s", self.tmux, "-x", "160", "-y", "50",
                        command)
        steps = ((("Yes, I trust this folder",), "Yes, I trust this folder", "trust"),
                 (("Bypass Permissions mode", "Yes, I accept"), "Yes, I accept",
                  "bypass warning"),
                 (("Trust this folder?",), "Trust and continue", "trust"),
                 (("Hooks need review",), "Trust all and continue", "hook trust"))
        end = time.time() + 45
        ready_since = None
        while time.time() < end:
            screen = self.visible()
            step = next((s for s in steps if all(m in screen for m in s[0])), None)
            if step is not None:
                if self.dialogs_met.count(step[2]) >= 2:
                    raise Failure("the %s dialog came back after it was answered; screen:"
                                  "\n%s" % (step[2], screen))
                self.dialogs_met.append(step[2])
                if not self.choose(step[1]):
                    raise Failure("cannot pick %r in the %s dialog; screen:\n%s"
                                  % (step[1], step[2], self.visible()))
                time.sleep(1.0)
                continue
            bad = self.forbidden(screen)
            if bad:
                raise Failure("at start the TUI shows %r, a dialog setup should have made "
                              "unneeded (dialogs answered: %s); screen:\n%s"
                              % (bad, self.dialogs_met or "none", screen))
            if not self.ready(screen):
                ready_since = None
            elif ready_since is None:
                ready_since = time.time()
            elif time.time() - ready_since > 1.5:
                # Ready and still so: a dialog may come up over a prompt
                # that was drawn first (Codex's folder trust does).
                break
            time.sleep(0.4)
        else:
            raise Failure("the TUI did not become ready in 45 s (dialogs answered: %s); "
                          "screen:\n%s" % (self.dialogs_met or "none", self.visible()))
        want = "trust" if claude_mode(self.mode) else "hook trust"
        if want not in self.dialogs_met:
            self.notes.append("no %s dialog met" % want)
        self.watch()

    def ready(self, screen):
        lines = [l for l in screen.splitlines() if l.strip()]
        if claude_mode(self.mode):
            # The prompt box near the bottom, its mode/shortcuts line under it
            # (a dialog's options are marked with the same arrow).
            return any(l.lstrip().startswith("\u276f") for l in lines[-6:]) and any(
                m in screen for m in ("for shortcuts", "mode on", "permissions on",
                                      "for agents"))
        # Codex draws its session card and prompt first and puts the folder
        # trust dialog over them seconds later; the card's "permissions:"
        # line comes only once the folder's trust is settled.
        return "OpenAI Codex (v" in screen and "permissions:" in screen and any(
            l.lstrip().startswith("\u203a") for l in lines[-6:])

    def forbidden(self, screen):
        marks = DIALOGS["claude" if claude_mode(self.mode) else "codex"]
        return next((m for m in marks if m in screen), None)

    def choose(self, label):
        """Move a dialog's cursor to the option containing label, then Enter."""
        for _ in range(12):
            lines = self.visible().splitlines()
            cursor = [i for i, l in enumerate(lines)
                      if l.lstrip()[:1] in ("\u276f", "\u203a")]
            target = [i for i, l in enumerate(lines) if label in l]
            if not cursor or not target:
                time.sleep(0.3)
                continue
            if cursor[0] == target[0]:
                self.suite.tmux("send-keys", "-t", self.tmux, "Enter")
                return True
            self.suite.tmux("send-keys", "-t", self.tmux,
                            "Down" if target[0] > cursor[0] else "Up")
            time.sleep(0.3)
        return False

    def watch(self):
        """A thread that looks at the screen twice a second until cleanup and
        keeps the first dialog a user would have to answer."""
        import threading
        stop = threading.Event()

        def look():
            while not stop.wait(0.5):
                try:
                    screen = self.visible()
                except (Failure, subprocess.SubprocessError, OSError):
                    continue
                bad = self.forbidden(screen)
                if bad and self.dialog_seen is None:
                    self.dialog_seen = (bad, screen, time.time())
        thread = threading.Thread(target=look, daemon=True)
        thread.start()
        self.watching = (stop, thread)

    def unwatch(self):
        if self.watching:
            self.watching[0].set()
            self.watching[1].join(timeout=5)
            self.watching = None

    def check_no_dialog(self):
        if self.dialog_seen is not None:
            bad, screen, _ = self.dialog_seen
            shown = "\n".join(l for l in screen.splitlines() if l.strip())
            raise Failure("the TUI showed %r (a dialog the user must answer); screen:\n%s"
                          % (bad, shown[-1500:]))

    def visible(self):
        return self.suite.tmux("capture-pane", "-p", "-t", self.tmux)

    def screen(self):
        return self.suite.tmux("capture-pane", "-p", "-t", self.tmux, "-S", "-200")

    def tui_exit(self, timeout=12):
        """/exit as a user types it: the TUI must end, and with it every
        process of this case (MCP server, rewake waiter; see
        marked_processes).  Returns what is left (the screen, if the TUI
        itself is)."""
        self.unwatch()
        self.tui_send("/exit")
        end = time.time() + timeout
        while time.time() < end:
            if self.tmux and self._has_session():
                left = ["the TUI (screen: %s)" % one_line(self.visible(), 400)]
            else:
                self.tmux = None
                left = marked_processes([self.dir, self.db])
            if not left:
                break
            time.sleep(0.5)
        return left

    def _has_session(self):
        done = subprocess.run(["tmux", "-L", self.suite.socket, "has-session", "-t",
                               self.tmux], capture_output=True, timeout=10)
        return done.returncode == 0

    def tui_send(self, text):
        self.suite.tmux("send-keys", "-t", self.tmux, "-l", text)
        time.sleep(0.4)
        self.suite.tmux("send-keys", "-t", self.tmux, "Enter")

    def wait_quiet(self, at_least, quiet=2.5, settle=8.0, timeout=40):
        """Wait until >= at_least main requests were seen and none came for
        `quiet` s; with fewer, give up once none came for `settle` s."""
        start = time.time()
        while time.time() < start + timeout:
            calls = self.mock.model_calls()
            last = calls[-1].at if calls else start
            idle = time.time() - last
            if (len(calls) >= at_least and idle > quiet) or (calls and idle > settle):
                return calls
            time.sleep(0.3)
        return self.mock.model_calls()

    def cleanup(self):
        self.unwatch()
        if self.tmux:
            try:
                with open(os.path.join(self.dir, "screen.txt"), "w") as handle:
                    handle.write(self.screen())
            except (OSError, Failure, subprocess.SubprocessError):
                pass
            self.suite.tmux("kill-session", "-t", self.tmux, check=False)
            time.sleep(0.3)
        kill_marked([self.dir, self.db])


def _marked(markers):
    """{pid: command line} of the processes whose environment names one of
    `markers` (a case's dir or store): the ones this suite started."""
    wanted = [("AGENTS_ROOM_E2E_BOX=%s" % markers[0]).encode(),
              ("AGENTS_ROOM_DB=%s" % markers[-1]).encode()]
    me = os.getpid()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as handle:
                environ = handle.read().split(b"\0")
            if not any(item in wanted for item in environ):
                continue
            with open("/proc/%s/cmdline" % entry, "rb") as handle:
                found[int(entry)] = handle.read().replace(b"\0", b" ").decode(
                    "utf-8", "replace").strip()
        except OSError:
            continue
    return found


def marked_processes(markers):
    """Command lines of this case's live processes (zombies left out), but
    Codex's app-server daemon and what it runs: Codex 0.171's TUI runs its
    threads, MCP servers included, in a daemon that outlives it by design."""
    found = _marked(markers)
    out = []
    for pid, command in found.items():
        try:
            with open("/proc/%d/stat" % pid) as handle:
                fields = handle.read().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if fields[0] == "Z" or "app-server" in command or \
                "app-server" in found.get(int(fields[1]), ""):
            continue
        out.append(command[:160])
    return out


def kill_marked(markers):
    """End the processes this suite started whose environment names one of
    `markers` (a case's dir or store), by pid."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        found = list(_marked(markers))
        for pid in found:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        if not found:
            return
        time.sleep(0.5)


# ---- what the model was shown ---------------------------------------------------

def signal_in(req):
    return SIGNAL_RE.search(req.all_text())


def new_text(req, before):
    """Text in req that a previous request `before` did not have (the tail)."""
    old = before.all_text() if before is not None else ""
    text = req.all_text()
    return text[len(old):] if text.startswith(old) else _diff_tail(old, text)


def _diff_tail(old, text):
    lines_old = set(old.splitlines())
    return "\n".join(line for line in text.splitlines() if line not in lines_old)


def secrets_shown(calls):
    return [r.index for r in calls if SECRET_SUBJECT in r.all_text() or SECRET_BODY in r.all_text()]


def ar_call(mode, name, args):
    if claude_mode(mode):
        return Call("mcp__agents-room__" + name, args)
    return Call(name, args, namespace="mcp__agents_room")


def noop_call(box):
    if claude_mode(box.mode):
        # Read needs no permission in any mode (Bash would, in claude -p's
        # default mode, and auto mode may ask its classifier first).
        return Call("Read", {"file_path": os.path.join(box.repo, "README")})
    return Call("exec_command", {"cmd": "true"})


def result_texts(req):
    return [text for _, text in req.tool_results()]


def last_digest_rooms(req):
    found = re.findall(r"Rooms: ([^\n]*?)\. Autonomy", req.all_text())
    return found[-1] if found else None


def thread_id(req):
    return req.headers.get("thread-id") or req.headers.get("session-id")


# ---- scenarios ----------------------------------------------------------------
# Each returns a short detail string on success and raises Failure otherwise.

def run_turn(box, prompt, expect, timeout=45):
    """One user turn: a one-shot run, or a prompt typed into the TUI (started on
    first use).  `expect`: main requests to wait for."""
    if tui_mode(box.mode):
        if box.tmux is None:
            box.tui_start()
        box.tui_send(prompt)
        box.wait_quiet(expect, timeout=timeout)
        return None
    return box.oneshot(prompt, timeout=timeout)


def done_noting_who(box, state):
    """End the scripted turn with "done", noting who is in the room first:
    while the turn runs (a one-shot harness has ended after it)."""
    if "who" not in state:
        state["who"] = [s["session_id"] for s in box.sessions()]
    return Reply(text="done")


def s_digest(box):
    state = {}

    def script(req):
        return done_noting_who(box, state)
    box.mock.script = script
    run = run_turn(box, "hello", 1)
    calls = box.mock.model_calls()
    check(calls, "no model request at all%s" % _run_hint(run))
    sid = calls[0].session_id()
    check(sid, "the first request has no 'your session_id is <16 hex>' digest")
    check(sid in state["who"], "digest session %s is not in `who` during the turn (%s)"
          % (sid, state["who"]))
    return "session %s in first request" % sid


def s_mcp(box):
    state = {}

    def script(req):
        sid = req.session_id()
        done = len(req.tool_results())
        if sid and done == 0:
            state["sid"] = sid
            return Reply(calls=[ar_call(box.mode, "room_join", {})])
        if sid and done == 1:
            if "sent" not in state:
                state["sent"] = box.send(sid)       # a peer's words for msg_recv to frame
            return Reply(calls=[ar_call(box.mode, "msg_recv", {"session_id": sid})])
        return done_noting_who(box, state)
    box.mock.script = script
    run = run_turn(box, "join the room", 3)
    calls = box.mock.model_calls()
    check(state.get("sid"), "no digest session id reached the model%s" % _run_hint(run))
    sid = state["sid"]
    check(len(calls) >= 3, "expected 3 requests (join, recv, done), saw %d" % len(calls))
    results = result_texts(calls[-1])
    check(len(results) >= 2, "tool results missing: %r" % results)
    joined, received = results[0], results[1]
    check('"messages"' in received and "error" not in received.lower()[:200],
          "msg_recv on the digest's session failed: %s" % received[:200])
    check(SECRET_BODY in received, "msg_recv did not show the peer's message: %s"
          % received[:300])
    # The frame that tells the model these are other agents' words, not the
    # user's: a second text block, which the harness must pass on.
    check(PEER_FRAME in received, "the model got the peer's message without the frame "
          "%r; the result it saw: %s" % (PEER_FRAME, received[-300:]))
    mine = state.get("who", [])
    joined_sid = re.findall(r'"session_id":\s*"([0-9a-f]{16})"', joined)
    check(joined_sid and joined_sid[0] == sid,
          "room_join over MCP returned session %s, not the digest's %s (orphan session)"
          % (joined_sid[:1], sid))
    check(mine == [sid], "`who` lists %d harness sessions %s; expected only %s"
          % (len(mine), mine, sid))
    return "room_join -> %s, msg_recv ok (the peer's words framed), one session" % sid


def s_midturn(box):
    state = {}

    def script(req):
        sid = req.session_id()
        if sid and not req.tool_results():
            if "sent" not in state:
                state["sent"] = box.send(sid)
            return Reply(calls=[noop_call(box)])
        return Reply(text="done")
    box.mock.script = script
    run = run_turn(box, "work on something", 2)
    calls = box.mock.model_calls()
    check("sent" in state, "no digest session id reached the model%s" % _run_hint(run))
    check(state["sent"].get("recipients") == 1, "send reached %r" % state["sent"])
    check(len(calls) >= 2, "no request after the tool call%s" % _run_hint(run))
    check(not signal_in(calls[0]), "the signal was already in the first request")
    tail = new_text(calls[1], calls[0])
    match = SIGNAL_RE.search(tail)
    check(match, "the request after the tool call has no 'agents-room: N unread "
          "message' signal; new text: %r" % tail[-300:])
    leaked = secrets_shown(calls)
    check(not leaked, "subject/body rode the signal (requests %s)" % leaked)
    return "signal: %s" % signal_line(tail)[:110]


def s_hold_once(box, ui_rows=None):
    state = {"turn": 1}

    def script(req):
        sid = req.session_id()
        if sid and "sent" not in state:
            state["sent"] = box.send(sid)
        return Reply(text="done-turn%d" % state["turn"])
    box.mock.script = script
    run = run_turn(box, "first task", 2)
    first = box.mock.model_calls()
    check("sent" in state, "no digest reached the model%s" % _run_hint(run))
    if run is not None:
        check(not run["hung"], "the first run did not end")
    check(len(first) >= 2, "the end of the turn was not held: %d request(s) and no "
          "continuation (delivery states %s)" % (len(first), box.states()))
    hold = new_text(first[1], first[0])
    check(SIGNAL_RE.search(hold), "the continuation does not carry the signal: %r"
          % hold[-300:])
    check(len(first) == 2, "the Stop was held %d times in one turn" % (len(first) - 1))
    leaked = secrets_shown(first)
    check(not leaked, "subject/body shown to the model (requests %s)" % leaked)
    if ui_rows is not None:
        ui_rows.append(_hold_ui(box, first, box.screen() if box.tmux else ""))
    # second turn, delivery still unread: must not hold again
    state["turn"] = 2
    if tui_mode(box.mode):
        box.tui_send("second task")
        calls = box.wait_quiet(3)
    else:
        box.oneshot("second task", resume=run["id"], timeout=45)
        calls = box.mock.model_calls()
    second = calls[2:]
    check(second, "the second turn made no request")
    check(len(second) == 1, "the same delivery held a Stop again in the next turn "
          "(%d requests in turn 2)" % len(second))
    return "held once (continuation carried the signal), not again in turn 2"


def _hold_ui(box, first, screen):
    """How the one hold looked: to the user (TUI screen) and to the model."""
    shown = new_text(first[1], first[0])
    problems = []
    if claude_mode(box.mode):
        if "Stop hook error" in screen:
            problems.append("the user sees 'Stop hook error: ...'")
    if "agents_room" in shown or "--event=Stop" in shown:
        problems.append("the model sees the hook command line")
    line = [l for l in shown.splitlines() if SIGNAL_RE.search(l)]
    detail = "model saw %r" % (line[0].strip()[:100] if line else shown[-100:])
    return ("FAIL" if problems else "PASS", "; ".join(problems) or detail)


def s_wake(box, before_first):
    state = {"n": 0}

    def script(req):
        state["n"] += 1
        return Reply(text="done-%d" % state["n"])
    box.mock.script = script
    box.tui_start()
    if before_first:
        session = box.wait_session(10)
        if session is None and not claude_mode(box.mode):
            # Codex 0.171 fires SessionStart at the first prompt and writes the thread's
            # rollout only then (`codex queue` refuses the thread before): no wake can exist
            raise Skip("Codex has no session before its first prompt (SessionStart fires "
                       "at the first prompt; codex queue needs the rollout)")
        check(session, "no agents-room session exists while the TUI sits before its "
              "first prompt (no SessionStart yet), so nothing can wake it")
    else:
        box.tui_send("first task")
        box.wait_quiet(1)
        session = box.sessions()[0] if box.sessions() else None
        check(session, "no agents-room session after the first turn")
        time.sleep(2.0)       # let a turn-end waiter arm
    # The armed rewake waiter goes first (no dialog, one turn); Codex: its queue.
    return _wake_once(box, session, "claude-rewake" if claude_mode(box.mode) else
                      "codex-queue")


def _wake_once(box, session, want_lever=None):
    """Send to an idle TUI session: exactly one model call, carrying the
    signal (not the subject or body); the delivery accepted once that turn is
    seen; no dialog; /exit leaves nothing running."""
    before = len(box.mock.model_calls())
    level = "" if session["autonomy"] == 2 else (
        "; its autonomy is %s, not 2" % session["autonomy"])
    lever = box.sessions()[0].get("lever") if box.sessions() else session.get("lever")
    sent_at = time.time()
    box.send(session["session_id"])
    woke = box.mock.wait_for(lambda calls: len(calls) > before and calls[before], 30)
    states = box.states()
    check(woke is not None, "no turn started within 30 s of the send (lever %s, "
          "delivery states %s, wake events %s%s)" % (lever, states,
                                                   box.wake_events(session), level))
    check(not level, "woke, but" + level[1:])
    latency = woke.at - sent_at
    box.notes.append("wake latency %.1f s" % latency)
    calls = box.wait_quiet(before + 1, quiet=WAKE_QUIET_S, settle=WAKE_QUIET_S,
                           timeout=30)
    count = len(calls) - before
    previous = calls[before - 1] if before else None
    tail = new_text(woke, previous)
    check(SIGNAL_RE.search(tail), "the woken turn does not carry the signal: %r"
          % tail[-300:])
    check(not secrets_shown([woke]), "subject/body rode the wake")
    events = box.wake_events(session)
    tails = [new_text(calls[i], calls[i - 1] if i else None) for i in range(before,
                                                                             len(calls))]
    check(count == 1, "one send made %d model calls (want 1); wake events %s; what each "
          "added: %s" % (count, events, [one_line(signal_line(t) or t[-120:], 120)
                                         for t in tails]))
    states = box.states()
    end = time.time() + 5
    while states != ["accepted"] and time.time() < end:
        time.sleep(0.5)
        states = box.states()
    check("undeliverable" not in states, "delivery marked undeliverable although it "
          "woke the session: %s" % states)
    check(states == ["accepted"], "after the woken turn the sender sees %s, not accepted "
          "(the turn it started was not recognised; wake events %s)" % (states, events))
    levers = wake_levers(events)
    if want_lever:
        check(want_lever in levers, "the wake went through %s, not %s (events %s)"
              % (levers, want_lever, events))
    box.check_no_dialog()
    left = box.tui_exit()
    check(not left, "after /exit these are still running: %s" % left)
    box.suite.wakes.append((box.mode, latency, count))
    return "woke in %.1f s, %d model call; lever %s; states %s; /exit left nothing " \
        "(first-run dialogs answered: %s)" % (latency, count, "+".join(levers), states,
                                               ", ".join(box.dialogs_met) or "none")


def wake_levers(events):
    """The levers that were tried or took a wake ("turn": a turn seen is
    what confirmed it, not a lever)."""
    return sorted({lever for kind, lever in events if kind in ("wake.try", "wake.accepted")
                   and lever and lever != "turn"})


def s_wake_by_inbox(box):
    """setup --autonomy 1 installs no rewake waiter; the model raises the
    session to wake (room_join {"autonomy": 2}), so a send can only go
    through Claude Code's inbox socket (2.1.224 and later)."""
    state = {"n": 0}

    def script(req):
        sid = req.session_id()
        if sid and "raised" not in state and not req.tool_results():
            state["raised"] = sid
            return Reply(calls=[ar_call(box.mode, "room_join", {"autonomy": 2})])
        state["n"] += 1
        return Reply(text="done-%d" % state["n"])
    box.mock.script = script
    box.tui_start()
    box.tui_send("raise your autonomy to wake")
    box.wait_quiet(2)
    found = box.sessions()
    check(found and state.get("raised"), "no session raised its autonomy (sessions %s)"
          % found)
    session = found[0]
    check(session["autonomy"] == 2, "room_join {autonomy: 2} left autonomy %s"
          % session["autonomy"])
    if session.get("lever") is None:
        raise Skip("no lever without the rewake waiter: this Claude Code has no inbox "
                   "socket (CLAUDE_CODE_MESSAGING_SOCKET, 2.1.224 and later)")
    time.sleep(1.0)
    return _wake_once(box, session, want_lever="claude-socket")


def s_wake_finished(box):
    """A send to a session whose one-shot run has exited."""
    state = {"phase": 1, "n": 0}

    def script(req):
        if state["phase"] == 1:
            state.setdefault("sid", req.session_id())
            return Reply(text="first done")
        state["n"] += 1
        if state["n"] == 1 and not claude_mode(box.mode):
            return Reply(calls=[ar_call(box.mode, "msg_recv", {"session_id": state["sid"]})])
        return Reply(text="woken done")
    box.mock.script = script
    run = box.oneshot("first task", timeout=45)
    check(state.get("sid") and run["id"] and not run["hung"],
          "the first run gave no session%s" % _run_hint(run))
    session = box.sessions()[0]
    state["phase"] = 2
    before = len(box.mock.model_calls())
    sent_at = time.time()
    box.send(state["sid"])
    if claude_mode(box.mode):
        # No lever for a finished claude -p run: nothing may start, and the
        # next run of the session is told.
        time.sleep(6.0)
        stray = box.mock.model_calls()[before:]
        check(not stray, "%d model call(s) after a send to a finished claude -p run"
              % len(stray))
        states = box.states()
        check("accepted" not in states, "the sender sees %s although nothing runs the "
              "session" % states)
        box.oneshot("next task", resume=run["id"], timeout=45)
        calls = box.mock.model_calls()[before:]
        check(calls, "the resumed run reached no model")
        check(SIGNAL_RE.search(calls[0].all_text()) or
              "1 unread message" in calls[0].all_text(),
              "the resumed run was not told of the unread message")
        return "no lever (nothing ran; states %s); the next --resume run was told" % states
    woke = box.mock.wait_for(lambda calls: len(calls) > before and calls[before], 40)
    check(woke is not None, "no resumed turn within 40 s of the send (lever %s, states %s,"
          " wake events %s)" % (session.get("lever"), box.states(), box.wake_events(session)))
    latency = woke.at - sent_at
    box.notes.append("wake latency %.1f s" % latency)
    tail = new_text(woke, box.mock.model_calls()[before - 1] if before else None)
    check(SIGNAL_RE.search(tail), "the resumed turn does not carry the signal: %r"
          % tail[-300:])
    mine = [n for n in woke.tool_names() if "agents_room" in str(n)]
    check(mine, "the resumed turn was offered no agents-room tool (%s)" % woke.tool_names())
    calls = box.wait_quiet(before + 2, quiet=WAKE_QUIET_S, settle=WAKE_QUIET_S, timeout=40)
    count = len(calls) - before
    check(count == 2, "the wake made %d model calls (want 2: msg_recv and the answer)"
          % count)
    results = result_texts(calls[-1])
    check(results and '"messages"' in results[-1], "msg_recv in the resumed turn failed: "
          "%r" % results[-1:])
    states = box.states()
    check(states == ["read"], "after the resumed turn read it the sender sees %s" % states)
    levers = wake_levers(box.wake_events(session))
    check(levers == ["codex-resume"], "the wake went through %s (want codex-resume)"
          % levers)
    end = time.time() + 10
    while time.time() < end and [c for c in marked_processes([box.dir, box.db])
                                 if " exec " in " %s " % c]:
        time.sleep(0.5)
    left = [c for c in marked_processes([box.dir, box.db]) if " exec " in " %s " % c]
    check(not left, "the resumed run is still running: %s" % left)
    box.suite.wakes.append((box.mode, latency, 1))
    return "resumed in %.1f s (codex exec resume), 1 turn: msg_recv worked; states %s" % (
        latency, states)


def s_p_exits(box):
    box.mock.script = lambda req: Reply(text="final answer")
    run = box.oneshot("hello", timeout=30)
    check(not run["hung"], "did not exit within 30 s after its turn (killed); stdout %r"
          % run["out"][-200:])
    check(run["rc"] == 0, "exit %s: %s" % (run["rc"], run["err"][-200:]))
    check("final answer" in run["out"], "result not printed: %r" % run["out"][-200:])
    return "exit 0 in %.1f s, result printed" % run["elapsed"]


def s_resume_rooms(box):
    state = {"phase": 1}

    def script(req):
        sid = req.session_id()
        if state["phase"] == 1:
            if sid and not req.tool_results():
                state["sid"] = sid
                args = {"extra_rooms": [SHARED]}
                if not claude_mode(box.mode):
                    # Codex's serve has no harness key: name it, or the join is an orphan
                    args["harness_key"] = thread_id(req)
                return Reply(calls=[ar_call(box.mode, "room_join", args)])
            if "members" not in state:
                state["members"] = [s["session_id"] for s in box.sessions("shared:" + SHARED)]
            return Reply(text="joined")
        if "rooms2" not in state:
            state["rooms2"] = last_digest_rooms(req)
            state["sid2"] = re.findall(r"your session_id is ([0-9a-f]{16})", req.all_text())[-1:]
            state["who"] = [s["session_id"] for s in box.sessions("shared:" + SHARED)]
        return Reply(text="resumed")
    box.mock.script = script
    run = box.oneshot("join the shared room", timeout=45)
    check(state.get("sid") and run["id"], "first run gave no session%s" % _run_hint(run))
    sid = state["sid"]
    members = state.get("members", [])
    check(sid in members, "the session never got into shared:%s during its turn "
          "(members %s)" % (SHARED, members))
    after_end = [s["session_id"] for s in box.sessions("shared:" + SHARED)]
    state["phase"] = 2
    box.mock.reset(script)
    run2 = box.oneshot("continue", resume=run["id"], timeout=45)
    check("rooms2" in state, "the resumed run reached no model%s" % _run_hint(run2))
    check(state["sid2"] == [sid], "resumed digest names session %s, not %s"
          % (state["sid2"], sid))
    check(sid in state["who"], "resumed session is not in shared:%s any more (who: %s; "
          "right after SessionEnd: %s; resumed digest rooms: %s)"
          % (SHARED, state["who"], after_end, state["rooms2"]))
    return "still in shared:%s after SessionEnd + resume" % SHARED


def s_sent_states(box):
    state = {}

    def script(req):
        sid = req.session_id()
        results = req.tool_results()
        if sid and not results:
            if "sent" not in state:
                state["sent"] = box.send(sid)
                state["at_send"] = box.states()
            return Reply(calls=[noop_call(box)])
        if sid and len(results) == 1:
            state["signalled"] = bool(signal_in(req))
            state["at_signal"] = box.states()
            return Reply(calls=[ar_call(box.mode, "msg_recv", {"session_id": sid})])
        if "at_recv" not in state:
            state["at_recv"] = box.states()
        return Reply(text="done")
    box.mock.script = script
    if tui_mode(box.mode):
        run_turn(box, "work on something", 3)
        box.wait_quiet(99, quiet=6.0, settle=6.0, timeout=20)   # a late wake would show
    else:
        run = box.oneshot("work on something", timeout=45, done=lambda: "at_recv" in state)
        if run["id"] and "at_recv" in state:
            # resume once: a wake queued for the finished run must not surface now
            box.oneshot("next task", resume=run["id"], timeout=45,
                        done=lambda: len(box.mock.model_calls()) > 3)
    check("sent" in state, "no digest reached the model")
    check(state.get("signalled"), "the signal never reached the model (states %s)"
          % state.get("at_signal"))
    seen = state["at_send"] + state["at_signal"] + state.get("at_recv", [])
    check("undeliverable" not in seen, "a signalled delivery was reported undeliverable "
          "(at send %s, when signalled %s, after recv %s)"
          % (state["at_send"], state["at_signal"], state.get("at_recv")))
    check(all(s in ("offered", "accepted") for s in state["at_signal"]),
          "when the model was signalled the sender saw %s (want offered/accepted)"
          % state["at_signal"])
    check(state.get("at_recv") == ["read"], "after msg_recv the sender saw %s"
          % state.get("at_recv"))
    calls = box.mock.model_calls()
    read_at = [i for i, r in enumerate(calls) if len(r.tool_results()) >= 2]
    stale = [(r.index, signal_line(new_text(r, calls[i - 1])))
             for i, r in enumerate(calls[1:], 1)
             if read_at and i > read_at[0] and SIGNAL_RE.search(new_text(r, calls[i - 1]))]
    check(not stale, "a signal/wake for the already-read message reached the model after "
          "msg_recv (request %s%s: %r)" % (
              stale[0][0] if stale else None,
              "" if tui_mode(box.mode) else ", in the resumed run",
              one_line(stale[0][1] if stale else "", 160)))
    aborted = [r.index for r in calls if "<turn_aborted>" in r.all_text()]
    check(not aborted, "the model was told a turn was interrupted (request %s): a wake was "
          "dispatched into a run that was exiting" % aborted[:1])
    return "send %s -> signalled %s -> recv %s" % (state["at_send"], state["at_signal"],
                                                    state["at_recv"])


def _run_hint(run):
    if not run:
        return ""
    return " (exit %s%s; stderr %r)" % (run["rc"], ", hung" if run["hung"] else "",
                                        run["err"].strip()[-200:])


def s_idle_watch(box):
    """A peer asks, while the session works, to be told when its turn ends
    (notify-when idle): one message when it ends, none at the next."""
    state = {}

    def script(req):
        sid = req.session_id()
        if sid and not req.tool_results():
            if "watch" not in state:
                state["sid"] = sid
                state["watch"] = box.ar("notify-when", "--session", box.peer(), "idle", sid,
                                        "--json", check_rc=False)
            return Reply(calls=[noop_call(box)])
        return Reply(text="done")
    box.mock.script = script
    run = run_turn(box, "work on something", 2)
    check("watch" in state, "no digest session id reached the model%s" % _run_hint(run))
    watch = state["watch"]
    check(isinstance(watch, dict), "notify-when idle failed: %r" % (watch,))
    check(not watch.get("already"), "notify-when answered at once, as if no turn ran: %r"
          % watch)
    check(watch.get("watches"), "notify-when idle during the turn set no watch: %r" % watch)
    told, end = [], time.time() + 15
    while time.time() < end and not told:
        got = box.ar("recv", "--session", box.peer(), "--json")
        told += [m for m in got.get("messages", []) if m.get("subject", "").startswith(
            "[watch #")]
        time.sleep(0.5)
    check(len(told) == 1, "the peer was told %d times that the turn ended, not once "
          "(within 15 s of the last model request)" % len(told))
    took = time.time() - box.mock.model_calls()[-1].at
    detail = "told once: %r (%.1f s after the last model request)" % (told[0]["subject"],
                                                                       took)
    if tui_mode(box.mode):
        box.tui_send("and again")
        box.wait_quiet(len(box.mock.model_calls()) + 1)
        time.sleep(2)
        again = box.ar("recv", "--session", box.peer(), "--json").get("messages", [])
        check(not again, "a second turn's end told the peer again: %r"
              % [m.get("subject") for m in again])
        detail += "; not again after a second turn"
    return detail


# name, autonomy, modes, function
SCENARIOS = [
    ("a-digest", 0, MODES, s_digest),
    ("b-mcp-session", 0, MODES, s_mcp),
    ("c-midturn-signal", 0, MODES, s_midturn),
    ("d-hold-once", 1, MODES, s_hold_once),
    ("e1-wake-before-first-turn", 2, ("claude-tui", "claude-tui-skip", "codex-tui"),
     lambda box: s_wake(box, True)),
    ("e2-wake-after-turn", 2, ("claude-tui", "claude-tui-skip", "codex-tui"),
     lambda box: s_wake(box, False)),
    ("e3-wake-finished-run", 2, ("claude-p", "codex-exec"), s_wake_finished),
    ("e4-wake-by-inbox", 1, ("claude-tui",), s_wake_by_inbox),
    ("f-oneshot-exits-at-wake", 2, ("claude-p", "codex-exec"), s_p_exits),
    ("g-resume-keeps-rooms", 0, ("claude-p", "codex-exec"), s_resume_rooms),
    ("h-sent-states", 2, MODES, s_sent_states),
    ("i-idle-watch", 0, ("claude-p", "claude-tui", "codex-exec", "codex-tui"), s_idle_watch),
]


# ---- the suite ------------------------------------------------------------------

class Suite:
    def __init__(self, args):
        self.npm_bin = os.path.abspath(args.npm_bin)
        self.keep = args.keep
        self.pg_url = args.db
        os.makedirs(args.workdir, exist_ok=True)
        self.root = tempfile.mkdtemp(prefix="run-", dir=os.path.abspath(args.workdir))
        self.socket = "agents-room-e2e-%d" % os.getpid()
        self.mock = MockModel(log=log, require_offered=True).start()
        self.results = []
        self.wakes = []         # (mode, latency s, model calls) of each wake measured

    def tmux(self, *args, check=True):
        done = subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null"] + list(args),
                              capture_output=True, text=True, timeout=30)
        if check and done.returncode != 0:
            raise Failure("tmux %s: %s" % (args[0], done.stderr.strip()))
        return done.stdout

    def run_case(self, scenario, mode):
        name, autonomy, _, function = scenario
        case = "%s/%s" % (name, mode)
        started = time.time()
        box = None
        extra = []
        try:
            box = Box(self, case, mode, autonomy)
            if function is s_hold_once:
                detail = s_hold_once(box, extra)
            else:
                detail = function(box)
            check(not self.mock.problems, "; ".join(self.mock.problems[:2]))
            if box.tmux:
                box.check_no_dialog()
            status = "PASS"
        except Failure as error:
            status, detail = "FAIL", str(error)
            if self.mock.problems and self.mock.problems[0] not in detail:
                detail += " [mock: %s]" % self.mock.problems[0]
            if box is not None and box.dialog_seen and box.dialog_seen[0] not in detail:
                detail += " [the TUI showed %r]" % box.dialog_seen[0]
        except Skip as error:
            status, detail = "SKIP", str(error)
        except Exception as error:  # a broken case is a failure, never a crash
            status, detail = "FAIL", "error: %s: %s" % (type(error).__name__, error)
            if VERBOSE:
                import traceback
                traceback.print_exc()
        finally:
            if box is not None:
                try:
                    self.mock.dump(os.path.join(box.dir, "requests.json"))
                except OSError:
                    pass
                if box.notes and status != "PASS":
                    detail += " [%s]" % "; ".join(box.notes)
                box.cleanup()
        elapsed = time.time() - started
        self.results.append((case, status, elapsed, detail))
        for ui_status, ui_detail in extra:
            self.results.append(("d-hold-ui/%s" % mode, ui_status, 0.0, ui_detail))
        print("%-4s %-38s %5.1fs  %s" % (status, case, elapsed, one_line(detail)), flush=True)
        for ui_status, ui_detail in extra:
            print("%-4s %-38s %5s   %s" % (ui_status, "d-hold-ui/%s" % mode, "", one_line(
                ui_detail)), flush=True)

    def close(self):
        self.mock.stop()
        self.tmux("kill-server", check=False)
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)


def truth_rows(results, versions, wakes):
    """One E2E-ROW per harness and mode for the README's table
    (.ci/e2e_report.py): a cell is yes when every case behind it passed."""
    sys.path.insert(0, HERE)
    from e2e_report import row
    status = {case: s for case, s, _, _ in results}

    def cell(*names):
        got = [status[n] for n in names if n in status]
        if not got or all(s == "SKIP" for s in got):
            return None
        return all(s in ("PASS", "SKIP") for s in got)

    def measured(mode):
        mine = [(l, c) for m, l, c in wakes if m == mode]
        if not mine:
            return None, ""
        latencies = sorted(l for l, _ in mine)
        calls = sorted({c for _, c in mine})
        return latencies[len(latencies) // 2], "%s model call%s per wake (%d wake%s)" % (
            "/".join(map(str, calls)), "" if calls == [1] else "s", len(mine),
            "" if len(mine) == 1 else "s")

    def basics(mode):
        return dict(digest=cell("a-digest/" + mode, "b-mcp-session/" + mode),
                    signal=cell("c-midturn-signal/" + mode, "h-sent-states/" + mode),
                    hold=cell("d-hold-once/" + mode, "d-hold-ui/" + mode))
    claude, codex = versions
    # Claude Code's inbox socket exists from 2.1.224 on: e4 skips without it.
    inbox = status.get("e4-wake-by-inbox/claude-tui") not in (None, "SKIP")
    if any(c.endswith("/claude-p") for c in status):
        row("claude-code", claude, "claude -p", wake="n/a" if status.get(
            "e3-wake-finished-run/claude-p") == "PASS" else cell(
                "e3-wake-finished-run/claude-p"),
            note="untrusted folder, default permission mode: setup alone; no lever for a "
                 "finished run (the next --resume is told)", **basics("claude-p"))
    if any(c.endswith("/claude-tui") for c in status):
        latency, calls = measured("claude-tui")
        row("claude-code", claude, "claude (TUI, default mode)", latency=latency,
            wake=cell("e1-wake-before-first-turn/claude-tui",
                      "e2-wake-after-turn/claude-tui", "e4-wake-by-inbox/claude-tui"),
            note="folder trusted once in the TUI; the rewake waiter%s; %s" % (
                ", or the inbox socket where no waiter is armed" if inbox else
                " (no inbox socket in this version)", calls or "no wake measured"),
            **basics("claude-tui"))
    if any(c.endswith("/claude-tui-skip") for c in status):
        latency, calls = measured("claude-tui-skip")
        row("claude-code", claude, "claude --dangerously-skip-permissions (TUI)",
            latency=latency, wake=cell("e1-wake-before-first-turn/claude-tui-skip",
                                       "e2-wake-after-turn/claude-tui-skip"),
            note="trust and the Bypass warning accepted once in the TUI; the rewake "
                 "waiter%s; %s" % (" (never the inbox: it would hold the wake behind a "
                                   "dialog)" if inbox else "", calls or "no wake measured"),
            **basics("claude-tui-skip"))
    if any(c.endswith("/codex-exec") for c in status):
        latency, calls = measured("codex-exec")
        row("codex", codex, "codex exec", latency=latency,
            wake=cell("e3-wake-finished-run/codex-exec"),
            note="hooks run with --dangerously-bypass-hook-trust; a finished run is woken "
                 "by codex exec resume", **basics("codex-exec"))
    if any(c.endswith("/codex-tui") for c in status):
        latency, calls = measured("codex-tui")
        row("codex", codex, "codex (TUI)", latency=latency,
            wake=cell("e1-wake-before-first-turn/codex-tui", "e2-wake-after-turn/codex-tui"),
            note="folder and hooks trusted once in the TUI; codex queue, not before the "
                 "first prompt; %s" % (calls or "no wake measured"), **basics("codex-tui"))


def cases(only):
    wanted = [w.strip() for w in (only or "").split(",") if w.strip()]
    for scenario in SCENARIOS:
        for mode in scenario[2]:
            case = "%s/%s" % (scenario[0], mode)
            ui = "d-hold-ui/%s" % mode if scenario[3] is s_hold_once else ""
            if not wanted or any(w in case or (ui and w in ui) for w in wanted):
                yield scenario, mode


def _version(npm_bin, tool):
    try:
        out = subprocess.run([os.path.join(npm_bin, tool), "--version"], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "?"
    found = re.search(r"\d+\.\d+\.\d+", out)
    return found.group(0) if found else "?"


def preflight(npm_bin):
    missing = [tool for tool in ("git", "tmux", "node") if shutil.which(tool) is None]
    for tool in ("claude", "codex"):
        if not os.path.exists(os.path.join(npm_bin, tool)):
            missing.append("%s (in %s)" % (tool, npm_bin))
    return missing


def _agents_room():
    """The agents_room module under test (for its store: the case's sessions)."""
    sys.path.insert(0, os.path.dirname(AR))
    import agents_room
    return agents_room


def main():
    global VERBOSE, AR
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="run the cases whose name contains one of these "
                        "(comma-separated), e.g. c-midturn or claude-tui")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--keep", action="store_true", help="keep the work directory "
                        "(homes, stores, recorded requests.json per case)")
    parser.add_argument("--npm-bin", default=os.path.join(ROOT, ".e2e", "npm",
                                                           "node_modules", ".bin"))
    parser.add_argument("--workdir", default=os.path.join(ROOT, ".e2e"))
    parser.add_argument("--agents-room", default=AR, help="the agents_room.py under test "
                        "(default: the one beside .ci/)")
    parser.add_argument("--budget", type=float, default=540, help="seconds; cases not "
                        "started by then are reported SKIP (default 540, so make e2e stays "
                        "under 10 minutes)")
    parser.add_argument("--db", metavar="URL", help="run every case on this PostgreSQL "
                        "database (a schema per case) instead of a SQLite file")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    VERBOSE = args.verbose
    AR = os.path.abspath(args.agents_room)
    selected = list(cases(args.only))
    if args.list:
        for scenario, mode in selected:
            print("%s/%s" % (scenario[0], mode))
        return 0
    if not selected:
        print("no case matches %r" % args.only)
        return 2
    missing = preflight(os.path.abspath(args.npm_bin))
    if missing:
        print("e2e: missing %s (make e2e installs the harnesses)" % ", ".join(missing))
        return 2
    suite = Suite(args)
    started = time.time()
    versions = (_version(suite.npm_bin, "claude"), _version(suite.npm_bin, "codex"))
    print("e2e: %s (sha256 %s), claude %s, codex %s" % ((AR, file_sha(AR)) + versions),
          flush=True)
    try:
        for scenario, mode in selected:
            if time.time() - started > args.budget:
                case = "%s/%s" % (scenario[0], mode)
                suite.results.append((case, "SKIP", 0.0, "time budget (%gs) spent" % args.budget))
                print("SKIP %-38s        time budget spent" % case, flush=True)
                continue
            suite.run_case(scenario, mode)
    finally:
        suite.close()
    results = suite.results
    print("\n%-4s  %-38s %7s  %s" % ("", "case", "time", "why"))
    for case, status, elapsed, detail in results:
        print("%-4s  %-38s %6.1fs  %s" % (status, case, elapsed, one_line(detail, 200)))
    failed = sum(1 for r in results if r[1] == "FAIL")
    passed = sum(1 for r in results if r[1] == "PASS")
    skipped = sum(1 for r in results if r[1] == "SKIP")
    print()
    truth_rows(results, versions, suite.wakes)
    print("\n%.0f s%s" % (time.time() - started,
                           "" if not args.keep else "; kept %s" % suite.root))
    print("e2e: %d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
