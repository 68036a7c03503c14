"""Data parallelism with `jax.sharding`: one `data` mesh axis over every device of every host.

Each process loads its own share of a global batch (the input pipeline shards by process);
`shard_batch` assembles the shares into global arrays split over the `data` axis. Parameters
and optimizer state are replicated.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


def make_mesh() -> jax.sharding.Mesh:
  # Auto axes: Explicit axes (the jax.make_mesh default) break Linen dropout under jit.
  return jax.make_mesh((jax.device_count(),), ('data',),
                       axis_types=(jax.sharding.AxisType.Auto,))


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
  """Leading (batch) axis split over `data`, the rest replicated."""
  return NamedSharding(mesh, P('data'))


def shard_batch(batch: dict[str, np.ndarray], mesh: jax.sharding.Mesh) -> dict[str, jax.Array]:
  """This process's rows of each array -> global arrays sharded on the batch axis."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}
