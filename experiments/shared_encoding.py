"""What does sharing one encoding between a request's beam and the scoring of its candidates
save in a lone learned request?

`search.encoded` keeps the last host batch's encoder memory on the calling thread, so that the
teacher forcing of the learned ranker's candidates (`teacher_forcing.candidate_log_probs`) reads the
memory the beam search just computed instead of encoding the same session again. This study
times `Pipeline.ordered` on lone contexts of the test split (every prefix of its first
sessions, each padded to the service's session widths), alternating rounds with and without
the sharing in one process (the other arm encodes anew: `search.encode_sessions`), and prints
the median and quartile of each arm with the machine and date.
docs/notes/2026-11-27-learned-ranker.md quotes its output.

  python experiments/shared_encoding.py --workdir=W $U    # U as in docs/RESULTS.md
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

from mtn_jax.data import preprocess
from mtn_jax.data import sessions
from mtn_jax.decoding import search
from mtn_jax.inference import pipeline
from mtn_jax.inference.inputs import Context
# pylint: enable=wrong-import-position

config_flags.DEFINE_config_file('config', 'configs/aol.py:small')
flags.DEFINE_string('workdir', None, 'a trained workdir with a learned ranker', required=True)
flags.DEFINE_integer('contexts', 60, 'lone contexts of the test split, timed in each round')
flags.DEFINE_integer('rounds', 6, 'rounds, the two arms alternating which goes first')
flags.DEFINE_list('widths', ['1', '2', '4', '8', '16'], "the service's session widths")
FLAGS = flags.FLAGS


def main(argv) -> None:
  del argv
  config = FLAGS.config.copy_and_resolve_references()
  config.suggest.strategy = 'learned'
  if FLAGS.contexts < 1 or FLAGS.rounds < 1:
    sys.exit('--contexts and --rounds must be at least 1')
  pipe = pipeline.Pipeline.load(config, FLAGS.workdir, log=lambda *a, **k: None)
  if pipe.settings.strategy != 'learned':  # the pipeline fell back to the blend
    sys.exit(f'--workdir={FLAGS.workdir}: no learned ranker there (made by --mode=train); '
             'the study times the learned strategy')
  split = sessions.load_split(preprocess.data_dir(os.path.abspath(FLAGS.workdir)), 'test')
  contexts = [tuple(split.session_texts(i)[:t]) for i in range(split.num_sessions)
              for t in range(1, len(split.session_texts(i)))][:FLAGS.contexts]
  widths = sorted(int(w) for w in FLAGS.widths)

  def run(queries):
    width = next(w for w in widths if w >= len(queries))
    pipe.ordered([Context(queries, len(queries) - 1, {})], positions='last', batch_rows=1,
                 widths=[width])

  arms = {'shared': search.encoded,
          'encoded anew': lambda model, params, batch, rows=None: search.encode_sessions(
              model, params, batch, rows)}
  for queries in contexts:  # compilation and warm-up
    run(queries)
  times = {name: [] for name in arms}
  for r in range(FLAGS.rounds):
    for name in (list(arms) if r % 2 else list(arms)[::-1]):
      search.encoded = arms[name]
      for queries in contexts:
        started = time.perf_counter()
        run(queries)
        times[name].append(1000 * (time.perf_counter() - started))
  search.encoded = arms['shared']
  print(f'{platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs), '
        f'{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {FLAGS.workdir}; '
        f'{len(contexts)} contexts x {FLAGS.rounds} rounds')
  print('| encoding | median ms | 25th percentile ms | mean ms |\n|---|---:|---:|---:|')
  for name, ms in times.items():
    ms.sort()
    print(f'| {name} | {ms[len(ms) // 2]:.2f} | {ms[len(ms) // 4]:.2f} | '
          f'{sum(ms) / len(ms):.2f} |')


if __name__ == '__main__':
  app.run(main)
