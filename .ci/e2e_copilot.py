#!/usr/bin/env python3
"""End-to-end: real GitHub Copilot CLI turns (npm @github/copilot), offline, against
.ci/mock_model.py through its BYOK provider (COPILOT_PROVIDER_BASE_URL, COPILOT_MODEL,
COPILOT_OFFLINE=true).

    make e2e-copilot                  # installs the pinned @github/copilot, runs this, cleans up
    python3 .ci/e2e_copilot.py --bin DIR [--only NAME[,NAME...]] [--list] [--keep]
                               [--jobs N] [-v]

DIR is the npm prefix's node_modules/.bin (it holds `copilot`).  One mode, -p
(`copilot -p MESSAGE --allow-all-tools --trust-folder`: prompt mode, with the
flag Copilot documents for trusting the folder for one prompt-mode session, no
saved trust).  The interactive TUI is not driven here.

Every case gets its own HOME, a git repository `api` set up with
`agents_room.py setup copilot --write [--autonomy N]` (.github/hooks/agents-room.json:
the hooks in Claude's PascalCase form; .github/mcp.json: the MCP server), its own
AGENTS_ROOM_DB and its own mock model on 127.0.0.1 (the assertions are on what the
model was shown).  A peer session (the CLI: join, send, sent) plays the other agent.
Nothing else is written: COPILOT_OFFLINE keeps Copilot off the network (no login,
telemetry, update), HTTP(S)_PROXY points at a closed local port.

Scenarios (setup --autonomy in brackets):
  a-digest [0]          the SessionStart digest is in the first request; `who` shows that
                        session, harness copilot
  b-mcp-session [0]     the lean listing is offered (agents-room-room_join ...); room_join {}
                        acts on the digest's session; no second session
  c-midturn-signal [0]  a message sent while Copilot works shows up after the next tool
                        result as the one-line signal, never with subject or body
  d-hold-once [1]       the end of a turn with unread mail is held once (the hold's reason
                        is the next prompt), not again
  e-wake [2]            after the -p run has exited, a send resumes the session (lever
                        copilot-resume: copilot --resume=<id> -p <signal>); latency from
                        the send to the woken request; the delivery accepted (the
                        resumed run, without --trust-folder, has no project MCP server
                        in a folder never trusted in the TUI)
  h-exit [2]            SessionEnd at the run's exit: `who` shows the session ended; no
                        process of the case is left

Prints a PASS/FAIL table and one E2E-ROW line (.ci/e2e_report.py); exits 1 on any
FAIL.  Standard library only; needs git.
"""

import argparse
import json
import os
import re
import shutil
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
    Failure, SIGNAL_RE, Skip, check, file_sha, kill_group, one_line)

AR = os.path.join(ROOT, "agents_room.py")
PREFIX = "agents-room-"                 # how Copilot names our MCP tools
LEAN = ("room_join", "msg_send", "msg_recv", "room_who", "lease_claim", "lease_release",
        "note_read", "drift_check", "room_call")
SECRET_SUBJECT = "E2E-SECRET-SUBJECT"
SECRET_BODY = "E2E-SECRET-BODY"
CLOSED = "http://127.0.0.1:9"
VERBOSE = False


def log(text):
    if VERBOSE:
        sys.stderr.write("  . %s\n" % text)
        sys.stderr.flush()


class Box:
    """A temporary HOME, a git repository `api`, a store, a mock model, Copilot
    configured by agents_room.py setup, a peer."""

    def __init__(self, suite, case, autonomy=0):
        self.suite = suite
        self.name = re.sub(r"[^a-z0-9]+", "-", case.lower()).strip("-")
        self.dir = os.path.join(suite.root, self.name)
        self.home = os.path.join(self.dir, "home")
        self.repo = os.path.join(self.dir, "api")
        self.db = os.path.join(self.dir, "store", "room.db")
        self.peer_sid = None
        self.runs = 0
        self.latency = None
        self.mock = MockModel(log=lambda text: log("%s %s" % (self.name, text))).start()
        for path in (self.home, self.repo, os.path.dirname(self.db)):
            os.makedirs(path, exist_ok=True)
        os.chmod(os.path.dirname(self.db), 0o700)
        drop = ("COPILOT", "GH_", "GITHUB", "AGENTS_ROOM", "CLAUDE", "CODEX_", "OPENCODE",
                "KILO", "ANTHROPIC", "OPENAI", "TMUX", "XDG_", "npm_config_", "NPM_CONFIG_")
        env = {k: v for k, v in os.environ.items() if not k.startswith(drop) and
               k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")}
        env.update({
            "HOME": self.home, "PATH": suite.bin + os.pathsep + env.get("PATH", "/usr/bin:/bin"),
            "AGENTS_ROOM_DB": self.db, "AGENTS_ROOM_E2E_BOX": self.dir,
            # mock-side: the model is the mock, nothing leaves the machine
            "COPILOT_PROVIDER_BASE_URL": self.mock.url + "/v1", "COPILOT_MODEL": "mock-model",
            "COPILOT_OFFLINE": "true", "COPILOT_AUTO_UPDATE": "false",
            "HTTP_PROXY": CLOSED, "HTTPS_PROXY": CLOSED, "NO_PROXY": "127.0.0.1,localhost",
            "LANG": env.get("LANG", "C.UTF-8"),
        })
        self.env = env
        git = ["git", "-c", "user.name=e2e", "-c", "user.email=e2e@localhost"]
        subprocess.run(git + ["init", "-q", self.repo], check=True)
        with open(os.path.join(self.repo, "README"), "w") as handle:
            handle.write("e2e\n")
        subprocess.run(git + ["-C", self.repo, "add", "README"], check=True)
        subprocess.run(git + ["-C", self.repo, "commit", "-qm", "init"], check=True)
        argv = [sys.executable, AR, "setup", "copilot", "--write"]
        if autonomy:
            argv += ["--autonomy", str(autonomy)]
        done = subprocess.run(argv, cwd=self.repo, env=self.env, capture_output=True,
                              text=True, timeout=60)
        if done.returncode != 0:
            raise Failure("setup copilot failed: %s" % done.stderr.strip()[-300:])

    def ar(self, *args):
        done = subprocess.run([sys.executable, AR] + list(args), cwd=self.dir, env=self.env,
                              capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise Failure("agents_room.py %s failed: %s" % (" ".join(args[:2]),
                                                            done.stderr.strip()[-300:]))
        try:
            return json.loads(done.stdout)
        except ValueError:
            return done.stdout

    def peer(self):
        if self.peer_sid is None:
            self.peer_sid = self.ar("join", "--room", "repo:api", "--label", "peer",
                                    "--harness-key", "e2e-peer", "--json")["session_id"]
        return self.peer_sid

    def send(self, to):
        return self.ar("send", "--session", self.peer(), "--to", to, "--subject",
                       SECRET_SUBJECT, "--body", SECRET_BODY, "--json")

    def states(self):
        sent = self.ar("sent", "--session", self.peer(), "--json")
        return [d["state"] for m in sent.get("messages", []) for d in m.get("deliveries", [])]

    def sessions(self):
        who = self.ar("who", "--json")
        return {s["session_id"]: s for s in who.get("sessions", [])}

    def oneshot(self, message, timeout=120):
        """copilot -p MESSAGE to its end -> dict(rc, out, err, hung)."""
        self.runs += 1
        argv = [os.path.join(self.suite.bin, "copilot"), "-p", message, "--allow-all-tools",
                "--trust-folder"]
        log("%s: run %s" % (self.name, " ".join(argv[1:])))
        proc = subprocess.Popen(argv, cwd=self.repo, env=self.env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
            hung = False
        except subprocess.TimeoutExpired:
            kill_group(proc)
            out, err = proc.communicate()
            hung = True
        return {"rc": proc.returncode, "out": out, "err": err, "hung": hung}

    def processes(self):
        return marked_processes(self.dir, self.db)

    def cleanup(self):
        for pid in self.processes():
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        self.mock.stop()
        if self.suite.keep:
            self.mock.dump(os.path.join(self.dir, "requests.json"))


def marked_processes(box_dir, db):
    """{pid: argv} of processes whose environment names this case's dir or store."""
    wanted = [("AGENTS_ROOM_E2E_BOX=%s" % box_dir).encode(), ("AGENTS_ROOM_DB=%s" % db).encode()]
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
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


def run_turn(box, prompt, expect):
    run = box.oneshot(prompt)
    check(not run["hung"], "copilot -p did not exit (stderr %r)" % one_line(run["err"][-300:]))
    calls = box.mock.model_calls()
    check(len(calls) >= expect, "the model was called %d times, expected %d (stderr %r)" % (
        len(calls), expect, one_line(run["err"][-300:])))
    return calls, run


def new_text(req, before=0):
    return "\n".join(t for _, t in req.tool_results()[before:]) + "\n" + "\n".join(
        req.user_texts())


def secrets_shown(calls):
    return [c.index for c in calls if SECRET_SUBJECT in c.all_text() or SECRET_BODY in
            c.all_text()]


# ---- scenarios ----------------------------------------------------------------------

def s_digest(box):
    box.mock.script = lambda req: Reply(text="done")
    calls, _ = run_turn(box, "hello", 1)
    sid = calls[0].session_id()
    check(sid, "no digest (your session_id is ...) in the first request")
    who = box.sessions()
    check(who.get(sid, {}).get("harness") == "copilot", "the session's harness is %r"
          % who.get(sid, {}).get("harness"))
    return "session %s (harness copilot) in the first request" % sid


def s_mcp(box):
    state = {}

    def script(req):
        if "join" not in state:
            state["join"] = req.session_id()
            return Reply(calls=[Call(PREFIX + "room_join", {})])
        if "recv" not in state:
            state["recv"] = True
            return Reply(calls=[Call(PREFIX + "msg_recv", {"session_id": state["join"]})])
        return Reply(text="done")
    box.mock.script = script
    calls, _ = run_turn(box, "join", 3)
    ours = sorted(n[len(PREFIX):] for n in calls[0].tool_names() if n.startswith(PREFIX))
    check(ours == sorted(LEAN), "offered %r, not the lean listing" % ours)
    joined = json.loads(calls[1].tool_results()[-1][1])
    check(joined.get("session_id") == state["join"], "room_join {} answered %r, the digest "
          "said %s" % (joined.get("session_id"), state["join"]))
    check("error" not in calls[2].tool_results()[-1][1].lower()[:40],
          "msg_recv failed: %s" % one_line(calls[2].tool_results()[-1][1]))
    mine = [s for s in box.sessions().values() if s["label"] != "peer"]
    check(len(mine) == 1, "%d sessions besides the peer" % len(mine))
    return "lean listing (%d tools); room_join -> %s, one session" % (len(ours), state["join"])


def s_midturn(box):
    state = {}

    def script(req):
        if "sid" not in state:
            state["sid"] = req.session_id()
            box.send(state["sid"])
            return Reply(calls=[Call("bash", {"command": "echo working",
                                              "description": "work"})])
        return Reply(text="done")
    box.mock.script = script
    calls, _ = run_turn(box, "work", 2)
    text = calls[1].tool_results()[-1][1]
    check(SIGNAL_RE.search(text), "no signal after the tool result: %r" % one_line(text))
    check(not secrets_shown(calls), "subject or body shown to the model")
    return "signal after the tool result: %s" % one_line(SIGNAL_RE.search(text).group(0))


def s_hold_once(box):
    state = {}

    def script(req):
        if "sid" not in state:
            state["sid"] = req.session_id()
            box.send(state["sid"])
        return Reply(text="done %d" % req.count_assistant_turns())
    box.mock.script = script
    calls, _ = run_turn(box, "first", 2)
    check(any(SIGNAL_RE.search(t) for t in calls[1].user_texts()),
          "the continuation does not carry the signal: %r" % calls[1].user_texts()[-1:])
    time.sleep(1)
    calls = box.mock.model_calls()
    check(len(calls) == 2, "held more than once: %d model calls" % len(calls))
    check(not secrets_shown(calls), "subject or body shown to the model")
    return "held once (the reason as the next prompt), not again"


def s_wake(box, side):
    state = {}

    def script(req):
        texts = req.user_texts()[-1:]
        if state.get("sent_at") and "woken" not in state and any(
                SIGNAL_RE.search(t) for t in texts):
            state["woken"] = time.time()
            return Reply(calls=[Call(PREFIX + "msg_recv", {"session_id": state["sid"]})])
        if "sid" not in state:
            state["sid"] = req.session_id()
        return Reply(text="done")
    box.mock.script = script
    run_turn(box, "first", 1)
    check(state.get("sid"), "no digest")
    lever = box.sessions()[state["sid"]].get("lever")
    check(lever == "copilot-resume", "the session's lever is %r" % lever)
    state["sent_at"] = time.time()
    box.send(state["sid"])
    after = box.states()
    side.append(("e-wake-send", "PASS" if after and after[-1] in ("offered", "accepted")
                 else "FAIL", "right after the send: %r" % after))
    box.mock.wait_for(lambda calls: "woken" in state, 90)
    check("woken" in state, "no woken turn within 90 s; deliveries %r" % box.states())
    box.latency = state["woken"] - state["sent_at"]
    end = time.time() + 60
    while time.time() < end and box.states()[-1:] not in (["accepted"], ["read"]):
        time.sleep(0.5)
    check(box.states()[-1:] in (["accepted"], ["read"]), "the delivery is %r, not accepted"
          % box.states())
    # The resumed run cannot be given --trust-folder (copilot refuses it beside
    # --resume), so in a folder never trusted in the TUI it loads no project
    # MCP server: the woken turn sees the signal, its msg_recv is refused.
    return "resumed by copilot-resume in %.1f s; delivery %s" % (box.latency, box.states()[-1])


def s_exit(box):
    box.mock.script = lambda req: Reply(text="done")
    calls, run = run_turn(box, "bye", 1)
    check(run["rc"] == 0, "copilot -p exited %s" % run["rc"])
    sid = calls[0].session_id()
    end = time.time() + 15
    while time.time() < end and not box.sessions().get(sid, {}).get("ended"):
        time.sleep(0.3)
    check(box.sessions().get(sid, {}).get("ended"), "the session is not ended after exit")
    end = time.time() + 10
    while time.time() < end and box.processes():
        time.sleep(0.3)
    left = box.processes()
    check(not left, "processes left: %r" % [" ".join(a)[:80] for a in left.values()])
    return "ended at exit; no process left"


SCENARIOS = [("a-digest", 0, s_digest), ("b-mcp-session", 0, s_mcp),
             ("c-midturn-signal", 0, s_midturn), ("d-hold-once", 1, s_hold_once),
             ("e-wake", 2, s_wake), ("h-exit", 2, s_exit)]


class Suite:
    def __init__(self, args):
        self.bin = os.path.abspath(args.bin)
        self.keep = args.keep
        os.makedirs(args.workdir, exist_ok=True)
        self.root = tempfile.mkdtemp(prefix="run-", dir=os.path.abspath(args.workdir))
        self.results, self.latency, self.lock = [], None, threading.Lock()

    def run_case(self, scenario):
        name, autonomy, function = scenario
        case = name + "/p"
        started, box, side = time.time(), None, []
        try:
            box = Box(self, case, autonomy)
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
                    self.latency = box.latency
                box.cleanup()
        with self.lock:
            self.results.append((case, status, time.time() - started, detail))
            print("%-4s %-24s %5.1fs  %s" % (status, case, time.time() - started,
                                             one_line(detail)), flush=True)
            for side_case, side_status, side_detail in side:
                self.results.append((side_case, side_status, 0.0, side_detail))
                print("%-4s %-24s %5s   %s" % (side_status, side_case, "",
                                              one_line(side_detail)), flush=True)


def main():
    global VERBOSE, AR
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default=os.path.join(ROOT, ".e2e", "copilot", "npm",
                                                      "node_modules", ".bin"))
    parser.add_argument("--only", help="run the cases whose name contains one of these")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--workdir", default=os.path.join(ROOT, ".e2e"))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--agents-room", default=AR)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    VERBOSE, AR = args.verbose, os.path.abspath(args.agents_room)
    wanted = [w.strip() for w in (args.only or "").split(",") if w.strip()]
    selected = [s for s in SCENARIOS if not wanted or any(w in s[0] + "/p" for w in wanted)]
    if args.list:
        print("\n".join(s[0] + "/p" for s in selected))
        return 0
    program = os.path.join(args.bin, "copilot")
    if shutil.which("git") is None or not os.path.exists(program):
        print("e2e-copilot: missing git or %s (make e2e-copilot installs @github/copilot)"
              % program)
        return 2
    out = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, COPILOT_AUTO_UPDATE="false")).stdout
    found = re.search(r"\d+\.\d+\.\d+\S*", out)
    version = found.group(0).rstrip(".") if found else "?"
    suite = Suite(args)
    started = time.time()
    print("e2e-copilot: %s (sha256 %s), copilot %s" % (AR, file_sha(AR), version), flush=True)
    queue, queue_lock = list(selected), threading.Lock()

    def worker():
        while True:
            with queue_lock:
                if not queue:
                    return
                scenario = queue.pop(0)
            suite.run_case(scenario)
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, args.jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if not args.keep:
        shutil.rmtree(suite.root, ignore_errors=True)
    status = {case: s for case, s, _, _ in suite.results}

    def cell(name):
        got = status.get(name + "/p")
        return None if got in (None, "SKIP") else got == "PASS"
    print()
    report_row("copilot", version, "copilot -p", digest=cell("a-digest"),
               signal=cell("c-midturn-signal"), hold=cell("d-hold-once"),
               wake=cell("e-wake"), latency=suite.latency,
               note="--trust-folder per run; a finished session is resumed "
                    "(copilot --resume=<id> -p <signal>)")
    failed = sum(1 for r in suite.results if r[1] == "FAIL")
    passed = sum(1 for r in suite.results if r[1] == "PASS")
    print("\n%.0f s%s" % (time.time() - started, "; kept %s" % suite.root if args.keep else ""))
    print("e2e-copilot %s: %d passed, %d failed" % (version, passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
