#!/usr/bin/env python3
"""A local, scripted stand-in for two model APIs, for the e2e runs (.ci/e2e_box.py).

Standard library only: http.server in a thread, on 127.0.0.1.

  * Anthropic Messages API (Claude Code: ANTHROPIC_BASE_URL=http://127.0.0.1:PORT):
    POST /v1/messages (SSE when "stream": true, JSON otherwise),
    POST /v1/messages/count_tokens.
  * OpenAI Responses API (Codex: a model_provider with base_url .../v1 and
    wire_api = "responses"): POST /v1/responses (SSE), GET /v1/models.
  * OpenAI Chat Completions (Qwen Code, OpenCode, Pi, Hermes: a base URL
    http://127.0.0.1:PORT/v1): POST /v1/chat/completions (SSE when "stream": true).
  * Gemini API (Gemini CLI: GOOGLE_GEMINI_BASE_URL=http://127.0.0.1:PORT):
    POST /v1beta/models/M:streamGenerateContent?alt=sse (SSE), :generateContent
    (its JSON utility calls get a value built from their schema), :countTokens.
  * Anything else: 200 with an empty JSON object (and recorded), so auxiliary
    calls a harness makes never hang it.

Every request is recorded (path, headers, parsed body, time), so a test asserts
on what the model was shown.  Answers come from a script: a callable
`script(req) -> Reply | None` set per run (None: the default, a short text).
`req` is a Request with helpers to find the text the model was shown, the
agents-room session id in it, and tool results.

A Reply is text and/or tool calls:
    Reply(text="done")
    Reply(calls=[Call("mcp__agents-room__msg_recv", {"session_id": sid})])
The mock turns a Call into the harness's wire shape: a tool_use block for
Anthropic; for Responses a function_call item (with "namespace" when the tool
the harness offered lives in a namespace, as Codex offers MCP tools).

MockModel(require_offered=True): a scripted call of a tool that the request did
not offer is not sent; the reply is a text saying so, and the refusal is kept
in mock.problems (a harness whose MCP server was not up in time, or that
deferred its tools, shows as that and not as a confusing tool error).

Run standalone for manual poking:  python3 .ci/mock_model.py --port 8765
(prints each request's path and the last user text; answers "ok").
"""

import argparse
import json
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SESSION_RE = re.compile(r"your session_id is ([0-9a-f]{16})")


class Call:
    def __init__(self, name, args=None, namespace=None):
        if namespace is None and "/" in name:      # "ns/name", as tool_names() lists it
            namespace, name = name.rsplit("/", 1)
        self.name = name
        self.args = args or {}
        self.namespace = namespace  # Responses only; found from the tools if None

    def __repr__(self):
        return "Call(%r, %r)" % (self.name, self.args)


class Reply:
    def __init__(self, text=None, calls=None, delay=0.0):
        self.text = text
        self.calls = list(calls or [])
        self.delay = delay


def _texts(value):
    """Every string inside a JSON value (depth first)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _texts(item)


class Request:
    """One recorded request."""

    def __init__(self, index, method, path, headers, body, raw):
        self.index = index
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body if isinstance(body, dict) else {}
        self.raw = raw
        self.at = time.time()

    # -- which API, which kind of request
    @property
    def api(self):
        if "/messages" in self.path:
            return "anthropic"
        if "/responses" in self.path:
            return "responses"
        if "/chat/completions" in self.path:
            return "chat"
        return "other"

    @property
    def is_model_call(self):
        return self.method == "POST" and (
            self.path.split("?")[0].endswith("/messages")
            or self.path.split("?")[0].endswith("/responses")
            or self.path.split("?")[0].endswith("/chat/completions"))

    def tool_names(self):
        """Flat tool names offered.  Responses namespaces -> 'ns/name'."""
        names = []
        for tool in self.body.get("tools") or []:
            if not isinstance(tool, dict):
                continue
            if tool.get("type") == "function" and isinstance(tool.get("function"), dict):
                names.append(tool["function"].get("name"))
            elif tool.get("type") == "namespace" or "tools" in tool and tool.get("name"):
                for inner in tool.get("tools") or []:
                    names.append("%s/%s" % (tool.get("name"), inner.get("name")))
            elif tool.get("name"):
                names.append(tool["name"])
        return names

    @property
    def is_main(self):
        """The agent's own conversation (offers tools), not a title/quota call."""
        return self.is_model_call and bool(self.body.get("tools"))

    # -- what the model saw
    def messages(self):
        """Anthropic messages or Responses input items."""
        if self.api in ("anthropic", "chat"):
            return self.body.get("messages") or []
        return self.body.get("input") or []

    def all_text(self):
        """Every text the model was shown: the system prompt and every item of
        the conversation, whatever its role (Claude Code 2.1.332 puts hook
        context in role "system" messages inside `messages`)."""
        parts = list(_texts(self.body.get("system") or self.body.get("instructions") or ""))
        parts += list(_texts(self.messages()))
        return "\n".join(parts)

    def session_id(self):
        found = SESSION_RE.findall(self.all_text())
        return found[0] if found else None

    def last_role(self):
        msgs = self.messages()
        for item in reversed(msgs):
            if isinstance(item, dict) and item.get("role"):
                return item["role"]
            if isinstance(item, dict) and item.get("type", "").endswith("_output"):
                return "tool"
        return None

    def tool_results(self):
        """[(call id, text)] of tool results in the conversation, oldest first."""
        out = []
        for item in self.messages():
            if not isinstance(item, dict):
                continue
            if self.api == "anthropic":
                content = item.get("content")
                if isinstance(content, list):
                    for block in content:
                        if isinstance(block, dict) and block.get("type") == "tool_result":
                            out.append((block.get("tool_use_id"),
                                        "\n".join(_texts(block.get("content")))))
            elif self.api == "chat":
                if item.get("role") == "tool":
                    out.append((item.get("tool_call_id"), "\n".join(_texts(item.get("content")))))
            elif item.get("type") in ("function_call_output", "custom_tool_call_output"):
                out.append((item.get("call_id"), "\n".join(_texts(item.get("output")))))
        return out

    def count_assistant_turns(self):
        n = 0
        for item in self.messages():
            if isinstance(item, dict) and item.get("role") == "assistant":
                n += 1
            elif isinstance(item, dict) and item.get("type") in ("function_call",
                                                                  "custom_tool_call"):
                n += 1
        return n

    def user_texts(self):
        """Texts of user-role content, in order (each block separately)."""
        out = []
        for item in self.messages():
            if not isinstance(item, dict) or item.get("role") != "user":
                continue
            content = item.get("content")
            if isinstance(content, str):
                out.append(content)
            elif isinstance(content, list):
                for block in content:
                    if isinstance(block, dict):
                        if block.get("type") in ("text", "input_text") or (
                                "text" in block and "type" not in block):
                            out.append(block.get("text", ""))
                        elif block.get("type") == "tool_result":
                            out.append("\n".join(_texts(block.get("content"))))
        return out

    def to_json(self):
        return {"index": self.index, "at": self.at, "method": self.method,
                "path": self.path, "headers": self.headers, "body": self.body
                if self.body else self.raw}


def _is_gemini(path):
    return ":generateContent" in path or ":streamGenerateContent" in path


class GeminiRequest(Request):
    """Request helpers for the Gemini API shape (merge: add a branch on
    self.api == "gemini" in Request's methods)."""

    @property
    def api(self):
        if _is_gemini(self.path) or ":countTokens" in self.path:
            return "gemini"
        return Request.api.fget(self)

    @property
    def is_model_call(self):
        if _is_gemini(self.path):
            return self.method == "POST"
        return Request.is_model_call.fget(self)

    @property
    def model(self):
        part = self.path.split("?")[0].rsplit("/", 1)[-1]
        return part.split(":")[0]

    @property
    def streaming(self):
        return ":streamGenerateContent" in self.path

    def tool_names(self):
        if self.api != "gemini":
            return Request.tool_names(self)
        names = []
        for tool in self.body.get("tools") or []:
            for decl in (tool or {}).get("functionDeclarations") or []:
                if decl.get("name"):
                    names.append(decl["name"])
        return names

    @property
    def is_main(self):
        if self.api != "gemini":
            return Request.is_main.fget(self)
        # The agent's own loop offers function declarations; the router,
        # next-speaker, loop-detection and summary calls offer none.
        return self.is_model_call and bool(self.tool_names())

    def messages(self):
        if self.api != "gemini":
            return Request.messages(self)
        return self.body.get("contents") or []

    def all_text(self):
        if self.api != "gemini":
            return Request.all_text(self)
        parts = list(_texts(self.body.get("systemInstruction") or ""))
        parts += list(_texts(self.messages()))
        return "\n".join(parts)

    def last_role(self):
        if self.api != "gemini":
            return Request.last_role(self)
        msgs = self.messages()
        if not msgs:
            return None
        last = msgs[-1]
        if any("functionResponse" in p for p in last.get("parts") or []):
            return "tool"
        return last.get("role")

    def tool_results(self):
        if self.api != "gemini":
            return Request.tool_results(self)
        out = []
        for item in self.messages():
            for part in item.get("parts") or []:
                fr = part.get("functionResponse") if isinstance(part, dict) else None
                if fr:
                    out.append((fr.get("id") or fr.get("name"),
                                "\n".join(_texts(fr.get("response")))))
        return out

    def count_assistant_turns(self):
        if self.api != "gemini":
            return Request.count_assistant_turns(self)
        return sum(1 for m in self.messages() if m.get("role") == "model")

    def user_texts(self):
        if self.api != "gemini":
            return Request.user_texts(self)
        out = []
        for item in self.messages():
            if item.get("role") != "user":
                continue
            for part in item.get("parts") or []:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    out.append(part["text"])
                elif isinstance(part, dict) and part.get("functionResponse"):
                    out.append("\n".join(_texts(part["functionResponse"].get("response"))))
        return out


def _fill_schema(schema, text):
    """A JSON value matching a responseJsonSchema / responseSchema: utility
    calls (router, next-speaker, loop check) get a harmless answer."""
    kind = (schema or {}).get("type")
    if isinstance(kind, str):
        kind = kind.lower()
    if kind == "object" or "properties" in (schema or {}):
        out = {}
        for name, sub in (schema.get("properties") or {}).items():
            if name == "next_speaker":
                out[name] = "user"            # never let it auto-continue
            elif name == "model_choice":
                out[name] = "flash"
            elif name in ("is_stuck", "is_loop"):
                out[name] = False
            elif name == "confidence" or name.endswith("_confidence"):
                out[name] = 0.0
            else:
                out[name] = _fill_schema(sub, text)
        return out
    if kind == "array":
        return []
    if kind in ("number", "integer"):
        return (schema or {}).get("minimum", 1)   # router: complexity_score 1..100
    if kind == "boolean":
        return False
    enum = (schema or {}).get("enum")
    if enum:
        return enum[0]
    return text


class MockModel:
    def __init__(self, script=None, log=None, require_offered=False):
        self.script = script
        self.requests = []
        self.require_offered = require_offered
        self.problems = []
        self.lock = threading.Lock()
        self.log = log
        self.server = None
        self.thread = None
        self.changed = threading.Condition(self.lock)

    # -- lifecycle
    def start(self, port=0):
        mock = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _body(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                if self.headers.get("Content-Encoding") == "zstd" or \
                        self.headers.get("Content-Encoding") == "gzip":
                    try:
                        import gzip
                        raw = gzip.decompress(raw)
                    except Exception:
                        pass
                try:
                    return raw, json.loads(raw.decode("utf-8")) if raw else {}
                except ValueError:
                    return raw, None

            def do_GET(self):
                mock._handle(self, "GET", b"", None)

            def do_POST(self):
                raw, body = self._body()
                mock._handle(self, "POST", raw, body)

            def do_HEAD(self):
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    @property
    def port(self):
        return self.server.server_address[1]

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def stop(self):
        if self.server:
            self.server.shutdown()
            self.server.server_close()

    # -- queries for tests
    def reset(self, script=None):
        with self.lock:
            self.requests = []
            self.problems = []
            self.script = script

    def model_calls(self, main_only=True):
        with self.lock:
            return [r for r in self.requests if r.is_model_call and (r.is_main or not main_only)]

    def wait_for(self, predicate, timeout):
        """Wait until predicate(list of main model calls) is truthy; returns it."""
        end = time.time() + timeout
        with self.lock:
            while True:
                calls = [r for r in self.requests if r.is_main]
                value = predicate(calls)
                if value:
                    return value
                left = end - time.time()
                if left <= 0:
                    return None
                self.changed.wait(min(left, 1.0))

    def dump(self, path):
        with self.lock:
            data = [r.to_json() for r in self.requests]
        with open(path, "w") as handle:
            json.dump(data, handle, indent=1, default=str)

    # -- the server side
    def _record(self, method, path, headers, body, raw):
        with self.lock:
            req = GeminiRequest(len(self.requests), method, path, headers, body,
                          raw.decode("utf-8", "replace") if body is None else None)
            self.requests.append(req)
            self.changed.notify_all()
        if self.log:
            self.log("mock: %s %s%s" % (method, path, " (main)" if req.is_main else ""))
        return req

    def _handle(self, handler, method, raw, body):
        keep = {k.lower(): v for k, v in handler.headers.items()
                if k.lower() not in ("authorization", "x-api-key", "x-goog-api-key", "cookie")}
        req = self._record(method, handler.path, keep, body, raw)
        path = handler.path.split("?")[0]
        try:
            if _is_gemini(path) or ":countTokens" in path or path.endswith("/v1beta/models"):
                return self._gemini(handler, req)
            if method == "POST" and path.endswith("/messages/count_tokens"):
                return self._json(handler, {"input_tokens": max(1, len(raw) // 4)})
            if method == "POST" and path.endswith("/messages"):
                return self._anthropic(handler, req)
            if method == "POST" and path.endswith("/responses"):
                return self._responses(handler, req)
            if method == "POST" and path.endswith("/chat/completions"):
                return self._chat(handler, req)
            if method == "GET" and path.endswith("/models"):
                return self._json(handler, {"object": "list", "data": [], "models": []})
            return self._json(handler, {})
        except (BrokenPipeError, ConnectionResetError):
            return None

    def _reply_for(self, req):
        reply = None
        if self.script is not None and req.is_main:
            try:
                reply = self.script(req)
            except Exception as error:  # a broken script must not hang the harness
                if self.log:
                    self.log("mock: script failed: %r" % (error,))
                reply = Reply(text="script error: %r" % (error,))
        if reply is not None and reply.calls and self.require_offered:
            missing = [c.name for c in reply.calls if not self.offered(req, c)]
            if missing:
                problem = ("request %d: the script called %s, which the harness did not "
                           "offer (it offered %d tools: %s)" % (
                               req.index, ", ".join(missing), len(req.tool_names()),
                               ", ".join(sorted(str(n) for n in req.tool_names()))[:600]))
                with self.lock:
                    self.problems.append(problem)
                if self.log:
                    self.log("mock: " + problem)
                reply = Reply(text="mock: %s not offered" % ", ".join(missing))
        if reply is None:
            # Auxiliary calls (no tools): Claude Code and Codex ask for a session
            # title (Claude Code wants JSON {"title": ...}); anything else gets "ok".
            if req.is_main:
                reply = Reply(text="ok")
            elif "title" in req.all_text().lower():
                reply = Reply(text='{"title": "E2E session"}')
            else:
                reply = Reply(text="ok")
        if reply.delay:
            time.sleep(reply.delay)
        return reply

    @staticmethod
    def offered(req, call):
        """Whether req offered the tool a Call names (a Responses namespace
        may be given by the call or found among the tools)."""
        names = req.tool_names()
        if call.name in names:
            return True
        return any(n.endswith("/" + call.name) and (
            call.namespace is None or n == "%s/%s" % (call.namespace, call.name))
            for n in names if isinstance(n, str))

    @staticmethod
    def _json(handler, obj, status=200):
        data = json.dumps(obj).encode("utf-8")
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
        handler.wfile.flush()

    @staticmethod
    def _sse_start(handler):
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Cache-Control", "no-cache")
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.close_connection = True

    @staticmethod
    def _sse(handler, name, obj):
        handler.wfile.write(("event: %s\ndata: %s\n\n" % (name, json.dumps(obj)))
                            .encode("utf-8"))
        handler.wfile.flush()

    # Anthropic Messages
    def _anthropic(self, handler, req):
        reply = self._reply_for(req)
        model = req.body.get("model") or "mock"
        blocks = []
        if reply.text:
            blocks.append({"type": "text", "text": reply.text})
        for call in reply.calls:
            blocks.append({"type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:20],
                           "name": call.name, "input": call.args})
        if not blocks:
            blocks.append({"type": "text", "text": ""})
        stop = "tool_use" if reply.calls else "end_turn"
        usage = {"input_tokens": 10, "output_tokens": 5,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        message = {"id": "msg_" + uuid.uuid4().hex[:20], "type": "message",
                   "role": "assistant", "model": model, "content": blocks,
                   "stop_reason": stop, "stop_sequence": None, "usage": usage}
        if not req.body.get("stream"):
            return self._json(handler, message)
        self._sse_start(handler)
        start = dict(message, content=[], stop_reason=None,
                     usage=dict(usage, output_tokens=1))
        self._sse(handler, "message_start", {"type": "message_start", "message": start})
        for index, block in enumerate(blocks):
            if block["type"] == "text":
                self._sse(handler, "content_block_start", {
                    "type": "content_block_start", "index": index,
                    "content_block": {"type": "text", "text": ""}})
                self._sse(handler, "content_block_delta", {
                    "type": "content_block_delta", "index": index,
                    "delta": {"type": "text_delta", "text": block["text"]}})
            else:
                self._sse(handler, "content_block_start", {
                    "type": "content_block_start", "index": index,
                    "content_block": {"type": "tool_use", "id": block["id"],
                                      "name": block["name"], "input": {}}})
                self._sse(handler, "content_block_delta", {
                    "type": "content_block_delta", "index": index,
                    "delta": {"type": "input_json_delta",
                              "partial_json": json.dumps(block["input"])}})
            self._sse(handler, "content_block_stop", {"type": "content_block_stop",
                                                      "index": index})
        self._sse(handler, "message_delta", {
            "type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": 5}})
        self._sse(handler, "message_stop", {"type": "message_stop"})

    # OpenAI Responses
    @staticmethod
    def _namespace_of(req, name):
        for tool in req.body.get("tools") or []:
            if isinstance(tool, dict) and isinstance(tool.get("tools"), list):
                for inner in tool["tools"]:
                    if isinstance(inner, dict) and inner.get("name") == name:
                        return tool.get("name")
        return None

    def _responses(self, handler, req):
        reply = self._reply_for(req)
        rid = "resp_" + uuid.uuid4().hex[:20]
        items = []
        for call in reply.calls:
            item = {"type": "function_call", "id": "fc_" + uuid.uuid4().hex[:20],
                    "call_id": "call_" + uuid.uuid4().hex[:20], "name": call.name,
                    "arguments": json.dumps(call.args), "status": "completed"}
            namespace = call.namespace or self._namespace_of(req, call.name)
            if namespace:
                item["namespace"] = namespace
            items.append(item)
        if reply.text or not items:
            items.insert(0, {"type": "message", "role": "assistant", "status": "completed",
                             "id": "msg_" + uuid.uuid4().hex[:20],
                             "content": [{"type": "output_text", "text": reply.text or "",
                                          "annotations": []}]})
        usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": 15}
        base = {"id": rid, "object": "response", "created_at": int(time.time()),
                "model": req.body.get("model") or "mock", "status": "in_progress",
                "output": []}
        if not req.body.get("stream", True):
            return self._json(handler, dict(base, status="completed", output=items,
                                             usage=usage))
        self._sse_start(handler)
        self._sse(handler, "response.created", {"type": "response.created",
                                                "response": base})
        for index, item in enumerate(items):
            self._sse(handler, "response.output_item.added", {
                "type": "response.output_item.added", "output_index": index,
                "item": dict(item, content=[]) if item["type"] == "message" else item})
            if item["type"] == "message":
                text = item["content"][0]["text"]
                self._sse(handler, "response.output_text.delta", {
                    "type": "response.output_text.delta", "item_id": item["id"],
                    "output_index": index, "content_index": 0, "delta": text})
            self._sse(handler, "response.output_item.done", {
                "type": "response.output_item.done", "output_index": index, "item": item})
        self._sse(handler, "response.completed", {
            "type": "response.completed",
            "response": dict(base, status="completed", output=items, usage=usage)})

    # Gemini API (Gemini CLI: GOOGLE_GEMINI_BASE_URL=http://127.0.0.1:PORT)
    def _gemini(self, handler, req):
        path = req.path.split("?")[0]
        if path.endswith("/models"):
            return self._json(handler, {"models": []})
        if ":countTokens" in path:
            return self._json(handler, {"totalTokens": max(1, len(req.raw or json.dumps(
                req.body)) // 4)})
        config = req.body.get("generationConfig") or {}
        if not req.is_main and config.get("responseMimeType") == "application/json":
            schema = config.get("responseJsonSchema") or config.get("responseSchema") or {}
            reply = Reply(text=json.dumps(_fill_schema(schema, "ok")))
        else:
            reply = self._reply_for(req)
        parts = []
        if reply.text:
            parts.append({"text": reply.text})
        for call in reply.calls:
            parts.append({"functionCall": {"id": "call_" + uuid.uuid4().hex[:12],
                                           "name": call.name, "args": call.args}})
        if not parts:
            parts.append({"text": ""})
        usage = {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15}
        response = {"candidates": [{"content": {"role": "model", "parts": parts},
                                    "finishReason": "STOP", "index": 0}],
                    "usageMetadata": usage, "modelVersion": req.model or "mock",
                    "responseId": uuid.uuid4().hex[:20]}
        if not req.streaming:
            return self._json(handler, response)
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Cache-Control", "no-cache")
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.close_connection = True
        # One chunk per part, the finish reason and usage on the last: the
        # CLI joins text chunks and collects function calls from any chunk.
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            chunk = {"candidates": [dict({"content": {"role": "model", "parts": [part]},
                                          "index": 0},
                                         **({"finishReason": "STOP"} if last else {}))],
                     "modelVersion": response["modelVersion"],
                     "responseId": response["responseId"]}
            if last:
                chunk["usageMetadata"] = usage
            handler.wfile.write(("data: %s\r\n\r\n" % json.dumps(chunk)).encode("utf-8"))
            handler.wfile.flush()
        return None

    # OpenAI Chat Completions
    def _chat(self, handler, req):
        reply = self._reply_for(req)
        cid = "chatcmpl-" + uuid.uuid4().hex[:12]
        model = req.body.get("model") or "mock"
        calls = [{"id": "call_" + uuid.uuid4().hex[:20], "type": "function",
                  "function": {"name": call.name, "arguments": json.dumps(call.args)}}
                 for call in reply.calls]
        finish = "tool_calls" if calls else "stop"
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        if not req.body.get("stream"):
            message = {"role": "assistant", "content": reply.text or None}
            if calls:
                message["tool_calls"] = calls
            return self._json(handler, {
                "id": cid, "object": "chat.completion", "created": int(time.time()),
                "model": model, "usage": usage,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}]})
        self._sse_start(handler)

        def chunk(delta, finish_reason=None, last=False):
            obj = {"id": cid, "object": "chat.completion.chunk",
                   "created": int(time.time()), "model": model,
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}
            if last:
                obj["choices"], obj["usage"] = [], usage
            handler.wfile.write(b"data: " + json.dumps(obj).encode("utf-8") + b"\n\n")
            handler.wfile.flush()
        chunk({"role": "assistant", "content": ""})
        if reply.text:
            chunk({"content": reply.text})
        for index, call in enumerate(calls):
            chunk({"tool_calls": [dict(call, index=index)]})
        chunk({}, finish)
        chunk({}, last=True)
        handler.wfile.write(b"data: [DONE]\n\n")
        handler.wfile.flush()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--dump", help="write recorded requests here on Ctrl-C")
    args = parser.parse_args()

    def show(req):
        texts = req.user_texts()
        print("[%d] %s %s main=%s sid=%s last=%r" % (
            req.index, req.method, req.path, req.is_main, req.session_id(),
            (texts[-1][:200] if texts else None)), flush=True)
        return None

    mock = MockModel(script=show).start(args.port)
    print("mock model API on %s" % mock.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        if args.dump:
            mock.dump(args.dump)
        mock.stop()


if __name__ == "__main__":
    main()
