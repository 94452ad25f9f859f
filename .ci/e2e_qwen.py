#!/usr/bin/env python3
"""End-to-end: agents-room under a real Qwen Code (qwen -p and the TUI), offline.

    python3 .ci/e2e_qwen.py --bin DIR [--only NAME[,NAME...]] [--list] [--keep]
                            [--jobs 1|2] [-v]

DIR is the directory holding the `qwen` executable (an npm prefix's
node_modules/.bin, e.g. after `npm install --prefix P @qwen-code/qwen-code@0.24.4`:
P/node_modules/.bin).  The version it ran is printed and reported.

Each run gets a fresh HOME (XDG dirs, TMPDIR and a short XDG_RUNTIME_DIR for
Qwen's inbox socket), a git repository `proj` configured by exactly
`agents_room.py setup qwen --write [--autonomy N]`, and its own store
(AGENTS_ROOM_DB).  Besides that, the run pre-writes only what is about the mock
model: ~/.qwen/.env (OPENAI_BASE_URL/API_KEY/MODEL pointing at 127.0.0.1) and
~/.qwen/settings.json (auth type openai, the model name, auto-update,
telemetry and usage statistics off, and the extra model calls off: managed
memory, auto-dream, auto-skill, follow-up suggestions).  Qwen talks only to
.ci/mock_model.py, which records every request: the checks read what the model
was shown.  A peer session (the CLI: join, send, sent) plays the other agent.

Modes: qwen-p (`qwen -p PROMPT -o json`), qwen-tui (interactive `qwen` in tmux).
Runs (setup --autonomy in brackets); each run is one harness session and
reports the rows after it:
  room [0]     a-digest     the SessionStart digest ("your session_id is <16 hex>") is in
                            the first request, and that session is alive in `who`
               b-mcp        the lean tool listing is offered (mcp__agents-room__*), and
                            room_join (no arguments) / msg_recv act on the digest's session:
                            no second session in `who`; no auto-mode classifier call
               f-room-call  room_call {"op": "task", ...} adds a task in a real turn
               h-exit       the harness exits (the TUI: /quit) and the session is gone in
                            `who` (the TUI: ended by SessionEnd; qwen -p fires none, its
                            session is gone by its process), no process of the run is left
  signal [0]   c-midturn-signal  a send while the model works reaches the next request as
                            the one-line signal (in the tool result), never subject or body
  hold [1]     d-hold-once  the end of a turn with unread mail is held once (the
                            continuation carries the signal), not again the next turn
  wake [2]     e1-wake-before-first-turn, e2-wake-after-turn (qwen-tui): a send to the
                            idle TUI starts a turn (lever qwen-socket, the session's
                            cross-session inbox); latency from the send to the mock seeing
                            the woken request; the peer sees accepted, then read
  doctor [2]   g-doctor     `agents_room.py doctor --json` run through Qwen's shell tool
                            names this session and its wake lever (this run alone starts
                            Qwen with --approval-mode yolo: its shell tool needs approval)
               e3-wake-finished (qwen-p): a send to the finished one-shot session resumes it
                            (lever qwen-resume: qwen --resume KEY -p SIGNAL) and the signal
                            reaches the model
--only matches any part of a row's name or of a run's (e.g. "wake", "qwen-tui",
"c-midturn"); the whole run is done and all its rows are printed.  --jobs 2 (the
default) runs the qwen-p runs and the qwen-tui runs side by side, each lane with
its own mock.  Exit 1 on any FAIL.  Standard library only; needs node, git and
tmux.  E2E-ROW lines (.ci/e2e_report.py) are printed for the truth table, one per
mode.
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
import mock_model  # noqa: E402
from mock_model import Call, MockModel, Reply  # noqa: E402
from e2e_report import row  # noqa: E402

from e2e_common import (  # noqa: E402
    drop_ci_markers, Failure, SIGNAL_RE, Skip, check, kill_group, one_line, signal_line)

drop_ci_markers()

AR = os.path.join(ROOT, "agents_room.py")
PACKAGE = "@qwen-code/qwen-code"
MODES = ("qwen-p", "qwen-tui")
PREFIX = "mcp__agents-room__"
LEAN = {"room_join", "msg_send", "msg_recv", "room_who", "lease_claim", "lease_release",
        "note_read", "drift_check", "room_call"}
SECRET_SUBJECT = "E2E-SECRET-SUBJECT"
SECRET_BODY = "E2E-SECRET-BODY"
READY = "Type your message"
VERBOSE = False


def log(text):
    if VERBOSE:
        sys.stderr.write("  . %s\n" % text)
        sys.stderr.flush()


# ---- the mock: Qwen's auto-mode classifier is not the agent ---------------------

class QwenRequest(mock_model.GeminiRequest):
    """A request of Qwen's: one whose only tool is respond_in_schema is the
    auto-mode permission classifier, not the agent's own conversation."""

    @property
    def is_classifier(self):
        return self.is_model_call and self.tool_names() == ["respond_in_schema"]

    @property
    def is_main(self):
        return mock_model.GeminiRequest.is_main.fget(self) and not self.is_classifier


class QwenMock(MockModel):
    """.ci/mock_model.py's mock, with two additions kept here: it records
    QwenRequests (the classifier is auxiliary: it gets the default "ok", which
    Qwen reads as no approval), and it knows when a script is still running,
    so a TUI turn is not taken as over while the script notes what it saw."""

    def __init__(self, script=None, log=None):
        MockModel.__init__(self, script, log)
        self.answering = 0              # scripts running now
        self.answered_at = 0.0          # when the last one returned

    def _record(self, method, path, headers, body, raw):
        with self.lock:
            req = QwenRequest(len(self.requests), method, path, headers, body,
                              raw.decode("utf-8", "replace") if body is None else None)
            self.requests.append(req)
            self.changed.notify_all()
        log("mock: %s %s%s" % (method, path, " (main)" if req.is_main else
                                " (classifier)" if req.is_classifier else ""))
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
        while a script still runs (it may be noting what it saw)."""
        with self.lock:
            if self.answering:
                return None
            calls = [r.at for r in self.requests if r.is_main]
            return max([start, self.answered_at] + calls[-1:])

    def classifier_calls(self):
        with self.lock:
            return [r for r in self.requests if r.is_classifier]


# ---- the world of one run ---------------------------------------------------------

class Box:
    """A temporary HOME, a git repository `proj` set up by `setup qwen --write`,
    a store, a peer session, and the suite's mock (reset for this run)."""

    def __init__(self, suite, mock, name, mode, autonomy):
        self.suite, self.mode, self.autonomy = suite, mode, autonomy
        self.name = name
        self.dir = os.path.join(suite.root, name)
        self.home = os.path.join(self.dir, "home")
        self.repo = os.path.join(self.dir, "proj")
        self.db = os.path.join(self.dir, "store", "room.db")
        # Qwen's inbox socket is $XDG_RUNTIME_DIR/qwen-socks/<pid>.sock (at most
        # 103 bytes) and the lever binds its reply socket under $TMPDIR: short paths.
        self.run = tempfile.mkdtemp(prefix="qe2e-")
        self.tmux = None
        self.peer_sid = None
        self.notes = suite.notes
        self.errors = []
        self.mock = mock
        self.mock.reset()
        for path in (self.home, self.repo, os.path.join(self.home, ".qwen"),
                     os.path.join(self.run, "tmp")):
            os.makedirs(path, exist_ok=True)
        os.makedirs(os.path.dirname(self.db), mode=0o700, exist_ok=True)
        self.env = self._env()
        self._mock_settings()
        git = ["git", "-c", "user.name=e2e", "-c", "user.email=e2e@localhost"]
        subprocess.run(git + ["init", "-q", self.repo], check=True, timeout=30)
        with open(os.path.join(self.repo, "README"), "w") as handle:
            handle.write("e2e\n")
        subprocess.run(git + ["-C", self.repo, "add", "README"], check=True, timeout=30)
        subprocess.run(git + ["-C", self.repo, "commit", "-qm", "init"], check=True,
                       timeout=30)
        self.setup()

    def _env(self):
        drop = ("QWEN", "OPENAI", "DASHSCOPE", "BAILIAN", "ANTHROPIC", "GEMINI", "GOOGLE",
                "CLAUDE", "CODEX", "AGENTS_ROOM", "TMUX", "XDG_", "NODE_OPTIONS")
        proxies = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(drop) and k.lower() not in proxies}
        env.update({
            "HOME": self.home,
            "PATH": self.suite.bin + os.pathsep + env.get("PATH", "/usr/bin:/bin"),
            "AGENTS_ROOM_DB": self.db,
            "AGENTS_ROOM_E2E_BOX": self.dir,      # marks every process of this run
            "XDG_RUNTIME_DIR": self.run,
            "TMPDIR": os.path.join(self.run, "tmp"),
            "XDG_CONFIG_HOME": os.path.join(self.home, ".config"),
            "XDG_CACHE_HOME": os.path.join(self.home, ".cache"),
            "XDG_DATA_HOME": os.path.join(self.home, ".local", "share"),
            "XDG_STATE_HOME": os.path.join(self.home, ".local", "state"),
            "NO_PROXY": "127.0.0.1,localhost",
            "TERM": "xterm-256color",
            "LANG": env.get("LANG", "C.UTF-8"),
        })
        return env

    def _mock_settings(self):
        """Only what is about the mock: where the model is, and no extra calls."""
        qwen = os.path.join(self.home, ".qwen")
        with open(os.path.join(qwen, ".env"), "w") as handle:
            handle.write("OPENAI_BASE_URL=%s/v1\nOPENAI_API_KEY=sk-e2e-mock\n"
                         "OPENAI_MODEL=mock-model\n" % self.mock.url)
        settings = {
            "security": {"auth": {"selectedType": "openai"}},
            "model": {"name": "mock-model"},
            "general": {"enableAutoUpdate": False},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            # Each of these makes model calls of its own (after a turn) that a
            # scripted mock would take for the agent's next step.
            "memory": {"enableManagedAutoMemory": False, "enableManagedAutoDream": False,
                       "enableAutoSkill": False},
            "ui": {"enableFollowupSuggestions": False},
        }
        with open(os.path.join(qwen, "settings.json"), "w") as handle:
            json.dump(settings, handle, indent=2)

    def setup(self):
        argv = [sys.executable, AR, "setup", "qwen", "--write"]
        if self.autonomy:
            argv += ["--autonomy", str(self.autonomy)]
        done = subprocess.run(argv, cwd=self.repo, env=self.env, capture_output=True,
                              text=True, timeout=60)
        if done.returncode != 0:
            raise Failure("setup qwen failed: %s" % done.stderr.strip()[-300:])

    def play(self, script):
        """The mock answers with script(req); an error in it is kept for the
        report (the mock answers "script error" text then)."""
        def guarded(req):
            try:
                return script(req)
            except Exception as error:
                self.errors.append("script at request %d: %s: %s" % (
                    req.index, type(error).__name__, one_line(error, 200)))
                raise
        self.mock.script = guarded

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
            return done.stdout + done.stderr

    def peer(self):
        if self.peer_sid is None:
            joined = self.ar("join", "--room", "repo:proj", "--label", "peer",
                             "--harness-key", "e2e-peer", "--json")
            self.peer_sid = joined["session_id"]
        return self.peer_sid

    def send(self, to):
        return self.ar("send", "--session", self.peer(), "--to", to, "--subject",
                       SECRET_SUBJECT, "--body", SECRET_BODY, "--json")

    def states(self, message_id=None):
        """The peer's view: the state of each delivery it sent (of one message)."""
        sent = self.ar("sent", "--session", self.peer(), "--json")
        return [d["state"] for m in sent.get("messages", []) for d in m.get("deliveries", [])
                if message_id is None or m.get("message_id") == message_id]

    def sessions(self):
        """Sessions `who` lists, the peer left out (dicts as `who --json` has them)."""
        for _ in range(3):
            found = self.ar("who", "--json", "--room", "repo:proj", check_rc=False)
            if isinstance(found, dict):
                break
            self.errors.append("who: %s" % one_line(found, 300))
            time.sleep(0.3)
        else:
            return []
        return [s for s in found.get("sessions", []) if s["session_id"] != self.peer_sid
                and s.get("label") != "peer"]

    def wake_events(self, message_id):
        """The kinds of the store's wake.* events about one message."""
        import sqlite3
        conn = sqlite3.connect(self.db, timeout=10)
        try:
            rows = conn.execute("SELECT kind, data FROM events WHERE kind LIKE 'wake.%' "
                                "ORDER BY id").fetchall()
        finally:
            conn.close()
        return [kind for kind, data in rows
                if message_id in (json.loads(data or "{}").get("messages") or [])]

    def session(self, sid):
        return next((s for s in self.sessions() if s["session_id"] == sid), None)

    def wait_session(self, timeout):
        end = time.time() + timeout
        while time.time() < end:
            if os.path.exists(self.db):
                found = self.sessions()
                if found:
                    return found[0]
            time.sleep(0.3)
        return None

    # -- one-shot runs: qwen -p
    def oneshot(self, prompt, resume=None, yolo=False, timeout=60):
        """One `qwen -p` turn to completion: dict(rc, out, err, elapsed, hung, id)."""
        argv = [os.path.join(self.suite.bin, "qwen"), "-p", prompt, "-o", "json"]
        argv += ["--resume", resume] if resume else []
        argv += ["--approval-mode", "yolo"] if yolo else []
        log("run qwen -p %r%s" % (prompt, " --resume" if resume else ""))
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
        return {"rc": proc.returncode, "out": out_text, "err": err_text, "elapsed": elapsed,
                "hung": hung, "id": result_of(out_text).get("session_id")}

    # -- interactive runs in tmux
    def tui_start(self, extra=()):
        self.tmux = "qe2e-%s" % self.name[-40:]
        envfile = os.path.join(self.dir, "env.sh")
        with open(envfile, "w") as handle:
            for key, value in sorted(self.env.items()):
                handle.write("export %s=%s\n" % (key, shlex.quote(value)))
        program = " ".join(["qwen"] + [shlex.quote(a) for a in extra])
        command = "bash --norc --noprofile -c %s" % shlex.quote(
            ". %s; cd %s && exec %s" % (shlex.quote(envfile), shlex.quote(self.repo), program))
        self.suite.tmux("new-session", "-d", "-s", self.tmux, "-x", "160", "-y", "50", command)
        end = time.time() + 40
        while time.time() < end:
            if READY in self.screen():
                break
            time.sleep(0.3)
        else:
            raise Failure("the TUI did not become ready in 40 s; screen:\n%s" % self.screen())
        time.sleep(0.8)

    def screen(self):
        return self.suite.tmux("capture-pane", "-p", "-t", self.tmux, "-S", "-300",
                               check=False)

    def tui_alive(self):
        return self.tmux is not None and subprocess.run(
            ["tmux", "-L", self.suite.socket, "has-session", "-t", self.tmux],
            capture_output=True, timeout=10).returncode == 0

    def tui_send(self, text):
        self.suite.tmux("send-keys", "-t", self.tmux, "-l", text)
        time.sleep(0.4)
        self.suite.tmux("send-keys", "-t", self.tmux, "Enter")

    def tui_quit(self, timeout=15):
        """/quit; returns the last screen seen before the pane closed, or raises."""
        self.tui_send("/quit")
        end, last = time.time() + timeout, ""
        while time.time() < end:
            if not self.tui_alive():
                self.tmux = None
                return last
            last = self.screen() or last
            time.sleep(0.2)
        raise Failure("the TUI did not exit within %d s of /quit; screen:\n%s"
                      % (timeout, last[-800:]))

    def wait_quiet(self, at_least, quiet=1.2, settle=12.0, timeout=45):
        """Wait until >= at_least main requests were seen and none came for
        `quiet` s; with fewer, give up once none came for `settle` s."""
        start = time.time()
        while time.time() < start + timeout:
            calls = self.mock.model_calls()
            since = self.mock.idle_since(start)
            idle = time.time() - since if since is not None else 0.0
            if (len(calls) >= at_least and idle > quiet) or (idle > settle):
                return calls
            time.sleep(0.2)
        return self.mock.model_calls()

    def turn(self, prompt, expect, quiet=1.2, **oneshot):
        """One user turn: a one-shot run, or a prompt typed into the TUI (started
        on first use).  `expect`: the main requests to wait for; then none for
        `quiet` s (longer where a check is that nothing more comes)."""
        if self.mode == "qwen-tui":
            if self.tmux is None:
                self.tui_start()
            self.tui_send(prompt)
            self.wait_quiet(expect, quiet=quiet)
            return None
        return self.oneshot(prompt, **oneshot)

    def end(self):
        """End the harness session the way a user does (the TUI: /quit)."""
        if self.tmux is not None:
            return self.tui_quit()
        return ""

    def cleanup(self):
        if self.tmux:
            try:
                with open(os.path.join(self.dir, "screen.txt"), "w") as handle:
                    handle.write(self.screen())
            except OSError:
                pass
            self.suite.tmux("kill-session", "-t", self.tmux, check=False)
            time.sleep(0.3)
        kill_marked(self)
        shutil.rmtree(self.run, ignore_errors=True)


def marked(box):
    """{pid: command line} of the processes this run started: their environment
    names its directory or its store (a lever's process keeps only the store)."""
    wanted = [("AGENTS_ROOM_E2E_BOX=%s" % box.dir).encode(),
              ("AGENTS_ROOM_DB=%s" % box.db).encode()]
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
                    continue            # a zombie is gone, waiting for its reaper
        except OSError:
            continue
        if any(item in wanted for item in environ):
            found[int(entry)] = cmdline.strip()
    return found


def wait_unmarked(box, timeout):
    """Wait until no process of the run is left; returns those still there."""
    end = time.time() + timeout
    left = marked(box)
    while left and time.time() < end:
        time.sleep(0.3)
        left = marked(box)
    return left


def kill_marked(box):
    """End the processes this run started (by pid, never by name)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        found = marked(box)
        for pid in found:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        if not found:
            return
        time.sleep(0.5)


# ---- what the model was shown -------------------------------------------------------

def result_of(out):
    """The result item of `qwen -p -o json` (an array of events)."""
    try:
        items = json.loads(out)
    except ValueError:
        items = []
    for item in items if isinstance(items, list) else [items]:
        if isinstance(item, dict) and item.get("type") == "result":
            return item
    return {}


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


def last_user_text(req):
    texts = req.user_texts()
    return texts[-1] if texts else ""


def ar_call(name, args):
    return Call(PREFIX + name, args)


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


def run_hint(run):
    if not run:
        return ""
    return " (exit %s%s; stderr %r)" % (run["rc"], ", hung" if run["hung"] else "",
                                        run["err"].strip()[-200:])


def qwen_errors(run):
    """Qwen's own errors on stderr, without its harmless ripgrep notice."""
    return [line for line in run["err"].splitlines() if line.strip()
            and "Ripgrep not available" not in line]


# ---- runs ---------------------------------------------------------------------------
# Each is one harness session; step(name, fn) records a row (fn returns its detail
# or raises Failure/Skip).

def run_room(box, step):
    state = {}

    def script(req):
        sid = req.session_id()
        done = len(req.tool_results())
        if not sid:
            return Reply(text="no digest")
        if done == 0:
            state.update(sid=sid, tools=req.tool_names())
            return Reply(calls=[ar_call("room_join", {})])
        if done == 1:
            return Reply(calls=[ar_call("msg_recv", {"session_id": sid})])
        if done == 2:
            return Reply(calls=[ar_call("room_call", {"op": "task", "args": {
                "session_id": sid, "action": "add", "title": "e2e task"}})])
        if "who" not in state:
            state["who"] = box.sessions()
        return Reply(text="done")
    box.play(script)
    run = box.turn("use the room", 4, timeout=60)
    calls = box.mock.model_calls()

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
        return "session %s (in the %s), alive in who" % (sid, where)
    step("a-digest", digest)

    def mcp():
        check(state.get("sid"), "no digest session id reached the model%s" % run_hint(run))
        sid = state["sid"]
        ours = {n[len(PREFIX):] for n in state["tools"] if n.startswith(PREFIX)}
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
        mine = [s["session_id"] for s in state.get("who") or []]
        check(mine == [sid], "`who` lists %d harness sessions %s; expected only %s"
              % (len(mine), mine, sid))
        classifier = box.mock.classifier_calls()
        check(not classifier, "our tool calls went to the auto-mode classifier (%d requests):"
              " permissions.allow missing?" % len(classifier))
        return "9 lean tools offered; room_join -> %s, msg_recv ok, one session" % sid
    step("b-mcp", mcp)

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
            check(not run["hung"], "qwen -p did not exit within 60 s (killed)")
            check(run["rc"] == 0, "qwen -p exit %s: %s" % (run["rc"], qwen_errors(run)[-3:]))
            how = "qwen -p exit 0"
        else:
            screen = box.end()
            how = "/quit%s" % (", 'qwen --resume' offered" if "--resume" in screen else "")
        # Qwen Code 0.24.4 fires SessionEnd in the TUI (and ACP), not in -p.
        want_end = box.mode == "qwen-tui"
        end = time.time() + 8
        while time.time() < end:
            found = box.session(sid) or {}
            if found.get("liveness") != "alive" and (found.get("ended") or not want_end):
                break
            time.sleep(0.3)
        check(found.get("liveness") != "alive", "session %s still alive after the exit" % sid)
        if want_end:
            check(found.get("ended"), "`who` does not show session %s ended after /quit "
                  "(liveness %s): no SessionEnd?" % (sid, found.get("liveness")))
            ended = "ended (SessionEnd)"
        else:
            ended = "ended (SessionEnd)" if found.get("ended") else \
                "not ended: qwen -p fires no SessionEnd"
        left = wait_unmarked(box, 8)
        check(not left, "processes left after the exit: %s" % "; ".join(
            "%d %s" % (p, one_line(c, 80)) for p, c in sorted(left.items())))
        return "%s; who: %s, %s; no process left" % (how, found.get("liveness"), ended)
    step("h-exit", exit_)


def run_signal(box, step):
    state = {}
    readme = os.path.join(box.repo, "README")

    def script(req):
        sid = req.session_id()
        if sid and not req.tool_results():
            if "sent" not in state:
                state["sent"] = box.send(sid)
            return Reply(calls=[Call("read_file", {"file_path": readme})])
        return Reply(text="done")
    box.play(script)
    run = box.turn("work on something", 2, timeout=60)
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
        where = "the read_file result" if texts and SIGNAL_RE.search(texts[-1]) else \
            "a message after the tool result"
        leaked = secrets_shown(calls)
        check(not leaked, "subject/body rode the signal (requests %s)" % leaked)
        return "in %s: %s" % (where, signal_line(tail)[:100])
    step("c-midturn-signal", midturn)


def run_hold(box, step):
    state = {"turn": 1}

    def script(req):
        sid = req.session_id()
        if sid and "sent" not in state:
            state["sent"] = box.send(sid)
        return Reply(text="done-turn%d" % state["turn"])
    box.play(script)

    def hold():
        run = box.turn("first task", 2, quiet=2.5, timeout=60)
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
        shown = ""
        if box.tmux and "Stop hook error" in box.screen():
            shown = "; the TUI labels it 'Stop hook error' (Qwen's fixed wording)"
        # the second turn, the delivery still unread: no second hold
        state["turn"] = 2
        if box.tmux:
            box.tui_send("second task")
            calls = box.wait_quiet(3, quiet=2.5)
        else:
            check(run["id"], "qwen -p printed no session id to resume")
            box.oneshot("second task", resume=run["id"], timeout=60)
            calls = box.mock.model_calls()
        second = calls[2:]
        check(second, "the second turn made no request")
        check(len(second) == 1, "the same delivery held a Stop again in the next turn "
              "(%d requests in turn 2)" % len(second))
        return "held once (%r), not again in turn 2%s" % (signal_line(held)[:60], shown)
    step("d-hold-once", hold)


def _wake_script(state):
    """A woken turn reads its mail (msg_recv), then answers."""
    def script(req):
        sid = req.session_id()
        if req.last_role() == "user" and SIGNAL_RE.search(last_user_text(req)) and sid:
            return Reply(calls=[ar_call("msg_recv", {"session_id": sid})])
        state["n"] = state.get("n", 0) + 1
        return Reply(text="done-%d" % state["n"])
    return script


def _wake_once(box, sid):
    """Send to the idle session and see the woken turn read it: returns (latency,
    how long the send took, the delivery's state after it, after the turn, the
    inbox message's origin), or raises."""
    box.peer()                      # joined before the clock starts
    calls = box.mock.model_calls()
    before = len(calls)
    sent_at = time.time()
    sent = box.send(sid)
    returned = time.time() - sent_at
    at_send = box.states(sent["message_id"])
    woke = box.mock.wait_for(lambda calls: len(calls) > before and calls[before], 30)
    check(woke is not None, "no turn started within 30 s of the send (delivery %s, "
          "session %s)" % (at_send, box.session(sid)))
    latency = woke.at - sent_at
    asked = last_user_text(woke)
    check(SIGNAL_RE.search(asked), "the woken turn does not start with the signal: %r"
          % asked[-300:])
    shown = new_text(woke, calls[-1] if calls else None)
    check(SECRET_SUBJECT not in shown and SECRET_BODY not in shown,
          "subject/body rode the wake: %r" % shown[-300:])
    box.wait_quiet(before + 2, quiet=1.0, settle=6, timeout=20)
    after = box.states(sent["message_id"])
    wakes = box.wake_events(sent["message_id"])
    # accepted: the inbox's receipt came within the lever's 1 s; offered: it came
    # later (a busy machine, a TUI's first turn), as SPEC §10 allows.
    check(at_send in (["accepted"], ["offered"], ["read"]) and (
        "wake.accepted" in wakes or "wake.offered" in wakes),
        "right after the send the peer saw %s, wake events %s (want accepted, or offered "
        "when no receipt came within 1 s)" % (at_send, wakes))
    at_send = "accepted" if "wake.accepted" in wakes else "offered (no receipt within 1 s)"
    check(after == ["read"], "after the woken turn's msg_recv the peer saw %s" % after)
    origin = re.search(r'origin="([^"]+)"', asked)
    return latency, returned, at_send, after, origin.group(1) if origin else None


def run_wake(box, step):
    state = {}
    box.play(_wake_script(state))
    box.tui_start()
    found = {}

    def before_first():
        session = box.wait_session(10)
        check(session, "no agents-room session while the TUI sits before its first prompt")
        found["sid"] = sid = session["session_id"]
        check(session["autonomy"] == 2, "autonomy %s after setup --autonomy 2"
              % session["autonomy"])
        check(session.get("lever") == "qwen-socket", "lever %r, not qwen-socket"
              % session.get("lever"))
        latency, returned, at_send, after, origin = _wake_once(box, sid)
        box.notes["e1"] = latency
        return "woke in %.2f s (the send returned in %.2f s; lever qwen-socket, origin %s); "\
            "delivery %s, then %s" % (latency, returned, origin, at_send, after)
    step("e1-wake-before-first-turn", before_first)

    def after_turn():
        sid = found.get("sid") or (box.wait_session(5) or {}).get("session_id")
        check(sid, "no session")
        count = len(box.mock.model_calls())
        box.tui_send("first task")
        box.wait_quiet(count + 1, quiet=1.5)
        time.sleep(0.5)
        latency, returned, at_send, after, origin = _wake_once(box, sid)
        box.notes["e2"] = latency
        return "woke in %.2f s after a user turn (the send returned in %.2f s); delivery "\
            "%s, then %s" % (latency, returned, at_send, after)
    step("e2-wake-after-turn", after_turn)
    box.end()


def run_doctor(box, step):
    state = {}
    command = "%s %s doctor --json" % (shlex.quote(sys.executable), shlex.quote(AR))

    def script(req):
        sid = req.session_id()
        if state.get("phase") == "woken":
            return _wake_script(state)(req)
        if sid and not req.tool_results():
            state["sid"] = sid
            return Reply(calls=[Call("run_shell_command", {
                "command": command, "description": "agents-room doctor"})])
        return Reply(text="doctor done")
    box.play(script)
    if box.mode == "qwen-tui":
        box.tui_start(["--approval-mode", "yolo"])
    run = box.turn("run the doctor", 2, yolo=True, timeout=60)

    def doctor():
        sid = state.get("sid")
        check(sid, "no digest reached the model%s" % run_hint(run))
        calls = box.mock.model_calls()
        check(len(calls) >= 2 and results(calls[-1]), "no shell result reached the model")
        text = results(calls[-1])[0]
        lines = [one_line(l, 300) for l in text.splitlines() if sid in l or "lever" in l]
        check(any(sid in l for l in lines), "doctor does not name session %s: %s"
              % (sid, one_line(text, 300)))
        lever = "qwen-socket" if box.mode == "qwen-tui" else "qwen-resume"
        check(any(lever in l for l in lines), "doctor does not name the lever %s: %s"
              % (lever, lines or one_line(text, 300)))
        failed = re.findall(r'"status":\s*"fail",\s*"check":\s*"([^"]*)"', text)
        check(not failed, "doctor fails inside the session: %s" % failed)
        named = [l for l in lines if lever in l]
        return one_line(named[0], 140) if named else "ok"
    step("g-doctor", doctor)

    if box.mode != "qwen-p":
        box.end()
        return

    def wake_finished():
        sid = state.get("sid")
        check(sid, "no session")
        check(run and not run["hung"], "the first run did not end")
        session = box.session(sid) or {}
        check(session.get("lever") == "qwen-resume", "lever %r, not qwen-resume"
              % session.get("lever"))
        check(wait_unmarked(box, 8) == {}, "the first run left processes")
        state["phase"] = "woken"
        box.peer()
        before = len(box.mock.model_calls())
        sent_at = time.time()
        sent = box.send(sid)
        at_send = box.states(sent["message_id"])    # the lever runs detached: offered
        woke = box.mock.wait_for(lambda calls: len(calls) > before and calls[before], 40)
        check(woke is not None, "no resumed turn within 40 s of the send (delivery %s)"
              % box.states(sent["message_id"]))
        latency = woke.at - sent_at
        box.notes["e3"] = latency
        asked = last_user_text(woke)
        check(SIGNAL_RE.search(asked), "the resumed turn does not carry the signal: %r"
              % asked[-200:])
        check(woke.session_id() == sid, "the resumed turn's digest names %s, not %s"
              % (woke.session_id(), sid))
        check(not secrets_shown([woke]), "subject/body rode the wake")
        left = wait_unmarked(box, 30)
        check(not left, "the resumed run did not end: %s" % list(left.values())[:2])
        after = box.states(sent["message_id"])
        check(after == ["read"], "after the resumed turn's msg_recv the peer saw %s" % after)
        wakes = [w[5:] for w in box.wake_events(sent["message_id"])]
        return "resumed in %.1f s (qwen --resume KEY -p; wake %s); peer saw %s then %s" % (
            latency, "/".join(wakes), at_send, after)
    step("e3-wake-finished", wake_finished)


# name, autonomy, modes, function, the rows it reports (NAME@MODE: in that mode only)
RUNS = [
    ("room", 0, MODES, run_room, ("a-digest", "b-mcp", "f-room-call", "h-exit")),
    ("signal", 0, MODES, run_signal, ("c-midturn-signal",)),
    ("hold", 1, MODES, run_hold, ("d-hold-once",)),
    ("wake", 2, ("qwen-tui",), run_wake,
     ("e1-wake-before-first-turn", "e2-wake-after-turn")),
    ("doctor", 2, MODES, run_doctor, ("g-doctor", "e3-wake-finished@qwen-p")),
]


def rows_of(run, mode):
    return ["%s/%s" % (n.split("@")[0], mode) for n in run[4]
            if "@" not in n or n.split("@")[1] == mode]


# ---- the suite ------------------------------------------------------------------------

class Suite:
    """The runs, in lanes: one lane per mode (its own mock) when --jobs 2, so
    the one-shot runs go on while the TUI runs wait for their screens."""

    def __init__(self, args):
        self.bin = os.path.abspath(args.bin)
        self.keep = args.keep
        if args.workdir:
            os.makedirs(args.workdir, exist_ok=True)
        self.root = tempfile.mkdtemp(prefix="e2e-qwen-", dir=args.workdir and
                                     os.path.abspath(args.workdir))
        self.socket = "agents-room-e2e-qwen-%d" % os.getpid()
        self.mocks = []
        self.results = {}           # case -> (status, detail)
        self.notes = {}
        self.lock = threading.Lock()

    def tmux(self, *args, check=True):
        done = subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null"] + list(args),
                              capture_output=True, text=True, timeout=30)
        if check and done.returncode != 0:
            raise Failure("tmux %s: %s" % (args[0], done.stderr.strip()))
        return done.stdout

    def lanes(self, selected, jobs):
        """Run the selected (run, mode) pairs, a lane per mode when jobs > 1."""
        groups = {}
        for run, mode in selected:
            groups.setdefault(mode if jobs > 1 else "all", []).append((run, mode))
        threads = []
        for lane in groups.values():
            mock = QwenMock(log=log).start()
            self.mocks.append(mock)
            thread = threading.Thread(target=lambda lane=lane, mock=mock: [
                self.run(run, mode, mock) for run, mode in lane], daemon=True)
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join()

    def run(self, run, mode, mock):
        name, autonomy, _, function, _ = run
        wanted = rows_of(run, mode)
        started = time.time()
        rows = []
        box = None

        def step(row_name, fn):
            case = "%s/%s" % (row_name, mode)
            try:
                status, detail = "PASS", fn()
            except Failure as error:
                status, detail = "FAIL", str(error)
            except Skip as error:
                status, detail = "SKIP", str(error)
            except Exception as error:  # a broken step is a failure, never a crash
                status, detail = "FAIL", "error: %s: %s" % (type(error).__name__, error)
            rows.append((case, status, detail))
            log("%s %s: %s" % (status, case, one_line(detail)))

        try:
            box = Box(self, mock, "%s-%s" % (name, mode), mode, autonomy)
            function(box, step)
            error = "not reached"
        except Exception as exc:  # the run broke before its steps
            error = "error: %s: %s" % (type(exc).__name__, exc)
        finally:
            if box is not None:
                try:
                    mock.dump(os.path.join(box.dir, "requests.json"))
                except OSError:
                    pass
                box.cleanup()
        if box is not None and box.errors:
            rows = [(c, st, d + (" [%s]" % "; ".join(box.errors[:2]) if st == "FAIL" else ""))
                    for c, st, d in rows]
        done = {case for case, _, _ in rows}
        rows += [(case, "FAIL", error) for case in wanted if case not in done]
        with self.lock:
            for case, status, detail in rows:
                self.results[case] = (status, detail)
                print("%-4s %-36s %s" % (status, case, one_line(detail)), flush=True)
            print("     %-36s %.1f s" % ("(run %s/%s)" % (name, mode), time.time() - started),
                  flush=True)

    def close(self):
        for mock in self.mocks:
            mock.stop()
        self.tmux("kill-server", check=False)
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def status(self, name, mode):
        return (self.results.get("%s/%s" % (name, mode)) or (None,))[0]

    def ordered(self, selected):
        """(case, status, detail) in the order of RUNS."""
        return [(case,) + self.results[case] for run, mode in selected
                for case in rows_of(run, mode) if case in self.results]


def selected_runs(only):
    wanted = [w.strip() for w in (only or "").split(",") if w.strip()]
    for run in RUNS:
        for mode in run[2]:
            names = rows_of(run, mode) + ["%s/%s" % (run[0], mode)]
            if not wanted or any(w in n for w in wanted for n in names):
                yield run, mode


def version(bin_dir):
    try:
        out = subprocess.run([os.path.join(bin_dir, "qwen"), "--version"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "?"
    found = re.search(r"\d+\.\d+\.\d+\S*", out)
    return found.group(0) if found else "?"


def report_rows(suite, qwen_version):
    """One E2E-ROW per mode that ran (for .ci/e2e_report.py)."""
    def cell(*names):
        states = [suite.status(n, m) for n, m in names]
        if any(s is None for s in states):
            return None
        if all(s == "SKIP" for s in states):
            return "n/a"
        return all(s == "PASS" for s in states)

    ran = {case.split("/")[1] for case in suite.results}
    if "qwen-p" in ran:
        row("qwen-code", qwen_version, "qwen -p", digest=cell(("a-digest", "qwen-p")),
            signal=cell(("c-midturn-signal", "qwen-p")), hold=cell(("d-hold-once", "qwen-p")),
            wake=cell(("e3-wake-finished", "qwen-p")), latency=suite.notes.get("e3"),
            note="no inbox in -p: a finished session is resumed (qwen --resume -p)")
    if "qwen-tui" in ran:
        row("qwen-code", qwen_version, "qwen (TUI)", digest=cell(("a-digest", "qwen-tui")),
            signal=cell(("c-midturn-signal", "qwen-tui")),
            hold=cell(("d-hold-once", "qwen-tui")),
            wake=cell(("e1-wake-before-first-turn", "qwen-tui"),
                      ("e2-wake-after-turn", "qwen-tui")),
            latency=suite.notes.get("e2", suite.notes.get("e1")),
            note="woken through its cross-session inbox (its own child token); "
                 "the TUI shows a hold as 'Stop hook error'")


def main():
    global VERBOSE, AR
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default=os.path.join(ROOT, ".e2e-npm", "node_modules", ".bin"),
                        help="the directory with the qwen executable (an npm prefix's "
                        "node_modules/.bin; default %(default)s)")
    parser.add_argument("--only", help="run the runs with a row or name containing one of "
                        "these (comma-separated), e.g. c-midturn, wake or qwen-tui")
    parser.add_argument("--list", action="store_true", help="list the rows and exit")
    parser.add_argument("--keep", action="store_true", help="keep the work directory "
                        "(homes, stores, requests.json and screen.txt per run)")
    parser.add_argument("--workdir", help="where the work directory goes (default: the "
                        "system's temporary directory)")
    parser.add_argument("--agents-room", default=AR, help="the agents_room.py under test "
                        "(default: the one beside .ci/)")
    parser.add_argument("--jobs", type=int, default=2, choices=(1, 2), help="2 (default): "
                        "the qwen-p and the qwen-tui runs side by side; 1: one after another "
                        "(steadier wake latencies on a busy machine)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    VERBOSE = args.verbose
    AR = os.path.abspath(args.agents_room)
    selected = list(selected_runs(args.only))
    if args.list:
        for run, mode in selected:
            for case in rows_of(run, mode):
                print("%-36s (run %s/%s, autonomy %d)" % (case, run[0], mode, run[1]))
        return 0
    if not selected:
        print("no row matches %r" % args.only)
        return 2
    missing = [tool for tool in ("git", "tmux", "node") if shutil.which(tool) is None]
    if not os.path.exists(os.path.join(args.bin, "qwen")):
        missing.append("qwen (in %s; npm install --prefix DIR %s@VERSION)" % (args.bin,
                                                                               PACKAGE))
    if missing:
        print("e2e-qwen: missing %s" % ", ".join(missing))
        return 2
    suite = Suite(args)
    started = time.time()
    qwen_version = version(suite.bin)
    print("e2e-qwen: qwen-code %s (%s), node %s, %s" % (
        qwen_version, suite.bin, subprocess.run(["node", "--version"], capture_output=True,
                                                text=True, timeout=30).stdout.strip(), AR),
        flush=True)
    try:
        suite.lanes(selected, args.jobs)
    finally:
        suite.close()
    results = suite.ordered(selected)
    print("\n%-4s  %-36s  %s" % ("", "row", "why"))
    for case, status, detail in results:
        print("%-4s  %-36s  %s" % (status, case, one_line(detail, 200)))
    report_rows(suite, qwen_version)
    counts = {s: sum(1 for r in results if r[1] == s) for s in ("PASS", "FAIL", "SKIP")}
    print("\nqwen-code %s: %d passed, %d failed, %d skipped in %.0f s%s" % (
        qwen_version, counts["PASS"], counts["FAIL"], counts["SKIP"], time.time() - started,
        "; kept %s" % suite.root if args.keep else ""))
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
