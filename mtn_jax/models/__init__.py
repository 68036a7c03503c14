"""Model registry: `config.model.name` -> a Linen module class taking `config: ModelConfig`.

Every registered model has the same entry points (see `mtn_jax.models.base`):
  `encode(queries int32 [B, S, n], *, train=False)` -> memory, leaves with leading dim B*S;
  `decode(memory, decoder_inputs int32 [N, T'], *, train=False, decode=False)`
    -> float32 logits [N, T', V];
  `__call__(queries int32 [B, S, n], *, train)` -> float32 logits [B, S-1, n+1, V].
"""

from __future__ import annotations

import flax.linen as nn

from mtn_jax.models.base import ModelConfig, count_params, decoder_io, size_mb
from mtn_jax.models.mtn import MTN
from mtn_jax.models.recurrent import HRED, MNSRF, Seq2SeqAttention
from mtn_jax.models.transformer import Transformer

__all__ = ['MODELS', 'ModelConfig', 'count_params', 'create_model', 'decoder_io', 'size_mb']

MODELS: dict[str, type[nn.Module]] = {
    'mtn': MTN,
    'transformer': Transformer,
    'seq2seq': Seq2SeqAttention,
    'hred': HRED,
    'mnsrf': MNSRF,
}


def create_model(cfg: ModelConfig) -> nn.Module:
  """The module named by `cfg.name`, built with `cfg` as its single attribute."""
  if cfg.name not in MODELS:
    raise ValueError(f'config.model.name {cfg.name!r} is not a registered model; known: '
                     + ', '.join(sorted(MODELS)))
  return MODELS[cfg.name](config=cfg)
