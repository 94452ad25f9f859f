#!/usr/bin/env python3
"""Each harness's e2e pin beside its newest release, from the registries.

    python3 .ci/pins.py

CI runs this (it reaches the registries); a release newer than a pin is one
the end-to-end runs have not met yet (`make e2e-latest` runs the same cases on
it), and `doctor` says the same to a user running it.  The pins are the
Makefile's; agents_room.py's adapters keep the same versions as `tested` (a
unit test holds them equal).  Asks npm (`npm view PKG version`) and pip (`pip
index versions PKG`), their ordinary clients, once per harness.  Prints one line
each; always exits 0: a new release is news, not a failure.
"""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import agents_room  # noqa: E402

# The package each harness is installed from, and its registry.
PACKAGES = {"claude-code": ("npm", "@anthropic-ai/claude-code"),
            "codex": ("npm", "@openai/codex"),
            "hermes": ("pypi", "hermes-agent"),
            "qwen-code": ("npm", "@qwen-code/qwen-code"),
            "gemini": ("npm", "@google/gemini-cli"),
            "pi": ("npm", "@earendil-works/pi-coding-agent"),
            "opencode": ("npm", "opencode-ai"),
            "kilo": ("npm", "@kilocode/cli"),
            "copilot": ("npm", "@github/copilot")}


def newest(registry, package):
    argv = (["npm", "view", package, "version"] if registry == "npm" else
            [sys.executable, "-m", "pip", "index", "versions", package,
             "--disable-pip-version-check"])
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        return None, str(error)
    found = re.search(r"\d+(?:\.\d+)+", done.stdout)
    if done.returncode != 0 or not found:
        return None, (done.stderr.strip().splitlines() or ["no version"])[-1][:120]
    return found.group(0), None


def key(version):
    return tuple(int(x) for x in version.split("."))


def main():
    with open(os.path.join(ROOT, "Makefile")) as handle:
        makefile = handle.read()
    for adapter in agents_room.HARNESS_ADAPTERS:
        if adapter.name not in PACKAGES:
            continue
        registry, package = PACKAGES[adapter.name]
        pin = re.search(re.escape(package) + r"(?:\[\w+\])?(?:@|==)(\d+(?:\.\d+)+)", makefile)
        pin = pin.group(1) if pin else "?"
        latest, why = newest(registry, package)
        if latest is None:
            said = "newest unknown (%s)" % why
        elif pin != "?" and key(latest) > key(pin):
            said = "newest %s: NEWER than the pin, untested (make e2e-latest)" % latest
        else:
            said = "newest %s" % latest
        print("pin %-12s %-9s %s%s" % (adapter.name, pin, said,
                                        "" if pin == adapter.tested else
                                        "; agents_room.py's table says %s" % adapter.tested))
    return 0


if __name__ == "__main__":
    sys.exit(main())
