#!/usr/bin/env python3
"""End-to-end: Claude Code with agents-room installed as a plugin, not by setup's
files, offline, against .ci/mock_model.py.  The framework, its options and
the common runs: .ci/e2e_box.py.

    make e2e-claude-plugin   # installs the pinned Claude Code, runs this, cleans up
    python3 .ci/e2e_claude_plugin.py --bin DIR [--only NAME[,NAME...]] [--list] [--keep]

What a user does, per the README's "Claude Code as a plugin": `agents_room.py
plugin DIR` writes a marketplace, `claude plugin marketplace add DIR`, `claude
plugin install agents-room@agents-room --config autonomy=N`, and (a plugin
cannot allow its own tools) `mcp__plugin_agents-room_agents-room__*` in
permissions.allow of ~/.claude/settings.json.  No `setup` file is written; the
project is a plain git repository.  Besides that the box writes only what is
about the mock (~/.claude.json: onboarding done, the dummy API key approved)
and, in the TUI, answers the folder trust dialog as a user does once (the rest
is Claude Code's declaration, .ci/e2e_claude.py).  Modes:
claude-p (`claude -p PROMPT --output-format json`, the default permission mode
in a folder never trusted) and claude-tui (interactive `claude` in tmux).  A
finished claude -p run has no lever (.ci/e2e_claude.py's e3 shows it), so no run here
wakes one; the TUI is woken before and after its first turn.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_box  # noqa: E402
from e2e_box import AR, Failure  # noqa: E402
from e2e_claude import Claude  # noqa: E402

ALLOW = "mcp__plugin_agents-room_agents-room__*"


class ClaudePlugin(Claude):
    name = "claude-plugin"
    title = "claude-code (plugin)"
    program = "claude"
    modes = {"claude-p": "oneshot", "claude-tui": "tui"}
    labels = {"claude-p": "claude -p, as a plugin", "claude-tui": "claude (TUI), as a plugin"}
    notes = {"claude-p": "the plugin's hooks and server; its tools allowed in "
                         "~/.claude/settings.json; no lever for a finished run",
             "claude-tui": "the plugin's hooks and server; folder trusted in the TUI"}
    levers = {"claude-tui": ("claude-socket", "claude-rewake")}
    prefix = "mcp__plugin_agents-room_agents-room__"
    # Measured with 2.1.332: a prompt typed as soon as the TUI is ready goes
    # out before the plugin's server is up (its tools come from the next
    # request on); with setup's .mcp.json the start waits for the server.
    late_tools = {"claude-tui": "the TUI's first request went out before the plugin's "
                                "MCP server was up"}
    # Claude Code's, but the folder trust only (the TUI runs in its default mode);
    # its cells and notes are the common ones.
    start_dialogs = Claude.start_dialogs[:1]
    dialogs = ("New MCP server found", "new MCP servers found",
               "Held message from another session", "Bypass Permissions mode")
    wake_levers = {}
    wake_na = {}
    cells = {}
    note = e2e_box.Harness.note

    def cases(self):
        return [c for c in e2e_box.COMMON if c.name != "doctor"]

    def setup(self, box):
        market = os.path.join(box.dir, "marketplace")
        claude = box.suite.which(self.program)
        box.must([sys.executable, AR, "plugin", market], what="agents_room.py plugin")
        box.must([claude, "plugin", "marketplace", "add", market], cwd=box.repo,
                 what="claude plugin marketplace add")
        box.must([claude, "plugin", "install", "agents-room@agents-room", "--config",
                  "autonomy=%d" % box.autonomy], cwd=box.repo, what="claude plugin install")
        path = os.path.join(box.home, ".claude", "settings.json")
        settings = {}
        if os.path.exists(path):
            with open(path) as handle:
                settings = json.load(handle)
        allow = settings.setdefault("permissions", {}).setdefault("allow", [])
        allow.append(ALLOW)
        with open(path, "w") as handle:
            json.dump(settings, handle, indent=2)
        written = [p for p in (".mcp.json", ".claude") if os.path.exists(
            os.path.join(box.repo, p))]
        if written:
            raise Failure("the plugin's install wrote %s into the project" % written)


if __name__ == "__main__":
    sys.exit(e2e_box.main(ClaudePlugin()))
