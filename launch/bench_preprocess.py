"""Preprocessing speed: a synthetic AOL-format log of millions of lines through `prepare`.

  python launch/bench_preprocess.py                       # 3.6M lines in 4 gzip files
  python launch/bench_preprocess.py --lines=36000000 --files=10
  python launch/bench_preprocess.py --order=shuffled      # unsorted input: the sort path
  python launch/bench_preprocess.py --logs='/data/aol/user-ct-test-collection-*.txt.gz'

In: flags only. Unless --logs names real ones, the log is written to a temporary folder
(removed afterwards unless --keep), with AOL's format and habits, synthesised with numpy:
users in AnonID order split across --files gzip files, sessions of 1-8 distinct queries a
few seconds to minutes apart, sessions hours to days apart, every click repeating its
query's line with a rank and a url, some queries of more than 10 words, a few "-".

Out: one report on stdout with the machine, the date, the data config, the log's size, and
prepare's wall time, lines per second, CPU time and peak resident memory (prepare runs in a
process of its own, plus its reader processes; CPU time does not depend on what else the
machine runs, wall time does).
"""

from __future__ import annotations

import gzip
import json
import multiprocessing
import os
import resource
import shutil
import sys
import tempfile
import time

from absl import flags
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs import default  # pylint: disable=g-import-not-at-top,wrong-import-position
from launch import bench_report  # pylint: disable=g-import-not-at-top,wrong-import-position
from mtn_jax.data import aol_log  # pylint: disable=g-import-not-at-top,wrong-import-position
from mtn_jax.data import preprocess  # pylint: disable=g-import-not-at-top,wrong-import-position

_LINES = flags.DEFINE_integer('lines', 3_600_000, 'Approximate number of log lines.')
flags.register_validator('lines', lambda n: n > 0, message='expected a positive number of lines')
_FILES = flags.DEFINE_integer('files', 4, 'Number of gzip files the users are split over.')
_ORDER = flags.DEFINE_enum('order', 'sorted', ['sorted', 'shuffled'],
                           'sorted: by AnonID then time, like AOL; shuffled: random order.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the synthetic log.')
_KEEP = flags.DEFINE_string('keep', '', 'Write the log and corpus here and keep them.')
_WRITE_WORKERS = flags.DEFINE_integer(
    'write_workers', 1, 'Processes writing the synthetic log\'s files side by side (> 1: each '
    'file draws from a random stream of its own, so the log differs from one written by one '
    'process with the same seed).')
_JSON = flags.DEFINE_string('json', '', 'Also write the figures to this JSON file.')
_LOGS = flags.DEFINE_string('logs', '', 'Benchmark these AOL-format logs (a glob or a comma-'
                            'separated list, e.g. the real collection) instead of a synthetic one.')

_LINES_PER_USER = 55  # the AOL collection: 36.4M lines of 657k users
_START = np.datetime64('2006-03-01T00:00:00', 's').astype(np.int64)
_SPAN_SECONDS = 92 * 86400


def _zipf(rng: np.random.Generator, exponent: float, num_values: int, size: int) -> np.ndarray:
  """`size` draws of 0..num_values-1 with P(k) proportional to 1 / (k + 1)**exponent."""
  cdf = np.cumsum(1.0 / np.arange(1, num_values + 1)**exponent)
  return np.minimum(np.searchsorted(cdf, rng.random(size) * cdf[-1]), num_values - 1)


def _query_pool(rng: np.random.Generator, size: int) -> np.ndarray:
  """`size` query strings over a Zipf-distributed vocabulary of made-up words."""
  letters = np.array(list('abcdefghijklmnopqrstuvwxyz'))
  word_lengths = rng.integers(2, 10, 100_000)
  words = np.array([''.join(rng.choice(letters, n)) for n in word_lengths])
  query_lengths = np.minimum(rng.geometric(0.4, size), 14)  # ~1% have more than 10 words
  chosen = words[_zipf(rng, 1.0, len(words), int(query_lengths.sum()))]
  ends = np.cumsum(query_lengths)
  return np.array([' '.join(chosen[e - n:e]) for e, n in zip(ends, query_lengths)], object)


def _user_lines(rng: np.random.Generator, users: np.ndarray, pool: np.ndarray,
                urls: np.ndarray) -> list[str]:
  """Log lines of `users` (AnonIDs), sorted by AnonID then time."""
  sessions = rng.geometric(1 / 16, len(users))
  session_user = np.repeat(users, sessions)
  session_start = _START + rng.integers(0, _SPAN_SECONDS, len(session_user))
  queries = rng.geometric(1 / 2.5, len(session_user))
  queries = np.minimum(queries, 8)
  query_session = np.repeat(np.arange(len(session_user)), queries)
  gaps = rng.exponential(100.0, len(query_session)).astype(np.int64)
  gaps[np.cumsum(queries) - queries] = 0
  first_gap = np.repeat(np.cumsum(gaps)[np.cumsum(queries) - queries], queries)
  query_time = session_start[query_session] + np.cumsum(gaps) - first_gap
  query_text = pool[_zipf(rng, 0.9, len(pool), len(query_session))]
  query_text[rng.random(len(query_text)) < 0.002] = '-'
  clicks = rng.poisson(1.0, len(query_session))
  line_query = np.repeat(np.arange(len(query_session)), np.maximum(clicks, 1))
  order = np.lexsort((np.arange(len(line_query)), query_time[line_query],
                      session_user[query_session][line_query]))
  line_query = line_query[order]
  clicked = clicks[line_query] > 0
  ranks = rng.integers(1, 11, len(line_query)).astype(str)
  line_url = urls[rng.integers(0, len(urls), len(line_query))]
  stamps = np.datetime_as_string(query_time[line_query].astype('datetime64[s]'))
  user_ids = session_user[query_session][line_query].astype(str)
  texts = query_text[line_query]
  return [f'{u}\t{q}\t{s[:10]} {s[11:]}\t{r}\t{url}' if c else
          f'{u}\t{q}\t{s[:10]} {s[11:]}\t\t'
          for u, q, s, r, url, c in zip(user_ids, texts, stamps, ranks, line_url, clicked)]


_HEADER = 'AnonID\tQuery\tQueryTime\tItemRank\tClickURL'
_URLS = 5_000


def _write_file(folder: str, i: int, lines: list[str], order: str,
                rng: np.random.Generator) -> None:
  if order == 'shuffled':
    lines = [lines[j] for j in rng.permutation(len(lines))]
  with gzip.open(os.path.join(folder, f'log-{i:02d}.tsv.gz'), 'wt', encoding='utf-8',
                 compresslevel=6) as f:
    f.write(_HEADER + '\n')
    f.write('\n'.join(lines) + '\n')


def _write_one_file(args) -> None:
  """One file of a log written by several processes: the query pool of `seed` (the same in
  every process), this file's users, lines from this file's own random stream."""
  folder, i, users, order, seed, stream = args
  pool = _query_pool(np.random.default_rng(seed), 1_000_000)
  urls = np.array([f'http://www.site{k}.com' for k in range(_URLS)])
  rng = np.random.default_rng(stream)
  _write_file(folder, i, _user_lines(rng, users, pool, urls), order, rng)


def write_log(folder: str, num_lines: int, num_files: int, order: str, seed: int,
              workers: int = 1) -> None:
  """Writes a synthetic log of about `num_lines` lines as `folder/log-NN.tsv.gz`, with
  `workers` > 1 that many files at a time, each in a process of its own."""
  rng = np.random.default_rng(seed)
  if workers > 1:
    user_ids = np.sort(rng.choice(25_000_000, max(num_lines // _LINES_PER_USER, 1),
                                  replace=False))
    streams = np.random.SeedSequence(seed).spawn(num_files)
    jobs = [(folder, i, users, order, seed, streams[i])
            for i, users in enumerate(np.array_split(user_ids, num_files))]
    with multiprocessing.get_context('spawn').Pool(min(workers, num_files)) as pool:
      pool.map(_write_one_file, jobs, chunksize=1)
    return
  pool = _query_pool(rng, 1_000_000)
  urls = np.array([f'http://www.site{i}.com' for i in range(_URLS)])
  user_ids = np.sort(rng.choice(25_000_000, max(num_lines // _LINES_PER_USER, 1),
                                replace=False))
  for i, users in enumerate(np.array_split(user_ids, num_files)):
    _write_file(folder, i, _user_lines(rng, users, pool, urls), order, rng)


def _prepare_and_measure(raw_files: str, workdir: str, connection) -> None:
  """Runs prepare in a fresh process, so that its peak memory is its own."""
  config = default.get_config()
  config.data.raw_files = raw_files
  started = time.perf_counter()
  stats = preprocess.prepare(config, workdir)
  wall = time.perf_counter() - started
  main, readers = (resource.getrusage(who)
                   for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
  connection.send({
      'stats': stats, 'wall': wall, 'config': config.data.to_dict(),
      'self_kib': main.ru_maxrss, 'worker_kib': readers.ru_maxrss,
      'self_cpu': main.ru_utime + main.ru_stime,
      'worker_cpu': readers.ru_utime + readers.ru_stime})


def main(argv):
  del argv
  folder = _KEEP.value or tempfile.mkdtemp(prefix='bench_preprocess_')
  os.makedirs(folder, exist_ok=True)
  try:
    write_s = None
    if _LOGS.value:
      raw_files, source = _LOGS.value, f'given ({_LOGS.value})'
    else:
      started = time.perf_counter()
      write_log(folder, _LINES.value, _FILES.value, _ORDER.value, _SEED.value,
                _WRITE_WORKERS.value)
      raw_files = os.path.join(folder, 'log-*.tsv.gz')
      write_s = time.perf_counter() - started
      source = (f'synthetic, {_ORDER.value} (written in {write_s:.0f} s by '
                f'{_WRITE_WORKERS.value} process(es))')
    paths = aol_log.expand_paths(raw_files)
    log_bytes = sum(os.path.getsize(p) for p in paths)
    workers = (min(len(paths), len(os.sched_getaffinity(0)))
               if log_bytes >= aol_log.PARALLEL_MIN_BYTES else 1)
    shutil.rmtree(os.path.join(folder, 'run'), ignore_errors=True)
    load_before = os.getloadavg()[0]
    context = multiprocessing.get_context('spawn')
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_prepare_and_measure,
                            args=(raw_files, os.path.join(folder, 'run'), sender))
    child.start()
    sender.close()  # the child's end alone stays open: a child that dies ends the wait
    try:
      result = receiver.recv()
    except EOFError:
      child.join()
      raise SystemExit(f'preparing {raw_files} failed (exit code {child.exitcode}; its error '
                       'is printed above)') from None
    child.join()
    stats, wall = result['stats'], result['wall']
    num_lines = stats['lines_read']
    header = bench_report.print_header(
        bench_report.argv_line('launch/bench_preprocess.py', sys.argv[1:]), devices=False)
    print(f'numpy {np.__version__}; load average {load_before:.1f} before, '
          f'{os.getloadavg()[0]:.1f} after')
    print(f'config.data: {json.dumps(result["config"], sort_keys=True)}')
    print(f'log: {num_lines:,} lines in {len(paths)} files, {log_bytes / 2**20:.0f} MiB, '
          f'{source}')
    print(f'kept: {sum(stats[s]["sessions"] for s in ("train", "valid", "test")):,} sessions, '
          f'{sum(stats[s]["pairs"] for s in ("train", "valid", "test")):,} pairs, '
          f'vocabulary {stats["vocab_size"]:,}')
    print(f'prepare: {wall:.1f} s wall, {num_lines / wall:,.0f} lines/s, '
          f'{workers} reader process(es); CPU {result["self_cpu"]:.1f} s main process, '
          f'{result["worker_cpu"]:.1f} s readers')
    if workers > 1:
      print(f'peak RSS: {result["self_kib"] / 2**20:.2f} GiB main process, '
            f'{result["worker_kib"] / 2**20:.2f} GiB the largest reader process '
            f'({workers} at a time); at most '
            f'{(result["self_kib"] + workers * result["worker_kib"]) / 2**20:.2f} GiB together')
    else:
      print(f'peak RSS: {result["self_kib"] / 2**20:.2f} GiB (read in the main process)')
    if _JSON.value:
      with open(_JSON.value, 'w', encoding='utf-8') as f:
        json.dump({**header, 'cores': os.cpu_count(), 'source': source, 'write_s': write_s,
                   'files': len(paths), 'log_bytes': log_bytes, 'lines': num_lines,
                   'readers': workers, 'prepare_s': wall, 'lines_per_s': num_lines / wall,
                   'cpu_s': {'main': result['self_cpu'], 'readers': result['worker_cpu']},
                   'peak_rss_gib': {'main': result['self_kib'] / 2**20,
                                    'reader': result['worker_kib'] / 2**20},
                   'workdir': os.path.join(folder, 'run'),
                   'stats': {k: v for k, v in stats.items() if k != 'vocab'}},
                  f, indent=2, sort_keys=True, default=str)
      print(f'wrote {_JSON.value}')
  finally:
    if not _KEEP.value:
      shutil.rmtree(folder, ignore_errors=True)


if __name__ == '__main__':
  bench_report.run(main)
