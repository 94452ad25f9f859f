"""What the end-to-end scripts (.ci/e2e*.py) share: failing and skipping a
case, the one-line signal, tidy output, stopping a process group, and the
environment a harness is started in.  Standard library only."""

import hashlib
import os
import re
import signal
import subprocess

SIGNAL_RE = re.compile(r"agents-room: (\d+) unread messages? \(")


def drop_ci_markers():
    """A harness's TUI draws nothing when it sees a CI marker (Ink's is-in-ci:
    CI, CONTINUOUS_INTEGRATION or any CI_* variable); a user at a terminal has
    none, and tmux hands this process's environment to every pane."""
    for name in [k for k in os.environ if k in ("CI", "CONTINUOUS_INTEGRATION")
                 or k.startswith("CI_")]:
        del os.environ[name]


class Failure(Exception):
    pass


class Skip(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failure(message)


def one_line(text, width=150):
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[:width - 3] + "..."


def signal_line(text):
    lines = [line.strip() for line in text.splitlines() if SIGNAL_RE.search(line)]
    return lines[0] if lines else ""


def kill_group(proc):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except OSError:
            pass
        try:
            proc.wait(timeout=3)
            return
        except subprocess.TimeoutExpired:
            continue


def file_sha(path):
    """The first 12 hex digits of a file's sha256 (which agents_room.py ran)."""
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()[:12]
