"""Training throughput of the real train step on AOL-shaped batches, and the harness's other parts.

  python launch/bench_train.py --config=configs/demo.py --peer
  python launch/bench_train.py --config=configs/aol.py --json=/tmp/bench_aol.json
  python launch/bench_train.py --config=configs/demo.py --check_equivalence
  python launch/bench_train.py --config=configs/aol.py --what=all

In: a config (model, optimizer and `input.train_queries_per_batch`; `--batch_queries`
overrides it) and flags. No data is read: sessions are synthetic but AOL-shaped --
  - 3, 4 or 5 queries in the mix 55 % / 27 % / 18 % (`SESSION_LENGTH_MIX`), which gives the
    2.63 pairs per session of AOL's training split (paper Table 1: 4,285,507 pairs over
    1,628,433 sessions);
  - queries of 1 to `max_query_words` words, in the word-count mix of the real AOL sample
    (`QUERY_WORDS_MIX`, mean 2.95 words), random ordinary word ids;
  - a vocabulary of `--vocab_size` words: by default the paper's 76,604 for an 'aol' data
    source, else the real vocabulary of the config's demo corpus (built in a temporary folder);
  - per session length, `input_pipeline.bucket_batch_sizes` sessions per batch, as in training.

`--what=train` (the default) measures, per session-length bucket, the jit-compiled
`train.train_step` as the trainer runs it (donated state, replicated on the `parallel` mesh,
the batch split over it): each bucket's shape is compiled and run once before timing, then
`--repeats` runs of `--steps` steps, of which the median counts. The buckets combine in
the proportions of an epoch (each bucket's share of sessions over its batch size). Out, on
stdout (and with `--json=PATH` as JSON too), with the machine, the config, the date and the
command:
  - per bucket and for the epoch mix: seconds per step (wall, and the process's CPU seconds,
    steadier on a shared machine), sessions/s, pairs/s, target tokens/s;
  - FLOPs per step (`step_flops`: executed, and on the padded batch) and MFU against the
    device's peak (`PEAK_FLOPS`, or `--peak_flops`), from the executed FLOPs;
  - peak device memory (`peak_bytes_in_use`), or on a CPU the process's peak RSS;
  - the time of one AOL epoch (`--epoch_pairs`, 4,285,507 pairs) at the measured pairs/s;
  - the input pipeline: `input_pipeline.make_train_iterator` over a synthetic AOL-size split
    plus `parallel.shard_batch`, seconds per batch against the step's, so that a slower
    producer than consumer shows;
  - with `--peer`, the PyTorch peer (`launch/torch_mtn.py`) on the same batches, timed
    alternately with the JAX step, and the throughput ratios (per wall and per CPU second);
  - with `--check_equivalence`, the JAX and peer losses from the same weights.
`--what=decode` and `--what=preprocess` run `launch/bench_decode.py` and
`launch/bench_preprocess.py` with this config and vocabulary, each in a process of its own
(their absl flags clash with these); `--what=all` runs all three.
To compare one core against one core: XLA_FLAGS='--xla_cpu_multi_thread_eigen=false
intra_op_parallelism_threads=1' with `--peer_threads=1`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=g-import-not-at-top,wrong-import-position
from mtn_jax import cli
from mtn_jax import config_lib
from mtn_jax import models
from mtn_jax import parallel
from mtn_jax import tasks
from mtn_jax.data import input_pipeline
from mtn_jax.data import preprocess
from mtn_jax.data.sessions import SessionSplit
from mtn_jax.training import train
from launch import bench_report
from launch.synthetic_batches import model_inputs, synthetic_queries
from mtn_jax.models.base import ModelConfig
# pylint: enable=g-import-not-at-top,wrong-import-position

LAUNCH_DIR = os.path.dirname(os.path.abspath(__file__))

# AOL's training split (paper Table 1) and vocabulary (Sec. 5.1).
AOL_TRAIN_SESSIONS = 1_628_433
AOL_TRAIN_PAIRS = 4_285_507
AOL_VOCAB_SIZE = 76_604
# Sessions of 3 / 4 / 5 queries: 0.55 * 2 + 0.27 * 3 + 0.18 * 4 = 2.63 pairs per session, the
# 4,285,507 / 1,628,433 of Table 1 (the paper gives no finer breakdown).
SESSION_LENGTH_MIX = {3: 0.55, 4: 0.27, 5: 0.18}
# Dense bfloat16 peak FLOP/s per device, matched against `device_kind` in order. The MFU is
# measured against it whatever the compute dtype, as is usual.
PEAK_FLOPS = (
    ('H100 PCIe', 756e12),
    ('H100', 989e12),  # SXM
    ('H200', 989e12),
    ('A100', 312e12),
)

CONFIG_FLAG = config_flags.DEFINE_config_file('config', None, 'Config file (path[:variant]).',
                                          lock_config=True)
_WHAT = flags.DEFINE_enum('what', 'train', ['train', 'decode', 'preprocess', 'all'],
                          'Which throughput to measure.')
_VOCAB_SIZE = flags.DEFINE_integer(
    'vocab_size', None, 'Vocabulary size; default: 76,604 (AOL) for an aol data source, else '
    "the real vocabulary size of the config's demo corpus.")
_BATCH_QUERIES = flags.DEFINE_integer(
    'batch_queries', None, 'Query slots per batch; default config.input.train_queries_per_batch.')
_SESSION_LENGTHS = flags.DEFINE_list(
    'session_lengths', ['3', '4', '5'], 'Session-length buckets to time (of 3, 4, 5); the '
    'epoch mix is renormalised over them.')
bench_report.positive_list('session_lengths')
_STEPS = flags.DEFINE_integer('steps', 20, 'Steps per timed run.')
_STEPS_PER_CALL = flags.DEFINE_integer(
    'steps_per_call', 1, 'Optimizer steps per compiled call: k > 1 scans the step over k '
    'batches of a bucket stacked [k, ...], so the host dispatches once per k steps.')
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Timed runs per bucket; the median counts.')
_PEER = flags.DEFINE_bool('peer', False, 'Also time the PyTorch peer on the same batches.')
_PEER_THREADS = flags.DEFINE_integer(
    'peer_threads', 0, "PyTorch's intra-op threads; 0: torch's default (the physical cores).")
_PEER_MODES = flags.DEFINE_list(
    'peer_modes', None, 'Peer variants: eager and/or compiled (torch.compile); default eager '
    'on a CPU, both on a GPU.')
flags.register_validator('peer_modes', lambda modes: modes is None or (
    bool(modes) and set(modes) <= {'eager', 'compiled'}), message='expected eager and/or compiled')
_CHECK_EQUIVALENCE = flags.DEFINE_bool(
    'check_equivalence', False, 'Copy the Flax weights into the PyTorch peer and compare the '
    'losses on one batch (dropout off), before and after one optimizer step.')
_PEAK_FLOPS = flags.DEFINE_float(
    'peak_flops', 0.0, "Peak FLOP/s of one device for the MFU; 0: from PEAK_FLOPS by the "
    "device's kind (none for CPUs).")
_EPOCH_PAIRS = flags.DEFINE_integer('epoch_pairs', AOL_TRAIN_PAIRS,
                                    'Pairs of the epoch whose time is projected.')
_PIPELINE_SESSIONS = flags.DEFINE_integer(
    'pipeline_sessions', AOL_TRAIN_SESSIONS, 'Sessions of the synthetic split fed through the '
    'input pipeline; 0: skip that measurement.')
_PIPELINE_BATCHES = flags.DEFINE_integer('pipeline_batches', 50,
                                         'Input-pipeline batches timed.')
_PREPROCESS_LINES = flags.DEFINE_integer('preprocess_lines', 3_600_000,
                                         'Log lines of --what=preprocess.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the synthetic data, weights and dropout.')
_CPU_DEVICES = flags.DEFINE_integer(
    'cpu_devices', 0, 'JAX devices of a CPU-only host, as the trainer\'s --cpu_devices: 0 = one '
    'per core (the default there too), 1 = one device for all cores.')
_JSON = flags.DEFINE_string('json', '', 'Also write the figures to this JSON file.')


# ---------------------------------------------------------------------------------------------
# Synthetic AOL-shaped data


def length_mix(lengths: list[int]) -> dict[int, float]:
  """`SESSION_LENGTH_MIX` restricted to `lengths` and renormalised."""
  unknown = sorted(set(lengths) - set(SESSION_LENGTH_MIX))
  if unknown or not lengths:
    raise ValueError(f'--session_lengths must be some of {sorted(SESSION_LENGTH_MIX)}, got '
                     f'{lengths}')
  total = sum(SESSION_LENGTH_MIX[k] for k in lengths)
  return {k: SESSION_LENGTH_MIX[k] / total for k in sorted(set(lengths))}


def synthetic_split(rng: np.random.Generator, num_sessions: int, max_words: int,
                    vocab_size: int) -> SessionSplit:
  """A training split of `num_sessions` sessions in `SESSION_LENGTH_MIX`."""
  mix = length_mix(list(SESSION_LENGTH_MIX))
  lengths = rng.choice(list(mix), size=num_sessions, p=list(mix.values()))
  starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
  queries = synthetic_queries(rng, (int(starts[-1]),), max_words, vocab_size)
  return SessionSplit('train', queries, starts)


def default_vocab_size(config: ml_collections.ConfigDict) -> int:
  """76,604 (AOL) for an 'aol' data source; else the config's demo corpus's real vocabulary."""
  if config.data.source == 'aol':
    return AOL_VOCAB_SIZE
  with tempfile.TemporaryDirectory(prefix='bench_train_vocab_') as workdir:
    return int(preprocess.prepare(config, workdir)['vocab_size'])


# ---------------------------------------------------------------------------------------------
# Machine


def peak_flops(device: jax.Device, override: float) -> float | None:
  if override > 0:
    return override
  for kind, flops in PEAK_FLOPS:
    if kind in device.device_kind:
      return flops
  return None


def peak_memory() -> dict[str, Any]:
  """Peak device memory where the device reports it, else the process's peak RSS."""
  stats = jax.devices()[0].memory_stats() or {}
  if 'peak_bytes_in_use' in stats:
    return {'bytes': int(stats['peak_bytes_in_use']),
            'what': 'peak device memory (device 0, peak_bytes_in_use)'}
  # Linux reports ru_maxrss in KiB.
  return {'bytes': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
          'what': 'process peak RSS (the device reports no memory statistics)'}


def config_args() -> list[str]:
  """`--config=FILE` and its `--config.key=value` overrides, as given."""
  return bench_report.config_args(CONFIG_FLAG.name)


def command_line(script: str = 'launch/bench_train.py') -> str:
  """The command that ran: the config and every flag of this module or of the script that
  imports it which was given on the command line."""
  return bench_report.command_line(script, (__name__, '__main__'), CONFIG_FLAG.name)


# ---------------------------------------------------------------------------------------------
# The JAX train step


def step_function(task: tasks.GenerationTask, optimizer, mesh=None):
  """`train.train_step` with the static arguments the trainer binds, ready for `jax.jit`."""
  train_fn, _ = train.make_steps(task, optimizer, mesh or parallel.make_mesh())
  return train_fn


def step_flops(model_cfg: ModelConfig, config: ml_collections.ConfigDict,
               queries: np.ndarray) -> dict[str, float]:
  """FLOPs of one train step on the batch `queries` int32 [B, S, n].

  XLA's cost analysis counts a loop's body once, so a scanned layer stack would count as one
  layer and the loss head's loop over chunks as one chunk. The counts come from the same step
  lowered (not compiled) with Python-loop layer stacks (the same function, `LayerStack`):
    'padded': the loss head in one chunk spanning every target slot, the model's arithmetic
      on the padded batch, what a plain implementation computes;
    'executed': what the trainer's step computes on this batch: the loss head visits only
      the chunks of `config.train.loss_chunk_tokens` slots that hold a real target (per
      device group, as `losses.output_layer_losses` does), each costing the per-slot cost
      (from the two lowerings) times its slots. GFLOP/s and MFU use this count.
  """
  # The kernel choices (`config.model.kernels`) change how a step runs, not the model's
  # arithmetic: the plain step's is counted.
  plain = {'kernels': ''} if 'kernels' in model_cfg.field_names() else {}
  task = tasks.make_task(model_cfg.replace(scan_layers=False, **plain), config.train)
  optimizer = train.make_optimizer(config.train, config.model.get('d_model'))
  mesh = parallel.make_mesh()
  cpus = jax.devices('cpu')
  if jax.default_backend() != 'cpu' and len(cpus) >= mesh.size:
    # GPU plugins have no cost analysis before compilation (it returns None), and compiling
    # the two extra programs per bucket costs minutes; the lowered program is the same on
    # the host's CPU backend, with as many data groups.
    mesh = jax.sharding.Mesh(np.array(cpus[:mesh.size]), ('data',),
                             axis_types=(jax.sharding.AxisType.Auto,))
  abstract_state = train.abstract_state(task, optimizer, mesh)

  def lowered_flops(chunk_tokens: int) -> float:
    step = jax.jit(step_function(dataclasses.replace(task, chunk_tokens=chunk_tokens),
                                 optimizer, mesh))
    inputs = model_inputs(task, queries, config.data.history_queries)
    batch_sharding = parallel.batch_sharding(mesh)
    lowered = step.lower(abstract_state, {
        k: jax.ShapeDtypeStruct(v.shape, jnp.int32, sharding=batch_sharding)
        for k, v in inputs.items()})
    analysis = lowered.cost_analysis() or lowered.compile().cost_analysis()
    return float(analysis['flops'])

  groups = mesh.size
  _, _, weights = models.decoder_io(jnp.asarray(queries))
  slots = weights.size // groups  # target slots per group
  chunk = min(config.train.loss_chunk_tokens, slots)
  padded = lowered_flops(slots)
  if chunk == slots:
    return {'padded': padded, 'executed': padded}
  one_chunk = lowered_flops(chunk)
  per_slot = (padded - one_chunk) / (slots - chunk)
  most_real = int(np.asarray(weights > 0).reshape(groups, -1).sum(1).max())
  chunks = -(-most_real // chunk)
  return {'padded': padded, 'executed': one_chunk + (chunks - 1) * chunk * per_slot}


def per_step_times(run_steps: Callable[[], None], steps: int) -> tuple[float, float]:
  """(wall, process CPU) seconds per step of `run_steps`, which runs `steps` steps.

  On a machine shared with other jobs, CPU seconds do not count the time spent waiting for
  a core, so they vary less with the load than wall seconds; they count every thread's work,
  spinning included.
  """
  wall, cpu = time.perf_counter(), time.process_time()
  run_steps()
  return (time.perf_counter() - wall) / steps, (time.process_time() - cpu) / steps


class JaxStep:
  """`train.train_step` jit-compiled as the trainer compiles it, per batch shape, ahead of time.

  With `steps_per_call` k > 1, one compiled call runs k optimizer steps: a `lax.scan` of the
  same step over k batches stacked on a leading axis ([k, B, ...], the batch axis still split
  over the devices), so the host dispatches one program per k steps instead of one per step.
  """

  def __init__(self, config: ml_collections.ConfigDict, cfg: ModelConfig, seed: int,
               steps_per_call: int = 1):
    if steps_per_call < 1:
      raise ValueError(f'steps_per_call must be positive, got {steps_per_call}')
    task = tasks.make_task(cfg, config.train)
    self.task, self.history_queries = task, config.data.history_queries
    self.model = task.model
    self.mesh = parallel.make_mesh()
    self.steps_per_call = steps_per_call
    optimizer = train.make_optimizer(config.train, config.model.get('d_model'))
    self._optimizer = optimizer
    self.state = train.create_state(task, optimizer, seed, self.mesh)
    replicated = parallel.replicated(self.mesh)
    one_step = step_function(task, optimizer)
    if steps_per_call == 1:
      step, batch_sharding = one_step, parallel.batch_sharding(self.mesh)
    else:
      def step(state, batches):
        return jax.lax.scan(one_step, state, batches)  # sums stacked [k, ...]
      batch_sharding = jax.sharding.NamedSharding(self.mesh,
                                                  jax.sharding.PartitionSpec(None, 'data'))
    self._batch_sharding = batch_sharding
    self._step = jax.jit(step, in_shardings=(replicated, batch_sharding),
                         out_shardings=(replicated, replicated), donate_argnums=0)
    self._compiled = {}

  def put(self, queries: np.ndarray) -> dict[str, jax.Array]:
    """The batch dict of `queries` int32 [B, S, n] (and what else the model reads:
    `model_inputs`), sharded over the devices; with k steps per call, k copies of it stacked
    [k, B, ...] (the same cost as k different batches of that shape)."""
    inputs = model_inputs(self.task, queries, self.history_queries)
    if self.steps_per_call == 1:
      return parallel.shard_batch(inputs, self.mesh)
    return {name: jax.make_array_from_process_local_data(
                self._batch_sharding, np.stack([value] * self.steps_per_call))
            for name, value in inputs.items()}

  def compile(self, batch: dict[str, jax.Array], run: bool = True) -> float:
    """Compiles the step for this batch shape and, with `run`, runs it once; returns the
    compile seconds. Several shapes may compile side by side in threads with `run=False`
    (a run replaces the state, which the threads share)."""
    start = time.perf_counter()
    self._compiled[batch['queries'].shape] = self._step.lower(self.state, batch).compile()
    seconds = time.perf_counter() - start
    if run:
      self.run(batch, self.steps_per_call)
    return seconds

  def compiled_text(self, batch: dict[str, jax.Array]) -> str:
    """The optimised HLO of the step compiled for this batch shape."""
    return self._compiled[batch['queries'].shape].as_text()

  def reset(self, seed: int) -> None:
    """A fresh initial state for `seed` (parameters, optimizer, dropout key); the compiled
    programs stay."""
    self.state = train.create_state(self.task, self._optimizer, seed, self.mesh)

  def step(self, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """One call of the program compiled for this batch's shape (dispatched, not waited
    for); its sums (loss, tokens, ...)."""
    self.state, sums = self._compiled[batch['queries'].shape](self.state, batch)
    return sums

  def run(self, batch: dict[str, jax.Array], steps: int) -> tuple[float, float]:
    """(wall, process CPU) seconds per step over `steps` steps (a multiple of the steps per
    call) on this batch."""
    if steps % self.steps_per_call:
      raise ValueError(f'{steps} steps are not a whole number of calls of '
                       f'{self.steps_per_call} steps')
    step = self._compiled[batch['queries'].shape]

    def steps_done():
      for _ in range(steps // self.steps_per_call):
        self.state, sums = step(self.state, batch)
      jax.block_until_ready((self.state, sums))
    return per_step_times(steps_done, steps)


# ---------------------------------------------------------------------------------------------
# Measurements


def _throughput(seconds: float, sessions: float, pairs: float, tokens: float) -> dict:
  return {'step_s': seconds, 'sessions_per_s': sessions / seconds,
          'pairs_per_s': pairs / seconds, 'target_tokens_per_s': tokens / seconds}


def step_shares(buckets: dict[int, dict]) -> dict[int, float]:
  """Each bucket's share of an epoch's steps: a bucket holding a share p of the sessions in
  batches of b sessions has a share of the steps proportional to p / b."""
  weights = {k: b['share'] / b['sessions'] for k, b in buckets.items()}
  total = sum(weights.values())
  return {k: w / total for k, w in weights.items()}


def epoch_mix(buckets: dict[int, dict], key: str) -> dict[str, float]:
  """The buckets' step times `key` combined as an epoch has them: the mean step, and the
  sessions, pairs and tokens it moves on average."""
  shares = step_shares(buckets)
  mean = lambda field: sum(shares[k] * b[field] for k, b in buckets.items())
  return _throughput(mean(key), mean('sessions'), mean('pairs'), mean('target_tokens'))


def measure_input_pipeline(config: ml_collections.ConfigDict, mesh, vocab_size: int,
                           queries_per_batch: int, num_sessions: int, num_batches: int,
                           seed: int) -> dict[str, float]:
  """Seconds per batch of `make_train_iterator` + `shard_batch` on a synthetic split."""
  rng = np.random.default_rng(seed)
  start = time.perf_counter()
  split = synthetic_split(rng, num_sessions, config.data.max_query_words, vocab_size)
  built = time.perf_counter() - start
  iterator = input_pipeline.make_train_iterator(
      split, queries_per_batch=queries_per_batch, seed=seed, multiple_of=jax.device_count(),
      process_index=jax.process_index(), process_count=jax.process_count(),
      worker_count=config.input.worker_count)

  def next_on_device():
    batch = next(iterator)
    parallel.shard_batch({'queries': batch['queries']}, mesh)['queries'].block_until_ready()

  start = time.perf_counter()
  next_on_device()  # plans the epoch and starts grain's threads
  first = time.perf_counter() - start
  times = []
  for _ in range(num_batches):
    start = time.perf_counter()
    next_on_device()
    times.append(time.perf_counter() - start)
  return {'sessions': num_sessions, 'pairs': split.num_pairs, 'split_build_s': built,
          'first_batch_s': first, 'batches': num_batches,
          'batch_median_s': statistics.median(times), 'batch_mean_s': statistics.fmean(times),
          'batch_max_s': max(times)}


def measure_train(config: ml_collections.ConfigDict, *, vocab_size: int, batch_queries: int,
                  session_lengths: list[int], steps: int, repeats: int, peer: bool,
                  peer_modes: list[str] | None, peer_threads: int, check_equivalence: bool,
                  peak_flops_override: float, epoch_pairs: int, pipeline_sessions: int,
                  pipeline_batches: int, seed: int, steps_per_call: int = 1
                  ) -> dict[str, Any]:
  """Every figure of `--what=train` (see the module docstring), as a JSON-ready dict."""
  if steps < 1 or repeats < 1:
    raise ValueError(f'--steps and --repeats must be positive, got {steps} and {repeats}')
  cfg = models.make_config(config.model, vocab_size=vocab_size,
                           max_query_words=config.data.max_query_words)
  mix = length_mix(session_lengths)
  rng = np.random.default_rng(seed)
  rows = input_pipeline.bucket_batch_sizes(np.array(list(mix)), batch_queries,
                                           jax.device_count())
  batches = {k: synthetic_queries(rng, (rows[k], k), cfg.max_query_words, vocab_size)
             for k in mix}
  result: dict[str, Any] = {}
  if check_equivalence:
    from launch import torch_mtn  # pylint: disable=g-import-not-at-top
    result['equivalence'] = torch_mtn.check_equivalence(config, cfg, batches[min(mix)],
                                                        step_function, seed)

  jax_step = JaxStep(config, cfg, seed, steps_per_call)
  buckets: dict[int, dict] = {}
  on_device = {}
  for k, queries in batches.items():
    _, _, weights = models.decoder_io(jnp.asarray(queries))
    on_device[k] = jax_step.put(queries)
    buckets[k] = {'share': mix[k], 'sessions': rows[k], 'pairs': rows[k] * (k - 1),
                  'target_tokens': float(weights.sum()), 'shape': list(queries.shape),
                  'compile_s': jax_step.compile(on_device[k]),
                  **{f'{kind}_flops': flops
                     for kind, flops in step_flops(cfg, config, queries).items()}}

  peers = {}
  if peer:
    peers = _make_peers(config, cfg, batches, peer_modes, peer_threads, steps * repeats + 1,
                        seed)
  for _ in range(repeats):
    # Alternating JAX and peer runs gives both the same share of a shared machine's load.
    for k in batches:
      runs = [('jax', jax_step.run(on_device[k], steps))]
      runs += [(name, runner.run(k, steps)) for name, runner in peers.items()]
      for name, (wall, cpu) in runs:
        buckets[k].setdefault(f'{name}_runs_s', []).append(wall)
        buckets[k].setdefault(f'{name}_cpu_runs_s', []).append(cpu)
  memory = peak_memory()

  flops_peak = peak_flops(jax.devices()[0], peak_flops_override)
  for b in buckets.values():
    for name in ['jax', *peers]:
      b[f'{name}_step_s'] = statistics.median(b[f'{name}_runs_s'])
      b[f'{name}_cpu_step_s'] = statistics.median(b[f'{name}_cpu_runs_s'])
      b[name] = _throughput(b[f'{name}_step_s'], b['sessions'], b['pairs'],
                            b['target_tokens'])
      b[name]['cpu_step_s'] = b[f'{name}_cpu_step_s']
    b['jax']['flops_per_s'] = b['executed_flops'] / b['jax_step_s']
    b['jax']['mfu'] = (b['jax']['flops_per_s'] / (flops_peak * jax.device_count())
                       if flops_peak else None)
  mixed = {}
  for name in ['jax', *peers]:
    mixed[name] = epoch_mix(buckets, f'{name}_step_s')
    mixed[name]['cpu_step_s'] = epoch_mix(buckets, f'{name}_cpu_step_s')['step_s']
  for name in peers:
    mixed[f'jax_over_{name}'] = mixed['jax']['pairs_per_s'] / mixed[name]['pairs_per_s']
    mixed[f'jax_over_{name}_per_cpu_second'] = (mixed[name]['cpu_step_s']
                                                / mixed['jax']['cpu_step_s'])
  shares = step_shares(buckets)
  mean_flops = sum(share * buckets[k]['executed_flops'] for k, share in shares.items())
  mixed['jax']['flops_per_step'] = mean_flops
  mixed['jax']['padded_flops_per_step'] = sum(share * buckets[k]['padded_flops']
                                              for k, share in shares.items())
  mixed['jax']['mfu'] = (mean_flops / mixed['jax']['step_s'] / (flops_peak * jax.device_count())
                         if flops_peak else None)
  result.update({
      'model': {'name': cfg.name, 'parameters': models.count_params(jax_step.state.params),
                'vocab_size': vocab_size, 'd_model': cfg.d_model, 'emb_dim': cfg.emb_dim,
                'ff_dim': cfg.ff_dim, 'num_heads': cfg.num_heads,
                'layers': {'query': cfg.query_layers, 'session': cfg.session_layers,
                           'levels': cfg.num_levels, 'decoder': cfg.decoder_layers},
                'compute_dtype': cfg.compute_dtype, 'scan_layers': cfg.scan_layers,
                'scan_unroll': cfg.scan_unroll, 'remat': cfg.remat,
                'max_query_words': cfg.max_query_words},
      'batch_queries': batch_queries, 'steps': steps, 'repeats': repeats,
      'steps_per_call': steps_per_call,
      'buckets': {str(k): b for k, b in buckets.items()}, 'epoch_mix': mixed,
      'peak_flops_per_device': flops_peak, 'memory': memory,
      'load_average_1min_after': round(os.getloadavg()[0], 2),
      'epoch': {'pairs': epoch_pairs,
                'minutes': epoch_pairs / mixed['jax']['pairs_per_s'] / 60}})
  if peers:
    import torch  # pylint: disable=g-import-not-at-top
    result['peer'] = {'torch': torch.__version__, 'threads': torch.get_num_threads(),
                      'device': str(next(iter(peers.values())).device),
                      'modes': list(peers)}
  if pipeline_sessions > 0:
    pipeline = measure_input_pipeline(config, jax_step.mesh, vocab_size, batch_queries,
                                      pipeline_sessions, pipeline_batches, seed)
    pipeline['step_s'] = mixed['jax']['step_s']
    pipeline['batch_over_step'] = pipeline['batch_median_s'] / pipeline['step_s']
    result['input_pipeline'] = pipeline
  return result


class _PeerRunner:
  """One variant of the PyTorch peer (eager or compiled) with its batches on its device."""

  def __init__(self, config, cfg, batches: dict[int, np.ndarray], compiled: bool,
               total_steps: int, seed: int):
    import torch  # pylint: disable=g-import-not-at-top
    from launch import torch_mtn  # pylint: disable=g-import-not-at-top
    self._torch = torch
    torch.manual_seed(seed)
    self.device = torch.device('cuda' if torch.cuda.is_available()
                               and jax.default_backend() == 'gpu' else 'cpu')
    model = torch_mtn.TorchMTN(cfg)
    self.trainer = torch_mtn.PeerTrainer(model, config.train, cfg, self.device, total_steps)
    if compiled:
      self.trainer.model = torch.compile(model.to(self.device))
    self.batches = {k: self.trainer.batch(q) for k, q in batches.items()}
    for k in self.batches:  # warm-up (and compilation) of each shape
      self.run(k, 1)

  def run(self, bucket: int, steps: int) -> tuple[float, float]:
    """(wall, process CPU) seconds per step over `steps` steps on this bucket's batch."""
    def steps_done():
      for _ in range(steps):
        loss = self.trainer.step(self.batches[bucket])
      loss.item()  # waits for the device
    return per_step_times(steps_done, steps)


def _make_peers(config, cfg, batches, modes, threads, total_steps, seed
                ) -> dict[str, _PeerRunner]:
  import torch  # pylint: disable=g-import-not-at-top
  if threads:
    torch.set_num_threads(threads)
  if torch.cuda.is_available():
    # JAX multiplies float32 matrices in TF32 on a GPU by default; the peer does the same,
    # or the comparison would time full-precision products against TF32 ones.
    torch.set_float32_matmul_precision('high')
  if modes is None:
    modes = ['eager', 'compiled'] if jax.default_backend() == 'gpu' else ['eager']
  peers = {}
  for mode in modes:
    name = f'torch_{mode}'
    try:
      peers[name] = _PeerRunner(config, cfg, batches, mode == 'compiled', total_steps, seed)
    except Exception as e:  # pylint: disable=broad-except
      if mode == 'eager':
        raise
      print(f'torch.compile failed, the compiled peer is left out: {e!r}', flush=True)
  return peers


# ---------------------------------------------------------------------------------------------
# Report


def print_train_report(result: dict[str, Any]) -> None:
  m = result['model']
  print(f'model: {m["name"]}, {m["parameters"]:,} parameters, vocabulary {m["vocab_size"]:,}, '
        f'd_model {m["d_model"]} (emb {m["emb_dim"]}, ff {m["ff_dim"]}, {m["num_heads"]} '
        f'heads), layers {m["layers"]["query"]}Q/{m["layers"]["session"]}S x '
        f'{m["layers"]["levels"] - 1}/{m["layers"]["decoder"]}D, {m["compute_dtype"]}, '
        f'scan_layers {m["scan_layers"]} (unroll {m["scan_unroll"]}), remat {m["remat"]}')
  print(f'batch: {result["batch_queries"]} query slots; sessions of 3/4/5 queries in the mix '
        f'55/27/18 % (2.63 pairs per session), {m["max_query_words"]} token slots per query; '
        f'median of {result["repeats"]} runs of {result["steps"]} steps per bucket, '
        f'{result["steps_per_call"]} per compiled call')
  if 'equivalence' in result:
    e = result['equivalence']
    print(f'equivalence (dropout off): loss JAX {e["jax_loss_before_step"]:.6f} / PyTorch '
          f'{e["torch_loss_before_step"]:.6f}; after one Adam step {e["jax_loss_after_step"]:.6f}'
          f' / {e["torch_loss_after_step"]:.6f}; max relative difference '
          f'{e["max_relative_difference"]:.2e}')
  if 'peer' in result:
    p = result['peer']
    print(f'peer: PyTorch {p["torch"]} on {p["device"]}, {p["threads"]} threads, '
          f'{", ".join(p["modes"])}')
  names = ['jax'] + result.get('peer', {}).get('modes', [])
  print(f'{"bucket":>6} {"shape":>14} {"impl":>14} {"step ms":>9} {"CPU ms":>9} '
        f'{"sessions/s":>11} {"pairs/s":>10} {"tokens/s":>10} {"compile s":>9}')
  rows = [(k, 'x'.join(map(str, b['shape'])), b) for k, b in result['buckets'].items()]
  mixed = result['epoch_mix']
  for bucket, shape, figures in rows + [('mix', 'epoch', mixed)]:
    for name in names:
      f = figures[name]
      compile_s = (f'{figures["compile_s"]:9.1f}' if name == 'jax' and 'compile_s' in figures
                   else '')
      print(f'{bucket:>6} {shape:>14} {name:>14} {f["step_s"] * 1e3:9.2f} '
            f'{f["cpu_step_s"] * 1e3:9.2f} {f["sessions_per_s"]:11.1f} '
            f'{f["pairs_per_s"]:10.1f} {f["target_tokens_per_s"]:10.1f} {compile_s}')
  for name in names[1:]:
    print(f'JAX / {name}: {mixed[f"jax_over_{name}"]:.2f}x the pairs/s, '
          f'{mixed[f"jax_over_{name}_per_cpu_second"]:.2f}x the pairs per CPU second')
  j = mixed['jax']
  mfu = f'{j["mfu"]:.1%}' if j['mfu'] is not None else 'n/a (no peak known; --peak_flops)'
  print(f'FLOPs per step (epoch mix): {j["flops_per_step"]:.3e} executed, '
        f'{j["flops_per_step"] / j["step_s"] / 1e9:.1f} GFLOP/s; MFU {mfu}; '
        f'{j["padded_flops_per_step"]:.3e} on the padded batch (every target slot projected)')
  memory = result['memory']
  print(f'memory: {memory["bytes"] / 2**30:.2f} GiB {memory["what"]}')
  epoch = result['epoch']
  print(f'epoch: {epoch["pairs"]:,} pairs at {j["pairs_per_s"]:,.0f} pairs/s = '
        f'{epoch["minutes"]:.1f} minutes')
  if 'input_pipeline' in result:
    p = result['input_pipeline']
    verdict = 'keeps up with' if p['batch_over_step'] < 1 else 'STALLS'
    print(f'input pipeline: {p["sessions"]:,} sessions ({p["pairs"]:,} pairs); first batch '
          f'{p["first_batch_s"]:.2f} s, then median {p["batch_median_s"] * 1e3:.2f} ms per '
          f'batch (max {p["batch_max_s"] * 1e3:.2f}) against {p["step_s"] * 1e3:.2f} ms per '
          f'step: {p["batch_over_step"]:.1%} of a step, it {verdict} the step')


def _run_script(script: str, args: list[str]) -> str:
  """Runs another benchmark of launch/ as its own process (its flags are its own)."""
  command = [sys.executable, os.path.join(LAUNCH_DIR, script), *args]
  print(f'$ {shlex.join(command)}', flush=True)
  completed = subprocess.run(command, capture_output=True, text=True, check=False)
  print(completed.stdout, end='', flush=True)
  if completed.returncode:
    raise RuntimeError(f'{script} exited with {completed.returncode}:\n{completed.stderr}')
  return completed.stdout


def main(argv):
  cli.quiet_library_logs()  # JAX's INFO lines (no TPU found, ...) above the figures
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if (_PEER.value or _CHECK_EQUIVALENCE.value) and importlib.util.find_spec('torch') is None:
    raise app.UsageError('--peer and --check_equivalence run the PyTorch peer: install torch '
                         '(pip install torch; BUILD.md)')
  if _PEER.value:
    # JAX takes 75 % of a GPU's memory at start by default, leaving the peer too little (an
    # H100's 80 GB ran out); it must be said before JAX's backend starts.
    os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')
  parallel.set_cpu_devices(_CPU_DEVICES.value)
  run()


def config_and_sizes():
  """(config, vocabulary size, query slots per batch) of the flags, the config checked but for
  its raw log files, which synthetic batches do not read: what every benchmark of synthetic
  batches starts from."""
  config = CONFIG_FLAG.value
  try:
    config_lib.validate(config, mode='eval')
  except config_lib.ConfigError as e:
    raise app.UsageError(str(e)) from None
  return (config, _VOCAB_SIZE.value or default_vocab_size(config),
          _BATCH_QUERIES.value or config.input.train_queries_per_batch)


def new_report(config, script: str = 'launch/bench_train.py') -> dict[str, Any]:
  """A benchmark's report as it starts, its 'date:', 'machine:' and 'command:' lines printed
  (`bench_report.print_header`), and the config."""
  report = bench_report.print_header(command_line(script))
  report['config'] = json.loads(config.to_json_best_effort())
  return report


write_report = bench_report.write_json


def run() -> dict[str, Any]:
  """Measures what the flags ask for; prints it and returns it as `--json` writes it."""
  config, vocab_size, batch_queries = config_and_sizes()
  what = _WHAT.value
  if what in ('train', 'all') and config.model.name != 'mtn':
    # Its FLOP count and report read MTN's layer stacks.
    name = config_flags.get_config_filename(flags.FLAGS['config'])
    raise app.UsageError(f'the train step measured is MTN\'s; {name} is a '
                         f'{config.model.name!r} config')
  report = new_report(config)
  if what in ('train', 'all'):
    report['train'] = measure_train(
        config, vocab_size=vocab_size, batch_queries=batch_queries,
        session_lengths=[int(k) for k in _SESSION_LENGTHS.value], steps=_STEPS.value,
        repeats=_REPEATS.value, peer=_PEER.value, peer_modes=_PEER_MODES.value,
        peer_threads=_PEER_THREADS.value,
        check_equivalence=_CHECK_EQUIVALENCE.value, peak_flops_override=_PEAK_FLOPS.value,
        epoch_pairs=_EPOCH_PAIRS.value, pipeline_sessions=_PIPELINE_SESSIONS.value,
        pipeline_batches=_PIPELINE_BATCHES.value, seed=_SEED.value,
        steps_per_call=_STEPS_PER_CALL.value)
    print_train_report(report['train'])
  if what in ('decode', 'all'):
    report['decode'] = _run_script('bench_decode.py', [
        *config_args(), f'--vocab_size={vocab_size}', f'--repeats={_REPEATS.value}',
        f'--seed={_SEED.value}', f'--cpu_devices={_CPU_DEVICES.value}'])
  if what in ('preprocess', 'all'):
    report['preprocess'] = _run_script('bench_preprocess.py', [
        f'--lines={_PREPROCESS_LINES.value}', f'--seed={_SEED.value}'])
  write_report(report, _JSON.value)
  return report


if __name__ == '__main__':
  flags.mark_flags_as_required(['config'])
  bench_report.run(main)
