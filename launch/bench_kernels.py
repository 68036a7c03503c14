"""The train step's kernel choices (`config.model.kernels`), each alone against XLA's own, and
what the loss head's bfloat16 gradient products change in what a run learns.

  python launch/bench_kernels.py --config=configs/aol.py --config.model.compute_dtype=bfloat16
  python launch/bench_kernels.py --config=configs/aol.py --config.model.compute_dtype=bfloat16 \
      --corpus=WORKDIR --learn_steps=300 --json=/tmp/kernels.json

In: the flags of `launch/bench_train.py` that shape a step (`--config`, `--vocab_size`,
`--batch_queries`, `--steps`, `--repeats`, `--seed`, `--peak_flops`, `--json`), `--bucket`
(the session length of the batches), `--variants` (comma-separated `config.model.kernels`
values, 'base' for ''), and for the learning comparison `--corpus` (a workdir whose corpus
`--mode=preprocess` prepared) with `--learn_steps`.

1. Timing: one `bench_train.JaxStep` per variant on the same synthetic batch of the bucket,
   compiled side by side in threads (XLA compiles with the GIL released), then `--repeats`
   runs of `--steps` steps of each variant in turn, so that every variant sees the same
   state of the machine; the median run counts. A variant that fails to build or compile
   (a choice `config.model.kernels` refuses) is reported with its error and the others go on.
   MFU from the executed FLOPs of the base step (`bench_train.step_flops`, or
   `--executed_flops` where another run counted them): every variant does the model's
   arithmetic.
2. Learning (with `--corpus`): the training split's sessions of at least `--bucket` queries,
   cut to their first `--bucket`, in a seeded order, in batches of the bucket's shape (ids
   beyond the model's vocabulary read as `<unk>`), trained `--learn_steps` steps from the
   same initial state by the base step, by the 'bf16_head_grads' step, and by the base step
   from another seed (`--seed` + 1: how far two runs that differ by chance alone drift
   apart). The per-step training losses, their means over windows of `--learn_window`
   steps, and the largest differences of those means.
Out: a table on stdout, and with `--json` every figure, the machine, the date and the
command.
"""

from __future__ import annotations

import concurrent.futures
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
from mtn_jax.data import input_pipeline
from mtn_jax.data import preprocess
from mtn_jax.data import sessions as sessions_lib
from mtn_jax.data.vocab import UNK_ID
# pylint: enable=g-import-not-at-top,wrong-import-position

_BUCKET = flags.DEFINE_integer('bucket', 4, 'Session length (queries) of the batches.')
_VARIANTS = flags.DEFINE_list(
    'variants', ['base', 'bf16_head_grads'],
    "config.model.kernels values to time: 'base' (none, XLA's own kernels) and "
    "'bf16_head_grads' (a choice of several joins them with '+').")
_CORPUS = flags.DEFINE_string('corpus', '', 'A workdir with a prepared corpus: train on its '
                              'sessions for the learning comparison (empty: none).')
_LEARN_STEPS = flags.DEFINE_integer('learn_steps', 300, 'Steps of each learning run.')
_LEARN_WINDOW = flags.DEFINE_integer('learn_window', 25, 'Steps per mean of the loss curves.')
_EXECUTED_FLOPS = flags.DEFINE_float(
    'executed_flops', 0.0, "The base step's executed FLOPs on this batch, when known (another "
    "run's bench_train --json, 'flops_per_step'); 0: counted here (two lowerings of the step).")

LEARN_VARIANT = 'bf16_head_grads'


def kernels_value(variant: str) -> str:
  return '' if variant == 'base' else variant.replace('+', ',')


def build(config, cfg, variant: str, seed: int, queries: np.ndarray) -> dict[str, Any]:
  """The variant's JaxStep, compiled for `queries`' shape and run once."""
  started = time.perf_counter()
  step = bench_train.JaxStep(config, cfg.replace(kernels=kernels_value(variant)), seed)
  batch = step.put(queries)
  compile_s = step.compile(batch)
  return {'step': step, 'batch': batch, 'compile_s': compile_s,
          'build_s': time.perf_counter() - started}


def learning_batches(corpus: str, bucket: int, rows: int, vocab_size: int, steps: int,
                     seed: int) -> tuple[list[np.ndarray], dict[str, Any]]:
  """`steps` batches int32 [rows, bucket, n] of the corpus's training sessions (see the
  module docstring), cycling through them if there are fewer."""
  split = sessions_lib.load_split(preprocess.data_dir(corpus), 'train')
  long_enough = np.flatnonzero(split.lengths >= bucket)
  if len(long_enough) < rows:
    raise ValueError(f'{corpus}: {len(long_enough)} training sessions of >= {bucket} queries, '
                     f'fewer than one batch of {rows}')
  order = np.random.default_rng(seed).permutation(long_enough)
  index = split.starts[order][:, None] + np.arange(bucket)  # [sessions, bucket]
  queries = split.queries[index].astype(np.int32)
  queries = np.where(queries >= vocab_size, UNK_ID, queries)
  per_pass = len(order) // rows
  batches = [queries[(i % per_pass) * rows:(i % per_pass + 1) * rows] for i in range(steps)]
  return batches, {'sessions': int(len(order)), 'batches_per_pass': per_pass,
                   'passes': steps / per_pass, 'corpus_vocab': int(split.queries.max()) + 1}


def learn(step: bench_train.JaxStep, batches: list[np.ndarray], seed: int) -> list[float]:
  """Per-step training losses of `batches` from the initial state of `seed`."""
  step.reset(seed)
  sums = [step.step(step.put(b)) for b in batches]
  fetched = jax.device_get(sums)
  return [float(s['loss'] / max(float(s['tokens']), 1.0)) for s in fetched]


def window_means(losses: list[float], window: int) -> list[float]:
  return [float(np.mean(losses[i:i + window])) for i in range(0, len(losses), window)]


def measure(config, *, vocab_size: int, batch_queries: int, bucket: int, variants: list[str],
            steps: int, repeats: int, seed: int, peak_flops_override: float, corpus: str,
            learn_steps: int, learn_window: int, executed_flops: float = 0.0
            ) -> dict[str, Any]:
  cfg = models.make_config(config.model, vocab_size=vocab_size,
                           max_query_words=config.data.max_query_words)
  if 'kernels' not in cfg.field_names():
    raise app.UsageError(f'{cfg.name} has no kernel choices (config.model.kernels)')
  rows = input_pipeline.bucket_batch_sizes(np.array([bucket]), batch_queries,
                                           jax.device_count())[bucket]
  queries = bench_train.synthetic_queries(np.random.default_rng(seed), (rows, bucket),
                                          cfg.max_query_words, vocab_size)
  models_, results = {}, {v: {} for v in variants}
  started = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(max(len(variants), 1)) as pool:
    futures = {v: pool.submit(build, config, cfg, v, seed, queries) for v in variants}
    for v, future in futures.items():
      try:
        models_[v] = future.result()
        results[v].update(compile_s=models_[v]['compile_s'], build_s=models_[v]['build_s'])
      except Exception as e:  # pylint: disable=broad-except
        results[v]['error'] = f'{type(e).__name__}: {str(e).splitlines()[0][:300]}'
        print(f'{v}: failed: {results[v]["error"]}', flush=True)
  built_s = time.perf_counter() - started
  flops = executed_flops or bench_train.step_flops(cfg, config, queries)['executed']
  _, _, weights = models.decoder_io(queries)
  pairs = rows * (bucket - 1)
  for _ in range(repeats):
    for v, m in models_.items():
      wall, cpu = m['step'].run(m['batch'], steps)
      results[v].setdefault('runs_s', []).append(wall)
      results[v].setdefault('cpu_runs_s', []).append(cpu)
  flops_peak = bench_train.peak_flops(jax.devices()[0], peak_flops_override)
  for v in models_:
    r = results[v]
    r['step_s'] = statistics.median(r['runs_s'])
    r['cpu_step_s'] = statistics.median(r['cpu_runs_s'])
    r['pairs_per_s'] = pairs / r['step_s']
    r['mfu'] = (flops / r['step_s'] / (flops_peak * jax.device_count())
                if flops_peak else None)
  base = results.get('base', {}).get('step_s')
  for v in models_:
    results[v]['speedup_over_base'] = base / results[v]['step_s'] if base else None
  out = {'bucket': bucket, 'shape': list(queries.shape), 'pairs_per_step': pairs,
         'target_tokens_per_step': float(np.asarray(weights).sum()),
         'executed_flops': flops, 'peak_flops_per_device': flops_peak, 'steps': steps,
         'repeats': repeats, 'built_s': built_s, 'variants': results,
         'memory': bench_train.peak_memory()}
  if corpus:
    out['learning'] = compare_learning(models_, corpus, bucket, rows, vocab_size, learn_steps,
                                       learn_window, seed)
  return out


def compare_learning(models_, corpus, bucket, rows, vocab_size, learn_steps, learn_window,
                     seed) -> dict[str, Any]:
  missing = [v for v in ('base', LEARN_VARIANT) if v not in models_]
  if missing:
    return {'error': f'no compiled step for {", ".join(missing)}'}
  batches, data = learning_batches(corpus, bucket, rows, vocab_size, learn_steps, seed)
  runs = {'base': learn(models_['base']['step'], batches, seed),
          LEARN_VARIANT: learn(models_[LEARN_VARIANT]['step'], batches, seed),
          f'base, seed {seed + 1}': learn(models_['base']['step'], batches, seed + 1)}
  means = {name: window_means(losses, learn_window) for name, losses in runs.items()}
  gap = lambda a, b: max(abs(x - y) for x, y in zip(means[a], means[b]))
  step_gap = lambda a, b: float(np.mean(np.abs(np.subtract(runs[a], runs[b]))))
  other_seed = f'base, seed {seed + 1}'
  return {'corpus': corpus, **data, 'steps': learn_steps, 'window': learn_window,
          'losses': runs, 'window_means': means,
          'max_window_gap_bf16_head': gap('base', LEARN_VARIANT),
          'max_window_gap_other_seed': gap('base', other_seed),
          'mean_step_gap_bf16_head': step_gap('base', LEARN_VARIANT),
          'mean_step_gap_other_seed': step_gap('base', other_seed),
          'final_window': {name: m[-1] for name, m in means.items()}}


def print_report(result: dict[str, Any]) -> None:
  print(f'batch {"x".join(map(str, result["shape"]))} (sessions of {result["bucket"]} '
        f'queries), {result["executed_flops"]:.3e} executed FLOPs per step; median of '
        f'{result["repeats"]} runs of {result["steps"]} steps, variants alternating')
  print(f'{"variant":>32} {"step ms":>9} {"pairs/s":>10} {"MFU":>7} {"x base":>7} '
        f'{"compile s":>9}')
  for v, r in result['variants'].items():
    if 'error' in r:
      print(f'{v:>32}  failed: {r["error"]}')
      continue
    mfu = f'{r["mfu"]:.1%}' if r['mfu'] is not None else 'n/a'
    speedup = f'{r["speedup_over_base"]:.3f}' if r['speedup_over_base'] else ''
    print(f'{v:>32} {r["step_s"] * 1e3:9.2f} {r["pairs_per_s"]:10.0f} {mfu:>7} '
          f'{speedup:>7} {r["compile_s"]:9.1f}')
  learning = result.get('learning')
  if learning and 'error' not in learning:
    print(f'learning: {learning["steps"]} steps on {learning["sessions"]:,} sessions of '
          f'{learning["corpus"]} ({learning["passes"]:.2f} passes); training loss, means of '
          f'{learning["window"]} steps:')
    for name, means in learning['window_means'].items():
      print(f'{name:>32} ' + ' '.join(f'{m:.4f}' for m in means))
    print(f'largest gap of those means from the base run: bf16 head gradients '
          f'{learning["max_window_gap_bf16_head"]:.4f}, another seed '
          f'{learning["max_window_gap_other_seed"]:.4f}; mean gap per step '
          f'{learning["mean_step_gap_bf16_head"]:.4f} and '
          f'{learning["mean_step_gap_other_seed"]:.4f}')
  elif learning:
    print(f'learning: {learning["error"]}')


def main(argv):
  cli.quiet_library_logs()  # JAX's INFO lines (no TPU found, ...) above the figures
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  parallel.set_cpu_devices(flags.FLAGS.cpu_devices)
  config, vocab_size, batch_queries = bench_train.config_and_sizes()
  report = bench_train.new_report(config, 'launch/bench_kernels.py')
  report['kernels'] = measure(
      config, vocab_size=vocab_size, batch_queries=batch_queries, bucket=_BUCKET.value,
      variants=_VARIANTS.value, steps=flags.FLAGS.steps, repeats=flags.FLAGS.repeats,
      seed=flags.FLAGS.seed, peak_flops_override=flags.FLAGS.peak_flops,
      corpus=_CORPUS.value, learn_steps=_LEARN_STEPS.value, learn_window=_LEARN_WINDOW.value,
      executed_flops=_EXECUTED_FLOPS.value)
  print_report(report['kernels'])
  bench_train.write_report(report, flags.FLAGS.json)


if __name__ == '__main__':
  bench_report.run(main)
