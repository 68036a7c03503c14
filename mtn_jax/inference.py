"""Loads a trained model for decoding: parameters only, never optimizer state."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from mtn_jax import checkpoints
from mtn_jax import errors
from mtn_jax import models
from mtn_jax.data import preprocess
from mtn_jax.data import sessions
from mtn_jax.data.vocab import Vocab
from mtn_jax.models.base import ModelConfig


@dataclasses.dataclass(frozen=True)
class Trained:
  model: nn.Module
  params: Any
  cfg: ModelConfig
  vocab: Vocab
  step: int
  meta: dict


def load_trained(config: ml_collections.ConfigDict, workdir: str,
                 which: str = 'best') -> Trained:
  """Restores the best (lowest validation loss) or latest checkpoint of `workdir`.

  The vocabulary comes from the checkpoint itself; the model is built from `config.model` and
  refused if it differs from the checkpoint's architecture.
  """
  workdir = os.path.abspath(workdir)
  if not os.path.isdir(checkpoints.checkpoint_dir(workdir)):
    raise errors.Error(f'no checkpoints in {workdir}: train first (--mode=train)')
  manager = checkpoints.open_manager(workdir, read_only=True)
  try:
    latest = manager.latest_step()
    if latest is None:
      raise errors.Error(f'no checkpoints in {checkpoints.checkpoint_dir(workdir)}: train first')
    step = checkpoints.best_step(manager) if which == 'best' else latest
    step = latest if step is None else step
    where = f'checkpoint {checkpoints.checkpoint_dir(workdir)}/{step}'
    head = manager.restore(step, args=checkpoints.ocp.args.Composite(
        meta=checkpoints.ocp.args.JsonRestore(), vocab=checkpoints.ocp.args.JsonRestore()))
    vocab = Vocab(tuple(head['vocab']['words']))
    data_dir = preprocess.data_dir(workdir)
    if os.path.exists(os.path.join(data_dir, 'vocab.json')):
      data_vocab = sessions.load_vocab(data_dir)
      if data_vocab.fingerprint != vocab.fingerprint:
        raise checkpoints.CheckpointMismatch(
            f'{where} was trained with another vocabulary than {data_dir}/vocab.json')
    cfg = ModelConfig.from_config(config.model, len(vocab), head['meta']['model']['max_query_words'])
    checkpoints.check_compatible(head['meta'], cfg, vocab, where)
    model = models.create_model(cfg)
    abstract = jax.eval_shape(
        lambda: model.init({'params': jax.random.PRNGKey(0)},
                           jnp.ones((1, 2, cfg.max_query_words), jnp.int32), train=False))
    params = checkpoints.restore(manager, step, abstract_params=abstract['params'])['params']
  finally:
    manager.close()
  return Trained(model, params, cfg, vocab, step, head['meta'])
