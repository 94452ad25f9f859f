#!/usr/bin/env python3
"""End-to-end: agents-room under a real Qwen Code (qwen -p and the TUI), offline.
The framework, its options and the common runs: .ci/e2e_box.py.

    make e2e-qwen         # installs the pinned @qwen-code/qwen-code, runs this, cleans up
    python3 .ci/e2e_qwen.py --bin DIR [--only NAME[,NAME...]] [--list] [--keep]
                            [--jobs 1|2] [-v]

Modes: qwen-p (`qwen -p PROMPT -o json`), qwen-tui (interactive `qwen` in tmux).
Besides setup's files the box writes only what is about the mock model:
~/.qwen/.env (OPENAI_BASE_URL/API_KEY/MODEL pointing at 127.0.0.1) and
~/.qwen/settings.json (auth type openai, the model name, auto-update,
telemetry and usage statistics off, and the extra model calls off: managed
memory, auto-dream, auto-skill, follow-up suggestions).  Qwen's own: a request
whose only tool is respond_in_schema is its auto-mode permission classifier,
not the agent (b-mcp-session checks none was made: permissions.allow is
right); its inbox socket ($XDG_RUNTIME_DIR/qwen-socks/<pid>.sock) wakes the
TUI (lever qwen-socket); a finished -p session is resumed (lever qwen-resume:
qwen --resume KEY -p SIGNAL); qwen -p fires no SessionEnd (0.24.4), the TUI
does at /quit; its shell tool needs --approval-mode yolo (the doctor run alone).
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_box  # noqa: E402
import mock_model  # noqa: E402
from e2e_box import Call, check  # noqa: E402


class QwenRequest(mock_model.GeminiRequest):
    """A request whose only tool is respond_in_schema is the auto-mode
    permission classifier, not the agent's own conversation."""

    @property
    def is_classifier(self):
        return self.is_model_call and self.tool_names() == ["respond_in_schema"]

    @property
    def is_main(self):
        return mock_model.GeminiRequest.is_main.fget(self) and not self.is_classifier


class Qwen(e2e_box.Harness):
    name = "qwen"
    title = "qwen-code"
    program = "qwen"
    request_class = QwenRequest
    modes = {"qwen-p": "oneshot", "qwen-tui": "tui"}
    labels = {"qwen-p": "qwen -p", "qwen-tui": "qwen (TUI)"}
    notes = {"qwen-p": "no inbox in -p: a finished session is resumed (qwen --resume -p)",
             "qwen-tui": "woken through its cross-session inbox (its own child token); "
                         "the TUI shows a hold as 'Stop hook error'"}
    levers = {"qwen-p": "qwen-resume", "qwen-tui": "qwen-socket"}
    ready = "Type your message"
    yolo_args = ("--approval-mode", "yolo")
    requires = ("git", "node")

    def configure(self, box):
        qwen = os.path.join(box.home, ".qwen")
        os.makedirs(qwen, exist_ok=True)
        with open(os.path.join(qwen, ".env"), "w") as handle:
            handle.write("OPENAI_BASE_URL=%s/v1\nOPENAI_API_KEY=sk-e2e-mock\n"
                         "OPENAI_MODEL=mock-model\n" % box.mock.url)
        settings = {
            "security": {"auth": {"selectedType": "openai"}},
            "model": {"name": "mock-model"},
            "general": {"enableAutoUpdate": False},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            # Each of these makes model calls of its own (after a turn) that a
            # scripted mock would take for the agent's next step.
            "memory": {"enableManagedAutoMemory": False, "enableManagedAutoDream": False,
                       "enableAutoSkill": False},
            "ui": {"enableFollowupSuggestions": False},
        }
        with open(os.path.join(qwen, "settings.json"), "w") as handle:
            json.dump(settings, handle, indent=2)

    def oneshot_argv(self, box, prompt, resume=None, yolo=False):
        return ([self.program, "-p", prompt, "-o", "json"]
                + (["--resume", resume] if resume else [])
                + (list(self.yolo_args) if yolo else []))

    def run_id(self, out):
        """The session id in `qwen -p -o json`'s result item (an array of events)."""
        try:
            items = json.loads(out)
        except ValueError:
            return None
        for item in items if isinstance(items, list) else [items]:
            if isinstance(item, dict) and item.get("type") == "result":
                return item.get("session_id")
        return None

    def read_call(self, box):
        return Call("read_file", {"file_path": os.path.join(box.repo, "README")})

    def shell_call(self, command):
        return Call("run_shell_command", {"command": command,
                                          "description": "agents-room doctor"})

    def checks_after_mcp(self, box):
        with box.mock.lock:
            classifier = [r for r in box.mock.requests if r.is_classifier]
        check(not classifier, "our tool calls went to the auto-mode classifier (%d "
              "requests): permissions.allow missing?" % len(classifier))


if __name__ == "__main__":
    sys.exit(e2e_box.main(Qwen()))
