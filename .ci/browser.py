#!/usr/bin/env python3
"""The operator page (`agents_room.py ui`) in a real browser: Debian's chromium,
headless, driven over the DevTools protocol with a small stdlib websocket
client.  Seeds a store as an operator would meet it (three agents on three
harnesses in three repositories and a shared room, a gone one, four leases, a
thread, a broadcast, a tag message, an urgent unread message, an overdue ack,
a blocked work state, tasks, a pending quiet window), starts `ui` and checks:
the page is marked loaded only once the first state rendered and "live" stays
grey until then; no cookie, the code gone from the address and spent; one
overview row per agent with the counts `status` reports, sorted by what needs
a person; a blocked agent's "waiting on"; the urgent unread message and the
overdue ack marked; the task board; a window's missing acks; lease paths as
written; no [object Object]; watching adds no recipient to a `*` broadcast; a
CLI send shows in the overview within 1 s; every action through the page (each
joins only the room it is in); `ui --open` hands the browser no code.
Screenshots at 1280 and 500 px, light and dark, go to the directory named on
the command line.

    python3 .ci/browser.py OUTDIR [--chromium /usr/bin/chromium]

BROWSER_TILES=1 also saves each long screenshot in full-size pieces of 1000 px.
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
            try:
                value = self.js(expression)
            except RuntimeError:
                value = None        # mid-navigation: no document yet
            if value:
                return value
            if time.time() > deadline:
                raise AssertionError("page: %s not seen within %ss" % (what, seconds))
            time.sleep(0.1)

    def screenshot(self, path, width, dark, below=None):
        """The whole page at width (or only down to the end of the element
        `below` names), light or dark."""
        self.call("Emulation.setEmulatedMedia", features=[
            {"name": "prefers-color-scheme", "value": "dark" if dark else "light"}])
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=900,
                  deviceScaleFactor=1, mobile=False)
        time.sleep(0.4)
        height = self.js("Math.ceil(document.documentElement.scrollHeight)" if not below else
                         "Math.ceil(document.querySelector(%s).getBoundingClientRect()"
                         ".bottom + window.scrollY + 8)" % json.dumps(below))
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": width, "height": max(height, 300),
                               "scale": 1})["data"]
        with open(path, "wb") as handle:
            handle.write(base64.b64decode(data))
        print("screenshot", path)
        # A long page shrinks past reading in an image viewer: BROWSER_TILES=1
        # also saves it in pieces of 1000 px at full size.
        for number, top in enumerate(range(0, height, 1000) if os.environ.get(
                "BROWSER_TILES") == "1" else ()):
            data = self.call("Page.captureScreenshot", format="png",
                             captureBeyondViewport=True, clip={
                                 "x": 0, "y": top, "width": width,
                                 "height": min(1000, height - top), "scale": 1})["data"]
            with open(path[:-4] + "-%d.png" % (number + 1), "wb") as handle:
                handle.write(base64.b64decode(data))

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def cli(env, *args, cwd=None, ago=0):
    """A CLI call; ago=N runs it N seconds in the past (the test clock seam), so
    the seeded store spreads over the timeline's hour."""
    if ago:
        env = dict(env, AGENTS_ROOM_TEST_SEAMS="1", AGENTS_ROOM_TIME_OFFSET=str(-ago))
    done = subprocess.run(PROGRAM + list(args) + ["--json"], env=env, cwd=cwd or env["HOME"],
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise SystemExit("%s failed: %s" % (args, done.stderr))
    return json.loads(done.stdout)


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def git_repo(path):
    os.makedirs(path)
    subprocess.run(["git", "init", "-q", path], check=True, capture_output=True)
    return path


def start_ui(env, work, *extra):
    ui = subprocess.Popen(PROGRAM + ["ui", "--label", "operator"] + list(extra), env=env,
                          cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = ui.stdout.readline().strip()
    check(url.startswith("http://127.0.0.1:") and "/#k=" in url, "ui printed %r" % url)
    return ui, url


def text_of(browser, selector):
    return browser.js("Array.from(document.querySelectorAll(%s)).map(e => e.innerText)"
                      % json.dumps(selector))


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
    keepers, uis, browser = [], [], None
    try:
        def keep_alive(key):
            keepers.append(subprocess.Popen(
                [sys.executable, "-c", "import time; time.sleep(600)"],
                env=dict(env, AGENTS_ROOM_HARNESS_KEY=key)))

        def join(key, cwd, *args):
            return cli(dict(env, AGENTS_ROOM_HARNESS_KEY=key), "join", *args, cwd=cwd,
                       ago=3300)["session_id"]
        repos = {name: git_repo(os.path.join(work, name)) for name in ("api", "web", "billing")}
        for sub in ("api/src", "web/src", "billing/db"):
            os.makedirs(os.path.join(work, sub))
        keep_alive("k-api")
        keep_alive("k-web")
        keep_alive("k-billing")
        api = join("k-api", repos["api"], "--also", "storefront", "--label", "api",
                   "--harness", "claude-code", "--tag", "backend")
        web = join("k-web", repos["web"], "--also", "storefront", "--label", "web",
                   "--harness", "codex", "--autonomy", "2")
        billing = join("k-billing", repos["billing"], "--also", "storefront", "--label",
                       "billing", "--tag", "backend")
        old = join("k-old", repos["api"], "--label", "api-old")
        hold = ("--ttl", "7200")
        cli(env, "claim", "--session", old, "--purpose", "left behind", "db:schema", *hold,
            cwd=repos["api"], ago=3200)
        cli(env, "claim", "--session", api, "--purpose", "add phone field", "src/users.go",
            *hold, cwd=repos["api"], ago=3000)
        cli(env, "work", "--session", api, "started", "--scope", "phone-field",
            "--summary", "adding the column", ago=2950)
        first = cli(env, "send", "--session", api, "--to", "*", "--subject",
                    "need a phone field", "--body", "<img src=x onerror=alert(1)> in users",
                    ago=2700)
        cli(env, "send", "--session", web, "--to", api, "--reply-to",
            str(first["message_id"]), "--subject", "re: need a phone field",
            "--body", "on it, after the migration", ago=2400)
        cli(env, "claim", "--session", web, "--purpose", "phone input", "src/checkout.ts",
            *hold, cwd=repos["web"], ago=2350)
        cli(env, "claim", "--session", billing, "--purpose", "fix totals", "db/ledger.sql",
            cwd=repos["billing"], ago=2100)
        cli(env, "send", "--session", web, "--to", "tag:backend", "--subject",
            "schema freeze at 5pm", ago=1800)
        cli(env, "release", "--session", billing, "db/ledger.sql", cwd=repos["billing"],
            ago=1300)
        cli(env, "claim", "--session", billing, "--mode", "shared", "--purpose",
            "reading invoices", "db/invoices.sql", *hold, cwd=repos["billing"], ago=1250)
        cli(env, "task", "--session", api, "add", "--title", "add the phone column",
            "--room", "shared:storefront", ago=1500)
        cli(env, "task", "--session", web, "add", "--title", "phone input on checkout",
            "--room", "shared:storefront", ago=1450)
        stale_task = cli(env, "task", "--session", old, "add", "--title", "old migration",
                         "--room", "repo:api", ago=3150)["task"]["task_id"]
        cli(env, "task", "--session", old, "claim", str(stale_task), ago=3100)
        cli(env, "task", "--session", web, "claim", ago=1400)
        urgent = cli(env, "send", "--session", billing, "--to", web, "--importance", "urgent",
                     "--subject", "invoices broken in checkout", ago=1100)["message_id"]
        owed = cli(env, "send", "--session", billing, "--to", api, "--ack-by", "300",
                   "--subject", "confirm the column name", ago=900)["message_id"]
        cli(env, "work", "--session", web, "blocked", "--scope", "api", "--summary",
            "needs the phone field", "--to", api, ago=600)
        cli(env, "recv", "--session", billing, ago=400)
        window = cli(env, "window", "request", "--session", billing, "db:main",
                     "--purpose", "apply migration", "--require", api, "--require",
                     web)["window_id"]
        status = cli(env, "status")
        by_label = {s["label"]: s for s in status["sessions"]}

        ui, url = start_ui(env, work)
        uis.append(ui)
        browser = Browser(chromium, work)
        browser.call("Emulation.setDeviceMetricsOverride", width=1280, height=900,
                     deviceScaleFactor=1, mobile=False)
        browser.call("Page.navigate", url=url)
        # "live" is grey (and the page unmarked) until the first state rendered.
        samples = []
        deadline = time.time() + 10
        while time.time() < deadline:
            sample = browser.js("document.documentElement && document.getElementById("
                                "'conn') ? [document.documentElement.dataset.loaded, "
                                "document.getElementById('conn').className] : ['', '']")
            samples.append(tuple(sample or ("", "")))
            if samples[-1][0] == "1" and "live" in samples[-1][1]:
                break
        check(samples[-1][0] == "1", "never marked loaded: %r" % samples[-3:])
        check(not any(s[0] != "1" and "live" in s[1] for s in samples),
              "live before the first render: %r" % samples)
        browser.wait("document.getElementById('conn').classList.contains('live')", "live")
        check(browser.js("location.hash") == "", "the code stayed in the address")
        cookies = browser.call("Network.getAllCookies").get("cookies", [])
        check(cookies == [] and browser.js("document.cookie") == "",
              "the page set a cookie: %r" % cookies)
        text = browser.js("document.body.innerText")
        check("[object Object]" not in text, "[object Object] on the page")
        check(browser.js("document.querySelectorAll('img').length") == 0, "markup rendered")
        for needed in ("repo:api", "repo:web", "repo:billing", "shared:storefront",
                       "src/users.go", "src/checkout.ts", "db/invoices.sql", "db:schema",
                       "add phone field", "apply migration", "need a phone field",
                       "add the phone column", "phone input on checkout", "old migration"):
            check(needed in text, "page lacks %r" % needed)
        check(repos["api"] not in text, "an absolute lease path is shown")

        # One overview row per agent, with the counts status reports.
        rows = browser.js("Array.from(document.querySelectorAll('#overview tr[data-agent]'))"
                          ".map(r => [r.dataset.agent, r.dataset.rank, r.innerText])")
        check(sorted(r[0] for r in rows) == sorted([api, web, billing, old]),
              "overview rows: %r" % rows)
        ranks = [int(r[1]) for r in rows]
        check(ranks == sorted(ranks), "not sorted by what needs a person: %r" % ranks)
        row = {r[0]: r[2] for r in rows}
        for label, sid in (("api", api), ("web", web), ("billing", billing)):
            unread = by_label[label]["unread"]
            check(("%d unread" % unread) in row[sid] if unread else "0 unread" in row[sid],
                  "%s: %d unread not shown: %r" % (label, unread, row[sid]))
        check("owes 1 ack (1 overdue)" in row[api], "api's overdue ack: %r" % row[api])
        check("1 urgent" in row[web], "web's urgent unread: %r" % row[web])
        check("blocked on api: needs the phone field; told api" in row[web],
              "web's waiting on: %r" % row[web])
        check("urgent #%d from billing unread" % urgent in row[web], row[web])
        check("owes an ack on #%d from billing" % owed in row[api], row[api])
        check("gone, still holds db:schema" in row[old], "the gone holder: %r" % row[old])
        check("waits for acks from api, web" in row[billing], "window: %r" % row[billing])
        check(rows[0][0] == old, "the gone holder is not first: %r" % rows[0])
        marked = browser.js("Array.from(document.querySelectorAll('#overview .chip.bad'))"
                            ".map(c => c.innerText)")
        check("1 urgent" in marked and "owes 1 ack (1 overdue)" in marked,
              "urgent and overdue not marked: %r" % marked)
        check(browser.js("document.querySelector('[data-message=\"%d\"]').classList"
                         ".contains('urgent')" % urgent), "the urgent message is not marked")
        # The task board, and the rooms each showing a lease once.
        board = text_of(browser, "#tasks [data-tasks]")
        check(any("Claimed (2)" in b for b in board) and any("Open (1)" in b for b in board),
              "task board: %r" % board)
        check(browser.js("document.querySelectorAll('#rooms span.res').length") == 4,
              "each lease once in the rooms")
        check(browser.js("document.querySelectorAll('#timeline .mark').length") > 10,
              "the timeline is empty")
        thread = browser.js("Array.from(document.querySelectorAll('article.thread')).map("
                            "a => Array.from(a.querySelectorAll('[data-message]')).map("
                            "m => Number(m.dataset.message)))")
        check([1, 2] in thread, "messages 1 and 2 are not one thread: %r" % thread)
        notice = browser.js("Array.from(document.querySelectorAll('[data-message]')).map("
                            "m => m.innerText).find(t => t.includes('quiet window #%d'))"
                            % window)
        check(notice and "to those asked about quiet window #%d" % window in notice,
              "the window notice's recipients: %r" % notice)
        check(browser.js("document.getElementById('to').value") == "",
              "the composer has a default recipient")
        events = browser.js("document.getElementById('events').innerText")
        check("api claimed src/users.go for 2h: add phone field" in events, events[-2000:])
        # Issue 35: a new store's first event, the words hovered, no name split.
        check("the store was created (schema" in events and "from schema 0" not in events,
              "the new store's first event: %r" % events[:300])
        untitled = browser.js("Array.from(document.querySelectorAll('.deliveries .chip'))"
                              ".filter(c => !c.title).map(c => c.innerText)")
        check(untitled == [], "delivery states without an explanation: %r" % untitled)
        check(browser.js("Array.from(document.querySelectorAll('#rooms span')).filter("
                         "s => s.innerText.includes('cap ')).every(s => s.title)"),
              "the rooms' cap is not explained")
        # Every word of a resource's name segments (between its "/"s) on one
        # line at 1280 px: a name may wrap after a "/", never inside a name.
        split = browser.js(
            "Array.from(document.querySelectorAll('.name')).filter(n => Array.from("
            "n.childNodes).some(t => t.nodeType === 3 && Array.from(t.data.matchAll("
            "/\\S+/g)).some(m => { const r = document.createRange();"
            " r.setStart(t, m.index); r.setEnd(t, m.index + m[0].length);"
            " return new Set(Array.from(r.getClientRects()).map(x => Math.round(x.top)))"
            ".size > 1; }))).map(n => n.innerText)")
        check(split == [], "resource names split inside a name at 1280 px: %r" % split)
        check(browser.js("document.querySelectorAll('#overview .name').length") >= 4,
              "the overview's holds are not names")

        # Watching is no membership: a broadcast reaches the agents only.
        sent = cli(env, "send", "--session", api, "--to", "*", "--subject", "hello all")
        check(sorted(sent["recipient_ids"]) == sorted([web, billing, old]),
              "a * broadcast reached %r" % sent["recipient_labels"])
        check(cli(env, "who")["sessions"] and not any(
            s["harness"] == "human" for s in cli(env, "who")["sessions"]),
            "the operator is in a room")

        browser.js("window.__same_page = 1")
        for width in (1280, 500):
            for dark in (False, True):
                browser.screenshot(os.path.join(outdir, "ui-%d-%s.png" % (
                    width, "dark" if dark else "light")), width, dark)
        browser.screenshot(os.path.join(outdir, "ui-1280-top.png"), 1280, False,
                           below="#timeline-pane")
        browser.call("Emulation.setEmulatedMedia", features=[
            {"name": "prefers-color-scheme", "value": "light"}])
        browser.call("Emulation.setDeviceMetricsOverride", width=1280, height=900,
                     deviceScaleFactor=1, mobile=False)

        # A CLI send shows in the overview within a second, without a reload.
        before = browser.js("document.querySelector('#overview tr[data-agent=\"%s\"]')"
                            ".innerText" % billing)
        cli(env, "send", "--session", api, "--to", billing, "--subject", "from the terminal")
        started = time.time()
        browser.wait("document.body.innerText.includes('from the terminal') && "
                     "document.querySelector('#overview tr[data-agent=\"%s\"]').innerText "
                     "!== %s" % (billing, json.dumps(before)), "the CLI's message", seconds=5)
        took = time.time() - started
        print("overview updated %.2fs after the CLI send" % took)
        check(took < 1.0, "the overview took %.2fs" % took)
        check(browser.js("window.__same_page") == 1, "the page reloaded")

        # The form: to everyone in repo:web; the operator joins that room only.
        browser.js("document.getElementById('to').value = 'r:repo:web';"
                   "document.getElementById('to').dispatchEvent(new Event('change'));"
                   "document.getElementById('subject').value = 'from the page';"
                   "document.getElementById('body').value = 'hello from the operator';"
                   "document.getElementById('send').click(); true")
        browser.wait("document.getElementById('sendstatus').textContent.startsWith('sent')",
                     "the send confirmed")
        got = cli(env, "recv", "--session", web)["messages"]
        check(any(m["subject"] == "from the page" and m["sender_label"] == "operator"
                  for m in got), got)
        operator = [s for s in cli(env, "status")["sessions"] if s["label"] == "operator"]
        check(len(operator) == 1 and operator[0]["rooms"] == ["repo:web"] and
              operator[0]["harness"] == "human", "the operator joined %r" % operator)
        browser.wait("document.getElementById('me').innerText.includes('in repo:web')",
                     "the header says where you are")

        # Reply in the thread, ack what the operator was sent, agree to a window.
        browser.js("document.querySelector('[data-k=\"reply:2\"]').click();"
                   "document.getElementById('body').value = 'operator agrees';"
                   "document.getElementById('send').click(); true")
        browser.wait("Array.from(document.querySelectorAll('article.thread')).some(a =>"
                     " a.dataset.thread === '1' && a.innerText.includes('operator agrees'))",
                     "the reply in thread #1")
        to_me = cli(env, "send", "--session", web, "--to", operator[0]["session_id"],
                    "--subject", "for the operator")["message_id"]
        browser.wait("!!document.querySelector('[data-k=\"ack:%d\"]')" % to_me,
                     "an ack button")
        browser.js("document.querySelector('[data-k=\"ack:%d\"]').click(); true" % to_me)
        browser.wait("!document.querySelector('[data-k=\"ack:%d\"]')" % to_me, "the ack")
        # Cap, cancel a window, release a gone holder's lease, reopen a gone
        # claimant's task, add a task: each confirmed and the operator's.
        browser.js("document.querySelector('[data-k=\"cap:repo:web\"]').value = '1';"
                   "document.querySelector('[data-k=\"setcap:repo:web\"]').click(); true")
        browser.js("document.querySelector('[data-k=\"win:%d\"]').click(); true" % window)
        browser.wait("!document.querySelector('[data-k=\"win:%d\"]')" % window,
                     "the window cancelled")
        browser.js("Array.from(document.querySelectorAll('button')).find("
                   "b => b.textContent === 'release').click(); true")
        browser.wait("!Array.from(document.querySelectorAll('button')).some("
                     "b => b.textContent === 'release')", "the stale lease released")
        browser.js("document.querySelector('[data-k=\"task-release:%d\"]').click(); true"
                   % stale_task)
        browser.wait("!document.querySelector('[data-k=\"task-release:%d\"]')" % stale_task,
                     "the gone claimant's task reopened")
        browser.js("document.getElementById('task-room').value = 'shared:storefront';"
                   "document.getElementById('task-title').value = 'review the migration';"
                   "document.getElementById('task-submit').click(); true")
        browser.wait("document.getElementById('tasks').innerText.includes("
                     "'review the migration')", "the task added")
        import sqlite3
        db = sqlite3.connect(env["AGENTS_ROOM_DB"])
        kinds = [r[0] for r in db.execute(
            "SELECT e.kind FROM events e JOIN sessions s ON s.id = e.session_id"
            " WHERE s.label='operator' ORDER BY e.id")]
        cap = db.execute("SELECT cap FROM rooms WHERE name='repo:web'").fetchone()[0]
        reply = db.execute("SELECT reply_to FROM messages WHERE body='operator agrees'"
                           ).fetchone()[0]
        rooms = [r[0] for r in db.execute(
            "SELECT m.room FROM memberships m JOIN sessions s ON s.id = m.session_id "
            "WHERE s.label='operator' ORDER BY m.room")]
        db.close()
        for kind in ("msg.send", "msg.ack", "room.cap", "lease.release", "window.cancel",
                     "task.release", "task.add"):
            check(kind in kinds, "no %s by the operator: %r" % (kind, kinds))
        check((cap, reply) == (1, 2), (cap, reply))
        # Each act joined the room it was in, and no other.
        check(rooms == ["repo:api", "repo:billing", "repo:web", "shared:storefront"],
              "the operator's rooms: %r" % rooms)
        check("[object Object]" not in browser.js("document.body.innerText"),
              "[object Object] after acting")
        browser.screenshot(os.path.join(outdir, "ui-after.png"), 1280, False)

        # A time a member wrote as text: the page says which value and how to
        # reset it (not "reconnecting"), and is the overview again after it.
        db = sqlite3.connect(env["AGENTS_ROOM_DB"])
        db.execute("UPDATE sessions SET last_seen = 'x' WHERE id = ?", (web,))
        db.commit()
        db.close()
        browser.wait("!document.getElementById('trouble').hidden", "the store's values said")
        said = browser.js("document.getElementById('trouble').innerText")
        check('sessions.last_seen of session %s is "x" (not a time)' % web in said and
              "doctor --repair" in said, "the banner: %r" % said)
        browser.screenshot(os.path.join(outdir, "ui-store-values.png"), 1280, False)
        repaired = subprocess.run(PROGRAM + ["doctor", "--repair"], env=env, cwd=env["HOME"],
                                  capture_output=True, text=True, timeout=60).stdout
        check("store values: repaired 1" in repaired, "doctor --repair: %s" % repaired)
        cli(env, "send", "--session", api, "--to", web, "--subject", "after the repair")
        browser.wait("document.getElementById('trouble').hidden && document.body.innerText"
                     ".includes('after the repair')", "the overview after the repair")

        # The code is spent: a tab without a key that opens the URL again is refused.
        browser.js("sessionStorage.clear(); true")
        browser.call("Page.navigate", url="about:blank")
        browser.call("Page.navigate", url=url)
        browser.wait("document.documentElement.dataset.loaded === 'locked'", "a spent code")
        check(not browser.js("document.getElementById('locked').hidden"), "no lock banner")
        banner = browser.js("document.getElementById('locked').innerText")
        check("start it again" in banner, "the banner says no way out: %r" % banner)

        # ui --open: the browser's command line carries a private file, not a code.
        argv_file = os.path.join(work, "browser-argv")
        fake = os.path.join(work, "fake-browser")
        with open(fake, "w") as handle:
            handle.write("#!/bin/sh\nprintf '%%s\\n' \"$@\" > %s\n" % argv_file)
        os.chmod(fake, 0o755)
        ui2, url2 = start_ui(dict(env, BROWSER=fake), work, "--open")
        uis.append(ui2)
        deadline = time.time() + 10
        while not os.path.exists(argv_file) and time.time() < deadline:
            time.sleep(0.1)
        opened = open(argv_file).read().strip()
        check(opened.startswith("file:///") and url2.split("#k=")[1] not in opened,
              "the browser was handed %r" % opened)
        from urllib.parse import unquote
        check(oct(os.stat(unquote(opened[7:])).st_mode & 0o777) == "0o600",
              "the opener is not private")
        browser.call("Page.navigate", url=opened)
        browser.wait("location.port === %s && document.documentElement.dataset.loaded === "
                     "'1'" % json.dumps(url2.split(":")[2].split("/")[0]),
                     "the opener's redirect to a working page")
        check(not os.path.exists(unquote(opened[7:])), "the opener outlived its code")
        print("browser test: ok")
        return 0
    finally:
        if browser:
            browser.close()
        for ui in uis:
            ui.terminate()
            ui.wait(10)
            sys.stderr.write(ui.stderr.read())
        for proc in keepers:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
