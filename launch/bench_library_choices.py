"""Three hand-written pieces of the training path against the library way, measured side by side.

  python launch/bench_library_choices.py --config=configs/demo.py
  python launch/bench_library_choices.py --config=configs/demo.py --steps=10 --repeats=7
  python launch/bench_library_choices.py --config=configs/demo.py --items=dropout --json=x.json

Every figure is taken in one process with the variants timed alternately (each repeat runs
every variant once, in an order rotated from repeat to repeat), so that a shared machine's
changing load falls on all of them alike; the ratios are paired, repeat by repeat (the
variant's run over the reference's run of the same repeat), and reported as their median and
range. A variant counts as measurably faster or slower only when every repeat agrees (and there
are two at least).

`--items` (default all three):

dropout -- the whole jit-compiled train step (`bench_train.JaxStep`: the trainer's
  `train.train_step`, donated state, the `parallel` mesh), milliseconds per step in the epoch
  mix of session-length buckets (`bench_train.epoch_mix`) on AOL-shaped synthetic batches, with
  each model's dropout layers being:
    'hand-written'            `mtn_jax.models.dropout.Dropout` (unrolled Threefry, 16-bit draws)
                              with JAX's default threefry2x32 keys, what the trainer runs;
    'nn.Dropout, unsafe_rbg'  `flax.linen.Dropout` with `jax_default_prng_impl='unsafe_rbg'`
                              (XLA's RngBitGenerator), as MaxText configures it;
    'nn.Dropout, threefry'    `flax.linen.Dropout` with the default keys;
    'hand-written, unsafe_rbg' the project's layer with unsafe_rbg keys (what the flag alone
                              changes: the key derivation of `train_step` and `make_rng`).
  The variant's class replaces the `Dropout` that the model modules (mtn_jax.models.*) import,
  and its key implementation is set, while its state is made and its step traced and compiled;
  both are restored afterwards, and the compiled steps are then timed alternately. Each
  variant's drop rate is checked on its own (a [4096, 64] mask), and its lowered step is
  searched for the library's mask ops (`_bernoulli`, `rng_bit_generator`) to show the
  replacement took.

prefetch -- batches put on the devices from `input_pipeline.make_train_iterator` over a
  synthetic AOL-size split (`--pipeline_sessions`) and `parallel.shard_batch`, by:
    'in the loop'             no prefetch: next() and shard_batch in the consuming thread;
    'hand-written thread'     the thread the trainer had before grain (`_HandWrittenPrefetcher`,
                              `config.input.prefetch_batches` ahead);
    'grain ThreadPrefetch'    grain's `ThreadPrefetchIterDataset` over the same iterator mapped
                              through shard_batch, `prefetch_batches` ahead: the library
                              equivalent of that thread, host-side session count included;
    'grain device_put'        `grain.experimental.device_put` as shipped (a CPU buffer of 4,
                              `jax.device_put` onto the batch sharding, a device buffer of 2).
  Figures: batches per second with nothing else running (`--pipeline_batches` per run), then
  milliseconds per train step when each feeds the real step (`--steps` steps per run, the
  same batches in the same order for every variant) against the same batches already on the
  devices, with the time the loop waited in next(). Exact resume is checked for each: the
  iterator state recorded with the k-th consumed batch, set on a fresh pipeline, must give
  batch k + 1.

metrics -- microseconds per `write` of 12 scalars (the trainer's log line), `--writes` per
  run: `metric_writer.MetricWriter` (JSONL + tensorboardX, both flushed per write) against
  tensorboardX alone (flushed per write, and as it comes, flushing every 120 s from its own
  thread) and the JSONL line alone; clu's writers and PyTorch's SummaryWriter are imported
  to report whether they are usable here.

From `launch/bench_train.py` (whose flags this script shares): `--config`, `--steps`,
`--repeats`, `--seed`, `--cpu_devices`, `--json`, `--vocab_size`, `--batch_queries`,
`--session_lengths`, `--pipeline_sessions`, `--pipeline_batches`; its other flags are refused.
Out, on stdout (and with `--json=PATH` as JSON too): the date, the exact command, the machine,
the config and the figures.
"""

from __future__ import annotations

# The benchmark reads bench_train's flags and JaxStep's compiled steps, and times the
# trainer's own prefetch thread.
# pylint: disable=protected-access

import contextlib
import importlib
import json
import os
import pkgutil
import queue
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from absl import app
from absl import flags
import flax.linen as nn
import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=g-import-not-at-top,wrong-import-position
from launch import bench_report
from launch import bench_train
from mtn_jax import cli
from mtn_jax import models
from mtn_jax import parallel
from mtn_jax.data import input_pipeline
from mtn_jax.models import dropout as project_dropout
from mtn_jax.training import metric_writer
# pylint: enable=g-import-not-at-top,wrong-import-position

SCRIPT = 'launch/bench_library_choices.py'
ITEMS = ('dropout', 'prefetch', 'metrics')

_ITEMS = flags.DEFINE_list('items', list(ITEMS), f'What to measure, of {", ".join(ITEMS)}.')
_WRITES = flags.DEFINE_integer('writes', 200, 'Metric writes per timed run.')
# bench_train's flags that this script reads; giving any other of them is refused.
_SHARED_FLAGS = ('config', 'steps', 'repeats', 'seed', 'cpu_devices', 'json', 'vocab_size',
                 'batch_queries', 'session_lengths', 'pipeline_sessions', 'pipeline_batches')

# name: (the Dropout class the models get, jax_default_prng_impl); the first is the reference.
DROPOUT_VARIANTS = {
    'hand-written': (project_dropout.Dropout, 'threefry2x32'),
    'nn.Dropout, unsafe_rbg': (nn.Dropout, 'unsafe_rbg'),
    'nn.Dropout, threefry': (nn.Dropout, 'threefry2x32'),
    'hand-written, unsafe_rbg': (project_dropout.Dropout, 'unsafe_rbg'),
}
PREFETCH_VARIANTS = ('in the loop', 'hand-written thread', 'grain ThreadPrefetch',
                     'grain device_put')
# What `train._TrainMonitor.write` logs every `log_every_steps`, plus the validation's
# perplexity: 12 scalars.
SCALARS = ('epoch', 'loss', 'nll', 'learning_rate', 'grad_norm', 'sessions_per_s',
           'pairs_per_s', 'tokens_per_s', 'steps_per_s', 'eta_s', 'compile_s', 'perplexity')


# ---------------------------------------------------------------------------------------------
# Timing


def rotated(names: list[str], repeat: int) -> list[str]:
  """`names` starting at position `repeat` (mod its length): each variant takes each place in
  the order of a repeat equally often."""
  shift = repeat % len(names)
  return names[shift:] + names[:shift]


def paired(runs: dict[str, list[float]], reference: str) -> dict[str, dict[str, float]]:
  """Per variant: the median of its runs, and its runs over the reference's runs of the same
  repeats (median, min, max), with a verdict that needs every repeat, two at least, to agree."""
  out = {}
  for name, times in runs.items():
    ratios = [t / r for t, r in zip(times, runs[reference])]
    verdict = ('reference' if name == reference else
               'one repeat: no verdict' if len(ratios) < 2 else
               'slower' if min(ratios) > 1 else 'faster' if max(ratios) < 1 else
               'no measurable difference')
    out[name] = {'median': statistics.median(times), 'ratio': statistics.median(ratios),
                 'ratio_min': min(ratios), 'ratio_max': max(ratios), 'verdict': verdict}
  return out


def ratio_text(p: dict[str, float]) -> str:
  if p['verdict'] == 'reference':
    return '1 (reference)'
  return f'{p["ratio"]:.3f} [{p["ratio_min"]:.3f}-{p["ratio_max"]:.3f}]'


# ---------------------------------------------------------------------------------------------
# 1. Dropout inside the train step


def _model_modules() -> list[Any]:
  """The model modules that import the project's `Dropout` by name (all of mtn_jax.models
  imported first, so that none is loaded later with the original)."""
  package = importlib.import_module('mtn_jax.models')
  for info in pkgutil.iter_modules(package.__path__):
    importlib.import_module(f'mtn_jax.models.{info.name}')
  found = [m for name, m in sorted(sys.modules.items())
           if name.startswith('mtn_jax.') and m is not None
           and getattr(m, 'Dropout', None) is project_dropout.Dropout]
  if not found:
    raise RuntimeError('no mtn_jax module imports mtn_jax.models.dropout.Dropout by name; '
                       'the dropout variants cannot be swapped in')
  return found


@contextlib.contextmanager
def dropout_variant(dropout_class: type[nn.Module], prng_impl: str) -> Iterator[None]:
  """The models' `Dropout` is `dropout_class` and new keys are `prng_impl`'s, inside."""
  modules = _model_modules()
  previous_impl = jax.config.jax_default_prng_impl
  jax.config.update('jax_default_prng_impl', prng_impl)
  for module in modules:
    module.Dropout = dropout_class
  try:
    yield
  finally:
    for module in modules:
      module.Dropout = project_dropout.Dropout
    jax.config.update('jax_default_prng_impl', previous_impl)


def drop_fraction(dropout_class: type[nn.Module], rate: float) -> float:
  """The share of a [4096, 64] mask that `dropout_class(rate)` drops, with the current keys."""
  layer = dropout_class(rate, deterministic=False)
  x = jnp.ones((4096, 64), jnp.float32)
  y = jax.jit(lambda key: layer.apply({}, x, rngs={'dropout': jax.random.fold_in(key, 1)}))(
      jax.random.PRNGKey(0))
  return float(jnp.mean(y == 0))


def library_ops(jax_step: bench_train.JaxStep, batch: dict[str, jax.Array]) -> dict[str, int]:
  """Counts of the library masks' ops in the step's lowered program (call sites of
  `jax.random.bernoulli` and RngBitGenerator ops)."""
  text = jax_step._step.lower(jax_step.state, batch).as_text()
  return {'bernoulli_calls': text.count('call @_bernoulli'),
          'rng_bit_generator': text.count('rng_bit_generator')}


def measure_dropout(config: ml_collections.ConfigDict, cfg, batches: dict[int, np.ndarray],
                    buckets: dict[int, dict], steps: int, repeats: int, seed: int
                    ) -> tuple[dict[str, Any], bench_train.JaxStep]:
  """Epoch-mix ms per train step for each of `DROPOUT_VARIANTS`; also returns the reference
  variant's compiled step, for the prefetch item to reuse."""
  jax_steps, on_device, info = {}, {}, {}
  for name, (dropout_class, prng_impl) in DROPOUT_VARIANTS.items():
    with dropout_variant(dropout_class, prng_impl):
      start = time.perf_counter()
      jax_step = bench_train.JaxStep(config, cfg, seed)
      on_device[name] = {k: jax_step.put(q) for k, q in batches.items()}
      for k in batches:
        jax_step.compile(on_device[name][k])
      info[name] = {'class': f'{dropout_class.__module__}.{dropout_class.__qualname__}',
                    'prng_impl': prng_impl, 'key_shape': list(jax_step.state.dropout_rng.shape),
                    'compile_s': time.perf_counter() - start,
                    'drop_fraction': drop_fraction(dropout_class, cfg.dropout),
                    **library_ops(jax_step, on_device[name][min(batches)])}
    jax_steps[name] = jax_step
    print(f'  compiled {name}: {info[name]["compile_s"]:.1f} s', flush=True)

  names = list(DROPOUT_VARIANTS)
  runs = {n: {k: [] for k in batches} for n in names}
  cpu_runs = {n: {k: [] for k in batches} for n in names}
  for repeat in range(repeats):
    for k in batches:
      for name in rotated(names, repeat):
        wall, cpu = jax_steps[name].run(on_device[name][k], steps)
        runs[name][k].append(wall)
        cpu_runs[name][k].append(cpu)

  def mix(per_bucket: dict[int, list[float]], repeat: int) -> float:
    shares = bench_train.step_shares(buckets)
    return sum(shares[k] * per_bucket[k][repeat] for k in buckets)

  mixed = {n: [mix(runs[n], r) for r in range(repeats)] for n in names}
  mixed_cpu = {n: [mix(cpu_runs[n], r) for r in range(repeats)] for n in names}
  wall, cpu = paired(mixed, names[0]), paired(mixed_cpu, names[0])
  result = {}
  for name in names:
    result[name] = {**info[name], 'step_s': wall[name], 'cpu_step_s': cpu[name],
                    'step_s_runs': mixed[name], 'cpu_step_s_runs': mixed_cpu[name],
                    'bucket_step_s': {str(k): statistics.median(runs[name][k])
                                      for k in batches}}
  return result, jax_steps[names[0]]


def print_dropout(result: dict[str, Any], rate: float) -> None:
  print(f'\n1. Dropout (rate {rate}) inside the train step, epoch mix; ratio = variant / '
        'hand-written, median [range] of the paired repeats')
  print(f'{"variant":>26} {"key":>7} {"drops":>7} {"bern/rbg":>8} {"ms/step":>8} '
        f'{"ratio":>21} {"CPU ms":>8} {"CPU ratio":>21}  verdict (wall / CPU)')
  for name, r in result.items():
    ops = f'{r["bernoulli_calls"]}/{r["rng_bit_generator"]}'
    print(f'{name:>26} {"x".join(map(str, r["key_shape"])):>7} {r["drop_fraction"]:7.4f} '
          f'{ops:>8} {r["step_s"]["median"] * 1e3:8.2f} {ratio_text(r["step_s"]):>21} '
          f'{r["cpu_step_s"]["median"] * 1e3:8.2f} {ratio_text(r["cpu_step_s"]):>21}  '
          f'{r["step_s"]["verdict"]} / {r["cpu_step_s"]["verdict"]}')
  print('key: the dropout key words; drops: the share a [4096, 64] mask drops; bern/rbg: '
        'jax.random.bernoulli call sites / RngBitGenerator ops in the lowered step')


# ---------------------------------------------------------------------------------------------
# 2. Device prefetch


class _FromIterator(grain.IterDataset):
  """An IterDataset whose iterator is `make()`: lets grain's transformations wrap the
  iterator `input_pipeline.make_train_iterator` returns, unchanged."""

  def __init__(self, make: Callable[[], grain.DatasetIterator]):
    super().__init__()
    self._make = make

  def __iter__(self) -> grain.DatasetIterator:
    return self._make()


class _HandWrittenPrefetcher:
  """The trainer's device prefetch before it became grain's thread prefetch, kept here as the
  measured reference: a thread puts batches on the devices `size` ahead, each with the
  iterator state right after it and its number of real sessions."""

  def __init__(self, iterator, mesh, size: int, keys: tuple[str, ...]):
    self._iterator, self._mesh, self._keys = iterator, mesh, keys
    self._queue: queue.Queue = queue.Queue(maxsize=max(size, 1))
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._fill, daemon=True)
    self._thread.start()

  def _fill(self):
    try:
      while not self._stop.is_set():
        batch = next(self._iterator)
        item = (parallel.shard_batch({k: batch[k] for k in self._keys}, self._mesh),
                self._iterator.get_state(), int((batch['session_ids'] >= 0).sum()))
        while not self._stop.is_set():
          try:
            self._queue.put(item, timeout=0.1)
            break
          except queue.Full:
            pass
    except Exception as e:  # pylint: disable=broad-except
      self._queue.put(e)

  def __next__(self):
    item = self._queue.get()
    if isinstance(item, Exception):
      raise item
    return item

  def close(self):
    self._stop.set()
    self._thread.join(timeout=5)


class _Pipeline:
  """One way of putting training batches on the devices: `next()` -> (batch dict on the
  devices, the iterator state recorded with it); `set_state` before the first `next()`."""

  def __init__(self, variant: str, make_iterator: Callable[[], grain.DatasetIterator], mesh,
               prefetch: int, keys: tuple[str, ...]):
    self.variant = variant
    shard = lambda b: parallel.shard_batch({k: b[k] for k in keys}, mesh)
    self._closers: list[Callable[[], None]] = []
    if variant in ('in the loop', 'hand-written thread'):
      self._iterator = make_iterator()
      self._closers.append(self._iterator.close)
    elif variant == 'grain ThreadPrefetch':
      # (batch on the devices, its real sessions): what `_Prefetcher` hands the trainer.
      dataset = _FromIterator(make_iterator).map(
          lambda b: (shard(b), int((b['session_ids'] >= 0).sum())))
      self._iterator = iter(grain.experimental.ThreadPrefetchIterDataset(
          dataset, prefetch_buffer_size=prefetch))
      self._closers.append(self._iterator.close)
    elif variant == 'grain device_put':
      dataset = _FromIterator(make_iterator).map(lambda b: {k: b[k] for k in keys})
      self._iterator = iter(grain.experimental.device_put(dataset,
                                                          parallel.batch_sharding(mesh)))
      self._closers.append(self._iterator.close)
    else:
      raise ValueError(f'unknown prefetch variant {variant!r}')
    self._shard, self._mesh, self._prefetch, self._keys = shard, mesh, prefetch, keys
    self._prefetcher = None

  def set_state(self, state: dict) -> None:
    self._iterator.set_state(state)

  def next(self) -> tuple[dict[str, jax.Array], dict]:
    if self.variant == 'in the loop':
      batch = next(self._iterator)
      return self._shard(batch), self._iterator.get_state()
    if self.variant == 'hand-written thread':
      if self._prefetcher is None:  # started here, so that set_state comes first
        self._prefetcher = _HandWrittenPrefetcher(
            self._iterator, self._mesh, self._prefetch, self._keys)
        self._closers.insert(0, self._prefetcher.close)
      batch, state, _ = next(self._prefetcher)
      return batch, state
    element = next(self._iterator)
    batch = element[0] if self.variant == 'grain ThreadPrefetch' else element
    return batch, self._iterator.get_state()

  def close(self) -> None:
    for close in self._closers:
      close()


def exact_resume(make_pipeline: Callable[[], _Pipeline], consumed: int) -> bool:
  """Whether the state recorded with the `consumed`-th batch, set on a fresh pipeline, gives
  the batch that followed it."""
  first = make_pipeline()
  for _ in range(consumed):
    _, state = first.next()
  following, _ = first.next()
  first.close()
  second = make_pipeline()
  second.set_state(state)
  resumed, _ = second.next()
  second.close()
  return all(np.array_equal(np.asarray(following[k]), np.asarray(resumed[k]))
             for k in following)


def measure_prefetch(config: ml_collections.ConfigDict, jax_step: bench_train.JaxStep,
                     vocab_size: int, batch_queries: int, steps: int, repeats: int,
                     num_sessions: int, num_batches: int, seed: int) -> dict[str, Any]:
  """Batches/s of each of `PREFETCH_VARIANTS` alone, ms per train step fed by each, and
  whether each resumes exactly."""
  mesh = jax_step.mesh
  keys = ('queries',)
  start = time.perf_counter()
  split = bench_train.synthetic_split(np.random.default_rng(seed), num_sessions,
                                      config.data.max_query_words, vocab_size)
  built = time.perf_counter() - start

  def make_iterator():
    return input_pipeline.make_train_iterator(
        split, queries_per_batch=batch_queries, seed=seed, multiple_of=jax.device_count(),
        process_index=jax.process_index(), process_count=jax.process_count(),
        worker_count=config.input.worker_count)

  prefetch = config.input.prefetch_batches
  make = {v: (lambda v=v: _Pipeline(v, make_iterator, mesh, prefetch, keys))
          for v in PREFETCH_VARIANTS}
  resume = {v: exact_resume(make[v], consumed=5) for v in PREFETCH_VARIANTS}

  # The step for every batch shape the pipeline makes, and batches 1..steps on the devices:
  # the no-input reference, and the batches every variant feeds after its untimed first
  # (which plans the epoch and starts its threads).
  reference = make['in the loop']()
  resident = [reference.next()[0] for _ in range(steps + 1)][1:]
  reference.close()
  for batch in resident:
    if batch['queries'].shape not in jax_step._compiled:
      jax_step.compile(batch)

  def producer_run(variant: str) -> tuple[float, float]:
    pipeline = make[variant]()
    pipeline.next()  # plans the epoch, starts the threads
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(num_batches):
      batch, _ = pipeline.next()
      batch['queries'].block_until_ready()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    pipeline.close()
    return wall / num_batches, cpu / num_batches

  def step_run(variant: str) -> tuple[float, float, float]:
    """(wall, CPU, waiting in next()) seconds per step over `steps` steps."""
    pipeline = None if variant == 'on the devices' else make[variant]()
    if pipeline is not None:
      pipeline.next()
    compiled = jax_step._compiled
    waited = 0.0
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(steps):
      asked = time.perf_counter()
      batch = resident[i] if pipeline is None else pipeline.next()[0]
      waited += time.perf_counter() - asked
      jax_step.state, sums = compiled[batch['queries'].shape](jax_step.state, batch)
    jax.block_until_ready((jax_step.state, sums))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if pipeline is not None:
      pipeline.close()
    return wall / steps, cpu / steps, waited / steps

  producer = {v: {'wall': [], 'cpu': []} for v in PREFETCH_VARIANTS}
  step_names = ['on the devices', *PREFETCH_VARIANTS]
  stepped = {v: {'wall': [], 'cpu': [], 'wait': []} for v in step_names}
  for repeat in range(repeats):
    for variant in rotated(list(PREFETCH_VARIANTS), repeat):
      for key, value in zip(('wall', 'cpu'), producer_run(variant)):
        producer[variant][key].append(value)
    for variant in rotated(step_names, repeat):
      for key, value in zip(('wall', 'cpu', 'wait'), step_run(variant)):
        stepped[variant][key].append(value)

  producer_wall = paired({v: r['wall'] for v, r in producer.items()}, 'hand-written thread')
  step_wall = paired({v: r['wall'] for v, r in stepped.items()}, 'on the devices')
  step_cpu = paired({v: r['cpu'] for v, r in stepped.items()}, 'on the devices')
  return {
      'split': {'sessions': split.num_sessions, 'pairs': split.num_pairs, 'build_s': built},
      'prefetch_batches': prefetch, 'batches_per_run': num_batches, 'steps_per_run': steps,
      'resident_shapes': sorted({tuple(b['queries'].shape) for b in resident}),
      'producer': {v: {'batch_s': producer_wall[v],
                       'batches_per_s': 1 / producer_wall[v]['median'],
                       'cpu_batch_s': statistics.median(producer[v]['cpu']),
                       'exact_resume': resume[v]} for v in PREFETCH_VARIANTS},
      'with_step': {v: {'step_s': step_wall[v], 'cpu_step_s': step_cpu[v],
                        'wait_s': statistics.median(stepped[v]['wait']),
                        'wait_s_max': max(stepped[v]['wait'])} for v in step_names}}


def print_prefetch(result: dict[str, Any]) -> None:
  split = result['split']
  print(f'\n2. Device prefetch: make_train_iterator over {split["sessions"]:,} synthetic '
        f'sessions + shard_batch, prefetch_batches {result["prefetch_batches"]}')
  print(f'alone ({result["batches_per_run"]} batches per run; ratio = time per batch over '
        "the hand-written thread's):")
  print(f'{"variant":>22} {"batches/s":>10} {"ms/batch":>9} {"ratio":>21} {"CPU ms":>8} '
        f'{"exact resume":>13}')
  for name, r in result['producer'].items():
    print(f'{name:>22} {r["batches_per_s"]:10.0f} {r["batch_s"]["median"] * 1e3:9.3f} '
          f'{ratio_text(r["batch_s"]):>21} {r["cpu_batch_s"] * 1e3:8.3f} '
          f'{str(r["exact_resume"]):>13}')
  print(f'feeding the train step ({result["steps_per_run"]} steps per run, shapes '
        f'{", ".join("x".join(map(str, s)) for s in result["resident_shapes"])}; ratio = '
        'over the same batches already on the devices):')
  print(f'{"variant":>22} {"ms/step":>8} {"ratio":>21} {"CPU ms":>8} {"CPU ratio":>21} '
        f'{"wait ms":>8} {"max":>7}')
  for name, r in result['with_step'].items():
    print(f'{name:>22} {r["step_s"]["median"] * 1e3:8.2f} {ratio_text(r["step_s"]):>21} '
          f'{r["cpu_step_s"]["median"] * 1e3:8.2f} {ratio_text(r["cpu_step_s"]):>21} '
          f'{r["wait_s"] * 1e3:8.3f} {r["wait_s_max"] * 1e3:7.3f}')


# ---------------------------------------------------------------------------------------------
# 3. Metric writing


class _TensorboardX:
  """tensorboardX's SummaryWriter alone, as `MetricWriter` calls it."""

  def __init__(self, workdir: str, flush: bool):
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
    self._tb, self._flush = SummaryWriter(os.path.join(workdir, 'tensorboard')), flush

  def write(self, step: int, kind: str, scalars: dict[str, float]) -> None:
    for k, v in scalars.items():
      self._tb.add_scalar(f'{kind}/{k}', float(v), int(step))
    if self._flush:
      self._tb.flush()

  def close(self) -> None:
    self._tb.close()


class _JsonlOnly:
  """The JSONL half of `MetricWriter` (the file `metric_writer.read_metrics` reads)."""

  def __init__(self, workdir: str):
    os.makedirs(workdir, exist_ok=True)
    self._file = open(os.path.join(workdir, 'metrics.jsonl'), 'a', encoding='utf-8')

  def write(self, step: int, kind: str, scalars: dict[str, float]) -> None:
    record = {'kind': kind, 'step': int(step), 'time': time.time(),
              **{k: float(v) for k, v in scalars.items()}}
    self._file.write(json.dumps(record) + '\n')
    self._file.flush()

  def close(self) -> None:
    self._file.close()


METRIC_VARIANTS = {
    'MetricWriter': lambda d: metric_writer.MetricWriter(d, enabled=True),
    'tensorboardX, flushed': lambda d: _TensorboardX(d, flush=True),
    'tensorboardX, unflushed': lambda d: _TensorboardX(d, flush=False),
    'JSONL alone': _JsonlOnly,
}


def _import_error(module: str) -> str | None:
  """None if `module` imports, else the error it raises."""
  try:
    importlib.import_module(module)
  except Exception as e:  # pylint: disable=broad-except
    return f'{type(e).__name__}: {e}'
  return None


def measure_metrics(writes: int, repeats: int) -> dict[str, Any]:
  """Microseconds per write of `SCALARS` for each of `METRIC_VARIANTS`, and what each leaves
  on disk."""
  root = tempfile.mkdtemp(prefix='bench_library_choices_')
  try:
    writers = {n: make(os.path.join(root, n.replace(' ', '_').replace(',', '')))
               for n, make in METRIC_VARIANTS.items()}
    scalars = {name: 1.0 + i / 7 for i, name in enumerate(SCALARS)}
    step = {n: 0 for n in writers}
    for name, writer in writers.items():  # warm-up: the first event file record, imports
      writer.write(0, 'train', scalars)
    runs = {n: {'wall': [], 'cpu': []} for n in writers}
    for repeat in range(repeats):
      for name in rotated(list(writers), repeat):
        writer = writers[name]
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(writes):
          step[name] += 1
          writer.write(step[name], 'train', scalars)
        runs[name]['wall'].append((time.perf_counter() - wall) / writes)
        runs[name]['cpu'].append((time.process_time() - cpu) / writes)
    for writer in writers.values():
      writer.close()
    files = {}
    for name in writers:
      folder = os.path.join(root, name.replace(' ', '_').replace(',', ''))
      files[name] = sorted(os.path.relpath(os.path.join(d, f), folder)
                           for d, _, fs in os.walk(folder) for f in fs)
    records = len(metric_writer.read_metrics(os.path.join(root, 'MetricWriter')))
  finally:
    shutil.rmtree(root, ignore_errors=True)
  wall = paired({n: r['wall'] for n, r in runs.items()}, 'MetricWriter')
  cpu = paired({n: r['cpu'] for n, r in runs.items()}, 'MetricWriter')
  return {'scalars': len(SCALARS), 'writes_per_run': writes,
          'read_back_by_read_metrics': records,
          'variants': {n: {'write_s': wall[n], 'cpu_write_s': cpu[n], 'files': files[n]}
                       for n in writers},
          'unavailable': {m: _import_error(m) for m in
                          ('clu.metric_writers', 'torch.utils.tensorboard')}}


def print_metrics(result: dict[str, Any]) -> None:
  print(f'\n3. Metric writing: one write of {result["scalars"]} scalars, '
        f'{result["writes_per_run"]} writes per run; ratio = over MetricWriter\'s')
  print(f'{"variant":>24} {"us/write":>9} {"ratio":>21} {"CPU us":>8}  files')
  for name, r in result['variants'].items():
    print(f'{name:>24} {r["write_s"]["median"] * 1e6:9.1f} {ratio_text(r["write_s"]):>21} '
          f'{r["cpu_write_s"]["median"] * 1e6:8.1f}  {", ".join(r["files"])}')
  print(f'metric_writer.read_metrics read back {result["read_back_by_read_metrics"]} records '
        "of MetricWriter's JSONL")
  for module, error in result['unavailable'].items():
    print(f'{module}: {"imports" if error is None else "unusable here, " + error}')


# ---------------------------------------------------------------------------------------------
# Main


def run() -> dict[str, Any]:
  """Measures what the flags ask for; prints it and returns it as `--json` writes it."""
  given = [f.name for f in flags.FLAGS.get_key_flags_for_module(bench_train.__name__)
           if f.present and f.name not in _SHARED_FLAGS]
  if given:
    raise app.UsageError(f'{SCRIPT} does not use --{", --".join(given)}')
  items = list(dict.fromkeys(_ITEMS.value))
  if not items or set(items) - set(ITEMS):
    raise app.UsageError(f'--items must be some of {", ".join(ITEMS)}, got {items}')
  steps, repeats = bench_train._STEPS.value, bench_train._REPEATS.value
  if steps < 1 or repeats < 1 or _WRITES.value < 1:
    raise app.UsageError('--steps, --repeats and --writes must be positive')
  config, vocab_size, batch_queries = bench_train.config_and_sizes()
  seed = bench_train._SEED.value
  session_lengths = [int(k) for k in bench_train._SESSION_LENGTHS.value]
  report = {**bench_train.new_report(config, SCRIPT), 'items': items, 'steps': steps,
            'repeats': repeats}
  started = time.perf_counter()
  m = config.model
  print(f'libraries: flax {_version("flax")}, grain {_version("grain")}, tensorboardX '
        f'{_version("tensorboardX")}')
  print(f'config: {bench_train.config_args()[0][len("--config="):]}: {m.name}, d_model '
        f'{m.d_model}, emb {m.emb_dim}, ff {m.ff_dim}, {m.num_heads} heads, layers '
        f'{m.query_layers}Q/{m.session_layers}S/{m.decoder_layers}D, {m.compute_dtype}, '
        f'dropout {m.dropout}; vocabulary {vocab_size:,}; {batch_queries} query slots per '
        f'batch; prefetch_batches {config.input.prefetch_batches}, worker_count '
        f'{config.input.worker_count}; median of {repeats} alternating repeats', flush=True)

  cfg = models.make_config(config.model, vocab_size=vocab_size,
                           max_query_words=config.data.max_query_words)
  jax_step = None
  if 'dropout' in items:
    mix = bench_train.length_mix(session_lengths)
    rng = np.random.default_rng(seed)
    rows = input_pipeline.bucket_batch_sizes(np.array(list(mix)), batch_queries,
                                             jax.device_count())
    batches = {k: bench_train.synthetic_queries(rng, (rows[k], k), cfg.max_query_words,
                                                vocab_size) for k in mix}
    buckets = {k: {'share': mix[k], 'sessions': rows[k]} for k in mix}
    report['dropout'], jax_step = measure_dropout(config, cfg, batches, buckets, steps,
                                                  repeats, seed)
    report['dropout_shapes'] = {str(k): list(q.shape) for k, q in batches.items()}
    print_dropout(report['dropout'], cfg.dropout)
  if 'prefetch' in items:
    if jax_step is None:
      jax_step = bench_train.JaxStep(config, cfg, seed)
    report['prefetch'] = measure_prefetch(
        config, jax_step, vocab_size, batch_queries, steps, repeats,
        bench_train._PIPELINE_SESSIONS.value, bench_train._PIPELINE_BATCHES.value, seed)
    print_prefetch(report['prefetch'])
  if 'metrics' in items:
    report['metrics'] = measure_metrics(_WRITES.value, repeats)
    print_metrics(report['metrics'])
  report['seconds'] = time.perf_counter() - started
  report['load_average_1min_after'] = round(os.getloadavg()[0], 2)
  print(f'\ntook {report["seconds"]:.0f} s; load average after {report["load_average_1min_after"]}')
  bench_train.write_report(report, bench_train._JSON.value)
  return report


def _version(package: str) -> str:
  return getattr(importlib.import_module(package), '__version__', '?')


def main(argv):
  cli.quiet_library_logs()  # JAX's INFO lines (no TPU found, ...) above the figures
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  parallel.set_cpu_devices(bench_train._CPU_DEVICES.value)
  run()


if __name__ == '__main__':
  flags.mark_flags_as_required(['config'])
  bench_report.run(main)
