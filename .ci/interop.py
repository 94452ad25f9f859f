"""Interop: agents_room.py serve against real third-party MCP clients.

Run by `make interop` inside a throwaway venv that has `mcp` and `fastmcp`;
the @modelcontextprotocol/inspector CLI path comes as --inspector.  Not part of
the core suite (which is standard library only).  Ends with 'N passed, N failed'.
"""

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile

import jsonschema
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "agents_room.py")
sys.path.insert(0, ROOT)
import agents_room  # noqa: E402  (the full output schemas, for lean answers too)
RESULTS = []


def field(obj, snake, camel):
    """mcp 2.x names fields in snake_case, 1.x in camelCase: read either."""
    return getattr(obj, snake) if hasattr(obj, snake) else getattr(obj, camel)


def check(name, condition, detail=""):
    RESULTS.append((name, bool(condition)))
    print("%s  %s%s" % ("ok  " if condition else "FAIL", name,
                        "" if condition else "  " + str(detail)[:2000]))


async def sdk_client(workdir, env, profile):
    """The official Python SDK: initialise, list, call every operation,
    validate structuredContent against each tool's outputSchema.  profile all:
    every tool by name; lean: the core tools by name, the rest through
    room_call, each answer validated against the full profile's schema."""
    tag = "sdk (%s)" % profile
    params = StdioServerParameters(command=sys.executable, args=[SCRIPT, "serve", "--tools",
                                                                 profile],
                                   env=env, cwd=workdir)
    full = {name: agents_room.shared_defs(t.output) for name, t in agents_room.TOOLS.items()
            if t.public}
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            check("%s: initialize" % tag, field(init, "server_info", "serverInfo").name ==
                  "agents-room", init)
            listed = await session.list_tools()
            tools = {t.name: t for t in listed.tools}
            if profile == "all":
                check("%s: every tool listed" % tag, set(tools) == set(full), sorted(tools))
            else:
                check("%s: the core tools and room_call listed" % tag,
                      "room_call" in tools and "msg_send" in tools and len(tools) < 12,
                      sorted(tools))
            for tool in tools.values():
                jsonschema.Draft202012Validator.check_schema(
                    field(tool, "input_schema", "inputSchema"))
                output = field(tool, "output_schema", "outputSchema")
                if output is not None:
                    jsonschema.Draft202012Validator.check_schema(output)
            check("%s: schemas are valid JSON Schema" % tag, True)

            async def call(name, **arguments):
                if name in tools:
                    result = await session.call_tool(name, arguments)
                else:
                    result = await session.call_tool("room_call", {"op": name,
                                                                   "args": arguments})
                ok = not field(result, "is_error", "isError")
                content = field(result, "structured_content", "structuredContent")
                if ok:
                    listed_schema = field(tools[name], "output_schema", "outputSchema") \
                        if name in tools else None
                    try:
                        jsonschema.validate(content, listed_schema or full[name])
                    except jsonschema.ValidationError as error:
                        ok, result = False, error
                check("%s: %s" % (tag, name), ok, result)
                return content if ok else None

            peer = subprocess.run(
                [sys.executable, SCRIPT, "join", "--room", "interop", "--label", "peer",
                 "--pid", str(os.getpid()), "--json"], env=env, cwd=workdir,
                capture_output=True, text=True)
            peer_id = json.loads(peer.stdout)["session_id"]
            me = await call("room_join", room="interop", label="sdk-" + profile,
                            extra_rooms=["team"])
            sid = me["session_id"]
            await call("room_who", session_id=sid)
            await call("room_set_autonomy_cap", room="team", autonomy="hold")
            await call("lease_claim", session_id=sid, path="file.txt", mode="shared")
            await call("lease_renew", session_id=sid, path="file.txt", ttl_s=120)
            await call("lease_check", session_id=sid, path="file.txt")
            await call("lease_guard", session_id=sid, resources=["file.txt", "db:x"])
            await call("lease_list", session_id=sid)
            await call("note_read", session_id=sid, path="file.txt")
            await call("drift_check", session_id=sid, path="file.txt")
            sent = await call("msg_send", session_id=sid, to=[peer_id, "tag:x"],
                              subject="hello", body="from the sdk")
            subprocess.run([sys.executable, SCRIPT, "send", "--session", peer_id, "--to",
                            sid, "--subject", "back"], env=env, cwd=workdir, check=True,
                           capture_output=True)
            await call("msg_unread", session_id=sid)
            got = await call("msg_recv", session_id=sid)
            await call("msg_ack", session_id=sid, message_id=got["messages"][0]["message_id"])
            await call("msg_get", session_id=sid, message_id=got["messages"][0]["message_id"])
            await call("msg_thread", session_id=sid,
                       message_id=got["messages"][0]["message_id"])
            await call("msg_sent", session_id=sid)
            await call("room_history", session_id=sid, room="interop")
            await call("room_history", session_id=sid, query="hello")
            task = await call("task", session_id=sid, action="add", title="interop task")
            await call("task", session_id=sid, action="list")
            await call("lease_release", session_id=sid, path="file.txt")
            await call("work_set", session_id=sid, state="started", scope="interop")
            window = await call("window_request", session_id=sid, resources=["db:main"],
                                purpose="migrate", require=peer_id)
            await call("window_ack", session_id=peer_id, window_id=window["window_id"])
            await call("window_activate", session_id=sid, window_id=window["window_id"])
            await call("window_status", window_id=window["window_id"])
            await call("room_status", room="interop")
            await call("window_release", session_id=sid, window_id=window["window_id"])
            second = await call("window_request", session_id=sid, resources=["db:x"],
                                purpose="p")
            await call("window_cancel", session_id=sid, window_id=second["window_id"])
            watch = await call("notify_when", session_id=sid, on="gone", of=peer_id)
            check("%s: a watch of a live peer waits" % tag, watch and watch["watches"],
                  watch)
            if watch and watch["watches"]:
                await call("notify_cancel", session_id=sid,
                           watch_id=watch["watches"][0]["watch_id"])
            oops = await call("msg_send", session_id=sid, to=["tag:nobody"], subject="oops")
            if oops:
                await call("wake_cancel", session_id=sid, message_id=oops["message_id"])
                await call("msg_retract", session_id=sid, message_id=oops["message_id"])
            await call("room_leave_room", session_id=sid, room="team")
            await call("room_leave", session_id=sid)
            check("%s: message reached the CLI peer" % tag, sent and sent["recipients"] == 1,
                  sent)
            called = {name for name, _ in RESULTS if name.startswith(tag + ": ")}
            wanted = {"%s: %s" % (tag, t) for t in full}
            check("%s: every operation called" % tag, wanted <= called, sorted(wanted - called))
            bad = await session.call_tool("msg_recv", {"session_id": "nope"})
            check("%s: unknown session is isError" % tag, field(bad, "is_error", "isError")
                  and "not a session id" in bad.content[0].text, bad)


def fastmcp_cli(workdir, env, fastmcp):
    # These clients start the server with a filtered environment (no
    # AGENTS_ROOM_DB): HOME points the default store into the work directory.
    env = dict(env, HOME=workdir)
    command = "%s %s serve" % (sys.executable, SCRIPT)
    listed = subprocess.run([fastmcp, "list", "--command", command, "--json"], env=env,
                            cwd=workdir, capture_output=True, text=True, timeout=120)
    check("fastmcp list", listed.returncode == 0 and "room_join" in listed.stdout,
          listed.stderr or listed.stdout)
    called = subprocess.run([fastmcp, "call", "--command", command, "--target", "room_join",
                             "--input-json", json.dumps({"label": "fastmcp",
                                                         "room": "interop"}),
                             "--json"], env=env,
                            cwd=workdir, capture_output=True, text=True, timeout=120)
    check("fastmcp call room_join", called.returncode == 0 and "session_id" in
          called.stdout, called.stderr or called.stdout)


def inspector_cli(workdir, env, inspector):
    env = dict(env, HOME=workdir)
    base = [inspector, "--cli", sys.executable, SCRIPT, "serve"]
    for profile, wanted in (("lean", lambda names: "room_call" in names and len(names) < 12),
                            ("all", lambda names: len(names) >= 30)):
        listed = subprocess.run(base + ["--tools", profile, "--method", "tools/list"],
                                env=env, cwd=workdir, capture_output=True, text=True,
                                timeout=120)
        ok = listed.returncode == 0
        tools = json.loads(listed.stdout[listed.stdout.index("{"):])["tools"] if ok else []
        check("inspector tools/list (%s)" % profile, wanted([t["name"] for t in tools]),
              listed.stderr or listed.stdout)
    called = subprocess.run(base + ["--method", "tools/call", "--tool-name", "room_join",
                                    "--tool-arg", "label=inspector", "--tool-arg",
                                    "room=interop"], env=env, cwd=workdir,
                            capture_output=True, text=True, timeout=120)
    ok = called.returncode == 0 and '"isError": false' in called.stdout
    check("inspector tools/call room_join", ok, called.stderr or called.stdout)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--inspector", required=True)
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="agents-room-interop-")
    with open(os.path.join(workdir, "file.txt"), "w") as handle:
        handle.write("shared file\n")
    env = dict(os.environ, AGENTS_ROOM_DB=os.path.join(workdir, "store", "room.db"))
    for var in ("AGENTS_ROOM_HARNESS_KEY", "CLAUDE_CODE_SESSION_ID", "CODEX_THREAD_ID",
                "HERMES_SESSION_ID", "AGENTS_ROOM_SESSION"):
        env.pop(var, None)
    for profile in ("all", "lean"):
        asyncio.run(sdk_client(workdir, env, profile))
    fastmcp_cli(workdir, env, os.path.join(os.path.dirname(sys.executable), "fastmcp"))
    inspector_cli(workdir, env, args.inspector)
    failed = sum(1 for _, ok in RESULTS if not ok)
    print("%d passed, %d failed" % (len(RESULTS) - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
