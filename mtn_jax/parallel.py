"""Data parallelism with `jax.sharding`: one `data` mesh axis over every device of every host.

Each process loads its own share of a global batch (the input pipeline shards by process);
`shard_batch` assembles the shares into global arrays split over the `data` axis. Parameters
and optimizer state are replicated. On a CPU-only host, `set_cpu_devices` (called before JAX
starts) makes every core a device, so the same data parallelism spreads a step over the cores.
"""

from __future__ import annotations

import os
import re

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

from mtn_jax import errors


_XLA_DEVICE_COUNT_FLAG = '--xla_force_host_platform_device_count'
_XLA_COLLECTIVE_TIMEOUT_FLAG = '--xla_cpu_collective_call_terminate_timeout_seconds'
# How long a CPU device waits at a collective (the gradients' all-reduce, an all-gather) for
# the other devices before XLA aborts the process (SIGABRT, exit 134, no checkpoint saved):
# XLA's default is 40 s, counted after a 20 s "may be stuck" warning, a minute in all. With one
# device per core on cores that other processes share, a device reaches a step's collectives
# late (under load, by more than XLA's minute in a user's run, which then died:
# docs/notes/2026-11-26-collective-timeout-on-a-busy-cpu.md). 30 minutes is XLA's own limit for its
# cross-process CPU collectives (xla_cpu_collective_timeout_seconds): a late device is waited
# for, a real deadlock still ends.
CPU_COLLECTIVE_TIMEOUT_SECONDS = 30 * 60


# Modes that run each batch whole, on one device (`inference.load_trained`): a further CPU
# device would take no part in the work (when their parameters were replicated, every device
# computed each batch again, which made them slower: docs/notes/2026-11-26-serving.md), and a
# service's other cores are its HTTP loop's.
WHOLE_BATCH_MODES = ('decode', 'suggest', 'serve')


def cpu_devices_for(mode: str, count: int | None) -> int:
  """The CPU device count of a `mode` run: `count` when given, else one per core (0) for
  the modes that split batches over devices, and 1 for `WHOLE_BATCH_MODES`."""
  if count is not None:
    return count
  return 1 if mode in WHOLE_BATCH_MODES else 0


def set_cpu_devices(count: int = 0, *, asked: bool = False) -> int:
  """Sets how many JAX devices a CPU host shows: `count`, or with 0 one per usable core.

  Must run before JAX starts (its first computation or device query). Data parallelism over
  one device per core runs each operation whole on one core, where a single CPU device splits
  every operation over all cores and waits for them: for small models, whose operations are
  too small to split well, this is the faster way to use the cores (docs/PERFORMANCE.md). A
  device count already set through XLA_FLAGS (`--xla_force_host_platform_device_count`) is
  kept; on a GPU host the setting only shapes the idle CPU backend. Returns the count set,
  or 0 when XLA_FLAGS decides. A count the user `asked` for (`--cpu_devices`) that XLA_FLAGS
  contradicts is refused: the run would train other batches than asked without a word.

  It also raises the CPU collectives' abort timeout to `CPU_COLLECTIVE_TIMEOUT_SECONDS`,
  through XLA_FLAGS (XLA reads it when its backend starts), unless XLA_FLAGS already sets
  `--xla_cpu_collective_call_terminate_timeout_seconds`.
  """
  if count < 0:
    raise ValueError(f'cpu_devices must be >= 0 (0: one per core), got {count}')
  xla_flags = os.environ.get('XLA_FLAGS', '')
  if _XLA_COLLECTIVE_TIMEOUT_FLAG not in xla_flags:
    os.environ['XLA_FLAGS'] = (
        f'{xla_flags} {_XLA_COLLECTIVE_TIMEOUT_FLAG}={CPU_COLLECTIVE_TIMEOUT_SECONDS}'.strip())
  cores = len(os.sched_getaffinity(0))
  if _XLA_DEVICE_COUNT_FLAG in xla_flags:
    set_there = re.findall(rf'{_XLA_DEVICE_COUNT_FLAG}=(\d+)', xla_flags)
    if asked and set_there and int(set_there[-1]) != (count or cores):
      asked_for = f'{count}' if count else f'0 (one per core: {cores})'
      raise errors.ConfigError(f'--cpu_devices={asked_for} contradicts XLA_FLAGS, whose '
                               f'{_XLA_DEVICE_COUNT_FLAG}={set_there[-1]} would decide: '
                               'unset one of them')
    return 0
  count = count or cores
  jax.config.update('jax_num_cpu_devices', count)
  return count


def make_mesh() -> jax.sharding.Mesh:
  # Auto axes: Explicit axes (the jax.make_mesh default) break Linen dropout under jit.
  return jax.make_mesh((jax.device_count(),), ('data',),
                       axis_types=(jax.sharding.AxisType.Auto,))


def local_mesh() -> jax.sharding.Mesh:
  """A `data` axis over this process's devices alone: work that every process of a
  multi-process run does whole (evaluation's decoding and pool ranking)."""
  return jax.sharding.Mesh(np.asarray(jax.local_devices()), ('data',),
                           axis_types=(jax.sharding.AxisType.Auto,))


def replicated_locally(tree, mesh: jax.sharding.Mesh):
  """`tree`'s arrays replicated over `mesh` (this process's devices): an array replicated
  over every process's devices (`inference.load_trained` in a multi-process run) gives its
  copy on this host, since a transfer between hosts' devices cannot be made."""
  local = lambda a: (a.addressable_data(0) if isinstance(a, jax.Array)
                     and not a.is_fully_addressable else a)
  return jax.device_put(jax.tree.map(local, tree), replicated(mesh))


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
  """Leading (batch) axis split over `data`, the rest replicated."""
  return NamedSharding(mesh, P('data'))


def shard_batch(batch: dict[str, np.ndarray], mesh: jax.sharding.Mesh) -> dict[str, jax.Array]:
  """This process's rows of each array -> global arrays sharded on the batch axis."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}
