#!/usr/bin/env python3
"""The operator page (`agents_room.py ui`) in a real browser: Debian's chromium,
headless, driven over the DevTools protocol with a small stdlib websocket
client.  Prepares a store, starts `ui`, checks what the page renders (rooms,
sessions, leases, a thread), sends through the page's form and sees the
message arrive for a session (CLI recv), sends from the CLI and sees the page
update without a reload, cancels a quiet window through the page, and saves
screenshots (light, dark, narrow) into the directory named on the command line.

    python3 .ci/browser.py OUTDIR [--chromium /usr/bin/chromium]
"""
import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = [sys.executable, os.path.join(HERE, "agents_room.py")]


class WebSocket:
    """Just enough RFC 6455 for the DevTools protocol: text frames, masked
    when sent, fragmented or not when received."""

    def __init__(self, url):
        assert url.startswith("ws://")
        hostport, _, path = url[5:].partition("/")
        host, _, port = hostport.partition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(("GET /%s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\n"
                           "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n" % (path, hostport, key))
                          .encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            if not chunk:
                raise OSError("websocket handshake failed")
            head += chunk
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise OSError("websocket handshake refused: %r" % head[:200])

    def _exact(self, count):
        data = b""
        while len(data) < count:
            chunk = self.sock.recv(count - len(data))
            if not chunk:
                raise OSError("websocket closed")
            data += chunk
        return data

    def send(self, text):
        payload = text.encode("utf-8")
        head = bytearray([0x81])
        if len(payload) < 126:
            head.append(0x80 | len(payload))
        elif len(payload) < 65536:
            head.append(0x80 | 126)
            head += struct.pack(">H", len(payload))
        else:
            head.append(0x80 | 127)
            head += struct.pack(">Q", len(payload))
        mask = os.urandom(4)
        head += mask
        self.sock.sendall(bytes(head) + bytes(b ^ mask[i % 4] for i, b in
                                              enumerate(payload)))

    def recv(self):
        message = b""
        while True:
            first, second = self._exact(2)
            length = second & 0x7F
            if length == 126:
                length = struct.unpack(">H", self._exact(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", self._exact(8))[0]
            payload = self._exact(length)
            opcode = first & 0x0F
            if opcode == 8:
                raise OSError("websocket closed by the browser")
            if opcode in (0, 1, 2):
                message += payload
                if first & 0x80:
                    return message.decode("utf-8")


class Browser:
    def __init__(self, chromium, workdir):
        self.profile = os.path.join(workdir, "profile")
        self.proc = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--disable-component-update",
             "--no-first-run", "--disable-dev-shm-usage", "--hide-scrollbars",
             "--user-data-dir=" + self.profile, "--remote-debugging-port=0",
             "--window-size=1280,900", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.time() + 30
        while not (os.path.exists(port_file) and open(port_file).read().count("\n") >= 1):
            if time.time() > deadline or self.proc.poll() is not None:
                raise SystemExit("chromium did not start (is it installed? apt-get "
                                 "install -y chromium)")
            time.sleep(0.1)
        port = int(open(port_file).read().split()[0])
        from urllib.request import urlopen
        targets = json.load(urlopen("http://127.0.0.1:%d/json/list" % port))
        page = [t for t in targets if t.get("type") == "page"][0]
        self.ws = WebSocket(page["webSocketDebuggerUrl"])
        self.next_id = 0
        self.call("Page.enable")
        self.call("Runtime.enable")

    def call(self, method, **params):
        self.next_id += 1
        ident = self.next_id
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("method") == "Page.javascriptDialogOpening":
                # confirm() in the page: the operator says yes.
                self.ws.send(json.dumps({"id": 0, "method": "Page.handleJavaScriptDialog",
                                         "params": {"accept": True}}))
            if message.get("method") == "Runtime.exceptionThrown":
                sys.stderr.write("page exception: %s\n" % json.dumps(
                    message["params"])[:500])
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError("%s: %s" % (method, message["error"]))
                return message.get("result", {})

    def js(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError("%s: %s" % (expression, result["exceptionDetails"]))
        return result["result"].get("value")

    def wait(self, expression, what, seconds=10):
        deadline = time.time() + seconds
        while True:
            value = self.js(expression)
            if value:
                return value
            if time.time() > deadline:
                raise AssertionError("page: %s not seen within %ss" % (what, seconds))
            time.sleep(0.1)

    def screenshot(self, path, width, dark):
        self.call("Emulation.setEmulatedMedia", features=[
            {"name": "prefers-color-scheme", "value": "dark" if dark else "light"}])
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=900,
                  deviceScaleFactor=1, mobile=False)
        time.sleep(0.4)
        height = self.js("Math.ceil(document.documentElement.scrollHeight)")
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": width, "height": max(height, 300),
                               "scale": 1})["data"]
        with open(path, "wb") as handle:
            handle.write(base64.b64decode(data))
        print("screenshot", path)

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def cli(env, *args):
    done = subprocess.run(PROGRAM + list(args) + ["--json"], env=env, cwd=env["HOME"],
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise SystemExit("%s failed: %s" % (args, done.stderr))
    return json.loads(done.stdout)


def main(argv):
    if not argv or argv[0].startswith("-"):
        print(__doc__)
        return 2
    outdir = os.path.abspath(argv[0])
    chromium = argv[argv.index("--chromium") + 1] if "--chromium" in argv else (
        shutil.which("chromium") or "/usr/bin/chromium")
    os.makedirs(outdir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="agents-room-browser-")
    env = {k: v for k, v in os.environ.items() if not k.startswith(
        ("AGENTS_ROOM_", "CLAUDE", "CODEX_", "HERMES_"))}
    env.update(AGENTS_ROOM_DB=os.path.join(work, "room.db"), HOME=work)
    keepers, ui, browser = [], None, None
    try:
        def keep_alive(key):
            keepers.append(subprocess.Popen(
                [sys.executable, "-c", "import time; time.sleep(600)"],
                env=dict(env, AGENTS_ROOM_HARNESS_KEY=key)))

        def join(key, *args):
            return cli(dict(env, AGENTS_ROOM_HARNESS_KEY=key), "join", *args)["session_id"]
        keep_alive("k-api")
        keep_alive("k-web")
        api = join("k-api", "--room", "repo:shop", "--also", "storefront", "--label", "api")
        web = join("k-web", "--room", "repo:shop", "--also", "storefront", "--label", "web",
                   "--autonomy", "2")
        old = join("k-old", "--room", "repo:shop", "--label", "old-worker")
        cli(env, "claim", "--session", api, "--purpose", "add phone field", "src/users.go")
        cli(env, "claim", "--session", old, "--purpose", "left behind", "db:schema")
        cli(env, "work", "--session", api, "started", "--scope", "phone-field",
            "--summary", "adding the column")
        first = cli(env, "send", "--session", api, "--to", "*", "--subject",
                    "need a phone field", "--body", "<img src=x onerror=alert(1)> in users")
        cli(env, "send", "--session", web, "--to", api, "--reply-to",
            str(first["message_id"]), "--subject", "re: need a phone field",
            "--body", "on it, after the migration")
        window = cli(env, "window", "request", "--session", web, "db:main",
                     "--purpose", "apply migration")["window_id"]

        ui = subprocess.Popen(PROGRAM + ["ui", "--label", "operator"], env=env, cwd=work,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        url = ui.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and "?k=" in url, url

        browser = Browser(chromium, work)
        browser.call("Emulation.setDeviceMetricsOverride", width=1280, height=900,
                     deviceScaleFactor=1, mobile=False)
        browser.call("Page.navigate", url=url)
        browser.wait("document.querySelectorAll('[data-room]').length === 2", "two rooms")
        browser.wait("location.search === ''", "the secret dropped from the address")
        text = browser.js("document.body.innerText")
        for needed in ("repo:shop", "shared:storefront", "api", "web", "old-worker",
                       "src/users.go", "db:schema", "add phone field", "apply migration",
                       "need a phone field"):
            assert needed in text, "page lacks %r" % needed
        assert browser.js("document.querySelectorAll('img').length") == 0, "markup rendered"
        thread = browser.js("Array.from(document.querySelectorAll('article.thread')).map("
                            "a => Array.from(a.querySelectorAll('[data-message]')).map("
                            "m => Number(m.dataset.message)))")
        assert [1, 2] in thread, "messages 1 and 2 are not one thread: %r" % thread
        released = browser.js("Array.from(document.querySelectorAll('button')).filter("
                              "b => b.textContent === 'release').length")
        assert released == 1, "one gone holder's lease is releasable, not %r" % released
        browser.js("window.__same_page = 1")
        browser.screenshot(os.path.join(outdir, "ui-light.png"), 1280, False)
        browser.screenshot(os.path.join(outdir, "ui-dark.png"), 1280, True)
        browser.screenshot(os.path.join(outdir, "ui-narrow.png"), 420, False)
        browser.call("Emulation.setEmulatedMedia", features=[
            {"name": "prefers-color-scheme", "value": "light"}])
        browser.call("Emulation.setDeviceMetricsOverride", width=1280, height=900,
                     deviceScaleFactor=1, mobile=False)

        # The form: a message from the operator arrives for web (CLI recv).
        browser.js("document.getElementById('to').value = '*';"
                   "document.getElementById('subject').value = 'from the page';"
                   "document.getElementById('body').value = 'hello from the operator';"
                   "document.getElementById('send').click(); true")
        browser.wait("document.getElementById('sendstatus').textContent.startsWith('sent')",
                     "the send confirmed")
        got = cli(env, "recv", "--session", web)["messages"]
        assert any(m["subject"] == "from the page" and m["sender_label"] == "operator"
                   for m in got), got

        # The CLI: a send shows up without a reload.
        cli(env, "send", "--session", api, "--to", "*", "--subject", "from the terminal")
        started = time.time()
        browser.wait("document.body.innerText.includes('from the terminal')",
                     "the CLI's message", seconds=5)
        print("page updated %.2fs after the CLI send" % (time.time() - started))
        assert browser.js("window.__same_page") == 1, "the page reloaded"

        # Cancel the quiet window through the page (confirm accepted).
        browser.js("document.querySelector('[data-k=\"win:%d\"]').click(); true" % window)
        browser.wait("!document.querySelector('[data-k=\"win:%d\"]')" % window,
                     "the window cancelled")
        import sqlite3
        db = sqlite3.connect(env["AGENTS_ROOM_DB"])
        by = db.execute("SELECT s.label FROM events e JOIN sessions s ON s.id = e.session_id"
                        " WHERE e.kind='window.cancel' AND e.subject=?", (window,)).fetchall()
        db.close()
        assert by == [("operator",)], "window.cancel not logged by the operator: %r" % by
        # Reply in the thread, ack what the operator was sent, cap a room and
        # release the gone holder's lease: each through the page.
        browser.js("document.querySelector('[data-k=\"reply:2\"]').click();"
                   "document.getElementById('body').value = 'operator agrees';"
                   "document.getElementById('send').click(); true")
        browser.wait("Array.from(document.querySelectorAll('article.thread')).some(a =>"
                     " a.dataset.thread === '1' && a.innerText.includes('operator agrees'))",
                     "the reply in thread #1")
        terminal = browser.js("Array.from(document.querySelectorAll('[data-message]')).find("
                              "m => m.innerText.includes('from the terminal'))"
                              ".dataset.message")
        browser.js("document.querySelector('[data-k=\"ack:%s\"]').click(); true" % terminal)
        browser.wait("!document.querySelector('[data-k=\"ack:%s\"]')" % terminal, "the ack")
        browser.js("document.querySelector('[data-k=\"cap:repo:shop\"]').value = '1';"
                   "document.querySelector('[data-k=\"setcap:repo:shop\"]').click(); true")
        browser.js("Array.from(document.querySelectorAll('button')).find("
                   "b => b.textContent === 'release').click(); true")
        browser.wait("!Array.from(document.querySelectorAll('button')).some("
                     "b => b.textContent === 'release')", "the stale lease released")
        db = sqlite3.connect(env["AGENTS_ROOM_DB"])
        rows = db.execute("SELECT e.kind FROM events e JOIN sessions s ON s.id = e.session_id"
                          " WHERE s.label='operator' ORDER BY e.id").fetchall()
        cap = db.execute("SELECT cap FROM rooms WHERE name='repo:shop'").fetchone()[0]
        reply = db.execute("SELECT reply_to FROM messages WHERE body='operator agrees'"
                           ).fetchone()[0]
        db.close()
        kinds = [r[0] for r in rows]
        for kind in ("msg.send", "msg.ack", "room.cap", "lease.release", "window.cancel"):
            assert kind in kinds, "no %s by the operator: %r" % (kind, kinds)
        assert (cap, reply) == (1, 2), (cap, reply)
        browser.screenshot(os.path.join(outdir, "ui-after.png"), 1280, False)
        print("browser test: ok")
        return 0
    finally:
        if browser:
            browser.close()
        if ui:
            ui.terminate()
            ui.wait(10)
            sys.stderr.write(ui.stderr.read())
        for proc in keepers:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
