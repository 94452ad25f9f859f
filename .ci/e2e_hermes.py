#!/usr/bin/env python3
"""End-to-end: agents-room under a real Hermes (PyPI hermes-agent[mcp]: the
`hermes chat` REPL and `hermes chat -q`), offline, against .ci/mock_model.py
(OpenAI Chat Completions).  The framework, its options and the common parts:
.ci/e2e_box.py.

    make e2e-hermes       # installs the pinned hermes-agent[mcp] into a venv, runs this
    python3 .ci/e2e_hermes.py --bin VENV/bin [--only NAME[,NAME...]] [--list] [--keep] [-v]

Besides setup's files the box writes only what is about the mock:
$HERMES_HOME/config.yaml's model block (provider custom at the mock's URL).
Hermes facts the runs rest on (hermes-agent 0.19.0; see /work/notes/hermes.md):
  * only `pre_llm_call` hook output of the form {"context": "..."} reaches the
    model (appended to the user message), once per user turn: a digest and a
    signal reach the next turn, not the next request inside a turn (so none
    of the common runs: the rows are Hermes' own);
  * `on_session_end` fires after EVERY turn, `on_session_finalize` at exit;
  * `pre_verify` fires when a turn that edited files (write_file/patch) is about
    to finish; {"decision":"block","reason":R} adds R as a user message and
    continues (extra.attempt counts the continuations): the hold lever;
  * `hermes chat --resume ID -q TEXT` runs one more turn of an idle session.

Rows (mode chat: the REPL in tmux, setup --autonomy 1; mode chat-q: one-shot):
  a  digest with the agents-room session id reaches the first request
  b  an unread signal reaches the next turn, without subject or body
  c  an MCP tool call works on the hook's session and store (non-default DB)
  c2 the MCP server is linked to its harness session (room_join without
     arguments answers the hook's session)
  d  the session keeps its rooms across turns (after on_session_end), and is
     not alive after on_session_finalize (/exit)
  e  hold: at autonomy 1, an unread message holds the end of an edit turn once
     (pre_verify), the signal as the follow-up
  f  resume: `--resume` restores the same agents-room session (alive while the
     resumed turn runs), and the signal reaches the resumed turn
  g  wake: at autonomy 2, a message to an idle (exited) Hermes session starts a
     turn in it (lever hermes-resume: `hermes chat --resume`)
  h  `setup hermes --write` merges into a config.yaml that already has
     mcp_servers:/hooks: (Hermes parses the user's entries and ours; idempotent)
  i  hook acceptance: setup approves its hooks in the allowlist, doctor checks it
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_box  # noqa: E402
from e2e_box import Call, Case, Reply, check, one_line  # noqa: E402

SESSION_RE = re.compile(r"your session_id is ([0-9a-f]{16})")


def signal_in(text):
    low = text.lower()
    return "agents-room" in low and "unread" in low


def tool(req, short):
    """The offered name of an agents-room tool (Hermes: mcp__<server>__<tool>);
    other names as they are."""
    return next((n for n in req.tool_names() if n and n.endswith("__" + short)
                 and "agents" in n), short)


def last_user(req):
    texts = req.user_texts()
    return texts[-1] if texts else ""


def last_result(req):
    results = req.tool_results()
    return results[-1][1] if results else ""


class Plan:
    """Each request with tools takes the next step of the plan, a function
    req -> Reply (or None: "ok"); no step left: "ok"."""

    def __init__(self, box):
        self.box, self.steps = box, []
        box.play(self)

    def set(self, *steps):
        with self.box.mock.lock:
            self.steps = list(steps)

    def __call__(self, req):
        with self.box.mock.lock:
            step = self.steps.pop(0) if self.steps else None
        return (step(req) if step else None) or Reply(text="ok")


def answer(seen, key, text):
    """A step that keeps its request as seen[key] and answers text."""
    def step(req):
        seen[key] = req
        return Reply(text=text)
    return step


def member(box, sid):
    """sid's row in `who --room repo:proj` (None: not a member)."""
    found = box.ar("who", "--room", "repo:proj", "--json", check_rc=False)
    sessions = found.get("sessions", []) if isinstance(found, dict) else []
    return next((s for s in sessions if s.get("session_id") == sid), None)


def send(box, to, subject, body):
    return box.ar("send", "--session", box.peer(), "--to", to or "0" * 16, "--subject",
                  subject, "--body", body, "--json", check_rc=False)


def main_count(box):
    return len(box.mock.model_calls())


def wait_main(box, count, timeout):
    return box.mock.wait_for(lambda calls: len(calls) >= count, timeout) is not None


def run_session(box, step):
    """a-f: one REPL session (two turns, /exit), then resumed by --resume -q."""
    tag = uuid.uuid4().hex[:6]
    secrets = ["%s-%s-%s" % (kind, n, tag) for n in ("one", "two", "three")
               for kind in ("subject", "body")]
    seen, plan = {}, Plan(box)
    peer = box.peer()

    def t1_first(req):
        seen["t1"] = req
        found = SESSION_RE.findall(last_user(req))
        seen["sid"] = found[-1] if found else None
        return Reply(calls=[Call(tool(req, "room_who"), {"session_id": seen["sid"]
                                                          or "0" * 16})])

    def t1_final(req):
        return Reply(text="REPLY-ONE-" + tag)
    plan.set(t1_first, t1_final)
    box.tui_start()
    box.tui_send("turn one " + tag)
    check(wait_main(box, 2, 60 + box.harness.cold), "turn one did not finish: %s"
          % box.screen()[-400:])
    box.wait_quiet(2, quiet=1.5)
    sid = seen.get("sid")

    def digest():
        t1 = seen.get("t1")
        check(t1 is not None, "no request in turn one")
        check(sid, "the first request's user message has no digest: %r"
              % last_user(t1)[-160:])
        check(member(box, sid) is not None, "session %s is not in repo:proj" % sid)
        return "session %s in the first request's user message" % sid
    step("a", digest)
    after_end = member(box, sid) if sid else None

    def t2_first(req):
        seen["t2"] = req
        return Reply(calls=[Call(tool(req, "msg_recv"), {"session_id": sid or "0" * 16})])

    def t2_join(req):
        seen["t2_recv"] = last_result(req)
        return Reply(calls=[Call(tool(req, "room_join"), {})])

    def t2_edit(req):
        seen["t2_join"] = last_result(req)
        return Reply(calls=[Call("write_file", {"path": os.path.join(box.repo, "notes.txt"),
                                                "content": "e2e\n"})])

    def t2_final(req):
        # a message arrives while the turn runs: at hold it holds the end
        seen["send2"] = send(box, sid, secrets[2], secrets[3])
        return Reply(text="REPLY-TWO-" + tag)

    seen["send1"] = send(box, sid, secrets[0], secrets[1])
    before = main_count(box)
    plan.set(t2_first, t2_join, t2_edit, t2_final,
             answer(seen, "t2_held", "REPLY-HELD-" + tag),
             answer(seen, "t2_held_again", "REPLY-AGAIN-" + tag))
    box.tui_send("turn two " + tag)
    check(wait_main(box, before + 4, 60 + box.harness.cold),
          "turn two did not reach its final answer: %s" % box.screen()[-400:])
    if wait_main(box, before + 5, 6):         # held by pre_verify
        wait_main(box, before + 6, 4)
    box.wait_quiet(before + 5, quiet=1.5, settle=4, timeout=20)

    def next_turn_signal():
        t2 = seen.get("t2")
        check(t2 is not None, "no request in turn two")
        first = last_user(t2)
        check(signal_in(first), "turn two's user message has no signal (send: %s): %r"
              % (one_line(json.dumps(seen.get("send1")), 160), first[-200:]))
        check(not any(s in json.dumps(t2.messages()) for s in secrets),
              "subject/body reached the model")
        return "turn two's user message: %s" % e2e_box.signal_line(first)[:80]
    step("b", next_turn_signal)

    def mcp_store():
        recv = seen.get("t2_recv", "")
        default_store = os.path.join(box.home, ".agents-room", "room.db")
        check(secrets[1] in recv and '"isError": true' not in recv,
              "msg_recv result: %r" % one_line(recv, 220))
        check(not os.path.exists(default_store), "the server created the default store %s"
              % default_store)
        return "msg_recv over MCP read the message from AGENTS_ROOM_DB"
    step("c", mcp_store)

    def linked():
        joined = seen.get("t2_join", "")
        check(sid and sid in joined and '"isError": true' not in joined,
              "room_join result: %r (hook session %s)" % (one_line(joined, 200), sid))
        return "room_join {} answered the hook's session %s" % sid
    step("c2", linked)
    after_t2 = member(box, sid) if sid else None

    def hold():
        held, again = seen.get("t2_held"), seen.get("t2_held_again")
        check(held is not None, "no continuation after the final answer (no pre_verify "
              "hook held it)")
        text = last_user(held)
        check(signal_in(text) and not any(s in text for s in secrets),
              "follow-up: %r" % text[-160:])
        check(again is None or not signal_in(last_user(again)), "held twice")
        return "held once: %s" % e2e_box.signal_line(text)[:80]
    step("e", hold)
    screen = box.tui_quit(30)
    found = re.findall(r"hermes --resume (\S+)", screen)
    hsid = found[-1] if found else box.harness_key(sid) if sid else None
    time.sleep(0.5)
    final = member(box, sid) if sid else None

    def rooms_kept():
        check(after_end is not None and not after_end.get("left"),
              "after turn 1 (on_session_end): %s" % (
                  "not in repo:proj" if after_end is None else "left=%s"
                  % after_end.get("left")))
        check(after_t2 is not None and not after_t2.get("left"), "after turn 2: %s" % (
            "not in repo:proj" if after_t2 is None else "left=%s" % after_t2.get("left")))
        check(final is None or final.get("liveness") != "alive", "after /exit: %s" % final)
        return "in repo:proj after both turns; %s after /exit" % (
            final.get("liveness") if final else "gone")
    step("d", rooms_kept)

    def resumed():
        check(hsid, "no Hermes session id to resume")
        check(box.wait_unmarked(15) == {}, "the REPL left processes")
        sent = send(box, sid, secrets[4], secrets[5])

        def t3_first(req):
            seen["t3"] = req
            me = member(box, sid) if sid else None
            seen["t3_live"] = me.get("liveness") if me else None
            return Reply(text="REPLY-THREE-" + tag)
        plan.set(t3_first)
        run = box.oneshot("turn three " + tag, resume=hsid)
        t3 = seen.get("t3")
        text = last_user(t3) if t3 else ""
        after = member(box, sid) if sid else None
        hermes = [s for s in box.sessions() if s.get("harness") == "hermes"]
        check(run["rc"] == 0 and t3 is not None, "no resumed turn (send %s)%s"
              % (one_line(json.dumps(sent), 120), e2e_box.run_hint(run)))
        check(signal_in(text), "the resumed user message has no signal: %r" % text[-160:])
        # earlier turns' msg_recv results are replayed in the history: only the
        # new message's subject/body and the new user message must stay clean
        check(not any(s in text for s in secrets) and not any(
            s in json.dumps(t3.messages()) for s in secrets[4:]), "subject/body shown")
        check(after is not None and not after.get("left"), "in repo:proj: %s"
              % ("no" if after is None else "left=%s" % after.get("left")))
        check(len(hermes) == 1, "hermes sessions present: %d" % len(hermes))
        check(seen.get("t3_live") == "alive", "liveness during the resumed turn: %s"
              % seen.get("t3_live"))
        return "hermes chat --resume %s: the same session %s, alive, told: %s" % (
            hsid, sid, e2e_box.signal_line(text)[:60])
    step("f", resumed)


def run_wake(box, step):
    """g: a send to an exited `hermes chat -q` session resumes it (hermes-resume)."""
    tag = uuid.uuid4().hex[:6]
    seen, plan = {}, Plan(box)
    box.peer()
    plan.set(answer(seen, "w1", "REPLY-WAKE-ONE-" + tag))
    run = box.oneshot("wake session " + tag)

    def wake():
        check(run["rc"] == 0 and seen.get("w1"), "the first run failed%s"
              % e2e_box.run_hint(run))
        found = SESSION_RE.findall(last_user(seen["w1"]))
        sid = found[-1] if found else (box.wait_session(5) or {}).get("session_id")
        check(sid, "no session")
        check(box.wait_unmarked(15) == {}, "the first run left processes")
        before = main_count(box)
        plan.set(answer(seen, "woken", "REPLY-WOKEN-" + tag))
        sent_at = time.time()
        sent = send(box, sid, "wake-subject-" + tag, "wake-body-" + tag)
        bound = 60 + box.harness.cold
        check(wait_main(box, before + 1, bound), "no turn started within %d s (send %s, "
              "delivery %s)" % (bound, one_line(json.dumps(sent), 120), box.states()))
        woke = box.mock.model_calls()[before]
        latency = woke.at - sent_at
        box.suite.latency["g/" + box.mode] = latency
        req = seen.get("woken") or woke
        check(any(("wake session " + tag) in t for t in req.user_texts()[:-1]),
              "the woken turn is not the first session's: %r" % req.user_texts()[:2])
        check(signal_in(last_user(req)), "the woken turn's user message: %r"
              % last_user(req)[-120:])
        check("wake-body-" + tag not in json.dumps(req.messages()), "the body rode the wake")
        left = box.wait_unmarked(40 + box.harness.cold)
        check(not left, "the resumed run did not end: %s" % list(left.values())[:2])
        return "resumed in %.1f s by %s; the peer saw %s" % (
            latency, (box.session(sid) or {}).get("lever"), box.states())
    step("g", wake)


def hermes_config(box, home):
    """config.yaml as Hermes itself parses it (its own interpreter)."""
    program = box.suite.which("hermes")
    with open(program) as handle:
        first = handle.readline()
    python = first[2:].strip().split()[0] if first.startswith("#!") else None
    if not python or "python" not in os.path.basename(python):
        return None
    code = ("import json; from hermes_cli.config import load_config; "
            "print(json.dumps(load_config(), default=str))")
    done = subprocess.run([python, "-c", code], env=dict(box.env, HERMES_HOME=home),
                          capture_output=True, text=True, timeout=60, cwd=box.dir)
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def run_merge(box, step):
    """h: setup into a config.yaml that has the user's own entries, twice."""
    def merge():
        home = os.path.join(box.home, ".hermes-merge")
        os.makedirs(home)
        with open(os.path.join(home, "config.yaml"), "w") as handle:
            handle.write(box.harness.model_block(box) + (
                "mcp_servers:\n  user-server:\n    command: \"true\"\n    args: [\"x\"]\n"
                "hooks:\n  post_tool_call:\n    - command: \"true e2e-user-hook\"\n"
                "      timeout: 5\ndisplay:\n  compact: true\n"))
        env = dict(box.env, HERMES_HOME=home)
        said = ""
        for _ in range(2):
            done = subprocess.run([sys.executable, e2e_box.AR, "setup", "hermes", "--write"],
                                  cwd=box.repo, env=env, capture_output=True, text=True,
                                  timeout=60)
            check(done.returncode == 0, "setup failed: %s" % done.stderr[-300:])
            said = said or done.stdout
        cfg = hermes_config(box, home)
        check(cfg is not None, "could not load config.yaml with Hermes' own loader")
        servers = cfg.get("mcp_servers") or {}
        ours = [n for n, e in servers.items() if "agents_room" in json.dumps(e)]
        hooks = cfg.get("hooks") or {}
        user_hook = any("e2e-user-hook" in json.dumps(v) for v in hooks.values())
        our_hooks = {e: sum("agents_room" in json.dumps(h) for h in v or [])
                     for e, v in hooks.items() if isinstance(v, list)}
        dupes = [e for e, n in our_hooks.items() if n > 1]
        check("user-server" in servers and len(ours) == 1 and user_hook and
              sum(our_hooks.values()) > 0 and not dupes and
              (cfg.get("model") or {}).get("provider") == "custom" and
              (cfg.get("display") or {}).get("compact") is True,
              "Hermes parsed: mcp_servers %s, agents-room hooks per event %s, user hook "
              "kept %s; setup said: %s" % (sorted(servers), our_hooks, user_hook,
                                            one_line(said, 160)))
        return "Hermes parses the user's server and hook beside ours, once each: %s" % (
            our_hooks)
    step("h", merge)


def run_acceptance(box, step):
    """i: setup approved its hooks in the allowlist; doctor warns without it."""
    def acceptance():
        home = box.env["HERMES_HOME"]
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
        other = os.path.join(box.home, ".hermes-noaccept")
        os.makedirs(other)
        shutil.copy(os.path.join(home, "config.yaml"), other)
        done = subprocess.run([sys.executable, e2e_box.AR, "doctor"], cwd=box.repo,
                              env=dict(box.env, HERMES_HOME=other), capture_output=True,
                              text=True, timeout=120)
        out = done.stdout + done.stderr
        checked = any(k in out for k in ("allowlist", "--accept-hooks"))
        check(ours and mode == 0o600 and not blanket and checked,
              "allowlist entries for agents-room %d (mode %s), hooks_auto_accept written "
              "%s; doctor without the allowlist: %s" % (
                  len(ours), oct(mode) if mode is not None else "absent", bool(blanket),
                  "warns" if checked else "no warning: %r" % [
                      l for l in out.splitlines() if "ermes" in l]))
        return "%d approvals (0600), no hooks_auto_accept; doctor warns without them" % (
            len(ours))
    step("i", acceptance)


class Hermes(e2e_box.Harness):
    name = "hermes"
    title = "hermes"
    program = "hermes"
    installer = "pip"
    request_class = e2e_box.mock_model.Request
    modes = {"chat": "tui", "chat-q": "oneshot"}
    labels = {"chat": "hermes chat (REPL)", "chat-q": "hermes chat -q"}
    notes = {"chat": "digest and signal at the next user turn (pre_llm_call), never "
                     "inside a turn; a hold only in turns that edited files (pre_verify)",
             "chat-q": "an exited session is resumed (hermes chat --resume ID -q <signal>)"}
    levers = {"chat": "hermes-resume", "chat-q": "hermes-resume"}
    # The table's cells from Hermes' own rows: its signal reaches the next turn.
    cells = {"chat": {"digest": ("a",), "signal": ("b",), "hold": ("e",)},
             "chat-q": {"wake": ("g",)}}
    prefix = "mcp__agents_room__"
    ready = "\u276f"
    quit_keys = ("/exit",)
    requires = ("git", "tmux")

    def cases(self):
        return [Case("session", 1, run_session, ("a", "b", "c", "c2", "d", "e", "f"),
                     modes=("tui",)),
                Case("wake", 2, run_wake, ("g",), modes=("oneshot",)),
                Case("merge", 0, run_merge, ("h",), modes=("oneshot",)),
                Case("accept", 0, run_acceptance, ("i",), modes=("oneshot",))]

    def env(self, box):
        return {"HERMES_HOME": os.path.join(box.home, ".hermes")}

    def model_block(self, box):
        return ("model:\n  provider: custom\n  base_url: %s/v1\n  api_key: dummy\n"
                "  default: mock-model\n" % box.mock.url)

    def configure(self, box):
        os.makedirs(box.env["HERMES_HOME"], exist_ok=True)
        with open(os.path.join(box.env["HERMES_HOME"], "config.yaml"), "w") as handle:
            handle.write(self.model_block(box))

    def tui_argv(self, box, extra=()):
        return [self.program, "chat"] + list(extra)

    def oneshot_argv(self, box, prompt, resume=None, yolo=False):
        return ([self.program, "chat"] + (["--resume", resume] if resume else [])
                + ["-q", prompt, "-Q"])

    def version_argv(self, suite):
        return [suite.which(self.program), "--version"]


if __name__ == "__main__":
    sys.exit(e2e_box.main(Hermes()))
