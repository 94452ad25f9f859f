#!/usr/bin/env python3
"""The e2e runs' truth table: what works per harness and mode, as measured.

Each e2e script (.ci/e2e_<harness>.py, on .ci/e2e_box.py) calls row(...)
once per harness and mode it ran; that prints one line

    E2E-ROW {"harness": ..., "version": ..., "mode": ..., "digest": ..., ...}

on stdout.  `python3 .ci/e2e_report.py LOG...` reads those lines from the runs'
logs and prints the Markdown table the README's "What works, per harness and
mode" is pasted from, with the date.  A cell is "yes", "no" (tried, failed),
"n/a" (the harness cannot: the reason is in the note) or "-" (not run).
Standard library only.
"""

import json
import sys
import time

COLUMNS = ("digest", "signal", "hold", "wake")
PREFIX = "E2E-ROW "


def row(harness, version, mode, note="", latency=None, **cells):
    """Print one row: cells digest/signal/hold/wake as True, False, None (not
    run) or a string ("n/a"); latency: the wake's, in seconds."""
    item = {"harness": harness, "version": version, "mode": mode, "note": note,
            "latency": latency}
    for name in COLUMNS:
        value = cells.get(name)
        item[name] = "yes" if value is True else "no" if value is False else (
            value if isinstance(value, str) else "-")
    sys.stdout.write(PREFIX + json.dumps(item, sort_keys=True) + "\n")
    sys.stdout.flush()
    return item


def read(paths):
    rows = []
    for path in paths:
        with open(path, errors="replace") as handle:
            for line in handle:
                if line.startswith(PREFIX):
                    rows.append(json.loads(line[len(PREFIX):]))
    return rows


def table(rows):
    lines = ["| harness | version | mode | digest | signal | hold | wake | wake latency "
             "| note |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        latency = "%.1f s" % r["latency"] if isinstance(r.get("latency"), (int, float)) \
            else ""
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["harness"], r["version"], r["mode"], r["digest"], r["signal"], r["hold"],
            r["wake"], latency, r.get("note", "")))
    lines.append("")
    lines.append("Measured by `make e2e` on %s (real turns against .ci/mock_model.py)."
                 % time.strftime("%Y-%m-%d", time.gmtime()))
    return "\n".join(lines)


def main(argv):
    if not argv:
        sys.stderr.write("usage: e2e_report.py LOG [LOG...]\n")
        return 2
    rows = read(argv)
    sys.stdout.write(table(rows) + "\n")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
