# agents-room: `make test` is the suite (standard library only); `make interop`
# checks real MCP clients, installed into a throwaway venv and npm prefix.
PYTHON ?= python3
INTEROP_DIR ?= $(CURDIR)/.interop
INSPECTOR ?= @modelcontextprotocol/inspector@1.0.3
PY_CLIENTS ?= mcp==2.3.0 fastmcp==4.2.3

.PHONY: test interop bench bench-quick clean

test:
	$(PYTHON) test_agents_room.py

interop:
	rm -rf "$(INTEROP_DIR)"
	$(PYTHON) -m venv "$(INTEROP_DIR)/venv"
	"$(INTEROP_DIR)/venv/bin/pip" install --quiet --disable-pip-version-check $(PY_CLIENTS)
	npm install --silent --no-audit --no-fund --prefix "$(INTEROP_DIR)/npm" "$(INSPECTOR)"
	"$(INTEROP_DIR)/venv/bin/python" .ci/interop.py --inspector "$(INTEROP_DIR)/npm/node_modules/.bin/mcp-inspector"
	rm -rf "$(INTEROP_DIR)"

bench:
	$(PYTHON) agents_room.py bench

bench-quick:
	$(PYTHON) agents_room.py bench --quick

clean:
	rm -rf "$(INTEROP_DIR)" __pycache__
