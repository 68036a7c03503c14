"""Each user's earlier queries, in SQLite: the history a personalising model (or the habit rule)
reads, kept across restarts and crashes.

A request names its whole session so far, or, past the model's `window` (its
max_session_queries), the latest `window` queries of it. The user's current session is stored
(`sessions`, one row a user); a request continues it when the stored queries are its
beginning, or, for a request of `window` queries, when it begins with at least half a
window of the stored session's last queries (the window slid on: its new queries are added
to the stored session). Any other request starts a new session, and the stored one's queries
join the user's earlier queries (`queries`), of which the latest `per_user` are kept. A request's history is thus its user's
queries before this session, as a raw log's earlier sessions are decode's history.

The database is in WAL mode and every request's change is one committed transaction, so a
process killed at any moment (kill -9) loses nothing it answered; `synchronous=NORMAL` syncs
at checkpoints, which only a machine losing power could undo.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Sequence

_SCHEMA = """
CREATE TABLE IF NOT EXISTS queries (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  user TEXT NOT NULL,
  query TEXT NOT NULL,
  at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS queries_by_user ON queries (user, id);
CREATE TABLE IF NOT EXISTS sessions (
  user TEXT PRIMARY KEY,
  queries TEXT NOT NULL,
  at REAL NOT NULL
);
"""


class HistoryStore:
  """Users' earlier queries in the SQLite file `path` (see the module docstring)."""

  def __init__(self, path: str, per_user: int, window: int, busy_seconds: float = 10.0):
    """`busy_seconds`: how long a request waits for the file while another process holds
    it locked, before sqlite3.OperationalError."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    self.path, self.per_user, self.window = path, per_user, window
    # One connection, used by one thread at a time (the lock); autocommit off by hand.
    self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None,
                               timeout=busy_seconds)
    self._lock = threading.Lock()
    with self._lock:
      mode = self._db.execute('PRAGMA journal_mode=WAL').fetchone()[0]
      if mode.lower() != 'wal':
        self._db.close()
        raise OSError(f'{path}: SQLite would not switch to WAL mode (it is {mode!r})')
      self._db.execute('PRAGMA synchronous=NORMAL')
      self._db.executescript(_SCHEMA)

  def observe(self, user: str, session: Sequence[str]) -> tuple[str, ...]:
    """Records that `user`'s session is now `session`; returns the user's earlier queries
    (before this session), oldest first, at most `per_user` of them."""
    session = list(session)
    with self._lock:
      db = self._db
      db.execute('BEGIN IMMEDIATE')
      try:
        row = db.execute('SELECT queries FROM sessions WHERE user = ?', (user,)).fetchone()
        stored = json.loads(row[0]) if row else []
        now = time.time()
        slid = self._slid_by(stored, session)
        if slid:  # the same session, sent as its latest `window` queries
          # At most as many as the user's history keeps: what it could ever add to it.
          session = (stored + session[slid:])[-max(self.per_user, self.window):]
        elif stored and session[:len(stored)] != stored:  # a new session: the last one ended
          db.executemany('INSERT INTO queries (user, query, at) VALUES (?, ?, ?)',
                         [(user, q, now) for q in stored])
          db.execute('DELETE FROM queries WHERE user = ? AND id <= (SELECT id FROM queries '
                     'WHERE user = ? ORDER BY id DESC LIMIT 1 OFFSET ?)',
                     (user, user, self.per_user))
        db.execute('INSERT INTO sessions (user, queries, at) VALUES (?, ?, ?) ON CONFLICT '
                   '(user) DO UPDATE SET queries = excluded.queries, at = excluded.at',
                   (user, json.dumps(session, ensure_ascii=False), now))
        earlier = db.execute('SELECT query FROM queries WHERE user = ? ORDER BY id DESC '
                             'LIMIT ?', (user, self.per_user)).fetchall()
        db.execute('COMMIT')
      except BaseException:
        db.execute('ROLLBACK')
        raise
    return tuple(q for (q,) in reversed(earlier))

  def _slid_by(self, stored: list[str], session: list[str]) -> int:
    """How many of `session`'s first queries are the stored session's last ones, where
    `session` is a full window that slid on past them: by the whole window (the same request
    again) or by at least half of it (a request or two the service never saw in between);
    0: it did not (a new session may well begin with the last query of the one before)."""
    if len(session) != self.window:
      return 0
    for overlap in range(min(self.window, len(stored)), max(1, self.window // 2) - 1, -1):
      if stored[-overlap:] == session[:overlap]:
        return overlap
    return 0

  def earlier(self, user: str) -> tuple[str, ...]:
    """`user`'s earlier queries, oldest first (nothing recorded)."""
    with self._lock:
      rows = self._db.execute('SELECT query FROM queries WHERE user = ? ORDER BY id DESC '
                              'LIMIT ?', (user, self.per_user)).fetchall()
    return tuple(q for (q,) in reversed(rows))

  def current(self, user: str) -> tuple[str, ...]:
    """`user`'s stored current session."""
    with self._lock:
      row = self._db.execute('SELECT queries FROM sessions WHERE user = ?', (user,)).fetchone()
    return tuple(json.loads(row[0])) if row else ()

  def close(self) -> None:
    with self._lock:
      self._db.close()
