#!/usr/bin/env python3
"""End-to-end: real OpenCode turns (npm opencode-ai), offline, against .ci/mock_model.py;
with --harness kilo the same for its fork Kilo Code (npm @kilocode/cli).

    make e2e-opencode                 # installs the pinned opencode-ai, runs this, cleans up
    make e2e-kilo                     # the same with the pinned @kilocode/cli
    python3 .ci/e2e_opencode.py --bin DIR [--harness opencode|kilo] [--only NAME[,NAME...]]
                                [--list] [--keep] [--jobs N] [-v]

Kilo Code is OpenCode under other names (the program kilo, kilo.json, .kilo/,
~/.config/kilo, KILO_* variables, @kilocode/plugin); the flavour below holds
them, and every case is the same.  Below, read "opencode" as either.

DIR is the npm prefix's node_modules/.bin (it holds `opencode`).  Each case is
SCENARIO/MODE, e.g. c-midturn-signal/run; --only matches any part of it.
Modes: run (`opencode run MESSAGE`, one-shot) and tui (interactive `opencode`
in tmux).  Cases run --jobs at a time (default 2), each in a world of its own.

Every case gets its own HOME and XDG directories, a git repository `api` set up
with `agents_room.py setup opencode --write [--autonomy N]` (opencode.json: the
MCP entry and `permission: agents-room_* allow`; .opencode/plugin/agents-room.js:
the plugin that runs the hooks), its own AGENTS_ROOM_DB and its own mock model
on 127.0.0.1, which records each request: the assertions are on what the model
was shown.  A peer session (the CLI: join, send, sent) plays the other agent.

What the test writes besides setup's files is about the mock only:
  * $XDG_CONFIG_HOME/opencode/opencode.json: a provider `mock`
    (@ai-sdk/openai-compatible, bundled in OpenCode) with baseURL the mock,
    as model and small_model; autoupdate off, share disabled;
  * OPENCODE_DISABLE_AUTOUPDATE / _MODELS_FETCH / _LSP_DOWNLOAD, and
    HTTP(S)_PROXY at a closed local port (NO_PROXY=127.0.0.1): nothing leaves
    the machine;
  * a speed-up: OpenCode makes the first start with a plugin wait for its own
    `npm install @opencode-ai/plugin` in each config directory (20 s online,
    70 s of retries offline).  The test seeds ~/.config/opencode and
    .opencode with an empty node_modules/ and a package-lock.json listing that
    package, which is OpenCode's own "already installed" test; the plugin
    imports nothing from it.  A user waits for that install once.
No trust, approval or permission state is written behind setup's back.

Scenarios (setup --autonomy in brackets); every case checks its own part:
  a-digest [0]          the SessionStart digest ("your session_id is <16 hex>") is in the
                        first request, and `who` shows that session (harness opencode)
  b-mcp-session [0]     the model is offered the lean listing (agents-room_room_join ...
                        agents-room_room_call, nothing else of ours); room_join {} and
                        msg_recv act on the digest's session; no second session in `who`
  c-midturn-signal [0]  a message sent while OpenCode works shows up after the next tool
                        result as the one-line signal, never with subject or body
  d-hold-once [1]       the end of a turn with unread mail is held once (the continuation
                        carries the signal), not again; not in the next turn either
                        (run: `opencode run --session`)
  e-wake [2]            tui: a send to the idle session starts a turn (the plugin's
                        rewake waiter); latency; the sender sees offered/accepted, then
                        read.  Before the first prompt there is no session to wake (row
                        e0).  run: `opencode run` exits when idle, so a send resumes the
                        finished session (lever opencode-resume: opencode run --session).
                        e-wake-send: right after the send the sender sees offered or
                        accepted, and the send's wake plan printed no error
  f-room-call [0]       the model adds a task through room_call {op: task} and it is there
  g-doctor [2]          `agents_room.py doctor` in OpenCode's bash tool names this session,
                        the harness and the wake lever, and finds setup's plugin and entry
  h-exit [2]            the session ends (SessionEnd at OpenCode's exit): `who` shows it
                        ended and gone; no process of the case is left (MCP server, waiter)

Prints a PASS/FAIL table and one E2E-ROW line per mode (.ci/e2e_report.py);
exits 1 on any FAIL.  Standard library only; needs git and tmux.
"""

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from mock_model import Call, MockModel, Reply  # noqa: E402
from e2e_report import row as report_row  # noqa: E402

from e2e_common import (  # noqa: E402
    drop_ci_markers, Failure, SIGNAL_RE, Skip, check, file_sha, kill_group, one_line, signal_line)

drop_ci_markers()

AR = os.path.join(ROOT, "agents_room.py")
MODES = ("run", "tui")
PREFIX = "agents-room_"                 # how OpenCode names our MCP tools
LEAN = ("room_join", "msg_send", "msg_recv", "room_who", "lease_claim", "lease_release",
        "note_read", "drift_check", "room_call")
SESSION_RE = re.compile(r"your session_id is ([0-9a-f]{16})")
SECRET_SUBJECT = "E2E-SECRET-SUBJECT"
SECRET_BODY = "E2E-SECRET-BODY"
CLOSED = "http://127.0.0.1:9"           # a port nothing listens on
VERBOSE = False


class Flavor:
    """What differs between OpenCode and a fork of it."""

    def __init__(self, name, title, program, env, config_name, project_dir, schema, plugin,
                 package, offline=None, cold=0, config=None):
        self.name, self.title, self.program, self.env = name, title, program, env
        self.config_name, self.project_dir, self.schema = config_name, project_dir, schema
        self.plugin, self.package = plugin, package
        # mock-side variables of its own: what it would otherwise fetch or send
        self.offline = offline or {}
        # seconds a start takes beyond OpenCode's (its own bounds grow by this)
        self.cold = cold
        # mock-side settings of its own in the global config (a speed-up)
        self.config = config or {}


FLAVORS = {
    "opencode": Flavor("opencode", "OpenCode", "opencode", "OPENCODE_", "opencode.json",
                       ".opencode", "https://opencode.ai/config.json", "@opencode-ai/plugin",
                       "opencode-ai"),
    "kilo": Flavor("kilo", "Kilo Code", "kilo", "KILO_", "kilo.json", ".kilo",
                   "https://app.kilo.ai/config.json", "@kilocode/plugin", "@kilocode/cli",
                   # telemetry (PostHog), session upload, presence and the codebase
                   # index, each of which would wait on the closed proxy
                   {"KILO_TELEMETRY_LEVEL": "off", "KILO_DISABLE_SESSION_INGEST": "1",
                    "KILO_DISABLE_PRESENCE": "1", "KILO_DISABLE_CODEBASE_INDEXING": "1",
                    "KILO_DISABLE_SHARE": "1"},
                   # a start of kilo run took 30-55 s at a load of 12 on two cores
                   cold=60,
                   # Kilo's undo snapshots of the work tree: on a loaded machine their
                   # first build outlasts a turn and the TUI asks whether to disable
                   # them; agents-room has nothing to do with them
                   config={"snapshot": False}),
}
H = FLAVORS["opencode"]                 # set by --harness


def log(text):
    if VERBOSE:
        sys.stderr.write("  . %s\n" % text)
        sys.stderr.flush()


# ---- the world of one case ---------------------------------------------------

class Box:
    """A temporary HOME (with XDG dirs), a git repository `api`, a store, a mock
    model of its own, OpenCode configured by agents_room.py setup, a peer."""

    def __init__(self, suite, case, mode, autonomy=0):
        self.suite, self.mode, self.autonomy = suite, mode, autonomy
        self.name = re.sub(r"[^a-z0-9]+", "-", case.lower()).strip("-")
        self.dir = os.path.join(suite.root, self.name)
        self.home = os.path.join(self.dir, "home")
        self.repo = os.path.join(self.dir, "api")
        self.db = os.path.join(self.dir, "store", "room.db")
        self.config_home = os.path.join(self.home, ".config")
        self.tmux = None
        self.peer_sid = None
        self.runs = 0
        self.latency = None          # a wake's, when the case measured one
        self.last_stderr = ""
        self.mock = MockModel(log=lambda text: log("%s %s" % (self.name, text))).start()
        for path in (self.home, self.repo, os.path.dirname(self.db)):
            os.makedirs(path, exist_ok=True)
        os.chmod(os.path.dirname(self.db), 0o700)     # as agents_room makes its own
        self.env = self._env()
        git = ["git", "-c", "user.name=e2e", "-c", "user.email=e2e@localhost"]
        subprocess.run(git + ["init", "-q", self.repo], check=True)
        with open(os.path.join(self.repo, "README"), "w") as handle:
            handle.write("e2e\n")
        subprocess.run(git + ["-C", self.repo, "add", "README"], check=True)
        subprocess.run(git + ["-C", self.repo, "commit", "-qm", "init"], check=True)
        self._mock_provider()
        self.setup()
        self._seed_plugin_install()

    def _env(self):
        drop = ("OPENCODE", "KILO", "AGENTS_ROOM", "CLAUDE", "CODEX_", "ANTHROPIC", "OPENAI", "TMUX",
                "XDG_", "npm_config_", "NPM_CONFIG_")
        env = {k: v for k, v in os.environ.items() if not k.startswith(drop) and k.lower() not in (
            "http_proxy", "https_proxy", "all_proxy", "no_proxy")}
        env.update({
            "HOME": self.home,
            "XDG_CONFIG_HOME": self.config_home,
            "XDG_DATA_HOME": os.path.join(self.home, ".local", "share"),
            "XDG_CACHE_HOME": os.path.join(self.home, ".cache"),
            "XDG_STATE_HOME": os.path.join(self.home, ".local", "state"),
            "PATH": self.suite.bin + os.pathsep + env.get("PATH", "/usr/bin:/bin"),
            "AGENTS_ROOM_DB": self.db,
            "AGENTS_ROOM_E2E_BOX": self.dir,      # marks every process of this case
            # mock-side: no update check, no models.dev, no LSP downloads; the
            # mock is reached directly, anything else meets a closed port
            H.env + "DISABLE_AUTOUPDATE": "1",
            H.env + "DISABLE_MODELS_FETCH": "1",
            H.env + "DISABLE_LSP_DOWNLOAD": "1",
            "HTTP_PROXY": CLOSED, "HTTPS_PROXY": CLOSED, "http_proxy": CLOSED,
            "https_proxy": CLOSED, "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost", "npm_config_registry": CLOSED + "/",
            "TERM": "xterm-256color",
            "LANG": env.get("LANG", "C.UTF-8"),
        })
        env.update(H.offline)
        return env

    def _mock_provider(self):
        """The global OpenCode config: the mock as the only provider (mock-side)."""
        config = {
            "$schema": H.schema,
            "autoupdate": False, "share": "disabled",
            "model": "mock/mock-model", "small_model": "mock/mock-model",
            "provider": {"mock": {
                "npm": "@ai-sdk/openai-compatible", "name": "Mock",
                "options": {"baseURL": self.mock.url + "/v1", "apiKey": "sk-mock"},
                "models": {"mock-model": {"name": "Mock Model", "tool_call": True,
                                          "limit": {"context": 200000, "output": 8192}}}}}}
        config.update(H.config)
        os.makedirs(os.path.join(self.config_home, H.name), exist_ok=True)
        with open(os.path.join(self.config_home, H.name, H.config_name), "w") as handle:
            json.dump(config, handle, indent=2)

    def _seed_plugin_install(self):
        """A speed-up, not a user step: OpenCode's `npm install @opencode-ai/plugin`
        returns at once where node_modules exists and package-lock.json lists it."""
        lock = {"packages": {"": {"dependencies": {
            H.plugin: self.suite.version}}}}
        for where in (os.path.join(self.config_home, H.name),
                      os.path.join(self.repo, H.project_dir)):
            os.makedirs(os.path.join(where, "node_modules"), exist_ok=True)
            with open(os.path.join(where, "package-lock.json"), "w") as handle:
                json.dump(lock, handle)

    def setup(self):
        argv = [sys.executable, AR, "setup", H.name, "--write"]
        if self.autonomy:
            argv += ["--autonomy", str(self.autonomy)]
        done = subprocess.run(argv, cwd=self.repo, env=self.env, capture_output=True,
                              text=True, timeout=60)
        if done.returncode != 0:
            raise Failure("setup %s failed: %s" % (H.name, done.stderr.strip()[-300:]))
        self.setup_said = done.stdout + done.stderr

    # -- agents-room CLI, as the peer or as an observer
    def ar(self, *args, check_rc=True):
        done = subprocess.run([sys.executable, AR] + list(args), cwd=self.dir, env=self.env,
                              capture_output=True, text=True, timeout=60)
        if check_rc and done.returncode != 0:
            raise Failure("agents_room.py %s failed: %s" % (" ".join(args[:2]),
                                                            done.stderr.strip()[-300:]))
        self.last_stderr = done.stderr
        try:
            return json.loads(done.stdout)
        except ValueError:
            return done.stdout

    def peer(self):
        if self.peer_sid is None:
            joined = self.ar("join", "--room", "repo:api", "--label", "peer",
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

    def wait_sessions(self, predicate, timeout):
        end = time.time() + timeout
        while True:
            found = self.sessions()
            if predicate(found) or time.time() > end:
                return found
            time.sleep(0.3)

    # -- one-shot runs: opencode run
    def oneshot(self, message, session=None, timeout=60):
        """Run `opencode run [--session S] MESSAGE` to its end.  MESSAGE is one
        word (run quotes an argument with a space before the model sees it).
        -> dict(rc, out, err, elapsed, hung)."""
        self.runs += 1
        argv = [os.path.join(self.suite.bin, H.program), "run", "--print-logs"] + (
            ["--session", session] if session else []) + [message]
        timeout += H.cold
        log("%s: run %s" % (self.name, " ".join(argv[1:])))
        out_path = os.path.join(self.dir, "run-%d.out" % self.runs)
        # OpenCode takes its project from $PWD, not from the process's cwd.
        env = dict(self.env, PWD=self.repo)
        with open(out_path, "w") as out, open(out_path + ".err", "w") as err:
            proc = subprocess.Popen(argv, cwd=self.repo, env=env, stdin=subprocess.DEVNULL,
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
        return {"rc": proc.returncode, "out": out_text, "err": err_text, "elapsed": elapsed,
                "hung": hung}

    # -- interactive runs in tmux
    def tui_start(self, timeout=60):
        self.tmux = "oc-%s" % self.name[-40:]
        envfile = os.path.join(self.dir, "env.sh")
        with open(envfile, "w") as handle:
            for key, value in sorted(self.env.items()):
                if re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
                    handle.write("export %s=%s\n" % (key, shlex.quote(value)))
        command = "bash --norc --noprofile -c %s" % shlex.quote(
            ". %s; cd %s && export PWD=%s && exec %s 2>%s" % (
                shlex.quote(envfile), shlex.quote(self.repo), shlex.quote(self.repo), H.program,
                shlex.quote(os.path.join(self.dir, "tui.stderr"))))
        self.suite.tmux("new-session", "-d", "-s", self.tmux, "-x", "160", "-y", "50", command)
        timeout += H.cold
        if not self.wait_screen("Ask anything", timeout):
            raise Failure("the TUI did not become ready in %d s; screen:\n%s"
                          % (timeout, self.screen()))
        time.sleep(0.5)

    def screen(self):
        return self.suite.tmux("capture-pane", "-p", "-t", self.tmux, check=False)

    def wait_screen(self, needle, timeout):
        end = time.time() + timeout
        while time.time() < end:
            if needle in self.screen():
                return True
            time.sleep(0.3)
        return False

    def tui_send(self, text):
        self.suite.tmux("send-keys", "-t", self.tmux, "-l", text)
        time.sleep(0.3)
        self.suite.tmux("send-keys", "-t", self.tmux, "Enter")

    def tui_pid(self):
        """The opencode process in the pane (bash execs it)."""
        out = self.suite.tmux("list-panes", "-t", self.tmux, "-F", "#{pane_pid}",
                              check=False).split()
        return int(out[0]) if out and out[0].isdigit() else None

    def wait_quiet(self, at_least, quiet=1.5, timeout=60):
        """TUI: wait (at most timeout s) for at_least main requests, then until
        OpenCode is idle: no new main request for `quiet` s and the screen no
        longer offers "esc interrupt" (shown while a turn runs)."""
        self.mock.wait_for(lambda calls: len(calls) >= at_least, timeout + H.cold)
        end = time.time() + 30
        while time.time() < end:
            calls = self.mock.model_calls()
            idle = time.time() - (calls[-1].at if calls else 0)
            if idle > quiet and "esc interrupt" not in self.screen():
                break
            time.sleep(0.3)
        return self.mock.model_calls()

    def processes(self):
        """Pids (and command lines) of this case's processes still running."""
        return marked_processes([self.dir, self.db])

    def wait_waiter(self, timeout):
        """The pid of the plugin's rewake waiter (hook --event=Stop --wait) once
        it runs and the store has it as the session's armed waiter.  (`who`
        names the session's recorded lever, opencode-resume, and shows an armed
        waiter only where a session has no lever.)"""
        end = time.time() + timeout
        while True:
            running = [pid for pid, argv in self.processes().items()
                       if "--event=Stop" in argv and "--wait" in argv]
            armed = set(self.armed_waiters())
            found = [pid for pid in running if pid in armed]
            if found or time.time() > end:
                return found[0] if found else None
            time.sleep(0.3)

    def query(self, sql):
        """Rows from the case's store, read-only ([] when it cannot be read)."""
        try:
            conn = sqlite3.connect("file:%s?mode=ro" % self.db, uri=True, timeout=5)
            try:
                return conn.execute(sql).fetchall()
            finally:
                conn.close()
        except sqlite3.Error:
            return []

    def armed_waiters(self):
        """waiter_pid of every session in the store."""
        return [r[0] for r in self.query(
            "SELECT waiter_pid FROM sessions WHERE waiter_pid IS NOT NULL")]

    def wake_events(self):
        """The store's wake.* events, oldest first, for a failure's detail."""
        return ["%s %s" % (kind, one_line(data or "", 160)) for kind, data in self.query(
            "SELECT kind, data FROM events WHERE kind LIKE 'wake.%' ORDER BY id")]

    def cleanup(self):
        if self.tmux:
            try:
                with open(os.path.join(self.dir, "screen.txt"), "w") as handle:
                    handle.write(self.screen())
            except OSError:
                pass
            self.suite.tmux("kill-session", "-t", self.tmux, check=False)
            time.sleep(0.3)
        kill_marked([self.dir, self.db])
        try:
            self.mock.dump(os.path.join(self.dir, "requests.json"))
        except OSError:
            pass
        self.mock.stop()


def marked_processes(markers):
    """{pid: argv} of processes whose environment names a case's dir or store."""
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
            with open("/proc/%s/cmdline" % entry, "rb") as handle:
                argv = [a.decode("utf-8", "replace") for a in handle.read().split(b"\0") if a]
        except OSError:
            continue
        if any(item in wanted for item in environ):
            found[int(entry)] = argv
    return found


def kill_marked(markers):
    """End the processes this suite started for a case, by pid."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        found = marked_processes(markers)
        for pid in found:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        if not found:
            return
        time.sleep(0.5)


# ---- what the model was shown ---------------------------------------------------

def new_text(req, before):
    """Text in req that a previous request `before` did not have (the tail)."""
    old = before.all_text() if before is not None else ""
    text = req.all_text()
    if text.startswith(old):
        return text[len(old):]
    seen = set(old.splitlines())
    return "\n".join(line for line in text.splitlines() if line not in seen)


def secrets_shown(calls):
    return [r.index for r in calls if SECRET_SUBJECT in r.all_text() or SECRET_BODY in r.all_text()]


def ar_call(name, args):
    return Call(PREFIX + name, args)


def bash_call(command):
    return Call("bash", {"command": command, "description": "e2e step"})


def last_result(req):
    results = req.tool_results()
    return results[-1][1] if results else ""


def opencode_session(req):
    """OpenCode's own session id (ses_...): it sends it to the model API."""
    return req.headers.get("x-session-id")


def run_hint(run):
    if not run:
        return ""
    return " (exit %s%s; stderr %r)" % (run["rc"], ", hung" if run["hung"] else "",
                                        one_line(run["err"][-300:], 300))


# ---- scenarios ----------------------------------------------------------------
# Each returns a short detail string on success and raises Failure otherwise.

def run_turn(box, prompt, expect, session=None, timeout=60):
    """One user turn: a one-shot run, or a prompt typed into the TUI (started on
    first use).  `expect`: main requests to wait for."""
    if box.mode == "tui":
        if box.tmux is None:
            box.tui_start()
        box.tui_send(prompt)
        box.wait_quiet(expect, timeout=timeout)
        return None
    run = box.oneshot(prompt, session=session, timeout=timeout)
    check(not run["hung"], "opencode run did not exit within %d s%s" % (timeout, run_hint(run)))
    return run


def s_digest(box):
    state = {}

    def script(req):
        if "who" not in state:
            state["who"] = box.sessions()
        return Reply(text="done")
    box.mock.script = script
    run = run_turn(box, "hello", 1)
    calls = box.mock.model_calls()
    check(calls, "no model request at all%s" % run_hint(run))
    sid = calls[0].session_id()
    check(sid, "the first request has no 'your session_id is <16 hex>' digest")
    who = {s["session_id"]: s for s in state["who"]}
    check(sid in who, "digest session %s is not in `who` during the turn (%s)"
          % (sid, list(who)))
    check(who[sid].get("harness") == H.name, "the session's harness is %r, not %s"
          % (who[sid].get("harness"), H.name))
    where = [t for t in calls[0].user_texts() if SESSION_RE.search(t)]
    check(where, "the digest is not in a user message part")
    return "session %s (harness %s) in the first request" % (sid, H.name)


def s_mcp(box):
    state = {}

    def script(req):
        sid = req.session_id()
        done = len(req.tool_results())
        if sid and done == 0:
            state["sid"] = sid
            state["tools"] = req.tool_names()
            return Reply(calls=[ar_call("room_join", {})])
        if sid and done == 1:
            return Reply(calls=[ar_call("msg_recv", {"session_id": sid})])
        if "who" not in state:
            state["who"] = [s["session_id"] for s in box.sessions()]
        return Reply(text="done")
    box.mock.script = script
    run = run_turn(box, "join", 3)
    calls = box.mock.model_calls()
    check(state.get("sid"), "no digest session id reached the model%s" % run_hint(run))
    sid = state["sid"]
    ours = sorted(n[len(PREFIX):] for n in state["tools"] if n.startswith(PREFIX))
    check(ours == sorted(LEAN), "offered agents-room tools %s, want the lean listing %s"
          % (ours, sorted(LEAN)))
    check(len(calls) >= 3, "expected 3 requests (join, recv, done), saw %d" % len(calls))
    results = [text for _, text in calls[-1].tool_results()]
    check(len(results) >= 2, "tool results missing: %r" % results)
    joined, received = results[0], results[1]
    joined_sid = re.findall(r'"session_id":\s*"([0-9a-f]{16})"', joined)
    check(joined_sid and joined_sid[0] == sid,
          "room_join {} over MCP returned session %s, not the digest's %s (orphan session): %s"
          % (joined_sid[:1], sid, one_line(joined, 200)))
    check('"messages"' in received and "error" not in received.lower()[:200],
          "msg_recv on the digest's session failed: %s" % received[:200])
    check(state.get("who") == [sid], "`who` lists harness sessions %s; expected only %s"
          % (state.get("who"), sid))
    return "lean listing (%d tools); room_join -> %s, msg_recv ok, one session" % (
        len(ours), sid)


def s_midturn(box):
    state = {}

    def script(req):
        sid = req.session_id()
        if sid and not req.tool_results():
            if "sent" not in state:
                state["sent"] = box.send(sid)
            return Reply(calls=[bash_call("true")])
        return Reply(text="done")
    box.mock.script = script
    run = run_turn(box, "work", 2)
    calls = box.mock.model_calls()
    check("sent" in state, "no digest session id reached the model%s" % run_hint(run))
    check(state["sent"].get("recipients") == 1, "send reached %r" % state["sent"])
    check(len(calls) >= 2, "no request after the tool call%s" % run_hint(run))
    check(not SIGNAL_RE.search(calls[0].all_text()), "the signal was already in the first "
          "request")
    tail = new_text(calls[1], calls[0])
    check(SIGNAL_RE.search(tail), "the request after the tool call has no 'agents-room: N "
          "unread message' signal; new text: %r" % tail[-300:])
    check(SIGNAL_RE.search(last_result(calls[1])), "the signal is not in the tool result: %r"
          % last_result(calls[1])[-200:])
    leaked = secrets_shown(calls)
    check(not leaked, "subject/body rode the signal (requests %s)" % leaked)
    return "signal after the bash result: %s" % signal_line(tail)[:110]


def last_message_text(req):
    """The text of a request's last message, all its blocks: Kilo adds its
    <environment_details> block after the text of every user message (and a
    resumed run's digest may follow the signal)."""
    last = (req.messages() or [{}])[-1]
    content = last.get("content")
    return content if isinstance(content, str) else "\n".join(
        b.get("text", "") for b in content or [] if isinstance(b, dict))


def s_hold_once(box):
    state = {"turn": 1}

    def script(req):
        sid = req.session_id()
        if sid and "sent" not in state:
            state["sent"] = box.send(sid)
        return Reply(text="done-turn%d" % state["turn"])
    box.mock.script = script
    run = run_turn(box, "first", 2)
    first = box.mock.model_calls()
    check("sent" in state, "no digest reached the model%s" % run_hint(run))
    check(len(first) >= 2, "the end of the turn was not held: %d request(s) and no "
          "continuation (delivery states %s)" % (len(first), box.states()))
    hold = new_text(first[1], first[0])
    check(SIGNAL_RE.search(hold), "the continuation does not carry the signal: %r"
          % hold[-300:])
    check(first[1].last_role() == "user" and SIGNAL_RE.search(last_message_text(first[1])),
          "the continuation does not end with the signal as a user message")
    check(len(first) == 2, "the Stop was held %d times in one turn" % (len(first) - 1))
    check("agents_room" not in hold and "--event=Stop" not in hold,
          "the model sees the hook command line: %r" % hold[-200:])
    leaked = secrets_shown(first)
    check(not leaked, "subject/body shown to the model (requests %s)" % leaked)
    ui = ""
    if box.mode == "tui":
        screen = box.screen()
        check("error" not in screen.lower(), "the TUI shows an error after the hold:\n%s"
              % screen)
        ui = "; the TUI shows no error"
    else:
        check("done-turn1" in run["out"], "run printed %r" % run["out"][-200:])
    # second turn, delivery still unread: must not hold again
    state["turn"] = 2
    if box.mode == "tui":
        box.tui_send("second task")
        calls = box.wait_quiet(3)
    else:
        run2 = run_turn(box, "second", 1, session=opencode_session(first[0]))
        calls = box.mock.model_calls()
        check(len(calls) > 2, "the resumed run made no request%s" % run_hint(run2))
        check(calls[2].session_id() == first[0].session_id(), "the resumed run's digest "
              "names %s, not %s" % (calls[2].session_id(), first[0].session_id()))
    second = calls[2:]
    check(second, "the second turn made no request")
    check(len(second) == 1, "the same delivery held a Stop again in the next turn "
          "(%d requests in turn 2)" % len(second))
    return "held once (the continuation ends with the signal), not again in turn 2%s" % ui


def s_wake(box, side_rows):
    """tui: the plugin's waiter; run: the opencode-resume lever."""
    state = {}

    def script(req):
        # The woken turn's prompt is the signal (a resumed run's digest may
        # follow it: the hook adds no second copy of the signal).
        if "woken" not in state and state.get("sent_at") and req.last_role() == "user" \
                and SIGNAL_RE.search(last_message_text(req)):
            state["woken"] = req
            state["at_wake"] = box.states()
            return Reply(calls=[ar_call("msg_recv", {"session_id": state["sid"]})])
        if "woken" in state and "at_recv" not in state:
            state["at_recv"] = box.states()
            return Reply(text="woken-done")
        if "sid" not in state:
            state["sid"] = req.session_id()
        return Reply(text="done-first")
    box.mock.script = script
    if box.mode == "tui":
        box.tui_start()
        time.sleep(2.0)
        before = box.sessions()
        side_rows.append(("e0-wake-before-first-prompt/tui", "SKIP",
                          "OpenCode has no agents-room session before its first prompt "
                          "(the plugin learns of a session at its first message): nothing "
                          "to address or wake" if not before else
                          "a session exists before the first prompt: %s" % before))
        box.tui_send("first task")
        box.wait_quiet(1)
    else:
        run = run_turn(box, "first", 1)
        check(run["rc"] == 0, "the first run failed%s" % run_hint(run))
    check(state.get("sid"), "no digest session id reached the model")
    sid = state["sid"]
    if box.mode == "tui":
        # the plugin arms the waiter at session.idle
        check(box.wait_waiter(15), "no rewake waiter runs after the turn (processes: %s)"
              % list(box.processes().values()))
        lever = "the waiter"
    else:
        found = box.wait_sessions(lambda s: s and s[0].get("liveness") == "gone", 10)
        check(found and found[0].get("liveness") == "gone", "the finished run's session is "
              "%s, not gone" % (found[0].get("liveness") if found else "missing"))
        lever = found[0].get("lever")
    before = len(box.mock.model_calls())
    state["sent_at"] = time.time()
    box.send(sid)
    send_said = box.last_stderr.strip()
    at_send = box.states()
    # run: the lever starts a new `opencode run` (a cold start); tui: a prompt
    bound = (60 if box.mode == "run" else 30) + (H.cold if box.mode == "run" else 0)
    woke = box.mock.wait_for(lambda calls: len(calls) > before and calls[before], bound)
    check(woke is not None, "no turn started within %d s of the send (lever %s, delivery "
          "states %s; events %s)" % (bound, lever, box.states(), box.wake_events()))
    latency = woke.at - state["sent_at"]
    box.latency = latency
    check("woken" in state, "the next request does not carry the signal: %r"
          % (woke.user_texts()[-1:] if woke.user_texts() else None))
    # run: the resumed process's plugin joins again and adds a new digest
    named = SESSION_RE.findall(woke.all_text())
    check(named and set(named) == {sid}, "the woken turn names sessions %s, not only %s"
          % (sorted(set(named)), sid))
    check(not secrets_shown([woke]), "subject/body rode the wake")
    if box.mode == "tui":
        box.wait_quiet(before + 2, timeout=30)
    else:
        # the resumed `opencode run` ends by itself after its turn
        end = time.time() + 40
        while time.time() < end and box.processes():
            time.sleep(0.3)
        check(not box.processes(), "the resumed run still runs 40 s after the wake: %s"
              % [one_line(" ".join(a), 100) for a in box.processes().values()])
    final = box.states()
    check("at_recv" in state, "the woken turn did not get to its msg_recv result")
    # The send runs the wake plan after its commit: an error there is only
    # printed (the send succeeds), and the delivery stays stored until the
    # waiter's next poll finds it.  A row of its own: the wake still happens.
    if send_said or not at_send or any(s not in ("offered", "accepted") for s in at_send):
        side_rows.append(("e-wake-send/%s" % box.mode, "FAIL",
                          "the sender's view right after the send: %s; its stderr %r"
                          % (at_send, one_line(send_said, 200))))
    else:
        side_rows.append(("e-wake-send/%s" % box.mode, "PASS",
                          "right after the send: %s, the send's wake plan ran clean"
                          % at_send))
    check(state["at_wake"] and all(s in ("accepted", "offered") for s in state["at_wake"]),
          "when the woken request came the peer saw %s" % state["at_wake"])
    check(final == ["read"], "after msg_recv the peer saw %s" % final)
    who = box.sessions()
    check(len(who) == 1, "`who` lists %d sessions after the wake: %s"
          % (len(who), [s["session_id"] for s in who]))
    return "%s woke it in %.2f s; states %s -> %s -> %s" % (
        lever, latency, at_send, state["at_wake"], final)


def s_room_call(box):
    state = {}

    def script(req):
        sid = req.session_id()
        if sid and not req.tool_results():
            state["sid"] = sid
            return Reply(calls=[ar_call("room_call", {"op": "task", "args": {
                "session_id": sid, "action": "add", "title": "e2e task"}})])
        return Reply(text="done")
    box.mock.script = script
    run = run_turn(box, "task", 2)
    calls = box.mock.model_calls()
    check(state.get("sid"), "no digest session id reached the model%s" % run_hint(run))
    check(len(calls) >= 2, "no request after room_call%s" % run_hint(run))
    result = last_result(calls[1])
    check('"ok":true' in result.replace(" ", "") and "e2e task" in result,
          "room_call {op: task, add} answered %r" % one_line(result, 300))
    tasks = box.ar("task", "--session", box.peer(), "list", "--json")
    titles = [t.get("title") for t in tasks.get("tasks", [])] if isinstance(tasks, dict) else []
    check("e2e task" in titles, "the task is not on the board: %r" % tasks)
    return "room_call task add -> on the board (%s)" % titles


def s_doctor(box):
    state = {}

    def script(req):
        sid = req.session_id()
        if sid and not req.tool_results():
            state["sid"] = sid
            return Reply(calls=[bash_call("%s %s doctor" % (shlex.quote(sys.executable),
                                                            shlex.quote(AR)))])
        return Reply(text="done")
    box.mock.script = script
    run = run_turn(box, "doctor", 2)
    calls = box.mock.model_calls()
    check(state.get("sid"), "no digest session id reached the model%s" % run_hint(run))
    check(len(calls) >= 2, "no request after the bash call%s" % run_hint(run))
    out = last_result(calls[1])
    lines = [l.strip() for l in out.splitlines()]
    mine = [l for l in lines if "this session: %s" % state["sid"] in l]
    check(mine, "doctor does not name this session %s: %r" % (state["sid"], one_line(
        [l for l in lines if "session" in l or "harness" in l], 400)))
    check(any("harness detected: " + H.name in l for l in lines),
          "doctor does not detect %s: %r" % (H.name, [l for l in lines if "harness" in l]))
    lever = re.findall(r"wake lever (\S+)", mine[0])
    check(lever, "doctor names no wake lever: %r" % mine[0])
    # doctor's own version line (issue 38: the harness against the e2e's pin)
    # is not one of the plugin's checks.
    ours = [l for l in lines if l.startswith(("ok", "warn", "fail")) and H.title in l
            and "%s version" % H.title not in l]
    check(len(ours) == 2 and all(l.startswith("ok") for l in ours),
          "doctor's %s checks (plugin, MCP entry): %r" % (H.title, ours))
    return "doctor: %s; %s" % (one_line(mine[0][4:], 120), "; ".join(
        one_line(l[4:], 40) for l in ours))


def s_exit(box):
    state = {}

    def script(req):
        if "sid" not in state:
            state["sid"] = req.session_id()
        return Reply(text="done")
    box.mock.script = script
    run = run_turn(box, "hello", 1)
    check(state.get("sid"), "no digest session id reached the model%s" % run_hint(run))
    sid = state["sid"]
    if box.mode == "tui":
        armed = box.wait_waiter(15)
        pid = box.tui_pid()
        box.tui_send("/exit")
        end = time.time() + 15
        while time.time() < end and pid and os.path.exists("/proc/%d" % pid):
            time.sleep(0.2)
        check(not (pid and os.path.exists("/proc/%d" % pid)), "the TUI did not exit within "
              "15 s of /exit; screen:\n%s" % box.screen())
        how = "/exit (the waiter was %sarmed)" % ("" if armed else "not ")
    else:
        check(run["rc"] == 0, "opencode run exited %s%s" % (run["rc"], run_hint(run)))
        how = "opencode run's end"
    found = box.wait_sessions(lambda s: s and s[0].get("liveness") == "gone", 10)
    mine = [s for s in found if s["session_id"] == sid]
    check(mine, "`who` does not list session %s any more: %s" % (sid, found))
    check(mine[0].get("liveness") == "gone", "after exit the session is %s, not gone"
          % mine[0].get("liveness"))
    check(mine[0].get("ended"), "after exit the session is gone but not ended (no "
          "SessionEnd from the plugin's dispose)")
    end = time.time() + 5
    left = box.processes()
    while left and time.time() < end:
        time.sleep(0.3)
        left = box.processes()
    check(not left, "processes left after exit: %s" % {p: one_line(" ".join(a), 120)
                                                       for p, a in left.items()})
    return "after %s: %s is ended and %s, no process left" % (how, sid,
                                                               mine[0].get("liveness"))


# name, autonomy, modes, function
SCENARIOS = [
    ("a-digest", 0, MODES, s_digest),
    ("b-mcp-session", 0, MODES, s_mcp),
    ("c-midturn-signal", 0, MODES, s_midturn),
    ("d-hold-once", 1, MODES, s_hold_once),
    ("e-wake", 2, MODES, s_wake),
    ("f-room-call", 0, MODES, s_room_call),
    ("g-doctor", 2, MODES, s_doctor),
    ("h-exit", 2, MODES, s_exit),
]


# ---- the suite ------------------------------------------------------------------

class Suite:
    def __init__(self, args, version):
        self.bin = os.path.abspath(args.bin)
        self.version = version
        self.keep = args.keep
        os.makedirs(args.workdir, exist_ok=True)
        self.root = tempfile.mkdtemp(prefix="run-", dir=os.path.abspath(args.workdir))
        self.socket = "agents-room-e2e-%s-%d" % (H.name, os.getpid())
        self.results = []
        self.latency = {}
        self.parent = {}            # a row a case adds -> that case
        self.lock = threading.Lock()

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
        side = []
        try:
            box = Box(self, case, mode, autonomy)
            detail = function(box, side) if function is s_wake else function(box)
            status = "PASS"
        except Failure as error:
            status, detail = "FAIL", str(error)
        except Skip as error:
            status, detail = "SKIP", str(error)
        except Exception as error:  # a broken case is a failure, never a crash
            status, detail = "FAIL", "error: %s: %s" % (type(error).__name__, error)
        finally:
            if box is not None:
                if box.latency is not None and status == "PASS":
                    self.latency[mode] = box.latency
                box.cleanup()
        elapsed = time.time() - started
        with self.lock:
            self.results.append((case, status, elapsed, detail))
            print("%-4s %-34s %5.1fs  %s" % (status, case, elapsed, one_line(detail)),
                  flush=True)
            for side_case, side_status, side_detail in side:
                self.parent[side_case] = case
                self.results.append((side_case, side_status, 0.0, side_detail))
                print("%-4s %-34s %5s   %s" % (side_status, side_case, "",
                                              one_line(side_detail)), flush=True)

    def close(self):
        self.tmux("kill-server", check=False)
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)


def cases(only):
    wanted = [w.strip() for w in (only or "").split(",") if w.strip()]
    for scenario in SCENARIOS:
        for mode in scenario[2]:
            case = "%s/%s" % (scenario[0], mode)
            if not wanted or any(w in case for w in wanted):
                yield scenario, mode


def opencode_version(bin_dir):
    try:
        out = subprocess.run([os.path.join(bin_dir, H.program), "--version"],
                             capture_output=True, text=True, timeout=30,
                             env=dict(os.environ, **{H.env + "DISABLE_AUTOUPDATE": "1"})).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"\d+\.\d+\.\d+\S*", out)
    return found.group(0) if found else None


def truth_rows(results, version, latency):
    """One E2E-ROW per mode that ran, for the README's table."""
    status = {case: s for case, s, _, _ in results}

    def cell(name, mode):
        got = status.get("%s/%s" % (name, mode))
        return None if got in (None, "SKIP") else got == "PASS"
    rows = []
    if any(c.endswith("/run") for c in status):
        rows.append(report_row(
            H.name, version, H.program + " run", digest=cell("a-digest", "run"),
            signal=cell("c-midturn-signal", "run"), hold=cell("d-hold-once", "run"),
            wake=cell("e-wake", "run"), latency=latency.get("run"),
            note="run exits when idle: a wake resumes it (%s run --session)" % H.program))
    if any(c.endswith("/tui") for c in status):
        rows.append(report_row(
            H.name, version, H.program + " (TUI)", digest=cell("a-digest", "tui"),
            signal=cell("c-midturn-signal", "tui"), hold=cell("d-hold-once", "tui"),
            wake=cell("e-wake", "tui"), latency=latency.get("tui"),
            note="the plugin's waiter; no session before the first prompt"))
    return rows


def main():
    global VERBOSE, AR, H
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default=os.path.join(ROOT, ".e2e", "opencode", "npm",
                                                      "node_modules", ".bin"),
                        help="the npm prefix's node_modules/.bin holding opencode (or kilo)")
    parser.add_argument("--harness", choices=sorted(FLAVORS), default="opencode",
                        help="OpenCode, or its fork Kilo Code (default opencode)")
    parser.add_argument("--only", help="run the cases whose name contains one of these "
                        "(comma-separated), e.g. c-midturn or /tui")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--keep", action="store_true", help="keep the work directory "
                        "(homes, stores, requests.json, run output, screens per case)")
    parser.add_argument("--workdir", default=os.path.join(ROOT, ".e2e"))
    parser.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    parser.add_argument("--agents-room", default=AR, help="the agents_room.py under test "
                        "(default: the one beside .ci/)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    VERBOSE = args.verbose
    H = FLAVORS[args.harness]
    AR = os.path.abspath(args.agents_room)
    selected = list(cases(args.only))
    if args.list:
        for scenario, mode in selected:
            print("%s/%s" % (scenario[0], mode))
        return 0
    if not selected:
        print("no case matches %r" % args.only)
        return 2
    missing = [tool for tool in ("git", "tmux") if shutil.which(tool) is None]
    if not os.path.exists(os.path.join(args.bin, H.program)):
        missing.append("%s (in %s)" % (H.program, args.bin))
    if missing:
        print("e2e-%s: missing %s (make e2e-%s installs %s)"
              % (H.name, ", ".join(missing), H.name, H.package))
        return 2
    version = opencode_version(args.bin)
    if not version:
        print("e2e-%s: %s/%s --version printed no version" % (H.name, args.bin, H.program))
        return 2
    suite = Suite(args, version)
    started = time.time()
    print("e2e-%s: %s (sha256 %s), %s %s (%s)" % (
        H.name, AR, file_sha(AR), H.program, version,
        os.path.realpath(os.path.join(args.bin, H.program))), flush=True)
    print("mock-side speed-up: node_modules/ + package-lock.json seeded in the config dirs "
          "(%s skips its npm install of %s)" % (H.title, H.plugin), flush=True)
    queue = list(selected)
    queue_lock = threading.Lock()

    def worker():
        while True:
            with queue_lock:
                if not queue:
                    return
                scenario, mode = queue.pop(0)
            suite.run_case(scenario, mode)
    try:
        threads = [threading.Thread(target=worker, daemon=True)
                   for _ in range(max(1, args.jobs))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        suite.close()
    order = {"%s/%s" % (s[0], m): i for i, (s, m) in enumerate(cases(None))}
    results = sorted(suite.results, key=lambda r: (
        order.get(suite.parent.get(r[0], r[0]), -1), r[0] in suite.parent, r[0]))
    print("\n%-4s  %-34s %7s  %s" % ("", "case", "time", "why"))
    for case, status, elapsed, detail in results:
        print("%-4s  %-34s %6.1fs  %s" % (status, case, elapsed, one_line(detail, 200)))
    print()
    truth_rows(results, version, suite.latency)
    failed = sum(1 for r in results if r[1] == "FAIL")
    passed = sum(1 for r in results if r[1] == "PASS")
    skipped = sum(1 for r in results if r[1] == "SKIP")
    print("\n%.0f s%s" % (time.time() - started,
                           "" if not args.keep else "; kept %s" % suite.root))
    print("e2e-%s %s: %d passed, %d failed, %d skipped" % (H.name, version, passed, failed,
                                                          skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
