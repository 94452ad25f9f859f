#!/usr/bin/env python3
"""The room on PostgreSQL as a team spread over machines uses it (issue 40).

Three hosts, each a network namespace with its own host name, process table
(UTS, PID and mount namespaces: no host sees another's processes), HOME and
clone of one repository, reach one throwaway PostgreSQL server through a
proxy that delays each way by --delay-ms.  Through them:

  who        every host sees every session, none `gone` on a guess
  leases     three hosts claim one file at once, round after round: one
             winner each time, fences strictly increasing, the old fence
             refused by `check --fence`
  sends      every host sends to the other two at once: none lost, none twice
  wake       an idle session on h1 (a wake-cmd lever, only `serve` running
             there) woken by a send from h2; its latency
  crash      every process of the server SIGKILLed right after acknowledged
             claims and sends, restarted: nothing acknowledged lost
  twin       a fourth host, also called h1 (its own process table): its
             sessions and h1's told apart, none `gone`; a send to its idle
             session is not fired by h1's listening serve, and is by its own
  dead link  `serve` on h3, one call, its link cut until keepalive gives the
             idle connection up (AGENTS_ROOM_PG_KEEPALIVE_S=1), the link
             restored: the next call is stored
  lost lock  a process on h3 holds the room's lock and its link is cut for
             longer than the server lets a transaction idle (--idle-s, in the
             URL's options): the server frees the lock, h2's claim proceeds,
             the process gets one clear error and its next send is stored once

Prints one line per check and the figures; exits 1 if any check failed, 77
when it cannot run here (not root, not Linux, no iproute2 or PostgreSQL).
Bounded: --timeout seconds for the whole run.  Run: make multihost (as root).
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
# The module imported, not run as a script: its bytecode cache makes a start
# cost a fifth (as the shim's command does).
PROGRAM = [sys.executable, "-c", "import sys; sys.path.insert(0, %r); import agents_room; "
           "sys.exit(agents_room.main())" % ROOT]
import agents_room  # noqa: E402  (its delay proxy)

HOSTS = ("h1", "h2", "h3")
SKIP = 77


class Failure(Exception):
    pass


def check(condition, what):
    if not condition:
        raise Failure(what)


class Host:
    """One simulated machine: a network namespace joined to this one by a
    veth pair, and a process (sleep) holding new UTS, PID and mount
    namespaces that every command of the host enters (nsenter)."""

    def __init__(self, name, index, base, pg_port, delay_s, hostname=None):
        self.name, self.base = name, os.path.join(base, name)
        self.hostname = hostname or name          # a twin: another's host name
        self.home = os.path.join(self.base, "home")
        self.repo = os.path.join(self.base, "app")
        os.makedirs(self.home)
        self.near, self.far = "10.242.%d.1" % index, "10.242.%d.2" % index
        self.veth = "mhv%d-%d" % (os.getpid() % 10000, index)
        self.peer = self.veth + "p"
        self.netns = "mh%d-%s" % (os.getpid(), name)
        ip("netns", "add", self.netns)
        ip("link", "add", self.veth, "type", "veth", "peer", "name", self.peer)
        ip("link", "set", self.peer, "netns", self.netns)
        ip("addr", "add", self.near + "/30", "dev", self.veth)
        ip("link", "set", self.veth, "up")
        for args in (("addr", "add", self.far + "/30", "dev", self.peer),
                     ("link", "set", self.peer, "up"), ("link", "set", "lo", "up")):
            ip("netns", "exec", self.netns, "ip", *args)
        self.proxy = agents_room._DelayProxy(("127.0.0.1", pg_port), delay_s, bind=self.near)
        self.holder = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, "unshare", "--uts", "--pid", "--fork",
             "--kill-child", "--mount-proc", "sh", "-c", "hostname %s && exec sleep 100000" % self.hostname])
        self.pid = None
        for _ in range(100):
            try:
                with open("/proc/%d/task/%d/children" % (self.holder.pid,
                                                         self.holder.pid)) as f:
                    children = f.read().split()
            except OSError:
                children = []
            if children:
                self.pid = int(children[0])
                if open("/proc/%d/comm" % self.pid).read().strip() == "sleep":
                    break
            time.sleep(0.05)
        check(self.pid, "%s: its namespaces did not start" % name)
        subprocess.run(["git", "init", "-q", self.repo], check=True)
        subprocess.run(["git", "-C", self.repo, "remote", "add", "origin",
                        "https://example.invalid/team/app.git"], check=True)

    def url(self, base_url, pg_port):
        return base_url.replace("127.0.0.1:%d" % pg_port, "%s:%d" % (
            self.near, self.proxy.port)) + "?sslmode=disable"

    def env(self, **extra):
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": self.home,
               "LANG": "C.UTF-8", "AGENTS_ROOM_DB": self.db}
        env.update(extra)
        return env

    def argv(self, argv):
        return ["nsenter", "-t", str(self.pid), "-u", "-p", "-m", "-n", "--"] + argv

    def popen(self, argv, env=None, **kw):
        return subprocess.Popen(self.argv(argv), env=env or self.env(), cwd=self.repo, **kw)

    def cli(self, *args, env=None, ok=True):
        done = subprocess.run(self.argv(PROGRAM + list(args) + ["--json"]),
                              env=env or self.env(), cwd=self.repo, capture_output=True,
                              text=True, timeout=120)
        check("Traceback" not in done.stderr, "%s %s: a traceback: %s" % (
            self.name, args[0], done.stderr[-500:]))
        if ok:
            check(done.returncode == 0, "%s %s exit %d: %s" % (
                self.name, " ".join(args), done.returncode, done.stderr.strip()[-300:]))
        return json.loads(done.stdout) if done.stdout.strip() else {}

    def connections(self, port):
        done = subprocess.run(self.argv(["ss", "-Htn", "state", "established", "dst",
                                         "%s:%d" % (self.near, port)]),
                              capture_output=True, text=True)
        return [l for l in done.stdout.splitlines() if l.strip()]

    def cut(self, mac=None):
        """Frames to the server's side sent to a hardware address no one has
        (vanish without an answer); mac=None restores the real one."""
        if mac is None:
            with open("/sys/class/net/%s/address" % self.veth) as f:
                mac = f.read().strip()
        ip("netns", "exec", self.netns, "ip", "neigh", "replace", self.near, "lladdr",
           mac, "dev", self.peer, "nud", "permanent")

    def close(self):
        # The namespace's first process: when it dies, the kernel kills every
        # other process of the host (nsenter's children included).
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
        if self.holder.poll() is None:
            self.holder.kill()
            self.holder.wait()
        ip("link", "del", self.veth, check=False)
        ip("netns", "del", self.netns, check=False)


def ip(*args, check=True):
    done = subprocess.run(["ip"] + list(args), capture_output=True, text=True)
    if check and done.returncode:
        raise Failure("ip %s: %s" % (" ".join(args), done.stderr.strip()))


class Mcp:
    """serve on a host, over pipes."""

    def __init__(self, host, env):
        self.proc = host.popen(PROGRAM + ["serve"], env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL)
        self.next = 0
        self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "multihost", "version": "1"}})
        self.proc.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        self.proc.stdin.flush()

    def request(self, method, params):
        self.next += 1
        self.proc.stdin.write((json.dumps({"jsonrpc": "2.0", "id": self.next,
                                           "method": method, "params": params}) + "\n"
                               ).encode())
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def call(self, name, **arguments):
        return self.request("tools/call", {"name": name, "arguments": arguments})["result"]

    def close(self):
        self.proc.kill()
        self.proc.wait()


def run(args, report):
    from test_agents_room import ThrowawayPostgres, PgUnavailable
    base = tempfile.mkdtemp(prefix="agents-room-multihost-")
    os.chmod(base, 0o755)
    cluster = ThrowawayPostgres(os.path.join(base, "pg"))
    hosts, servers, twin = [], [], None
    try:
        try:
            cluster.start()
        except PgUnavailable as error:
            print("multihost: skipped: %s" % error)
            return SKIP
        base_url = cluster.url()
        for index, name in enumerate(HOSTS, 1):
            host = Host(name, index, base, cluster.port, args.delay_ms / 2000.0)
            host.db = host.url(base_url, cluster.port)
            hosts.append(host)
        h1, h2, h3 = hosts
        # h1's twin: another machine that is also called h1.
        twin = Host("h1-twin", len(HOSTS) + 1, base, cluster.port, args.delay_ms / 2000.0,
                    hostname="h1")
        twin.db = twin.url(base_url, cluster.port)

        # who: one session per host, its harness a process of that host.
        sessions = {}
        for host in hosts:
            key = "k-" + host.name
            servers.append(host.popen(["sleep", "100000"], env=host.env(
                AGENTS_ROOM_HARNESS_KEY=key)))
            sessions[host.name] = host.cli("join", "--room", "team", "--label", host.name,
                                           env=host.env(AGENTS_ROOM_HARNESS_KEY=key))[
                                               "session_id"]
        for host in hosts:
            seen = {s["label"]: s["liveness"] for s in host.cli("who", "--room", "team")[
                "sessions"]}
            check(sorted(seen) == list(HOSTS), "who on %s: %s" % (host.name, seen))
            check("gone" not in seen.values(), "who on %s: %s" % (host.name, seen))
            check(seen[host.name] == "alive", "who on %s: %s" % (host.name, seen))
        report("who across hosts", "3 hosts see 3 sessions each, none gone")

        # leases: the three at once, round after round.
        fences, started = [], time.monotonic()
        for round_ in range(args.rounds):
            procs = [host.popen(PROGRAM + ["claim", "--session",
                                 sessions[host.name], "shared.py", "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                     for host in hosts]
            answers = [json.loads(p.communicate(timeout=120)[0] or "{}") for p in procs]
            winners = [(host, a) for host, a in zip(hosts, answers) if a.get("ok")]
            check(len(winners) == 1, "round %d: %d winners" % (round_, len(winners)))
            host, answer = winners[0]
            fences.append(answer["lease"]["fence"])
            host.cli("release", "--session", sessions[host.name], "shared.py")
        check(all(a < b for a, b in zip(fences, fences[1:])), "fences %s" % fences)
        last = hosts[0]
        last.cli("claim", "--session", sessions[last.name], "shared.py")
        refused = last.cli("check", "--session", sessions[last.name], "--fence",
                           str(fences[0]), "shared.py", ok=False)
        check(refused.get("ok") is False, "check --fence of an old grant: %s" % refused)
        last.cli("release", "--session", sessions[last.name], "shared.py")
        report("one winner per round", "%d rounds, fences %d..%d increasing, the old "
               "fence refused; %.0f ms a round" % (args.rounds, fences[0], fences[-1],
                                                  (time.monotonic() - started) * 1000 /
                                                  args.rounds))

        # sends: every host to the other two at once.
        script = ("import subprocess, sys\n"
                  "for n in range(%d):\n"
                  "    for to in sys.argv[2:]:\n"
                  "        subprocess.run(%r + ['send', '--session', "
                  "sys.argv[1], '--to', to, '--subject', 'from %%s #%%d' %% (sys.argv[1], n)]"
                  ", check=True, stdout=subprocess.DEVNULL)\n" % (args.sends, PROGRAM))
        started = time.monotonic()
        procs = [host.popen([sys.executable, "-c", script, sessions[host.name]] + [
            sessions[o.name] for o in hosts if o is not host]) for host in hosts]
        for proc in procs:
            check(proc.wait(timeout=300) == 0, "a sender failed")
        took = time.monotonic() - started
        lost = duplicated = 0
        for host in hosts:
            got = [m["subject"] for m in host.cli("recv", "--session", sessions[host.name],
                                                  "--limit", "1000")["messages"]]
            want = ["from %s #%d" % (sessions[o.name], n) for o in hosts if o is not host
                    for n in range(args.sends)]
            lost += len(set(want) - set(got))
            duplicated += len(got) - len(set(got))
        check(lost == 0 and duplicated == 0, "%d lost, %d duplicated" % (lost, duplicated))
        total = args.sends * 6
        report("sends across hosts", "%d deliveries, 0 lost, 0 duplicated, %.1f sends/s "
               "from 3 hosts (one CLI process each)" % (total, total / took))

        # wake: an idle session on h1, only serve running there.
        woke = os.path.join(h1.base, "woke")
        lever = "%s -c \"import sys; open(%r, 'a').write(sys.argv[1] + chr(10))\"" % (
            sys.executable, woke)
        servers.append(h1.popen(["sleep", "100000"], env=h1.env(
            AGENTS_ROOM_HARNESS_KEY="k-sleeper")))
        sleeper = h1.cli("join", "--room", "team", "--label", "sleeper", "--autonomy",
                         "wake", env=h1.env(AGENTS_ROOM_HARNESS_KEY="k-sleeper",
                                            AGENTS_ROOM_WAKE_CMD=lever))["session_id"]
        serve = Mcp(h1, h1.env())
        servers.append(serve.proc)
        time.sleep(1)
        started = time.monotonic()
        h2.cli("send", "--session", sessions["h2"], "--to", sleeper, "--subject", "wake")
        sent = time.monotonic()
        while not os.path.exists(woke) and time.monotonic() - sent < 15:
            time.sleep(0.02)
        check(os.path.exists(woke), "the lever on h1 did not run within 15 s")
        latency = time.monotonic() - sent
        time.sleep(1)
        with open(woke) as f:
            runs = len(f.read().splitlines())
        check(runs == 1, "the lever ran %d times" % runs)
        report("a wake across hosts", "h2's send (a CLI call of %.2f s) woke h1's idle "
               "session %.2f s after it answered, once" % (sent - started, latency))

        # twin: a second machine also called h1 (its own process table).  Its
        # sessions are its own: h1 judges none of them by its processes, and
        # h1's listening serve never fires the twin's lever; the twin's does.
        servers.append(twin.popen(["sleep", "100000"], env=twin.env(
            AGENTS_ROOM_HARNESS_KEY="k-twin")))
        twin_woke = os.path.join(twin.base, "woke")
        twin_lever = "%s -c \"import os; open(%r, 'a').write(os.readlink('/proc/self/ns/pid')" \
            " + chr(10))\"" % (sys.executable, twin_woke)
        mate = twin.cli("join", "--room", "team", "--label", "twin", "--autonomy", "wake",
                        env=twin.env(AGENTS_ROOM_HARNESS_KEY="k-twin",
                                     AGENTS_ROOM_WAKE_CMD=twin_lever))["session_id"]
        places = {}
        for host in (h1, twin):
            seen = {s["label"]: s for s in host.cli("who", "--room", "team")["sessions"]}
            for label in ("h1", "twin"):
                check(seen[label]["liveness"] != "gone", "who on %s: %s %s" % (
                    host.hostname + (" (the twin)" if host is twin else ""), label,
                    seen[label]["liveness"]))
            check(seen["h1" if host is h1 else "twin"]["liveness"] == "alive",
                  "who on %s: its own session %s" % (host.name, seen))
            places[host.name] = (seen["h1"].get("host"), seen["twin"].get("host"))
        check(places["h1"] == places["h1-twin"] and places["h1"][0] != places["h1"][1],
              "the two h1 hosts as recorded: %s" % places)
        h2.cli("send", "--session", sessions["h2"], "--to", mate, "--subject", "twin")
        sent = time.monotonic()
        time.sleep(2)              # h1's serve listens meanwhile (its wake took ~1.2 s)
        check(not os.path.exists(twin_woke), "h1 ran the twin's lever")
        twin_serve = Mcp(twin, twin.env())
        servers.append(twin_serve.proc)
        while not os.path.exists(twin_woke) and time.monotonic() - sent < 20:
            time.sleep(0.02)
        check(os.path.exists(twin_woke), "the twin's lever did not run with its serve")
        time.sleep(1)
        with open(twin_woke) as f:
            ran = f.read().splitlines()
        check(ran == [os.readlink("/proc/%d/ns/pid" % twin.pid)],
              "the twin's lever ran %s, its own PID namespace %s" % (
                  ran, os.readlink("/proc/%d/ns/pid" % twin.pid)))
        report("a twin host name", "two hosts called h1: sessions told apart (%s, %s), "
               "none gone; the twin's lever ran once, on the twin, not by h1's serve" %
               places["h1"])

        # crash: acknowledged claims and sends, then SIGKILL the server.
        claimed, sent_ids = [], []
        for n in range(5):
            claimed.append(h2.cli("claim", "--session", sessions["h2"], "crash%d.py" % n)[
                "lease"]["fence"])
            sent_ids.append(h2.cli("send", "--session", sessions["h2"], "--to",
                                   sessions["h3"], "--subject", "kept %d" % n)[
                                       "message_id"])
        cluster.crash()
        held = sorted(l["fence"] for l in h3.cli("leases", "--session", sessions["h2"])[
            "leases"] if l["resource"].endswith(tuple("crash%d.py" % n for n in range(5))))
        got = [m["message_id"] for m in h3.cli("recv", "--session", sessions["h3"],
                                               "--limit", "100")["messages"]]
        check(held == sorted(claimed), "leases after the crash: %s of %s" % (held, claimed))
        check(got == sent_ids, "messages after the crash: %s of %s" % (got, sent_ids))
        report("a crash of the server", "5 leases and 5 messages acknowledged, all kept")

        # dead link: keepalive gives the idle connection up, the link comes back.
        mcp = Mcp(h3, h3.env(AGENTS_ROOM_PG_KEEPALIVE_S="1"))
        servers.append(mcp.proc)
        first = mcp.call("msg_send", session_id=sessions["h3"], to=sessions["h1"],
                         subject="before the cut")
        check(not first.get("isError"), "msg_send before the cut: %s" % first)
        h3.cut("02:00:00:00:00:01")
        cut = time.monotonic()
        try:
            while h3.connections(h3.proxy.port) and time.monotonic() - cut < 40:
                time.sleep(0.2)
            gave_up = time.monotonic() - cut
        finally:
            h3.cut()
        check(not h3.connections(h3.proxy.port), "keepalive kept the dead connection")
        started = time.monotonic()
        after = mcp.call("msg_send", session_id=sessions["h3"], to=sessions["h1"],
                         subject="after the cut")
        check(not after.get("isError"), "msg_send after the cut: %s" % after)
        report("a dead connection", "keepalive gave it up %.1f s into the cut; the next "
               "msg_send connected again and was stored in %.2f s" % (
                   gave_up, time.monotonic() - started))
        lock_lost(args, report, h2, h3, sessions)
        return 0
    finally:
        for proc in servers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for host in hosts + ([twin] if twin else []):
            host.close()
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


HOLDER = """
import os, sys
sys.path.insert(0, %r)
import agents_room as ar
store = ar.open_store()
try:
    with store.write() as conn:            # a plain write: the lock from its BEGIN
        ar.event(conn, "multihost.held")
        print("locked", flush=True)
        sys.stdin.readline()
    print("committed", flush=True)
except ar.RoomError as error:
    print("error: " + error.message.replace(chr(10), " "), flush=True)
ctx = ar.Context(cwd=os.getcwd())
sent = ar.call_tool(store, ctx, "msg_send", {"session_id": sys.argv[1], "to": sys.argv[2],
                                             "subject": "after the lost lock"})
print("sent %%d" %% sent["message_id"], flush=True)
with store.read() as conn:
    print("held %%d" %% conn.execute("SELECT COUNT(*) FROM events WHERE kind = "
                                    "'multihost.held'").fetchone()[0], flush=True)
"""


def lock_lost(args, report, other, cut, sessions):
    """A process on `cut` holds the room's lock; its link is cut for longer
    than the server lets a transaction sit idle (idle_in_transaction_session_
    timeout, lowered in its URL's options): the server ends that transaction
    and frees the lock, `other` proceeds, and the cut process, its link back,
    gets one clear error for the lost write and its next call is stored, once."""
    idle_ms = int(args.idle_s * 1000)
    env = cut.env(AGENTS_ROOM_DB=cut.db + "&options=-cidle_in_transaction_session_timeout"
                  "%%3D%d" % idle_ms)
    holder = cut.popen([sys.executable, "-c", HOLDER % ROOT, sessions[cut.name],
                        sessions[other.name]], env=env, stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = holder.stdout.readline().strip()
        check(line == "locked", "the holder on %s: %r %s" % (
            cut.name, line, holder.stderr.read()[-500:] if not line else ""))
        cut.cut("02:00:00:00:00:01")
        began = time.monotonic()
        try:
            claimed = other.cli("claim", "--session", sessions[other.name], "lockloss.py")
            waited = time.monotonic() - began
            check(claimed.get("ok"), "the claim on %s while the lock was lost: %s" % (
                other.name, claimed))
            while time.monotonic() - began < args.idle_s + 2:
                time.sleep(0.1)
        finally:
            cut.cut()
        link_down = time.monotonic() - began
        holder.stdin.write("go\n")
        holder.stdin.flush()
        out, err = holder.communicate(timeout=120)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    check("Traceback" not in err, "the holder: a traceback: %s" % err[-800:])
    lines = out.strip().splitlines()
    check(len(lines) == 3 and lines[0].startswith(("error: ", "committed")) and
          lines[1].startswith("sent "), "the holder after the cut: %s %s" % (lines, err[-300:]))
    written = int(lines[2].split()[1])
    check(written == (1 if lines[0] == "committed" else 0),
          "the held transaction's write: %s, stored %d times" % (lines[0], written))
    got = [m for m in other.cli("recv", "--session", sessions[other.name], "--limit",
                                "100")["messages"] if m["subject"] == "after the lost lock"]
    check(len(got) == 1, "the holder's next send arrived %d times" % len(got))
    other.cli("release", "--session", sessions[other.name], "lockloss.py")
    report("the lock through a lost link", "%s's link down %.1f s holding the lock: the "
           "server freed it, %s's claim waited %.1f s; then %s; its next send stored once"
           % (cut.name, link_down, other.name, waited, lines[0][-200:]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay-ms", type=float, default=20,
                        help="round trip added between each host and the server (20)")
    parser.add_argument("--rounds", type=int, default=10, help="lease rounds (10)")
    parser.add_argument("--sends", type=int, default=5,
                        help="sends from each host to each other host (5)")
    parser.add_argument("--idle-s", type=float, default=3,
                        help="the server ends a transaction idle this long, for the "
                             "lost-lock check (its URL's options; 30 by default) (3)")
    parser.add_argument("--timeout", type=float, default=420,
                        help="seconds for the whole run (420)")
    args = parser.parse_args()
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        print("multihost: skipped: needs root on Linux (network namespaces)")
        return SKIP
    for tool in ("ip", "unshare", "nsenter", "ss", "git"):
        if not shutil.which(tool):
            print("multihost: skipped: no %s" % tool)
            return SKIP

    def overdue(*_):
        raise Failure("the run took longer than %g s" % args.timeout)
    signal.signal(signal.SIGALRM, overdue)
    signal.alarm(int(args.timeout))
    begun = time.monotonic()

    mark = [begun]

    def report(name, detail):
        print("ok    %-24s %s (%.0f s)" % (name, detail, time.monotonic() - mark[0]),
              flush=True)
        mark[0] = time.monotonic()
    try:
        status = run(args, report)
    except Failure as failure:
        print("FAIL  %s" % failure, flush=True)
        status = 1
    print("multihost: %s in %.0f s (3 hosts, %g ms round trip to the server)" % (
        "passed" if status == 0 else "skipped" if status == SKIP else "FAILED",
        time.monotonic() - begun, args.delay_ms))
    return status


if __name__ == "__main__":
    sys.exit(main())
