"""Which task trains and serves each registered model (`config.model.name`).

The models (`mtn_jax.models`) sit below the tasks, so the table lives here, above both, with
the task classes themselves rather than their names.
"""

from __future__ import annotations

import ml_collections

from mtn_jax import models
from mtn_jax.models.base import ModelConfig
from mtn_jax.tasks import base
from mtn_jax.tasks import multi_answer
from mtn_jax.tasks import rankers
from mtn_jax.tasks import zero_attention

TASKS: dict[str, type] = {
    'mtn': base.GenerationTask,
    'transformer': base.GenerationTask,
    'seq2seq': base.GenerationTask,
    'hred': base.GenerationTask,
    'mnsrf': base.GenerationTask,
    'zam': zero_attention.ZeroAttentionTask,
    'biencoder': rankers.DualEncoderTask,
    'polyencoder': rankers.DualEncoderTask,
    'crossencoder': rankers.CrossEncoderTask,
    'imdna': multi_answer.IMDNATask,
}
assert set(TASKS) == set(models.REGISTRY), (
    f'every registered model needs its task here: {sorted(set(models.REGISTRY) ^ set(TASKS))}')


def task_class(cfg: ModelConfig | ml_collections.ConfigDict) -> type:
  """The task class of the model `cfg.name` names."""
  models.spec(cfg.name)  # an unknown name: the registry's error, naming the known ones
  return TASKS[cfg.name]


def make_task(cfg: ModelConfig, train: ml_collections.ConfigDict, data_dir: str | None = None):
  """The task of the model `cfg` describes. A ranking task reads the candidate pool (and
  what else it learns from) in `data_dir`, the corpus's folder."""
  return task_class(cfg).from_config(cfg, train, data_dir)
