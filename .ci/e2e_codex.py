#!/usr/bin/env python3
"""End-to-end: real Codex turns, offline, against .ci/mock_model.py (OpenAI
Responses).  The framework, its options and the common runs: .ci/e2e_box.py.

    make e2e-codex        # installs the pinned Codex, runs this, cleans up
    python3 .ci/e2e_codex.py --bin DIR [--only NAME[,NAME...]] [--list] [--keep]
                             [--db URL] [-v]

Modes: codex-exec (`codex exec --dangerously-bypass-hook-trust --json PROMPT`:
its hooks run without the TUI's trust) and codex-tui (interactive `codex` in
tmux).  Each box starts from `agents_room.py setup codex --write [--autonomy N]`
and, about the mock only, CODEX_HOME/config.toml naming it as the model
provider; the TUI takes the README's one-time steps in its own dialogs, "Trust
and continue" for the folder and "Trust all and continue" for the new hooks,
through tmux.  A TUI run fails on either dialog after that, and any run on a
scripted call of a tool the request did not offer (Codex offers our tools in
the namespace mcp__agents_room).  Codex 0.171's TUI runs its threads, MCP
servers included, in an app-server daemon that outlives it by design: not
counted as left after an exit, and its SessionEnd comes when the thread
unloads, a minute after /exit (h-exit waits for it).

Codex fires SessionStart at the first prompt (and `codex queue` needs the
thread's rollout, written then): no session exists before it, so
e1-wake-before-first-turn is skipped.  A finished codex exec run is woken by
codex exec resume (e3-wake-finished, in the doctor run).  Table cells: digest
= a-digest + b-mcp-session, signal = c-midturn-signal + h-sent-states.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_box  # noqa: E402
from e2e_box import COMMON, MORE, Call  # noqa: E402


class Codex(e2e_box.Harness):
    name = "codex"
    title = "codex"
    program = "codex"
    modes = {"codex-exec": "oneshot", "codex-tui": "tui"}
    labels = {"codex-exec": "codex exec", "codex-tui": "codex (TUI)"}
    notes = {"codex-exec": "hooks run with --dangerously-bypass-hook-trust; a finished run "
                           "is woken by codex exec resume",
             "codex-tui": "folder and hooks trusted once in the TUI; codex queue, not before "
                          "the first prompt"}
    levers = {"codex-exec": "codex-resume", "codex-tui": "codex-queue"}
    wake_levers = dict(levers)
    cells = {mode: {"digest": ("a-digest", "b-mcp-session"),
                    "signal": ("c-midturn-signal", "h-sent-states")}
             for mode in ("codex-exec", "codex-tui")}
    prefix = "mcp__agents_room/"        # a Responses namespace: Call splits it off
    quit_keys = ("/exit",)
    require_offered = True
    start_dialogs = ((("Trust this folder?",), "Trust and continue", "trust"),
                     (("Hooks need review",), "Trust all and continue", "hook trust"))
    dialogs = ("Trust this folder?", "Hooks need review")
    outlives = ("app-server",)
    no_session_before_prompt = {
        "codex-tui": "Codex has no session before its first prompt (SessionStart fires at "
                     "the first prompt; codex queue needs the rollout)"}
    # Codex 0.171's TUI runs its thread in an app-server daemon that outlives
    # it by design; the daemon unloads the thread, and SessionEnd comes, when
    # the thread has been idle thread_unload_delay_secs (60 s by default):
    # h-exit is checked at the lane's end, its next runs going on meanwhile.
    exit_wait_s = {"codex-tui": 90}
    wake_quiet = 4.0        # a second lever's turn would show by then
    arm_s = 2.0
    requires = ("git", "node")

    def cases(self):
        return list(COMMON) + [MORE["exits"], MORE["resume-rooms"], MORE["sent-states"],
                               MORE["idle-watch"]]

    def note(self, suite, mode):
        if mode == "codex-tui":
            return "%s; %s" % (self.notes[mode], e2e_box.per_wake(suite, mode))
        return self.notes[mode]

    def env(self, box):
        return {"CODEX_HOME": os.path.join(box.home, ".codex")}

    def configure(self, box):
        # The mock as the model provider; no folder or hook trust (the TUI
        # trusts both in its dialogs, codex exec bypasses hook trust).
        os.makedirs(box.env["CODEX_HOME"], exist_ok=True)
        with open(os.path.join(box.env["CODEX_HOME"], "config.toml"), "w") as handle:
            handle.write(
                'model = "mock-model"\nmodel_provider = "mock"\n'
                'approval_policy = "never"\nsandbox_mode = "danger-full-access"\n\n'
                '[model_providers.mock]\nname = "Mock"\nbase_url = "%s/v1"\n'
                'wire_api = "responses"\nrequest_max_retries = 0\nstream_max_retries = 0\n'
                % box.mock.url)

    def oneshot_argv(self, box, prompt, resume=None, yolo=False):
        return [self.program, "exec"] + (["resume"] if resume else []) + [
            "--dangerously-bypass-hook-trust", "--json"] + ([resume] if resume else []) + [
            prompt]

    def tui_ready(self, screen):
        # Codex draws its session card and prompt first and puts the folder
        # trust dialog over them seconds later; the card's "permissions:" line
        # comes only once the folder's trust is settled.
        lines = [l for l in screen.splitlines() if l.strip()]
        return "OpenAI Codex (v" in screen and "permissions:" in screen and any(
            l.lstrip().startswith("\u203a") for l in lines[-6:])

    def run_id(self, out):
        return next((item.get("thread_id") for item in e2e_box.json_lines(out)
                     if item.get("type") == "thread.started"), None)

    def join_args(self, box, req):
        # Codex's serve has no harness key: name it, or the join is an orphan.
        return {"harness_key": req.headers.get("thread-id") or req.headers.get("session-id")}

    def read_call(self, box):
        return Call("exec_command", {"cmd": "true"})

    def shell_call(self, command):
        return Call("exec_command", {"cmd": command})


if __name__ == "__main__":
    sys.exit(e2e_box.main(Codex()))
