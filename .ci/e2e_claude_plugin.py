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
and, in the TUI, answers the folder trust dialog as a user does once.  Modes:
claude-p (`claude -p PROMPT --output-format json`, the default permission mode
in a folder never trusted) and claude-tui (interactive `claude` in tmux).  A
finished claude -p run has no lever (.ci/e2e.py's e3 shows it), so no run here
wakes one; the TUI is woken before and after its first turn.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_box  # noqa: E402
from e2e_box import AR, Call, Failure  # noqa: E402

API_KEY = "sk-ant-e2e-dummy-key-0000000000"
ALLOW = "mcp__plugin_agents-room_agents-room__*"
TRUST = "Yes, I trust this folder"
# Dialogs no user should meet once the folder is trusted (Enter on the MCP
# dialog rejects the server for good; a held message needs a person).
FORBIDDEN = ("New MCP server found", "new MCP servers found",
             "Held message from another session", "Bypass Permissions mode")


class ClaudePlugin(e2e_box.Harness):
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
    quit_keys = ("/exit",)
    # A hold is context (a system reminder): a decision block would show this.
    hold_screen_errors = ("Stop hook error",)
    requires = ("git", "node")

    def cases(self):
        return [c for c in e2e_box.COMMON if c.name != "doctor"]

    def env(self, box):
        return {"ANTHROPIC_BASE_URL": box.mock.url, "ANTHROPIC_API_KEY": API_KEY,
                "IS_SANDBOX": "1", "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
                "DISABLE_ERROR_REPORTING": "1",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}

    def configure(self, box):
        state = {"hasCompletedOnboarding": True, "numStartups": 5, "autoUpdates": False,
                 "theme": "dark",
                 "customApiKeyResponses": {"approved": [API_KEY[-20:]], "rejected": []}}
        with open(os.path.join(box.home, ".claude.json"), "w") as handle:
            json.dump(state, handle)

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

    def oneshot_argv(self, box, prompt, resume=None, yolo=False):
        return [self.program, "-p", prompt, "--output-format", "json"] + (
            ["--resume", resume] if resume else [])

    def run_id(self, out):
        for line in out.splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if isinstance(item, dict) and item.get("type") == "result":
                return item.get("session_id")
        return None

    def read_call(self, box):
        # Read needs no permission in any mode (Bash would, in -p's default mode).
        return Call("Read", {"file_path": os.path.join(box.repo, "README")})

    # -- the TUI's start: the folder trust dialog, then its prompt
    def tui_wait(self, box, timeout=90):
        end, trusted, ready_since = time.time() + timeout, 0, None
        while time.time() < end:
            screen = box.suite.tmux("capture-pane", "-p", "-t", box.tmux, check=False)
            if TRUST in screen:
                if trusted >= 2:
                    raise Failure("the trust dialog came back after it was answered")
                trusted += 1
                if not choose(box, TRUST):
                    raise Failure("cannot pick %r; screen:\n%s" % (TRUST, screen))
                time.sleep(1.0)
                continue
            bad = next((m for m in FORBIDDEN if m in screen), None)
            if bad:
                raise Failure("at start the TUI shows %r, a dialog the plugin should have "
                              "made unneeded; screen:\n%s" % (bad, screen))
            lines = [l for l in screen.splitlines() if l.strip()]
            ready = any(l.lstrip().startswith("\u276f") for l in lines[-6:]) and any(
                m in screen for m in ("for shortcuts", "mode on", "permissions on",
                                      "for agents"))
            if not ready:
                ready_since = None
            elif ready_since is None:
                ready_since = time.time()
            elif time.time() - ready_since > 1.5:
                return
            time.sleep(0.4)
        raise Failure("the TUI did not become ready in %d s; screen:\n%s"
                      % (timeout, box.screen()))


def choose(box, label):
    """Move a dialog's cursor to the option containing label, then Enter."""
    for _ in range(12):
        lines = box.suite.tmux("capture-pane", "-p", "-t", box.tmux, check=False).splitlines()
        cursor = [i for i, l in enumerate(lines) if l.lstrip()[:1] == "\u276f"]
        target = [i for i, l in enumerate(lines) if label in l]
        if not cursor or not target:
            time.sleep(0.3)
            continue
        if cursor[0] == target[0]:
            box.suite.tmux("send-keys", "-t", box.tmux, "Enter")
            return True
        box.suite.tmux("send-keys", "-t", box.tmux, "Down" if target[0] > cursor[0] else "Up")
        time.sleep(0.3)
    return False


if __name__ == "__main__":
    sys.exit(e2e_box.main(ClaudePlugin()))
