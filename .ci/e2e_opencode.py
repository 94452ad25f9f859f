#!/usr/bin/env python3
"""End-to-end: agents-room under a real OpenCode (npm opencode-ai: opencode run
and the TUI), offline, against .ci/mock_model.py; .ci/e2e_kilo.py runs the same
for its fork Kilo Code.  The framework, its options and the common runs:
.ci/e2e_box.py.

    make e2e-opencode     # installs the pinned opencode-ai, runs this, cleans up
    python3 .ci/e2e_opencode.py --bin DIR [--only NAME[,NAME...]] [--list] [--keep]
                                [--jobs 1|2] [-v]

setup opencode writes opencode.json (the MCP entry and `permission:
agents-room_* allow`) and .opencode/plugin/agents-room.js (the plugin that runs
the hooks and the rewake waiter).  What the box writes besides is about the mock
only: $XDG_CONFIG_HOME/opencode/opencode.json (a provider `mock`,
@ai-sdk/openai-compatible, bundled, at the mock's URL, as model and
small_model; autoupdate off, share disabled), OPENCODE_DISABLE_AUTOUPDATE /
_MODELS_FETCH / _LSP_DOWNLOAD, an npm registry at a closed port, and a speed-up:
OpenCode makes the first start with a plugin wait for its own `npm install
@opencode-ai/plugin` in each config directory (20 s online, 70 s of retries
offline), so the box seeds ~/.config/opencode and .opencode with an empty
node_modules/ and a package-lock.json listing that package (OpenCode's own
"already installed" test; the plugin imports nothing from it).  OpenCode takes
its project from $PWD.  Modes: run (`opencode run MESSAGE`) and tui.  Its own:
the TUI has no agents-room session before its first prompt (the plugin learns
of one at its first message: e0, a SKIP that says so), and is woken after a
turn by the plugin's rewake waiter (e-wake/tui); `opencode run` exits when idle
and a send resumes it (lever opencode-resume: opencode run --session;
e-wake/run); e-wake-send: right after the send the sender sees offered or
accepted, and the send's wake plan printed nothing.  The room run is at
autonomy 2, so h-exit sees the TUI's armed waiter end with it; a hold leaves
no "error" on the TUI's screen.
"""

import json
import os
import sqlite3
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_box  # noqa: E402
from e2e_box import Call, Case, Reply, Skip, check, one_line  # noqa: E402


def run_wake_tui(box, step):
    """No session before the first prompt; after a turn the plugin's waiter wakes it."""
    state = {"prefix": box.harness.prefix}
    box.play(e2e_box._wake_script(state))
    box.tui_start()

    def before_prompt():
        time.sleep(2.0)
        found = box.sessions()
        raise Skip("%s has no agents-room session before its first prompt (the plugin "
                   "learns of a session at its first message): nothing to address or wake"
                   % box.harness.label if not found else
                   "a session exists before the first prompt: %s"
                   % [s["session_id"] for s in found])
    step("e0-wake-before-first-prompt", before_prompt)

    def after_turn():
        box.tui_send("first task")
        calls = box.wait_quiet(1, quiet=1.5)
        check(calls and calls[0].session_id(), "no digest reached the model")
        state["sid"] = sid = calls[0].session_id()
        check(waiter_armed(box, 15 + box.harness.cold), "no rewake waiter armed after the "
              "turn (processes: %s)" % list(box.marked().values())[:4])
        before = len(box.mock.model_calls())
        sent_at = time.time()
        sent = box.send(sid)
        at_send = state["at_send"] = box.states(sent["message_id"])
        bound = 30 + box.harness.cold
        woke = box.mock.wait_for(lambda calls: len(calls) > before and calls[before], bound)
        check(woke is not None, "no turn started within %d s of the send (delivery %s)"
              % (bound, box.states()))
        latency = woke.at - sent_at
        box.suite.latency["e-wake/" + box.mode] = latency
        check(e2e_box.SIGNAL_RE.search(e2e_box.last_message_text(woke)),
              "the woken turn does not carry the signal")
        check(not e2e_box.secrets_shown([woke]), "subject/body rode the wake")
        check(at_send in (["offered"], ["accepted"], ["read"]),
              "right after the send the peer saw %s" % at_send)
        box.wait_quiet(before + 2, quiet=1.5, timeout=30)
        final = box.states(sent["message_id"])
        check(final == ["read"], "after msg_recv the peer saw %s" % final)
        check(len(box.sessions()) == 1, "`who` lists %d sessions after the wake"
              % len(box.sessions()))
        return "the waiter woke it in %.2f s; states %s -> %s" % (latency, at_send, final)
    step("e-wake", after_turn)
    step("e-wake-send", lambda: send_view(box, state))
    box.end()


def run_wake_run(box, step):
    """`opencode run` exits when idle: a send resumes the finished session."""
    state = {"prefix": box.harness.prefix}
    woken = e2e_box._wake_script(state)

    def script(req):
        if state.get("phase") == "woken":
            return woken(req)
        state.setdefault("sid", req.session_id())
        return Reply(text="done-first")
    box.play(script)
    run = box.oneshot("first")

    def wake():
        check(not run["hung"] and run["rc"] == 0, "the first run failed%s"
              % e2e_box.run_hint(run))
        return e2e_box.resume_wake(box, state, row="e-wake")
    step("e-wake", wake)
    step("e-wake-send", lambda: send_view(box, state))


def send_view(box, state):
    """The send runs the wake plan after its commit: an error there is only
    printed (the send succeeds) and the delivery waits for the waiter's next
    poll; a row of its own, beside the wake."""
    at_send = state.get("at_send")
    check(at_send is not None, "no send to a session")
    said = box.sent_stderr.strip()
    # read: the woken turn read it before the sender looked (a fast wake)
    check(at_send in (["offered"], ["accepted"], ["read"]) and not said,
          "the sender's view right after the send: %s; its stderr %r"
          % (at_send, one_line(said, 200)))
    return "right after the send: %s, the send's wake plan ran clean" % at_send


def run_doctor(box, step):
    """The common doctor run; a finished run's wake is e-wake/run's own case."""
    e2e_box.run_doctor(box, lambda row, fn: row == "e3-wake-finished" or step(row, fn))


def waiter_armed(box, timeout):
    """The plugin's rewake waiter (hook --event=Stop --wait) runs and the store
    has it as a session's armed waiter."""
    end = time.time() + timeout
    while time.time() < end:
        running = [pid for pid, argv in box.marked().items()
                   if "--event=Stop" in argv and "--wait" in argv]
        conn = sqlite3.connect("file:%s?mode=ro" % box.db, uri=True, timeout=5)
        try:
            armed = {r[0] for r in conn.execute(
                "SELECT waiter_pid FROM sessions WHERE waiter_pid IS NOT NULL")}
        except sqlite3.Error:
            armed = set()
        finally:
            conn.close()
        if any(pid in armed for pid in running):
            return True
        time.sleep(0.3)
    return False


class OpenCode(e2e_box.Harness):
    name = "opencode"
    title = "opencode"
    label = "OpenCode"
    program = "opencode"
    env_prefix = "OPENCODE_"
    config_name = "opencode.json"
    project_dir = ".opencode"
    schema = "https://opencode.ai/config.json"
    plugin = "@opencode-ai/plugin"
    offline = {}
    config = {}
    modes = {"run": "oneshot", "tui": "tui"}
    levers = {"run": "opencode-resume", "tui": "opencode-resume"}
    prefix = "agents-room_"
    ready = "Ask anything"
    quit_keys = ("/exit",)
    oneshot_session_end = True
    # Its TUI's MCP calls took over 12 s each at a load of 25 on two cores.
    settle = 45.0
    hold_screen_errors = ("error",)
    requires = ("git", "tmux")

    @property
    def labels(self):
        return {"run": self.program + " run", "tui": self.program + " (TUI)"}

    @property
    def notes(self):
        return {"run": "run exits when idle: a wake resumes it (%s run --session)"
                       % self.program,
                "tui": "the plugin's waiter; no session before the first prompt"}

    @property
    def who_harness(self):
        return self.name

    def cases(self):
        common = {c.name: c for c in e2e_box.COMMON}
        room = common["room"]
        return [Case("room", 2, room.function, room.rows), common["signal"], common["hold"],
                Case("wake", 2, run_wake_tui, ("e0-wake-before-first-prompt", "e-wake",
                                                "e-wake-send"), modes=("tui",)),
                Case("wake-run", 2, run_wake_run, ("e-wake", "e-wake-send"),
                     modes=("oneshot",)),
                Case("doctor", 2, run_doctor, ("g-doctor",))]

    def env(self, box):
        env = {self.env_prefix + "DISABLE_AUTOUPDATE": "1",
               self.env_prefix + "DISABLE_MODELS_FETCH": "1",
               self.env_prefix + "DISABLE_LSP_DOWNLOAD": "1",
               "npm_config_registry": e2e_box.CLOSED + "/", "PWD": box.repo}
        env.update(self.offline)
        return env

    def configure(self, box):
        config = {
            "$schema": self.schema, "autoupdate": False, "share": "disabled",
            "model": "mock/mock-model", "small_model": "mock/mock-model",
            "provider": {"mock": {
                "npm": "@ai-sdk/openai-compatible", "name": "Mock",
                "options": {"baseURL": box.mock.url + "/v1", "apiKey": "sk-mock"},
                "models": {"mock-model": {"name": "Mock Model", "tool_call": True,
                                          "limit": {"context": 200000, "output": 8192}}}}}}
        config.update(self.config)
        where = os.path.join(box.env["XDG_CONFIG_HOME"], self.name)
        os.makedirs(where, exist_ok=True)
        with open(os.path.join(where, self.config_name), "w") as handle:
            json.dump(config, handle, indent=2)

    def trust(self, box):
        """No trust step; the plugin-install speed-up (see the docstring)."""
        lock = {"packages": {"": {"dependencies": {self.plugin: box.suite.version}}}}
        for where in (os.path.join(box.env["XDG_CONFIG_HOME"], self.name),
                      os.path.join(box.repo, self.project_dir)):
            os.makedirs(os.path.join(where, "node_modules"), exist_ok=True)
            with open(os.path.join(where, "package-lock.json"), "w") as handle:
                json.dump(lock, handle)

    def busy(self, box):
        return "esc interrupt" in box.suite.tmux("capture-pane", "-p", "-t", box.tmux,
                                                 check=False)

    def oneshot_argv(self, box, prompt, resume=None, yolo=False):
        return [self.program, "run", "--print-logs"] + (
            ["--session", resume] if resume else []) + [prompt]

    def resume_key(self, box, run, sid):
        """OpenCode's own session id (ses_...): it sends it to the model API."""
        calls = box.mock.model_calls()
        return calls[0].headers.get("x-session-id") if calls else None

    def read_call(self, box):
        return Call("bash", {"command": "true", "description": "e2e step"})

    def shell_call(self, command):
        return Call("bash", {"command": command, "description": "agents-room doctor"})

    @property
    def version_env(self):
        return {self.env_prefix + "DISABLE_AUTOUPDATE": "1"}


if __name__ == "__main__":
    sys.exit(e2e_box.main(OpenCode()))
