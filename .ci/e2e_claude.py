#!/usr/bin/env python3
"""End-to-end: real Claude Code turns, offline, against .ci/mock_model.py
(Anthropic Messages).  The framework, its options and the common runs:
.ci/e2e_box.py.

    make e2e-claude       # installs the pinned Claude Code, runs this, cleans up
    python3 .ci/e2e_claude.py --bin DIR [--only NAME[,NAME...]] [--list] [--keep]
                              [--db URL] [-v]

Modes: claude-p (`claude -p PROMPT --output-format json`, the default
permission mode in a folder never trusted: setup's allow rule is what lets our
tools run), claude-tui (interactive `claude` in tmux, its default mode: "auto"
in 2.1.332) and claude-tui-skip (the same with --dangerously-skip-permissions;
its runs are the wakes only).  Each box starts from
`agents_room.py setup claude --write [--autonomy N]` and what is about the mock
only (~/.claude.json: onboarding done, the dummy API key approved); the TUI
takes the README's one step in its own dialog, "Yes, I trust this folder"
(and, with --dangerously-skip-permissions, "Yes, I accept" in the Bypass
Permissions warning), through tmux.  A TUI run fails on any other dialog on
screen (the MCP server approval, a held message, the trust dialog again), and
any run on a scripted call of a tool the request did not offer.

Its own runs: a finished claude -p run has no lever (nothing runs, the next
--resume is told: e3-wake-finished-run), and a session raised to wake
in-session (room_join {"autonomy": 2} under setup --autonomy 1, so no rewake
waiter) is woken through Claude Code's inbox socket (e4-wake-by-inbox,
2.1.224 and later).  Table cells: digest = a-digest + b-mcp-session, signal =
c-midturn-signal + h-sent-states, hold = d-hold-once (with what the TUI showed
of it: no "Stop hook error").
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_box  # noqa: E402
from e2e_box import COMMON, MORE, Call, Case, Reply, SIGNAL_RE, Skip, check  # noqa: E402

API_KEY = "sk-ant-e2e-dummy-key-0000000000"
SKIP_PERMISSIONS = "--dangerously-skip-permissions"


def run_finished(box, step):
    """A send to a finished claude -p run: no lever, nothing runs, and the
    next run of the session (--resume) is told."""
    state = {}

    def script(req):
        state.setdefault("sid", req.session_id())
        return Reply(text="first done")
    box.play(script)
    run = box.oneshot("first task", timeout=45)

    def finished():
        check(state.get("sid") and run["id"] and not run["hung"],
              "the first run gave no session%s" % e2e_box.run_hint(run))
        before = len(box.mock.model_calls())
        box.play(lambda req: Reply(text="next done"))
        box.send(state["sid"])
        time.sleep(6.0)
        stray = box.mock.model_calls()[before:]
        check(not stray, "%d model call(s) after a send to a finished claude -p run"
              % len(stray))
        states = box.states()
        check("accepted" not in states, "the sender sees %s although nothing runs the "
              "session" % states)
        box.oneshot("next task", resume=run["id"], timeout=45)
        calls = box.mock.model_calls()[before:]
        check(calls, "the resumed run reached no model")
        text = calls[0].all_text()
        check(SIGNAL_RE.search(text) or "1 unread message" in text,
              "the resumed run was not told of the unread message")
        return "no lever (nothing ran; states %s); the next --resume run was told" % states
    step("e3-wake-finished-run", finished)


def run_wake_by_inbox(box, step):
    """setup --autonomy 1 installs no rewake waiter; the model raises the
    session to wake (room_join {"autonomy": 2}), so a send can only go
    through Claude Code's inbox socket."""
    state = {"prefix": box.harness.prefix}
    woken = e2e_box._wake_script(state)

    def script(req):
        sid = req.session_id()
        if sid and "raised" not in state and not req.tool_results():
            state["raised"] = state["sid"] = sid
            return Reply(calls=[e2e_box.ar_call(box, "room_join", {"autonomy": 2})])
        return woken(req)
    box.play(script)
    box.tui_start()
    box.tui_send("raise your autonomy to wake")
    box.wait_quiet(2)

    def by_inbox():
        found = box.sessions()
        check(found and state.get("raised"), "no session raised its autonomy (sessions %s)"
              % found)
        session = found[0]
        check(session["autonomy"] == 2, "room_join {autonomy: 2} left autonomy %s"
              % session["autonomy"])
        if session.get("lever") is None:
            raise Skip("no lever without the rewake waiter: this Claude Code has no inbox "
                       "socket (CLAUDE_CODE_MESSAGING_SOCKET, 2.1.224 and later)")
        time.sleep(1.0)
        latency, returned, at_send, after, _ = e2e_box._wake_once(
            box, session["session_id"], lever="claude-socket")
        box.suite.latency["e4-wake-by-inbox/" + box.mode] = latency
        return "woke in %.2f s through claude-socket (the send returned in %.2f s); " \
            "delivery %s, then %s" % (latency, returned, at_send, after)
    step("e4-wake-by-inbox", by_inbox)
    box.end()


class Claude(e2e_box.Harness):
    name = "claude"
    title = "claude-code"
    program = "claude"
    modes = {"claude-p": "oneshot", "claude-tui": "tui", "claude-tui-skip": "tui"}
    labels = {"claude-p": "claude -p", "claude-tui": "claude (TUI, default mode)",
              "claude-tui-skip": "claude --dangerously-skip-permissions (TUI)"}
    notes = {"claude-p": "untrusted folder, default permission mode: setup alone; no lever "
                         "for a finished run (the next --resume is told)"}
    levers = {"claude-p": "claude-rewake", "claude-tui": ("claude-socket", "claude-rewake"),
              "claude-tui-skip": ("claude-socket", "claude-rewake")}
    # The armed rewake waiter goes first (no dialog, one turn).
    wake_levers = {"claude-tui": "claude-rewake", "claude-tui-skip": "claude-rewake"}
    wake_na = {"claude-p": ("e3-wake-finished-run",)}
    resumes = False         # its own e3: a finished run has no lever
    cells = {mode: {"digest": ("a-digest", "b-mcp-session"),
                    "signal": ("c-midturn-signal", "h-sent-states")}
             for mode in ("claude-p", "claude-tui")}
    quit_keys = ("/exit",)
    yolo_args = (SKIP_PERMISSIONS,)
    # A hold is context (a system reminder): a decision block would show this.
    hold_screen_errors = ("Stop hook error",)
    require_offered = True
    start_dialogs = ((("Yes, I trust this folder",), "Yes, I trust this folder", "trust"),
                     (("Bypass Permissions mode", "Yes, I accept"), "Yes, I accept",
                      "bypass warning"))
    # Enter on the MCP dialog rejects the server for good; a held message needs a person.
    dialogs = ("New MCP server found", "new MCP servers found",
               "Held message from another session", "Yes, I trust this folder",
               "Bypass Permissions mode")
    wake_quiet = 4.0        # a second lever's turn would show by then
    arm_s = 2.0
    requires = ("git", "node")

    def cases(self):
        both = ("claude-p", "claude-tui")
        return [c.within("claude-tui", "claude-tui-skip") if c.name == "wake" else
                Case("doctor", 2, e2e_box.run_doctor, ("g-doctor",), modes=both)
                if c.name == "doctor" else c.within(*both) for c in COMMON] + [
            MORE["exits"], MORE["resume-rooms"], MORE["sent-states"].within(*both),
            MORE["idle-watch"].within(*both),
            Case("finished", 2, run_finished, ("e3-wake-finished-run",), modes=("claude-p",)),
            Case("inbox", 1, run_wake_by_inbox, ("e4-wake-by-inbox",), modes=("claude-tui",))]

    def note(self, suite, mode):
        if mode == "claude-p":
            return self.notes[mode]
        inbox = suite.results.get("e4-wake-by-inbox/claude-tui", ("SKIP",))[0] != "SKIP"
        if mode == "claude-tui":
            note = "folder trusted once in the TUI; the rewake waiter%s" % (
                ", or the inbox socket where no waiter is armed" if inbox else
                " (no inbox socket in this version)")
        else:
            note = "trust and the Bypass warning accepted once in the TUI; the rewake " \
                "waiter%s" % (" (never the inbox: it would hold the wake behind a dialog)"
                              if inbox else "")
        return "%s; %s" % (note, e2e_box.per_wake(suite, mode))

    def env(self, box):
        return {"ANTHROPIC_BASE_URL": box.mock.url, "ANTHROPIC_API_KEY": API_KEY,
                "IS_SANDBOX": "1", "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
                "DISABLE_ERROR_REPORTING": "1",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}

    def configure(self, box):
        # About the mock only: onboarding done, the dummy API key approved.  No
        # trust, no MCP approval, no bypass acceptance.
        state = {"hasCompletedOnboarding": True, "numStartups": 5, "autoUpdates": False,
                 "theme": "dark",
                 "customApiKeyResponses": {"approved": [API_KEY[-20:]], "rejected": []}}
        with open(os.path.join(box.home, ".claude.json"), "w") as handle:
            json.dump(state, handle)

    def oneshot_argv(self, box, prompt, resume=None, yolo=False):
        return [self.program, "-p", prompt, "--output-format", "json"] + (
            ["--resume", resume] if resume else []) + ([SKIP_PERMISSIONS] if yolo else [])

    def tui_argv(self, box, extra=()):
        skip = [SKIP_PERMISSIONS] if box.mode == "claude-tui-skip" else []
        return [self.program] + skip + [a for a in extra if a not in skip]

    def tui_ready(self, screen):
        # The prompt box near the bottom, its mode/shortcuts line under it (a
        # dialog's options are marked with the same arrow).
        lines = [l for l in screen.splitlines() if l.strip()]
        return any(l.lstrip().startswith("\u276f") for l in lines[-6:]) and any(
            m in screen for m in ("for shortcuts", "mode on", "permissions on", "for agents"))

    def run_id(self, out):
        return next((item.get("session_id") for item in e2e_box.json_lines(out)
                     if item.get("type") == "result"), None)

    def read_call(self, box):
        # Read needs no permission in any mode (Bash would, in -p's default mode,
        # and auto mode may ask its classifier first).
        return Call("Read", {"file_path": os.path.join(box.repo, "README")})

    def shell_call(self, command):
        return Call("Bash", {"command": command})


if __name__ == "__main__":
    sys.exit(e2e_box.main(Claude()))
