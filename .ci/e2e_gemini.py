#!/usr/bin/env python3
"""End-to-end: agents-room under a real Gemini CLI (gemini -p and the TUI),
offline, against .ci/mock_model.py (GOOGLE_GEMINI_BASE_URL).  The framework,
its options and the common runs: .ci/e2e_box.py.

    make e2e-gemini       # installs the pinned @google/gemini-cli, runs this, cleans up
    python3 .ci/e2e_gemini.py --bin DIR [--only NAME[,NAME...]] [--list] [--keep]
                              [--jobs 1|2] [-v]

Modes: gemini-p (`gemini -p`, with --approval-mode yolo, else -p offers no
shell tool) and gemini-tui (interactive gemini in tmux).  Pre-written, as it
is about the mock only: ~/.gemini/settings.json with security.auth.selectedType
"gemini-api-key" (without it a base URL makes Gemini pick the "gateway" auth
type and exit 41), telemetry, usage statistics and auto-update off; ~/.env
with the mock's API key (Gemini CLI reads it in untrusted folders too, and a
resumed run finds the key there: the resume lever keeps no secret of the
session's environment).  The one user step is folder trust: the TUI's "1. Trust
folder", taken in tmux as a user does once (a gemini-p box takes it before its
first run and quits; that start is a session of its own, left out of the
checks).  gemini -p refuses an untrusted folder (exit 55), and --skip-trust
does not load the project's settings.  Gemini CLI 0.61.0 now and then saves the
trust without restarting; it then runs without the project's settings and is
started again, as a user would.  Gemini runs with `-m gemini-2.5-flash` (no
router call first).  Its own: a send to the idle open TUI starts no turn (it
has no way in while it runs: e1-idle-not-woken); once the session ends, the
send resumes it (lever gemini-resume: gemini --resume <id> -p <signal>).
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_box  # noqa: E402
from e2e_box import Call, Case, Failure, Reply, check  # noqa: E402

MODEL = "gemini-2.5-flash"
IDLE_S = 6                        # how long an idle TUI is watched for a turn (e1)
MOCK_SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "telemetry": {"enabled": False},
    "privacy": {"usageStatisticsEnabled": False},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
}


def run_idle(box, step):
    """The TUI after a turn: a send starts no turn; after /quit it resumes."""
    state = {"prefix": box.harness.prefix}

    def script(req):
        if state.get("phase") == "woken":
            return e2e_box._wake_script(state)(req)
        state.setdefault("sid", req.session_id())
        return Reply(text="done")
    box.play(script)
    box.turn("first task", 1, quiet=2.0)

    def idle():
        sid = state.get("sid")
        check(sid, "no digest reached the model")
        time.sleep(1.0)
        before = len(box.mock.model_calls())
        box.send(sid)
        woke = box.mock.wait_for(lambda calls: len(calls) > before, IDLE_S)
        states = box.states()
        check(woke is None, "a turn started in the open TUI (unexpected: Gemini CLI has no "
              "way in while it runs); states %s" % states)
        check(states == ["offered"], "the delivery to the idle TUI is %s (expected offered: "
              "the resume lever waits for the session's process to end)" % states)
        return "no turn in %d s; delivery %s (the TUI still runs)" % (IDLE_S, states[0])
    step("e1-idle-not-woken", idle)

    def resumed():
        box.end()
        return e2e_box.resume_wake(box, state, row="e2-resume-wakes")
    step("e2-resume-wakes", resumed)


class Gemini(e2e_box.Harness):
    name = "gemini"
    title = "gemini"
    program = "gemini"
    modes = {"gemini-p": "oneshot", "gemini-tui": "tui"}
    labels = {"gemini-p": "gemini -p", "gemini-tui": "gemini (TUI)"}
    notes = {"gemini-p": "wake: the finished run is resumed (gemini --resume <id> -p <signal>)",
             "gemini-tui": "no way in while the TUI runs: a send to an idle TUI stays "
                           "offered; after /quit the session is resumed headless "
                           "(gemini --resume <id> -p <signal>)"}
    levers = {"gemini-p": "gemini-resume", "gemini-tui": "gemini-resume"}
    wake_na = {"gemini-tui": ("e1-idle-not-woken",)}
    prefix = "mcp_agents-room_"
    ready = "Type your message"
    yolo_args = ("--approval-mode", "yolo")
    oneshot_session_end = True
    enter_tries = 4         # the first Enter is sometimes swallowed while MCP starts
    requires = ("git", "node", "tmux")

    def cases(self):
        # No wake through an inbox: the TUI is watched idle, then resumed.
        return [c for c in e2e_box.COMMON if c.name != "wake"] + [
            Case("idle", 2, run_idle, ("e1-idle-not-woken", "e2-resume-wakes"),
                 modes=("tui",))]

    def env(self, box):
        return {"GOOGLE_GEMINI_BASE_URL": box.mock.url}

    def configure(self, box):
        os.makedirs(os.path.join(box.home, ".gemini"), exist_ok=True)
        with open(os.path.join(box.home, ".gemini", "settings.json"), "w") as handle:
            json.dump(MOCK_SETTINGS, handle, indent=2)
        with open(os.path.join(box.home, ".env"), "w") as handle:
            handle.write("GEMINI_API_KEY=e2e-mock-key\n")

    def trust(self, box):
        if box.kind == "oneshot":       # the user trusts the folder once, in the TUI
            box.tui_start()
            box.tui_quit(timeout=20)
            box.ignored = {s["session_id"] for s in box.sessions()}

    def oneshot_argv(self, box, prompt, resume=None, yolo=False):
        return ([self.program, "-m", MODEL, "--approval-mode", "yolo", "--output-format",
                 "json"] + (["--resume", resume] if resume else []) + ["-p", prompt])

    def run_id(self, out):
        try:
            return json.loads(out).get("session_id")
        except (ValueError, AttributeError):
            return None

    def tui_argv(self, box, extra=()):
        return [self.program, "-m", MODEL] + list(extra)

    def tui_wait(self, box, timeout=90):
        """Answer the trust dialog with 1. Trust folder; True once the prompt
        shows with the MCP server, False when gemini came back without it."""
        answered_at = bare_since = None
        end = time.time() + timeout
        while time.time() < end:
            screen = box.suite.tmux("capture-pane", "-p", "-t", box.tmux, check=False)
            if "Do you trust the files in this folder" in screen:
                if answered_at is None and "MCP Servers" in screen:
                    check("1. Trust folder" in screen, "the trust dialog offers no '1. "
                          "Trust folder':\n%s" % screen[-800:])
                    time.sleep(1.0)             # let the dialog settle, as a reader would
                    box.suite.tmux("send-keys", "-t", box.tmux, "Enter")
                    answered_at = time.time()
            elif self.ready in screen:
                if "MCP server" in screen:
                    time.sleep(1.0)
                    return True
                if answered_at is not None:
                    # Back at the prompt without the server: for 8 s, it stays so.
                    bare_since = bare_since or time.time()
                    if time.time() - bare_since > 8:
                        return False
            time.sleep(0.3)
        raise Failure("gemini did not %s in %d s; screen:\n%s" % (
            "come back after the trust dialog" if answered_at else "get ready", timeout,
            box.screen()[-1500:]))

    def read_call(self, box):
        return Call("list_directory", {"dir_path": box.repo})

    def shell_call(self, command):
        return Call("run_shell_command", {"command": command,
                                          "description": "agents-room doctor"})


if __name__ == "__main__":
    sys.exit(e2e_box.main(Gemini()))
