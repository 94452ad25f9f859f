#!/usr/bin/env python3
"""End-to-end: agents-room under a real Kilo Code (npm @kilocode/cli), OpenCode's
fork: .ci/e2e_opencode.py's declaration under Kilo's names (the program kilo,
kilo.json, .kilo/, ~/.config/kilo, KILO_* variables, @kilocode/plugin); every
case is the same.  The framework, its options and the common runs: .ci/e2e_box.py.

    make e2e-kilo         # installs the pinned @kilocode/cli, runs CI's subset, cleans up
    make e2e-kilo E2E_KILO_ARGS=                    # every run (19 rows, 3-5.5 min)
    python3 .ci/e2e_kilo.py --bin DIR [--only NAME[,NAME...]] [--list] [--keep] [-v]

A Kilo start took 30-55 s at a load of 12 on two cores, so its bounds grow by
60 s (cold).  Mock-side besides OpenCode's: telemetry, session upload, presence,
the codebase index and share off (each would wait on the closed proxy), and its
work-tree snapshots off (on a loaded machine their first build outlasts a turn
and the TUI asks whether to disable them; agents-room has nothing to do with them).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_box  # noqa: E402
from e2e_opencode import OpenCode  # noqa: E402


class Kilo(OpenCode):
    name = "kilo"
    title = "kilo"
    label = "Kilo Code"
    program = "kilo"
    env_prefix = "KILO_"
    config_name = "kilo.json"
    project_dir = ".kilo"
    schema = "https://app.kilo.ai/config.json"
    plugin = "@kilocode/plugin"
    offline = {"KILO_TELEMETRY_LEVEL": "off", "KILO_DISABLE_SESSION_INGEST": "1",
               "KILO_DISABLE_PRESENCE": "1", "KILO_DISABLE_CODEBASE_INDEXING": "1",
               "KILO_DISABLE_SHARE": "1"}
    config = {"snapshot": False}
    levers = {"run": "kilo-resume", "tui": "kilo-resume"}
    cold = 60


if __name__ == "__main__":
    sys.exit(e2e_box.main(Kilo()))
