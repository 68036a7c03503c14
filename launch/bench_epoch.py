"""A slice of a training epoch through the real input pipeline, and the epoch it projects.

  python launch/bench_preprocess.py --lines=18200000 --files=16 --write_workers=16 \
      --keep=/tmp/log --json=/tmp/preprocess.json
  python launch/bench_epoch.py --config=configs/aol.py --config.model.compute_dtype=bfloat16 \
      --workdir=/tmp/log/run --preprocess_json=/tmp/preprocess.json --json=/tmp/epoch.json

In: a workdir whose corpus is prepared (`--mode=preprocess`, or bench_preprocess's `run`),
the flags of `launch/bench_train.py` that shape a step (`--config`, `--vocab_size`,
`--batch_queries`, `--seed`, `--peak_flops`, `--json`), `--slice_steps`, and
`--target_lines` and `--target_pairs`, the log whose preprocessing and epoch are projected
(default ten times AOL's 36,389,567 lines and 4,285,507 training pairs, the paper's Table 1:
363,895,670 and 42,855,070).

1. The training split is repeated to the size the target log would give (the log read here
   has `--preprocess_json`'s lines; the repeat is the whole number nearest their ratio), and
   made into the trainer's dataset (`input_pipeline.make_train_dataset`, the task's inputs,
   the trainer's device prefetch `train._device_batches`). Word ids past the model's
   vocabulary (`--vocab_size`, by default AOL's 76,604 for an 'aol' config) read as `<unk>`.
2. The trainer's step (`bench_train.JaxStep`) is compiled for every bucket's shape, side by
   side in threads, then run once on each (a program's first run, on a GPU its autotuning,
   is no step of the slice).
3. `--slice_steps` steps take their batches from the pipeline as the trainer's loop does.
   Per step: the time the host waited in `next()`, and whether the device had finished the
   step before it by then (nothing queued: it waited for the host). Then the same batches,
   already on the device, run again back to back: the step's own time. The slice's time over
   that is what the input pipeline costs the epoch.
4. The projection, said as one: preprocessing at the measured lines per second
   (`--preprocess_json`) for the target's lines; the epoch at the slice's time per step for
   the target's training pairs (the repeated split's steps per pair: the generated log holds
   more pairs a line than AOL's, so the epoch is scaled by pairs, not lines), plus the
   compilation and the first batch. Validation at the epoch's end and checkpoints are not
   counted.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import statistics
import sys
import time
from typing import Any

from absl import app
from absl import flags
import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=g-import-not-at-top,wrong-import-position
from launch import bench_report
from launch import bench_train
from mtn_jax import cli
from mtn_jax import models
from mtn_jax import parallel
from mtn_jax import tasks
from mtn_jax.data import input_pipeline
from mtn_jax.data import preprocess
from mtn_jax.data import sessions as sessions_lib
from mtn_jax.data.vocab import UNK_ID
from mtn_jax.training import train
# pylint: enable=g-import-not-at-top,wrong-import-position

AOL_LINES = 36_389_567  # the AOL collection's 10 files

_WORKDIR = flags.DEFINE_string('workdir', None, 'A workdir with a prepared corpus.')
_PREPROCESS_JSON = flags.DEFINE_string(
    'preprocess_json', '', "launch/bench_preprocess.py's --json of that corpus: its lines and "
    'preprocessing time (without it, the split is not repeated and nothing is projected '
    'for preprocessing).')
_TARGET_LINES = flags.DEFINE_integer('target_lines', 10 * AOL_LINES,
                                     'Log lines whose preprocessing is projected (and the '
                                     'repeat of the split).')
_TARGET_PAIRS = flags.DEFINE_integer('target_pairs', 10 * bench_train.AOL_TRAIN_PAIRS,
                                     'Training pairs whose epoch is projected.')
_SLICE_STEPS = flags.DEFINE_integer('slice_steps', 300, 'Steps of the timed slice.')


def repeated(split: sessions_lib.SessionSplit, times: int, vocab_size: int
             ) -> sessions_lib.SessionSplit:
  """`split`'s sessions `times` over (queries and session starts only), ids >= vocab_size as
  `<unk>`."""
  queries = np.where(split.queries >= vocab_size, UNK_ID, split.queries).astype(
      split.queries.dtype)
  rows = len(split.queries)
  starts = np.concatenate([split.starts[:-1] + i * rows for i in range(times)]
                          + [[rows * times]]).astype(split.starts.dtype)
  return sessions_lib.SessionSplit('train', np.tile(queries, (times, 1)), starts)


def measure(config, *, workdir: str, vocab_size: int, batch_queries: int, seed: int,
            slice_steps: int, preprocess_figures: dict | None, target_lines: int,
            target_pairs: int) -> dict[str, Any]:
  data_dir = preprocess.data_dir(os.path.abspath(workdir))
  vocab = sessions_lib.load_vocab(data_dir)
  split = sessions_lib.load_split(data_dir, 'train')
  ratio = target_lines / preprocess_figures['lines'] if preprocess_figures else 1.0
  times = max(int(round(ratio)), 1)
  started = time.perf_counter()
  big = repeated(split, times, vocab_size)
  repeat_s = time.perf_counter() - started
  cfg = models.make_config(config.model, vocab_size=vocab_size,
                           max_query_words=big.max_query_words)
  task = tasks.make_task(cfg, config.train, data_dir)
  inputs = task.training_inputs(big, vocab)
  dataset = input_pipeline.make_train_dataset(
      big, queries_per_batch=batch_queries, seed=seed, multiple_of=jax.device_count(),
      process_index=jax.process_index(), process_count=jax.process_count(),
      worker_count=config.input.worker_count, per_query=inputs.per_query,
      per_session=inputs.per_session)
  steps_per_epoch = input_pipeline.steps_per_epoch(big, batch_queries, jax.device_count())

  step = bench_train.JaxStep(config, cfg, seed)
  rows = input_pipeline.bucket_batch_sizes(np.unique(big.lengths), batch_queries,
                                           jax.device_count())
  rng = np.random.default_rng(seed)
  shapes = {k: step.put(bench_train.synthetic_queries(rng, (b, k), cfg.max_query_words,
                                                      vocab_size)) for k, b in rows.items()}
  started = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(len(shapes)) as pool:
    compile_s = dict(zip(shapes, pool.map(lambda b: step.compile(b, run=False),
                                          shapes.values())))
  compile_wall_s = time.perf_counter() - started
  for batch in shapes.values():  # each program's first run, outside the slice
    step.run(batch, step.steps_per_call)

  iterator = train._device_batches(dataset, task.input_keys, step.mesh,  # pylint: disable=protected-access
                                   config.input.prefetch_batches)
  started = time.perf_counter()
  first, _ = next(iterator)
  first_batch_s = time.perf_counter() - started
  kept, waits, starved, sums = [first], [], 0, [step.step(first)]
  jax.block_until_ready(sums)  # the slice starts with nothing queued
  started = time.perf_counter()
  for _ in range(slice_steps - 1):
    before = time.perf_counter()
    batch, _ = next(iterator)
    waits.append(time.perf_counter() - before)
    # The step before this one done already: the device has nothing queued, and waits.
    starved += bool(sums[-1]['loss'].is_ready())
    sums.append(step.step(batch))
    kept.append(batch)
  jax.block_until_ready(sums)
  slice_s = time.perf_counter() - started  # slice_steps - 1 steps, each fed by the pipeline
  iterator.close()
  started = time.perf_counter()
  again = [step.step(b) for b in kept[1:]]
  jax.block_until_ready(again)
  compute_s = time.perf_counter() - started
  fetched = jax.device_get(sums[1:])
  pairs = sum(float(s['pairs']) for s in fetched)
  timed = max(slice_steps - 1, 1)
  step_s = slice_s / timed
  by_bucket: dict[int, int] = {}
  for b in kept:
    by_bucket[b['queries'].shape[1]] = by_bucket.get(b['queries'].shape[1], 0) + 1
  epoch_steps = steps_per_epoch * target_pairs / big.num_pairs
  epoch_s = epoch_steps * step_s + compile_wall_s + first_batch_s
  out = {
      'corpus': {'workdir': workdir, 'train_sessions': split.num_sessions,
                 'train_pairs': split.num_pairs, 'vocab': len(vocab)},
      'repeat': {'times': times, 'exact_ratio': ratio, 'sessions': big.num_sessions,
                 'pairs': big.num_pairs, 'seconds': repeat_s},
      'model_vocab': vocab_size, 'batch_queries': batch_queries,
      'bucket_rows': {str(k): v for k, v in rows.items()},
      'compile_s': {str(k): v for k, v in compile_s.items()}, 'compile_wall_s': compile_wall_s,
      'first_batch_s': first_batch_s,
      'slice': {'steps': timed, 'seconds': slice_s, 'step_s': step_s,
                'compute_seconds': compute_s, 'compute_step_s': compute_s / timed,
                'input_overhead': slice_s / compute_s - 1,
                'pairs_per_s': pairs / slice_s, 'next_wait_median_s': statistics.median(waits)
                if waits else 0.0, 'next_wait_max_s': max(waits, default=0.0),
                'steps_device_idle': starved, 'steps_by_bucket': by_bucket},
      'epoch': {'steps': epoch_steps, 'pairs': target_pairs, 'seconds': epoch_s},
      'memory': bench_train.peak_memory()}
  if preprocess_figures:
    pre_s = preprocess_figures['prepare_s'] * ratio
    out['preprocess'] = {'measured_lines': preprocess_figures['lines'],
                         'measured_s': preprocess_figures['prepare_s'],
                         'target_lines': target_lines, 'projected_s': pre_s,
                         'peak_rss_gib_main_projected':
                             preprocess_figures['peak_rss_gib']['main'] * ratio}
    out['projected_total_s'] = pre_s + epoch_s
  return out


def print_report(r: dict[str, Any]) -> None:
  s, e = r['slice'], r['epoch']
  print(f'corpus: {r["corpus"]["train_sessions"]:,} training sessions '
        f'({r["corpus"]["train_pairs"]:,} pairs), vocabulary {r["corpus"]["vocab"]:,} '
        f'(model {r["model_vocab"]:,}); repeated {r["repeat"]["times"]}x = '
        f'{r["repeat"]["sessions"]:,} sessions ({r["repeat"]["pairs"]:,} pairs)')
  print(f'compile: {r["compile_wall_s"]:.1f} s for {len(r["compile_s"])} bucket shapes side by '
        f'side; first batch {r["first_batch_s"]:.2f} s')
  print(f'slice: {s["steps"]} steps fed by the pipeline in {s["seconds"]:.2f} s '
        f'({s["step_s"] * 1e3:.2f} ms a step, {s["pairs_per_s"]:,.0f} pairs/s); the same '
        f'batches from the device {s["compute_seconds"]:.2f} s: the pipeline costs '
        f'{s["input_overhead"]:+.1%}; next() waits median {s["next_wait_median_s"] * 1e3:.2f} '
        f'ms, max {s["next_wait_max_s"] * 1e3:.2f} ms; the device had nothing queued before '
        f'{s["steps_device_idle"]} of {s["steps"]} steps')
  print(f'projected epoch: {e["steps"]:,.0f} steps ({e["pairs"]:,.0f} pairs) = '
        f'{e["seconds"] / 60:.1f} min (compilation and the first batch included)')
  if 'preprocess' in r:
    p = r['preprocess']
    print(f'projected preprocessing: {p["measured_lines"]:,} lines took {p["measured_s"]:.1f} s; '
          f'{p["target_lines"]:,} lines at that rate {p["projected_s"] / 60:.1f} min; '
          f'preprocessing + epoch {r["projected_total_s"] / 60:.1f} min (a projection)')


def main(argv):
  cli.quiet_library_logs()  # JAX's INFO lines (no TPU found, ...) above the figures
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  parallel.set_cpu_devices(flags.FLAGS.cpu_devices)
  config, vocab_size, batch_queries = bench_train.config_and_sizes()
  figures = None
  if _PREPROCESS_JSON.value:
    with open(_PREPROCESS_JSON.value, encoding='utf-8') as f:
      figures = json.load(f)
  report = bench_train.new_report(config, 'launch/bench_epoch.py')
  print(f'date: {report["date"]}\ncommand: {report["command"]}', flush=True)
  report['epoch'] = measure(config, workdir=_WORKDIR.value, vocab_size=vocab_size,
                            batch_queries=batch_queries, seed=flags.FLAGS.seed,
                            slice_steps=_SLICE_STEPS.value, preprocess_figures=figures,
                            target_lines=_TARGET_LINES.value,
                            target_pairs=_TARGET_PAIRS.value)
  print_report(report['epoch'])
  bench_train.write_report(report, flags.FLAGS.json)


if __name__ == '__main__':
  flags.mark_flags_as_required(['workdir'])
  bench_report.run(main)
