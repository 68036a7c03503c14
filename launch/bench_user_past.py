"""What a heavy user's past costs decode of an AOL-format log: reading the contexts, and the
`history` source over them, with the user's latest `config.suggest.past_queries` earlier
queries against all of them.

  python launch/bench_user_past.py [--sessions=10000] [--queries_per_session=3]
      [--past_queries=1000]

In: nothing; a log of one user's `--sessions` sessions (31 minutes apart, so each is a session
of its own) of `--queries_per_session` queries each, drawn from 700 distinct ones, is written
to a temporary file. Each context holds its user's past (`inputs.read_raw_log`), so the whole
past grows the contexts' memory with the square of the user's sessions. Out: per window, the
time to read every context, the peak Python memory while reading (tracemalloc), and the time
of the `history` source over the last 2,000 contexts (all, where fewer); with the machine,
the command and the date.
"""

from __future__ import annotations

import datetime
import os
import sys
import tempfile
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
from absl import flags
import ml_collections

from launch import bench_report
from mtn_jax.data.vocab import SPECIAL_TOKENS
from mtn_jax.data.vocab import Vocab
from mtn_jax.inference import inputs
from mtn_jax.inference import sources
# pylint: enable=wrong-import-position

_SESSIONS = flags.DEFINE_integer('sessions', 10000, 'the user\'s sessions')
_QUERIES = flags.DEFINE_integer('queries_per_session', 3, 'queries a session')
_PAST = flags.DEFINE_integer('past_queries', 1000, 'the window measured against the whole past')
SCORED = 2000  # contexts the history source proposes for


def write_log(path: str, num_sessions: int, per_session: int) -> None:
  start = datetime.datetime(2006, 3, 1)
  with open(path, 'w', encoding='utf-8') as f:
    for s in range(num_sessions):
      for j in range(per_session):
        at = start + datetime.timedelta(minutes=31 * s, seconds=j)
        f.write(f'7\tquery {s % 700} word{j}\t{at:%Y-%m-%d %H:%M:%S}\n')


def main(argv) -> None:
  del argv
  data = ml_collections.ConfigDict({'session_gap_minutes': 30.0, 'strict': False,
                                    'history_queries': 0})
  vocab = Vocab(SPECIAL_TOKENS + ('query',))
  bench_report.print_header(bench_report.command_line('launch/bench_user_past.py', ('__main__',)),
                            devices=False)
  scored = min(SCORED, _SESSIONS.value)  # a context per session
  print(f'One user, {_SESSIONS.value:,} sessions of {_QUERIES.value} queries.\n')
  print('| past read | contexts | read s | peak MiB | history source, last '
        f'{scored:,} contexts s |\n|---|---:|---:|---:|---:|')
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, 'log.tsv')
    write_log(path, _SESSIONS.value, _QUERIES.value)
    total = _SESSIONS.value * _QUERIES.value
    for label, window in (('whole', total), (f'latest {_PAST.value:,}', _PAST.value)):
      tracemalloc.start()
      started = time.perf_counter()
      contexts = list(inputs.read_raw_log(path, inputs.QueryReader(vocab, 10, 10), data,
                                          chunk_sessions=256, past_queries=window))
      read = time.perf_counter() - started
      peak = tracemalloc.get_traced_memory()[1] / 2**20
      tracemalloc.stop()
      started = time.perf_counter()
      sources.History(10).propose(contexts[-scored:], positions='all')
      proposed = time.perf_counter() - started
      print(f'| {label} | {len(contexts):,} | {read:.1f} | {peak:.0f} | {proposed:.2f} |')
      del contexts


if __name__ == '__main__':
  bench_report.run(main)
