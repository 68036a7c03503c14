"""Decoding throughput: suggestions per second of beam search, per beam size and batch size.

  python launch/bench_decode.py --config=configs/aol.py:small --vocab_size=2851
  python launch/bench_decode.py --config=configs/demo.py --workdir=/tmp/mtn_demo
  python launch/bench_decode.py --config=configs/aol.py --vocab_size=76604 --batch_sessions=64,256

In: a config (its model and decode settings) and either a trained workdir (`--workdir`: the
best checkpoint, and sessions of its test split as input) or a randomly initialised model
with `--vocab_size` words and random sessions. Each measurement decodes batches of
`[batch, --session_queries, max_query_words]` sessions, suggesting after every position, as
evaluation does (`search.search_sessions(positions='all')`). The first call of each shape compiles and
warms up and is not timed; then `--repeats` timed calls, of which the median counts.
Out: one table on stdout (beam, sessions per batch, suggestions per batch, median seconds,
suggestions/s), with the machine, the config and the date.

A random model rarely emits `</s>` early, so its hypotheses run to `decode.max_len`: its
figures are the slow end; a trained model stops most beams after a few words.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time

from absl import flags
import jax
import numpy as np
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=g-import-not-at-top,wrong-import-position
from launch import bench_report
from launch import synthetic_batches
from mtn_jax import cli
from mtn_jax import inference
from mtn_jax import models
from mtn_jax import parallel
from mtn_jax import tasks
from mtn_jax.data import preprocess
from mtn_jax.data import sessions
from mtn_jax.decoding import search
# pylint: enable=g-import-not-at-top,wrong-import-position

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Config file (path[:variant]).',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', '', 'A trained workdir; empty: a random model.')
_VOCAB_SIZE = flags.DEFINE_integer('vocab_size', 76_604,
                                   'Vocabulary of the random model (76,604: AOL in the paper).')
_BEAMS = flags.DEFINE_list('beams', ['1', '5'], 'Beam sizes to measure.')
_BATCHES = flags.DEFINE_list('batch_sessions', ['16', '64'], 'Sessions per batch to measure.')
bench_report.positive_list('beams')
bench_report.positive_list('batch_sessions')
_SESSION_QUERIES = flags.DEFINE_integer('session_queries', 4, 'Queries per session (S).')
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Timed calls per measurement (median kept).')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the random model and sessions.')
_CPU_DEVICES = flags.DEFINE_integer(
    'cpu_devices', 0, 'JAX devices of a CPU-only host, as the trainer\'s --cpu_devices (0: one '
    'per core); decoding runs on the first.')


def random_model(config, vocab_size: int, seed: int):
  """(task, params) of a randomly initialised model."""
  cfg = models.make_config(config.model, vocab_size=vocab_size,
                           max_query_words=config.data.max_query_words)
  task = tasks.make_task(cfg, config.train)
  return task, jax.jit(task.init_params)(jax.random.PRNGKey(seed))


def random_sessions(rng: np.random.Generator, count: int, num_queries: int, max_words: int,
                    vocab_size: int) -> np.ndarray:
  """int32 [count, num_queries, max_words]: queries of 1..max_words random ordinary words."""
  words = rng.integers(5, vocab_size, (count, num_queries, max_words))
  lengths = rng.integers(1, max_words + 1, (count, num_queries, 1))
  return np.where(np.arange(max_words) < lengths, words, 0).astype(np.int32)


def test_sessions(workdir: str, rng: np.random.Generator, count: int,
                  num_queries: int) -> np.ndarray:
  """int32 [count, num_queries, n]: test sessions of exactly `num_queries` queries, drawn
  with replacement (the bucket's sessions repeat when there are fewer than `count`)."""
  split = sessions.load_split(preprocess.data_dir(workdir), 'test')
  candidates = np.flatnonzero(split.lengths == num_queries)
  if not len(candidates):
    raise SystemExit(f'{workdir}: no test session has {num_queries} queries; pass '
                     '--session_queries with a length the data has')
  chosen = rng.choice(candidates, count)
  return np.stack([split.session(i) for i in chosen]).astype(np.int32)


def main(argv):
  del argv
  cli.quiet_library_logs()
  parallel.set_cpu_devices(_CPU_DEVICES.value)
  config = _CONFIG.value
  rng = np.random.default_rng(_SEED.value)
  if _WORKDIR.value:
    trained = inference.load_trained(config, _WORKDIR.value)
    task, params = trained.task, trained.params
    source = f'trained checkpoint {_WORKDIR.value} (step {trained.step}), test sessions'
  else:
    task, params = random_model(config, _VOCAB_SIZE.value, _SEED.value)
    source = 'random initialisation, random sessions'
  cfg = task.cfg
  dc = config.decode
  num_queries = _SESSION_QUERIES.value
  bench_report.print_header(bench_report.command_line('launch/bench_decode.py', ('__main__',)))
  overrides = config_flags.get_override_values(flags.FLAGS['config'])
  print(f'config: {config_flags.get_config_filename(flags.FLAGS["config"])}'
        + (f', overrides {overrides}' if overrides else ''))
  # The model's own label (its layer counts where it has any): the families' configs differ.
  print(f'model: {models.spec(cfg.name).label(dataclasses.asdict(cfg))}, '
        f'{models.count_params(params):,} parameters, vocabulary {cfg.vocab_size:,}; {source}')
  print(f'decode: max_len {dc.max_len}, length penalty {dc.length_penalty}; sessions of '
        f'{num_queries} queries of {cfg.max_query_words} tokens, a suggestion after every '
        f'query; median of {_REPEATS.value} timed calls after one warm-up call')
  print(f'{"beam":>4} {"sessions":>8} {"suggestions":>11} {"median s":>9} {"suggestions/s":>13}')
  for beam in (int(b) for b in _BEAMS.value):
    for batch in (int(b) for b in _BATCHES.value):
      queries = (test_sessions(_WORKDIR.value, rng, batch, num_queries) if _WORKDIR.value
                 else random_sessions(rng, batch, num_queries, cfg.max_query_words,
                                      cfg.vocab_size))
      inputs = jax.device_put(synthetic_batches.model_inputs(task, queries,
                                                             config.data.history_queries))
      settings = search.SearchSettings(beam_size=beam, max_len=dc.max_len,
                                       length_penalty=dc.length_penalty,
                                       emit_unk=dc.emit_unk, top_k=beam)

      def run():
        sequences, scores = task.suggest(params, inputs, settings)
        jax.block_until_ready((sequences, scores))

      run()  # compiles and warms up
      times = []
      for _ in range(_REPEATS.value):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
      median = statistics.median(times)
      suggestions = batch * num_queries
      print(f'{beam:>4} {batch:>8} {suggestions:>11} {median:>9.4f} '
            f'{suggestions / median:>13.1f}', flush=True)


if __name__ == '__main__':
  flags.mark_flags_as_required(['config'])
  bench_report.run(main)
