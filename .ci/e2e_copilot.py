#!/usr/bin/env python3
"""End-to-end: agents-room under a real GitHub Copilot CLI (npm @github/copilot),
offline, its BYOK provider pointed at .ci/mock_model.py (COPILOT_PROVIDER_BASE_URL,
COPILOT_MODEL, COPILOT_OFFLINE=true: no login, telemetry or update).  The
framework, its options and the common runs: .ci/e2e_box.py.

    make e2e-copilot      # installs the pinned @github/copilot, runs this, cleans up
    python3 .ci/e2e_copilot.py --bin DIR [--only NAME[,NAME...]] [--list] [--keep] [-v]

One mode, p: `copilot -p MESSAGE --allow-all-tools --trust-folder` (prompt
mode, with the flag Copilot documents for trusting the folder for one
prompt-mode session, no saved trust).  The interactive TUI is not driven here.
setup copilot writes .github/hooks/agents-room.json (the hooks in Claude's
PascalCase form) and .github/mcp.json.  Copilot names our tools agents-room-*;
a -p run fires SessionEnd at its exit; a finished session is woken by the
lever copilot-resume (copilot --resume=<id> -p <signal>), whose resumed run,
without --trust-folder (copilot refuses it beside --resume), loads no project
MCP server in a folder never trusted in the TUI: the woken turn sees the
signal, its msg_recv is refused, and the delivery stays accepted.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_box  # noqa: E402
from e2e_box import Call  # noqa: E402


class Copilot(e2e_box.Harness):
    name = "copilot"
    title = "copilot"
    program = "copilot"
    modes = {"p": "oneshot"}
    labels = {"p": "copilot -p"}
    notes = {"p": "--trust-folder per run; a finished session is resumed "
                  "(copilot --resume=<id> -p <signal>)"}
    levers = {"p": "copilot-resume"}
    prefix = "agents-room-"
    who_harness = "copilot"
    oneshot_session_end = True
    resumed_reads = False
    version_env = {"COPILOT_AUTO_UPDATE": "false"}
    # Measured with 1.0.102: doctor runs, and says "no harness key in the
    # environment"; it names no session and no lever.
    doctor_skip = ("doctor runs in Copilot's shell tool, but the tool's commands get no "
                   "harness key, so it cannot name the session")

    def env(self, box):
        return {"COPILOT_PROVIDER_BASE_URL": box.mock.url + "/v1",
                "COPILOT_MODEL": "mock-model", "COPILOT_OFFLINE": "true",
                "COPILOT_AUTO_UPDATE": "false"}

    def oneshot_argv(self, box, prompt, resume=None, yolo=False):
        # The doctor's run names agents_room.py outside the folder: Copilot
        # asks for such a path, and nobody answers in -p.
        return [self.program, "-p", prompt, "--allow-all-tools", "--trust-folder"] + (
            ["--allow-all-paths"] if yolo else [])

    def read_call(self, box):
        return Call("bash", {"command": "cat README", "description": "read"})

    def shell_call(self, command):
        return Call("bash", {"command": command, "description": "agents-room doctor"})


if __name__ == "__main__":
    sys.exit(e2e_box.main(Copilot()))
