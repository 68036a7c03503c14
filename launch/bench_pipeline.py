"""A lone context's suggestion time in the pipeline, per strategy: what one request to the
service costs without HTTP.

  python launch/bench_pipeline.py --workdir=W --strategies=learned,blend \
      --config=configs/aol.py:small --config.data.raw_files=LOG --config.data.split_by=user

In: a trained workdir (with a ranker for 'learned'). Each strategy's pipeline orders the
candidates after one session (`--session`, queries separated by ' | '), positions 'last',
one row padded to the session's length, as the service runs a lone request: `--warmups`
untimed calls (compilation), then `--repeats` timed ones. With `--contexts=N`, the requests
are rather N sessions of the workdir's test split, each cut after a random position, as
`launch/bench_serve.py` sends them, padded to the service's session widths: one untimed
pass over them all, then one timed call each; with `--histories`, each names its user, whose
earlier queries (the corpus's) a strategy that reads them gets. Out: one table on stdout
(median and 90th percentile ms), with the machine, the config and the date.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
from absl import app
from absl import flags
from ml_collections import config_flags

import numpy as np

from launch import bench_report
from launch import bench_requests
from mtn_jax import cli
from mtn_jax import config_lib
from mtn_jax.decoding import search
from mtn_jax.inference import pipeline
from mtn_jax.inference.inputs import Context
from mtn_jax.serving import engine
# pylint: enable=wrong-import-position

config_flags.DEFINE_config_file('config', 'configs/aol.py:small')
flags.DEFINE_string('workdir', None, 'a trained workdir', required=True)
flags.DEFINE_list('strategies', ['learned', 'blend'], 'config.suggest.strategy values')
flags.DEFINE_string('session', 'weather | weather chicago', "the session, ' | ' between queries")
flags.DEFINE_integer('warmups', 3, 'untimed calls first')
flags.DEFINE_integer('repeats', 30, 'timed calls')
flags.DEFINE_integer('contexts', 0, 'if > 0: this many test-split sessions cut at random '
                     'positions (seed 0), one timed call each, instead of --session')
flags.DEFINE_bool('histories', False, "with --contexts: each request names its user, whose "
                  "earlier queries (the corpus's) a strategy reading them gets")
FLAGS = flags.FLAGS


def main(argv) -> None:
  del argv
  cli.quiet_library_logs()
  if not os.path.isdir(FLAGS.workdir):
    raise app.UsageError(f'--workdir={FLAGS.workdir}: no such folder')
  configs = {}
  for strategy in FLAGS.strategies:  # each checked before any is timed
    configs[strategy] = FLAGS.config.copy_and_resolve_references()
    configs[strategy].suggest.strategy = strategy
    try:
      config_lib.validate(configs[strategy], mode='serve')
    except config_lib.ConfigError as e:
      raise app.UsageError(f'--strategies: {e}') from None
  most = FLAGS.config.data.max_session_queries
  if FLAGS.contexts:
    requests = [tuple(queries) for queries in bench_requests.request_sessions(
        FLAGS.workdir, FLAGS.contexts, most, seed=0)]
    widths = engine.padded_sizes(most)
    what = (f'{len(requests)} test contexts cut at random positions (mean '
            f'{np.mean([len(r) for r in requests]):.1f} queries), one call each')
    histories = ([tuple(h) for h in bench_requests.request_histories(
        FLAGS.workdir, FLAGS.contexts, seed=0)] if FLAGS.histories else [()] * len(requests))
    if FLAGS.histories:
      what += (f', each with its user\'s earlier queries (mean '
               f'{np.mean([len(h) for h in histories]):.0f})')
  else:
    if FLAGS.histories:
      raise app.UsageError('--histories needs --contexts (the test split\'s users)')
    requests = [tuple(q.strip() for q in FLAGS.session.split('|'))]
    histories = [()]
    widths = None
    what = f'session {" | ".join(requests[0])}, {FLAGS.repeats} calls'
  bench_report.print_header(bench_report.command_line('launch/bench_pipeline.py',
                                                      ('__main__',)))
  print(f'{FLAGS.workdir}, {what}\n')
  print('| strategy | median ms | p90 ms |\n|---|---:|---:|')
  for strategy, config in configs.items():
    pipe = pipeline.Pipeline.load(config, FLAGS.workdir, log=lambda *a, **k: None)
    def run(queries, history):
      # A request's beam and its candidates' scoring share one encoding of its session
      # (`search.encoded` keeps the last): --session repeats one session, which a call must
      # not find encoded by the call before it.
      search._last_encoding.inputs = None  # pylint: disable=protected-access
      width = len(queries) if widths is None else next(w for w in widths if w >= len(queries))
      pipe.ordered([Context(queries, len(queries) - 1, {}, history=history)],
                   positions='last', batch_rows=1, widths=[width])
    calls = list(zip(requests, histories))
    timed = calls if FLAGS.contexts else calls * FLAGS.repeats
    for queries, history in (calls if FLAGS.contexts else calls * FLAGS.warmups):
      run(queries, history)
    times = []
    for queries, history in timed:
      started = time.perf_counter()
      run(queries, history)
      times.append(1000 * (time.perf_counter() - started))
    times.sort()
    print(f'| {strategy} | {times[len(times) // 2]:.1f} | '
          f'{times[min(len(times) - 1, (9 * len(times)) // 10)]:.1f} |')


if __name__ == '__main__':
  bench_report.run(main)
