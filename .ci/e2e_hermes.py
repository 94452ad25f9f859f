#!/usr/bin/env python3
"""End-to-end: agents-room under a real Hermes (hermes-agent), offline.

    python3 .ci/e2e_hermes.py [HERMES_BIN] [--keep] [-v]      (or HERMES_BIN=... in the environment)

Installs nothing.  HERMES_BIN is the `hermes` executable of an installed
`hermes-agent[mcp]` (0.19.0 when written).  Everything else is temporary: HOME,
HERMES_HOME, a git repository `api`, a non-default AGENTS_ROOM_DB, and a
stdlib OpenAI Chat Completions mock on 127.0.0.1 that Hermes talks to as a
`provider: custom` model.  The mock records every request and answers from a
per-scenario script (call a tool, then reply text), so the checks read exactly
what the model was shown.

Hermes facts the scenarios rest on (hermes-agent 0.19.0; see /work/notes/hermes.md):
  * only `pre_llm_call` hook output of the form {"context": "..."} reaches the
    model (appended to the user message); its stdin has extra.is_first_turn;
  * `on_session_end` fires after EVERY turn, `on_session_finalize` at exit;
  * `pre_verify` fires when a turn that edited files (write_file/patch) is about
    to finish; {"decision":"block","reason":R} adds R as a user message and
    continues (extra.attempt counts the continuations): the hold lever;
  * MCP servers get PATH/HOME/USER/LANG/LC_ALL/TERM/SHELL/TMPDIR/XDG_* plus the
    entry's `env:` (with ${VAR} interpolated from Hermes' environment), and run
    as hermes -> mcp_stdio_watchdog.py -> server;
  * `hermes chat --resume ID -q TEXT` runs one more turn of an idle session.

Scenarios (each row PASS/FAIL):
  a  digest with the agents-room session id reaches the first request
  b  an unread signal reaches the next turn, without subject or body
  c  an MCP tool call works on the hook's session and store (non-default DB)
  c2 the MCP server is linked to its harness session (room_join without
     arguments answers the hook's session)
  d  the session keeps its rooms across turns (after on_session_end), and is
     not alive after on_session_finalize
  e  hold: at autonomy 1, an unread message holds the end of an edit turn once
     (pre_verify), the signal as the follow-up
  f  resume: `--resume` restores the same agents-room session (alive while the
     resumed turn runs), and the signal reaches the resumed turn
  g  wake: at autonomy 2, a message to an idle (exited) Hermes session starts a
     turn in it (`hermes chat --resume`)
  h  `setup hermes --write` merges into a config.yaml that already has
     mcp_servers:/hooks: (Hermes parses the user's entries and ours; idempotent)
  i  hook acceptance: setup approves its hooks in the allowlist, doctor checks it
Exit 1 on any FAIL.
"""

import json
import os
import pty
import re
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from e2e_common import drop_ci_markers  # noqa: E402

drop_ci_markers()

HERE = os.path.dirname(os.path.abspath(__file__))
# AGENTS_ROOM_PY: another copy to test (e.g. a prototype); default: the one beside .ci/
AGENTS_ROOM = os.path.abspath(os.environ.get("AGENTS_ROOM_PY") or
                              os.path.join(os.path.dirname(HERE), "agents_room.py"))
SESSION_RE = re.compile(r"your session_id is ([0-9a-f]{16})")
ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[=>()][0-9A-Za-z]?")
VERBOSE = False


def log(*parts):
    if VERBOSE:
        sys.stderr.write("  . " + " ".join(str(p) for p in parts) + "\n")


# ---- the model: an OpenAI Chat Completions mock ---------------------------

class Req:
    """One recorded chat/completions request."""

    def __init__(self, body):
        self.body = body
        self.messages = body.get("messages") or []
        self.tools = [t.get("function", {}).get("name", "") for t in body.get("tools") or []]

    @staticmethod
    def text_of(message):
        content = message.get("content")
        if isinstance(content, list):
            return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
        return content or ""

    def user_texts(self):
        return [self.text_of(m) for m in self.messages if m.get("role") == "user"]

    def last_user(self):
        texts = self.user_texts()
        return texts[-1] if texts else ""

    def last_tool_result(self):
        for m in reversed(self.messages):
            if m.get("role") == "tool":
                return self.text_of(m)
        return ""

    def everything(self):
        return json.dumps(self.messages, ensure_ascii=False)

    def tool(self, short):
        """The offered tool name for an agents-room tool (Hermes offers MCP
        tools as mcp__<server>__<tool>); other names are used as they are."""
        for name in self.tools:
            if name.endswith("__" + short) and "agents" in name:
                return name
        return short


class Mock:
    """Requests without tools (title generation and other auxiliary calls) get
    "ok"; each request with tools takes the next step of the plan, a function
    req -> {"text": ...} | {"calls": [(name, args)]}; no step left -> "ok"."""

    def __init__(self):
        self.requests = []          # (kind, Req)
        self.steps = []
        self.errors = []
        self.cond = threading.Condition()
        mock = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _json(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path.rstrip("/").endswith("/models"):
                    return self._json(200, {"object": "list", "data": [
                        {"id": "mock-model", "object": "model", "owned_by": "e2e",
                         "context_length": 200000}]})
                self._json(200, {})

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {}
                if not self.path.endswith("/chat/completions"):
                    return self._json(200, {})
                reply = mock.answer(Req(body))
                mock.respond(self, body, reply)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, req):
        kind = "main" if req.tools else "aux"
        step = None
        with self.cond:
            if kind == "main" and self.steps:
                step = self.steps.pop(0)
        reply = {"text": "ok"}
        if step is not None:
            try:
                reply = step(req) or {"text": "ok"}
            except Exception as error:  # a broken step must not hang Hermes
                self.errors.append("%s: %s" % (getattr(step, "__name__", "step"), error))
                reply = {"text": "ok"}
        with self.cond:
            self.requests.append((kind, req))
            self.cond.notify_all()
        log("model", kind, "->", json.dumps(reply)[:120])
        return {"reply": reply, "req": req}

    @staticmethod
    def respond(handler, body, answer):
        reply, req = answer["reply"], answer["req"]
        calls = [{"id": "call_" + uuid.uuid4().hex[:10], "type": "function",
                  "function": {"name": req.tool(name), "arguments": json.dumps(args)}}
                 for name, args in reply.get("calls", [])]
        text = reply.get("text") or ""
        finish = "tool_calls" if calls else "stop"
        cid = "chatcmpl-" + uuid.uuid4().hex[:12]
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        if not body.get("stream"):
            message = {"role": "assistant", "content": text or None}
            if calls:
                message["tool_calls"] = calls
            return handler._json(200, {
                "id": cid, "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model"), "usage": usage,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}]})
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Cache-Control", "no-cache")
        handler.send_header("Connection", "close")
        handler.end_headers()

        def chunk(delta, finish_reason=None, choices=True):
            obj = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
                   "model": body.get("model"), "choices": [
                       {"index": 0, "delta": delta, "finish_reason": finish_reason}]}
            if not choices:
                obj["choices"], obj["usage"] = [], usage
            handler.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        chunk({"role": "assistant", "content": ""})
        if text:
            chunk({"content": text})
        for index, call in enumerate(calls):
            chunk({"tool_calls": [dict(call, index=index)]})
        chunk({}, finish)
        chunk({}, choices=False)
        handler.wfile.write(b"data: [DONE]\n\n")
        handler.wfile.flush()
        handler.close_connection = True

    def plan(self, steps):
        with self.cond:
            self.steps = list(steps)

    def main_count(self):
        with self.cond:
            return sum(1 for kind, _ in self.requests if kind == "main")

    def main_requests(self, since=0):
        with self.cond:
            return [r for kind, r in self.requests if kind == "main"][since:]

    def wait_main(self, count, timeout):
        end = time.time() + timeout
        with self.cond:
            while sum(1 for kind, _ in self.requests if kind == "main") < count:
                left = end - time.time()
                if left <= 0:
                    return False
                self.cond.wait(left)
        return True

    def close(self):
        self.server.shutdown()
        self.server.server_close()


# ---- a Hermes REPL under a pty ---------------------------------------------

class Repl:
    def __init__(self, hermes, env, cwd):
        self.buf = b""
        self.lock = threading.Lock()
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            try:
                os.chdir(cwd)
                os.execve(hermes, [hermes, "chat"], env)
            finally:
                os._exit(127)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        while True:
            try:
                ready, _, _ = select.select([self.fd], [], [], 0.5)
                if ready:
                    data = os.read(self.fd, 65536)
                    if not data:
                        return
                    with self.lock:
                        self.buf += data
            except OSError:
                return

    def text(self):
        with self.lock:
            raw = self.buf.decode("utf-8", "replace")
        return ANSI_RE.sub("", raw)

    def wait_text(self, needle, timeout, start=0):
        end = time.time() + timeout
        while time.time() < end:
            if needle in self.text()[start:]:
                return True
            if not self.alive():
                return needle in self.text()[start:]
            time.sleep(0.1)
        return False

    def send(self, line):
        os.write(self.fd, line.encode() + b"\r")

    def alive(self):
        try:
            pid, _ = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.pid = None
            return self.pid is not None
        except ChildProcessError:
            return False

    def wait_exit(self, timeout):
        end = time.time() + timeout
        while time.time() < end:
            if not self.alive():
                return True
            time.sleep(0.1)
        return False

    def kill(self):
        if self.pid and self.alive():
            try:
                os.kill(self.pid, signal.SIGTERM)
                self.wait_exit(5)
                if self.alive():
                    os.kill(self.pid, signal.SIGKILL)
                    os.waitpid(self.pid, 0)
            except OSError:
                pass
        try:
            os.close(self.fd)
        except OSError:
            pass


# ---- the run ---------------------------------------------------------------

class Run:
    def __init__(self, hermes):
        self.hermes = hermes
        self.work = tempfile.mkdtemp(prefix="e2e-hermes-")
        self.home = os.path.join(self.work, "home")
        self.repo = os.path.join(self.work, "api")
        self.db = os.path.join(self.work, "store", "room.db")
        self.results = []           # (id, ok, what, why)
        self.mock = Mock()
        self.tag = uuid.uuid4().hex[:6]
        os.makedirs(self.repo)
        subprocess.run(["git", "init", "-q", self.repo], check=True)
        self.sid = None             # the main Hermes session's agents-room id
        self.hsid = None            # its Hermes session id

    # environment and helpers
    def env(self, hermes_home=None, accept=False):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("HERMES_", "AGENTS_ROOM_", "CLAUDE", "CODEX_"))
               and k not in ("HOME", "PYTHONPATH", "VIRTUAL_ENV")}
        env.update(HOME=self.home, HERMES_HOME=hermes_home or self.hermes_home("main"),
                   AGENTS_ROOM_DB=self.db, TERM="xterm", COLUMNS="120", LINES="40",
                   LANG=os.environ.get("LANG", "C.UTF-8"))
        if accept:
            env["HERMES_ACCEPT_HOOKS"] = "1"
        return env

    def cli_env(self):
        """For agents-room commands run as the test (the peer): no Hermes marks."""
        env = self.env()
        for key in ("HERMES_HOME", "HERMES_ACCEPT_HOOKS"):
            env.pop(key, None)
        return env

    def hermes_home(self, name):
        return os.path.join(self.home, ".hermes" if name == "main" else ".hermes-" + name)

    def model_block(self):
        return ("model:\n  provider: custom\n  base_url: http://127.0.0.1:%d/v1\n"
                "  api_key: dummy\n  default: mock-model\n" % self.mock.port)

    def room(self, args, env=None, check=False, stdin=None):
        proc = subprocess.run([sys.executable, AGENTS_ROOM] + args, cwd=self.repo,
                              env=env or self.cli_env(), capture_output=True, text=True,
                              timeout=60, input=stdin)
        log("agents-room", " ".join(args[:3]), "->", proc.returncode,
            (proc.stdout + proc.stderr).strip()[:200])
        if check and proc.returncode != 0:
            raise RuntimeError("agents_room %s: %s" % (args[0], proc.stderr.strip()))
        return proc

    def room_json(self, args, env=None):
        proc = self.room(args + ["--json"], env=env)
        try:
            return json.loads(proc.stdout)
        except ValueError:
            return {"error": (proc.stderr or proc.stdout).strip()}

    def setup(self, name, autonomy=None, existing=""):
        home = self.hermes_home(name)
        os.makedirs(home, exist_ok=True)
        with open(os.path.join(home, "config.yaml"), "w") as handle:
            handle.write(self.model_block() + existing)
        args = ["setup", "hermes", "--write"]
        if autonomy is not None:
            args[2:2] = ["--autonomy", str(autonomy)]
        proc = self.room(args, env=self.env(home, accept=False))
        return home, proc

    def record(self, key, ok, what, why=""):
        self.results.append((key, bool(ok), what, "" if ok else why))
        log("RESULT", key, "PASS" if ok else "FAIL", why)

    def session_of(self, req=None, exclude=()):
        """The agents-room id of a Hermes session: from the digest the model was
        shown, else from the store (today's digest never arrives)."""
        if req is not None:
            for text in reversed(req.user_texts()):
                found = SESSION_RE.findall(text)
                if found:
                    return found[-1]
        who = self.room_json(["who"])
        for s in who.get("sessions", []):
            if s.get("harness") == "hermes" and s.get("session_id") not in exclude:
                return s["session_id"]
        try:        # a session that already left is not "present"
            conn = sqlite3.connect("file:%s?mode=ro" % self.db, uri=True)
            rows = conn.execute("SELECT id FROM sessions WHERE harness='hermes' "
                                "ORDER BY created_at").fetchall()
            conn.close()
            for (sid,) in rows:
                if sid not in exclude:
                    return sid
        except sqlite3.Error:
            pass
        return None

    def member(self, sid, room="repo:api"):
        who = self.room_json(["who", "--room", room])
        for s in who.get("sessions", []):
            if s.get("session_id") == sid:
                return s
        return None

    @staticmethod
    def signal_in(text):
        low = text.lower()
        return "agents-room" in low and "unread" in low

    def secret_free(self, text, secrets):
        return not any(s in text for s in secrets)

    # scenarios a-e on one interactive session, f by resume
    def main_session(self):
        home, proc = self.setup("main", autonomy=1)
        self.setup_output = proc.stdout + proc.stderr
        peer = self.room_json(["join", "--label", "peer", "--harness", "generic",
                               "--harness-key", "e2e-peer-" + self.tag])
        self.peer = peer.get("session_id")
        if not self.peer:
            raise RuntimeError("peer join failed: %s" % peer)
        subj1, body1 = "subject-one-" + self.tag, "body-one-" + self.tag
        subj2, body2 = "subject-two-" + self.tag, "body-two-" + self.tag
        subj3, body3 = "subject-three-" + self.tag, "body-three-" + self.tag
        secrets = [subj1, body1, subj2, body2, subj3, body3]
        seen = {}

        def t1_first(req):
            seen["t1"] = req
            self.sid = self.session_of(req, exclude=(self.peer,))
            return {"calls": [("room_who", {"session_id": self.sid or "0" * 16})]}

        def t1_final(req):
            seen["t1_who"] = req.last_tool_result()
            return {"text": "REPLY-ONE-" + self.tag}

        def t2_first(req):
            seen["t2"] = req
            return {"calls": [("msg_recv", {"session_id": self.sid or "0" * 16})]}

        def t2_join(req):
            seen["t2_recv"] = req.last_tool_result()
            return {"calls": [("room_join", {})]}

        def t2_edit(req):
            seen["t2_join"] = req.last_tool_result()
            return {"calls": [("write_file", {"path": os.path.join(self.repo, "notes.txt"),
                                              "content": "e2e\n"})]}

        def t2_final(req):
            # a message arrives while the turn runs: at hold it must hold the end
            seen["send2"] = self.room_json(["send", "--session", self.peer, "--to", self.sid
                                            or "0" * 16, "--subject", subj2, "--body", body2])
            return {"text": "REPLY-TWO-" + self.tag}

        def t2_held(req):
            seen["t2_held"] = req
            return {"text": "REPLY-HELD-" + self.tag}

        def t2_held_again(req):
            seen["t2_held_again"] = req
            return {"text": "REPLY-AGAIN-" + self.tag}

        self.mock.plan([t1_first, t1_final])
        repl = Repl(self.hermes, self.env(home), self.repo)
        try:
            if not repl.wait_text("\u276f", 40):
                raise RuntimeError("Hermes REPL gave no prompt: %s" % repl.text()[-400:])
            repl.send("turn one " + self.tag)
            if not repl.wait_text("REPLY-ONE-" + self.tag, 60):
                raise RuntimeError("turn one did not finish: %s" % repl.text()[-400:])
            time.sleep(1.5)         # on_session_end runs around the displayed reply
            t1 = seen.get("t1")
            digest = t1.last_user() if t1 else ""
            found = SESSION_RE.findall(digest)
            self.record("a", found and self.sid and found[-1] == self.sid and
                        self.member(self.sid) is not None,
                        "digest with the agents-room session id reaches the first request",
                        "first request's user message: %r" % digest[-160:])
            after_end = self.member(self.sid) if self.sid else None
            d1 = after_end is not None and not after_end.get("left")
            d1_why = "after turn 1 (on_session_end): %s" % (
                "not in repo:api" if after_end is None else "left=%s" % after_end.get("left"))
            seen["send1"] = self.room_json(["send", "--session", self.peer, "--to",
                                            self.sid or "0" * 16, "--subject", subj1,
                                            "--body", body1])
            before = self.mock.main_count()
            self.mock.plan([t2_first, t2_join, t2_edit, t2_final, t2_held, t2_held_again])
            start = len(repl.text())
            repl.send("turn two " + self.tag)
            if not self.mock.wait_main(before + 4, 60):
                raise RuntimeError("turn two did not reach its final answer: %s"
                                   % repl.text()[-400:])
            if self.mock.wait_main(before + 5, 6):      # held by pre_verify
                self.mock.wait_main(before + 6, 4)
                repl.wait_text("REPLY-HELD-" + self.tag, 20, start)
            else:
                repl.wait_text("REPLY-TWO-" + self.tag, 20, start)
            time.sleep(1.5)
            t2 = seen.get("t2")
            first = t2.last_user() if t2 else ""
            self.record("b", t2 is not None and self.signal_in(first) and
                        self.secret_free(t2.everything(), secrets),
                        "unread signal reaches the next turn, no subject/body",
                        "send: %s; turn 2 user message: %r" % (
                            json.dumps(seen.get("send1"))[:160], first[-200:]))
            recv = seen.get("t2_recv", "")
            default_store = os.path.join(self.home, ".agents-room", "room.db")
            self.record("c", body1 in recv and '"isError": true' not in recv
                        and not os.path.exists(default_store),
                        "MCP tool call on the hook's session and store (AGENTS_ROOM_DB)",
                        "msg_recv result: %r%s" % (
                            re.sub(r"\s+", " ", recv)[-220:],
                            "; the server created the default store %s" % default_store
                            if os.path.exists(default_store) else ""))
            joined = seen.get("t2_join", "")
            self.record("c2", bool(self.sid) and self.sid in joined and
                        "isError\": true" not in joined,
                        "MCP server linked to its harness session (room_join without args)",
                        "room_join result: %r (hook session %s)" % (
                            re.sub(r"\s+", " ", joined)[-200:], self.sid))
            after_t2 = self.member(self.sid) if self.sid else None
            d2 = after_t2 is not None and not after_t2.get("left")
            held = seen.get("t2_held")
            held_text = held.last_user() if held else ""
            again = seen.get("t2_held_again")
            self.record("e", held is not None and self.signal_in(held_text) and
                        self.secret_free(held_text, secrets) and
                        (again is None or not self.signal_in(again.last_user())),
                        "hold: unread message holds the end of an edit turn once (pre_verify)",
                        "no continuation after the final answer (no pre_verify hook held it)"
                        if held is None else "follow-up: %r%s" % (
                            held_text[-160:], "; held twice" if again is not None and
                            self.signal_in(again.last_user()) else ""))
            repl.send("/exit")
            exited = repl.wait_exit(30)
            time.sleep(0.5)
            m = re.findall(r"hermes --resume (\S+)", repl.text())
            self.hsid = m[-1] if m else None
            final = self.member(self.sid) if self.sid else None
            d3 = exited and (final is None or final.get("liveness") != "alive")
            self.record("d", d1 and d2 and d3,
                        "session keeps its rooms across turns; ends at on_session_finalize",
                        "; ".join(x for x in (
                            "" if d1 else d1_why,
                            "" if d2 else "after turn 2: %s" % (
                                "not in repo:api" if after_t2 is None
                                else "left=%s" % after_t2.get("left")),
                            "" if d3 else "after exit: %s" % (final or "no exit")) if x))
        finally:
            repl.kill()
        self.resume(secrets, subj3, body3)

    def resume(self, secrets, subj3, body3):
        seen = {}

        def t3_first(req):
            seen["t3"] = req
            me = self.member(self.sid) if self.sid else None
            seen["t3_live"] = me.get("liveness") if me else None
            return {"text": "REPLY-THREE-" + self.tag}
        sent = self.room_json(["send", "--session", self.peer, "--to", self.sid or "0" * 16,
                               "--subject", subj3, "--body", body3])
        if not self.hsid:
            self.record("f", False, "resume restores the session; signal reaches it",
                        "no Hermes session id to resume")
            return
        self.mock.plan([t3_first])
        proc = subprocess.run([self.hermes, "chat", "--resume", self.hsid, "-q",
                               "turn three " + self.tag, "-Q"], cwd=self.repo,
                              env=self.env(), capture_output=True, text=True, timeout=90)
        t3 = seen.get("t3")
        text = t3.last_user() if t3 else ""
        after = self.member(self.sid) if self.sid else None
        sessions = self.room_json(["who"]).get("sessions", [])
        hermes_sessions = [s for s in sessions if s.get("harness") == "hermes"]
        # earlier turns' msg_recv results are replayed in the history: only the
        # new message's subject/body and the new user message must stay clean
        ok = (proc.returncode == 0 and t3 is not None and self.signal_in(text) and
              self.secret_free(text, secrets) and
              self.secret_free(t3.everything(), [subj3, body3]) and after is not None and
              not after.get("left") and len(hermes_sessions) == 1 and
              seen.get("t3_live") == "alive")
        self.record("f", ok, "resume restores the session; signal reaches the resumed turn",
                    "hermes rc %s; send: %s; resumed user message: %r; in repo:api: %s; "
                    "hermes sessions present: %d; liveness during the resumed turn: %s" % (
                        proc.returncode, json.dumps(sent)[:120], text[-160:],
                        "no" if after is None else "left=%s" % after.get("left"),
                        len(hermes_sessions), seen.get("t3_live")))

    def wake(self):
        home, _ = self.setup("wake", autonomy=2)
        seen = {}

        def w_first(req):
            seen["w1"] = req
            return {"text": "REPLY-WAKE-ONE-" + self.tag}
        self.mock.plan([w_first])
        proc = subprocess.run([self.hermes, "chat", "-q", "wake session " + self.tag, "-Q"],
                              cwd=self.repo, env=self.env(home), capture_output=True,
                              text=True, timeout=90)
        wid = self.session_of(seen.get("w1"), exclude=(self.sid, self.peer))
        before = self.mock.main_count()
        woke = {}

        def w_woken(req):
            woke["req"] = req
            return {"text": "REPLY-WOKEN-" + self.tag}
        self.mock.plan([w_woken])
        sent = self.room_json(["send", "--session", self.peer, "--to", wid or "0" * 16,
                               "--subject", "wake-subject-" + self.tag,
                               "--body", "wake-body-" + self.tag])
        self.mock.wait_main(before + 1, 20)
        req = woke.get("req")
        ok = (proc.returncode == 0 and req is not None and
              any(("wake session " + self.tag) in t for t in req.user_texts()[:-1]) and
              self.signal_in(req.last_user()) and
              "wake-body-" + self.tag not in req.everything())
        state = ""
        if wid:
            conn = None
            try:
                conn = sqlite3.connect("file:%s?mode=ro" % self.db, uri=True)
                state = ", ".join("%s" % r for r in conn.execute(
                    "SELECT state FROM deliveries WHERE session_id=?", (wid,)))
            except sqlite3.Error:
                pass
            finally:
                if conn:
                    conn.close()
        self.record("g", ok, "wake: a message starts a turn in an idle Hermes session",
                    "hermes rc %s; send: %s; delivery state: %s; %s" % (
                        proc.returncode, json.dumps(sent)[:120], state or "?",
                        "no turn started within 20 s" if req is None else
                        "woken turn's user message: %r" % req.last_user()[-120:]))

    def hermes_config(self, home):
        """config.yaml as Hermes itself parses it (its own interpreter)."""
        with open(self.hermes) as handle:
            first = handle.readline()
        python = first[2:].strip().split()[0] if first.startswith("#!") else None
        if not python or "python" not in os.path.basename(python):
            return None
        code = ("import json; from hermes_cli.config import load_config; "
                "print(json.dumps(load_config(), default=str))")
        proc = subprocess.run([python, "-c", code], env=self.env(home), capture_output=True,
                              text=True, timeout=60, cwd=self.work)
        try:
            return json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return None

    def merge(self):
        existing = ("mcp_servers:\n  user-server:\n    command: \"true\"\n    args: [\"x\"]\n"
                    "hooks:\n  post_tool_call:\n    - command: \"true e2e-user-hook\"\n"
                    "      timeout: 5\ndisplay:\n  compact: true\n")
        home, proc = self.setup("merge", existing=existing)
        self.room(["setup", "hermes", "--write"], env=self.env(home, accept=False))
        cfg = self.hermes_config(home)
        if cfg is None:
            return self.record("h", False, "setup merges into existing mcp_servers:/hooks:",
                               "could not load config.yaml with Hermes' own loader")
        servers = cfg.get("mcp_servers") or {}
        ours = [n for n, e in servers.items() if "agents_room" in json.dumps(e)]
        hooks = cfg.get("hooks") or {}
        user_hook = any("e2e-user-hook" in json.dumps(v) for v in hooks.values())
        our_hooks = {e: sum("agents_room" in json.dumps(h) for h in v or [])
                     for e, v in hooks.items() if isinstance(v, list)}
        dupes = [e for e, n in our_hooks.items() if n > 1]
        ok = ("user-server" in servers and len(ours) == 1 and user_hook and
              sum(our_hooks.values()) > 0 and not dupes and
              (cfg.get("model") or {}).get("provider") == "custom" and
              (cfg.get("display") or {}).get("compact") is True)
        self.record("h", ok, "setup merges into existing mcp_servers:/hooks: (idempotent)",
                    "Hermes parsed: mcp_servers %s, agents-room hooks per event %s, user hook "
                    "kept %s; setup said: %s" % (sorted(servers), our_hooks, user_hook,
                                                  re.sub(r"\s+", " ", proc.stdout)[:160]))

    def acceptance(self):
        """setup approves its own hooks in Hermes' allowlist (no hooks_auto_accept,
        nothing to pass at start-up); doctor notices when that approval is gone."""
        home = self.hermes_home("main")
        allowlist = os.path.join(home, "shell-hooks-allowlist.json")
        with open(os.path.join(home, "config.yaml")) as handle:
            text = handle.read()
        try:
            with open(allowlist) as handle:
                approvals = json.load(handle).get("approvals") or []
            mode = os.stat(allowlist).st_mode & 0o777
        except (OSError, ValueError):
            approvals, mode = [], None
        ours = [a for a in approvals if "agents_room" in json.dumps(a)]
        blanket = re.search(r"^hooks_auto_accept:\s*true\s*$", text, re.M)
        home2 = self.hermes_home("noaccept")
        os.makedirs(home2, exist_ok=True)
        with open(os.path.join(home2, "config.yaml"), "w") as handle:
            handle.write(text)
        doctor = self.room(["doctor"], env=self.env(home2))
        out = doctor.stdout + doctor.stderr
        checked = any(k in out for k in ("allowlist", "--accept-hooks"))
        self.record("i", ours and mode == 0o600 and not blanket and checked,
                    "hook acceptance: setup approves its hooks in Hermes' allowlist, "
                    "doctor checks it",
                    "allowlist entries for agents-room %d (mode %s), hooks_auto_accept "
                    "written %s; doctor without the allowlist: %s" % (
                        len(ours), oct(mode) if mode is not None else "absent",
                        bool(blanket), "warns" if checked else "no warning: %r" % [
                            l for l in out.splitlines() if "ermes" in l]))

def main(argv):
    global VERBOSE
    args = [a for a in argv if not a.startswith("-")]
    VERBOSE = "-v" in argv
    keep = "--keep" in argv
    hermes = args[0] if args else os.environ.get("HERMES_BIN")
    if not hermes or not os.access(hermes, os.X_OK):
        sys.stderr.write("usage: e2e_hermes.py HERMES_BIN [--keep] [-v] "
                         "(or set HERMES_BIN); got %r\n" % hermes)
        return 2
    hermes = os.path.abspath(hermes)
    started = time.time()
    run = Run(hermes)
    names = {"a": 1, "b": 2, "c": 3, "c2": 4, "d": 5, "e": 6, "f": 7, "g": 8, "h": 9, "i": 10}
    try:
        for part in (run.main_session, run.wake, run.merge, run.acceptance):
            try:
                part()
            except Exception as error:
                run.record("!" + part.__name__, False, "scenario %s crashed" % part.__name__,
                           "%s: %s" % (type(error).__name__, error))
    finally:
        run.mock.close()
        if keep:
            sys.stderr.write("kept %s\n" % run.work)
        else:
            shutil.rmtree(run.work, ignore_errors=True)
    done = {k for k, _, _, _ in run.results}
    for key in names:
        if key not in done:
            run.record(key, False, "(not reached)", "an earlier step failed")
    rows = sorted(run.results, key=lambda r: names.get(r[0], 0))
    print("%-4s %-5s %s" % ("id", "", "scenario"))
    for key, ok, what, why in rows:
        print("%-4s %-5s %s" % (key, "PASS" if ok else "FAIL", what))
        if not ok and why:
            print("           " + why[:600])
    for error in run.mock.errors:
        print("mock step error: %s" % error)
    failed = sum(1 for r in rows if not r[1])
    print("%d passed, %d failed (%.0f s, hermes %s)" % (len(rows) - failed, failed,
                                                       time.time() - started, hermes))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
