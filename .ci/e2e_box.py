"""The e2e framework (issue 37): what every harness's end-to-end run shares,
written once; a harness's script (.ci/e2e_<harness>.py) is a declaration.

    python3 .ci/e2e_<harness>.py [--install PKG...] [--bin DIR...] [--workdir DIR]
                                 [--only NAME[,NAME...]] [--list] [--keep] [--jobs 1|2]
                                 [--db URL] [-v]

--install PKG installs the harness from its registry (npm, or PyPI into a
venv, as the harness declares) into WORKDIR and runs against that, removing
WORKDIR afterwards unless --keep; --bin DIR runs an installed one instead
(DIR on PATH, first); --db URL runs on that PostgreSQL database instead of a
SQLite file per run, each run in a schema of its own.  The Makefile's
e2e-<harness> targets are one rule over a list of harnesses that passes
--install the pin.

The parts:
  Box      one run's world: a temporary HOME (XDG dirs, a short runtime dir and
           TMPDIR), a git repository `proj` set up by exactly
           `agents_room.py setup HARNESS --write [--autonomy N]`, its own store
           (AGENTS_ROOM_DB), a peer session (the CLI: join, send, sent) playing
           the other agent, the lane's mock model (.ci/mock_model.py: the checks
           read what the model was shown), the harness as a one-shot process or
           a TUI in a tmux pane (its start dialogs answered as a user does, the
           screen watched for a dialog no user should meet); every process it
           starts is marked by AGENTS_ROOM_E2E_BOX in its environment and
           ended by pid at cleanup.
  Harness  the declaration: how it installs, its environment and mock
           settings, how it starts (one-shot argv, TUI argv and readiness), is
           trusted, is read (its output's session id), and what it names
           (its MCP tool prefix, its levers per mode, its file and shell tools).
  cases    the common runs (room: digest, MCP session, room_call, exit;
           signal: mid-turn signal; hold: hold once; wake: a TUI woken through
           its inbox before and after a turn; doctor: doctor through the shell
           tool, then a finished one-shot session resumed by its lever); MORE,
           for a harness to pick (a one-shot run exiting at wake, rooms kept
           across a resume, the sender's delivery states, an idle watch); and a
           harness's own, declared beside it.  A run is one harness session and
           reports one or more rows (NAME/MODE).
  Suite    the runs in lanes (one per mode with --jobs 2, each lane its own
           mock; with Harness.require_offered it refuses a scripted call of a
           tool the request did not offer, and that fails the run), the
           PASS/FAIL lines, the E2E-ROW lines (.ci/e2e_report.py; a harness's
           cells may combine rows) and the closing "N passed, N failed, N
           skipped" line; exit 1 on a FAIL.

Standard library only; needs git (and tmux for a TUI mode).
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
import mock_model  # noqa: E402
from mock_model import Call, MockModel, Reply  # noqa: E402,F401  (re-exported)
from e2e_report import row as report_row  # noqa: E402
from e2e_common import (  # noqa: E402,F401
    drop_ci_markers, Failure, SIGNAL_RE, Skip, check, file_sha, kill_group, one_line,
    signal_line)

AR = os.path.join(ROOT, "agents_room.py")
LEAN = {"room_join", "msg_send", "msg_recv", "room_who", "lease_claim", "lease_release",
        "note_read", "drift_check", "room_call"}
SECRET_SUBJECT = "E2E-SECRET-SUBJECT"
SECRET_BODY = "E2E-SECRET-BODY"
PEER_FRAME = "[agents-room: other agents' words"     # agents_room.PEER_TEXT_NOTE's start
SHARED = "e2e-shared"
CLOSED = "http://127.0.0.1:9"           # a proxy that is no proxy: nothing leaves
# Variables of the caller's own harnesses, models and tools that would leak
# into a box (a harness reads its vendor's variables wherever it runs).
DROP = ("AGENTS_ROOM", "CLAUDE", "CODEX", "ANTHROPIC", "OPENAI", "GEMINI", "GOOGLE", "QWEN",
        "DASHSCOPE", "BAILIAN", "COPILOT", "GH_", "GITHUB", "OPENCODE", "KILO", "PI_",
        "HERMES", "TMUX", "XDG_", "NODE_OPTIONS", "npm_config_", "NPM_CONFIG_")
PROXIES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
VERBOSE = False


def log(text):
    if VERBOSE:
        sys.stderr.write("  . %s\n" % text)
        sys.stderr.flush()


def agents_room():
    """The agents_room module under test (its store: a run on PostgreSQL)."""
    sys.path.insert(0, os.path.dirname(AR))
    import agents_room as module
    return module


# ---- the mock: knows when a script still runs --------------------------------------

class Mock(MockModel):
    """.ci/mock_model.py's mock, recording the harness's request class, and
    knowing when a script is still running, so a TUI turn is not taken as over
    while the script notes what it saw."""

    def __init__(self, request_class, log=None, require_offered=False):
        MockModel.__init__(self, None, log, require_offered)
        self.request_class = request_class
        self.answering = 0              # scripts running now
        self.answered_at = 0.0          # when the last one returned

    def _record(self, method, path, headers, body, raw):
        with self.lock:
            req = self.request_class(len(self.requests), method, path, headers, body,
                                     raw.decode("utf-8", "replace") if body is None
                                     else None)
            self.requests.append(req)
            self.changed.notify_all()
        log("mock: %s %s%s" % (method, path, " (main)" if req.is_main else ""))
        return req

    def _reply_for(self, req):
        with self.lock:
            self.answering += 1
        try:
            return MockModel._reply_for(self, req)
        finally:
            with self.lock:
                self.answering -= 1
                self.answered_at = time.time()

    def idle_since(self, start):
        """Since when nothing happened (no request, no script running), or None
        while a script still runs."""
        with self.lock:
            if self.answering:
                return None
            calls = [r.at for r in self.requests if r.is_main]
            return max([start, self.answered_at] + calls[-1:])


# ---- a harness's declaration --------------------------------------------------------

class Harness:
    """Override what differs; the defaults are the common case."""
    name = "?"              # setup's harness name (agents_room.py setup NAME)
    title = "?"             # the truth table's harness column
    program = "?"           # the executable in a bin directory
    installer = "npm"       # npm: npm install --prefix WORKDIR/npm; pip: a venv
    modes = {}              # mode -> "oneshot" | "tui"
    labels = {}             # mode -> the truth table's mode column
    notes = {}              # mode -> the truth table's note
    levers = {}             # mode -> the lever a session of that mode reports
    prefix = "mcp__agents-room__"   # how it names our MCP tools
    who_harness = None      # what `who` names as the session's harness, if checked
    ready = None            # text on the TUI's screen once it takes a prompt
    quit_keys = ("/quit",)
    enter_tries = 1         # Enters for a prompt while no request comes
    oneshot_session_end = False     # a one-shot run fires SessionEnd
    resumes = True          # a finished one-shot session has a lever (run_doctor's e3)
    resumed_reads = True    # a resumed one-shot turn can call msg_recv
    doctor_skip = None      # why doctor cannot name the session from its shell tool
    late_tools = {}         # mode -> why its first request may lack our tools
    wake_na = {}            # mode -> rows whose pass makes its wake cell "n/a"
    cells = {}              # mode -> {column: rows}: a table cell from a harness's own rows
    cold = 0                # seconds a start takes beyond the others' (its bounds grow)
    settle = 12.0           # s without a request before a TUI turn that fell short is over
    yolo_args = ()          # TUI arguments that let its shell tool run unasked
    hold_screen_errors = ()  # text the TUI must not show for a held Stop (the old
                             # scripts' "no error" screen: a hook shown as failing)
    requires = ("git",)
    version_env = {}
    require_offered = False  # the mock refuses a scripted call of a tool not offered
    start_dialogs = ()      # (screen texts, option, name): the one-time steps a user takes
                            # in the TUI's own dialogs at its start (the README's)
    dialogs = ()            # screen texts of a dialog no user should meet after those:
                            # at the start or at any time in the run, the run fails
    outlives = ()           # command-line texts of processes that outlive the harness by
                            # design (and their children): not "left" after an exit
    wake_levers = {}        # mode -> the lever a wake must go through (its wake events)
    wake_quiet = 1.0        # s without a request before a woken turn's turns are counted
    arm_s = 0.5             # s after a TUI turn before a wake (a turn-end waiter arms)
    no_session_before_prompt = {}   # mode -> why no session exists before a first prompt
    exit_wait_s = {}        # mode -> seconds its SessionEnd may take after an exit (15;
                            # longer: checked at the lane's end, Later)

    def cases(self):
        return list(COMMON)

    def note(self, suite, mode):
        """The truth table's note for a mode (what the run measured may add)."""
        return self.notes.get(mode, "")

    def join_args(self, box, req):
        """What room_join needs besides its rooms to act on the hook's session."""
        return {}

    # the process's world
    def env(self, box):
        return {}

    def configure(self, box):
        """Write what is about the mock (before setup runs)."""

    def setup(self, box):
        """Put agents-room in, as the README tells a user: by default exactly
        `agents_room.py setup NAME --write [--autonomy N]` in the project."""
        argv = [sys.executable, AR, "setup", self.name, "--write"]
        argv += ["--autonomy", str(box.autonomy)] if box.autonomy else []
        box.must(argv, cwd=box.repo, what="setup %s" % self.name)

    def trust(self, box):
        """The one-time trust a user gives (after setup)."""

    # how it starts
    def oneshot_argv(self, box, prompt, resume=None, yolo=False):
        raise NotImplementedError

    def run_id(self, out):
        """The harness's own session id in a one-shot run's stdout, if any."""
        return None

    def resume_key(self, box, run, sid):
        """What resumes a finished one-shot session: its id, as printed."""
        return run["id"]

    def quit(self, box):
        """Leave the TUI as a user does."""
        for keys in self.quit_keys:
            box.tui_send(keys, prompt=False)

    def tui_argv(self, box, extra=()):
        return [self.program] + list(extra)

    def tui_ready(self, screen):
        """Whether the TUI's screen takes a prompt."""
        return self.ready in screen

    def tui_wait(self, box, timeout=90):
        """Wait until the TUI takes a prompt (a harness with start dialogs
        answers them here, as a user does once); False: it came up without
        its settings, start it again."""
        if self.start_dialogs or self.dialogs:
            return box.answer_dialogs(timeout + self.cold)
        end = time.time() + timeout + self.cold
        while time.time() < end:
            if self.ready in box.screen():
                time.sleep(0.8)
                return
            time.sleep(0.3)
        raise Failure("the TUI did not become ready in %d s; screen:\n%s"
                      % (timeout, box.screen()))

    # its tools
    def read_call(self, box):
        raise NotImplementedError

    def shell_call(self, command):
        raise NotImplementedError

    def checks_after_mcp(self, box):
        """A harness's own check on the room run (e.g. no classifier call)."""

    def wake_files(self, box, sid):
        """The files a running session's wake lever keeps (a socket) and its
        exit must remove, found where they are (h-exit checks both); None: no
        such files to check."""
        return None

    def version(self, suite):
        try:
            out = subprocess.run(self.version_argv(suite), capture_output=True, text=True,
                                 timeout=60, env=dict(os.environ, **self.version_env)).stdout
        except (OSError, subprocess.SubprocessError, TypeError):
            return "?"
        found = re.search(r"\d+\.\d+\.\d+[^\s,)]*", out)
        return found.group(0).rstrip(".") if found else "?"

    def busy(self, box):
        """True while the TUI's screen shows a turn running (a tool call can
        outlast any quiet time on a loaded machine)."""
        return False

    def version_argv(self, suite):
        return [suite.which(self.program), "--version"]

    def install(self, packages, workdir):
        """Install from the registry; returns the bin directories."""
        if self.installer == "pip":
            venv = os.path.join(workdir, "venv")
            subprocess.run([sys.executable, "-m", "venv", venv], check=True)
            subprocess.run([os.path.join(venv, "bin", "pip"), "install", "--quiet",
                            "--disable-pip-version-check"] + list(packages), check=True)
            return [os.path.join(venv, "bin")]
        prefix = os.path.join(workdir, "npm")
        subprocess.run(["npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix",
                        prefix] + list(packages), check=True)
        return [os.path.join(prefix, "node_modules", ".bin")]


# ---- the world of one run -----------------------------------------------------------

class Box:
    def __init__(self, suite, mock, name, mode, autonomy):
        self.suite, self.harness, self.mode, self.autonomy = suite, suite.harness, mode, autonomy
        self.kind = self.harness.modes[mode]
        self.name = name
        self.dir = os.path.join(suite.root, name)
        self.home = os.path.join(self.dir, "home")
        self.repo = os.path.join(self.dir, "proj")
        self.db = os.path.join(self.dir, "store", "room.db")
        if suite.pg_url:
            # On PostgreSQL (--db): a schema of its own in that database.
            schema = "e2e_%s" % re.sub(r"[^a-z0-9]+", "_", "%s_%s" % (
                self.harness.name, name.lower()))
            admin = agents_room().PgConnection(suite.pg_url)
            try:
                admin.simple("DROP SCHEMA IF EXISTS %s CASCADE; CREATE SCHEMA %s"
                             % (schema, schema))
            finally:
                admin.close()
            self.db = "%s%soptions=-csearch_path%%3D%s" % (
                suite.pg_url, "&" if "?" in suite.pg_url else "?", schema)
        # Inbox sockets and a lever's reply socket live under these: short paths
        # (a socket's path has at most 103 bytes).
        self.run = tempfile.mkdtemp(prefix="e2e-")
        self.tmux = None
        self.peer_sid = None
        self.last_stderr = self.sent_stderr = ""
        self.ignored = set()    # sessions of the box's own making (a trust step's)
        self.errors = []
        self.latency = None
        self.dialog_seen = None     # (text, screen): a dialog no user should meet
        self.dialogs_met = []       # the start dialogs answered, in order
        self.watching = None
        self.mock = mock
        self.mock.reset()
        for path in (self.home, self.repo, os.path.join(self.run, "tmp")):
            os.makedirs(path, exist_ok=True)
        os.makedirs(os.path.join(self.dir, "store"), mode=0o700, exist_ok=True)
        self.env = self._env()
        git = ["git", "-c", "user.name=e2e", "-c", "user.email=e2e@localhost"]
        subprocess.run(git + ["init", "-q", self.repo], check=True, timeout=30)
        with open(os.path.join(self.repo, "README"), "w") as handle:
            handle.write("e2e\n")
        subprocess.run(git + ["-C", self.repo, "add", "README"], check=True, timeout=30)
        subprocess.run(git + ["-C", self.repo, "commit", "-qm", "init"], check=True,
                       timeout=30)
        self.harness.configure(self)
        self.harness.setup(self)
        self.harness.trust(self)

    def _env(self):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(DROP) and k.lower() not in PROXIES}
        env.update({
            "HOME": self.home,
            "PATH": os.pathsep.join(self.suite.bins + [env.get("PATH", "/usr/bin:/bin")]),
            "AGENTS_ROOM_DB": self.db,
            "AGENTS_ROOM_E2E_BOX": self.dir,      # marks every process of this run
            "XDG_RUNTIME_DIR": self.run,
            "TMPDIR": os.path.join(self.run, "tmp"),
            "XDG_CONFIG_HOME": os.path.join(self.home, ".config"),
            "XDG_CACHE_HOME": os.path.join(self.home, ".cache"),
            "XDG_DATA_HOME": os.path.join(self.home, ".local", "share"),
            "XDG_STATE_HOME": os.path.join(self.home, ".local", "state"),
            # Both spellings: a runtime that reads only one (Bun, curl) meets the
            # closed port at once instead of waiting on an address it cannot reach.
            "HTTP_PROXY": CLOSED, "HTTPS_PROXY": CLOSED, "http_proxy": CLOSED,
            "https_proxy": CLOSED,
            "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
            "TERM": "xterm-256color",
            "LANG": env.get("LANG", "C.UTF-8"),
        })
        env.update(self.harness.env(self))
        return env

    def play(self, script):
        """The mock answers with script(req); an error in it is kept for the report."""
        def guarded(req):
            try:
                return script(req)
            except Exception as error:
                self.errors.append("script at request %d: %s: %s" % (
                    req.index, type(error).__name__, one_line(error, 200)))
                raise
        self.mock.script = guarded

    def must(self, argv, cwd=None, what=None, timeout=120):
        """Run a step of the box's making in its environment; its output."""
        done = subprocess.run(argv, cwd=cwd or self.dir, env=self.env, capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise Failure("%s failed (exit %d): %s" % (what or " ".join(argv[:3]),
                                                       done.returncode,
                                                       (done.stderr or done.stdout)
                                                       .strip()[-300:]))
        return done.stdout

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
            return done.stdout + done.stderr

    def peer(self):
        if self.peer_sid is None:
            self.peer_sid = self.ar("join", "--room", "repo:proj", "--label", "peer",
                                    "--harness-key", "e2e-peer", "--json")["session_id"]
        return self.peer_sid

    def send(self, to):
        sent = self.ar("send", "--session", self.peer(), "--to", to, "--subject",
                       SECRET_SUBJECT, "--body", SECRET_BODY, "--json")
        self.sent_stderr = self.last_stderr     # what the send's wake plan printed
        return sent

    def states(self, message_id=None):
        """The peer's view: the state of each delivery it sent (of one message)."""
        sent = self.ar("sent", "--session", self.peer(), "--json")
        return [d["state"] for m in sent.get("messages", []) for d in m.get("deliveries", [])
                if message_id is None or m.get("message_id") == message_id]

    def sessions(self, room="repo:proj"):
        """Sessions `who` lists (in a room), the peer left out."""
        for _ in range(3):
            found = self.ar("who", "--json", "--room", room, check_rc=False)
            if isinstance(found, dict):
                break
            self.errors.append("who: %s" % one_line(found, 300))
            time.sleep(0.3)
        else:
            return []
        return [s for s in found.get("sessions", []) if s["session_id"] != self.peer_sid
                and s.get("label") != "peer" and s["session_id"] not in self.ignored]

    def session(self, sid):
        return next((s for s in self.sessions() if s["session_id"] == sid), None)

    def wait_session(self, timeout):
        end = time.time() + timeout
        while time.time() < end:
            if self.suite.pg_url or os.path.exists(self.db):
                found = self.sessions()
                if found:
                    return found[0]
            time.sleep(0.3)
        return None

    def query(self, sql, args=()):
        """Rows of a read of the run's store (SQLite, or PostgreSQL with --db)."""
        if not self.suite.pg_url:
            conn = sqlite3.connect(self.db, timeout=10)
            try:
                return conn.execute(sql, args).fetchall()
            finally:
                conn.close()
        store = agents_room().open_store(self.db)
        try:
            return store.conn.execute(sql, args).fetchall()
        finally:
            store.close()

    def harness_key(self, sid):
        found = self.query("SELECT harness_key FROM sessions WHERE id=?", (sid,))
        return found[0][0] if found else None

    def wake_events(self, message_id, levers=False):
        """The kinds of the store's wake.* events about one message (levers:
        (kind, lever) pairs, which lever was tried, armed or accepted)."""
        rows = self.query("SELECT kind, data FROM events WHERE kind LIKE 'wake.%%' "
                          "ORDER BY id")     # %%: two wildcards, whatever the dialect
        out = []
        for kind, data in rows:
            data = json.loads(data or "{}")
            if message_id in (data.get("messages") or []):
                out.append((kind, data.get("lever")) if levers else kind)
        return out

    # -- one-shot runs
    def oneshot(self, prompt, resume=None, yolo=False, timeout=90, done=None, quiet=3.0):
        """One one-shot turn to completion: dict(rc, out, err, elapsed, hung, id).
        With done(): once it holds and no request came for `quiet` s, a run
        still going is ended and reported hung."""
        timeout += self.harness.cold
        argv = self.harness.oneshot_argv(self, prompt, resume=resume, yolo=yolo)
        argv[0] = self.suite.which(argv[0]) or argv[0]
        log("%s: run %s" % (self.name, " ".join(argv[1:])))
        out_path = os.path.join(self.dir, "run-%d.out" % time.time_ns())
        with open(out_path, "w") as out, open(out_path + ".err", "w") as err:
            proc = subprocess.Popen(argv, cwd=self.repo, env=self.env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=err, start_new_session=True)
            start = time.time()
            hung = False
            while proc.poll() is None and not hung:
                now = time.time()
                last = max([r.at for r in self.mock.model_calls(main_only=False)] or [start])
                hung = now - start > timeout or (
                    done is not None and done() and now - last > quiet)
                time.sleep(0.2)
            if hung:
                kill_group(proc)
            elapsed = time.time() - start
        with open(out_path) as handle:
            out_text = handle.read()
        with open(out_path + ".err") as handle:
            err_text = handle.read()
        return {"rc": proc.returncode, "out": out_text, "err": err_text, "elapsed": elapsed,
                "hung": hung, "id": self.harness.run_id(out_text)}

    # -- interactive runs in tmux
    def tui_start(self, extra=()):
        self.tmux = "e2e-%s" % self.name[-40:]
        envfile = os.path.join(self.dir, "env.sh")
        with open(envfile, "w") as handle:
            for key, value in sorted(self.env.items()):
                handle.write("export %s=%s\n" % (key, shlex.quote(value)))
        program = " ".join(shlex.quote(a) for a in self.harness.tui_argv(self, extra))
        command = "bash --norc --noprofile -c %s" % shlex.quote(
            ". %s; cd %s && exec %s" % (shlex.quote(envfile), shlex.quote(self.repo), program))
        for attempt in (1, 2):
            self.suite.tmux("new-session", "-d", "-s", self.tmux, "-x", "160", "-y", "50",
                            command)
            if self.harness.tui_wait(self) is not False:
                return
            # The harness came up without what its start should have loaded (a
            # trust saved without a restart): a user starts it again.
            self.errors.append("the TUI started without its settings; started again")
            self.tui_quit()
            self.tmux = "e2e-%s" % self.name[-40:]
        raise Failure("the TUI started twice without its settings; screen:\n%s"
                      % self.screen()[-1500:])

    def screen(self):
        return self.suite.tmux("capture-pane", "-p", "-t", self.tmux, "-S", "-300",
                               check=False)

    def visible(self):
        return self.suite.tmux("capture-pane", "-p", "-t", self.tmux, check=False)

    def answer_dialogs(self, timeout):
        """The TUI's start as a user meets it: answer each of the harness's
        start_dialogs in the TUI (at most twice), fail on one of its dialogs,
        and return once the prompt is ready and stays so (a dialog may come
        up over a prompt drawn first); then watch the screen for dialogs."""
        harness = self.harness
        end, met, ready_since = time.time() + timeout, [], None
        while time.time() < end:
            screen = self.visible()
            step = next((s for s in harness.start_dialogs if all(m in screen for m in s[0])),
                        None)
            if step is not None:
                check(met.count(step[2]) < 2, "the %s dialog came back after it was "
                      "answered; screen:\n%s" % (step[2], screen))
                met.append(step[2])
                check(self.choose(step[1]), "cannot pick %r in the %s dialog; screen:\n%s"
                      % (step[1], step[2], self.visible()))
                time.sleep(1.0)
                continue
            bad = next((m for m in harness.dialogs if m in screen), None)
            check(not bad, "at start the TUI shows %r, a dialog setup should have made "
                  "unneeded (dialogs answered: %s); screen:\n%s"
                  % (bad, ", ".join(met) or "none", screen))
            if not harness.tui_ready(screen):
                ready_since = None
            elif ready_since is None:
                ready_since = time.time()
            elif time.time() - ready_since > 1.5:
                self.dialogs_met = met
                if harness.start_dialogs and not met:
                    self.errors.append("no start dialog met")
                self.watch()
                return
            time.sleep(0.4)
        raise Failure("the TUI did not become ready in %d s (dialogs answered: %s); "
                      "screen:\n%s" % (timeout, ", ".join(met) or "none", self.visible()))

    def choose(self, label):
        """Move a dialog's cursor (\u276f or \u203a) to the option with label, then Enter."""
        for _ in range(12):
            lines = self.visible().splitlines()
            cursor = [i for i, l in enumerate(lines) if l.lstrip()[:1] in ("\u276f", "\u203a")]
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
        """Look at the screen twice a second until the TUI is quit, keeping the
        first of the harness's dialogs (a user would have to answer it)."""
        stop = threading.Event()

        def look():
            while not stop.wait(0.5):
                try:
                    screen = self.visible()
                except (Failure, subprocess.SubprocessError, OSError):
                    continue
                bad = next((m for m in self.harness.dialogs if m in screen), None)
                if bad and self.dialog_seen is None:
                    self.dialog_seen = (bad, screen)
        thread = threading.Thread(target=look, daemon=True)
        thread.start()
        self.watching = (stop, thread)

    def unwatch(self):
        if self.watching:
            self.watching[0].set()
            self.watching[1].join(timeout=5)
            self.watching = None

    def dialog_shown(self):
        """What a dialog met after the start looked like, or None."""
        if self.dialog_seen is None:
            return None
        bad, screen = self.dialog_seen
        shown = "\n".join(l for l in screen.splitlines() if l.strip())
        return "the TUI showed %r (a dialog the user must answer); screen:\n%s" % (
            bad, shown[-1500:])

    def tui_alive(self):
        return self.tmux is not None and subprocess.run(
            ["tmux", "-L", self.suite.socket, "has-session", "-t", self.tmux],
            capture_output=True, timeout=10).returncode == 0

    def tui_send(self, text, prompt=True):
        """Type a line.  A prompt, where the harness swallows an Enter now and
        then (enter_tries > 1): Enter again while no request comes."""
        before = len(self.mock.model_calls(main_only=False))
        self.suite.tmux("send-keys", "-t", self.tmux, "-l", text)
        time.sleep(0.4)
        for _ in range(self.harness.enter_tries if prompt else 1):
            self.suite.tmux("send-keys", "-t", self.tmux, "Enter")
            end = time.time() + 4
            while prompt and self.harness.enter_tries > 1 and time.time() < end:
                if len(self.mock.model_calls(main_only=False)) > before:
                    return
                time.sleep(0.2)

    def save_screen(self):
        try:
            with open(os.path.join(self.dir, "screen-%d.txt" % time.time_ns()), "w") as handle:
                handle.write(self.screen())
        except (OSError, Failure, subprocess.SubprocessError):
            pass

    def tui_quit(self, timeout=15):
        """Quit as a user does; returns the last screen seen before the pane closed."""
        self.unwatch()
        self.save_screen()
        self.harness.quit(self)
        end, last = time.time() + timeout, ""
        while time.time() < end:
            if not self.tui_alive():
                self.tmux = None
                return last
            last = self.screen() or last
            time.sleep(0.2)
        raise Failure("the TUI did not exit within %d s of %s; screen:\n%s"
                      % (timeout, "/".join(self.harness.quit_keys), last[-800:]))

    def wait_quiet(self, at_least, quiet=1.2, settle=None, timeout=60):
        """Wait until >= at_least main requests were seen and none came for
        `quiet` s; with fewer, give up once none came for `settle` s (the
        harness's, by default)."""
        settle = max(settle or 0, self.harness.settle)
        start = time.time()
        timeout += self.harness.cold
        while time.time() < start + timeout:
            calls = self.mock.model_calls()
            since = self.mock.idle_since(start)
            idle = time.time() - since if since is not None else 0.0
            # No request yet: a loaded machine can take long to send the first.
            done = (len(calls) >= at_least and idle > quiet) or (calls and idle > settle)
            if done and not (self.tmux and self.harness.busy(self)):
                return calls
            time.sleep(0.2)
        return self.mock.model_calls()

    def turn(self, prompt, expect, quiet=1.2, settle=None, **oneshot):
        """One user turn: a one-shot run (returned), or a prompt typed into the
        TUI (started on first use; None)."""
        if self.kind == "tui":
            if self.tmux is None:
                self.tui_start()
            self.tui_send(prompt)
            longest = max(settle or 0, self.harness.settle)
            self.wait_quiet(expect, quiet=quiet, settle=settle, timeout=max(60, 2 * longest + 30))
            return None
        return self.oneshot(prompt, **oneshot)

    def end(self):
        """End the harness session the way a user does (a TUI: its quit)."""
        return self.tui_quit() if self.tmux is not None else ""

    # -- processes
    def marked(self):
        """{pid: command line} of the processes this run started: their
        environment names its directory or its store (a lever's keeps the store)."""
        wanted = [("AGENTS_ROOM_E2E_BOX=%s" % self.dir).encode(),
                  ("AGENTS_ROOM_DB=%s" % self.db).encode()]
        found = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open("/proc/%s/environ" % entry, "rb") as handle:
                    environ = handle.read().split(b"\0")
                with open("/proc/%s/cmdline" % entry, "rb") as handle:
                    cmdline = handle.read().replace(b"\0", b" ").decode("utf-8", "replace")
                with open("/proc/%s/stat" % entry) as handle:
                    if handle.read().rsplit(")", 1)[-1].split()[0] == "Z":
                        continue        # a zombie is gone, waiting for its reaper
            except OSError:
                continue
            if any(item in wanted for item in environ):
                found[int(entry)] = cmdline.strip()
        return found

    def left(self):
        """marked(), but the harness's processes that outlive it by design
        (Harness.outlives) and their children."""
        found = self.marked()
        out = {}
        for pid, command in found.items():
            try:
                with open("/proc/%d/stat" % pid) as handle:
                    parent = int(handle.read().rsplit(")", 1)[-1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if not any(t in command or t in found.get(parent, "")
                       for t in self.harness.outlives):
                out[pid] = command
        return out

    def wait_unmarked(self, timeout):
        """Wait until no process of the run is left; returns those still there."""
        end = time.time() + timeout
        left = self.left()
        while left and time.time() < end:
            time.sleep(0.3)
            left = self.left()
        return left

    def cleanup(self):
        self.unwatch()
        if self.tmux:
            self.save_screen()
            self.suite.tmux("kill-session", "-t", self.tmux, check=False)
            time.sleep(0.3)
        for sig in (signal.SIGTERM, signal.SIGKILL):      # by pid, never by name
            found = self.marked()
            for pid in found:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            if not found:
                break
            time.sleep(0.5)
        shutil.rmtree(self.run, ignore_errors=True)


class Later:
    """What a step returns when its check must wait for the harness (Codex's
    SessionEnd comes a minute after /exit): its lane runs its next runs
    meanwhile, then the check (which returns the row's detail or raises), and
    only then ends the run's processes and removes its box.  The lane's mock
    serves the next runs meanwhile: a harness that asks the model after its
    exit would show in their requests (Codex's daemon, unloading the thread,
    does not)."""

    def __init__(self, check):
        self.check = check


def outcome(fn):
    """(status, detail) of a step's function: PASS with what it returned,
    FAIL or SKIP with why; a broken step is a failure, never a crash."""
    try:
        return "PASS", fn()
    except Failure as error:
        return "FAIL", str(error)
    except Skip as error:
        return "SKIP", str(error)
    except Exception as error:
        return "FAIL", "error: %s: %s" % (type(error).__name__, error)


# ---- what the model was shown --------------------------------------------------------

def new_text(req, before):
    """Text in req that the previous request `before` did not have."""
    old = before.all_text() if before is not None else ""
    text = req.all_text()
    if text.startswith(old):
        return text[len(old):]
    lines_old = set(old.splitlines())
    return "\n".join(line for line in text.splitlines() if line not in lines_old)


def secrets_shown(calls):
    return [r.index for r in calls if SECRET_SUBJECT in r.all_text() or
            SECRET_BODY in r.all_text()]


def results(req):
    return [text for _, text in req.tool_results()]


def json_in(text):
    """The first JSON object in a tool result's text."""
    start = text.find("{")
    while start >= 0:
        try:
            return json.JSONDecoder().raw_decode(text[start:])[0]
        except ValueError:
            start = text.find("{", start + 1)
    return None


def json_lines(out):
    """The JSON objects of a one-shot run's stdout, one a line (its --json events)."""
    for line in out.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            yield item


def run_hint(run):
    if not run:
        return ""
    return " (exit %s%s; stderr %r)" % (run["rc"], ", hung" if run["hung"] else "",
                                        run["err"].strip()[-200:])


def ar_call(box, name, args):
    return Call(box.harness.prefix + name, args)


# ---- the common runs -------------------------------------------------------------------
# Each is one harness session; step(name, fn) records a row (fn returns its
# detail or raises Failure/Skip).

def run_room(box, step):
    """digest, MCP session, room_call and exit, in one session."""
    state = {}
    harness = box.harness
    late = harness.late_tools.get(box.mode)

    def script(req):
        sid = req.session_id()
        done = len(req.tool_results())
        if not sid:
            return Reply(text="no digest")
        if done == 0:
            state.setdefault("first_tools", req.tool_names())
            state.update(sid=sid, tools=req.tool_names())
            if late and not any(n.startswith(harness.prefix) for n in state["tools"]):
                return Reply(text="no agents-room tools yet")
            return Reply(calls=[ar_call(box, "room_join", {})])
        if done == 1:
            if "sent" not in state:
                state["sent"] = box.send(sid)       # a peer's words for msg_recv to frame
            return Reply(calls=[ar_call(box, "msg_recv", {"session_id": sid})])
        if done == 2:
            return Reply(calls=[ar_call(box, "room_call", {"op": "task", "args": {
                "session_id": sid, "action": "add", "title": "e2e task"}})])
        if "who" not in state:
            state["who"] = box.sessions()
        return Reply(text="done")
    box.play(script)
    run = box.turn("use the room", 4)
    if late and not any(n.startswith(harness.prefix) for n in state.get("first_tools", [])):
        box.tui_send("use the room again")     # the user asks again, the tools now up
        box.wait_quiet(5)
    calls = box.mock.model_calls()
    if late:        # the turn before the tools came is not the one checked
        calls = [c for c in calls if c.tool_results() or any(
            n.startswith(harness.prefix) for n in c.tool_names())]

    def digest():
        check(calls, "no model request at all%s" % run_hint(run))
        sid = calls[0].session_id()
        check(sid, "the first request has no 'your session_id is <16 hex>' digest")
        system = [m for m in calls[0].messages() if m.get("role") == "system"]
        where = "system prompt" if system and sid in json.dumps(system) else "messages"
        mine = {s["session_id"]: s for s in state.get("who") or []}
        check(sid in mine, "digest session %s is not in `who` during the turn (%s)"
              % (sid, list(mine)))
        check(mine[sid]["liveness"] == "alive", "session %s is %s during its turn"
              % (sid, mine[sid]["liveness"]))
        if harness.who_harness:
            check(mine[sid].get("harness") == harness.who_harness, "the session's harness "
                  "is %r, not %r" % (mine[sid].get("harness"), harness.who_harness))
        return "session %s (in the %s), alive in who" % (sid, where)
    step("a-digest", digest)

    def mcp():
        check(state.get("sid"), "no digest session id reached the model%s" % run_hint(run))
        sid = state["sid"]
        ours = {n[len(harness.prefix):] for n in state["tools"]
                if n.startswith(harness.prefix)}
        check(ours, "no agents-room tool offered (tools: %s)" % state["tools"])
        check(ours == LEAN, "not the lean listing: missing %s, extra %s"
              % (sorted(LEAN - ours), sorted(ours - LEAN)))
        check(len(calls) >= 3, "expected room_join, msg_recv, room_call, done; saw %d "
              "requests" % len(calls))
        texts = results(calls[-1])
        check(len(texts) >= 2, "tool results missing: %r" % texts)
        joined, received = json_in(texts[0]) or {}, json_in(texts[1]) or {}
        check(joined.get("session_id") == sid, "room_join over MCP answered session %s, not "
              "the digest's %s (an orphan session): %s"
              % (joined.get("session_id"), sid, one_line(texts[0], 200)))
        check("messages" in received, "msg_recv on the digest's session failed: %s"
              % one_line(texts[1], 200))
        check(SECRET_BODY in texts[1], "msg_recv did not show the peer's message: %s"
              % one_line(texts[1], 300))
        # What tells the model these are other agents' words, not the user's:
        # inside the one block of the result the harness shows the model.
        check(PEER_FRAME in texts[1], "the model got the peer's message without the frame "
              "%r; the result it saw: %s" % (PEER_FRAME, one_line(texts[1][-300:])))
        mine = [s["session_id"] for s in state.get("who") or []]
        check(mine == [sid], "`who` lists %d harness sessions %s; expected only %s"
              % (len(mine), mine, sid))
        harness.checks_after_mcp(box)
        first = {n for n in state.get("first_tools", []) if n.startswith(harness.prefix)}
        return "%d lean tools offered; room_join -> %s, msg_recv ok (the peer's words " \
            "framed), one session%s" % (
            len(ours), sid, "" if first else "; the first request offered none (%s)" % late)
    step("b-mcp-session", mcp)

    def room_call():
        check(len(calls) >= 4, "the turn did not get to room_call (%d requests)" % len(calls))
        texts = results(calls[-1])
        check(len(texts) >= 3, "no room_call result: %r" % texts)
        answer = json_in(texts[2]) or {}
        task = answer.get("task") or {}
        check(answer.get("ok") is True and task.get("title") == "e2e task",
              "room_call task add failed: %s" % one_line(texts[2], 200))
        return "task %s added in %s" % (task.get("task_id"), task.get("room"))
    step("f-room-call", room_call)

    def exit_():
        sid = state.get("sid")
        check(sid, "no session to end")
        if run is not None:
            check(not run["hung"], "the one-shot run did not exit (killed)")
            check(run["rc"] == 0, "the one-shot run exited %s: %s" % (
                run["rc"], one_line(run["err"][-300:])))
            how = "exit 0"
        else:
            files = harness.wake_files(box, sid)
            check(files is None or files, "no wake file of the running session %s" % sid)
            screen = box.end()
            how = "%s%s" % ("/".join(harness.quit_keys),
                            ", '--resume' offered" if "--resume" in screen else "")
        want_end = box.kind == "tui" or harness.oneshot_session_end
        wait = harness.exit_wait_s.get(box.mode, 15)
        end = time.time() + wait
        if wait > 15:       # the lane goes on meanwhile (Later)
            return Later(lambda: settle(sid, how, want_end, end))
        return settle(sid, how, want_end, end)

    def settle(sid, how, want_end, end):
        while True:
            found = box.session(sid) or {}
            if found.get("liveness") != "alive" and (found.get("ended") or not want_end):
                break
            if time.time() >= end:
                break
            time.sleep(0.3)
        check(found.get("liveness") != "alive", "session %s still alive after the exit" % sid)
        if want_end:
            check(found.get("ended"), "`who` does not show session %s ended after the exit "
                  "(liveness %s): no SessionEnd?" % (sid, found.get("liveness")))
        ended = ("ended (SessionEnd)" if found.get("ended") else
                 "not ended: this mode fires no SessionEnd")
        left = box.wait_unmarked(10)
        check(not left, "processes left after the exit: %s" % "; ".join(
            "%d %s" % (p, one_line(c, 80)) for p, c in sorted(left.items())))
        files = harness.wake_files(box, sid)
        check(not files, "the wake files are left after the exit: %s" % files)
        detail = "%s; who: %s, %s; no process%s left" % (
            how, found.get("liveness"), ended, "" if files is None else " or wake file")
        return detail
    step("h-exit", exit_)


def run_signal(box, step):
    """A send while the model works reaches the next request as the one-line signal."""
    state = {}

    def script(req):
        sid = req.session_id()
        if sid and not req.tool_results():
            if "sent" not in state:
                state["sent"] = box.send(sid)
            return Reply(calls=[box.harness.read_call(box)])
        return Reply(text="done")
    box.play(script)
    run = box.turn("work on something", 2)
    calls = box.mock.model_calls()

    def midturn():
        check("sent" in state, "no digest session id reached the model%s" % run_hint(run))
        check(state["sent"].get("recipients") == 1, "send reached %r" % state["sent"])
        check(len(calls) >= 2, "no request after the tool call%s" % run_hint(run))
        check(not SIGNAL_RE.search(calls[0].all_text()),
              "the signal was already in the first request")
        tail = new_text(calls[1], calls[0])
        check(SIGNAL_RE.search(tail), "the request after the tool call has no 'agents-room: "
              "N unread message' signal; new text: %r" % tail[-300:])
        texts = results(calls[1])
        where = ("the tool result" if texts and SIGNAL_RE.search(texts[-1]) else
                 "a message after the tool result")
        leaked = secrets_shown(calls)
        check(not leaked, "subject/body rode the signal (requests %s)" % leaked)
        return "in %s: %s" % (where, signal_line(tail)[:100])
    step("c-midturn-signal", midturn)


def run_hold(box, step):
    """The end of a turn with unread mail is held once, not again the next turn."""
    state = {"turn": 1}
    harness = box.harness

    def script(req):
        sid = req.session_id()
        if sid and "sent" not in state:
            state["sid"] = sid
            state["sent"] = box.send(sid)
        return Reply(text="done-turn%d" % state["turn"])
    box.play(script)

    def hold():
        run = box.turn("first task", 2, quiet=2.5)
        first = box.mock.model_calls()
        check("sent" in state, "no digest reached the model%s" % run_hint(run))
        if run is not None:
            check(not run["hung"] and run["rc"] == 0, "the first run did not end well%s"
                  % run_hint(run))
        check(len(first) >= 2, "the end of the turn was not held: %d request(s) and no "
              "continuation (delivery states %s)" % (len(first), box.states()))
        held = new_text(first[1], first[0])
        check(SIGNAL_RE.search(held), "the continuation does not carry the signal: %r"
              % held[-300:])
        check(len(first) == 2, "the Stop was held %d times in one turn" % (len(first) - 1))
        check(not secrets_shown(first), "subject/body shown to the model")
        check("--event=Stop" not in held and "agents_room" not in held,
              "the model sees the hook command line: %r" % held[-300:])
        if box.tmux and harness.hold_screen_errors:
            screen = box.screen()
            shown = [t for t in harness.hold_screen_errors if t.lower() in screen.lower()]
            check(not shown, "the TUI shows the hold as %r: %r" % (shown[:1], screen[-600:]))
        # the next turn, the delivery still unread: no second hold
        state["turn"] = 2
        if box.tmux:
            box.tui_send("second task")
            calls = box.wait_quiet(3, quiet=2.5)
        elif harness.resume_key(box, run, state.get("sid")):
            box.oneshot("second task", resume=harness.resume_key(box, run, state["sid"]))
            calls = box.mock.model_calls()
        else:       # no id to resume by: nothing more may come of the first run
            time.sleep(1.5)
            calls = box.mock.model_calls()
            check(len(calls) == 2, "held more than once: %d model calls" % len(calls))
            return "held once (%r), not again" % signal_line(held)[:60]
        second = calls[2:]
        check(second, "the second turn made no request")
        check(len(second) == 1, "the same delivery held a Stop again in the next turn "
              "(%d requests in turn 2)" % len(second))
        return "held once (%r), not again in turn 2" % signal_line(held)[:60]
    step("d-hold-once", hold)


def since_answer(req):
    """The conversation's items after the model's last answer: a woken turn's
    prompt and what the harness put beside it (Claude Code: a system item
    after the user's)."""
    items = req.messages()
    answers = [i for i, item in enumerate(items) if isinstance(item, dict) and
               item.get("role") in ("assistant", "model")]
    return items[answers[-1] + 1:] if answers else items


def last_message_text(req):
    """Every text after the model's last answer."""
    return "\n".join(mock_model._texts(since_answer(req)))


def _carries_results(items):
    text = json.dumps(items)
    return any(mark in text for mark in ('"tool_result"', '"role": "tool"',
                                         '"functionResponse"', '_output"'))


def turn_starts(calls):
    """How many of these requests begin a turn (carry no tool result since the
    model's last answer): one send must start one."""
    return sum(1 for req in calls if not _carries_results(since_answer(req)))


def wake_levers(events):
    """The levers wake events (kind, lever) name as tried or taking a wake
    ("turn": a turn seen confirmed it, no lever)."""
    return sorted({lever for kind, lever in events if kind in ("wake.try", "wake.accepted")
                   and lever and lever != "turn"})


def counted_wake(box, sent, before, latency, lever=None):
    """After a woken turn: it was one turn, through the mode's lever (when
    declared); the wake is kept for the note.  The number of turns."""
    calls = box.wait_quiet(before + 2, quiet=box.harness.wake_quiet, settle=6, timeout=20)
    events = box.wake_events(sent["message_id"], levers=True)
    turns = turn_starts(calls[before:])
    check(turns == 1, "one send started %d turns (want 1); wake events %s; what each "
          "added: %s" % (turns, events, [one_line(signal_line(new_text(c, p)) or
                                                   new_text(c, p)[-120:], 120)
                                          for p, c in zip(calls[before - 1:], calls[before:])]
                         if before else "?"))
    want = lever or box.harness.wake_levers.get(box.mode)
    if want:
        check(want in wake_levers(events), "the wake went through %s, not %s (events %s)"
              % (wake_levers(events), want, events))
    box.suite.wakes.append((box.mode, latency, turns))
    return turns


def per_wake(suite, mode):
    """How many turns each wake of the mode took, of how many wakes."""
    mine = [turns for m, _, turns in suite.wakes if m == mode]
    if not mine:
        return "no wake measured"
    counts = sorted(set(mine))
    return "%s turn%s per wake (%d wake%s)" % (
        "/".join(map(str, counts)), "" if counts == [1] else "s", len(mine),
        "" if len(mine) == 1 else "s")


def _wake_script(state):
    """A woken turn reads its mail (msg_recv), then answers."""
    def script(req):
        sid = req.session_id() or state.get("sid")
        if SIGNAL_RE.search(last_message_text(req)) and sid and not _carries_results(
                since_answer(req)):
            return Reply(calls=[Call(state["prefix"] + "msg_recv", {"session_id": sid})])
        state["n"] = state.get("n", 0) + 1
        return Reply(text="done-%d" % state["n"])
    return script


def _wake_once(box, sid, lever=None):
    """Send to the idle TUI and see the woken turn read it, one turn, through
    `lever` (or the mode's wake_levers) when given: (latency, how long the
    send took, the delivery's state after the send, after the turn, origin)."""
    box.peer()                      # joined before the clock starts
    calls = box.mock.model_calls()
    before = len(calls)
    sent_at = time.time()
    sent = box.send(sid)
    returned = time.time() - sent_at
    at_send = box.states(sent["message_id"])
    bound = 30 + box.harness.cold
    woke = box.mock.wait_for(lambda calls: len(calls) > before and calls[before], bound)
    check(woke is not None, "no turn started within %d s of the send (delivery %s, "
          "session %s)" % (bound, at_send, box.session(sid)))
    latency = woke.at - sent_at
    asked = last_message_text(woke)
    check(SIGNAL_RE.search(asked), "the woken turn does not start with the signal: %r"
          % asked[-300:])
    shown = new_text(woke, calls[-1] if calls else None)
    check(SECRET_SUBJECT not in shown and SECRET_BODY not in shown,
          "subject/body rode the wake: %r" % shown[-300:])
    counted_wake(box, sent, before, latency, lever)
    after = box.states(sent["message_id"])
    wakes = box.wake_events(sent["message_id"])
    # accepted: the inbox's receipt came within the lever's 1 s; offered: it
    # came later (a busy machine, a TUI's first turn), as SPEC §10 allows.
    check(at_send in (["accepted"], ["offered"], ["read"]) and (
        "wake.accepted" in wakes or "wake.offered" in wakes),
        "right after the send the peer saw %s, wake events %s (want accepted, or offered "
        "when no receipt came within 1 s)" % (at_send, wakes))
    at_send = "accepted" if "wake.accepted" in wakes else "offered (no receipt within 1 s)"
    check(after == ["read"], "after the woken turn's msg_recv the peer saw %s" % after)
    origin = re.search(r'origin="([^"]+)"', asked)
    return latency, returned, at_send, after, origin.group(1) if origin else None


def run_wake(box, step):
    """A TUI woken through its inbox: before its first prompt, after a turn."""
    state = {"prefix": box.harness.prefix}
    box.play(_wake_script(state))
    box.tui_start()
    lever = box.harness.levers[box.mode]
    lever = (lever,) if isinstance(lever, str) else lever

    def before_first():
        session = box.wait_session(10)
        why = box.harness.no_session_before_prompt.get(box.mode)
        if why and session is None:
            raise Skip(why)
        check(session, "no agents-room session while the TUI sits before its first prompt")
        state["sid"] = sid = session["session_id"]
        check(session["autonomy"] == 2, "autonomy %s after setup --autonomy 2"
              % session["autonomy"])
        check(session.get("lever") in lever, "lever %r, not %s" % (session.get("lever"),
                                                                 " or ".join(lever)))
        latency, returned, at_send, after, origin = _wake_once(box, sid)
        box.suite.latency["e1-wake-before-first-turn/" + box.mode] = latency
        return ("woke in %.2f s (the send returned in %.2f s; lever %s, origin %s); "
                "delivery %s, then %s" % (latency, returned, session.get("lever"), origin,
                                          at_send, after))
    step("e1-wake-before-first-turn", before_first)

    def after_turn():
        sid = state.get("sid") or (box.wait_session(5) or {}).get("session_id")
        count = len(box.mock.model_calls())
        box.tui_send("first task")
        calls = box.wait_quiet(count + 1, quiet=1.5)
        sid = sid or (calls[count].session_id() if len(calls) > count else None)
        check(sid, "no session")
        state["sid"] = sid
        time.sleep(box.harness.arm_s)       # a turn-end waiter arms
        autonomy = (box.session(sid) or {}).get("autonomy")
        check(autonomy == 2, "autonomy %s after setup --autonomy 2" % autonomy)
        latency, returned, at_send, after, origin = _wake_once(box, sid)
        box.suite.latency["e2-wake-after-turn/" + box.mode] = latency
        box.end()
        left = box.wait_unmarked(12)
        check(not left, "after %s these are still running: %s" % (
            "/".join(box.harness.quit_keys), [one_line(c, 120) for c in left.values()]))
        return ("woke in %.2f s after a user turn (the send returned in %.2f s); delivery "
                "%s, then %s; the exit left nothing" % (latency, returned, at_send, after))
    step("e2-wake-after-turn", after_turn)
    box.end()


def run_doctor(box, step):
    """doctor through the harness's shell tool names this session and its lever;
    a one-shot mode's finished session is then resumed by its lever."""
    harness = box.harness
    state = {"prefix": harness.prefix}
    command = "%s %s doctor --json" % (shlex.quote(sys.executable), shlex.quote(AR))
    lever = harness.levers[box.mode]

    def script(req):
        sid = req.session_id()
        if state.get("phase") == "woken":
            return _wake_script(state)(req)
        if sid and not req.tool_results():
            state["sid"] = sid
            return Reply(calls=[harness.shell_call(command)])
        return Reply(text="doctor done")
    box.play(script)
    if box.kind == "tui":
        box.tui_start(harness.yolo_args)
    # doctor times the quiet hook five times: on a loaded machine a while.
    run = box.turn("run the doctor", 2, settle=60, yolo=True)

    def doctor():
        sid = state.get("sid")
        check(sid, "no digest reached the model%s" % run_hint(run))
        calls = box.mock.model_calls()
        check(len(calls) >= 2 and results(calls[-1]), "no shell result reached the model")
        text = "\n".join(results(calls[-1]))
        if harness.doctor_skip:
            check('"status"' in text, "doctor did not run: %s" % one_line(text, 300))
            raise Skip(harness.doctor_skip)
        lines = [one_line(l, 300) for l in text.splitlines() if sid in l or "lever" in l]
        check(any(sid in l for l in lines), "doctor does not name session %s: %s"
              % (sid, one_line(text, 300)))
        levers = (lever,) if isinstance(lever, str) else lever
        named = [l for l in lines if any(n in l for n in levers)]
        check(named, "doctor does not name the lever %s: %s"
              % (" or ".join(levers), lines or one_line(text, 300)))
        failed = re.findall(r'"status":\s*"fail",\s*"check":\s*"([^"]*)"', text)
        check(not failed, "doctor fails inside the session: %s" % failed)
        return one_line(named[0], 140)
    step("g-doctor", doctor)

    if box.kind == "tui" or not harness.resumes:
        box.end()
        return

    def wake_finished():
        check(run and not run["hung"], "the first run did not end")
        return resume_wake(box, state)
    step("e3-wake-finished", wake_finished)


def resume_wake(box, state, row="e3-wake-finished"):
    """A send to a finished session (state["sid"], its script a run_doctor's
    or one that reads state["phase"] the same way) runs the mode's lever: a
    resumed turn carrying the signal; its detail, or raises."""
    harness = box.harness
    lever = harness.levers[box.mode]
    sid = state.get("sid")
    check(sid, "no session")
    session = box.session(sid) or {}
    check(session.get("lever") == lever, "lever %r, not %s" % (session.get("lever"), lever))
    check(box.wait_unmarked(10) == {}, "the first run left processes")
    state["phase"] = "woken"
    box.peer()
    before = len(box.mock.model_calls())
    sent_at = time.time()
    sent = box.send(sid)
    at_send = state["at_send"] = box.states(sent["message_id"])    # the lever runs detached
    bound = 60 + harness.cold          # the lever's run is a cold start
    woke = box.mock.wait_for(lambda calls: len(calls) > before and calls[before], bound)
    check(woke is not None, "no resumed turn within %d s of the send (delivery %s)"
          % (bound, box.states(sent["message_id"])))
    latency = woke.at - sent_at
    box.suite.latency[row + "/" + box.mode] = latency
    asked = last_message_text(woke)
    check(SIGNAL_RE.search(asked), "the resumed turn does not carry the signal: %r"
          % asked[-200:])
    check(woke.session_id() in (None, sid), "the resumed turn's digest names %s, not %s"
          % (woke.session_id(), sid))
    check(not secrets_shown([woke]), "subject/body rode the wake")
    counted_wake(box, sent, before, latency)
    left = box.wait_unmarked(40 + harness.cold)
    check(not left, "the resumed run did not end: %s" % list(left.values())[:2])
    after = box.states(sent["message_id"])
    want = [["read"]] if harness.resumed_reads else [["accepted"], ["read"]]
    check(after in want, "after the resumed turn the peer saw %s (want %s)"
          % (after, " or ".join(map(str, want))))
    wakes = [w[5:] for w in box.wake_events(sent["message_id"])]
    return "resumed in %.1f s by %s (wake %s); peer saw %s then %s" % (
        latency, lever, "/".join(wakes), at_send, after)


# ---- more runs, a harness's to pick (Harness.cases) ------------------------------------

def run_exits(box, step):
    """A one-shot run at autonomy 2 (its waiter armed) exits after its turn
    and prints its result."""
    box.play(lambda req: Reply(text="final answer"))
    run = box.oneshot("hello", timeout=30)

    def exits():
        check(not run["hung"], "did not exit within 30 s after its turn (killed); stdout %r"
              % run["out"][-200:])
        check(run["rc"] == 0, "exit %s: %s" % (run["rc"], run["err"][-200:]))
        check("final answer" in run["out"], "result not printed: %r" % run["out"][-200:])
        return "exit 0 in %.1f s, result printed" % run["elapsed"]
    step("f-oneshot-exits-at-wake", exits)


def run_resume_rooms(box, step):
    """A shared room joined in-session survives the run's end and a resume."""
    state = {"phase": 1}
    shared = "shared:" + SHARED

    def script(req):
        sid = req.session_id()
        if state["phase"] == 1:
            if sid and not req.tool_results():
                state["sid"] = sid
                args = dict(box.harness.join_args(box, req), extra_rooms=[SHARED])
                return Reply(calls=[ar_call(box, "room_join", args)])
            if "members" not in state:
                state["members"] = [s["session_id"] for s in box.sessions(shared)]
            return Reply(text="joined")
        if "rooms2" not in state:
            found = re.findall(r"Rooms: ([^\n]*?)\. Autonomy", req.all_text())
            state["rooms2"] = found[-1] if found else None
            state["sid2"] = re.findall(r"your session_id is ([0-9a-f]{16})",
                                       req.all_text())[-1:]
            state["who"] = [s["session_id"] for s in box.sessions(shared)]
        return Reply(text="resumed")
    box.play(script)
    run = box.oneshot("join the shared room", timeout=45)

    def keeps():
        check(state.get("sid") and run["id"], "first run gave no session%s" % run_hint(run))
        sid = state["sid"]
        members = state.get("members", [])
        check(sid in members, "the session never got into %s during its turn (members %s)"
              % (shared, members))
        after_end = [s["session_id"] for s in box.sessions(shared)]
        state["phase"] = 2
        box.mock.reset()
        box.play(script)
        run2 = box.oneshot("continue", resume=box.harness.resume_key(box, run, sid),
                           timeout=45)
        check("rooms2" in state, "the resumed run reached no model%s" % run_hint(run2))
        check(state["sid2"] == [sid], "resumed digest names session %s, not %s"
              % (state["sid2"], sid))
        check(sid in state["who"], "resumed session is not in %s any more (who: %s; right "
              "after the run's end: %s; resumed digest rooms: %s)"
              % (shared, state["who"], after_end, state["rooms2"]))
        return "still in %s after the run's end and a resume" % shared
    step("g-resume-keeps-rooms", keeps)


def run_sent_states(box, step):
    """The sender's delivery states (autonomy 2): never undeliverable for a
    signalled message, read after msg_recv, and no stale wake afterwards."""
    state = {}

    def script(req):
        sid = req.session_id()
        done = req.tool_results()
        if sid and not done:
            if "sent" not in state:
                state["sid"] = sid
                state["sent"] = box.send(sid)
                state["at_send"] = box.states()
            return Reply(calls=[box.harness.read_call(box)])
        if sid and len(done) == 1:
            state["signalled"] = bool(SIGNAL_RE.search(req.all_text()))
            state["at_signal"] = box.states()
            return Reply(calls=[ar_call(box, "msg_recv", {"session_id": sid})])
        if "at_recv" not in state:
            state["at_recv"] = box.states()
        return Reply(text="done")
    box.play(script)
    if box.kind == "tui":
        box.turn("work on something", 3)
        box.wait_quiet(99, quiet=6.0, settle=6.0, timeout=20)   # a late wake would show
    else:
        run = box.oneshot("work on something", timeout=45, done=lambda: "at_recv" in state)
        key = box.harness.resume_key(box, run, state.get("sid"))
        if key and "at_recv" in state:
            # resume once: a wake queued for the finished run must not surface now
            box.oneshot("next task", resume=key, timeout=45,
                        done=lambda: len(box.mock.model_calls()) > 3)

    def states():
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
        check(not stale, "a signal/wake for the already-read message reached the model "
              "after msg_recv (request %s%s: %r)" % (
                  stale[0][0] if stale else None, ", in the resumed run"
                  if box.kind == "oneshot" else "", one_line(stale[0][1] if stale else "",
                                                            160)))
        aborted = [r.index for r in calls if "<turn_aborted>" in r.all_text()]
        check(not aborted, "the model was told a turn was interrupted (request %s): a wake "
              "was dispatched into a run that was exiting" % aborted[:1])
        return "send %s -> signalled %s -> recv %s" % (state["at_send"], state["at_signal"],
                                                        state["at_recv"])
    step("h-sent-states", states)


def run_idle_watch(box, step):
    """A peer asks, while the session works, to be told when its turn ends
    (notify-when idle): one message when it ends, none at the next (a TUI)."""
    state = {}

    def script(req):
        sid = req.session_id()
        if sid and not req.tool_results():
            if "watch" not in state:
                state["watch"] = box.ar("notify-when", "--session", box.peer(), "idle", sid,
                                        "--json", check_rc=False)
            return Reply(calls=[box.harness.read_call(box)])
        return Reply(text="done")
    box.play(script)
    run = box.turn("work on something", 2)

    def told_once():
        check("watch" in state, "no digest session id reached the model%s" % run_hint(run))
        watch = state["watch"]
        check(isinstance(watch, dict), "notify-when idle failed: %r" % (watch,))
        check(not watch.get("already"), "notify-when answered at once, as if no turn ran: "
              "%r" % watch)
        check(watch.get("watches"), "notify-when idle during the turn set no watch: %r"
              % watch)
        told, end = [], time.time() + 15
        while time.time() < end and not told:
            got = box.ar("recv", "--session", box.peer(), "--json")
            told += [m for m in got.get("messages", []) if m.get("subject", "").startswith(
                "[watch #")]
            time.sleep(0.5)
        check(len(told) == 1, "the peer was told %d times that the turn ended, not once "
              "(within 15 s of the last model request)" % len(told))
        took = time.time() - box.mock.model_calls()[-1].at
        detail = "told once: %r (%.1f s after the last model request)" % (
            told[0]["subject"], took)
        if box.tmux:
            box.tui_send("and again")
            box.wait_quiet(len(box.mock.model_calls()) + 1)
            time.sleep(2)
            again = box.ar("recv", "--session", box.peer(), "--json").get("messages", [])
            check(not again, "a second turn's end told the peer again: %r"
                  % [m.get("subject") for m in again])
            detail += "; not again after a second turn"
        return detail
    step("i-idle-watch", told_once)


class Case:
    """One run: a name, setup's --autonomy, the modes it runs in ("oneshot",
    "tui", or mode names), its function and the rows it reports
    (NAME@KIND or NAME@MODE: in that kind or mode only)."""

    def __init__(self, name, autonomy, function, rows, modes=("oneshot", "tui")):
        self.name, self.autonomy, self.function = name, autonomy, function
        self.rows, self.modes = rows, modes

    def within(self, *modes):
        """The same run in these modes (names or kinds) only."""
        return Case(self.name, self.autonomy, self.function, self.rows, modes=modes)

    def runs_in(self, harness, mode):
        return mode in self.modes or harness.modes[mode] in self.modes

    def rows_in(self, harness, mode):
        out = []
        for row in self.rows:
            name, _, where = row.partition("@")
            if not where or where in (mode, harness.modes[mode]):
                out.append("%s/%s" % (name, mode))
        return out


COMMON = [
    Case("room", 0, run_room, ("a-digest", "b-mcp-session", "f-room-call", "h-exit")),
    Case("signal", 0, run_signal, ("c-midturn-signal",)),
    Case("hold", 1, run_hold, ("d-hold-once",)),
    Case("wake", 2, run_wake, ("e1-wake-before-first-turn", "e2-wake-after-turn"),
         modes=("tui",)),
    Case("doctor", 2, run_doctor, ("g-doctor", "e3-wake-finished@oneshot")),
]
# Runs a harness may add to COMMON (Harness.cases).
MORE = {
    "exits": Case("exits", 2, run_exits, ("f-oneshot-exits-at-wake",), modes=("oneshot",)),
    "resume-rooms": Case("resume-rooms", 0, run_resume_rooms, ("g-resume-keeps-rooms",),
                         modes=("oneshot",)),
    "sent-states": Case("sent-states", 2, run_sent_states, ("h-sent-states",)),
    "idle-watch": Case("idle-watch", 0, run_idle_watch, ("i-idle-watch",)),
}


# ---- the suite ------------------------------------------------------------------------

class Suite:
    def __init__(self, harness, args, bins):
        self.harness = harness
        self.bins = [os.path.abspath(b) for b in bins]
        self.keep = args.keep
        self.pg_url = args.db
        os.makedirs(args.workdir, exist_ok=True)
        self.root = tempfile.mkdtemp(prefix="run-", dir=os.path.abspath(args.workdir))
        self.socket = "agents-room-e2e-%s-%d" % (harness.name, os.getpid())
        self.mocks = []
        self.results = {}           # case -> (status, detail)
        self.latency = {}           # case -> a wake's latency in seconds
        self.wakes = []             # (mode, latency, turns) of each wake counted
        self.lock = threading.Lock()

    def which(self, program):
        return shutil.which(program, path=os.pathsep.join(self.bins))

    def tmux(self, *args, check=True):
        done = subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null"] + list(args),
                              capture_output=True, text=True, timeout=30)
        if check and done.returncode != 0:
            raise Failure("tmux %s: %s" % (args[0], done.stderr.strip()))
        return done.stdout

    def lanes(self, selected, jobs):
        """Run the selected (case, mode) pairs, a lane per mode when jobs > 1."""
        groups = {}
        for case, mode in selected:
            groups.setdefault(mode if jobs > 1 else "all", []).append((case, mode))
        threads = []
        for lane in groups.values():
            mock = Mock(getattr(self.harness, "request_class", mock_model.GeminiRequest),
                        log=log, require_offered=self.harness.require_offered).start()
            self.mocks.append(mock)
            thread = threading.Thread(target=self.lane, args=(lane, mock), daemon=True)
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join()

    def lane(self, lane, mock):
        """A lane's runs one after another, then the checks they left for
        later (Later), in the order of their runs: each, whatever broke
        before it, so every run's box is cleaned up."""
        finishes = []
        try:
            for case, mode in lane:
                finishes.append(self.run(case, mode, mock))
        finally:
            for finish in finishes:
                try:
                    finish()
                except Exception as error:  # its rows count as failed (_run)
                    log("FAIL finishing a run: %s: %s" % (type(error).__name__, error))

    def run(self, case, mode, mock):
        """One run: its box, its steps; returns what finishes it (its Later
        checks, the box's cleanup, its rows), done at once when it left none."""
        wanted = case.rows_in(self.harness, mode)
        started = time.time()
        rows, box, later = [], None, []

        def step(row_name, fn):
            name = "%s/%s" % (row_name, mode)
            status, detail = outcome(fn)
            if status == "PASS" and isinstance(detail, Later):
                later.append((name, detail.check))
                log("LATER %s" % name)
                return
            rows.append((name, status, detail))
            log("%s %s: %s" % (status, name, one_line(detail)))

        try:
            box = Box(self, mock, "%s-%s" % (case.name, mode), mode, case.autonomy)
            case.function(box, step)
            error = "not reached"
        except Exception as exc:  # the run broke before its steps
            error = "error: %s: %s" % (type(exc).__name__, exc)
        finally:
            # What fails the whole run: a scripted call the harness did not
            # offer (require_offered), a dialog a user would have to answer.
            wrong = list(mock.problems[:2])
            if box is not None and box.dialog_shown():
                wrong.append(box.dialog_shown())
            if box is not None:
                try:
                    mock.dump(os.path.join(box.dir, "requests.json"))
                except OSError:
                    pass
        ran = time.time() - started

        def finish():
            nonlocal rows
            for name, check_later in later:
                status, detail = outcome(check_later)
                rows.append((name, status, detail))
                log("%s %s: %s" % (status, name, one_line(detail)))
            rows = [(c, "FAIL", "%s [%s]" % (d, "; ".join(one_line(w, 300) for w in wrong)))
                    if wrong and st != "SKIP" else (c, st, d) for c, st, d in rows]
            if box is not None:
                try:
                    box.cleanup()
                except Exception as error:  # the rows are still recorded
                    box.errors.append("cleanup: %s: %s" % (type(error).__name__, error))
            if box is not None and box.errors:
                rows = [(c, st, d + (" [%s]" % "; ".join(box.errors[:2]) if st == "FAIL"
                                     else "")) for c, st, d in rows]
            done = {name for name, _, _ in rows}
            rows += [(name, "FAIL", error) for name in wanted if name not in done]
            with self.lock:
                for name, status, detail in rows:
                    self.results[name] = (status, detail)
                    print("%-4s %-36s %s" % (status, name, one_line(detail)), flush=True)
                print("     %-36s %.1f s%s" % (
                    "(run %s/%s)" % (case.name, mode), ran,
                    "; %s checked at the lane's end" % ", ".join(n for n, _ in later)
                    if later else ""), flush=True)
        if not later:
            finish()
        return finish if later else (lambda: None)

    def close(self):
        for mock in self.mocks:
            mock.stop()
        self.tmux("kill-server", check=False)
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def report(self, version):
        """One E2E-ROW per mode that ran: digest, signal, hold from their rows,
        wake from the mode's e* rows (all of them must pass)."""
        ran = {name.split("/")[1] for name in self.results}
        for mode in self.harness.modes:
            if mode not in ran:
                continue
            mine = {n.split("/")[0]: s for n, (s, _) in self.results.items()
                    if n.endswith("/" + mode)}

            def cell(*names):
                states = [mine.get(n) for n in names]
                if not names or any(s is None for s in states):
                    return None
                if all(s == "SKIP" for s in states):
                    return "n/a"
                return all(s == "PASS" for s in states if s != "SKIP")
            wakes = sorted(n for n in mine if re.match(r"e\d?-wake", n))
            latency = next((self.latency[n + "/" + mode] for n in reversed(wakes)
                            if n + "/" + mode in self.latency), None)
            wake = cell(*wakes)
            if mode in self.harness.wake_na:    # it cannot be woken: shown so, measured
                wake = cell(*self.harness.wake_na[mode])
                wake = "n/a" if wake is True else wake
            own = self.harness.cells.get(mode, {})
            if "wake" in own:
                wake = cell(*own["wake"])
                latency = next((self.latency[n + "/" + mode] for n in own["wake"]
                                if n + "/" + mode in self.latency), None)
            report_row(self.harness.title, version, self.harness.labels.get(mode, mode),
                       digest=cell(*own.get("digest", ("a-digest",))),
                       signal=cell(*own.get("signal", ("c-midturn-signal",))),
                       hold=cell(*own.get("hold", ("d-hold-once",))), wake=wake,
                       latency=latency, note=self.harness.note(self, mode))


def selected_cases(harness, only):
    wanted = [w.strip() for w in (only or "").split(",") if w.strip()]
    for case in harness.cases():
        for mode in harness.modes:
            if not case.runs_in(harness, mode):
                continue
            names = case.rows_in(harness, mode) + ["%s/%s" % (case.name, mode)]
            if not wanted or any(w in n for w in wanted for n in names):
                yield case, mode


def main(harness, argv=None):
    global VERBOSE, AR
    parser = argparse.ArgumentParser(description="e2e: agents-room under a real %s"
                                     % harness.title)
    parser.add_argument("--install", nargs="+", metavar="PKG", help="install these from "
                        "the registry into WORKDIR first (%s)" % harness.installer)
    parser.add_argument("--bin", action="append", default=[], metavar="DIR",
                        help="a directory with the harness's executables (repeatable)")
    parser.add_argument("--only", help="run the runs with a row or name containing one of "
                        "these (comma-separated), e.g. c-midturn, wake or a mode")
    parser.add_argument("--list", action="store_true", help="list the rows and exit")
    parser.add_argument("--keep", action="store_true", help="keep the work directory "
                        "(homes, stores, requests.json and screen.txt per run)")
    parser.add_argument("--workdir", default=os.path.join(ROOT, ".e2e-" + harness.name))
    parser.add_argument("--agents-room", default=AR, help="the agents_room.py under test")
    parser.add_argument("--jobs", type=int, default=2, choices=(1, 2), help="2 (default): "
                        "a lane per mode, side by side; 1: one run after another")
    parser.add_argument("--db", metavar="URL", help="every run on this PostgreSQL "
                        "database (a schema a run) instead of a SQLite file")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    VERBOSE = args.verbose
    AR = os.path.abspath(args.agents_room)
    selected = list(selected_cases(harness, args.only))
    tag = "e2e-%s" % harness.name
    if args.list:
        for case, mode in selected:
            for name in case.rows_in(harness, mode):
                print("%-36s (run %s/%s, autonomy %d)" % (name, case.name, mode,
                                                         case.autonomy))
        return 0
    if not selected:
        print("%s: no row matches %r" % (tag, args.only))
        return 2
    drop_ci_markers()
    workdir = os.path.abspath(args.workdir)
    bins = list(args.bin)
    if args.install:
        shutil.rmtree(workdir, ignore_errors=True)
        os.makedirs(workdir)
        try:
            bins = harness.install(args.install, workdir) + bins
        except (OSError, subprocess.CalledProcessError) as error:
            print("%s: could not install %s: %s" % (tag, " ".join(args.install), error))
            shutil.rmtree(workdir, ignore_errors=True)
            return 2
    try:
        return _run(harness, args, bins, selected, tag)
    finally:
        if args.install and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def _run(harness, args, bins, selected, tag):
    needs = list(harness.requires)
    if any(harness.modes[mode] == "tui" for _, mode in selected):
        needs.append("tmux")
    missing = [tool for tool in needs if shutil.which(tool) is None]
    if not shutil.which(harness.program, path=os.pathsep.join(bins) or None):
        missing.append("%s (in %s; make %s installs it)" % (harness.program,
                                                            bins or "PATH", tag))
    if missing:
        print("%s: missing %s" % (tag, ", ".join(missing)))
        return 2
    suite = Suite(harness, args, bins or [os.path.dirname(shutil.which(harness.program))])
    started = time.time()
    version = suite.version = harness.version(suite)
    print("%s: %s %s (%s), %s (sha256 %s)" % (tag, harness.title, version,
                                            suite.which(harness.program), AR, file_sha(AR)),
          flush=True)
    try:
        suite.lanes(selected, args.jobs)
    finally:
        suite.close()
    # A row no run recorded (its lane broke) is a failure, never left out.
    ordered = [(name,) + suite.results.get(name, ("FAIL", "not recorded: its lane broke"))
               for case, mode in selected for name in case.rows_in(harness, mode)]
    print("\n%-4s  %-36s  %s" % ("", "row", "why"))
    for name, status, detail in ordered:
        print("%-4s  %-36s  %s" % (status, name, one_line(detail, 200)))
    suite.report(version)
    counts = {s: sum(1 for r in ordered if r[1] == s) for s in ("PASS", "FAIL", "SKIP")}
    print("\n%s %s: %d passed, %d failed, %d skipped in %.0f s%s" % (
        harness.title, version, counts["PASS"], counts["FAIL"], counts["SKIP"],
        time.time() - started, "; kept %s" % suite.root if args.keep else ""))
    return 1 if counts["FAIL"] else 0
