"""A lone context's suggestion time in the pipeline, per strategy: what one request to the
service costs without HTTP.

  python launch/bench_pipeline.py --workdir=W --strategies=learned,blend \
      --config=configs/aol.py:small --config.data.raw_files=LOG --config.data.split_by=user

In: a trained workdir (with a ranker for 'learned'). Each strategy's pipeline orders the
candidates after one session (`--session`, queries separated by ' | '), positions 'last',
one row padded to the session's length, as the service runs a lone request: `--warmups`
untimed calls (compilation), then `--repeats` timed ones. Out: one table on stdout (median
and 90th percentile ms), with the machine, the config and the date.
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
from absl import app
from absl import flags
from ml_collections import config_flags

from mtn_jax.inference import pipeline
from mtn_jax.inference.inputs import Context
# pylint: enable=wrong-import-position

config_flags.DEFINE_config_file('config', 'configs/aol.py:small')
flags.DEFINE_string('workdir', None, 'a trained workdir', required=True)
flags.DEFINE_list('strategies', ['learned', 'blend'], 'config.suggest.strategy values')
flags.DEFINE_string('session', 'weather | weather chicago', "the session, ' | ' between queries")
flags.DEFINE_integer('warmups', 3, 'untimed calls first')
flags.DEFINE_integer('repeats', 30, 'timed calls')
FLAGS = flags.FLAGS


def main(argv) -> None:
  del argv
  queries = tuple(q.strip() for q in FLAGS.session.split('|'))
  context = [Context(queries, len(queries) - 1, {})]
  print(f'{platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs), '
        f'{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, '
        f'{FLAGS.workdir}, session {" | ".join(queries)}\n'
        + ' '.join(a for a in sys.argv[1:] if a.startswith('--config')) + '\n')
  print('| strategy | median ms | p90 ms |\n|---|---:|---:|')
  for strategy in FLAGS.strategies:
    config = FLAGS.config.copy_and_resolve_references()
    config.suggest.strategy = strategy
    pipe = pipeline.Pipeline.load(config, FLAGS.workdir, log=lambda *a, **k: None)
    run = lambda: pipe.ordered(context, positions='last', batch_rows=1, widths=[len(queries)])
    for _ in range(FLAGS.warmups):
      run()
    times = []
    for _ in range(FLAGS.repeats):
      started = time.perf_counter()
      run()
      times.append(1000 * (time.perf_counter() - started))
    times.sort()
    print(f'| {strategy} | {times[len(times) // 2]:.1f} | '
          f'{times[min(len(times) - 1, (9 * len(times)) // 10)]:.1f} |')


if __name__ == '__main__':
  app.run(main)
