#!/usr/bin/env python3
"""End-to-end: agents-room under a real Gemini CLI, offline, against .ci/mock_model.py.

    python3 .ci/e2e_gemini.py --bin DIR [--only NAME[,NAME...]] [--list] [--keep]
                              [--jobs 1|2] [-v]

DIR is the bin directory of an npm prefix with `@google/gemini-cli` installed
(.../node_modules/.bin); the version it ran is printed and reported.  Each case
is CASE/MODE, e.g. c-midturn-signal/gemini-tui; --only matches any part of it
(or a scenario's name).  Modes: gemini-p (`gemini -p`, one-shot) and gemini-tui
(interactive gemini in tmux); the two modes' scenarios run side by side
(--jobs 1: one after another).

Every scenario gets its own HOME (and XDG dirs), git repository `proj`
configured by `agents_room.py setup gemini --write` alone (project scope:
proj/.gemini/settings.json), AGENTS_ROOM_DB and mock, and talks only to that
mock on 127.0.0.1 (GOOGLE_GEMINI_BASE_URL), which records each request: the
checks are on what the model was shown.  A peer session (the CLI: join, send,
sent) plays the other agent.

Pre-written, as it is about the mock only: ~/.gemini/settings.json with
security.auth.selectedType "gemini-api-key" (without it a base URL makes
Gemini pick the "gateway" auth type and exit 41), telemetry, usage statistics
and auto-update off; ~/.env with the mock's API key (a .env file is where
Gemini CLI finds a key besides the environment; the resume lever keeps no
secret of the session's environment, so a key exported only in the shell would
not reach a resumed run; ~/.gemini/.env is read in trusted folders only).
The one user step is folder trust: every scenario starts gemini in the project
in tmux and picks "1. Trust folder" in its dialog, as a user does once (a
gemini -p scenario then quits it; that start is a session of its own, ended).
gemini -p refuses an untrusted folder (exit 55), and --skip-trust does not
load the project's settings (no hooks, no server).  Gemini CLI 0.61.0 now and
then saves the trust without restarting; gemini then runs without the
project's settings and is started again, as a user would (noted).  Gemini CLI
runs with `-m gemini-2.5-flash` (no router call first; a resumed run does not
keep it); gemini -p also with `--approval-mode yolo` (else -p offers no shell
tool), the TUI without it: its shell confirmation is answered "Allow once".

Scenarios, each one box and one or more cases:
  session [autonomy 2]  a-digest: the SessionStart digest with "your session_id is <16 hex>"
                          is in the first request, and that session is in `who`;
                        b-mcp-session: the lean tool listing is offered (mcp_agents-room_*),
                          room_join without arguments and msg_recv act on the digest's
                          session, `who` shows no second (orphan) session;
                        f-room-call: room_call {"op": "task", ...} adds a task (task list);
                        g-doctor: `agents_room.py doctor` run by the model through the shell
                          tool names this session and its lever;
                        e1-idle-not-woken (TUI): a send to the idle open TUI starts no
                          turn; the delivery stays offered (Gemini takes no turn from
                          outside while it runs);
                        h-exit: the run / /quit ends the session (SessionEnd): `who` shows it
                          ended and gone, and no process of the scenario is left;
                        e2-resume-wakes: a send to the finished session runs the resume
                          lever (gemini --resume <id> -p <signal>): a turn with the signal
                          (latency send -> woken request), accepted, then read
  signal [0]            c-midturn-signal: a message sent while the model works shows up in
                          the next request as the one-line signal, never subject or body
  hold [1]              d-hold-once: the end of a turn with unread mail is held once (the
                          continuation carries the signal), not again in the next turn
Prints a PASS/FAIL table and the README truth table's rows (.ci/e2e_report.py);
exits 1 on any FAIL.  Standard library only; needs node, git and tmux.
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
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from e2e_report import row  # noqa: E402
from mock_model import Call, MockModel, Reply  # noqa: E402

from e2e_common import (  # noqa: E402
    drop_ci_markers, Failure, SIGNAL_RE, check, kill_group, one_line, signal_line)

drop_ci_markers()

AR = os.path.join(ROOT, "agents_room.py")
MODES = ("gemini-p", "gemini-tui")
MODEL = "gemini-2.5-flash"
PREFIX = "mcp_agents-room_"       # how Gemini CLI names the MCP server's tools
LEAN = ("room_join", "msg_send", "msg_recv", "room_who", "lease_claim", "lease_release",
        "note_read", "drift_check", "room_call")
SESSION_RE = re.compile(r"your session_id is ([0-9a-f]{16})")
SECRET_SUBJECT = "E2E-SECRET-SUBJECT"
SECRET_BODY = "E2E-SECRET-BODY"
TASK_TITLE = "e2e-task-via-room-call"
READY = "Type your message"
IDLE_S = 6                        # how long an idle TUI is watched for a turn (e1)
MOCK_SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "telemetry": {"enabled": False},
    "privacy": {"usageStatisticsEnabled": False},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
}
VERBOSE = False


def log(text):
    if VERBOSE:
        sys.stderr.write("  . %s\n" % text)
        sys.stderr.flush()


# ---- the world of one scenario --------------------------------------------------

class Box:
    """A temporary HOME, a git repository `proj` set up by `agents_room.py setup
    gemini --write`, a store, a peer session and a mock of its own."""

    def __init__(self, suite, name, mode, autonomy):
        self.suite, self.mode, self.autonomy = suite, mode, autonomy
        self.name = "%s-%s" % (name, mode)
        self.dir = os.path.join(suite.root, self.name)
        self.home = os.path.join(self.dir, "home")
        self.repo = os.path.join(self.dir, "proj")
        self.db = os.path.join(self.dir, "store", "room.db")
        self.tmux = None
        self.peer_sid = None
        self.notes = []
        self.mock = MockModel(log=log).start()      # one per box: boxes run in parallel
        for path in (self.home, self.repo, os.path.join(self.home, ".gemini")):
            os.makedirs(path, exist_ok=True)
        self.env = self._env()
        git = ["git", "-c", "user.name=e2e", "-c", "user.email=e2e@localhost"]
        subprocess.run(git + ["init", "-q", self.repo], check=True)
        with open(os.path.join(self.repo, "README"), "w") as handle:
            handle.write("e2e\n")
        subprocess.run(git + ["-C", self.repo, "add", "README"], check=True)
        subprocess.run(git + ["-C", self.repo, "commit", "-qm", "init"], check=True)
        # About the mock only: its auth type and key, nothing phoning home.
        with open(os.path.join(self.home, ".gemini", "settings.json"), "w") as handle:
            json.dump(MOCK_SETTINGS, handle, indent=2)
        # ~/.env: Gemini CLI reads it in untrusted folders too (~/.gemini/.env
        # only once trusted), and a resumed run finds the key there.
        with open(os.path.join(self.home, ".env"), "w") as handle:
            handle.write("GEMINI_API_KEY=e2e-mock-key\n")
        try:
            self.setup()
        except Exception:
            self.mock.stop()
            raise

    def _env(self):
        """Built from nothing: no variable of the machine's leaks in."""
        env = {
            "HOME": self.home,
            "PATH": os.pathsep.join([self.suite.bin, os.path.dirname(shutil.which("node")),
                                     "/usr/local/bin", "/usr/bin", "/bin"]),
            "USER": os.environ.get("USER", "e2e"),
            "LOGNAME": os.environ.get("USER", "e2e"),
            "LANG": "C.UTF-8",
            "TERM": "xterm-256color",
            "XDG_CONFIG_HOME": os.path.join(self.home, ".config"),
            "XDG_DATA_HOME": os.path.join(self.home, ".local", "share"),
            "XDG_CACHE_HOME": os.path.join(self.home, ".cache"),
            "XDG_STATE_HOME": os.path.join(self.home, ".local", "state"),
            "GOOGLE_GEMINI_BASE_URL": self.mock.url,
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            "AGENTS_ROOM_DB": self.db,
            "AGENTS_ROOM_E2E_BOX": self.dir,      # marks every process of this box
        }
        return env

    def setup(self):
        argv = [sys.executable, AR, "setup", "gemini", "--write"]
        if self.autonomy:
            argv += ["--autonomy", str(self.autonomy)]
        done = subprocess.run(argv, cwd=self.repo, env=self.env, capture_output=True,
                              text=True, timeout=60)
        with open(os.path.join(self.dir, "setup.txt"), "w") as handle:
            handle.write(done.stdout + done.stderr)
        if done.returncode != 0:
            raise Failure("setup gemini failed: %s" % done.stderr.strip()[-300:])

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
            joined = self.ar("join", "--room", "repo:proj", "--label", "peer",
                             "--harness-key", "e2e-peer", "--json")
            self.peer_sid = joined["session_id"]
        return self.peer_sid

    def send(self, to):
        return self.ar("send", "--session", self.peer(), "--to", to, "--subject",
                       SECRET_SUBJECT, "--body", SECRET_BODY, "--json")

    def states(self):
        """The peer's view: [state] of every delivery it sent, oldest first."""
        sent = self.ar("sent", "--session", self.peer(), "--json")
        return [d["state"] for m in sent.get("messages", []) for d in m.get("deliveries", [])]

    def sessions(self):
        """Sessions `who` lists, the peer left out."""
        found = self.ar("who", "--json", check_rc=False)
        if not isinstance(found, dict):
            return []
        return [s for s in found.get("sessions", []) if s["session_id"] != self.peer_sid
                and s.get("label") != "peer"]

    def session(self, sid):
        return next((s for s in self.sessions() if s["session_id"] == sid), None)

    def store_rows(self, sql, params=()):
        import sqlite3
        conn = sqlite3.connect("file:%s?mode=ro" % self.db, uri=True, timeout=10)
        try:
            conn.row_factory = sqlite3.Row
            return [dict(r) for r in conn.execute(sql, params)]
        finally:
            conn.close()

    def harness_key(self, sid):
        rows = self.store_rows("SELECT harness_key FROM sessions WHERE id=?", (sid,))
        return rows[0]["harness_key"] if rows else None

    def events(self, kind):
        return self.store_rows("SELECT kind, session_id, data FROM events WHERE kind=? "
                               "ORDER BY id", (kind,))

    def processes(self):
        """Pids of running processes of this box (its mark, or its store)."""
        return marked_pids([self.dir, self.db])

    # -- the harness
    def gemini(self):
        return os.path.join(self.suite.bin, "gemini")

    def oneshot(self, prompt, resume=None, timeout=60):
        """gemini -p to completion: dict(rc, out, err, elapsed, hung, id)."""
        argv = [self.gemini(), "-m", MODEL, "--approval-mode", "yolo", "--output-format",
                "json"] + (["--resume", resume] if resume else []) + ["-p", prompt]
        log("run %s" % " ".join(shlex.quote(a) for a in argv[1:]))
        out_path = os.path.join(self.dir, "run-%d.out" % time.time_ns())
        with open(out_path, "w") as out, open(out_path + ".err", "w") as err:
            proc = subprocess.Popen(argv, cwd=self.repo, env=self.env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=err, start_new_session=True)
            start = time.time()
            hung = False
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                hung = True
                kill_group(proc)
            elapsed = time.time() - start
        with open(out_path) as handle:
            out_text = handle.read()
        with open(out_path + ".err") as handle:
            err_text = handle.read()
        try:
            run_id = json.loads(out_text).get("session_id")
        except ValueError:
            run_id = None
        return {"rc": proc.returncode, "out": out_text, "err": err_text, "elapsed": elapsed,
                "hung": hung, "id": run_id}

    # -- interactive gemini in tmux
    def tui_start(self, keep=True):
        """Start gemini in tmux in the project and trust the folder in its dialog,
        as a user does once; wait for the prompt with the MCP server loaded.
        keep False: /quit right away (the trust step before a gemini -p
        scenario)."""
        self.tmux = "e2e-%s" % self.name[-40:]
        envfile = os.path.join(self.dir, "env.sh")
        with open(envfile, "w") as handle:
            for key, value in sorted(self.env.items()):
                handle.write("export %s=%s\n" % (key, shlex.quote(value)))
        command = "bash --norc --noprofile -c %s" % shlex.quote(
            ". %s; cd %s && exec %s -m %s" % (shlex.quote(envfile), shlex.quote(self.repo),
                                              shlex.quote(self.gemini()), MODEL))
        for attempt in (1, 2):
            self.suite.tmux("new-session", "-d", "-s", self.tmux, "-x", "160", "-y", "50",
                            command)
            if self._trust_and_wait():
                break
            # Gemini CLI 0.61.0 sometimes saves the trust but does not restart:
            # it runs on without the project's settings (no hooks, no server).
            # A user restarts it; so do we (the folder is trusted now).
            self.notes.append("the trust dialog did not restart gemini; started it again")
            check(self.tui_quit(), "gemini did not quit after the trust step")
            self.tmux = "e2e-%s" % self.name[-40:]
        else:
            raise Failure("gemini started twice without its MCP server; screen:\n%s"
                          % self.screen()[-1500:])
        time.sleep(1.0)
        if not keep:
            check(self.tui_quit(), "gemini did not quit after the trust step")

    def _trust_and_wait(self, timeout=45):
        """Answer the trust dialog (when it comes) with 1. Trust folder; True
        once the prompt shows with the MCP server, False when gemini came back
        without it."""
        answered_at = bare_since = None
        end = time.time() + timeout
        while time.time() < end:
            screen = self.visible()
            if VERBOSE:
                with open(os.path.join(self.dir, "start-screens.txt"), "a") as handle:
                    handle.write("==== %.1f\n%s\n" % (time.time(), screen))
            if "Do you trust the files in this folder" in screen:
                if answered_at is None and "MCP Servers" in screen:
                    check("1. Trust folder" in screen, "the trust dialog offers no '1. "
                          "Trust folder':\n%s" % screen[-800:])
                    time.sleep(1.0)             # let the dialog settle, as a reader would
                    self.suite.tmux("send-keys", "-t", self.tmux, "Enter")
                    answered_at = time.time()
            elif READY in screen:
                if "MCP server" in screen:
                    return True
                if answered_at is not None:
                    # Back at the prompt without the server: for 8 s, it stays so.
                    bare_since = bare_since or time.time()
                    if time.time() - bare_since > 8:
                        return False
            time.sleep(0.3)
        raise Failure("gemini did not %s in %d s; screen:\n%s" % (
            "come back after the trust dialog" if answered_at else "get ready", timeout,
            self.screen()[-1500:]))

    def visible(self):
        return self.suite.tmux("capture-pane", "-p", "-t", self.tmux, check=False)

    def screen(self):
        return self.suite.tmux("capture-pane", "-p", "-t", self.tmux, "-S", "-300",
                               check=False)

    def tui_alive(self):
        return self.tmux is not None and self.suite.tmux(
            "has-session", "-t", self.tmux, check=False, rc=True) == 0

    def tui_send(self, text, tries=4):
        """Type a prompt; press Enter again while no request comes (the first
        Enter is sometimes swallowed while the MCP server starts)."""
        before = len(self.mock.model_calls(main_only=False))
        self.suite.tmux("send-keys", "-t", self.tmux, "-l", text)
        time.sleep(0.4)
        for _ in range(tries):
            self.suite.tmux("send-keys", "-t", self.tmux, "Enter")
            end = time.time() + 4
            while time.time() < end:
                if len(self.mock.model_calls(main_only=False)) > before:
                    return True
                time.sleep(0.2)
        return False

    def tui_quit(self, timeout=20):
        """/quit, and wait for the pane (gemini exec'd in it) to close."""
        self.save_screen()
        self.suite.tmux("send-keys", "-t", self.tmux, "-l", "/quit")
        time.sleep(0.4)
        self.suite.tmux("send-keys", "-t", self.tmux, "Enter")
        end = time.time() + timeout
        while time.time() < end:
            if not self.tui_alive():
                self.tmux = None
                return True
            time.sleep(0.2)
        return False

    def wait_quiet(self, at_least, quiet=2.5, settle=8.0, timeout=40):
        """Wait until >= at_least main requests came and none for `quiet` s;
        with fewer, give up once none came for `settle` s."""
        start = time.time()
        while time.time() < start + timeout:
            calls = self.mock.model_calls()
            last = calls[-1].at if calls else start
            idle = time.time() - last
            if (len(calls) >= at_least and idle > quiet) or (calls and idle > settle):
                return calls
            time.sleep(0.3)
        return self.mock.model_calls()

    def save_screen(self):
        try:
            with open(os.path.join(self.dir, "screen-%d.txt" % time.time_ns()), "w") as handle:
                handle.write(self.screen())
        except (OSError, Failure):
            pass

    def cleanup(self):
        if self.tmux:
            self.save_screen()
            self.suite.tmux("kill-session", "-t", self.tmux, check=False)
            time.sleep(0.3)
        kill_marked([self.dir, self.db])
        try:
            self.mock.dump(os.path.join(self.dir, "requests.json"))
        except OSError:
            pass
        self.mock.stop()


def marked_pids(markers):
    """Processes (not this one) whose environment names the box's dir or store."""
    wanted = [("AGENTS_ROOM_E2E_BOX=%s" % markers[0]).encode(),
              ("AGENTS_ROOM_DB=%s" % markers[-1]).encode()]
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as handle:
                environ = handle.read().split(b"\0")
        except OSError:
            continue
        if any(item in wanted for item in environ):
            found.append(int(entry))
    return found


def kill_marked(markers):
    """End the processes this suite started for a box, by pid."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        found = marked_pids(markers)
        for pid in found:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        if not found:
            return
        time.sleep(0.5)


def describe(pids):
    out = []
    for pid in pids:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as handle:
                argv = [a.decode("utf-8", "replace") for a in handle.read().split(b"\0") if a]
        except OSError:
            continue
        out.append("%d %s" % (pid, one_line(" ".join(os.path.basename(a) if i == 0 else a
                                                    for i, a in enumerate(argv)), 90)))
    return out


# ---- what the model was shown ---------------------------------------------------

def new_text(req, before):
    """Text in req that the request `before` did not have."""
    old = before.all_text() if before is not None else ""
    text = req.all_text()
    if text.startswith(old):
        return text[len(old):]
    seen = set(old.splitlines())
    return "\n".join(line for line in text.splitlines() if line not in seen)


def secrets_shown(calls):
    return [r.index for r in calls
            if SECRET_SUBJECT in r.all_text() or SECRET_BODY in r.all_text()]


def last_results(req, count):
    """The texts of the last `count` tool results of a request."""
    return [text for _, text in req.tool_results()[-count:]]


def ar_call(name, args):
    return Call(PREFIX + name, args)


def result_json(text):
    """The first JSON object in an MCP tool result (Gemini wraps MCP output in
    <untrusted_context> and may append a <hook_context>)."""
    start = text.find("{")
    while start >= 0:
        try:
            return json.JSONDecoder().raw_decode(text[start:])[0]
        except ValueError:
            start = text.find("{", start + 1)
    return None


# ---- scenarios ----------------------------------------------------------------
# Each fills `rows` {case: (status, detail)} for the cases it covers; a step that
# fails records FAIL for its case and the scenario goes on where it can.

class Rows(dict):
    def run(self, case, function):
        try:
            self[case] = ("PASS", function())
        except Failure as error:
            self[case] = ("FAIL", str(error))
        except Exception as error:     # a broken step is a failure, never a crash
            self[case] = ("FAIL", "error: %s: %s" % (type(error).__name__, error))
        return self[case][0] == "PASS"


def start_turn(box, prompt, expect):
    """A first user turn: the TUI, trusted and started, or a gemini -p run
    after the trust step.  Returns (the -p run or None, the main requests)."""
    if box.mode == "gemini-tui":
        box.tui_start()
        check(box.tui_send(prompt), "the TUI sent no request for the prompt; screen:\n%s"
              % box.screen()[-1200:])
        return None, box.wait_quiet(expect, quiet=3.0)
    box.tui_start(keep=False)                # the user trusts the folder once
    run = box.oneshot(prompt)
    return run, box.mock.model_calls()


def run_hint(run):
    if not run:
        return ""
    return " (exit %s%s; stderr %r)" % (run["rc"], ", hung" if run["hung"] else "",
                                        one_line(run["err"], 240))


def s_session(box, rows):
    """a, b, f, g, h, e: one session through its first turn, its end and a wake."""
    doctor = "%s %s doctor" % (shlex.quote(sys.executable), shlex.quote(AR))
    state = {"phase": "turn", "woken": None}
    pre = set()
    if box.mode == "gemini-p":
        box.tui_start(keep=False)            # the user trusts the folder once
        pre = {s["session_id"] for s in box.sessions()}

    def script(req):
        sid = req.session_id()
        if state["phase"] == "woken":
            if state["woken"] is None:
                state["woken"] = req
                state["at_woken"] = box.states()
                return Reply(calls=[ar_call("msg_recv", {"session_id": state.get("sid")})])
            return Reply(text="read the message; done")
        if state["phase"] != "turn":
            return Reply(text="ok")
        step = len(req.tool_results())
        if step == 0:
            state["first"], state["sid"] = req, sid
            state["who"] = [s["session_id"] for s in box.sessions()
                            if s["session_id"] not in pre]
            return Reply(text="joining", calls=[ar_call("room_join", {})])
        if step == 1:
            return Reply(calls=[ar_call("msg_recv", {"session_id": sid})])
        if step == 2:
            return Reply(calls=[ar_call("room_call", {"op": "task", "args": {
                "session_id": sid, "action": "add", "title": TASK_TITLE}})])
        if step == 3:
            return Reply(calls=[Call("run_shell_command", {
                "command": doctor, "description": "agents-room doctor"})])
        if step == 4:
            state["last"] = req
            state["who_end"] = [s["session_id"] for s in box.sessions()
                                if s["session_id"] not in pre]
        return Reply(text="done")
    box.mock.script = script
    run = None
    if box.mode == "gemini-tui":
        box.tui_start()
        check(box.tui_send("join the room and check your setup"),
              "the TUI sent no request; screen:\n%s" % box.screen()[-1200:])
        approve_shell(box, state)
        box.wait_quiet(5, timeout=30)
    else:
        run = box.oneshot("join the room and check your setup")
    sid = state.get("sid")
    last = state.get("last")

    def digest():
        check(state.get("first") is not None, "no model request%s" % run_hint(run))
        check(sid, "the first request has no 'your session_id is <16 hex>' digest")
        check(state["who"] == [sid], "during the turn `who` lists %s, expected the "
              "digest's session %s" % (state["who"], sid))
        return "session %s in the first request and in `who`" % sid
    rows.run("a-digest", digest)

    def mcp():
        check(sid, "no digest session to act on")
        offered = [n[len(PREFIX):] for n in state["first"].tool_names()
                   if n.startswith(PREFIX)]
        check(set(offered) == set(LEAN), "agents-room tools offered: %s (expected the "
              "lean listing %s)" % (sorted(offered), list(LEAN)))
        check(last is not None, "the turn stopped before its 5th request (requests: %d)"
              % len(box.mock.model_calls()))
        joined, received = [result_json(t) or {} for t in last_results(last, 4)[:2]]
        check(joined.get("session_id") == sid, "room_join without arguments answered "
              "%s, not the digest's session %s (an orphan session)" % (
                  joined.get("session_id") or one_line(last_results(last, 4)[0], 200), sid))
        check("messages" in received, "msg_recv on %s failed: %s" % (
            sid, one_line(last_results(last, 4)[1], 200)))
        check(state["who_end"] == [sid], "`who` lists %s after room_join, expected only %s"
              % (state["who_end"], sid))
        return "%d tools offered as %s*; room_join -> %s; msg_recv ok; one session" % (
            len(offered), PREFIX, sid)
    rows.run("b-mcp-session", mcp)

    def room_call():
        check(last is not None, "the turn never got to room_call")
        text = last_results(last, 4)[2]
        answer = result_json(text) or {}
        check("error" not in answer and not answer.get("isError"),
              "room_call task add failed: %s" % one_line(text, 240))
        listed = box.ar("task", "list", "--session", sid, "--json")
        titles = [t.get("title") for t in listed.get("tasks", [])] if isinstance(
            listed, dict) else []
        check(TASK_TITLE in titles, "the task is not on the board: %s" % one_line(listed, 200))
        return "room_call task add -> %s; on the board" % one_line(
            json.dumps(answer), 80)
    rows.run("f-room-call", room_call)

    def doctor_check():
        check(last is not None, "the turn never got to the shell tool")
        text = last_results(last, 4)[3]
        with open(os.path.join(box.dir, "doctor.txt"), "w") as handle:
            handle.write(text)
        lines = [l.strip() for l in text.splitlines() if "this session" in l]
        check(lines, "doctor in the session does not name it: %s" % one_line(
            [l for l in text.splitlines() if "harness" in l or "session" in l], 300))
        check(sid in lines[0] and "gemini-resume" in lines[0], "doctor says %r (expected "
              "session %s and lever gemini-resume)" % (lines[0], sid))
        asked = "" if box.mode == "gemini-p" else (
            "; the TUI asked first, answered Allow once" if state.get("approved") else
            "; the TUI did not ask before running it")
        return one_line(lines[0], 140) + asked
    rows.run("g-doctor", doctor_check)

    state["phase"] = "idle"
    if box.mode == "gemini-tui" and sid:
        e1_idle(box, rows, sid)

    def exit_check():
        check(sid, "no session to end")
        if box.mode == "gemini-tui":
            check(box.tui_quit(), "/quit did not end gemini within 20 s")
        else:
            check(run and not run["hung"] and run["rc"] == 0, "gemini -p did not exit "
                  "cleanly%s" % run_hint(run))
            check(run["id"] == box.harness_key(sid), "gemini -p printed session %s, the "
                  "store's key is %s" % (run["id"], box.harness_key(sid)))
        end = time.time() + 10
        while time.time() < end:
            me, left = box.session(sid), box.processes()
            if me and me.get("ended") and me.get("liveness") == "gone" and not left:
                break
            time.sleep(0.5)
        check(me and me.get("ended"), "after the exit `who` shows %s" % one_line(me, 200))
        check(me.get("liveness") == "gone", "after the exit the session is %s"
              % me.get("liveness"))
        check(not left, "processes left after the exit: %s" % describe(left))
        return "ended (SessionEnd), liveness gone, no process left"
    rows.run("h-exit", exit_check)

    def resume_wake():
        check(rows.get("h-exit", ("FAIL",))[0] == "PASS", "the session did not end")
        before = len(box.mock.model_calls())
        state["phase"] = "woken"
        sent_at = time.time()
        box.send(sid)
        woke = box.mock.wait_for(lambda calls: len(calls) > before and calls[before], 40)
        check(woke is not None, "no turn within 40 s of the send (delivery states %s; "
              "wake events %s)" % (box.states(), [e["data"] for e in box.events(
                  "wake.try") + box.events("wake.accepted")][-3:]))
        latency = woke.at - sent_at
        box.latency = latency
        # The woken turn's user message (all its parts): the prompt the lever gave.
        contents = woke.messages()
        tail = "\n".join(p.get("text", "") for p in (contents[-1].get("parts") or [])
                         if isinstance(p, dict)) if contents else ""
        check(SIGNAL_RE.search(tail), "the woken turn's prompt is not the signal: %r"
              % tail[-300:])
        check(len(SIGNAL_RE.findall(tail)) == 1, "the woken turn shows the signal %d "
              "times: %r" % (len(SIGNAL_RE.findall(tail)), tail[-400:]))
        check(sid in tail, "the woken turn's signal does not name session %s" % sid)
        check(not secrets_shown([woke]), "subject/body rode the wake")
        end = time.time() + 30
        while time.time() < end and box.processes():
            time.sleep(0.5)
        accepted = [json.loads(e["data"] or "{}") for e in box.events("wake.accepted")]
        final = box.states()
        check(any(a.get("lever") == "gemini-resume" for a in accepted),
              "the resume lever recorded no accepted outcome: %s" % (
                  box.events("wake.failed") or box.events("wake.offered") or "nothing"))
        check(final[-1] == "read", "after the woken turn's msg_recv the peer sees %s" % final)
        check(not box.processes(), "the resumed gemini did not exit within 30 s")
        return "woke in %.1f s (%s: %s -> accepted by gemini-resume, %s); prompt %r" % (
            latency, "state at the woken request", state["at_woken"], final[-1],
            signal_line(tail)[:70])
    rows.run("e2-resume-wakes", resume_wake)


def approve_shell(box, state, timeout=30):
    """The TUI asks before the shell tool runs the doctor: answer as a user,
    'Allow once' (the dialog's first choice)."""
    end = time.time() + timeout
    while time.time() < end:
        if state.get("last") is not None:
            return
        screen = box.visible()
        if "Allow once" in screen:
            box.suite.tmux("send-keys", "-t", box.tmux, "Enter")     # 1. Allow once
            state["approved"] = state.get("approved", 0) + 1
            time.sleep(1.0)
            continue
        time.sleep(0.3)


def e1_idle(box, rows, sid):
    """e1: a send to the idle open TUI: nothing starts a turn."""
    def idle():
        time.sleep(1.0)
        before = len(box.mock.model_calls())
        box.send(sid)
        woke = box.mock.wait_for(lambda calls: len(calls) > before, IDLE_S)
        states = box.states()
        tried = [json.loads(e["data"] or "{}").get("lever") for e in box.events("wake.try")]
        check(woke is None, "a turn started in the open TUI (unexpected: Gemini CLI has no "
              "way in while it runs); states %s" % states)
        check(states == ["offered"], "the delivery to the idle TUI is %s (expected offered: "
              "the resume lever waits for the session's process to end)" % states)
        return "no turn in %d s; delivery %s (lever %s tried, held back: the TUI still runs)" % (
            IDLE_S, states[0], tried[-1] if tried else "none")
    rows.run("e1-idle-not-woken", idle)


def s_signal(box, rows):
    """c: a message sent while the model works reaches a later request as the signal."""
    state = {}

    def script(req):
        sid = req.session_id()
        if sid and not req.tool_results():
            if "sent" not in state:
                state["sent"] = box.send(sid)
            return Reply(text="looking", calls=[Call("list_directory",
                                                      {"dir_path": box.repo})])
        return Reply(text="done")
    box.mock.script = script
    run, calls = start_turn(box, "work on something", 2)

    def midturn():
        check("sent" in state, "no digest session id reached the model%s" % run_hint(run))
        check(state["sent"].get("recipients") == 1, "send reached %r" % state["sent"])
        check(len(calls) >= 2, "no request after the tool call%s" % run_hint(run))
        check(not SIGNAL_RE.search(calls[0].all_text()), "the signal was in the first request")
        tail = new_text(calls[1], calls[0])
        check(SIGNAL_RE.search(tail), "the request after the tool call has no 'agents-room: "
              "N unread message' signal; new text: %r" % tail[-300:])
        where = "in the tool result" if any(SIGNAL_RE.search(t) for t in last_results(
            calls[1], 1)) else "elsewhere"
        leaked = secrets_shown(calls)
        check(not leaked, "subject/body reached the model (requests %s)" % leaked)
        return "signal %s: %s" % (where, signal_line(tail)[:100])
    rows.run("c-midturn-signal", midturn)


def s_hold(box, rows):
    """d: a turn's end held once with the signal, not again in the next turn."""
    state = {"turn": 1}

    def script(req):
        sid = req.session_id()
        if sid and "sent" not in state:
            state["sid"] = sid
            state["sent"] = box.send(sid)
        return Reply(text="done-turn%d" % state["turn"])
    box.mock.script = script
    run, first = start_turn(box, "first task", 2)
    shown_user = [l.strip() for l in (box.visible() if box.tmux else "").splitlines()
                  if "blocked" in l or "request failed" in l]

    def hold():
        check("sent" in state, "no digest reached the model%s" % run_hint(run))
        if run is not None:
            check(not run["hung"] and run["rc"] == 0, "the first run did not end well%s"
                  % run_hint(run))
        check(len(first) >= 2, "the end of the turn was not held: %d request(s), no "
              "continuation (delivery states %s)" % (len(first), box.states()))
        shown = new_text(first[1], first[0])
        check(SIGNAL_RE.search(shown), "the continuation does not carry the signal: %r"
              % shown[-300:])
        check("agents_room" not in shown and "--event=Stop" not in shown,
              "the model sees the hook's command line")
        check(len(first) == 2, "the Stop was held %d times in one turn" % (len(first) - 1))
        check(not secrets_shown(first), "subject/body shown to the model")
        state["turn"] = 2
        if box.mode == "gemini-tui":
            check(box.tui_send("second task"), "the TUI sent no request for turn 2")
            calls = box.wait_quiet(3, quiet=3.0)
        else:
            key = box.harness_key(state["sid"])
            second_run = box.oneshot("second task", resume=key)
            check(second_run["rc"] == 0, "gemini --resume %s -p failed%s" % (
                key, run_hint(second_run)))
            calls = box.mock.model_calls()
        second = calls[2:]
        check(second, "the second turn made no request")
        check(len(second) == 1, "the same delivery held the end of turn 2 again (%d "
              "requests in turn 2)" % len(second))
        for line in shown_user:
            check("agents_room" not in line and "--event" not in line,
                  "the TUI shows the hook's command line: %r" % line)
        return "held once (continuation: %s), not again in turn 2%s" % (
            signal_line(shown)[:70], "" if not shown_user else "; the TUI shows %s" %
            " / ".join(repr(one_line(l, 70)) for l in shown_user))
    rows.run("d-hold-once", hold)


# name, autonomy, modes, function, cases (in the order they are reported)
SCENARIOS = [
    ("session", 2, MODES, s_session,
     ("a-digest", "b-mcp-session", "f-room-call", "g-doctor", "e1-idle-not-woken", "h-exit",
      "e2-resume-wakes")),
    ("signal", 0, MODES, s_signal, ("c-midturn-signal",)),
    ("hold", 1, MODES, s_hold, ("d-hold-once",)),
]


def cases_of(scenario, mode):
    return [c for c in scenario[4] if not (c.startswith("e1") and mode != "gemini-tui")]


# ---- the suite ------------------------------------------------------------------

class Suite:
    def __init__(self, args):
        self.bin = os.path.abspath(args.bin)
        self.keep = args.keep
        os.makedirs(args.workdir, exist_ok=True)
        self.root = tempfile.mkdtemp(prefix="gemini-", dir=os.path.abspath(args.workdir))
        self.socket = "agents-room-e2e-gemini-%d" % os.getpid()
        self.results = {}           # (scenario, mode) -> [(case, status, detail)]
        self.latency = {}
        self.print_lock = threading.Lock()

    def tmux(self, *args, check=True, rc=False):
        try:
            done = subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null"] + list(args),
                                  capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            raise Failure("tmux %s timed out" % args[0])
        if rc:
            return done.returncode
        if check and done.returncode != 0:
            raise Failure("tmux %s: %s" % (args[0], done.stderr.strip()))
        return done.stdout

    def run_chain(self, chain):
        for scenario, mode in chain:
            self.run_scenario(scenario, mode)

    def run_scenario(self, scenario, mode):
        name, autonomy, _, function, _ = scenario
        started = time.time()
        rows = Rows()
        box = None
        try:
            box = Box(self, name, mode, autonomy)
            box.latency = None
            function(box, rows)
        except Failure as error:
            rows.setdefault("!" + name, ("FAIL", str(error)))
        except Exception as error:  # a broken scenario is a failure, never a crash
            rows.setdefault("!" + name, ("FAIL", "error: %s: %s" % (type(error).__name__,
                                                                    error)))
        finally:
            if box is not None:
                if box.latency is not None:
                    self.latency[mode] = box.latency
                box.cleanup()
        elapsed = time.time() - started
        broken = rows.get("!" + name)
        found = []
        for case in cases_of(scenario, mode):
            status, detail = rows.get(case) or (("FAIL", "not reached: " + broken[1])
                                                if broken else ("FAIL", "not reached"))
            found.append(("%s/%s" % (case, mode), status, detail))
        self.results[(name, mode)] = found
        with self.print_lock:
            print("---- %s/%s [autonomy %d] %.1fs%s" % (name, mode, autonomy, elapsed,
                  "".join("; note: " + n for n in (box.notes if box else []))), flush=True)
            for label, status, detail in found:
                print("%-4s %-32s %s" % (status, label, one_line(detail, 200)), flush=True)

    def close(self):
        self.tmux("kill-server", check=False)
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)


def selected(only):
    wanted = [w.strip() for w in (only or "").split(",") if w.strip()]
    for scenario in SCENARIOS:
        for mode in scenario[2]:
            names = ["%s/%s" % (c, mode) for c in cases_of(scenario, mode)]
            if not wanted or any(w in n or w == scenario[0] for w in wanted for n in names):
                yield scenario, mode, names


def version_of(bin_dir):
    home = tempfile.mkdtemp(prefix="gemini-version-")
    try:
        out = subprocess.run([os.path.join(bin_dir, "gemini"), "--version"],
                             capture_output=True, text=True, timeout=60,
                             env={"PATH": os.environ.get("PATH", ""), "HOME": home}).stdout
    except (OSError, subprocess.SubprocessError):
        return "?"
    finally:
        shutil.rmtree(home, ignore_errors=True)
    found = re.search(r"\d+\.\d+\.\d+\S*", out)
    return found.group(0) if found else "?"


def truth_rows(results, version, latency):
    """The README truth table's rows, one per mode (.ci/e2e_report.py)."""
    status = {case: s for case, s, _ in results}

    def cell(case):
        value = status.get(case)
        return None if value is None else value == "PASS"
    p_lat, t_lat = latency.get("gemini-p"), latency.get("gemini-tui")
    row("gemini", version, "gemini -p", digest=cell("a-digest/gemini-p"),
        signal=cell("c-midturn-signal/gemini-p"), hold=cell("d-hold-once/gemini-p"),
        wake=cell("e2-resume-wakes/gemini-p"), latency=p_lat,
        note="wake: the finished run is resumed (gemini --resume <id> -p <signal>)")
    idle, resumed = cell("e1-idle-not-woken/gemini-tui"), cell("e2-resume-wakes/gemini-tui")
    row("gemini", version, "gemini (TUI)", digest=cell("a-digest/gemini-tui"),
        signal=cell("c-midturn-signal/gemini-tui"), hold=cell("d-hold-once/gemini-tui"),
        wake="n/a" if idle else cell("e1-idle-not-woken/gemini-tui"),
        note="no way in while the TUI runs: a send to an idle TUI stays offered; after "
             "/quit the session is resumed headless (gemini --resume <id> -p <signal>)%s"
             % ("" if not resumed else ", %.1f s" % t_lat if t_lat else "")
             + ("" if resumed in (True, None) else " (resume FAILED)"))


def main():
    global VERBOSE, AR
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", required=True, help="the npm prefix's node_modules/.bin "
                        "with gemini in it")
    parser.add_argument("--only", help="run the scenarios with a case whose name contains "
                        "one of these (comma-separated), e.g. c-midturn or gemini-tui")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--keep", action="store_true", help="keep the work directory "
                        "(homes, stores, requests.json, screens per scenario)")
    parser.add_argument("--workdir", default=os.path.join(ROOT, ".e2e"))
    parser.add_argument("--agents-room", default=AR, help="the agents_room.py under test")
    parser.add_argument("--jobs", type=int, default=2, help="2 (default): the two modes' "
                        "scenarios side by side; 1: one at a time")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    VERBOSE = args.verbose
    AR = os.path.abspath(args.agents_room)
    chosen = list(selected(args.only))
    if args.list:
        for scenario, mode, names in chosen:
            for name in names:
                print("%-34s (scenario %s, autonomy %d)" % (name, scenario[0], scenario[1]))
        return 0
    if not chosen:
        print("no case matches %r" % args.only)
        return 2
    missing = [t for t in ("git", "tmux", "node") if shutil.which(t) is None]
    if not os.path.exists(os.path.join(args.bin, "gemini")):
        missing.append("gemini (in %s)" % args.bin)
    if missing:
        print("e2e_gemini: missing %s" % ", ".join(missing))
        return 2
    version = version_of(args.bin)
    suite = Suite(args)
    started = time.time()
    print("e2e_gemini: %s, gemini-cli %s (%s)" % (AR, version, suite.bin), flush=True)
    # The modes' scenarios run as two chains side by side (each box has its own
    # HOME, store, mock and tmux session); --jobs 1 runs them one after another.
    chains = [[(sc, m) for sc, m, _ in chosen if m == mode] for mode in MODES]
    chains = [c for c in chains if c]
    if args.jobs < 2:
        chains = [[item for chain in chains for item in chain]]
    try:
        threads = [threading.Thread(target=suite.run_chain, args=(chain,), daemon=True)
                   for chain in chains]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        suite.close()
    results = [r for sc, m, _ in chosen for r in suite.results.get((sc[0], m), [])]
    print("\n%-4s  %-32s  %s" % ("", "case", "why"))
    for case, status, detail in results:
        print("%-4s  %-32s  %s" % (status, case, one_line(detail, 220)))
    truth_rows(results, version, suite.latency)
    failed = sum(1 for r in results if r[1] == "FAIL")
    passed = sum(1 for r in results if r[1] == "PASS")
    print("\n%.0f s%s" % (time.time() - started, "" if not args.keep else
                           "; kept %s" % suite.root))
    print("e2e_gemini: gemini-cli %s: %d passed, %d failed" % (version, passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
