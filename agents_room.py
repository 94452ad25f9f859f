#!/usr/bin/env python3
"""agents-room: where AI coding agents in different repositories meet.

Each agent session joins its repository's room (``repo:<name>``) and any shared
rooms (``shared:<name>``).  Sessions message each other by session id, by tag or
by the files they hold leases on; they lease paths, record the hash of what they
read and check it for drift.  One SQLite file, no daemon, standard library only.

Subcommands (``python3 agents_room.py <command> --help`` shows an example each):
  join leave leave-room who set-cap status   rooms and sessions
  send recv ack unread sent history          messages
  claim renew release check leases guard     leases on paths and kind:name resources
  install-guard                              git pre-commit hook running guard
  note-read drift                            reads and drift
  work window (request|ack|activate|...)     work states and quiet windows
  serve                                      MCP server over stdio
  hook setup doctor                          harness hooks and wake levers
  watch version bench prune                  follow, identify, measure, clean up

Python 3.9 or newer.  Tests: ``python3 test_agents_room.py`` (or ``make test``).

Environment:
  AGENTS_ROOM_DB            the store (default ~/.agents-room/room.db)
  AGENTS_ROOM_SESSION       default for --session in the CLI
  AGENTS_ROOM_HARNESS_KEY   harness key, before CLAUDE_CODE_SESSION_ID,
                            CODEX_THREAD_ID and HERMES_SESSION_ID
  AGENTS_ROOM_WAKE_CMD      a wake lever: a command run with the signal as its
                            last argument (split like a shell would, never run
                            by one)
  AGENTS_ROOM_GUARD         warn: guard reports but never refuses; off: skip it
  AGENTS_ROOM_SIGNAL_RETRY_S, AGENTS_ROOM_STOP_RETRY_S, AGENTS_ROOM_WAKE_TIMEOUT_S
                            signal windows and the process-lever timeout
Test seams (documented so tests never patch private names):
  AGENTS_ROOM_PROCSCAN=proc|ps   force the process scanner
  AGENTS_ROOM_PROC_ROOT=DIR      point the /proc scanner at another tree
  AGENTS_ROOM_TIME_OFFSET=SECS   shift this process's clock (TTL tests)
"""

__version__ = "0.1.0"

import json
import os
import sqlite3
import sys
import time

# ---- constants ------------------------------------------------------------

SCHEMA_VERSION = 3
MIN_SQLITE = (3, 31, 0)

HARNESS_KEY_VARS = ("AGENTS_ROOM_HARNESS_KEY", "CLAUDE_CODE_SESSION_ID",
                    "CODEX_THREAD_ID", "HERMES_SESSION_ID")
HARNESSES = ("claude-code", "codex", "hermes", "generic")

AUTONOMY_NAMES = ("notify", "hold", "wake")
ROOM_PREFIXES = ("repo:", "shared:")

MESSAGE_TTL_S = 7 * 86400
MESSAGE_TTL_MAX_S = 90 * 86400
LEASE_TTL_S = 15 * 60
LEASE_TTL_MAX_S = 24 * 3600
BODY_MAX_BYTES = 1024 * 1024
SUBJECT_MAX_CHARS = 1000
LABEL_MAX_CHARS = 200
ROOM_NAME_MAX_CHARS = 200
TAGS_MAX = 32
ROOMS_MAX = 64
SELECTORS_MAX = 100
PATH_MAX_CHARS = 4096
LIMIT_MAX = 1000
PRUNE_QUIET_S = 24 * 3600
EVENT_RETENTION_S = 30 * 86400        # the audit log keeps 30 days
MESSAGE_RETENTION_S = 90 * 86400      # history keeps a message 90 days past its TTL
RETENTION_BATCH = 200                 # rows removed per tool event, at most
RETENTION_EVERY_S = 60
BUSY_TIMEOUT_MS = 60000

WORK_STATES = ("started", "waiting", "blocked", "completed", "handoff", "failed")
WINDOW_OPEN = ("pending", "active")
WINDOW_TTL_S = 30 * 60
WINDOW_ACK_TIMEOUT_S = 5 * 60

# A delivery is unread in any of these states; read, acked and expired are final
# for the recipient's inbox.
UNREAD_STATES = ("stored", "offered", "accepted", "undeliverable")
UNREAD_SQL = "(%s)" % ", ".join("'%s'" % state for state in UNREAD_STATES)  # constants only
STATE_ORDER = ("stored", "offered", "accepted", "undeliverable", "read", "acked",
               "expired")

# ---- errors ---------------------------------------------------------------


class RoomError(Exception):
    """A refused or failed operation: exit 1, an isError tool result over MCP."""

    exit_code = 1
    code = "refused"

    def __init__(self, message, hint=None, code=None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if code:
            self.code = code

    def as_dict(self):
        return {"error": {"code": self.code, "message": self.message,
                          "hint": self.hint}}

    def text(self):
        return self.message + ("\nhint: " + self.hint if self.hint else "")


class UsageError(RoomError):
    """Arguments that do not fit the command: exit 2."""

    exit_code = 2
    code = "usage"


class UnknownSession(RoomError):
    """A session id that names no session; the message says what was meant."""

    code = "unknown_session"


class GuardRefused(RoomError):
    """guard found a conflict: exit 3, so hooks can tell it from an error."""

    exit_code = 3
    code = "conflict"


class StoreError(RoomError):
    """The store cannot be opened or written: the message names the path."""

    code = "store"


# ---- small utilities ------------------------------------------------------


def now():
    """Seconds since the epoch, shifted by AGENTS_ROOM_TIME_OFFSET (a test seam)."""
    offset = os.environ.get("AGENTS_ROOM_TIME_OFFSET")
    return time.time() + (float(offset) if offset else 0.0)


def iso(ts):
    """ISO-8601 UTC with milliseconds, or None."""
    if ts is None:
        return None
    ms = int(round((ts - int(ts)) * 1000))
    if ms == 1000:
        ts, ms = int(ts) + 1, 0
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(int(ts))) + ".%03dZ" % ms


def parse_duration(text):
    """'90', '90s', '15m', '2h', '7d' -> seconds (int)."""
    text = str(text).strip().lower()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    factor = units.get(text[-1:], None)
    number = text[:-1] if factor else text
    try:
        value = float(number)
    except ValueError:
        raise UsageError("not a duration: %r" % text,
                         "use seconds, or a number with s, m, h or d (15m, 2h)")
    return int(value * (factor or 1))


_CONTROL = None


def clean(text):
    """Strip terminal control characters from text shown to a human or a hook."""
    global _CONTROL
    if text is None:
        return ""
    if _CONTROL is None:
        import re
        _CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
    return _CONTROL.sub("", str(text))


def one_line(text, width=80):
    text = " ".join(clean(text).split())
    return text if len(text) <= width else text[:width - 1] + "…"


def is_session_id(value):
    return (isinstance(value, str) and len(value) == 16
            and all(c in "0123456789abcdef" for c in value))


def new_session_id():
    return os.urandom(8).hex()


def detect_harness(env):
    """The harness this process runs under, from its environment."""
    if env.get("CLAUDECODE") == "1":
        return "claude-code"
    if any(k.startswith("CODEX_") for k in env):
        return "codex"
    if any(k.startswith("HERMES_") for k in env):
        return "hermes"
    return "generic"


def harness_key_from(env):
    for var in HARNESS_KEY_VARS:
        value = env.get(var)
        if value:
            return value
    return None


def detect_lever(env, harness):
    """The wake lever a session's environment offers: (name, data) or (None, None).

    The Claude Code rewake waiter is not recorded here: it arms itself at run
    time (hook --event=Stop --wait) and is found through sessions.waiter_pid."""
    socket_path = env.get("CLAUDE_CODE_MESSAGING_SOCKET")
    token = env.get("CLAUDE_CODE_MESSAGING_TOKEN")
    if socket_path and token:
        return "claude-socket", {"socket": socket_path, "token": token}
    if harness == "codex" and env.get("CODEX_THREAD_ID"):
        return "codex-queue", {"thread": env["CODEX_THREAD_ID"]}
    command = env.get("AGENTS_ROOM_WAKE_CMD")
    if command:
        import shlex
        try:
            argv = shlex.split(command)
        except ValueError:
            argv = []
        if argv:
            return "wake-cmd", {"argv": argv}
    return None, None


def parse_autonomy(value):
    """0/1/2 or notify/hold/wake (also as strings) -> int; None stays None."""
    if value is None:
        return None
    if isinstance(value, bool):
        value = None
    elif isinstance(value, int):
        if 0 <= value <= 2:
            return value
    elif isinstance(value, str):
        text = value.strip().lower()
        if text in AUTONOMY_NAMES:
            return AUTONOMY_NAMES.index(text)
        if text in ("0", "1", "2"):
            return int(text)
    raise UsageError("autonomy must be 0/notify, 1/hold or 2/wake, not %r" % (value,))


def autonomy_name(level):
    return "%d (%s)" % (level, AUTONOMY_NAMES[level])


def repo_root(cwd):
    """The git top level containing cwd (a .git dir or file), else None."""
    path = os.path.abspath(cwd)
    while True:
        if os.path.exists(os.path.join(path, ".git")):
            return path
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def normalize_path(path, cwd):
    """Absolute, normalised form of path against cwd (~ expanded)."""
    if not isinstance(path, str) or not path.strip():
        raise UsageError("path must be a non-empty string")
    if "\x00" in path or len(path) > PATH_MAX_CHARS:
        raise UsageError("path is not usable (NUL byte, or longer than %d characters)"
                         % PATH_MAX_CHARS)
    return os.path.normpath(os.path.join(cwd, os.path.expanduser(path)))


def room_name(name, default_prefix):
    """A room's full name: bare names get default_prefix ('repo:' or 'shared:')."""
    if not isinstance(name, str) or not name.strip():
        raise UsageError("a room name must be a non-empty string")
    name = name.strip()
    if ":" in name:
        prefix, rest = name.split(":", 1)
        if prefix + ":" not in ROOM_PREFIXES:
            raise UsageError("unknown room prefix %r in %r" % (prefix + ":", name),
                             "rooms are repo:<name> or shared:<name>; a bare name "
                             "gets %s" % default_prefix)
        if not rest.strip():
            raise UsageError("room %r has no name after its prefix" % name)
    else:
        name = default_prefix + name
    if len(name) > ROOM_NAME_MAX_CHARS or any(c.isspace() for c in name):
        raise UsageError("room names have no spaces and at most %d characters: %r"
                         % (ROOM_NAME_MAX_CHARS, name))
    return name


def this_file():
    return os.path.abspath(__file__)


def sha256_file(path):
    import hashlib
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


# ---- store ----------------------------------------------------------------

SCHEMA_V1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    harness TEXT NOT NULL,
    harness_key TEXT,
    cwd TEXT NOT NULL,
    pid INTEGER,
    pid_start INTEGER,
    label TEXT,
    tags TEXT NOT NULL DEFAULT '[]',
    autonomy INTEGER NOT NULL DEFAULT 0,
    lever TEXT,
    lever_data TEXT,
    waiter_pid INTEGER,
    waiter_start INTEGER,
    waiter_until REAL,
    created_at REAL NOT NULL,
    last_seen REAL NOT NULL,
    left_at REAL
);
CREATE UNIQUE INDEX sessions_harness_key ON sessions(harness_key)
    WHERE harness_key IS NOT NULL;
CREATE INDEX sessions_label ON sessions(label);
CREATE INDEX sessions_last_seen ON sessions(last_seen);
CREATE TABLE rooms (
    name TEXT PRIMARY KEY,
    cap INTEGER NOT NULL DEFAULT 2,
    created_at REAL NOT NULL
);
CREATE TABLE memberships (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    room TEXT NOT NULL REFERENCES rooms(name),
    joined_at REAL NOT NULL,
    PRIMARY KEY (session_id, room)
) WITHOUT ROWID;
CREATE INDEX memberships_room ON memberships(room, session_id);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    sender TEXT NOT NULL,
    sender_label TEXT,
    selector TEXT NOT NULL,
    subject TEXT,
    body TEXT,
    reply_to INTEGER,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX messages_sender ON messages(sender, id);
CREATE INDEX messages_expires ON messages(expires_at);
CREATE TABLE message_rooms (
    room TEXT NOT NULL,
    message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    PRIMARY KEY (room, message_id)
) WITHOUT ROWID;
CREATE INDEX message_rooms_message ON message_rooms(message_id);
CREATE TABLE deliveries (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    state TEXT NOT NULL,
    updated_at REAL NOT NULL,
    offered_at REAL,
    stop_held_at REAL,
    read_at REAL,
    wake_attempts INTEGER NOT NULL DEFAULT 0,
    wake_next_at REAL,
    PRIMARY KEY (session_id, message_id)
) WITHOUT ROWID;
CREATE INDEX deliveries_message ON deliveries(message_id);
CREATE INDEX deliveries_state ON deliveries(session_id, state);
CREATE INDEX deliveries_wake ON deliveries(wake_next_at) WHERE wake_next_at IS NOT NULL;
CREATE TABLE leases (
    id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    path TEXT NOT NULL,
    mode TEXT NOT NULL,
    acquired_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    UNIQUE (session_id, path)
);
CREATE INDEX leases_path ON leases(path);
CREATE INDEX leases_expires ON leases(expires_at);
CREATE TABLE reads (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    path TEXT NOT NULL,
    hash TEXT,
    read_at REAL NOT NULL,
    PRIMARY KEY (session_id, path)
) WITHOUT ROWID;
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    session_id TEXT,
    room TEXT,
    subject TEXT,
    data TEXT
);
CREATE INDEX events_subject ON events(subject, at);
CREATE INDEX events_session ON events(session_id, at);
"""

# MIGRATIONS[n] takes a store from user_version n to n + 1.  A store newer than
# the last entry is refused untouched: an older program cannot know what a
# newer schema means, and guessing would corrupt it.
def _migrate_v2(conn):
    """Leases on typed resources: kind, the comparison key, a purpose."""
    conn.execute("ALTER TABLE leases ADD COLUMN kind TEXT NOT NULL DEFAULT 'path'")
    conn.execute("ALTER TABLE leases ADD COLUMN key TEXT")
    conn.execute("ALTER TABLE leases ADD COLUMN purpose TEXT")
    conn.execute("UPDATE leases SET key = path")
    conn.execute("CREATE INDEX leases_key ON leases(kind, key)")


SCHEMA_V3 = """
CREATE TABLE work (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    scope TEXT NOT NULL,
    state TEXT NOT NULL,
    summary TEXT,
    updated_at REAL NOT NULL,
    PRIMARY KEY (session_id, scope)
) WITHOUT ROWID;
CREATE TABLE windows (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    purpose TEXT,
    state TEXT NOT NULL,
    required TEXT NOT NULL,
    acked TEXT NOT NULL,
    created_at REAL NOT NULL,
    ack_deadline REAL NOT NULL,
    expires_at REAL NOT NULL,
    activated_at REAL,
    ended_at REAL
);
CREATE INDEX windows_open ON windows(state, expires_at);
CREATE TABLE window_resources (
    window_id INTEGER NOT NULL REFERENCES windows(id) ON DELETE CASCADE,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    shown TEXT NOT NULL
);
CREATE INDEX window_resources_key ON window_resources(kind, key);
CREATE INDEX window_resources_window ON window_resources(window_id);
CREATE INDEX events_kind ON events(kind, id);
"""

MIGRATIONS = [SCHEMA_V1, _migrate_v2, SCHEMA_V3]


def default_db_path():
    configured = os.environ.get("AGENTS_ROOM_DB")
    if configured:
        return os.path.abspath(os.path.expanduser(configured))
    return os.path.join(os.path.expanduser("~"), ".agents-room", "room.db")


def explain_sqlite(error, path):
    """Turn a sqlite3 error into a StoreError that names the path and a remedy."""
    text = str(error)
    lower = text.lower()
    if "readonly" in lower or "read-only" in lower:
        return StoreError("the store %s is read-only (%s)" % (path, text),
                          "make the file and its directory writable by you, or "
                          "point AGENTS_ROOM_DB at a writable path")
    if "not a database" in lower or "malformed" in lower:
        return StoreError("%s is not an agents-room store, or is damaged (%s)"
                          % (path, text),
                          "move it aside or point AGENTS_ROOM_DB elsewhere; "
                          "nothing was written to it")
    if "disk is full" in lower or "disk i/o" in lower:
        return StoreError("cannot write the store %s: %s" % (path, text),
                          "free space on that disk; the failed change was rolled "
                          "back, nothing half-written")
    if "locked" in lower or "busy" in lower:
        return StoreError("the store %s stayed locked for %d s (%s)"
                          % (path, BUSY_TIMEOUT_MS // 1000, text),
                          "another process holds a long write transaction; retry")
    if "unable to open" in lower:
        return StoreError("cannot open the store %s (%s)" % (path, text),
                          "check that the directory exists and is writable, or "
                          "set AGENTS_ROOM_DB")
    return StoreError("store error at %s: %s" % (path, text))


class Store:
    """One connection to the SQLite store, with the transaction helper.

    Every read-check-write runs in BEGIN IMMEDIATE: the write lock is taken
    before the first read, so two agents can never both see a path free and
    both claim it.  busy_timeout makes a waiting writer queue instead of
    failing with 'database is locked'.
    """

    def __init__(self, path=None):
        self.path = path or default_db_path()
        self.conn = None
        self._open()

    def _open(self):
        directory = os.path.dirname(self.path)
        try:
            if directory and not os.path.isdir(directory):
                os.makedirs(directory, mode=0o700, exist_ok=True)
            if not os.path.exists(self.path):
                # Create the file 0600 ourselves: sqlite would honour the umask.
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        except OSError as error:
            raise StoreError("cannot create the store %s: %s"
                             % (self.path, error.strerror or error),
                             "make %s writable or set AGENTS_ROOM_DB to another "
                             "path" % (directory or "."))
        try:
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000,
                                   isolation_level=None, check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA busy_timeout=%d" % BUSY_TIMEOUT_MS)
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA synchronous=NORMAL")
            self.conn = conn
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.Error as error:
            raise explain_sqlite(error, self.path)
        if version > len(MIGRATIONS):
            self.close()
            raise StoreError(
                "the store %s has schema version %d, written by a newer "
                "agents-room; this one (%s) knows up to %d" % (
                    self.path, version, __version__, len(MIGRATIONS)),
                "upgrade agents_room.py, or set AGENTS_ROOM_DB to another store; "
                "the store was not modified")
        if version < len(MIGRATIONS):
            self._migrate()

    def _migrate(self):
        conn = self.conn
        try:
            mode = self._set_wal()
            if mode.lower() != "wal":
                raise StoreError("the store %s cannot use WAL mode (got %s)"
                                 % (self.path, mode),
                                 "put the store on a local filesystem")
            conn.execute("BEGIN IMMEDIATE")
            try:
                # Re-read inside the lock: another process may have migrated.
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                for step in range(version, len(MIGRATIONS)):
                    migration = MIGRATIONS[step]
                    if callable(migration):
                        migration(conn)
                    else:
                        for statement in migration.split(";"):
                            if statement.strip():
                                conn.execute(statement)
                    conn.execute("PRAGMA user_version=%d" % (step + 1))
                if version < len(MIGRATIONS):
                    event(conn, "store.migrate", data={"from": version,
                                                       "to": len(MIGRATIONS)})
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as error:
            raise explain_sqlite(error, self.path)

    def _set_wal(self):
        """Switch to WAL.  The switch takes a lock without SQLite's busy handler,
        so processes that create the store at the same moment get 'database is
        locked' at once: retry within the busy timeout instead."""
        deadline = time.time() + BUSY_TIMEOUT_MS / 1000.0
        delay = 0.005
        while True:
            try:
                return self.conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) or time.time() > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.1)

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def write(self):
        return _Transaction(self, "BEGIN IMMEDIATE")

    def read(self):
        return _Transaction(self, "BEGIN")


class _Transaction:
    def __init__(self, store, begin):
        self.store, self.begin = store, begin

    def __enter__(self):
        try:
            self.store.conn.execute(self.begin)
        except sqlite3.Error as error:
            raise explain_sqlite(error, self.store.path)
        return self.store.conn

    def __exit__(self, kind, value, traceback):
        conn = self.store.conn
        if kind is None:
            try:
                conn.execute("COMMIT")
                return False
            except sqlite3.Error as error:
                # A failed COMMIT (disk full, I/O error) may already have rolled
                # the transaction back; either way nothing of it was kept.
                if conn.in_transaction:
                    try:
                        conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                raise explain_sqlite(error, self.store.path)
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        if isinstance(value, sqlite3.Error):
            raise explain_sqlite(value, self.store.path)
        return False


def event(conn, kind, session_id=None, room=None, subject=None, data=None, at=None):
    """Append one audit row; callers do it inside the change's own transaction."""
    conn.execute(
        "INSERT INTO events (at, kind, session_id, room, subject, data) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (now() if at is None else at, kind, session_id, room,
         None if subject is None else str(subject),
         None if data is None else json.dumps(data, sort_keys=True)))


def sweep_windows(conn, at):
    """Windows move on with time: pending past its ack deadline without every
    ack, or any open window past its end, expires."""
    for window in conn.execute(
            "SELECT * FROM windows WHERE state IN ('pending', 'active') AND "
            "(expires_at <= ? OR (state = 'pending' AND ack_deadline <= ?))",
            (at, at)).fetchall():
        required = set(json.loads(window["required"]))
        acked = set(json.loads(window["acked"]))
        if window["expires_at"] > at and required <= acked:
            continue          # acked in time: it may still activate until it ends
        conn.execute("UPDATE windows SET state='expired', ended_at=? WHERE id=?",
                     (at, window["id"]))
        event(conn, "window.expire", window["session_id"], subject=window["id"], at=at,
              data={"was": window["state"], "missing_acks": sorted(required - acked)})


def retention(conn, at, batch=RETENTION_BATCH):
    """Drop audit events older than the event retention and messages long past
    their TTL (with their deliveries and room rows), a bounded batch at a time,
    so the store does not grow without bound and no call pays for a big purge.
    Returns (events, messages) removed."""
    events_cutoff = at - float(os.environ.get("AGENTS_ROOM_EVENT_RETENTION_S")
                               or EVENT_RETENTION_S)
    messages_cutoff = at - float(os.environ.get("AGENTS_ROOM_MESSAGE_RETENTION_S")
                                 or MESSAGE_RETENTION_S)
    # The oldest rows by id, then their times: bounded even when none is old
    # (a WHERE on the unindexed time would read the whole log to find nothing).
    old_events = [r[0] for r in conn.execute(
        "SELECT id, at FROM events WHERE id < (SELECT MIN(id) FROM events) + ?",
        (batch,)) if r[1] < events_cutoff]
    conn.executemany("DELETE FROM events WHERE id=?", [(i,) for i in old_events])
    old_messages = [r[0] for r in conn.execute(
        "SELECT id FROM messages WHERE expires_at < ? ORDER BY expires_at LIMIT ?",
        (messages_cutoff, batch))]
    conn.executemany("DELETE FROM messages WHERE id=?", [(i,) for i in old_messages])
    return len(old_events), len(old_messages)


def sweep(conn, at):
    """Expire what passed its TTL: deliveries unread past their message's TTL,
    leases past their expiry.  Runs on every write, bounded by indexes."""
    row = conn.execute("SELECT value FROM meta WHERE key='expiry_swept_to'").fetchone()
    swept_to = float(row[0]) if row else 0.0
    ids = []
    if at > swept_to:
        ids = [r[0] for r in conn.execute(
            "SELECT id FROM messages WHERE expires_at > ? AND expires_at <= ?",
            (swept_to, at))]
        for message_id in ids:
            count = conn.execute(
                "UPDATE deliveries SET state='expired', updated_at=?, wake_next_at=NULL "
                "WHERE message_id=? AND state IN " + UNREAD_SQL,
                (at, message_id)).rowcount
            if count:
                event(conn, "msg.expire", subject=message_id,
                      data={"deliveries": count}, at=at)
    # The watermark only bounds the next scan of an index range; writing it on
    # every call would add a page write to every transaction.  Retention rides
    # the same once-a-minute beat.
    if ids or at - swept_to > RETENTION_EVERY_S:
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES "
                     "('expiry_swept_to', ?)", (repr(at),))
        if at - swept_to > RETENTION_EVERY_S:
            retention(conn, at)
    sweep_windows(conn, at)
    for lease in conn.execute("SELECT id, session_id, path, mode, expires_at "
                              "FROM leases WHERE expires_at <= ?", (at,)).fetchall():
        conn.execute("DELETE FROM leases WHERE id=?", (lease["id"],))
        event(conn, "lease.expire", lease["session_id"], subject=lease["path"],
              data={"mode": lease["mode"], "expires_at": lease["expires_at"]}, at=at)


# ---- liveness (process scan) ---------------------------------------------


def proc_root():
    return os.environ.get("AGENTS_ROOM_PROC_ROOT") or "/proc"


def scanner_kind():
    forced = os.environ.get("AGENTS_ROOM_PROCSCAN")
    if forced in ("proc", "ps"):
        return forced
    return "proc" if os.path.isdir(os.path.join(proc_root(), "self")) or \
        os.environ.get("AGENTS_ROOM_PROC_ROOT") else "ps"


def _proc_boot_time(root):
    try:
        with open(os.path.join(root, "stat")) as handle:
            for line in handle:
                if line.startswith("btime "):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _proc_start(root, pid, boot):
    """Start time (epoch seconds) of pid under a /proc tree, or None."""
    try:
        with open(os.path.join(root, str(pid), "stat")) as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])
    except (OSError, IndexError, ValueError):
        return None
    if boot is None:
        return None
    return boot + ticks // os.sysconf("SC_CLK_TCK")


def _ps_lstart(text):
    try:
        return int(time.mktime(time.strptime(" ".join(text.split()),
                                             "%a %b %d %H:%M:%S %Y")))
    except ValueError:
        return None


def process_start(pid):
    """Start time of a running process, to tell it from a later one with the same
    pid; None when it does not run or cannot be read."""
    if not pid:
        return None
    if scanner_kind() == "proc":
        root = proc_root()
        return _proc_start(root, pid, _proc_boot_time(root))
    import subprocess
    try:
        out = subprocess.run(["ps", "-o", "lstart=", "-p", str(pid)],
                             capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return _ps_lstart(out) if out.strip() else None


class ProcessScan:
    """One look at the running processes of this user, shared by every session a
    call answers for: which harness keys are in some process's environment, and
    the start time of each process."""

    def __init__(self):
        self.keys = set()
        self.starts = {}          # pid -> start epoch, or None if not inspectable
        self.own = set()          # pids of this user's running processes
        self.kind = scanner_kind()
        self.root = proc_root()
        self.boot = None
        if self.kind == "proc":
            self._scan_proc()
        else:
            self._scan_ps()

    def _scan_proc(self):
        root = self.root
        uid = os.getuid()
        markers = tuple(var.encode() + b"=" for var in HARNESS_KEY_VARS)
        try:
            names = os.listdir(root)
        except OSError:
            return
        for name in names:
            if not name.isdigit():
                continue
            pid = int(name)
            base = os.path.join(root, name)
            try:
                if os.stat(base).st_uid != uid:
                    continue
            except OSError:
                continue
            self.own.add(pid)
            try:
                with open(os.path.join(base, "environ"), "rb") as handle:
                    data = handle.read()
            except OSError:
                # Many own processes refuse this (pid 1 in a container,
                # ssh-agent): skip it, it proves nothing about anyone.
                continue
            if not any(marker in data for marker in markers):
                continue
            for item in data.split(b"\0"):
                for marker in markers:
                    if item.startswith(marker) and len(item) > len(marker):
                        self.keys.add(item[len(marker):].decode("utf-8", "replace"))

    def _scan_ps(self):
        import subprocess
        env_flag = {"darwin": "-E"}.get(sys.platform, "e" if sys.platform.startswith(
            "linux") else "-e")
        command = ["ps", env_flag, "-ww", "-U", str(os.getuid()),
                   "-o", "pid=,lstart=,command="]
        if env_flag == "e":
            command = ["ps", "eww", "-U", str(os.getuid()), "-o", "pid=,lstart=,args="]
        try:
            out = subprocess.run(command, capture_output=True, text=True,
                                 timeout=10, errors="replace").stdout
        except (OSError, subprocess.SubprocessError):
            return
        prefixes = tuple(var + "=" for var in HARNESS_KEY_VARS)
        for line in out.splitlines():
            parts = line.split()
            if len(parts) < 6 or not parts[0].isdigit():
                continue
            self.own.add(int(parts[0]))
            self.starts[int(parts[0])] = _ps_lstart(" ".join(parts[1:6]))
            for token in parts[6:]:
                if token.startswith(prefixes):
                    value = token.split("=", 1)[1]
                    if value:
                        self.keys.add(value)

    def start_of(self, pid):
        """Start time of one of the scanned processes, read when first asked:
        only recorded pids need it, so the scan does not read every stat file."""
        if pid not in self.starts:
            if self.boot is None:
                self.boot = _proc_boot_time(self.root)
            self.starts[pid] = _proc_start(self.root, pid, self.boot)
        return self.starts[pid]

    def liveness(self, harness_key, pid, pid_start):
        """alive / gone / unknown, as SPEC §6 defines them."""
        if harness_key and harness_key in self.keys:
            return "alive"
        if pid:
            if pid in self.own:
                started = self.start_of(pid)
                if started is None:
                    return "unknown"
                if pid_start is None or abs(started - pid_start) <= 2:
                    return "alive"
        if harness_key or pid:
            return "gone"
        return "unknown"


class LazyScan:
    """Scan at most once, and only if some answer needs liveness.

    The caller's own process needs no scan: if it carries the session's harness
    key, or is the session's recorded process, it is running right now, which
    is exactly what the scan would find.  That keeps a claim or a check by an
    MCP server or a hook from reading every process on the machine."""

    def __init__(self, ctx=None):
        self._scan = None
        self.key = harness_key_from(ctx.env) if ctx is not None else None
        self.pid = ctx.pid if ctx is not None else None
        self.pid_start = ctx.pid_start if ctx is not None else None

    def __call__(self, row):
        if (self.key and row["harness_key"] == self.key) or (
                self.pid and row["pid"] == self.pid and row["pid_start"] == self.pid_start):
            return "alive"
        if self._scan is None:
            self._scan = ProcessScan()
        return self._scan.liveness(row["harness_key"], row["pid"], row["pid_start"])


# ---- tool registry and argument checking ----------------------------------
# Each operation is registered with its MCP metadata and CLI shape beside it, so
# adding a tool is one edit in one place.  Liveness sits above this section
# because who, leases and prune answer with it.


class Tool:
    def __init__(self, fn, name, title, params, required, output, cli, positional,
                 flags, example, read_only, destructive, idempotent):
        self.fn, self.name, self.title = fn, name, title
        self.params, self.required, self.output = params, tuple(required), output
        self.cli, self.positional, self.flags = cli, positional, flags
        self.example = example
        self.annotations = {"title": title, "readOnlyHint": read_only,
                            "destructiveHint": destructive,
                            "idempotentHint": idempotent, "openWorldHint": False}

    @property
    def description(self):
        return " ".join((self.fn.__doc__ or "").split())

    def input_schema(self):
        return {"type": "object", "properties": self.params,
                "required": list(self.required), "additionalProperties": False}


TOOLS = {}


def tool(name, title, params, required=(), output=None, cli=None, positional=(),
         flags=None, example="", read_only=False, destructive=False, idempotent=False):
    def register(fn):
        TOOLS[name] = Tool(fn, name, title, params, required, output or {"type": "object"},
                           cli, positional, flags or {}, example, read_only,
                           destructive, idempotent)
        return fn
    return register


def check_value(schema, value, where):
    """Check value against the subset of JSON Schema the tools use."""
    types = schema.get("type")
    if types:
        types = types if isinstance(types, list) else [types]
        ok = False
        for kind in types:
            if kind == "string" and isinstance(value, str):
                ok = True
            elif kind == "integer" and isinstance(value, int) and not isinstance(value, bool):
                ok = True
            elif kind == "number" and isinstance(value, (int, float)) \
                    and not isinstance(value, bool):
                ok = True
            elif kind == "boolean" and isinstance(value, bool):
                ok = True
            elif kind == "array" and isinstance(value, list):
                ok = True
            elif kind == "object" and isinstance(value, dict):
                ok = True
            elif kind == "null" and value is None:
                ok = True
        if not ok:
            raise UsageError("%s must be %s, not %s" % (
                where, " or ".join(types), type(value).__name__ if value is not None
                else "null"))
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError("%s is not valid Unicode (a lone surrogate)" % where)
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            raise UsageError("%s is longer than %d characters" % (where, schema["maxLength"]))
        if "minLength" in schema and len(value) < schema["minLength"]:
            raise UsageError("%s must not be empty" % where)
        if "enum" in schema and value not in schema["enum"]:
            raise UsageError("%s must be one of %s, not %r" % (
                where, ", ".join(map(str, schema["enum"])), value))
    if isinstance(value, int) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise UsageError("%s must be at least %s, not %d" % (where, schema["minimum"], value))
        if "maximum" in schema and value > schema["maximum"]:
            raise UsageError("%s must be at most %s, not %d" % (where, schema["maximum"], value))
        if "enum" in schema and value not in schema["enum"]:
            raise UsageError("%s must be one of %s" % (where, schema["enum"]))
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise UsageError("%s has more than %d items" % (where, schema["maxItems"]))
        if "minItems" in schema and len(value) < schema["minItems"]:
            raise UsageError("%s needs at least %d item(s)" % (where, schema["minItems"]))
        for index, item in enumerate(value):
            check_value(schema.get("items", {}), item, "%s[%d]" % (where, index))


def check_args(tool_, args):
    if not isinstance(args, dict):
        raise UsageError("arguments must be an object")
    unknown = sorted(set(args) - set(tool_.params))
    if unknown:
        raise UsageError("%s takes no argument %s" % (tool_.name, ", ".join(unknown)),
                         "it takes: %s" % ", ".join(sorted(tool_.params)))
    missing = [name for name in tool_.required if args.get(name) is None]
    if missing:
        raise UsageError("%s needs %s" % (tool_.name, ", ".join(missing)))
    for name, value in args.items():
        if value is not None:
            check_value(tool_.params[name], value, name)


class Context:
    """Who is calling: the front end ('cli', 'mcp' or 'hook'), its working
    directory, environment, and the pid a join should record."""

    def __init__(self, via="cli", cwd=None, env=None, pid=None, pid_start=None):
        self.via = via
        self.cwd = cwd or os.getcwd()
        self.env = os.environ if env is None else env
        self.pid = pid
        self.pid_start = pid_start


def call_tool(store, ctx, name, args):
    """The one entry point both front ends use: check, then run the operation."""
    tool_ = TOOLS.get(name)
    if tool_ is None:
        raise UsageError("no tool %r" % name, "tools: %s" % ", ".join(sorted(TOOLS)))
    args = {k: v for k, v in (args or {}).items()} if isinstance(args, dict) else args
    check_args(tool_, args)
    try:
        return tool_.fn(store, ctx, **{k: v for k, v in args.items() if v is not None})
    except sqlite3.Error as error:
        raise explain_sqlite(error, store.path)


# Schema fragments shared by the tools.
S_SESSION = {"type": "string", "maxLength": 200,
             "description": "your session id: the 16-hex id room_join returned"}
S_SESSION_OPT = dict(S_SESSION, description="your session id (optional here)")
S_PATH = {"type": "string", "minLength": 1, "maxLength": PATH_MAX_CHARS,
          "description": "a file path; relative paths resolve against your session's cwd"}
S_ROOM = {"type": "string", "minLength": 1, "maxLength": ROOM_NAME_MAX_CHARS,
          "description": "repo:<name> or shared:<name>; a bare name matches either"}
S_LIMIT = {"type": "integer", "minimum": 1, "maximum": LIMIT_MAX}
S_AUTONOMY = {"type": ["integer", "string"],
              "description": "0/notify, 1/hold or 2/wake"}
S_TIME = {"type": ["string", "null"], "description": "ISO-8601 UTC"}
S_LIVENESS = {"type": "string", "enum": ["alive", "gone", "unknown"]}
S_LEASE = {"type": "object", "properties": {
    "session_id": {"type": "string"}, "label": {"type": ["string", "null"]},
    "path": {"type": "string"}, "resource": {"type": "string"},
    "kind": {"type": "string"}, "purpose": {"type": ["string", "null"]},
    "mode": {"type": "string"},
    "acquired_at": S_TIME, "expires_at": S_TIME, "liveness": S_LIVENESS},
    "required": ["session_id", "label", "path", "mode", "acquired_at", "expires_at",
                 "liveness"]}
S_LEASE_OR_NULL = dict(S_LEASE, type=["object", "null"])
S_MESSAGE = {"type": "object", "properties": {
    "message_id": {"type": "integer"}, "sender": {"type": "string"},
    "sender_label": {"type": ["string", "null"]}, "subject": {"type": ["string", "null"]},
    "body": {"type": ["string", "null"]}, "reply_to": {"type": ["integer", "null"]},
    "created_at": S_TIME, "expires_at": S_TIME,
    "rooms": {"type": "array", "items": {"type": "string"}}},
    "required": ["message_id", "sender", "sender_label", "subject", "body", "reply_to",
                 "created_at", "expires_at", "rooms"]}
S_SESSION_ROW = {"type": "object", "properties": {
    "session_id": {"type": "string"}, "label": {"type": ["string", "null"]},
    "harness": {"type": "string"}, "cwd": {"type": "string"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "rooms": {"type": "array", "items": {"type": "string"}},
    "autonomy": {"type": "integer"}, "autonomy_requested": {"type": "integer"},
    "liveness": S_LIVENESS, "last_seen": S_TIME},
    "required": ["session_id", "label", "harness", "cwd", "tags", "rooms", "autonomy",
                 "liveness", "last_seen"]}
S_OK = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


def out_schema(required, **props):
    return {"type": "object", "properties": props, "required": list(required)}


# ---- operations: sessions and rooms ---------------------------------------


def session_row(conn, session_id):
    return conn.execute("SELECT * FROM sessions WHERE id=?", (session_id,)).fetchone()


def unknown_session(conn, value, path):
    """The error for a session id that names nothing, naming what was meant."""
    if not isinstance(value, str):
        return UnknownSession("not a session id (expected 16 lowercase hex)")
    text = value.strip()
    row = conn.execute("SELECT id, label FROM sessions WHERE harness_key=?",
                       (text,)).fetchone()
    if row:
        return UnknownSession(
            "that is a harness key; your session id is %s" % row["id"],
            "pass session_id=%s (room_join returns it)" % row["id"])
    candidates = []
    lowered = text.lower()
    if 4 <= len(lowered) < 16 and all(c in "0123456789abcdef" for c in lowered):
        candidates = conn.execute(
            "SELECT id, label FROM sessions WHERE id >= ? AND id < ? ORDER BY last_seen "
            "DESC LIMIT 6", (lowered, lowered + "g")).fetchall()
    if not candidates and text:
        candidates = conn.execute(
            "SELECT id, label FROM sessions WHERE label = ? COLLATE NOCASE "
            "ORDER BY last_seen DESC LIMIT 6", (text,)).fetchall()
    if candidates:
        names = ["%s (label %s)" % (r["id"], r["label"] or "-") for r in candidates[:5]]
        return UnknownSession("no session %r; did you mean %s?"
                              % (text, " or ".join(names)),
                              "session ids are 16 lowercase hex; use the whole id")
    if is_session_id(text):
        return UnknownSession(
            "no such session: %s may have left, or belong to another store "
            "(this store is %s)" % (text, path),
            "join again with room_join, or check AGENTS_ROOM_DB")
    return UnknownSession("not a session id: %r (expected 16 lowercase hex)" % text[:80],
                          "room_join returns your session id")


def require_session(store, conn, session_id, *, present=False, touch=True):
    """The session row for session_id, or the error naming what was meant.

    present=True refuses a session that has left: it may still read, but not
    send or claim.  touch updates last_seen (every tool call by a session does).
    """
    row = session_row(conn, session_id) if is_session_id(session_id) else None
    if row is None:
        raise unknown_session(conn, session_id, store.path)
    if present and row["left_at"] is not None:
        raise RoomError("session %s has left; join again" % row["id"],
                        "room_join with the same harness key gives it back its id")
    if touch:
        conn.execute("UPDATE sessions SET last_seen=? WHERE id=?", (now(), row["id"]))
    return row


def rooms_of(conn, session_id):
    return [r[0] for r in conn.execute(
        "SELECT room FROM memberships WHERE session_id=? ORDER BY room", (session_id,))]


def effective_autonomy(conn, row):
    cap = conn.execute(
        "SELECT MIN(r.cap) FROM memberships m JOIN rooms r ON r.name=m.room "
        "WHERE m.session_id=?", (row["id"],)).fetchone()[0]
    return row["autonomy"] if cap is None else min(row["autonomy"], cap)


def resolve_room(conn, name):
    """An existing room from a full or bare name; a bare name matching both
    repo:x and shared:x is ambiguous and the error lists both."""
    if not isinstance(name, str) or not name.strip():
        raise UsageError("a room name must be a non-empty string")
    name = name.strip()
    if ":" in name:
        full = room_name(name, "shared:")
        if conn.execute("SELECT 1 FROM rooms WHERE name=?", (full,)).fetchone():
            return full
        candidates = [full]
    else:
        candidates = [p + name for p in ROOM_PREFIXES]
        found = [c for c in candidates if
                 conn.execute("SELECT 1 FROM rooms WHERE name=?", (c,)).fetchone()]
        if len(found) == 1:
            return found[0]
        if len(found) == 2:
            raise UsageError("room %r is ambiguous: both %s exist" % (name, " and ".join(found)),
                             "name it with its prefix")
    known = [r[0] for r in conn.execute("SELECT name FROM rooms ORDER BY name LIMIT 20")]
    raise RoomError("no room %s" % " or ".join(candidates),
                    "rooms in this store: %s" % (", ".join(known) or "none yet"),
                    code="unknown_room")


def default_room_of(conn, row):
    rooms = rooms_of(conn, row["id"])
    repo = [r for r in rooms if r.startswith("repo:")]
    if repo:
        return repo[0]
    if rooms:
        return rooms[0]
    raise RoomError("session %s is in no room" % row["id"], "join a room first")


def room_for(conn, room, caller, command):
    """The room a command acts on: the one named, else the caller's repository
    room; with neither, a usage error."""
    if room:
        return resolve_room(conn, room)
    if caller is not None:
        return default_room_of(conn, caller)
    raise UsageError("%s needs a room (or a session, for its repository room)" % command)


def ensure_room(conn, name, at):
    conn.execute("INSERT OR IGNORE INTO rooms (name, cap, created_at) VALUES (?, 2, ?)",
                 (name, at))


def work_of(conn, session_id):
    return [{"scope": r["scope"], "state": r["state"], "summary": r["summary"],
             "updated_at": iso(r["updated_at"])} for r in conn.execute(
        "SELECT * FROM work WHERE session_id=? ORDER BY updated_at", (session_id,))]


def session_dict(conn, row, liveness):
    return {
        "session_id": row["id"], "label": row["label"], "harness": row["harness"],
        "cwd": row["cwd"], "tags": json.loads(row["tags"]),
        "rooms": rooms_of(conn, row["id"]),
        "autonomy": effective_autonomy(conn, row),
        "autonomy_requested": row["autonomy"],
        "liveness": liveness(row), "last_seen": iso(row["last_seen"]),
        "created_at": iso(row["created_at"]), "pid": row["pid"],
        "lever": row["lever"], "left": row["left_at"] is not None,
        "work": work_of(conn, row["id"]),
    }


def _string_list(value, what, limit):
    if value is None:
        return None
    values = [value] if isinstance(value, str) else list(value)
    values = [v.strip() for v in values if isinstance(v, str) and v.strip()]
    if len(values) > limit:
        raise UsageError("at most %d %s" % (limit, what))
    return values


@tool("room_join", "Join rooms", {
    "room": dict(S_ROOM, description="your repository room; default repo:<git top level "
                 "of cwd>; a bare name gets repo:"),
    "extra_rooms": {"type": "array", "items": S_ROOM, "maxItems": ROOMS_MAX,
                    "description": "shared rooms to join too; a bare name gets shared:"},
    "label": {"type": "string", "maxLength": LABEL_MAX_CHARS,
              "description": "a short name others see, e.g. api"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 100},
             "maxItems": TAGS_MAX, "description": "tags others can address with tag:<tag>"},
    "autonomy": S_AUTONOMY,
    "harness": {"type": "string", "enum": list(HARNESSES)},
    "harness_key": {"type": "string", "maxLength": 200,
                    "description": "the harness's own session key; read from the "
                    "environment when not given"},
    "cwd": {"type": "string", "maxLength": PATH_MAX_CHARS,
            "description": "working directory to record; default the caller's"},
}, output=out_schema(["session_id", "rooms", "autonomy"],
                     session_id={"type": "string"},
                     rooms={"type": "array", "items": {"type": "string"}},
                     autonomy={"type": "integer"},
                     autonomy_requested={"type": "integer"},
                     warning={"type": "string"}),
    cli="join", flags={"extra_rooms": "--also", "tags": "--tag"},
    example="join --room repo:api --also storefront --label api --autonomy 2",
    idempotent=True)
def room_join(store, ctx, room=None, extra_rooms=None, label=None, tags=None,
              autonomy=None, harness=None, harness_key=None, cwd=None):
    """Join your repository room and any shared rooms; returns your session_id,
    which every other tool takes. Call it once at the start and keep the id.
    Rejoining with the same harness key returns the same session and adds the
    rooms named; label and tags change only when given; autonomy is kept unless
    raised (lowering is refused with a warning: only a room cap lowers it)."""
    level = parse_autonomy(autonomy)
    cwd = os.path.abspath(os.path.expanduser(cwd)) if cwd else ctx.cwd
    key = harness_key or harness_key_from(ctx.env)
    # A rejoin from a plain terminal detects nothing: it keeps the harness the
    # session was joined with rather than overwrite it with 'generic'.
    detected = harness or detect_harness(ctx.env)
    tags = _string_list(tags, "tags", TAGS_MAX)
    if room:
        home = room_name(room, "repo:")
    else:
        home = "repo:" + os.path.basename(repo_root(cwd) or cwd.rstrip(os.sep) or "root")
        home = room_name(home.replace(" ", "-"), "repo:")
    wanted = [home] + [room_name(r, "shared:") for r in (extra_rooms or [])]
    wanted = list(dict.fromkeys(wanted))
    if label is not None:
        label = one_line(label, LABEL_MAX_CHARS) or None
    at = now()
    warning = None
    with store.write() as conn:
        sweep(conn, at)
        row = conn.execute("SELECT * FROM sessions WHERE harness_key=?",
                           (key,)).fetchone() if key else None
        if row is None:
            session_id = new_session_id()
            harness = detected
            conn.execute(
                "INSERT INTO sessions (id, harness, harness_key, cwd, pid, pid_start, label,"
                " tags, autonomy, created_at, last_seen) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (session_id, harness, key, cwd, ctx.pid, ctx.pid_start, label,
                 json.dumps(tags or []), level or 0, at, at))
            event(conn, "session.join", session_id, data={
                "harness": harness, "label": label, "cwd": cwd, "pid": ctx.pid})
        else:
            session_id = row["id"]
            harness = row["harness"] if detected == "generic" else detected
            requested = row["autonomy"]
            if level is not None and level < requested:
                warning = ("autonomy stays %s: a rejoin cannot lower it (asked %s); "
                           "a room cap (room_set_autonomy_cap) is the way down"
                           % (autonomy_name(requested), autonomy_name(level)))
            elif level is not None:
                requested = level
            conn.execute(
                "UPDATE sessions SET harness=?, cwd=?, pid=COALESCE(?, pid), "
                "pid_start=CASE WHEN ? IS NULL THEN pid_start ELSE ? END, "
                "label=COALESCE(?, label), tags=COALESCE(?, tags), autonomy=?, "
                "last_seen=?, left_at=NULL WHERE id=?",
                (harness, cwd, ctx.pid, ctx.pid, ctx.pid_start, label,
                 json.dumps(tags) if tags is not None else None, requested, at,
                 session_id))
            event(conn, "session.rejoin", session_id, data={
                "label": label, "autonomy": requested, "pid": ctx.pid,
                "was_left": row["left_at"] is not None})
        have = set(rooms_of(conn, session_id))
        if len(have | set(wanted)) > ROOMS_MAX:
            raise UsageError("a session can be in at most %d rooms" % ROOMS_MAX)
        for name in wanted:
            if name not in have:
                ensure_room(conn, name, at)
                conn.execute("INSERT INTO memberships (session_id, room, joined_at) "
                             "VALUES (?,?,?)", (session_id, name, at))
                event(conn, "room.join", session_id, room=name)
        lever, lever_data = detect_lever(ctx.env, harness)
        if lever:
            conn.execute("UPDATE sessions SET lever=?, lever_data=? WHERE id=?",
                         (lever, json.dumps(lever_data), session_id))
        row = session_row(conn, session_id)
        result = {"session_id": session_id, "rooms": rooms_of(conn, session_id),
                  "autonomy": effective_autonomy(conn, row),
                  "autonomy_requested": row["autonomy"], "label": row["label"],
                  "harness": row["harness"], "cwd": row["cwd"]}
    if warning:
        result["warning"] = warning
    return result


def _release_all(conn, session_id, why, at):
    for lease in conn.execute("SELECT id, path, mode FROM leases WHERE session_id=?",
                              (session_id,)).fetchall():
        conn.execute("DELETE FROM leases WHERE id=?", (lease["id"],))
        event(conn, "lease.release", session_id, subject=lease["path"],
              data={"mode": lease["mode"], "why": why}, at=at)


@tool("room_leave", "Leave every room", {"session_id": S_SESSION}, ["session_id"],
      output=out_schema(["ok"], ok={"type": "boolean"}, session_id={"type": "string"},
                        left_rooms={"type": "array", "items": {"type": "string"}}),
      cli="leave", example="leave --session $ID", destructive=True, idempotent=True)
def room_leave(store, ctx, session_id):
    """Leave every room and release your leases. The session stays on record
    (marked left) so history and errors can still name it; joining again with
    the same harness key brings it back."""
    at = now()
    with store.write() as conn:
        row = require_session(store, conn, session_id)
        rooms = rooms_of(conn, row["id"])
        conn.execute("DELETE FROM memberships WHERE session_id=?", (row["id"],))
        _release_all(conn, row["id"], "leave", at)
        conn.execute("UPDATE sessions SET left_at=COALESCE(left_at, ?) WHERE id=?",
                     (at, row["id"]))
        event(conn, "session.leave", row["id"], data={"rooms": rooms}, at=at)
    return {"ok": True, "session_id": row["id"], "left_rooms": rooms}


@tool("room_leave_room", "Leave one room", {"session_id": S_SESSION, "room": S_ROOM},
      ["session_id", "room"],
      output=out_schema(["ok"], ok={"type": "boolean"}, room={"type": "string"},
                        rooms={"type": "array", "items": {"type": "string"}}),
      cli="leave-room", positional=("room",),
      example="leave-room --session $ID shared:storefront", destructive=True)
def room_leave_room(store, ctx, session_id, room):
    """Leave one room and stay in the rest (your session, leases and other
    rooms are kept). A bare name matches the repo: or shared: room you are in."""
    with store.write() as conn:
        row = require_session(store, conn, session_id)
        mine = rooms_of(conn, row["id"])
        if ":" in room.strip():
            full = room_name(room, "shared:")
            matches = [full] if full in mine else []
        else:
            matches = [r for r in mine if r in (p + room.strip() for p in ROOM_PREFIXES)]
        if len(matches) > 1:
            raise UsageError("room %r is ambiguous: you are in %s" % (room, " and ".join(
                matches)), "name it with its prefix")
        if not matches:
            raise RoomError("you are not in room %s" % room,
                            "your rooms: %s" % (", ".join(mine) or "none"))
        conn.execute("DELETE FROM memberships WHERE session_id=? AND room=?",
                     (row["id"], matches[0]))
        event(conn, "room.leave", row["id"], room=matches[0])
        return {"ok": True, "room": matches[0], "rooms": rooms_of(conn, row["id"])}


@tool("room_who", "Who is here", {"session_id": S_SESSION_OPT, "room": S_ROOM},
      output=out_schema(["sessions"], sessions={"type": "array", "items": S_SESSION_ROW},
                        room={"type": ["string", "null"]}),
      cli="who", example="who --room shared:storefront", read_only=True, idempotent=True)
def room_who(store, ctx, session_id=None, room=None):
    """List sessions with their liveness (alive, gone or unknown), autonomy and
    rooms: those in room, else those sharing a room with session_id, else
    everyone present in the store."""
    liveness = LazyScan(ctx)
    with store.write() as conn:
        caller = require_session(store, conn, session_id) if session_id else None
        if room:
            full = resolve_room(conn, room)
            ids = [r[0] for r in conn.execute(
                "SELECT session_id FROM memberships WHERE room=?", (full,))]
        elif caller is not None:
            full = None
            ids = [r[0] for r in conn.execute(
                "SELECT DISTINCT m2.session_id FROM memberships m1 JOIN memberships m2 "
                "ON m1.room = m2.room WHERE m1.session_id=?", (caller["id"],))]
            if caller["id"] not in ids:
                ids.append(caller["id"])
        else:
            full = None
            ids = [r[0] for r in conn.execute("SELECT DISTINCT session_id FROM memberships")]
        rows = [session_row(conn, i) for i in ids]
        rows.sort(key=lambda r: (r["label"] or "~", r["created_at"]))
        sessions = [session_dict(conn, r, liveness) for r in rows]
    if caller is not None:
        for item in sessions:
            item["you"] = item["session_id"] == caller["id"]
    return {"room": full, "sessions": sessions}


@tool("room_set_autonomy_cap", "Cap a room's autonomy", {
    "session_id": S_SESSION_OPT, "room": S_ROOM, "autonomy": S_AUTONOMY}, ["autonomy"],
    output=out_schema(["room", "autonomy"], room={"type": "string"},
                      autonomy={"type": "integer"},
                      lowered={"type": "array", "items": {"type": "string"}}),
    cli="set-cap", flags={"autonomy": "autonomy"}, positional=("autonomy",),
    example="set-cap --room shared:storefront hold", idempotent=True)
def room_set_autonomy_cap(store, ctx, autonomy, session_id=None, room=None):
    """Set the highest autonomy any member of a room may use (0 notify, 1 hold,
    2 wake). Members above it are lowered at once and later joins are clamped;
    raising the cap again restores what each session asked for. The room
    defaults to session_id's repository room."""
    level = parse_autonomy(autonomy)
    with store.write() as conn:
        caller = require_session(store, conn, session_id) if session_id else None
        full = room_for(conn, room, caller, "set-cap")
        conn.execute("UPDATE rooms SET cap=? WHERE name=?", (level, full))
        lowered = [r[0] for r in conn.execute(
            "SELECT s.id FROM sessions s JOIN memberships m ON m.session_id=s.id "
            "WHERE m.room=? AND s.autonomy > ?", (full, level))]
        event(conn, "room.cap", caller["id"] if caller else None, room=full,
              data={"autonomy": level, "lowered": lowered})
    return {"room": full, "autonomy": level, "lowered": lowered}


# ---- operations: messages -------------------------------------------------


def _roommates(conn, session_id):
    """Ids of present sessions sharing at least one room with session_id."""
    return [r[0] for r in conn.execute(
        "SELECT DISTINCT m2.session_id FROM memberships m1 JOIN memberships m2 "
        "ON m1.room = m2.room JOIN sessions s ON s.id = m2.session_id "
        "WHERE m1.session_id=? AND m2.session_id != ? AND s.left_at IS NULL",
        (session_id, session_id))]


def lease_forms(path, holder_cwd):
    """The three forms a file: selector is matched against: absolute, relative
    to the holder's cwd (the holder's, not the room's: src/wire.go is a
    different file in each repository of a shared room), and the base name."""
    forms = [path]
    if holder_cwd:
        try:
            relative = os.path.relpath(path, holder_cwd)
        except ValueError:
            relative = None
        if relative and not relative.startswith(".." + os.sep) and relative != "..":
            forms.append(relative)
    forms.append(os.path.basename(path.rstrip(os.sep)) or path)
    return forms


def resolve_selectors(store, conn, sender, to, at):
    """Recipients of a send: the union over the selectors, among sessions that
    share a room with the sender, never the sender itself."""
    selectors = [to] if isinstance(to, str) else list(to)
    if not selectors:
        raise UsageError("to needs at least one selector: *, a session id, "
                         "file:<glob> or tag:<tag>")
    if len(selectors) > SELECTORS_MAX:
        raise UsageError("at most %d selectors in one send" % SELECTORS_MAX)
    mates = set(_roommates(conn, sender["id"]))
    found = []
    for selector in selectors:
        selector = selector.strip()
        if selector == "*":
            found.extend(sorted(mates))
        elif selector.startswith("file:"):
            from fnmatch import fnmatchcase
            glob = selector[5:]
            if not glob:
                raise UsageError("file: needs a glob, e.g. file:src/api/*.go")
            for lease in conn.execute(
                    "SELECT l.session_id, l.path, s.cwd FROM leases l JOIN sessions s "
                    "ON s.id = l.session_id WHERE l.expires_at > ? AND l.kind = 'path'",
                    (at,)):
                if lease["session_id"] not in mates:
                    continue
                forms = lease_forms(lease["path"], lease["cwd"])
                # A file under a leased directory reaches the directory's holder.
                if any(fnmatchcase(form, glob) for form in forms) or any(
                        glob.startswith(form.rstrip(os.sep) + os.sep)
                        for form in forms[:-1]):
                    found.append(lease["session_id"])
        elif selector.startswith("tag:"):
            tag = selector[4:]
            if not tag:
                raise UsageError("tag: needs a tag, e.g. tag:backend")
            for session_id in sorted(mates):
                tags = json.loads(session_row(conn, session_id)["tags"])
                if tag in tags:
                    found.append(session_id)
        else:
            row = session_row(conn, selector) if is_session_id(selector) else None
            if row is None:
                error = unknown_session(conn, selector, store.path)
                error.hint = ("selectors are *, a session id, file:<glob> or tag:<tag>"
                              + ("; " + error.hint if error.hint else ""))
                raise error
            if row["id"] == sender["id"]:
                continue
            if row["id"] not in mates:
                raise RoomError(
                    "session %s (label %s) shares no room with you" % (
                        row["id"], row["label"] or "-"),
                    "your rooms: %s; theirs: %s" % (
                        ", ".join(rooms_of(conn, sender["id"])) or "none",
                        ", ".join(rooms_of(conn, row["id"])) or "none (left)"))
            found.append(row["id"])
    return list(dict.fromkeys(found))


def message_dict(conn, row):
    return {
        "message_id": row["id"], "sender": row["sender"],
        "sender_label": row["sender_label"], "subject": row["subject"],
        "body": row["body"], "reply_to": row["reply_to"],
        "created_at": iso(row["created_at"]), "expires_at": iso(row["expires_at"]),
        "rooms": [r[0] for r in conn.execute(
            "SELECT room FROM message_rooms WHERE message_id=? ORDER BY room",
            (row["id"],))],
    }


def post_message(conn, sender, recipients, subject, body, reply_to, ttl, selector, at):
    """Store one message in the sender's rooms with a delivery per recipient
    (wake-level recipients get their wake scheduled) and its event, all in the
    caller's transaction.  msg_send, work handoffs and window notices use it."""
    message_id = conn.execute(
        "INSERT INTO messages (sender, sender_label, selector, subject, body, reply_to,"
        " created_at, expires_at) VALUES (?,?,?,?,?,?,?,?)",
        (sender["id"], sender["label"], json.dumps(selector), subject, body, reply_to,
         at, at + ttl)).lastrowid
    rooms = rooms_of(conn, sender["id"])
    conn.executemany("INSERT INTO message_rooms (room, message_id) VALUES (?, ?)",
                     [(room, message_id) for room in rooms])
    for recipient in recipients:
        wake = effective_autonomy(conn, session_row(conn, recipient)) == 2
        conn.execute(
            "INSERT INTO deliveries (session_id, message_id, state, updated_at, "
            "wake_next_at) VALUES (?,?,?,?,?)",
            (recipient, message_id, "stored", at, at if wake else None))
    event(conn, "msg.send", sender["id"], subject=message_id, at=at, data={
        "to": selector, "recipients": recipients, "rooms": rooms, "subject": subject})
    return message_id


@tool("msg_send", "Send a message", {
    "session_id": S_SESSION,
    "to": {"type": ["string", "array"], "items": {"type": "string", "maxLength": 5000},
           "minItems": 1, "maxItems": SELECTORS_MAX, "description":
           "* (everyone sharing a room with you), a session id, file:<glob> (holders "
           "of matching leases) or tag:<tag>; or a list of these"},
    "subject": {"type": "string", "maxLength": SUBJECT_MAX_CHARS},
    "body": {"type": "string"},
    "reply_to": {"type": "integer", "minimum": 1, "description": "a message id"},
    "ttl_s": {"type": "integer", "minimum": 1, "maximum": MESSAGE_TTL_MAX_S,
              "description": "seconds until unread deliveries expire (default 7 days)"},
}, ["session_id", "to"],
    output=out_schema(["message_id", "recipients"], message_id={"type": "integer"},
                      recipients={"type": "integer"},
                      recipient_ids={"type": "array", "items": {"type": "string"}},
                      warning={"type": "string"}),
    cli="send", flags={"ttl_s": "--ttl"},
    example='send --session $ID --to file:src/api/users.go --subject "need a phone field"')
def msg_send(store, ctx, session_id, to, subject=None, body=None, reply_to=None,
             ttl_s=None):
    """Send a message to the sessions a selector picks among those sharing a
    room with you: '*', a session id, 'file:<glob>' (sessions holding a lease on
    a matching path) or 'tag:<tag>', or a list of them. Needs a subject or a
    body. Returns the message_id and how many recipients got it; zero recipients
    is not an error but comes with a warning."""
    if not subject and not body:
        raise UsageError("a message needs a subject or a body")
    if subject is not None and len(subject) > SUBJECT_MAX_CHARS:
        raise UsageError("subject is longer than %d characters" % SUBJECT_MAX_CHARS)
    if body is not None and len(body.encode("utf-8")) > BODY_MAX_BYTES:
        raise UsageError("body is larger than 1 MiB (%d bytes)" % len(body.encode("utf-8")),
                         "send a path to a file instead")
    ttl = MESSAGE_TTL_S if ttl_s is None else ttl_s
    if not 1 <= ttl <= MESSAGE_TTL_MAX_S:
        raise UsageError("ttl_s must be between 1 and %d" % MESSAGE_TTL_MAX_S)
    at = now()
    with store.write() as conn:
        sweep(conn, at)
        sender = require_session(store, conn, session_id, present=True)
        if reply_to is not None and not conn.execute(
                "SELECT 1 FROM messages WHERE id=?", (reply_to,)).fetchone():
            raise RoomError("reply_to names no message: %s" % reply_to,
                            "message ids come from msg_recv or room_history")
        recipients = resolve_selectors(store, conn, sender, to, at)
        message_id = post_message(conn, sender, recipients, subject, body, reply_to, ttl,
                                  to, at)
        rooms = rooms_of(conn, sender["id"])
    result = {"message_id": message_id, "recipients": len(recipients),
              "recipient_ids": recipients}
    if not recipients:
        result["warning"] = (
            "stored, but delivered to nobody: no other session matched %s in your "
            "rooms (%s)" % (json.dumps(to), ", ".join(rooms) or "none"))
    return result


@tool("msg_recv", "Receive messages", {"session_id": S_SESSION, "limit": S_LIMIT},
      ["session_id"],
      output=out_schema(["messages"], messages={"type": "array", "items": S_MESSAGE},
                        inbox={"type": "object", "properties": {
                            "rooms": {"type": "array", "items": {"type": "string"}},
                            "deliveries_total": {"type": "integer"},
                            "read_total": {"type": "integer"},
                            "last_created_at": S_TIME},
                            "required": ["rooms", "deliveries_total", "read_total",
                                         "last_created_at"]}),
      cli="recv", example="recv --session $ID")
def msg_recv(store, ctx, session_id, limit=50):
    """Fetch your unread messages, oldest first, and mark them read. Call it
    when a signal says something is waiting. An empty answer carries an inbox
    block (your rooms, deliveries ever, how many read, the newest one's time) so
    'caught up' and 'wrong room' look different."""
    at = now()
    with store.write() as conn:
        sweep(conn, at)
        row = require_session(store, conn, session_id)
        messages = conn.execute(
            "SELECT m.* FROM deliveries d JOIN messages m ON m.id = d.message_id "
            "WHERE d.session_id=? AND d.state IN %s ORDER BY d.message_id LIMIT ?"
            % UNREAD_SQL, (row["id"], limit)).fetchall()
        result = [message_dict(conn, m) for m in messages]
        if messages:
            ids = [m["id"] for m in messages]
            conn.executemany(
                "UPDATE deliveries SET state='read', read_at=?, updated_at=?, "
                "wake_next_at=NULL WHERE session_id=? AND message_id=?",
                [(at, at, row["id"], i) for i in ids])
            event(conn, "msg.read", row["id"], data={"messages": ids}, at=at)
            return {"messages": result}
        # Each figure from an index of the session's own deliveries; the newest
        # message is one primary-key lookup, not a join over every delivery.
        total, newest = conn.execute(
            "SELECT COUNT(*), MAX(message_id) FROM deliveries WHERE session_id=?",
            (row["id"],)).fetchone()
        read_total = conn.execute(
            "SELECT COUNT(*) FROM deliveries WHERE session_id=? AND state IN "
            "('read', 'acked')", (row["id"],)).fetchone()[0]
        created = conn.execute("SELECT created_at FROM messages WHERE id=?",
                               (newest,)).fetchone() if newest else None
        return {"messages": [], "inbox": {
            "rooms": rooms_of(conn, row["id"]), "deliveries_total": total,
            "read_total": read_total,
            "last_created_at": iso(created[0]) if created else None}}


@tool("msg_ack", "Acknowledge a message", {
    "session_id": S_SESSION, "message_id": {"type": "integer", "minimum": 1}},
    ["session_id", "message_id"],
    output=out_schema(["ok"], ok={"type": "boolean"}, message_id={"type": "integer"},
                      state={"type": "string"}),
    cli="ack", positional=("message_id",), example="ack --session $ID 42", idempotent=True)
def msg_ack(store, ctx, session_id, message_id):
    """Confirm a message you were sent (after acting on it). Acking an unread
    message is allowed; an expired one is an error; a second ack changes
    nothing."""
    at = now()
    with store.write() as conn:
        sweep(conn, at)
        row = require_session(store, conn, session_id)
        delivery = conn.execute(
            "SELECT state FROM deliveries WHERE session_id=? AND message_id=?",
            (row["id"], message_id)).fetchone()
        if delivery is None:
            exists = conn.execute("SELECT 1 FROM messages WHERE id=?",
                                  (message_id,)).fetchone()
            raise RoomError(("message %d was not delivered to you" if exists else
                             "no message %d") % message_id,
                            "msg_recv lists the messages sent to you")
        if delivery["state"] == "expired":
            raise RoomError("message %d expired before you read it" % message_id,
                            "ask its sender to send it again")
        if delivery["state"] != "acked":
            conn.execute(
                "UPDATE deliveries SET state='acked', read_at=COALESCE(read_at, ?), "
                "updated_at=?, wake_next_at=NULL WHERE session_id=? AND message_id=?",
                (at, at, row["id"], message_id))
            event(conn, "msg.ack", row["id"], subject=message_id, at=at)
    return {"ok": True, "message_id": message_id, "state": "acked"}


def unread_count(conn, session_id):
    return conn.execute("SELECT COUNT(*) FROM deliveries WHERE session_id=? AND "
                        "state IN " + UNREAD_SQL, (session_id,)).fetchone()[0]


@tool("msg_unread", "Count unread messages", {"session_id": S_SESSION}, ["session_id"],
      output=out_schema(["count"], count={"type": "integer"}),
      cli="unread", example="unread --session $ID", read_only=True, idempotent=True)
def msg_unread(store, ctx, session_id):
    """How many messages wait for you, without marking anything read."""
    at = now()
    with store.write() as conn:
        sweep(conn, at)
        row = require_session(store, conn, session_id)
        return {"count": unread_count(conn, row["id"])}


@tool("msg_sent", "Messages you sent", {"session_id": S_SESSION, "limit": S_LIMIT},
      ["session_id"],
      output=out_schema(["messages"], messages={"type": "array", "items": {
          "type": "object", "properties": {
              "message_id": {"type": "integer"}, "subject": {"type": ["string", "null"]},
              "created_at": S_TIME, "deliveries": {"type": "array", "items": {
                  "type": "object", "properties": {
                      "session_id": {"type": "string"},
                      "label": {"type": ["string", "null"]},
                      "state": {"type": "string"}},
                  "required": ["session_id", "label", "state"]}},
              "sent": {"type": "integer"}, "pending": {"type": "integer"},
              "left": {"type": "integer"}},
          "required": ["message_id", "subject", "created_at", "deliveries", "sent",
                       "pending", "left"]}}),
      cli="sent", example="sent --session $ID --limit 5", read_only=True, idempotent=True)
def msg_sent(store, ctx, session_id, limit=20):
    """Your newest sent messages (shown oldest first) with each recipient's
    delivery state: stored, offered, accepted, undeliverable, read, acked or
    expired; plus counts: sent, pending (not yet read), left (recipient has
    left). Answers 'why did they not hear me'."""
    at = now()
    with store.write() as conn:
        sweep(conn, at)
        row = require_session(store, conn, session_id)
        messages = conn.execute(
            "SELECT id, subject, created_at FROM messages WHERE sender=? "
            "ORDER BY id DESC LIMIT ?", (row["id"], limit)).fetchall()
        result = []
        for message in reversed(messages):
            deliveries = conn.execute(
                "SELECT d.session_id, s.label, d.state, s.left_at FROM deliveries d "
                "JOIN sessions s ON s.id = d.session_id WHERE d.message_id=? "
                "ORDER BY s.label, d.session_id", (message["id"],)).fetchall()
            counts = {state: 0 for state in STATE_ORDER}
            for d in deliveries:
                counts[d["state"]] += 1
            result.append(dict({
                "message_id": message["id"], "subject": message["subject"],
                "created_at": iso(message["created_at"]),
                "deliveries": [{"session_id": d["session_id"], "label": d["label"],
                                "state": d["state"], "left": d["left_at"] is not None}
                               for d in deliveries],
                "sent": len(deliveries),
                "pending": sum(1 for d in deliveries if d["state"] in UNREAD_STATES
                               and d["left_at"] is None),
                "left": sum(1 for d in deliveries if d["left_at"] is not None),
            }, **counts))
    return {"messages": result}


@tool("room_history", "A room's history", {
    "session_id": S_SESSION_OPT, "room": S_ROOM, "limit": S_LIMIT,
    "before": {"type": "integer", "minimum": 1,
               "description": "page back: only messages older than this message id"}},
    output=out_schema(["room", "messages"], room={"type": "string"},
                      messages={"type": "array", "items": S_MESSAGE}),
    cli="history", example="history --room shared:storefront", read_only=True,
    idempotent=True)
def room_history(store, ctx, session_id=None, room=None, limit=50, before=None):
    """The newest messages sent in a room (shown oldest first), complete even
    for sessions that joined later. Read-only: marks nothing read. The room
    defaults to session_id's repository room; page back with before=<the
    oldest message_id you have>."""
    with store.write() as conn:
        caller = require_session(store, conn, session_id) if session_id else None
        full = room_for(conn, room, caller, "history")
        rows = conn.execute(
            "SELECT m.* FROM message_rooms r JOIN messages m ON m.id = r.message_id "
            "WHERE r.room=? AND r.message_id < ? ORDER BY r.message_id DESC LIMIT ?",
            (full, before or (1 << 62), limit)).fetchall()
        return {"room": full, "messages": [message_dict(conn, m) for m in reversed(rows)]}


# ---- operations: leases ---------------------------------------------------
# A lease is on a resource: a path (the default: a bare path means path:) or
# any <kind>:<name> (db:main, service:api, branch:main, port:5432, ...).  Paths
# conflict when equal or when one is an ancestor of the other, compared with
# symlinks resolved; other kinds only on equal names.


def parse_resource(text, cwd):
    """'src/a.go', 'path:src/a.go', 'db:main' -> (kind, shown, key): shown is
    the absolute path or kind:name, key what conflicts are decided on."""
    if not isinstance(text, str) or not text.strip():
        raise UsageError("a resource must be a non-empty string (a path or kind:name)")
    text = text.strip()
    head, sep, rest = text.partition(":")
    if sep and head and "/" not in head and head == head.lower() and all(
            c.isalnum() or c in "-_" for c in head) and head[0].isalpha() and len(head) > 1:
        kind, name = head, rest
    else:
        kind, name = "path", text
    if kind in ("path", "file"):
        shown = normalize_path(name, cwd)
        return "path", shown, os.path.realpath(shown)
    name = name.strip()
    if not name or len(name) > PATH_MAX_CHARS or "\x00" in name:
        raise UsageError("resource %r needs a name after %s:" % (text, kind))
    return kind, "%s:%s" % (kind, name), name


def path_ancestors(key):
    """key and every directory above it: the leases that cover it."""
    found = [key]
    while True:
        parent = os.path.dirname(key)
        if parent == key:
            return found
        found.append(parent)
        key = parent


def overlapping_leases(conn, kind, key, at, exclude=None):
    """Live leases that overlap the resource: same key, or for paths an ancestor
    or a descendant (indexed: the ancestors by equality, the descendants by a
    key range)."""
    if kind != "path":
        rows = conn.execute("SELECT * FROM leases WHERE kind=? AND key=? AND expires_at > ?",
                            (kind, key, at)).fetchall()
    else:
        ancestors = path_ancestors(key)
        prefix = key.rstrip(os.sep) + os.sep
        marks = ",".join("?" * len(ancestors))
        rows = conn.execute(
            "SELECT * FROM leases WHERE kind='path' AND expires_at > ? AND (key IN (%s) "
            "OR (key >= ? AND key < ?))" % marks,
            [at] + ancestors + [prefix, prefix[:-1] + chr(ord(os.sep) + 1)]).fetchall()
    return [r for r in rows if r["session_id"] != exclude]


def _window_rows(conn, kind, key, at, states=WINDOW_OPEN):
    if kind != "path":
        where, params = "r.key = ?", [key]
    else:
        ancestors = path_ancestors(key)
        prefix = key.rstrip(os.sep) + os.sep
        where = "(r.key IN (%s) OR (r.key >= ? AND r.key < ?))" % ",".join(
            "?" * len(ancestors))
        params = ancestors + [prefix, prefix[:-1] + chr(ord(os.sep) + 1)]
    marks = ",".join("?" * len(states))
    return conn.execute(
        "SELECT DISTINCT w.* FROM window_resources r JOIN windows w ON w.id = r.window_id "
        "WHERE r.kind = ? AND %s AND w.state IN (%s)" % (where, marks),
        [kind] + params + list(states)).fetchall()


def window_blocking(conn, kind, key, session_id, at, active_only=False):
    """Why a quiet window of another session blocks this resource, or None: a
    pending window blocks new overlapping leases and their renewal, an active
    one blocks everything that overlaps it."""
    for window in _window_rows(conn, kind, key, at,
                               ("active",) if active_only else WINDOW_OPEN):
        if window["session_id"] == session_id:
            continue
        owner = session_row(conn, window["session_id"])
        return ("quiet window #%d (%s) of %s (label %s) for: %s, until %s" % (
            window["id"], window["state"], window["session_id"],
            owner["label"] if owner else "-", one_line(window["purpose"], 80),
            iso(window["expires_at"])))
    return None


def _overlapping_ignoring_case(conn, key, at):
    """Path leases overlapping key when case does not matter (a filesystem that
    ignores case: Readme.md and README.md are one file).  Not indexed; leases
    are few."""
    ancestors = [a.lower() for a in path_ancestors(key)]
    prefix = key.lower().rstrip(os.sep) + os.sep
    return [lease for lease in conn.execute(
        "SELECT * FROM leases WHERE kind='path' AND expires_at > ?", (at,))
        if lease["key"].lower() in ancestors or lease["key"].lower().startswith(prefix)]


def lease_dict(conn, lease, liveness):
    holder = session_row(conn, lease["session_id"])
    return {"session_id": lease["session_id"], "label": holder["label"] if holder else None,
            "path": lease["path"], "resource": lease["path"], "kind": lease["kind"],
            "mode": lease["mode"], "purpose": lease["purpose"],
            "acquired_at": iso(lease["acquired_at"]), "expires_at": iso(lease["expires_at"]),
            "liveness": liveness(holder) if holder else "gone"}


def _holder_text(lease):
    return "%s (label %s, %s, %s until %s%s)" % (
        lease["session_id"], lease["label"] or "-", lease["liveness"], lease["mode"],
        lease["expires_at"], ", for: %s" % one_line(lease["purpose"], 80)
        if lease.get("purpose") else "")


def _targets(ctx, row, path, resources):
    """The resources a lease call names (path and/or resources), parsed and
    deduplicated, in order."""
    items = ([path] if path else []) + list(resources or [])
    if not items:
        raise UsageError("name a path or resources (a list of paths or kind:name)")
    if len(items) > 100:
        raise UsageError("at most 100 resources in one call")
    base = row["cwd"] if ctx.via == "mcp" else ctx.cwd
    seen, found = set(), []
    for item in items:
        kind, shown, key = parse_resource(item, base)
        if (kind, key) not in seen:
            seen.add((kind, key))
            found.append((kind, shown, key))
    return found


S_TTL_LEASE = {"type": "integer", "minimum": 1, "maximum": LEASE_TTL_MAX_S,
               "description": "seconds the lease lives (default 900, at most 86400)"}
S_RESOURCES = {"type": "array", "items": {"type": "string", "minLength": 1,
                                          "maxLength": PATH_MAX_CHARS},
               "minItems": 1, "maxItems": 100,
               "description": "several resources at once, all or nothing: paths or "
                              "kind:name (db:main, service:api, branch:x, port:5432)"}
S_RESOURCE = dict(S_PATH, description="one resource: a path (relative to your cwd) or "
                  "kind:name such as db:main")
S_LEASE_ARGS = {"session_id": S_SESSION, "path": S_RESOURCE, "resources": S_RESOURCES}


@tool("lease_claim", "Claim a lease", dict(S_LEASE_ARGS, **{
    "ttl_s": S_TTL_LEASE,
    "mode": {"type": "string", "enum": ["exclusive", "shared"],
             "description": "exclusive (default): one holder; shared: many, no exclusive"},
    "purpose": {"type": "string", "maxLength": 500,
                "description": "why you hold it, shown to others"},
}), ["session_id"],
    output=out_schema(["ok", "holder", "reason"], ok={"type": "boolean"},
                      holder=S_LEASE_OR_NULL, holders={"type": "array", "items": S_LEASE},
                      reason={"type": "string"}, lease=S_LEASE_OR_NULL,
                      leases={"type": "array", "items": S_LEASE}),
    cli="claim", positional=("resources",), flags={"ttl_s": "--ttl"},
    example='claim --session $ID src/api/ db:main --purpose "migrate users" --ttl 30m')
def lease_claim(store, ctx, session_id, path=None, resources=None, ttl_s=LEASE_TTL_S,
                mode="exclusive", purpose=None):
    """Claim a lease before editing files (or using a database, service, branch
    or port) others may touch. path is one resource; resources a list taken all
    or nothing. A directory lease covers everything under it. exclusive
    (default) admits one holder; shared admits several and blocks exclusive
    claims. Claiming again renews your own lease. A conflict is a normal
    answer: ok false, holder (the first conflicting lease), holders, reason."""
    if ttl_s > LEASE_TTL_MAX_S or ttl_s < 1:
        raise UsageError("ttl_s must be between 1 and %d (24 hours)" % LEASE_TTL_MAX_S)
    liveness = LazyScan(ctx)
    at = now()
    with store.write() as conn:
        row = require_session(store, conn, session_id, present=True)
        targets = _targets(ctx, row, path, resources)
        sweep(conn, at)
        conflicts = {}
        for kind, shown, key in targets:
            for lease in overlapping_leases(conn, kind, key, at, exclude=row["id"]):
                if mode == "exclusive" or lease["mode"] == "exclusive":
                    conflicts[lease["id"]] = lease
            blocked = window_blocking(conn, kind, key, row["id"], at)
            if blocked:
                raise RoomError(blocked)
        if conflicts:
            holders = [lease_dict(conn, lease, liveness) for lease in
                       sorted(conflicts.values(), key=lambda l: l["acquired_at"])]
            event(conn, "lease.refused", row["id"], subject=targets[0][1],
                  data={"mode": mode, "resources": [t[1] for t in targets],
                        "holders": [h["session_id"] for h in holders]})
            return {"ok": False, "holder": holders[0], "holders": holders, "lease": None,
                    "leases": [], "reason": "%s: held by %s; nothing was claimed" % (
                        ", ".join(t[1] for t in targets),
                        "; ".join("%s on %s" % (_holder_text(h), h["resource"])
                                  for h in holders))}
        reasons, granted = [], []
        for kind, shown, key in targets:
            mine = conn.execute("SELECT * FROM leases WHERE kind=? AND key=? AND "
                                "session_id=?", (kind, key, row["id"])).fetchone()
            if mine:
                conn.execute("UPDATE leases SET mode=?, expires_at=?, purpose=COALESCE(?, "
                             "purpose) WHERE id=?", (mode, at + ttl_s, purpose, mine["id"]))
                reason, lease_id = "renewed", mine["id"]
            else:
                lease_id = conn.execute(
                    "INSERT INTO leases (session_id, path, kind, key, mode, purpose, "
                    "acquired_at, expires_at) VALUES (?,?,?,?,?,?,?,?)",
                    (row["id"], shown, kind, key, mode, purpose, at, at + ttl_s)).lastrowid
                reason = "acquired"
            reasons.append(reason)
            event(conn, "lease.claim", row["id"], subject=shown, at=at,
                  data={"mode": mode, "expires_at": at + ttl_s, "reason": reason,
                        "kind": kind, "purpose": purpose})
            granted.append(lease_dict(conn, conn.execute(
                "SELECT * FROM leases WHERE id=?", (lease_id,)).fetchone(), liveness))
        reason = reasons[0] if len(set(reasons)) == 1 else "acquired and renewed"
        return {"ok": True, "holder": None, "holders": [], "reason": reason,
                "lease": granted[0], "leases": granted}


@tool("lease_renew", "Renew your leases", dict(S_LEASE_ARGS, ttl_s=S_TTL_LEASE),
      ["session_id"],
      output=dict(S_LEASE, properties=dict(S_LEASE["properties"], leases={
          "type": "array", "items": S_LEASE})),
      cli="renew", positional=("resources",), flags={"ttl_s": "--ttl"},
      example="renew --session $ID src/a.go --ttl 900", idempotent=True)
def lease_renew(store, ctx, session_id, path=None, resources=None, ttl_s=LEASE_TTL_S):
    """Extend live leases you hold (all named, or none). An expired lease, or
    one held by another session, is not renewed: the error says which (claim
    it again instead)."""
    if ttl_s > LEASE_TTL_MAX_S or ttl_s < 1:
        raise UsageError("ttl_s must be between 1 and %d (24 hours)" % LEASE_TTL_MAX_S)
    liveness = LazyScan(ctx)
    at = now()
    with store.write() as conn:
        row = require_session(store, conn, session_id, present=True)
        renewed = []
        for kind, shown, key in _targets(ctx, row, path, resources):
            mine = conn.execute("SELECT * FROM leases WHERE kind=? AND key=? AND "
                                "session_id=?", (kind, key, row["id"])).fetchone()
            if mine is not None and mine["expires_at"] <= at:
                raise RoomError("your lease on %s expired at %s; it was not renewed"
                                % (shown, iso(mine["expires_at"])),
                                "claim it again (lease_claim): someone may have "
                                "changed it meanwhile")
            if mine is None:
                other = overlapping_leases(conn, kind, key, at, exclude=row["id"])
                if other:
                    raise RoomError("%s is held by %s, not by you; not renewed" % (
                        shown, _holder_text(lease_dict(conn, other[0], liveness))))
                expired = conn.execute(
                    "SELECT at FROM events WHERE subject=? AND session_id=? AND kind="
                    "'lease.expire' ORDER BY at DESC LIMIT 1", (shown, row["id"])).fetchone()
                if expired:
                    raise RoomError("your lease on %s expired at %s; it was not renewed"
                                    % (shown, iso(expired[0])),
                                    "claim it again (lease_claim)")
                raise RoomError("you hold no lease on %s" % shown, "claim it (lease_claim)")
            blocked = window_blocking(conn, kind, key, row["id"], at)
            if blocked:
                raise RoomError(blocked)
            conn.execute("UPDATE leases SET expires_at=? WHERE id=?", (at + ttl_s, mine["id"]))
            event(conn, "lease.renew", row["id"], subject=shown, at=at,
                  data={"mode": mine["mode"], "expires_at": at + ttl_s, "kind": kind})
            renewed.append(lease_dict(conn, conn.execute(
                "SELECT * FROM leases WHERE id=?", (mine["id"],)).fetchone(), liveness))
        return dict(renewed[0], leases=renewed)


@tool("lease_release", "Release your leases", S_LEASE_ARGS, ["session_id"],
      output=out_schema(["ok"], ok={"type": "boolean"}, path={"type": "string"},
                        released={"type": "array", "items": {"type": "string"}}),
      cli="release", positional=("resources",), example="release --session $ID src/a.go",
      destructive=True)
def lease_release(store, ctx, session_id, path=None, resources=None):
    """Release leases you hold (all named, or none), as soon as you are done,
    so others waiting for them can claim them."""
    at = now()
    with store.write() as conn:
        row = require_session(store, conn, session_id)
        released = []
        for kind, shown, key in _targets(ctx, row, path, resources):
            mine = conn.execute("SELECT * FROM leases WHERE kind=? AND key=? AND "
                                "session_id=?", (kind, key, row["id"])).fetchone()
            if mine is None:
                raise RoomError("you hold no lease on %s; nothing was released" % shown,
                                "lease_list shows the leases in your rooms")
            conn.execute("DELETE FROM leases WHERE id=?", (mine["id"],))
            event(conn, "lease.release", row["id"], subject=shown, at=at,
                  data={"mode": mine["mode"], "expired": mine["expires_at"] <= at,
                        "kind": kind})
            released.append(shown)
    return {"ok": True, "path": released[0], "released": released}


def _check_one(conn, row, kind, shown, key, at, liveness):
    leases = overlapping_leases(conn, kind, key, at)
    leases.sort(key=lambda l: (l["session_id"] == row["id"], l["acquired_at"]))
    shown_leases = [lease_dict(conn, lease, liveness) for lease in leases]
    free = not any(lease["session_id"] != row["id"] for lease in leases)
    return {"path": shown, "resource": shown, "free": free,
            "lease": shown_leases[0] if shown_leases else None, "leases": shown_leases}


@tool("lease_check", "Is it leased", S_LEASE_ARGS, ["session_id"],
      output=out_schema(["free", "lease"], free={"type": "boolean"}, lease=S_LEASE_OR_NULL,
                        leases={"type": "array", "items": S_LEASE},
                        path={"type": "string"},
                        resources={"type": "array", "items": {"type": "object"}}),
      cli="check", positional=("resources",), example="check --session $ID src/a.go",
      read_only=True, idempotent=True)
def lease_check(store, ctx, session_id, path=None, resources=None):
    """Whether resources are free of other sessions' live leases, counting
    leases on a directory above a path or on anything under it. lease is the
    first other holder's lease (or your own if only you hold it); leases lists
    all; with several resources, resources has one answer each."""
    liveness = LazyScan(ctx)
    at = now()
    with store.write() as conn:
        row = require_session(store, conn, session_id)
        answers = [_check_one(conn, row, kind, shown, key, at, liveness)
                   for kind, shown, key in _targets(ctx, row, path, resources)]
    first = dict(answers[0])
    if len(answers) > 1:
        first["free"] = all(a["free"] for a in answers)
        first["leases"] = [l for a in answers for l in a["leases"]]
        first["lease"] = next((a["lease"] for a in answers if not a["free"]),
                              first["lease"])
        first["resources"] = answers
    return first


@tool("lease_list", "Leases in your rooms", {"session_id": S_SESSION}, ["session_id"],
      output=out_schema(["leases"], leases={"type": "array", "items": S_LEASE}),
      cli="leases", example="leases --session $ID", read_only=True, idempotent=True)
def lease_list(store, ctx, session_id):
    """Live leases held by you and by the sessions sharing a room with you, with
    each holder's label, liveness, purpose and expiry."""
    liveness = LazyScan(ctx)
    at = now()
    with store.write() as conn:
        row = require_session(store, conn, session_id)
        holders = set(_roommates(conn, row["id"])) | {row["id"]}
        leases = conn.execute("SELECT * FROM leases WHERE expires_at > ? ORDER BY path, "
                              "acquired_at", (at,)).fetchall()
        return {"leases": [lease_dict(conn, lease, liveness) for lease in leases
                           if lease["session_id"] in holders]}


@tool("lease_guard", "May I touch these", dict(S_LEASE_ARGS, **{
    "session_id": S_SESSION_OPT,
    "require_held": {"type": "boolean",
                     "description": "also require that you hold a covering lease"},
    "mode": {"type": "string", "enum": ["exclusive", "shared"],
             "description": "exclusive (default): any other lease conflicts; shared: "
                            "only exclusive leases of others do"},
    "ignorecase": {"type": "boolean",
                   "description": "compare paths ignoring case (git core.ignorecase)"},
}), [], output=out_schema(
    ["safe", "conflicts", "missing"], safe={"type": "boolean"},
    conflicts={"type": "array", "items": S_LEASE},
    missing={"type": "array", "items": {"type": "string"}},
    stale={"type": "array", "items": S_LEASE}),
    cli="guard", positional=("resources",),
    example="guard --session $ID src/api/users.go --require-held", read_only=True,
    idempotent=True)
def lease_guard(store, ctx, session_id=None, path=None, resources=None,
                require_held=False, mode="exclusive", ignorecase=False):
    """The question a script or a git hook asks before touching resources: is
    any of them under a live lease of another live session (or, with
    require_held, not covered by a lease of yours; a lease on a directory
    covers what is under it, not the reverse)? safe is false when so;
    conflicts and missing say why. Leases of sessions that are gone are listed
    as stale and do not block."""
    liveness = LazyScan(ctx)
    at = now()
    with store.write() as conn:
        row = require_session(store, conn, session_id) if session_id else None
        if row is None and require_held:
            raise UsageError("require_held needs your session (--session or "
                             "AGENTS_ROOM_SESSION)")
        me = row["id"] if row else None
        base_row = row or {"cwd": ctx.cwd}
        conflicts, stale, missing = [], [], []
        for kind, shown, key in _targets(ctx, base_row, path, resources):
            leases = overlapping_leases(conn, kind, key, at)
            if ignorecase and kind == "path":
                leases += [l for l in _overlapping_ignoring_case(conn, key, at)
                           if l["id"] not in {m["id"] for m in leases}]
            for lease in leases:
                if lease["session_id"] == me:
                    continue
                if mode == "shared" and lease["mode"] != "exclusive":
                    continue
                item = lease_dict(conn, lease, liveness)
                (stale if item["liveness"] == "gone" else conflicts).append(item)
            if require_held:
                covering = set(path_ancestors(key)) if kind == "path" else {key}
                if not any(l["session_id"] == me and l["key"] in covering for l in leases):
                    missing.append(shown)
            blocked = window_blocking(conn, kind, key, me, at, active_only=True)
            if blocked:
                conflicts.append({"session_id": "", "label": None, "path": shown,
                                  "resource": shown, "kind": kind, "mode": "window",
                                  "purpose": blocked, "acquired_at": None,
                                  "expires_at": None, "liveness": "unknown"})
    return {"safe": not conflicts and not missing, "conflicts": conflicts,
            "missing": missing, "stale": stale}


# ---- operations: work states and quiet windows ----------------------------
# A work state says what a session is doing on a scope; a quiet window asks
# the holders of overlapping leases and named sessions for quiet on resources
# before an operation that must not be disturbed (a migration, a release).



@tool("work_set", "Say what you are doing", {
    "session_id": S_SESSION,
    "state": {"type": "string", "enum": list(WORK_STATES)},
    "scope": {"type": "string", "minLength": 1, "maxLength": 200,
              "description": "what the state is about, e.g. api-v2 or ticket-42"},
    "summary": {"type": "string", "maxLength": SUBJECT_MAX_CHARS},
    "to": {"type": ["string", "array"], "items": {"type": "string", "maxLength": 5000},
           "minItems": 1, "maxItems": SELECTORS_MAX,
           "description": "with handoff or blocked: who to tell (a message is sent)"},
}, ["session_id", "state", "scope"],
    output=out_schema(["state", "scope"], state={"type": "string"},
                      scope={"type": "string"}, message_id={"type": ["integer", "null"]},
                      recipients={"type": "integer"}),
    cli="work", positional=("state",),
    example='work --session $ID handoff --scope api-v2 --summary "ready for review" '
            '--to tag:reviewer')
def work_set(store, ctx, session_id, state, scope, summary=None, to=None):
    """Record your work state on a scope: started, waiting, blocked, completed,
    handoff or failed. who and status show the latest per scope; completed and
    failed clear it (the event log keeps it). handoff or blocked with 'to'
    also sends a message, so the addressee is signalled like any message."""
    if to is not None and state not in ("handoff", "blocked"):
        raise UsageError("'to' goes with handoff or blocked, not %s" % state)
    at = now()
    result = {"state": state, "scope": scope, "message_id": None, "recipients": 0}
    with store.write() as conn:
        sweep(conn, at)
        row = require_session(store, conn, session_id, present=True)
        if state in ("completed", "failed"):
            conn.execute("DELETE FROM work WHERE session_id=? AND scope=?", (row["id"], scope))
        else:
            conn.execute("INSERT OR REPLACE INTO work (session_id, scope, state, summary, "
                         "updated_at) VALUES (?,?,?,?,?)",
                         (row["id"], scope, state, summary, at))
        if to is not None:
            recipients = resolve_selectors(store, conn, row, to, at)
            subject = "[%s] %s%s" % (state, scope, ": " + summary if summary else "")
            result["message_id"] = post_message(conn, row, recipients,
                                                subject[:SUBJECT_MAX_CHARS], None, None,
                                                MESSAGE_TTL_S, to, at)
            result["recipients"] = len(recipients)
        event(conn, "work." + state, row["id"], subject=scope, at=at,
              data={"summary": summary, "message_id": result["message_id"]})
    return result


def window_dict(conn, window, liveness=None):
    required = json.loads(window["required"])
    acked = json.loads(window["acked"])
    return {"window_id": window["id"], "session_id": window["session_id"],
            "label": (session_row(conn, window["session_id"]) or {"label": None})["label"],
            "purpose": window["purpose"], "state": window["state"],
            "resources": [r[0] for r in conn.execute(
                "SELECT shown FROM window_resources WHERE window_id=? ORDER BY shown",
                (window["id"],))],
            "required": required, "acked": sorted(acked),
            "missing_acks": [r for r in required if r not in acked],
            "created_at": iso(window["created_at"]),
            "ack_deadline": iso(window["ack_deadline"]),
            "expires_at": iso(window["expires_at"]),
            "activated_at": iso(window["activated_at"]), "ended_at": iso(window["ended_at"])}


S_WINDOW = {"type": "object", "properties": {
    "window_id": {"type": "integer"}, "session_id": {"type": "string"},
    "state": {"type": "string", "enum": ["pending", "active", "released", "cancelled",
                                         "expired"]},
    "purpose": {"type": ["string", "null"]},
    "resources": {"type": "array", "items": {"type": "string"}},
    "required": {"type": "array", "items": {"type": "string"}},
    "missing_acks": {"type": "array", "items": {"type": "string"}}},
    "required": ["window_id", "session_id", "state", "resources", "required",
                 "missing_acks"]}
S_WINDOW_ID = {"type": "integer", "minimum": 1}


def _load_window(conn, window_id):
    window = conn.execute("SELECT * FROM windows WHERE id=?", (window_id,)).fetchone()
    if window is None:
        raise RoomError("no quiet window #%s" % window_id, "window_status lists them")
    return window


@tool("window_request", "Ask for quiet", {
    "session_id": S_SESSION, "resources": S_RESOURCES,
    "purpose": {"type": "string", "minLength": 1, "maxLength": 500},
    "require": {"type": ["string", "array"], "items": {"type": "string"},
                "minItems": 1, "maxItems": SELECTORS_MAX,
                "description": "sessions that must ack first: session ids, tag:<t> or *"},
    "ttl_s": {"type": "integer", "minimum": 1, "maximum": LEASE_TTL_MAX_S,
              "description": "how long the window may last (default 1800)"},
    "ack_timeout_s": {"type": "integer", "minimum": 1, "maximum": LEASE_TTL_MAX_S,
                      "description": "how long acks may take (default 300)"},
}, ["session_id", "resources", "purpose"], output=S_WINDOW,
    cli="window-request", positional=("resources",), flags={"ttl_s": "--ttl",
                                                            "ack_timeout_s": "--ack-timeout"},
    example='window-request --session $ID db:main --purpose "apply migration" '
            '--require tag:reviewer')
def window_request(store, ctx, session_id, resources, purpose, require=None,
                   ttl_s=WINDOW_TTL_S, ack_timeout_s=WINDOW_ACK_TIMEOUT_S):
    """Ask for quiet on resources before an operation that must not be
    disturbed. The holders of overlapping leases and the required sessions get
    a message (so they are signalled). While pending, the window blocks new
    overlapping leases of others and their renewal; window_activate succeeds
    once every required session acked before the deadline and every
    overlapping lease is released."""
    at = now()
    with store.write() as conn:
        sweep(conn, at)
        row = require_session(store, conn, session_id, present=True)
        targets = _targets(ctx, row, None, resources)
        required = resolve_selectors(store, conn, row, require, at) if require else []
        holders = []
        for kind, shown, key in targets:
            for lease in overlapping_leases(conn, kind, key, at, exclude=row["id"]):
                if lease["session_id"] not in holders:
                    holders.append(lease["session_id"])
        window_id = conn.execute(
            "INSERT INTO windows (session_id, purpose, state, required, acked, created_at, "
            "ack_deadline, expires_at) VALUES (?,?,?,?,?,?,?,?)",
            (row["id"], purpose, "pending", json.dumps(required), "[]", at,
             at + ack_timeout_s, at + ttl_s)).lastrowid
        conn.executemany("INSERT INTO window_resources (window_id, kind, key, shown) "
                         "VALUES (?,?,?,?)", [(window_id, k, key, shown)
                                              for k, shown, key in targets])
        event(conn, "window.request", row["id"], subject=window_id, at=at, data={
            "resources": [t[1] for t in targets], "purpose": purpose,
            "required": required, "holders": holders})
        notified = list(dict.fromkeys(required + holders))
        if notified:
            subject = ("[quiet window #%d] %s on %s: %s" % (
                window_id, row["label"] or row["id"], ", ".join(t[1] for t in targets),
                purpose))[:SUBJECT_MAX_CHARS]
            body = ("%s asks for quiet on %s until %s.\n%s"
                    "Release your overlapping leases; required sessions: window_ack %d "
                    "before %s." % (row["label"] or row["id"],
                                   ", ".join(t[1] for t in targets), iso(at + ttl_s),
                                   "You hold an overlapping lease. " if holders else "",
                                   window_id, iso(at + ack_timeout_s)))
            post_message(conn, row, notified, subject, body, None, MESSAGE_TTL_S,
                         {"window": window_id}, at)
        return window_dict(conn, _load_window(conn, window_id))


@tool("window_ack", "Agree to a quiet window", {
    "session_id": S_SESSION, "window_id": S_WINDOW_ID}, ["session_id", "window_id"],
    output=S_WINDOW, cli="window-ack", positional=("window_id",),
    example="window-ack --session $ID 3", idempotent=True)
def window_ack(store, ctx, session_id, window_id):
    """Acknowledge a quiet window you were asked about (before its deadline).
    Release your overlapping leases too: the window activates only when they
    are gone."""
    at = now()
    with store.write() as conn:
        sweep(conn, at)
        row = require_session(store, conn, session_id)
        window = _load_window(conn, window_id)
        if window["state"] != "pending":
            raise RoomError("quiet window #%d is %s; there is nothing to ack"
                            % (window_id, window["state"]))
        if at > window["ack_deadline"]:
            raise RoomError("too late: the ack deadline of quiet window #%d passed at %s"
                            % (window_id, iso(window["ack_deadline"])),
                            "its requester has to ask again")
        acked = json.loads(window["acked"])
        if row["id"] not in acked:
            acked.append(row["id"])
            conn.execute("UPDATE windows SET acked=? WHERE id=?", (json.dumps(acked),
                                                                    window_id))
            event(conn, "window.ack", row["id"], subject=window_id, at=at)
        return window_dict(conn, _load_window(conn, window_id))


@tool("window_activate", "Start the quiet window", {
    "session_id": S_SESSION, "window_id": S_WINDOW_ID}, ["session_id", "window_id"],
    output=dict(S_WINDOW, properties=dict(S_WINDOW["properties"], ok={"type": "boolean"},
                                          reason={"type": "string"},
                                          holders={"type": "array", "items": S_LEASE})),
    cli="window-activate", positional=("window_id",),
    example="window-activate --session $ID 3")
def window_activate(store, ctx, session_id, window_id):
    """Start your pending window: it succeeds (ok true) only when every required
    session acked in time, every overlapping lease of others is released, and
    no other active window overlaps it; otherwise ok is false and reason says
    what is missing."""
    liveness = LazyScan(ctx)
    at = now()
    with store.write() as conn:
        sweep(conn, at)
        row = require_session(store, conn, session_id, present=True)
        window = _load_window(conn, window_id)
        if window["session_id"] != row["id"]:
            raise RoomError("quiet window #%d belongs to %s, not to you"
                            % (window_id, window["session_id"]))
        if window["state"] != "pending":
            raise RoomError("quiet window #%d is %s, not pending" % (window_id,
                                                                     window["state"]))
        shown = window_dict(conn, window)
        problems, holders = [], []
        if shown["missing_acks"]:
            problems.append("waiting for acks from %s" % ", ".join(shown["missing_acks"]))
        for r in conn.execute("SELECT * FROM window_resources WHERE window_id=?",
                              (window_id,)).fetchall():
            for lease in overlapping_leases(conn, r["kind"], r["key"], at,
                                            exclude=row["id"]):
                holders.append(lease_dict(conn, lease, liveness))
            for other in _window_rows(conn, r["kind"], r["key"], at, ("active",)):
                if other["id"] != window_id:
                    problems.append("quiet window #%d of %s is active on it"
                                    % (other["id"], other["session_id"]))
        if holders:
            problems.append("leases still held: %s" % "; ".join(
                "%s by %s" % (h["resource"], _holder_text(h)) for h in holders))
        if problems:
            event(conn, "window.refused", row["id"], subject=window_id, at=at,
                  data={"problems": problems})
            return dict(shown, ok=False, reason="; ".join(problems), holders=holders)
        conn.execute("UPDATE windows SET state='active', activated_at=? WHERE id=?",
                     (at, window_id))
        event(conn, "window.activate", row["id"], subject=window_id, at=at)
        return dict(window_dict(conn, _load_window(conn, window_id)), ok=True,
                    reason="active", holders=[])


def _end_window(store, ctx, session_id, window_id, state, allowed):
    at = now()
    with store.write() as conn:
        sweep(conn, at)
        row = require_session(store, conn, session_id)
        window = _load_window(conn, window_id)
        if window["session_id"] != row["id"]:
            raise RoomError("quiet window #%d belongs to %s, not to you"
                            % (window_id, window["session_id"]))
        if window["state"] not in allowed:
            raise RoomError("quiet window #%d is %s; it cannot be %s"
                            % (window_id, window["state"], state))
        conn.execute("UPDATE windows SET state=?, ended_at=? WHERE id=?",
                     (state, at, window_id))
        event(conn, {"released": "window.release", "cancelled": "window.cancel"}[state],
              row["id"], subject=window_id, at=at)
        return window_dict(conn, _load_window(conn, window_id))


@tool("window_release", "End the quiet window", {
    "session_id": S_SESSION, "window_id": S_WINDOW_ID}, ["session_id", "window_id"],
    output=S_WINDOW, cli="window-release", positional=("window_id",),
    example="window-release --session $ID 3", destructive=True)
def window_release(store, ctx, session_id, window_id):
    """End your active quiet window once the operation is done: others may
    claim the resources again."""
    return _end_window(store, ctx, session_id, window_id, "released", ("active",))


@tool("window_cancel", "Cancel a quiet window", {
    "session_id": S_SESSION, "window_id": S_WINDOW_ID}, ["session_id", "window_id"],
    output=S_WINDOW, cli="window-cancel", positional=("window_id",),
    example="window-cancel --session $ID 3", destructive=True)
def window_cancel(store, ctx, session_id, window_id):
    """Cancel your pending or active quiet window."""
    return _end_window(store, ctx, session_id, window_id, "cancelled", WINDOW_OPEN)


@tool("window_status", "Quiet windows", {
    "session_id": S_SESSION_OPT, "window_id": S_WINDOW_ID},
    output=out_schema(["windows"], windows={"type": "array", "items": S_WINDOW}),
    cli="window-status", example="window-status", read_only=True, idempotent=True)
def window_status(store, ctx, session_id=None, window_id=None):
    """One quiet window by id, or every open (pending or active) one."""
    at = now()
    with store.write() as conn:
        sweep(conn, at)
        if session_id:
            require_session(store, conn, session_id)
        if window_id:
            return {"windows": [window_dict(conn, _load_window(conn, window_id))]}
        return {"windows": [window_dict(conn, w) for w in conn.execute(
            "SELECT * FROM windows WHERE state IN ('pending', 'active') ORDER BY id")]}


STATUS_SCHEMA_VERSION = 1


@tool("room_status", "The room at a glance", {
    "session_id": S_SESSION_OPT, "room": S_ROOM},
    output=out_schema(["schema_version", "rooms", "sessions", "leases", "windows"],
                      schema_version={"type": "integer"},
                      generated_at=S_TIME,
                      rooms={"type": "array", "items": {"type": "object"}},
                      sessions={"type": "array", "items": {"type": "object"}},
                      leases={"type": "array", "items": S_LEASE},
                      windows={"type": "array", "items": S_WINDOW}),
    cli="status", example="status --room shared:storefront --json", read_only=True,
    idempotent=True)
def room_status(store, ctx, session_id=None, room=None):
    """One snapshot: sessions with liveness, autonomy, work states and unread
    counts; live leases with purpose and expiry; open quiet windows; the last
    messages' subjects per room. For one room, or everything in the store.
    The JSON shape is stable for scripts (schema_version)."""
    liveness = LazyScan(ctx)
    at = now()
    with store.write() as conn:
        sweep(conn, at)
        if session_id:
            require_session(store, conn, session_id)
        if room:
            rooms = [resolve_room(conn, room)]
        else:
            rooms = [r[0] for r in conn.execute(
                "SELECT DISTINCT room FROM memberships ORDER BY room")]
        marks = ",".join("?" * len(rooms)) or "''"
        ids = [r[0] for r in conn.execute(
            "SELECT DISTINCT session_id FROM memberships WHERE room IN (%s)" % marks, rooms)]
        sessions = []
        for sid in ids:
            row = session_row(conn, sid)
            item = session_dict(conn, row, liveness)
            item["work"] = work_of(conn, sid)
            item["unread"] = unread_count(conn, sid)
            sessions.append(item)
        sessions.sort(key=lambda s: (s["label"] or "~", s["session_id"]))
        leases = [lease_dict(conn, lease, liveness) for lease in conn.execute(
            "SELECT * FROM leases WHERE expires_at > ? ORDER BY path", (at,))
            if lease["session_id"] in ids or not room]
        windows = [window_dict(conn, w) for w in conn.execute(
            "SELECT * FROM windows WHERE state IN ('pending', 'active') ORDER BY id")
            if w["session_id"] in ids or not room]
        room_items = []
        for name in rooms:
            recent = conn.execute(
                "SELECT m.id, m.subject, m.sender_label, m.created_at FROM message_rooms r "
                "JOIN messages m ON m.id = r.message_id WHERE r.room=? "
                "ORDER BY r.message_id DESC LIMIT 5", (name,)).fetchall()
            room_items.append({
                "room": name,
                "cap": conn.execute("SELECT cap FROM rooms WHERE name=?",
                                    (name,)).fetchone()[0],
                "sessions": [r[0] for r in conn.execute(
                    "SELECT session_id FROM memberships WHERE room=? ORDER BY session_id",
                    (name,))],
                "recent": [{"message_id": m["id"], "subject": m["subject"],
                            "sender_label": m["sender_label"],
                            "created_at": iso(m["created_at"])} for m in reversed(recent)]})
    return {"schema_version": STATUS_SCHEMA_VERSION, "generated_at": iso(at),
            "store": store.path, "rooms": room_items, "sessions": sessions,
            "leases": leases, "windows": windows}


# ---- operations: reads and drift ------------------------------------------


def path_for(ctx, row, path):
    """Relative paths resolve against the caller's cwd on the CLI and in hooks,
    and against the session's recorded cwd over MCP (the server's cwd at join
    is the agent's project, while the server process may sit anywhere)."""
    return normalize_path(path, row["cwd"] if ctx.via == "mcp" else ctx.cwd)


@tool("note_read", "Record what you read", {"session_id": S_SESSION, "path": S_PATH},
      ["session_id", "path"],
      output=out_schema(["hash"], hash={"type": "string"}, path={"type": "string"},
                        read_at=S_TIME),
      cli="note-read", positional=("path",), example="note-read --session $ID src/a.go",
      idempotent=True)
def note_read(store, ctx, session_id, path):
    """Record the SHA-256 of a file as you read it now, the baseline drift_check
    compares against later."""
    at = now()
    with store.write() as conn:
        row = require_session(store, conn, session_id)
        full = path_for(ctx, row, path)
        try:
            digest = sha256_file(full)
        except OSError as error:
            raise RoomError("cannot read %s: %s" % (full, error.strerror or error))
        conn.execute("INSERT OR REPLACE INTO reads (session_id, path, hash, read_at) "
                     "VALUES (?,?,?,?)", (row["id"], full, digest, at))
        event(conn, "read.note", row["id"], subject=full, data={"hash": digest}, at=at)
    return {"path": full, "hash": digest, "read_at": iso(at)}


def lease_holders_between(conn, path, session_id, start, end):
    """Other sessions' leases on path that were live at some time in [start, end],
    from the event log: each claim or renewal lives until its expiry or the
    holder's next release, whichever comes first."""
    horizon = start - LEASE_TTL_MAX_S
    found = []
    covering = path_ancestors(path)      # a lease on a directory covers the file
    marks = ",".join("?" * len(covering))
    for claim in conn.execute(
            "SELECT * FROM events WHERE subject IN (%s) AND at >= ? AND at <= ? AND kind IN "
            "('lease.claim', 'lease.renew') AND session_id != ? ORDER BY at" % marks,
            covering + [horizon, end, session_id]).fetchall():
        data = json.loads(claim["data"] or "{}")
        until = data.get("expires_at", claim["at"])
        released = conn.execute(
            "SELECT MIN(at) FROM events WHERE subject=? AND session_id=? AND at >= ? AND "
            "kind = 'lease.release'", (claim["subject"], claim["session_id"],
                                       claim["at"])).fetchone()[0]
        if released is not None:
            until = min(until, released)
        if until >= start:
            found.append((claim, data, until))
    return found


@tool("drift_check", "Has a file changed since you read it", {
    "session_id": S_SESSION, "path": S_PATH}, ["session_id", "path"],
    output=out_schema(["path", "severity", "changed", "holder", "since", "message"],
                      path={"type": "string"},
                      severity={"type": "string", "enum": ["SAFE", "MINOR", "CRITICAL"]},
                      changed={"type": "boolean"}, holder=S_LEASE_OR_NULL, since=S_TIME,
                      message={"type": "string"}),
    cli="drift", positional=("path",), example="drift --session $ID src/a.go",
    read_only=True, idempotent=True)
def drift_check(store, ctx, session_id, path):
    """Compare a file with the hash note_read recorded. SAFE: unchanged, or no
    baseline. MINOR: changed (or deleted), no other session leased it meanwhile.
    CRITICAL: changed while another session held a lease on it (holder names
    it, since says from when): re-read before you write."""
    liveness = LazyScan(ctx)
    at = now()
    with store.write() as conn:
        row = require_session(store, conn, session_id)
        full = path_for(ctx, row, path)
        base = conn.execute("SELECT * FROM reads WHERE session_id=? AND path=?",
                            (row["id"], full)).fetchone()
        result = {"path": full, "severity": "SAFE", "changed": False, "holder": None,
                  "since": None}
        if base is None:
            result["message"] = "no baseline recorded for %s (note_read it first)" % full
            return result
        try:
            current = sha256_file(full)
        except FileNotFoundError:
            current = None
        except OSError as error:
            raise RoomError("cannot read %s: %s" % (full, error.strerror or error))
        if current == base["hash"]:
            result["message"] = "unchanged since you read it at %s" % iso(base["read_at"])
            return result
        result["changed"] = True
        what = "deleted" if current is None else "changed"
        holders = lease_holders_between(conn, full, row["id"], base["read_at"], at)
        if not holders:
            result["severity"] = "MINOR"
            result["message"] = "%s since you read it at %s; nobody else leased it" % (
                what, iso(base["read_at"]))
            return result
        claim, data, until = holders[-1]
        holder_row = session_row(conn, claim["session_id"])
        result["severity"] = "CRITICAL"
        result["since"] = iso(max(claim["at"], base["read_at"]))
        result["holder"] = {
            "session_id": claim["session_id"],
            "label": holder_row["label"] if holder_row else None, "path": claim["subject"],
            "resource": claim["subject"], "kind": "path", "purpose": data.get("purpose"),
            "mode": data.get("mode", "exclusive"), "acquired_at": iso(claim["at"]),
            "expires_at": iso(until),
            "liveness": liveness(holder_row) if holder_row else "gone"}
        result["message"] = "%s since you read it, while %s (label %s) held a lease on " \
            "it from %s: re-read before writing" % (
                what, claim["session_id"], result["holder"]["label"] or "-", result["since"])
        return result


# ---- operations: housekeeping ---------------------------------------------


def prune(store, quiet_s=PRUNE_QUIET_S, dry_run=False):
    """Remove sessions quiet longer than quiet_s *and* gone (the liveness room_who
    reports).  Their messages stay, each keeping its sender's label; their
    memberships, leases, reads and deliveries go.  Also finishes retention:
    audit events past 30 days, messages 90 days past their TTL."""
    liveness = LazyScan()
    at = now()
    removed, kept = [], []
    events_removed = messages_removed = 0
    with store.write() as conn:
        if not dry_run:
            while True:          # prune is the explicit call: finish the job
                batch = retention(conn, at, 5000)
                events_removed += batch[0]
                messages_removed += batch[1]
                if batch == (0, 0):
                    break
        sweep(conn, at)
        for row in conn.execute("SELECT * FROM sessions WHERE last_seen < ? ORDER BY "
                                "last_seen", (at - quiet_s,)).fetchall():
            state = liveness(row)
            item = {"session_id": row["id"], "label": row["label"], "liveness": state,
                    "last_seen": iso(row["last_seen"])}
            if state != "gone":
                kept.append(item)
                continue
            removed.append(item)
            if not dry_run:
                _release_all(conn, row["id"], "prune", at)
                conn.execute("DELETE FROM sessions WHERE id=?", (row["id"],))
                event(conn, "session.prune", row["id"], data=item, at=at)
    return {"removed": removed, "kept": kept, "dry_run": dry_run,
            "quiet_s": quiet_s, "events_removed": events_removed,
            "messages_removed": messages_removed}


def follow_events(room=None, since=None, poll_s=0.5):
    """Yield event rows as dicts, oldest first, forever: those after `since`
    (epoch seconds; default: from now on), only of `room`'s sessions when given.
    Polls the store with an indexed read of new event ids: no write, no busy
    loop."""
    store = Store()
    try:
        conn = store.conn
        if since is not None:
            last = conn.execute("SELECT COALESCE(MAX(id), 0) FROM events WHERE at < ?",
                                (since,)).fetchone()[0]
        else:
            last = conn.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0]
        full = resolve_room(conn, room) if room else None
        labels = {}
        while True:
            rows = conn.execute("SELECT * FROM events WHERE id > ? ORDER BY id LIMIT 500",
                                (last,)).fetchall()
            for row in rows:
                last = row["id"]
                sid = row["session_id"]
                if full and row["room"] != full and not conn.execute(
                        "SELECT 1 FROM memberships WHERE session_id=? AND room=?",
                        (sid, full)).fetchone():
                    continue
                if sid and sid not in labels:
                    found = session_row(conn, sid)
                    labels[sid] = found["label"] if found else None
                yield {"id": row["id"], "at": iso(row["at"]), "kind": row["kind"],
                       "session_id": sid, "label": labels.get(sid), "room": row["room"],
                       "subject": row["subject"],
                       "data": json.loads(row["data"]) if row["data"] else {}}
            if not rows:
                time.sleep(poll_s)
    finally:
        store.close()


def version_info():
    """This copy and its store: so two agents can tell whether they run the same."""
    import hashlib
    with open(this_file(), "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()
    path = default_db_path()
    schema = None
    if os.path.exists(path):
        try:
            conn = sqlite3.connect("file:%s?mode=ro" % path, uri=True)
            schema = conn.execute("PRAGMA user_version").fetchone()[0]
            conn.close()
        except sqlite3.Error:
            schema = None
    return {"version": __version__, "python": sys.version.split()[0],
            "sqlite": sqlite3.sqlite_version, "file": this_file(), "sha256": digest,
            "store": path, "store_schema_version": schema,
            "schema_version": SCHEMA_VERSION}


# ---- signals: hooks and wake levers ---------------------------------------
# The signal is one line saying something waits (counts and sender labels);
# subjects and bodies never ride it, so a recipient's context stays small and
# 'read' means the agent fetched the content itself.

SIGNAL_RETRY_S = 0            # tool events mention what is unread every time
STOP_RETRY_S = 30 * 60        # a delivery holds a Stop again after this long
WAKE_RETRY_FIRST_S = 60
WAKE_RETRY_MAX_S = 30 * 60
WAKE_ATTEMPTS_MAX = 6
WAKE_TIMEOUT_S = 20           # a process lever is killed after this long
SOCKET_TIMEOUT_S = 1.0
WAITER_LIFETIME_S = 12 * 3600
WAITER_POLL_S = 1.0


def _env_seconds(name, default):
    value = os.environ.get(name)
    try:
        return float(value) if value not in (None, "") else default
    except ValueError:
        return default


def signal_text(conn, session_id):
    """The one-line signal for a session's unread deliveries, or None."""
    rows = conn.execute(
        "SELECT COALESCE(m.sender_label, substr(m.sender, 1, 8)) AS who, COUNT(*) "
        "FROM deliveries d JOIN messages m ON m.id = d.message_id "
        "WHERE d.session_id=? AND d.state IN %s GROUP BY who ORDER BY COUNT(*) DESC"
        % UNREAD_SQL, (session_id,)).fetchall()
    total = sum(r[1] for r in rows)
    if not total:
        return None
    senders = ", ".join("%d from %s" % (r[1], one_line(r[0], 40)) for r in rows[:5])
    if len(rows) > 5:
        senders += ", ..."
    return ("agents-room: %d unread message%s (%s); call msg_recv with session_id %s"
            % (total, "" if total == 1 else "s", senders, session_id))


def mark_offered(conn, session_id, at, stop=False):
    """Signalling moves stored -> offered and stamps when; it never moves a
    state backwards (accepted and undeliverable stay as they are)."""
    conn.execute("UPDATE deliveries SET state='offered', updated_at=? WHERE session_id=? "
                 "AND state='stored'", (at, session_id))
    column = "stop_held_at" if stop else "offered_at"
    conn.execute("UPDATE deliveries SET %s=? WHERE session_id=? AND state IN %s"
                 % (column, UNREAD_SQL), (at, session_id))


def tool_event_signal(store, session_id):
    """The signal for a PostToolUse/UserPromptSubmit event, or None.  With the
    default window of 0 every tool event mentions what is still unread; with a
    window, only deliveries never offered or offered longer ago than it."""
    window = _env_seconds("AGENTS_ROOM_SIGNAL_RETRY_S", SIGNAL_RETRY_S)
    at = now()
    with store.write() as conn:
        sweep(conn, at)
        conn.execute("UPDATE sessions SET last_seen=? WHERE id=?", (at, session_id))
        due = conn.execute(
            "SELECT COUNT(*) FROM deliveries WHERE session_id=? AND state IN %s AND "
            "(offered_at IS NULL OR offered_at <= ?)" % UNREAD_SQL,
            (session_id, at - window)).fetchone()[0]
        if not due:
            return None
        text = signal_text(conn, session_id)
        mark_offered(conn, session_id, at)
        event(conn, "signal.tool", session_id, data={"text": text}, at=at)
        return text


def stop_signal(store, session_id, stop_hook_active):
    """The reason to block a Stop, or None: at hold or wake, when some unread
    delivery has not held a Stop yet, or held one longer ago than the window.
    Never when the harness says this Stop was already blocked once this turn."""
    if stop_hook_active:
        return None
    window = _env_seconds("AGENTS_ROOM_STOP_RETRY_S", STOP_RETRY_S)
    at = now()
    with store.write() as conn:
        sweep(conn, at)
        row = session_row(conn, session_id)
        conn.execute("UPDATE sessions SET last_seen=? WHERE id=?", (at, session_id))
        if effective_autonomy(conn, row) < 1:
            return None
        due = conn.execute(
            "SELECT COUNT(*) FROM deliveries WHERE session_id=? AND state IN %s AND "
            "(stop_held_at IS NULL OR stop_held_at <= ?)" % UNREAD_SQL,
            (session_id, at - window)).fetchone()[0]
        if not due:
            return None
        text = signal_text(conn, session_id)
        mark_offered(conn, session_id, at, stop=True)
        event(conn, "signal.stop", session_id, data={"text": text}, at=at)
        return text


def _waiter_armed(row, at):
    if not row["waiter_pid"] or (row["waiter_until"] or 0) <= at:
        return False
    started = process_start(row["waiter_pid"])
    return started is not None and (row["waiter_start"] is None or
                                    abs(started - row["waiter_start"]) <= 2)


def _send_socket(data, text):
    """Claude Code's inbox socket: auth line, then a user message line."""
    import socket
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(SOCKET_TIMEOUT_S)
    try:
        client.connect(data["socket"])
        client.sendall((json.dumps({"type": "auth", "token": data["token"]}) + "\n"
                        + json.dumps({"type": "user", "message": {
                            "role": "user", "content": text}, "priority": "next"})
                        + "\n").encode("utf-8"))
    finally:
        client.close()


def _wake_retry_at(attempts, at):
    if attempts >= WAKE_ATTEMPTS_MAX:
        return None
    return at + min(WAKE_RETRY_FIRST_S * (2 ** (attempts - 1)), WAKE_RETRY_MAX_S)


def run_due_wakes(store, limit=20):
    """Try the wake lever for deliveries whose wake is due (at send, then
    retries at 60 s doubling to 30 min, at most 6 attempts).  Called after tool
    events of any session: there is no daemon.  The next attempt is scheduled
    before the lever runs, so two processes never fire the same wake."""
    at = now()
    # Most tool events have nothing due: find out with an indexed read before
    # taking the write lock.
    if store.conn.execute("SELECT 1 FROM deliveries WHERE wake_next_at <= ? LIMIT 1",
                          (at,)).fetchone() is None:
        return 0
    with store.write() as conn:
        due = conn.execute(
            "SELECT session_id, message_id, wake_attempts FROM deliveries "
            "WHERE wake_next_at IS NOT NULL AND wake_next_at <= ? LIMIT ?",
            (at, limit)).fetchall()
        if not due:
            return 0
        plans = {}
        for d in due:
            attempts = d["wake_attempts"] + 1
            conn.execute("UPDATE deliveries SET wake_attempts=?, wake_next_at=? "
                         "WHERE session_id=? AND message_id=?",
                         (attempts, _wake_retry_at(attempts, at), d["session_id"],
                          d["message_id"]))
            plans.setdefault(d["session_id"], []).append(d["message_id"])
        jobs = []
        for session_id, message_ids in plans.items():
            row = session_row(conn, session_id)
            marks = ",".join("?" * len(message_ids))
            scope = "session_id=? AND message_id IN (%s)" % marks
            params = (session_id,) + tuple(message_ids)
            if row["left_at"] is not None or effective_autonomy(conn, row) < 2:
                conn.execute("UPDATE deliveries SET wake_next_at=NULL WHERE " + scope,
                             params)
                continue
            text = signal_text(conn, session_id)
            if text is None:
                conn.execute("UPDATE deliveries SET wake_next_at=NULL WHERE " + scope,
                             params)
                continue
            data = json.loads(row["lever_data"] or "{}")
            lever = row["lever"]
            if lever != "claude-socket" and _waiter_armed(row, at):
                lever = "claude-rewake"
            if lever is None:
                conn.execute("UPDATE deliveries SET state='undeliverable', updated_at=?, "
                             "wake_next_at=NULL WHERE state='stored' AND " + scope,
                             (at,) + params)
                event(conn, "wake.none", session_id, data={"messages": message_ids}, at=at)
                continue
            conn.execute("UPDATE deliveries SET state='offered', updated_at=?, offered_at="
                         "COALESCE(offered_at, ?) WHERE state='stored' AND " + scope,
                         (at, at) + params)
            if lever == "claude-rewake":
                # The armed waiter sees the delivery and wakes the session itself.
                conn.execute("UPDATE deliveries SET wake_next_at=NULL WHERE " + scope,
                             params)
            event(conn, "wake.try", session_id, data={"lever": lever,
                                                      "messages": message_ids}, at=at)
            jobs.append((session_id, message_ids, lever, data, text))
    for session_id, message_ids, lever, data, text in jobs:
        if lever == "claude-socket":
            try:
                _send_socket(data, text)
                ok, detail = True, "socket accepted"
            except OSError as error:
                ok, detail = False, "socket: %s" % error
            record_wake(store, session_id, message_ids, lever, ok, detail)
        elif lever in ("codex-queue", "wake-cmd"):
            if lever == "codex-queue":
                argv = ["codex", "queue", "--thread", data["thread"], "--message", text]
            else:
                argv = list(data["argv"]) + [text]
            _spawn_wake(store, session_id, message_ids, lever, argv)
    return len(jobs)


def mark_accepted(conn, session_id, message_ids, lever, at, detail=None):
    """A lever confirmed: its deliveries move to accepted (forward only, so a
    read or acked one stays) and stop being retried; the event says which."""
    conn.execute(
        "UPDATE deliveries SET state='accepted', updated_at=?, wake_next_at=NULL "
        "WHERE session_id=? AND state IN ('stored','offered') AND message_id IN (%s)"
        % ",".join("?" * len(message_ids)), (at, session_id) + tuple(message_ids))
    event(conn, "wake.accepted", session_id, at=at,
          data={"lever": lever, "messages": message_ids, "detail": detail})


def record_wake(store, session_id, message_ids, lever, ok, detail):
    """A lever's outcome: confirmed -> accepted (no more retries); otherwise the
    delivery stays offered and the retry already scheduled stands."""
    at = now()
    with store.write() as conn:
        if ok:
            mark_accepted(conn, session_id, message_ids, lever, at, detail)
        else:
            event(conn, "wake.failed", session_id, at=at,
                  data={"lever": lever, "messages": message_ids, "detail": detail})


def _spawn_wake(store, session_id, message_ids, lever, argv):
    """Run a process lever detached, in its own process group, through
    `agents_room.py wake-run`, which bounds it by a timeout and records the
    outcome in the store itself: no caller waits on a slow lever."""
    import subprocess
    payload = json.dumps({"session_id": session_id, "messages": message_ids,
                          "lever": lever, "argv": argv})
    env = dict(os.environ, AGENTS_ROOM_DB=store.path)
    try:
        subprocess.Popen([sys.executable, os.path.abspath(__file__), "wake-run", payload],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, env=env,
                         close_fds=True)
    except OSError as error:
        record_wake(store, session_id, message_ids, lever, False, "spawn: %s" % error)


def wake_run(payload):
    """The detached half of a process lever (see _spawn_wake)."""
    import subprocess
    job = json.loads(payload)
    timeout = _env_seconds("AGENTS_ROOM_WAKE_TIMEOUT_S", WAKE_TIMEOUT_S)
    try:
        done = subprocess.run(job["argv"], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              timeout=timeout)
        ok = done.returncode == 0
        detail = "exit %d %s" % (done.returncode, one_line(
            done.stderr.decode("utf-8", "replace"), 200))
    except subprocess.TimeoutExpired:
        ok, detail = False, "timed out after %gs" % timeout
    except OSError as error:
        ok, detail = False, "cannot run %s: %s" % (job["argv"][0], error)
    store = Store()
    try:
        record_wake(store, job["session_id"], job["messages"], job["lever"], ok, detail)
    finally:
        store.close()
    return 0


def after_tool_event(store):
    """Work that rides any session's tool event: due wakes and their retries."""
    try:
        run_due_wakes(store)
    except RoomError as error:
        sys.stderr.write("agents-room: wake: %s\n" % error.message)


HOOK_EVENTS = ("SessionStart", "UserPromptSubmit", "PostToolUse", "Stop", "SessionEnd",
               "PreToolUse")
EDIT_TOOLS = "Edit|Write|MultiEdit|NotebookEdit"
HOOK_TIMEOUT_S = 8
# Launchers between a harness and its hook.  Not python: Hermes is a Python
# program, and the walk starts at the hook's parent, never the hook itself.
SHELLS = {"sh", "bash", "zsh", "dash", "fish", "ksh", "tcsh", "csh", "env", "timeout",
          "nice", "nohup", "sudo"}


def harness_pid(start_pid):
    """The first ancestor of a hook that is not a shell or launcher: the harness
    process whose lifetime is the session's."""
    pid = start_pid
    for _ in range(16):
        if pid <= 1:
            return None
        comm, parent = _proc_comm_ppid(pid)
        if comm is None:
            return None
        if os.path.basename(comm) not in SHELLS:
            return pid
        pid = parent
    return None


def _proc_comm_ppid(pid):
    if scanner_kind() == "proc":
        try:
            with open(os.path.join(proc_root(), str(pid), "stat")) as handle:
                text = handle.read()
            comm = text[text.index("(") + 1:text.rindex(")")]
            return comm, int(text.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None, 0
    import subprocess
    try:
        out = subprocess.run(["ps", "-o", "ppid=,comm=", "-p", str(pid)],
                             capture_output=True, text=True, timeout=5).stdout.split(None, 1)
        return out[1].strip(), int(out[0])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None, 0


def hook_harness(env):
    """The harness a hook runs in: detected, else Claude Code, whose hook format
    this is (Codex and Hermes mark their environments)."""
    detected = detect_harness(env)
    return "claude-code" if detected == "generic" else detected


def _hook_options(argv):
    """--event=E --autonomy N --label L --room R --also S --tag T --wait, parsed
    by hand: argparse alone costs more than the rest of a hook."""
    opts = {"also": [], "tag": [], "wait": False}
    items = list(argv)
    while items:
        item = items.pop(0)
        if item == "--wait":
            opts["wait"] = True
            continue
        if not item.startswith("--"):
            raise UsageError("hook: unexpected argument %r" % item)
        name, _, value = item[2:].partition("=")
        if not _:
            if not items:
                raise UsageError("hook: --%s needs a value" % name)
            value = items.pop(0)
        if name in ("also", "tag"):
            opts[name].append(value)
        elif name in ("event", "autonomy", "label", "room"):
            opts[name] = value
        else:
            raise UsageError("hook: unknown option --%s" % name)
    if opts.get("event") not in HOOK_EVENTS:
        raise UsageError("hook needs --event=%s" % "|".join(HOOK_EVENTS))
    return opts


def _hook_context(event_name, text):
    return json.dumps({"hookSpecificOutput": {"hookEventName": event_name,
                                              "additionalContext": text}})


def session_digest(store, session_id, cwd):
    """SessionStart's context: the session id first, then blockers (live leases
    of others in this repository), unread count, rooms and who is here."""
    liveness = LazyScan()
    at = now()
    root = repo_root(cwd) or cwd
    with store.read() as conn:
        row = session_row(conn, session_id)
        rooms = rooms_of(conn, session_id)
        lines = ["agents-room: your session_id is %s - pass it to every agents-room "
                 "tool (it is not the harness's session id)." % session_id]
        blockers = []
        for lease in conn.execute(
                "SELECT * FROM leases WHERE session_id != ? AND expires_at > ? AND "
                "kind = 'path' AND (path = ? OR path LIKE ?) ORDER BY path LIMIT 20",
                (session_id, at, root, root.rstrip(os.sep) + os.sep + "%")):
            shown = lease_dict(conn, lease, liveness)
            blockers.append("%s (%s by %s, %s, until %s)" % (
                os.path.relpath(shown["path"], root), shown["mode"],
                one_line(shown["label"] or shown["session_id"], 40), shown["liveness"],
                shown["expires_at"]))
        if blockers:
            lines.append("Leased by others here: " + "; ".join(blockers))
        count = unread_count(conn, session_id)
        if count:
            lines.append("%d unread message%s: call msg_recv." % (
                count, "" if count == 1 else "s"))
        lines.append("Rooms: %s. Autonomy: %s." % (
            ", ".join(rooms), autonomy_name(effective_autonomy(conn, row))))
        others = []
        for room in rooms:
            for mate in conn.execute(
                    "SELECT s.* FROM memberships m JOIN sessions s ON s.id = m.session_id "
                    "WHERE m.room=? AND s.id != ? AND s.left_at IS NULL LIMIT 20",
                    (room, session_id)):
                entry = "%s (%s)" % (one_line(mate["label"] or mate["id"], 40),
                                     liveness(mate))
                if entry not in others:
                    others.append(entry)
        lines.append("Here: %s." % (", ".join(others[:20]) if others else "nobody else"))
    return "\n".join(lines)


def run_hook(argv, stdin_text, env=None):
    """One harness hook event -> (stdout text, exit code).  Raises on failure;
    hook_main turns any failure into silence, because a hook must never break
    the harness."""
    env = os.environ if env is None else env
    opts = _hook_options(argv)
    event_name = opts["event"]
    payload = json.loads(stdin_text) if stdin_text.strip() else {}
    if not isinstance(payload, dict):
        raise UsageError("hook input is not a JSON object")
    key = payload.get("session_id") or harness_key_from(env)
    if not key or not isinstance(key, str):
        return "", 0
    cwd = payload.get("cwd") if isinstance(payload.get("cwd"), str) else os.getcwd()
    store = Store()
    try:
        if event_name == "SessionStart":
            pid = harness_pid(os.getppid())
            ctx = Context(via="hook", cwd=cwd, env=env, pid=pid,
                          pid_start=process_start(pid) if pid else None)
            joined = room_join(store, ctx, room=opts.get("room"),
                               extra_rooms=opts["also"] or None, label=opts.get("label"),
                               tags=opts["tag"] or None, autonomy=opts.get("autonomy"),
                               harness=hook_harness(env), harness_key=key)
            return _hook_context(event_name, session_digest(
                store, joined["session_id"], cwd)), 0
        with store.read() as conn:
            row = conn.execute("SELECT id, left_at FROM sessions WHERE harness_key=?",
                               (key,)).fetchone()
        if row is None or (row["left_at"] is not None and event_name != "SessionEnd"):
            return "", 0        # SessionStart was missed: stay silent
        if event_name == "SessionEnd":
            if row["left_at"] is None:
                room_leave(store, Context(via="hook", cwd=cwd, env=env), row["id"])
            return "", 0
        if event_name == "PreToolUse":
            return pre_tool_use(store, row["id"], payload, cwd), 0
        if event_name == "Stop":
            if opts["wait"]:
                return wait_for_wake(store, row["id"])
            text = stop_signal(store, row["id"], bool(payload.get("stop_hook_active")))
            after_tool_event(store)
            return (json.dumps({"decision": "block", "reason": text}) if text else ""), 0
        text = tool_event_signal(store, row["id"])
        after_tool_event(store)
        return (_hook_context(event_name, text) if text else ""), 0
    finally:
        store.close()


def pre_tool_use(store, session_id, payload, cwd):
    """Before an edit tool writes a file that another live session holds
    exclusively (or that sits under a directory it holds), ask the user first:
    the answer names the holder, its purpose and the expiry."""
    tool_input = payload.get("tool_input") if isinstance(payload.get("tool_input"),
                                                         dict) else {}
    target = next((tool_input[k] for k in ("file_path", "notebook_path", "path")
                   if isinstance(tool_input.get(k), str) and tool_input[k]), None)
    if target is None:
        return ""
    ctx = Context(via="hook", cwd=cwd)
    result = lease_guard(store, ctx, session_id, path=target, mode="shared")
    if not result["conflicts"]:
        return ""
    reason = "agents-room: %s is leased: %s. Ask the holder (msg_send) or the user " \
             "before editing." % (target, "; ".join(
                 _holder_text(l) if l["mode"] != "window" else l["purpose"]
                 for l in result["conflicts"]))
    return json.dumps({"hookSpecificOutput": {
        "hookEventName": "PreToolUse", "permissionDecision": "ask",
        "permissionDecisionReason": clean(reason)}})


def wait_for_wake(store, session_id):
    """Claude Code's rewake lever: run as an asyncRewake Stop hook, register as
    the session's armed waiter, poll the store cheaply, and when a message sent
    after arming is unread, print the signal to stderr and exit 2 (which wakes
    the model).  Ends quietly when replaced by a newer waiter, when the session
    leaves or its harness is gone, or after WAITER_LIFETIME_S."""
    pid = os.getpid()
    armed_at = now()
    lifetime = _env_seconds("AGENTS_ROOM_WAITER_LIFETIME_S", WAITER_LIFETIME_S)
    poll = _env_seconds("AGENTS_ROOM_WAITER_POLL_S", WAITER_POLL_S)
    with store.write() as conn:
        conn.execute("UPDATE sessions SET waiter_pid=?, waiter_start=?, waiter_until=? "
                     "WHERE id=?", (pid, process_start(pid), armed_at + lifetime,
                                    session_id))
        event(conn, "wake.armed", session_id, data={"pid": pid}, at=armed_at)
    checks = 0
    while now() < armed_at + lifetime:
        time.sleep(poll)
        checks += 1
        with store.write() as conn:
            row = session_row(conn, session_id)
            if row is None or row["left_at"] is not None or row["waiter_pid"] != pid:
                return "", 0
            fresh = [r[0] for r in conn.execute(
                "SELECT d.message_id FROM deliveries d JOIN messages m ON m.id = "
                "d.message_id WHERE d.session_id=? AND d.state IN %s AND "
                "m.created_at >= ?" % UNREAD_SQL, (session_id, armed_at))]
            if fresh:
                text = signal_text(conn, session_id)
                mark_accepted(conn, session_id, fresh, "claude-rewake", now())
                conn.execute("UPDATE sessions SET waiter_pid=NULL WHERE id=?", (session_id,))
                sys.stderr.write(text + "\n")
                return "", 2
        if checks % 30 == 0 and row["pid"]:
            scan_state = LazyScan()(row)
            if scan_state == "gone":
                return "", 0
    return "", 0


def hook_main(argv):
    """Entry for `hook`: never fails the harness.  Any error prints nothing,
    exits 0, and leaves a line in hook.log beside the store."""
    import signal

    def too_slow(signum, frame):
        raise TimeoutError("hook took longer than %ds" % HOOK_TIMEOUT_S)
    waiting = "--wait" in argv
    if not waiting and hasattr(signal, "SIGALRM"):
        signal.signal(signal.SIGALRM, too_slow)
        signal.alarm(HOOK_TIMEOUT_S)
    try:
        text, code = run_hook(argv, sys.stdin.read() if not sys.stdin.isatty() else "")
    except BaseException as error:  # noqa: a hook must never break the harness
        if isinstance(error, KeyboardInterrupt):
            return 0
        _hook_log("hook %s failed: %s: %s" % (" ".join(argv), type(error).__name__,
                                              error))
        return 0
    finally:
        if not waiting and hasattr(signal, "SIGALRM"):
            signal.alarm(0)
    if text:
        sys.stdout.write(text + "\n")
    return code


def _hook_log(line):
    try:
        directory = os.path.dirname(default_db_path())
        os.makedirs(directory, mode=0o700, exist_ok=True)
        with open(os.path.join(directory, "hook.log"), "a") as handle:
            handle.write("%s %s\n" % (iso(time.time()), line))
    except OSError:
        pass
    sys.stderr.write("agents-room: %s\n" % line)


# ---- harness setup and doctor ---------------------------------------------
# `setup` writes the MCP entry and the hook entries with this file's absolute
# path, so nobody hand-writes hook JSON; `doctor` says, line by line, what is
# configured and what to do where it is not.

SETUP_MARK = "agents_room"


def fast_launcher():
    """argv that runs this program by importing it, so Python uses the bytecode
    cache instead of compiling a few thousand lines on every hook (measured:
    about 60 ms of a 130 ms hook).  -c with an explicit sys.path entry needs no
    shell and no PYTHONPATH, and a stray agents_room.py in the harness's cwd
    cannot shadow this one."""
    code = ("import sys; sys.path.insert(0, %s); from agents_room import main; "
            "sys.exit(main())" % json.dumps(os.path.dirname(this_file())))
    return [sys.executable, "-c", code]


def precompile():
    """Write this file's bytecode cache now (best effort), so the first hook
    is fast even where PYTHONDONTWRITEBYTECODE is set."""
    import importlib.util
    import py_compile
    try:
        return py_compile.compile(this_file(), doraise=True,
                                  cfile=importlib.util.cache_from_source(this_file()))
    except (OSError, py_compile.PyCompileError):
        return None


def hook_command(event_name, autonomy=None, extra=()):
    parts = fast_launcher() + ["hook", "--event=" + event_name]
    if autonomy is not None and event_name == "SessionStart":
        parts += ["--autonomy", str(autonomy)]
    parts += list(extra)
    import shlex
    return " ".join(shlex.quote(p) for p in parts)


def _claude_style_hooks(events, autonomy, start_extra=()):
    """Hook entries in the Claude Code settings shape (Codex reads the same)."""
    hooks = {}
    for name in events:
        # Codex clamps SessionEnd hooks to 3 s; a leave takes milliseconds.
        entry = {"type": "command", "timeout": 3 if name == "SessionEnd" else
                 HOOK_TIMEOUT_S + 2,
                 "command": hook_command(name, autonomy,
                                         start_extra if name == "SessionStart" else ())}
        group = {"hooks": [entry]}
        if name == "PostToolUse":
            group["matcher"] = "*"
        if name == "PreToolUse":
            group["matcher"] = EDIT_TOOLS
        hooks[name] = [group]
    if autonomy == 2 and "Stop" in hooks:
        hooks["Stop"][0]["hooks"].append({
            "type": "command", "command": hook_command("Stop", None, ["--wait"]),
            "asyncRewake": True, "timeout": int(WAITER_LIFETIME_S)})
    return hooks


def _is_ours(group):
    return any(SETUP_MARK in str(h.get("command", "")) and " hook " in
               str(h.get("command", "")) for h in group.get("hooks", []))


def merge_hooks(settings, hooks):
    """Replace agents-room's hook groups in settings, keeping everyone else's."""
    existing = settings.setdefault("hooks", {})
    if not isinstance(existing, dict):
        raise RoomError("'hooks' in the settings file is not an object; fix it by hand")
    for name, groups in hooks.items():
        kept = [g for g in existing.get(name, []) if isinstance(g, dict) and not _is_ours(g)]
        existing[name] = kept + groups
    return settings


def _read_json(path):
    if not os.path.exists(path):
        return {}
    try:
        with open(path) as handle:
            text = handle.read()
        data = json.loads(text) if text.strip() else {}
    except (OSError, ValueError) as error:
        raise RoomError("cannot read %s as JSON: %s" % (path, error),
                        "fix or move the file; nothing was written")
    if not isinstance(data, dict):
        raise RoomError("%s does not hold a JSON object; nothing was written" % path)
    return data


def _read_text(path):
    """A config file's text, or "" when it does not exist yet."""
    try:
        with open(path) as handle:
            return handle.read()
    except FileNotFoundError:
        return ""


def _write_atomic(path, text):
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    temporary = "%s.agents-room-%d.tmp" % (path, os.getpid())
    with open(temporary, "w") as handle:
        handle.write(text)
    if os.path.exists(path):
        os.chmod(temporary, os.stat(path).st_mode & 0o7777)
    os.replace(temporary, path)


def _mcp_entry():
    return {"command": sys.executable, "args": [this_file(), "serve"]}


def _toml_block(autonomy):
    return ('[mcp_servers.agents-room]\ncommand = %s\nargs = [%s, "serve"]\n'
            'env_vars = ["AGENTS_ROOM_DB", "CODEX_THREAD_ID", "AGENTS_ROOM_HARNESS_KEY"]\n'
            % (json.dumps(sys.executable), json.dumps(this_file())))


def merge_codex_toml(text):
    """Add (or replace) the agents-room MCP table and turn hooks on, leaving the
    rest of config.toml as it was.  Line-based: no TOML library in the stdlib."""
    lines = text.splitlines()
    out, skipping = [], False
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("["):
            skipping = stripped in ("[mcp_servers.agents-room]",
                                    '[mcp_servers."agents-room"]')
        if not skipping:
            out.append(line)
    # Hooks are on by default in current Codex; `hooks` is the canonical key
    # (`codex_hooks` its deprecated alias).  Say it once, where it is absent.
    import re
    out = [re.sub(r"^(\s*)codex_hooks(\s*=)", r"\1hooks\2", l) for l in out]
    keys = [l.split("=")[0].strip() for l in out]
    if "hooks" not in keys:
        if "[features]" in (l.strip() for l in out):
            index = [l.strip() for l in out].index("[features]")
            out.insert(index + 1, "hooks = true")
        else:
            out += ["", "[features]", "hooks = true"]
    while out and not out[-1].strip():
        out.pop()
    while out and not out[0].strip():
        out.pop(0)
    return "\n".join(out) + ("\n\n" if out else "") + _toml_block(None)


def _hermes_block(autonomy):
    events = (("on_session_start", "SessionStart"), ("pre_llm_call", "UserPromptSubmit"),
              ("post_tool_call", "PostToolUse"), ("on_session_end", "SessionEnd"))
    lines = ["mcp_servers:", "  agents-room:", "    command: %s" % json.dumps(sys.executable),
             "    args: [%s, \"serve\"]" % json.dumps(this_file()), "hooks:"]
    for hermes_event, ours in events:
        lines += ["  %s:" % hermes_event,
                  "    - command: %s" % json.dumps(hook_command(ours, autonomy)),
                  "      timeout: %d" % (HOOK_TIMEOUT_S + 2)]
    return "\n".join(lines) + "\n"


def setup(harness, autonomy=0, write=False, scope="project", cwd=None, home=None):
    """What to configure for a harness -> {"files": [{path, content, action}],
    "notes": [...]}; with write=True the files are merged and written."""
    cwd = cwd or os.getcwd()
    home = home or os.path.expanduser("~")
    level = parse_autonomy(autonomy) or 0
    files, notes = [], []
    if harness == "claude":
        events = ("SessionStart", "UserPromptSubmit", "PostToolUse", "Stop", "SessionEnd",
                  "PreToolUse")
        hooks = _claude_style_hooks(events, level)
        if scope == "user":
            settings_path = os.path.join(home, ".claude", "settings.json")
            notes.append("MCP server for every project: claude mcp add --scope user "
                         "agents-room -- %s %s serve" % (sys.executable, this_file()))
        else:
            settings_path = os.path.join(cwd, ".claude", "settings.json")
            mcp_path = os.path.join(cwd, ".mcp.json")
            mcp = _read_json(mcp_path)
            servers = mcp.setdefault("mcpServers", {})
            servers["agents-room"] = _mcp_entry()
            files.append({"path": mcp_path, "content": json.dumps(mcp, indent=2) + "\n"})
        settings = merge_hooks(_read_json(settings_path), hooks)
        files.append({"path": settings_path,
                      "content": json.dumps(settings, indent=2) + "\n"})
        if level == 2:
            notes.append("wake: a Stop hook with asyncRewake waits in the background and "
                         "wakes the session when a message arrives")
    elif harness == "codex":
        codex_home = os.environ.get("CODEX_HOME") or os.path.join(home, ".codex")
        config_path = os.path.join(codex_home, "config.toml")
        files.append({"path": config_path,
                      "content": merge_codex_toml(_read_text(config_path))})
        hooks_path = os.path.join(codex_home, "hooks.json")
        hooks = _claude_style_hooks(("SessionStart", "UserPromptSubmit", "PostToolUse",
                                     "Stop", "SessionEnd"), min(level, 1))
        notes.append("Codex runs a new or changed hook only once you trust it: open /hooks "
                     "in the Codex TUI and trust the agents-room entries")
        settings = merge_hooks(_read_json(hooks_path), hooks)
        files.append({"path": hooks_path, "content": json.dumps(settings, indent=2) + "\n"})
        if level == 2:
            notes.append("wake: codex queue --thread <CODEX_THREAD_ID> is the lever; "
                         "the session records it at join when CODEX_THREAD_ID is set")
    elif harness == "hermes":
        hermes_home = os.environ.get("HERMES_HOME") or os.path.join(home, ".hermes")
        config_path = os.path.join(hermes_home, "config.yaml")
        current = _read_text(config_path)
        block = _hermes_block(min(level, 1))
        if this_file() in current:
            files.append({"path": config_path, "content": current,
                          "action": "already configured"})
        elif any(l.startswith(("mcp_servers:", "hooks:")) for l in current.splitlines()):
            files.append({"path": config_path, "content": block,
                          "action": "merge by hand: the file already has mcp_servers: or "
                                    "hooks:; add these entries under them"})
        else:
            files.append({"path": config_path, "content": current + (
                "\n" if current and not current.endswith("\n") else "") + block})
        notes.append("Hermes asks once per hook before running it; set "
                     "hooks_auto_accept: true for unattended runs")
    else:
        raise UsageError("setup takes claude, codex or hermes, not %r" % harness)
    if write:
        precompile()
        for item in files:
            if item.get("action"):
                continue
            _write_atomic(item["path"], item["content"])
            item["action"] = "written"
    for item in files:
        item.setdefault("action", "would write (use --write)")
    return {"harness": harness, "autonomy": level, "files": files, "notes": notes}


GUARD_MARK = "agents-room guard: installed by agents_room.py install-guard"


def install_guard(cwd=None):
    """Write a git pre-commit hook that runs `guard --staged`, keeping any hook
    already there: it is renamed and run first, and its failure stops the
    commit as before."""
    import shlex
    import subprocess
    cwd = cwd or os.getcwd()
    done = subprocess.run(["git", "rev-parse", "--git-path", "hooks"], cwd=cwd,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RoomError("not in a git repository: %s" % cwd, "run it inside the repository")
    hooks = os.path.join(cwd, done.stdout.strip())
    os.makedirs(hooks, exist_ok=True)
    hook = os.path.join(hooks, "pre-commit")
    chained = hook + ".agents-room-chained"
    action = "installed"
    if os.path.exists(hook):
        with open(hook, errors="replace") as handle:
            ours = GUARD_MARK in handle.read()
        if ours:
            action = "updated"
        elif os.path.exists(chained):
            raise RoomError("%s exists and so does %s; merge them by hand" % (hook, chained))
        else:
            os.replace(hook, chained)
            action = "installed, chaining the existing hook (now %s)" % os.path.basename(
                chained)
    command = " ".join(shlex.quote(p) for p in fast_launcher() + ["guard", "--staged"])
    script = ("#!/bin/sh\n# %s\n"
              "# It refuses a commit that touches files another live session holds\n"
              "# exclusively.  AGENTS_ROOM_GUARD=warn: report only; =off: skip.\n"
              "chained=\"$(dirname \"$0\")/pre-commit.agents-room-chained\"\n"
              "if [ -x \"$chained\" ]; then \"$chained\" \"$@\" || exit $?; fi\n"
              "exec %s\n" % (GUARD_MARK, command))
    _write_atomic(hook, script)
    os.chmod(hook, 0o755)
    precompile()
    return {"hook": hook, "action": action}


def _configured(path, needle):
    try:
        with open(path) as handle:
            return needle in handle.read()
    except OSError:
        return False


def doctor(env=None, cwd=None, home=None):
    """Checks, each (status, what, advice): status is ok, warn or fail."""
    env = os.environ if env is None else env
    cwd = cwd or os.getcwd()
    home = home or os.path.expanduser("~")
    checks = []
    path = default_db_path()
    directory = os.path.dirname(path)
    checks.append(("ok", "store: %s" % path, ""))
    if os.path.exists(path):
        mode = stat_mode(path)
        dir_mode = stat_mode(directory)
        if mode & 0o077 or dir_mode & 0o077:
            checks.append(("warn", "store permissions: file %03o, directory %03o" % (
                mode, dir_mode), "others can read it: chmod 600 %s; chmod 700 %s"
                % (path, directory)))
        else:
            checks.append(("ok", "store permissions: file %03o, directory %03o"
                           % (mode, dir_mode), ""))
        try:
            store = Store(path)
            try:
                journal = store.conn.execute("PRAGMA journal_mode").fetchone()[0]
                version = store.conn.execute("PRAGMA user_version").fetchone()[0]
                sessions = store.conn.execute(
                    "SELECT COUNT(*) FROM sessions WHERE left_at IS NULL").fetchone()[0]
            finally:
                store.close()
            checks.append(("ok" if journal == "wal" else "warn",
                           "journal mode: %s" % journal,
                           "" if journal == "wal" else "the store should be in WAL mode"))
            checks.append(("ok", "schema version %d, %d present sessions, SQLite %s"
                           % (version, sessions, sqlite3.sqlite_version), ""))
        except RoomError as error:
            checks.append(("fail", "store: %s" % error.message, error.hint or ""))
    else:
        checks.append(("ok", "store not created yet", "the first join creates it"))
    harness = detect_harness(env)
    checks.append(("ok", "harness detected: %s" % harness, ""))
    key = harness_key_from(env)
    var = next((v for v in HARNESS_KEY_VARS if env.get(v)), None)
    if key:
        checks.append(("ok", "harness key from %s: %s" % (var, key), ""))
    else:
        checks.append(("warn", "no harness key in the environment",
                       "rejoins cannot find the same session and liveness relies on a "
                       "pid; set AGENTS_ROOM_HARNESS_KEY or run inside the harness"))
    lever, _ = detect_lever(env, harness)
    checks.append(("ok" if lever else "warn", "wake lever here: %s" % (lever or "none"),
                   "" if lever else "at autonomy 2 deliveries become undeliverable; "
                   "Claude Code wakes through the asyncRewake Stop hook (setup claude "
                   "--autonomy 2), or set AGENTS_ROOM_WAKE_CMD"))
    claude_settings = [os.path.join(cwd, ".claude", "settings.json"),
                       os.path.join(home, ".claude", "settings.json")]
    hooked = [p for p in claude_settings if _configured(p, SETUP_MARK)]
    checks.append(("ok" if hooked else "warn", "Claude Code hooks: %s" % (
        ", ".join(hooked) or "not configured"),
        "" if hooked else "python3 %s setup claude --write" % this_file()))
    mcp_files = [os.path.join(cwd, ".mcp.json"), os.path.join(home, ".claude.json")]
    served = [p for p in mcp_files if _configured(p, SETUP_MARK)]
    checks.append(("ok" if served else "warn", "Claude Code MCP entry: %s" % (
        ", ".join(served) or "not configured"),
        "" if served else "python3 %s setup claude --write" % this_file()))
    codex_home = env.get("CODEX_HOME") or os.path.join(home, ".codex")
    codex_ok = _configured(os.path.join(codex_home, "config.toml"), "agents-room")
    checks.append(("ok" if codex_ok else "warn", "Codex MCP entry: %s" % (
        "configured" if codex_ok else "not configured"),
        "" if codex_ok else "python3 %s setup codex --write" % this_file()))
    if key:
        try:
            store = Store(path)
            try:
                row = store.conn.execute("SELECT * FROM sessions WHERE harness_key=?",
                                         (key,)).fetchone()
                if row:
                    checks.append(("ok", "this session: %s (label %s), autonomy %s, "
                                   "lever %s" % (row["id"], row["label"] or "-",
                                                 autonomy_name(effective_autonomy(
                                                     store.conn, row)),
                                                 row["lever"] or "none"), ""))
                else:
                    checks.append(("warn", "no session for this harness key yet",
                                   "the SessionStart hook or room_join creates it"))
            finally:
                store.close()
        except RoomError:
            pass
    return checks


def stat_mode(path):
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        return 0



# ---- MCP server -----------------------------------------------------------

PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
LINE_MAX_BYTES = 16 * 1024 * 1024
JSON_DEPTH_MAX = 64

INSTRUCTIONS = """agents-room connects you with agent sessions in other repositories.
1. Call room_join once at the start (add extra_rooms for shared rooms); keep the
   session_id it returns and pass it to every other tool. It is not the
   harness's own session id.
2. When told messages are waiting, call msg_recv; msg_ack what you acted on.
3. Before editing a file others may touch, lease_claim it; release it after.
4. note_read files you rely on; drift_check them before writing: CRITICAL
   means another session changed it while holding a lease - re-read first.
5. msg_send to '*', a session id, file:<glob> or tag:<tag>; room_who shows who
   is here and alive; room_history shows what was decided in a room."""


def _rpc_error(id_, code, message, data=None):
    error = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": id_, "error": error}


def _rpc_result(id_, result):
    return {"jsonrpc": "2.0", "id": id_, "result": result}


def _too_deep(value, depth=0):
    if depth > JSON_DEPTH_MAX:
        return True
    if isinstance(value, dict):
        return any(_too_deep(v, depth + 1) for v in value.values())
    if isinstance(value, list):
        return any(_too_deep(v, depth + 1) for v in value)
    return False


class McpServer:
    """Newline-delimited JSON-RPC 2.0 over stdio: one line in, at most one line
    out.  No input can end the loop: every line gets its answer (or, for a
    notification or a response, none) and the next line is read."""

    def __init__(self, store, ctx, log=None):
        self.store, self.ctx = store, ctx
        self.protocol = None
        self.wrote = False        # a tools/call since the last idle checkpoint
        self.log = log or (lambda text: sys.stderr.write("agents-room: %s\n" % text))

    def handle_line(self, line):
        """One raw line (bytes) -> the response object or list, or None."""
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as error:
            return _rpc_error(None, -32700, "Parse error: the line is not valid UTF-8 "
                              "(byte %d)" % error.start)
        if not text.strip():
            return None
        try:
            message = json.loads(text)
        except ValueError as error:
            return _rpc_error(None, -32700, "Parse error: %s" % error)
        except RecursionError:
            return _rpc_error(None, -32600, "Invalid Request: nested deeper than %d"
                              % JSON_DEPTH_MAX)
        if _too_deep(message):
            return _rpc_error(None, -32600, "Invalid Request: nested deeper than %d"
                              % JSON_DEPTH_MAX)
        if isinstance(message, list):
            if self.protocol != "2025-03-26":
                return _rpc_error(None, -32600, "Invalid Request: batches are only "
                                  "accepted under protocol 2025-03-26 (negotiated: %s)"
                                  % (self.protocol or "none"))
            if not message:
                return _rpc_error(None, -32600, "Invalid Request: empty batch")
            answers = [self.handle_message(item) for item in message]
            answers = [a for a in answers if a is not None]
            return answers or None
        return self.handle_message(message)

    def handle_message(self, message):
        if not isinstance(message, dict):
            return _rpc_error(None, -32600, "Invalid Request: expected a JSON object")
        if "method" not in message:
            if "result" in message or "error" in message:
                return None         # a response to nothing we asked: ignore it
            return _rpc_error(self._id_or_null(message), -32600,
                              "Invalid Request: no method")
        has_id = "id" in message
        id_ = message.get("id")
        if has_id and not self._valid_id(id_):
            return _rpc_error(None, -32600, "Invalid Request: id must be a string or an "
                              "integer")
        if message.get("jsonrpc") != "2.0" or not isinstance(message["method"], str):
            return _rpc_error(id_ if has_id else None, -32600,
                              "Invalid Request: needs jsonrpc \"2.0\" and a string method")
        params = message.get("params", {})
        if params is None:
            params = {}
        if not isinstance(params, dict):
            if not has_id:
                return None
            return _rpc_error(id_, -32602, "Invalid params: params must be an object")
        if not has_id:
            return None             # notifications (initialized, cancelled, ...)
        method = message["method"]
        try:
            if method == "initialize":
                return _rpc_result(id_, self.initialize(params))
            if method == "ping":
                return _rpc_result(id_, {})
            if method == "tools/list":
                return _rpc_result(id_, {"tools": [self.describe(t) for t in
                                                   TOOLS.values()]})
            if method == "tools/call":
                return self.call(id_, params)
        except Exception as error:   # a bug must cost one answer, not the server
            import traceback
            self.log("internal error on %s: %s\n%s" % (method, error,
                                                        traceback.format_exc()))
            return _rpc_error(id_, -32603, "Internal error: %s" % error)
        return _rpc_error(id_, -32601, "Method not found: %s" % method)

    @staticmethod
    def _valid_id(id_):
        return isinstance(id_, str) or (isinstance(id_, int) and not isinstance(id_, bool))

    def _id_or_null(self, message):
        id_ = message.get("id")
        return id_ if self._valid_id(id_) else None

    def initialize(self, params):
        asked = params.get("protocolVersion")
        self.protocol = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
        return {"protocolVersion": self.protocol,
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": "agents-room", "title": "agents-room",
                               "version": __version__},
                "instructions": INSTRUCTIONS}

    @staticmethod
    def describe(tool_):
        return {"name": tool_.name, "title": tool_.title,
                "description": tool_.description, "inputSchema": tool_.input_schema(),
                "outputSchema": tool_.output, "annotations": tool_.annotations}

    def call(self, id_, params):
        name = params.get("name")
        if not isinstance(name, str) or name not in TOOLS:
            return _rpc_error(id_, -32602, "Invalid params: unknown tool %r" % (name,),
                              {"tools": sorted(TOOLS)})
        arguments = params.get("arguments")
        if arguments is None:
            arguments = {}
        self.wrote = True
        try:
            result = call_tool(self.store, self.ctx, name, arguments)
        except RoomError as error:
            return _rpc_result(id_, {"content": [{"type": "text", "text": error.text()}],
                                     "isError": True})
        after_tool_event(self.store)
        return _rpc_result(id_, {
            "content": [{"type": "text", "text": json.dumps(result, ensure_ascii=False)}],
            "structuredContent": result, "isError": False})


class LineReader:
    """Reads newline-terminated lines from a file descriptor, at most
    LINE_MAX_BYTES each, and wakes on a signal.

    A blocking readline cannot be interrupted reliably: a SIGTERM that lands
    between Python's signal check and the read() call is only noticed when the
    next line arrives, which may be never.  So the reader selects on stdin and
    on the signal wakeup pipe together.  An overlong line is drained without
    being kept and reported as None, so memory stays bounded."""

    def __init__(self, fd, wake_fd):
        self.fd, self.wake_fd = fd, wake_fd
        self.buffer = bytearray()
        self.start = 0
        self.draining = False
        self.stopped = False
        self.eof = False

    def readline(self, idle=None, idle_s=1.0):
        """The next line (bytes), None for an overlong one, b"" at EOF or stop.
        idle() is called once whenever input pauses for idle_s."""
        import select
        idled = False
        while True:
            newline = self.buffer.find(b"\n", self.start)
            if newline >= 0:
                line = bytes(self.buffer[:newline + 1])
                del self.buffer[:newline + 1]
                self.start = 0
                if self.draining or len(line) > LINE_MAX_BYTES + 1:
                    self.draining = False
                    return None
                return line
            if self.eof or self.stopped:
                line, self.buffer = bytes(self.buffer), bytearray()
                return None if self.draining else line
            if len(self.buffer) > LINE_MAX_BYTES:
                self.draining = True
                self.buffer = bytearray()
            self.start = len(self.buffer)
            wait = None if idle is None or idled else idle_s
            ready, _, _ = select.select([self.fd, self.wake_fd], [], [], wait)
            if not ready:
                idled = True
                idle()
                continue
            if self.wake_fd in ready:
                os.read(self.wake_fd, 512)
                if self.stopped:
                    continue
            if self.fd in ready:
                chunk = os.read(self.fd, 1 << 16)
                if chunk:
                    self.buffer += chunk
                else:
                    self.eof = True


def serve(store_path=None):
    """Run the MCP server on stdin/stdout until EOF or SIGTERM (exit 0 both)."""
    import signal
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    os.set_blocking(wake_read, False)
    reader = LineReader(sys.stdin.fileno(), wake_read)

    def stop(signum, frame):
        reader.stopped = True
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    store = Store(store_path)
    # A WAL checkpoint fsyncs; left to SQLite it lands on whichever call crosses
    # 1,000 pages (the p99 of msg_send, measured: 4.7 ms with, 0.5 ms without).
    # The server checkpoints when its input pauses instead, with a larger
    # automatic threshold kept as the backstop for a server that is never idle.
    store.conn.execute("PRAGMA wal_autocheckpoint=10000")
    pid = os.getpid()
    ctx = Context(via="mcp", pid=pid, pid_start=process_start(pid))
    server = McpServer(store, ctx)
    stdout = sys.stdout.buffer

    def idle():
        if server.wrote:
            server.wrote = False
            try:
                store.conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except sqlite3.Error:
                pass          # busy or locked: the next pause, or SQLite, does it
    try:
        while not reader.stopped:
            line = reader.readline(idle)
            if line == b"" or reader.stopped:
                break
            if line is None:
                answer = _rpc_error(None, -32700, "Parse error: line longer than %d bytes"
                                    % LINE_MAX_BYTES)
            else:
                answer = server.handle_line(line)
            if answer is not None:
                stdout.write(json.dumps(answer, ensure_ascii=False).encode(
                    "utf-8", "backslashreplace") + b"\n")
                stdout.flush()
    except BrokenPipeError:
        pass
    finally:
        store.close()
    return 0


# ---- benchmark ------------------------------------------------------------
# `bench` measures the hot paths against the machine's own limits in the same
# run (the bare interpreter, a raw SQLite commit), on a temporary store beside
# the configured one so the user's own filesystem is what gets measured.

BENCH_WORKER = """
import os, sys, time
sys.path.insert(0, %r)
import agents_room as ar
store = ar.Store()
ctx = ar.Context(cwd=os.getcwd())
role, index, until = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
sid = ar.room_join(store, ctx, room="bench-load", harness_key="%%s-%%d" %% (role, index),
                   tags=["inbox"] if role == "recv" else [])["session_id"]
done = errors = 0
print("ready", flush=True)
first = time.time()
while time.time() < until:
    try:
        if role == "send":
            ar.msg_send(store, ctx, sid, "tag:inbox", subject="load")
            done += 1
        else:
            got = ar.msg_recv(store, ctx, sid, limit=500)["messages"]
            done += len(got)
            if not got:
                time.sleep(0.002)
    except ar.RoomError as error:
        errors += 1
        sys.stderr.write(error.message + "\\n")
if role == "recv":
    sys.stdin.readline()          # the parent says: every sender has finished
    drain = time.time() + 30
    while time.time() < drain:
        got = ar.msg_recv(store, ctx, sid, limit=1000)["messages"]
        done += len(got)
        if not got and ar.msg_unread(store, ctx, sid)["count"] == 0:
            break
print(done, errors, first, time.time())
"""


def _percentile(values, fraction):
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def _timed_runs(argv, runs, env, stdin=b""):
    import subprocess
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, input=stdin, env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - started)
    return times


class _Bench:
    def __init__(self, quick, progress):
        self.quick = quick
        self.progress = progress
        self.figures = []

    def add(self, name, values=None, unit="ms", p50=None, p99=None, limit=None,
            goal=None, goal_value=None, note=""):
        """One row: values in seconds (converted to unit), or p50/p99 given."""
        scale = {"ms": 1000.0, "s": 1.0}.get(unit, 1.0)
        if values is not None:
            p50, p99 = _percentile(values, 0.5) * scale, _percentile(values, 0.99) * scale
        row = {"name": name, "unit": unit, "p50": round(p50, 3),
               "p99": None if p99 is None else round(p99, 3), "note": note}
        if limit is not None:
            row["limit"] = round(limit, 3)
            row["ratio"] = round(p50 / limit, 3) if limit else None
        if goal is not None:
            row["goal"] = goal
            row["met"] = bool(goal_value)
        self.figures.append(row)
        self.progress(row)
        return row


def bench(quick=False, progress=None):
    """Measure hooks, CLI, MCP round trips, contention, scale, the liveness scan
    and the server's memory -> {"figures": [...], "machine": {...}}."""
    import shutil
    import subprocess
    import tempfile
    progress = progress or (lambda row: None)
    base = os.path.dirname(default_db_path())
    os.makedirs(base, mode=0o700, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="bench-", dir=base)
    path = os.path.join(workdir, "room.db")
    env = {k: v for k, v in os.environ.items()
           if k not in HARNESS_KEY_VARS and not k.startswith(("CODEX_", "HERMES_"))}
    env["AGENTS_ROOM_DB"] = path
    saved = os.environ.get("AGENTS_ROOM_DB")
    os.environ["AGENTS_ROOM_DB"] = path
    b = _Bench(quick, progress)
    try:
        precompile()
        store = Store(path)
        ctx = Context(cwd=workdir)
        _bench_processes(b, store, ctx, env, workdir)
        _bench_mcp(b, store, ctx, env, workdir)
        _bench_raw(b, store)
        _bench_contention(b, env, workdir)
        _bench_scale(b, store, ctx)
        _bench_liveness(b, store, ctx)
        _bench_memory(b, env, workdir)
        store.close()
    finally:
        if saved is None:
            os.environ.pop("AGENTS_ROOM_DB", None)
        else:
            os.environ["AGENTS_ROOM_DB"] = saved
        shutil.rmtree(workdir, ignore_errors=True)
    return {"figures": b.figures, "quick": quick, "machine": {
        "python": sys.version.split()[0], "sqlite": sqlite3.sqlite_version,
        "platform": sys.platform, "cpus": os.cpu_count(), "store_dir": base}}


def _paired(argv, runs, env, stdin=b""):
    """argv and the bare interpreter run in turn, so drift hits both alike:
    (bare times, argv times)."""
    bare, times = [], []
    for _ in range(runs):
        bare += _timed_runs([sys.executable, "-c", "pass"], 1, env)
        times += _timed_runs(argv, 1, env, stdin)
    return bare, times


def _bench_processes(b, store, ctx, env, workdir):
    runs = 15 if b.quick else 40
    key = "bench-hook-key"
    sid = room_join(store, ctx, room="bench", harness_key=key)["session_id"]
    other = room_join(store, ctx, room="bench", label="peer")["session_id"]
    payload = json.dumps({"session_id": key, "cwd": workdir}).encode()
    hook = fast_launcher() + ["hook", "--event=PostToolUse"]

    def row(name, argv, goal=None, ratio=None, stdin=b"", note=""):
        bare, times = _paired(argv, runs, env, stdin)
        limit = _percentile(bare, 0.5) * 1000
        added = b.add(name, times, limit=limit, goal=goal, note=note)
        if ratio is not None:
            added["met"] = added["ratio"] <= ratio
    bare = _timed_runs([sys.executable, "-c", "pass"], runs, env)
    b.add("bare interpreter (python -c pass)", bare,
          note="each row below is paired with its own interleaved bare runs")
    row("hook PostToolUse, nothing waiting", hook, "<= 1.5x bare", 1.5, payload)
    for _ in range(3):
        msg_send(store, ctx, other, sid, subject="waiting")
    row("hook PostToolUse, 3 messages waiting", hook, "<= 1.6x bare", 1.6, payload)
    row("CLI unread (python3 agents_room.py unread)",
        [sys.executable, this_file(), "unread", "--session", sid], "<= 1.6x bare", 1.6,
        note="run as a script, Python compiles the whole file every time")
    row("CLI unread through the bytecode cache",
        fast_launcher() + ["unread", "--session", sid], "<= 1.6x bare", 1.6,
        note="the launcher setup writes into hooks")


def _bench_mcp(b, store, ctx, env, workdir):
    import subprocess
    calls = 300 if b.quick else 2000
    proc = subprocess.Popen([sys.executable, this_file(), "serve"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                            cwd=workdir)

    def rpc(method, params, id_=1):
        proc.stdin.write((json.dumps({"jsonrpc": "2.0", "id": id_, "method": method,
                                      "params": params}) + "\n").encode())
        proc.stdin.flush()
        return json.loads(proc.stdout.readline())

    try:
        rpc("initialize", {"protocolVersion": PROTOCOL_VERSIONS[0]})
        me = rpc("tools/call", {"name": "room_join", "arguments": {
            "room": "mcp", "harness_key": "bench-mcp"}})["result"]["structuredContent"]
        sid = me["session_id"]
        peers = [room_join(store, ctx, room="mcp", label="p%d" % i)["session_id"]
                 for i in range(20)]
        cases = [
            ("msg_send to 1", {"name": "msg_send", "arguments": {
                "session_id": sid, "to": peers[0], "subject": "s"}}, "p50 <= 0.5 ms, p99 <= 3 ms"),
            ("msg_send to 20", {"name": "msg_send", "arguments": {
                "session_id": sid, "to": "*", "subject": "s"}}, None),
            ("msg_recv", {"name": "msg_recv", "arguments": {"session_id": peers[1],
                                                             "limit": 5}}, None),
            ("lease_claim", {"name": "lease_claim", "arguments": {
                "session_id": sid, "path": "bench.txt"}}, None),
            ("room_who", {"name": "room_who", "arguments": {"session_id": sid}}, None),
        ]
        for name, params, goal in cases:
            times = []
            count = calls if name != "room_who" else max(50, calls // 10)
            for i in range(count):
                started = time.perf_counter()
                answer = rpc("tools/call", params, i)
                times.append(time.perf_counter() - started)
                if answer.get("result", {}).get("isError"):
                    raise RoomError("bench: %s failed: %s" % (name, answer))
            row = b.add("MCP %s (%d calls)" % (name, count), times, goal=goal)
            if goal:
                row["met"] = row["p50"] <= 0.5 and row["p99"] <= 3
    finally:
        proc.stdin.close()
        proc.wait(10)


def _bench_raw(b, store):
    times = []
    conn = store.conn
    for i in range(300 if b.quick else 2000):
        started = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('bench', ?)", (i,))
        conn.execute("COMMIT")
        times.append(time.perf_counter() - started)
    b.add("raw SQLite BEGIN IMMEDIATE / insert / COMMIT", times,
          note="the floor under every write")


def _bench_contention(b, env, workdir):
    import subprocess
    seconds = 3 if b.quick else 10
    until = time.time() + seconds + 2
    code = BENCH_WORKER % os.path.dirname(this_file())
    procs = []
    for role, count in (("recv", 4), ("send", 8)):
        # Receivers first, and joined, so every send reaches all four.
        started = [subprocess.Popen(
            [sys.executable, "-c", code, role, str(index), repr(until)], env=env,
            cwd=workdir, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True) for index in range(count)]
        for proc in started:
            proc.stdout.readline()
        procs += [(role, proc) for proc in started]
    sent = received = errors = 0
    locked = 0
    outputs = {}
    window = [None, None]
    for role, proc in sorted(procs, key=lambda item: item[0] != "send"):
        if role == "recv" and not outputs.get("senders_done"):
            outputs["senders_done"] = True
            for other_role, other in procs:
                if other_role == "recv":
                    other.stdin.write("drain\n")
                    other.stdin.flush()
        out, err = proc.communicate(timeout=seconds + 60)
        done, failed, first, last = out.split()[-4:]
        done, failed = int(done), int(failed)
        errors += failed
        locked += err.count("locked")
        if role == "send":
            sent += done
            window[0] = min(window[0] or float(first), float(first))
            window[1] = max(window[1] or float(last), float(last))
        else:
            received += done
    lost = sent * 4 - received
    rate = received / max(window[1] - window[0], 0.001)
    b.add("throughput: 8 senders, 4 receivers, %d s" % seconds, unit="msg/s", p50=rate,
          goal=">= 2000 delivered/s, 0 lost, 0 lock errors",
          goal_value=rate >= 2000 and lost == 0 and locked == 0 and errors == 0,
          note="%d sent x 4 recipients, %d received, %d lost, %d lock errors"
               % (sent, received, lost, locked))


def _fill(store, count, sessions, mine, room):
    """count filler messages in room, from and to the filler sessions; the
    first 500 of the store also to `mine`, so the measured session's own history
    is the same at every store size and only the store grows."""
    at = now()
    conn = store.conn
    conn.execute("BEGIN IMMEDIATE")
    start = conn.execute("SELECT COALESCE(MAX(id), 0) FROM messages").fetchone()[0] + 1
    first = conn.execute("SELECT MIN(id) FROM messages WHERE sender_label = 'filler'"
                         ).fetchone()[0] or start
    batch = 50000
    for chunk in range(start, start + count, batch):
        ids = range(chunk, min(chunk + batch, start + count))
        conn.executemany(
            "INSERT INTO messages (id, sender, sender_label, selector, subject, body, "
            "created_at, expires_at) VALUES (?,?,?,?,?,?,?,?)",
            [(i, sessions[i % len(sessions)], "filler", '"*"',
              "filler %d" % i, "body", at, at + 86400 * 30) for i in ids])
        conn.executemany("INSERT INTO message_rooms (room, message_id) VALUES (?, ?)",
                         [(room, i) for i in ids])
        conn.executemany(
            "INSERT INTO deliveries (session_id, message_id, state, updated_at) "
            "VALUES (?,?,?,?)",
            [(mine if i < first + 500 else sessions[(i + 1) % len(sessions)], i, "read", at)
             for i in ids])
    conn.execute("COMMIT")


def _bench_scale(b, store, ctx):
    """The same calls on a store of 1,000 messages and on one of 1,000,000 (or
    100,000 with --quick), alternated call by call so machine noise hits both:
    indexes make the large store cost what the small one does."""
    sizes = (1000, 100000) if b.quick else (1000, 1000000)
    # The measured session calls as a harness would: its key in the environment.
    ctx = Context(cwd=ctx.cwd, env=dict(ctx.env, AGENTS_ROOM_HARNESS_KEY="scale-me"))
    stores = [Store(os.path.join(os.path.dirname(store.path), "scale-%d.db" % size))
              for size in sizes]
    try:
        calls = []
        for each, size in zip(stores, sizes):
            sessions = [room_join(each, ctx, room="scale", harness_key="filler-%d" % i)
                        ["session_id"] for i in range(50)]
            mine = room_join(each, ctx, room="scale", harness_key="scale-me")["session_id"]
            lease_claim(each, ctx, mine, "scale.txt")
            for _ in range(25):        # msg_sent shows 20: the same page at every size
                msg_send(each, ctx, mine, "*", subject="mine")
            _fill(each, size, sessions, mine, "repo:scale")
            calls.append([
                ("msg_recv", lambda s=each, m=mine: msg_recv(s, ctx, m)),
                ("msg_unread", lambda s=each, m=mine: msg_unread(s, ctx, m)),
                ("room_history", lambda s=each, m=mine: room_history(s, ctx, m)),
                ("lease_check", lambda s=each, m=mine: lease_check(s, ctx, m, "scale.txt")),
                ("msg_sent", lambda s=each, m=mine: msg_sent(s, ctx, m))])
        for index, (name, _) in enumerate(calls[0]):
            times = ([], [])
            for _ in range(40):
                for side in (0, 1):
                    started = time.perf_counter()
                    calls[side][index][1]()
                    times[side].append(time.perf_counter() - started)
            small, large = (_percentile(t, 0.5) * 1000 for t in times)
            b.add("scale %s: %s messages" % (name, "{:,}".format(sizes[1])), p50=large,
                  limit=small, goal="<= 1.5x the 1,000-message figure",
                  goal_value=large <= 1.5 * small,
                  note="limit = the same call on a 1,000-message store, alternated")
    finally:
        for each in stores:
            each.close()


def _bench_liveness(b, store, ctx):
    import subprocess
    count = 100 if b.quick else 500
    sleepers = [subprocess.Popen(["sleep", "60"], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL) for _ in range(count)]
    try:
        sid = room_join(store, ctx, room="live", harness_key="live-me")["session_id"]
        times = []
        for _ in range(20):
            started = time.perf_counter()
            room_who(store, ctx, sid)
            times.append(time.perf_counter() - started)
        row = b.add("room_who with %d extra processes" % count, times, goal="<= 20 ms")
        row["met"] = row["p50"] <= 20
    finally:
        for proc in sleepers:
            proc.kill()
        for proc in sleepers:
            proc.wait()


def _rss_kb(pid):
    try:
        with open("/proc/%d/status" % pid) as handle:
            for line in handle:
                if line.startswith("VmRSS"):
                    return int(line.split()[1])
    except OSError:
        import subprocess
        out = subprocess.run(["ps", "-o", "rss=", "-p", str(pid)], capture_output=True,
                             text=True).stdout.strip()
        return int(out) if out else 0
    return 0


def _bench_memory(b, env, workdir):
    import subprocess
    calls = 10000 if b.quick else 100000
    proc = subprocess.Popen([sys.executable, this_file(), "serve"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                            cwd=workdir)
    try:
        proc.stdin.write(b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}\n')
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                     "params": {"name": "room_join", "arguments": {
                                         "room": "mem", "harness_key": "mem"}}}).encode()
                         + b"\n")
        proc.stdin.flush()
        proc.stdout.readline()
        sid = json.loads(proc.stdout.readline())["result"]["structuredContent"]["session_id"]
        line = (json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "msg_unread", "arguments": {"session_id": sid}}}) + "\n").encode()
        early = None
        for i in range(calls):
            proc.stdin.write(line)
            proc.stdin.flush()
            proc.stdout.readline()
            if i == calls // 10:
                early = _rss_kb(proc.pid)
        late = _rss_kb(proc.pid)
    finally:
        proc.stdin.close()
        proc.wait(10)
    growth = (late - early) / 1024.0
    b.add("serve RSS after %d calls" % calls, unit="MiB", p50=late / 1024.0,
          limit=early / 1024.0, goal="flat (< 2 MiB growth after the first 10%)",
          goal_value=growth < 2, note="RSS at 10%% of the calls: %.1f MiB" % (early / 1024.0))


def render_bench(result):
    rows = [("figure", "p50", "p99", "vs limit", "goal", "met")]
    for f in result["figures"]:
        unit = f["unit"]
        rows.append((f["name"], "%.3f %s" % (f["p50"], unit),
                     "" if f["p99"] is None else "%.3f %s" % (f["p99"], unit),
                     "" if "ratio" not in f or f["ratio"] is None else "%.2fx" % f["ratio"],
                     f.get("goal", ""), "" if "met" not in f else ("yes" if f["met"]
                                                                     else "NO")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    machine = result["machine"]
    lines.append("Python %s, SQLite %s, %s, %s CPUs, store directory %s%s" % (
        machine["python"], machine["sqlite"], machine["platform"], machine["cpus"],
        machine["store_dir"], " (quick)" if result["quick"] else ""))
    for f in result["figures"]:
        if f.get("note"):
            lines.append("  %s: %s" % (f["name"], f["note"]))
    return "\n".join(lines)


# ---- CLI ------------------------------------------------------------------


def _short(session_id):
    return (session_id or "")[:16]


def _who_name(item):
    return "%s (%s)" % (one_line(item.get("label") or "-", 30), _short(item["session_id"]))


def _render_messages(messages, empty):
    if not messages:
        return empty
    lines = []
    for m in messages:
        head = "#%d  %s  from %s" % (m["message_id"], m["created_at"], _who_name(
            {"label": m["sender_label"], "session_id": m["sender"]}))
        if m.get("reply_to"):
            head += "  (reply to #%d)" % m["reply_to"]
        lines.append(head)
        if m.get("subject"):
            lines.append("    subject: " + one_line(m["subject"], 200))
        for line in clean(m.get("body") or "").splitlines():
            lines.append("    " + line)
    return "\n".join(lines)


def _render_session_table(sessions):
    if not sessions:
        return "nobody here"
    rows = [("SESSION", "LABEL", "HARNESS", "LIVENESS", "AUTONOMY", "LAST SEEN", "ROOMS")]
    for s in sessions:
        level = "%d" % s["autonomy"] + (
            " (asked %d)" % s["autonomy_requested"]
            if s.get("autonomy_requested", s["autonomy"]) != s["autonomy"] else "")
        if s.get("lever"):
            level += " " + s["lever"]
        rows.append((s["session_id"] + ("*" if s.get("you") else ""),
                     one_line(s["label"] or "-", 24), s["harness"], s["liveness"], level,
                     (s["last_seen"] or "")[:19], ",".join(s["rooms"]) or "(left)"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1]
                     for r in rows)


def _render_lease(lease):
    return "%s  %s  %s  until %s  (%s)%s" % (
        lease["path"], lease["mode"], _who_name(lease), lease["expires_at"],
        lease["liveness"], "  for: " + one_line(lease["purpose"], 60)
        if lease.get("purpose") else "")


def _render_sent(result):
    if not result["messages"]:
        return "nothing sent yet"
    lines = []
    for m in result["messages"]:
        lines.append("#%d  %s  %s  - %d sent, %d pending, %d left" % (
            m["message_id"], m["created_at"], one_line(m["subject"] or "(no subject)", 60),
            m["sent"], m["pending"], m["left"]))
        for d in m["deliveries"]:
            lines.append("    %-13s %s%s" % (d["state"], _who_name(d),
                                            " (left)" if d.get("left") else ""))
    return "\n".join(lines)


def _render_recv(result):
    if result["messages"]:
        return _render_messages(result["messages"], "")
    inbox = result["inbox"]
    return ("no unread messages (rooms: %s; deliveries ever %d, read %d, newest %s)" % (
        ", ".join(inbox["rooms"]) or "none", inbox["deliveries_total"],
        inbox["read_total"], inbox["last_created_at"] or "never"))


def _render_window(w):
    text = "quiet window #%d %s by %s: %s on %s until %s" % (
        w["window_id"], w["state"], w["label"] or w["session_id"],
        one_line(w["purpose"], 80), ", ".join(w["resources"]), w["expires_at"])
    if w["state"] == "pending" and w["missing_acks"]:
        text += "\n    waiting for acks from %s (by %s)" % (", ".join(w["missing_acks"]),
                                                         w["ack_deadline"])
    if w.get("reason") and not w.get("ok", True):
        text = "not activated: %s\n%s" % (clean(w["reason"]), text)
    return text


def _render_status(r):
    lines = ["status at %s (%s)" % (r["generated_at"], r["store"])]
    for room in r["rooms"]:
        lines.append("== %s (cap %s, %d sessions)" % (room["room"], room["cap"],
                                                       len(room["sessions"])))
        for m in room["recent"]:
            lines.append("   #%d %s: %s" % (m["message_id"], one_line(
                m["sender_label"] or "-", 20), one_line(m["subject"] or "(no subject)", 70)))
    lines.append("== sessions")
    for s in r["sessions"]:
        work = "; ".join("%s %s%s" % (w["scope"], w["state"], ": " + one_line(
            w["summary"], 40) if w["summary"] else "") for w in s["work"])
        lines.append("   %s  %-8s autonomy %d  unread %d  %s" % (
            _who_name(s), s["liveness"], s["autonomy"], s["unread"], work))
    lines.append("== leases")
    lines += ["   " + _render_lease(l) + (" for: " + one_line(l["purpose"], 60)
                                         if l.get("purpose") else "") for l in r["leases"]]
    lines.append("== quiet windows")
    lines += ["   " + _render_window(w).replace("\n", "\n   ") for w in r["windows"]]
    return "\n".join(lines)


RENDER = {
    "room_join": lambda r: "session %s in %s, autonomy %s\nexport AGENTS_ROOM_SESSION=%s"
    % (r["session_id"], ", ".join(r["rooms"]), autonomy_name(r["autonomy"]),
       r["session_id"]),
    "room_leave": lambda r: "left %s" % (", ".join(r["left_rooms"]) or "no rooms"),
    "room_leave_room": lambda r: "left %s; still in %s" % (r["room"],
                                                          ", ".join(r["rooms"]) or "none"),
    "room_who": lambda r: _render_session_table(r["sessions"]),
    "room_set_autonomy_cap": lambda r: "autonomy cap of %s is %s%s" % (
        r["room"], autonomy_name(r["autonomy"]),
        "; lowered %s" % ", ".join(r["lowered"]) if r["lowered"] else ""),
    "msg_send": lambda r: "message #%d -> %d recipient%s" % (
        r["message_id"], r["recipients"], "" if r["recipients"] == 1 else "s"),
    "msg_recv": _render_recv,
    "msg_ack": lambda r: "acked #%d" % r["message_id"],
    "msg_unread": lambda r: "%d" % r["count"],
    "msg_sent": _render_sent,
    "room_history": lambda r: "%s\n%s" % (r["room"], _render_messages(
        r["messages"], "(no messages yet)")),
    "lease_claim": lambda r: ("%s %s lease on %s until %s" % (
        r["reason"], r["lease"]["mode"], r["lease"]["path"], r["lease"]["expires_at"])
        if r["ok"] else "refused: " + clean(r["reason"])),
    "lease_renew": lambda r: "renewed %s until %s" % (r["path"], r["expires_at"]),
    "lease_release": lambda r: "released %s" % r["path"],
    "lease_check": lambda r: ("free: %s" % r["path"] if r["free"] else "taken: "
                              + _render_lease(r["lease"])) + (
        "\n  held by you too" if r["free"] and r["lease"] else ""),
    "lease_list": lambda r: "\n".join(_render_lease(x) for x in r["leases"]) or "no leases",
    "note_read": lambda r: "%s  %s" % (r["hash"], r["path"]),
    "drift_check": lambda r: "%s  %s" % (r["severity"], clean(r["message"])),
    "work_set": lambda r: "%s %s%s" % (r["scope"], r["state"], (
        "; message #%d -> %d recipients" % (r["message_id"], r["recipients"]))
        if r["message_id"] else ""),
    "window_request": _render_window, "window_ack": _render_window,
    "window_activate": _render_window, "window_release": _render_window,
    "window_cancel": _render_window,
    "window_status": lambda r: "\n".join(_render_window(w) for w in r["windows"])
    or "no open quiet windows",
    "room_status": _render_status,
}


def _cli_flag(tool_, name):
    return tool_.flags.get(name, "--" + name.replace("_", "-"))


def build_parser(only=None):
    """The argparse parser: one subcommand per tool (derived from the tool's
    schema), plus serve, hook, prune, setup, doctor, bench.  With only=<command>
    just that tool's subcommand is built: a CLI call pays for one parser, not
    for twenty-five."""
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            raise UsageError("%s: %s" % (self.prog, message),
                             "%s --help shows the usage" % self.prog)

    parser = Parser(prog="agents_room.py", description=__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter,
                    epilog="Run '<command> --help' for each command's options and an "
                           "example.  Store: $AGENTS_ROOM_DB or ~/.agents-room/room.db.")
    parser.add_argument("--version", action="version", version="agents-room " + __version__)
    commands = parser.add_subparsers(dest="command", metavar="<command>", parser_class=Parser)
    commands.required = True
    for tool_ in TOOLS.values():
        if only is not None and tool_.cli != only:
            continue
        doc = " ".join((tool_.fn.__doc__ or "").split())
        sub = commands.add_parser(
            tool_.cli, help=doc.split(". ")[0].rstrip(".") + ".", description=doc,
            epilog="example:\n  python3 agents_room.py " + tool_.example,
            formatter_class=argparse.RawDescriptionHelpFormatter)
        sub.set_defaults(tool=tool_.name)
        for name, schema in tool_.params.items():
            kinds = schema.get("type")
            kinds = kinds if isinstance(kinds, list) else [kinds]
            help_text = schema.get("description")
            convert = str
            if name.endswith("_s"):
                convert = parse_duration
            elif kinds == ["integer"]:
                convert = int
            if name == "session_id":
                sub.add_argument("--session", dest="session_id", metavar="ID",
                                 help="your session id (default $AGENTS_ROOM_SESSION)")
            elif name in tool_.positional:
                sub.add_argument(name, type=convert, help=help_text,
                                 nargs="+" if "array" in kinds else None,
                                 metavar="RESOURCE" if "array" in kinds else None)
            elif kinds == ["boolean"]:
                sub.add_argument(_cli_flag(tool_, name), dest=name, action="store_true",
                                 default=None, help=help_text)
            elif "array" in kinds:
                sub.add_argument(_cli_flag(tool_, name), dest=name, action="append",
                                 metavar=name.upper().rstrip("S") if name != "to" else
                                 "SELECTOR", help=(help_text or "") + " (repeatable)")
            else:
                sub.add_argument(_cli_flag(tool_, name), dest=name, type=convert,
                                 metavar=name.upper(), help=help_text)
        if tool_.name == "room_join":
            sub.add_argument("--pid", type=int, help="the process whose life is the "
                             "session's (default none: a CLI join ends at once)")
        if tool_.name == "lease_guard":
            sub._actions[[a.dest for a in sub._actions].index("resources")].nargs = "*"
            sub.add_argument("--staged", action="store_true",
                             help="check the files staged in this git repository "
                                  "against exclusive leases of other live sessions")
            sub.epilog += ("\n\nexit status: 0 safe, 3 a conflict (or, with "
                           "--require-held, a resource you do not hold), 1 an error.\n"
                           "AGENTS_ROOM_GUARD=warn reports conflicts but exits 0; "
                           "AGENTS_ROOM_GUARD=off skips the check.")
        sub.add_argument("--json", action="store_true", help="print the result as JSON")
    sub = commands.add_parser("serve", help="Run the MCP server on stdin/stdout.",
                              description=serve.__doc__)
    sub.set_defaults(special="serve")
    sub = commands.add_parser("hook", help="Answer a harness hook event (JSON on stdin).",
                              description=run_hook.__doc__, add_help=False)
    sub.set_defaults(special="hook")
    def special(name, summary, doc, example, json_help=None):
        """A command that is not a tool: its help, example and --json."""
        sub = commands.add_parser(name, help=summary, description=doc,
                                  formatter_class=argparse.RawDescriptionHelpFormatter,
                                  epilog="example:\n  python3 agents_room.py " + example)
        sub.add_argument("--json", action="store_true", help=json_help)
        sub.set_defaults(special=name)
        return sub

    sub = special("prune", "Remove sessions that are quiet and gone.", prune.__doc__,
                  "prune --older-than 24h --dry-run")
    sub.add_argument("--older-than", default="24h", type=parse_duration,
                     help="quiet for longer than this (default 24h)")
    sub.add_argument("--dry-run", action="store_true", help="only show what would go")
    sub = special("setup", "Configure a harness: MCP entry and hooks.", setup.__doc__,
                  "setup claude --autonomy hold --write")
    sub.add_argument("harness", choices=["claude", "codex", "hermes"])
    sub.add_argument("--autonomy", default="0", help="0/notify, 1/hold or 2/wake")
    sub.add_argument("--scope", choices=["project", "user"], default="project",
                     help="Claude Code: this project (.claude/, .mcp.json) or the user")
    sub.add_argument("--write", action="store_true",
                     help="merge into the files (default: print what would be written)")
    special("doctor", "Check the store, harness, key, wake lever and configuration.",
            doctor.__doc__, "doctor")
    sub = special("watch", "Follow the room's events live, like tail -f.",
                  follow_events.__doc__, "watch --room shared:storefront --since 10m",
                  json_help="one JSON object per line")
    sub.add_argument("--room", help="only events of this room's sessions")
    sub.add_argument("--since", help="replay from a time: ISO-8601, or a duration ago "
                                     "(10m, 2h)")
    special("version", "Version, Python, SQLite, this file's path and SHA-256, store.",
            version_info.__doc__, "version --json")
    special("install-guard", "Install a git pre-commit hook that runs guard --staged.",
            install_guard.__doc__, "install-guard")
    sub = special("bench", "Measure hooks, MCP round trips, contention, scale, memory.",
                  bench.__doc__, "bench --quick")
    sub.add_argument("--quick", action="store_true", help="a reduced set, under 30 s")
    sub = commands.add_parser("wake-run", help=argparse.SUPPRESS)
    sub.add_argument("payload")
    sub.set_defaults(special="wake-run")
    return parser


def cli_args_to_tool(args):
    """argparse namespace -> the tool's argument dict (None means not given)."""
    tool_ = TOOLS[args.tool]
    values = {}
    for name in tool_.params:
        value = getattr(args, name, None)
        if value is None:
            continue
        if name == "to" and isinstance(value, list) and len(value) == 1:
            value = value[0]
        values[name] = value
    if "session_id" in tool_.params and not values.get("session_id"):
        env_session = os.environ.get("AGENTS_ROOM_SESSION")
        if env_session:
            values["session_id"] = env_session
        elif "session_id" in tool_.required:
            raise UsageError("%s needs --session (or AGENTS_ROOM_SESSION)" % tool_.cli,
                             "room_join / 'agents_room.py join' prints your session id")
    if values.get("body") == "-":
        values["body"] = sys.stdin.read()
    return tool_, values


def run_cli(args):
    """Run a parsed command -> (text for stdout, exit code)."""
    special = getattr(args, "special", None)
    if special == "prune":
        store = Store()
        try:
            result = prune(store, args.older_than, args.dry_run)
        finally:
            store.close()
        if args.json:
            return json.dumps(result, indent=2, ensure_ascii=False), 0
        lines = ["%s %s (label %s, %s, last seen %s)" % (
            "would remove" if args.dry_run else "removed", r["session_id"],
            r["label"] or "-", r["liveness"], r["last_seen"]) for r in result["removed"]]
        lines += ["kept %s (label %s): %s, not gone" % (r["session_id"], r["label"] or "-",
                                                        r["liveness"])
                  for r in result["kept"]]
        if not args.dry_run:
            lines.append("removed %d audit events and %d messages past retention" % (
                result["events_removed"], result["messages_removed"]))
        return "\n".join(lines) or "nothing to prune", 0
    if special == "setup":
        result = setup(args.harness, args.autonomy, args.write, args.scope)
        if args.json:
            return json.dumps(result, indent=2), 0
        lines = []
        for item in result["files"]:
            lines.append("== %s (%s)" % (item["path"], item["action"]))
            if not args.write or item["action"].startswith("merge by hand"):
                lines.append(item["content"].rstrip("\n"))
        lines += ["note: " + note for note in result["notes"]]
        return "\n".join(lines), 0
    if special == "doctor":
        checks = doctor()
        if args.json:
            return json.dumps([{"status": s, "check": c, "advice": a}
                               for s, c, a in checks], indent=2), 0
        lines = ["%-4s %s%s" % (s, c, ("\n     -> " + a) if a and s != "ok" else "")
                 for s, c, a in checks]
        return "\n".join(lines), 1 if any(s == "fail" for s, _, _ in checks) else 0
    if special == "watch":
        return "", run_watch(args)
    if special == "version":
        info = version_info()
        if args.json:
            return json.dumps(info, indent=2), 0
        return ("agents-room %(version)s (Python %(python)s, SQLite %(sqlite)s)\n"
                "file %(file)s\nsha256 %(sha256)s\nstore %(store)s (schema %(store_schema_"
                "version)s; this copy writes %(schema_version)s)" % info), 0
    if special == "install-guard":
        result = install_guard()
        return (json.dumps(result) if args.json else
                "pre-commit hook %s: %s" % (result["action"], result["hook"])), 0
    if special == "bench":
        def progress(row):
            sys.stderr.write("bench: %s: %.3f %s\n" % (row["name"], row["p50"], row["unit"]))
        result = bench(args.quick, progress)
        return (json.dumps(result, indent=2) if args.json else render_bench(result)), 0
    if special == "wake-run":
        return "", wake_run(args.payload)
    if getattr(args, "tool", None) == "lease_guard":
        return run_guard(args)
    tool_, values = cli_args_to_tool(args)
    pid = getattr(args, "pid", None)
    ctx = Context(via="cli", pid=pid, pid_start=process_start(pid) if pid else None)
    store = Store()
    try:
        result = call_tool(store, ctx, tool_.name, values)
        after_tool_event(store)
    finally:
        store.close()
    code = 1 if tool_.name in ("lease_claim", "window_activate") and not result["ok"] else 0
    if args.json:
        return json.dumps(result, indent=2, ensure_ascii=False), code
    text = RENDER[tool_.name](result)
    if result.get("warning"):
        text += "\nwarning: " + clean(result["warning"])
    return text, code


def parse_since(text):
    """--since: an ISO-8601 UTC time, or a duration ago (90s, 10m, 2h, 1d)."""
    text = text.strip()
    if text[:1].isdigit() and ("T" in text or "-" in text[1:]):
        import calendar
        for form in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M",
                     "%Y-%m-%d"):
            try:
                return calendar.timegm(time.strptime(text.rstrip("Z").split(".")[0], form))
            except ValueError:
                continue
        raise UsageError("not a time: %r" % text, "use ISO-8601 UTC or a duration (10m)")
    return now() - parse_duration(text)


def run_watch(args):
    """watch: print events as they come, until Ctrl-C or SIGTERM (exit 0)."""
    import signal

    def stop(signum, frame):
        raise KeyboardInterrupt
    # SIGTERM too, and SIGINT even where a shell started us with it ignored (a
    # background job): either way watch ends with exit 0.
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    since = parse_since(args.since) if args.since else None
    try:
        for item in follow_events(args.room, since):
            if args.json:
                line = json.dumps(item, ensure_ascii=False)
            else:
                detail = ", ".join("%s=%s" % (k, one_line(v if isinstance(v, str)
                                                          else json.dumps(v), 60))
                                   for k, v in sorted(item["data"].items())
                                   if v not in (None, [], {}))
                who = (_who_name(item) + " ") if item["session_id"] else ""
                line = "%s  %-16s %s%s%s" % (item["at"][11:23], item["kind"], who,
                                             clean(item["subject"] or item["room"] or ""),
                                             ("  " + detail) if detail else "")
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
    except (KeyboardInterrupt, BrokenPipeError):
        pass
    return 0


def staged_paths(cwd):
    """Absolute paths of the files staged in cwd's git repository, both sides
    of a rename, and whether core.ignorecase is on."""
    import subprocess

    def git(*argv):
        done = subprocess.run(["git"] + list(argv), cwd=cwd, capture_output=True)
        if done.returncode != 0:
            raise RoomError("git %s failed: %s" % (argv[0], done.stderr.decode(
                "utf-8", "replace").strip() or "not a git repository?"))
        return done.stdout.decode("utf-8", "surrogateescape")
    top = git("rev-parse", "--show-toplevel").strip()
    ignorecase = git("config", "--bool", "--default", "false", "core.ignorecase").strip()
    fields = git("diff", "--cached", "--name-status", "-M", "-z").split("\0")
    paths, index = [], 0
    while index < len(fields) and fields[index]:
        status = fields[index]
        count = 2 if status[:1] in ("R", "C") else 1
        paths += [os.path.join(top, p) for p in fields[index + 1:index + 1 + count]]
        index += 1 + count
    return paths, ignorecase == "true"


def run_guard(args):
    """guard: exit 0 safe, 3 conflict or not held, 1 error; AGENTS_ROOM_GUARD
    =warn turns refusals into warnings, =off skips the check."""
    setting = os.environ.get("AGENTS_ROOM_GUARD", "").strip().lower()
    if setting == "off":
        return "agents-room guard: off (AGENTS_ROOM_GUARD=off), nothing checked", 0
    values = {}
    resources = list(args.resources or [])
    mode = args.mode or "exclusive"
    ignorecase = False
    if args.staged:
        staged, ignorecase = staged_paths(os.getcwd())
        resources += staged
        mode = "shared"          # a commit collides with exclusive leases only
    if not resources:
        return "agents-room guard: nothing to check", 0
    session = args.session_id or os.environ.get("AGENTS_ROOM_SESSION")
    store = Store()
    try:
        if not session:
            key = harness_key_from(os.environ)
            row = store.conn.execute("SELECT id FROM sessions WHERE harness_key=?",
                                     (key,)).fetchone() if key else None
            session = row["id"] if row else None
        values = {"resources": resources, "mode": mode,
                  "require_held": bool(args.require_held), "ignorecase": ignorecase}
        if session:
            values["session_id"] = session
        result = call_tool(store, Context(via="cli"), "lease_guard", values)
    finally:
        store.close()
    lines = []
    for lease in result["conflicts"]:
        lines.append("%s is %s" % (lease["resource"], "in a quiet window: " + lease["purpose"]
                                   if lease["mode"] == "window" else
                                   "held by " + _holder_text(lease)))
    lines += ["%s is not covered by a lease of yours" % m for m in result["missing"]]
    lines += ["%s: stale lease of %s (gone), ignored" % (l["resource"], l["session_id"])
              for l in result["stale"]]
    safe = result["safe"]
    if args.json:
        return json.dumps(result, indent=2), 0 if safe or setting == "warn" else 3
    if safe:
        return "\n".join(lines + ["agents-room guard: ok (%d checked)" % len(resources)]), 0
    if setting == "warn":
        return "\n".join(["agents-room guard (warn only, AGENTS_ROOM_GUARD=warn):"] +
                         ["  " + l for l in lines]), 0
    raise GuardRefused("agents-room guard: refused\n" + "\n".join("  " + l for l in lines),
                       "release the leases, ask their holders, or set "
                       "AGENTS_ROOM_GUARD=warn (report only) or =off")


def main(argv=None):
    """The command line: returns the exit code (0 ok, 1 refused or failed, 2
    usage).  Errors go to stderr as 'error: ...' with a hint."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "hook":
        return hook_main(argv[1:])
    if argv and argv[0] == "serve" and len(argv) == 1:
        try:
            return serve()
        except RoomError as error:
            sys.stderr.write("error: %s\n" % clean(error.text()))
            return error.exit_code
    if len(argv) > 1 and argv[0] == "window" and not argv[1].startswith("-"):
        argv = ["window-" + argv[1]] + argv[2:]      # window request -> window-request
    try:
        sys.stdout.reconfigure(errors="backslashreplace")
    except (AttributeError, ValueError):
        pass
    want_json = "--json" in argv
    try:
        known = {t.cli for t in TOOLS.values()}
        command = next((a for a in argv if not a.startswith("-")), None)
        args = build_parser(command if command in known else None).parse_args(argv)
        text, code = run_cli(args)
    except RoomError as error:
        if want_json:
            sys.stdout.write(json.dumps(error.as_dict(), ensure_ascii=False) + "\n")
        sys.stderr.write("error: %s\n" % clean(error.message))
        if error.hint:
            sys.stderr.write("hint: %s\n" % clean(error.hint))
        return error.exit_code
    except KeyboardInterrupt:
        return 130
    try:
        if text:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (| head): not our failure; keep Python quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return code


if __name__ == "__main__":
    sys.exit(main())
