"""The model registry: one entry per model, and everything the rest of the project needs of it.

A model is one `ModelSpec` in `REGISTRY`: its Linen module, its config class (the fields it
reads, `base.ModelConfig` and its own), the name shown in logs and reports, its Fig.-3 layer
label, and the example batch its parameters are made from. Training, checkpoints, evaluation
and the report all look a model up here; adding one is adding its entry, its family's keys
and its task (BUILD.md lists the places).

Every registered module has the entry points of `mtn_jax.models.base.SessionModel`:
  `encode(batch, *, train=False)` -> memory, leaves with leading dim B*S;
  `decode(memory, decoder_inputs int32 [N, T'], *, train=False, decode=False)`
    -> float32 logits [N, T', V];
  `__call__(batch, *, train)` -> float32 logits [B, S-1, n+1, V];
  `output_head()` -> the output layer as a pure function and its parameters.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from mtn_jax.models import imdna
from mtn_jax.models import mtn
from mtn_jax.models import polyencoder
from mtn_jax.models import recurrent
from mtn_jax.models import transformer
from mtn_jax.models import zam
from mtn_jax.models.base import count_params
from mtn_jax.models.base import decoder_io
from mtn_jax.models.base import ModelConfig
from mtn_jax.models.base import size_mb
from mtn_jax.models.encoder_decoder import EncoderDecoder
from mtn_jax.models.layers import TransformerConfig

__all__ = ['REGISTRY', 'ModelConfig', 'ModelSpec', 'count_params', 'create_model',
           'decoder_io', 'make_config', 'size_mb', 'spec']


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """One registered model.

  Attributes:
    name: its `config.model.name`.
    module: (config) -> the Linen module.
    config_class: its config, a `ModelConfig` subclass.
    display_name: as logs, results and the report show it ("MTN").
    layer_label: (display name, saved model fields) -> the paper's Fig.-3 label, or None
      where the model has no layers to count.
    layer_ablation: its place in the paper's layer ablation (Fig. 3, which the report draws
      where a model of it comes at more than one depth), None for a model not in it.
  """

  name: str
  module: Callable[[ModelConfig], nn.Module]
  config_class: type[ModelConfig]
  display_name: str
  layer_label: Callable[[str, dict], str] | None = None
  layer_ablation: int | None = None

  def example_batch(self, cfg: ModelConfig) -> dict:
    """The smallest batch the model takes, for making (or shaping) its parameters: one
    session of two queries (and their out-of-vocabulary numbers, for a copying model)."""
    queries = jnp.ones((1, 2, cfg.max_query_words), jnp.int32)
    if type(cfg).copies(cfg):
      return {'queries': queries, 'oov': jnp.zeros_like(queries)}
    return {'queries': queries}

  def label(self, fields: Mapping[str, Any]) -> str:
    """The display name with the layer counts of a saved model config, where it has any."""
    if self.layer_label is None:
      return self.display_name
    return self.layer_label(self.display_name, dict(fields))


REGISTRY: dict[str, ModelSpec] = {s.name: s for s in (
    ModelSpec('mtn', functools.partial(EncoderDecoder, encoder_class=mtn.MTNEncoder),
              mtn.MTNConfig, 'MTN', mtn.layer_label, layer_ablation=1),
    ModelSpec('transformer',
              functools.partial(EncoderDecoder, encoder_class=transformer.FlatSessionEncoder),
              TransformerConfig, 'Transformer', transformer.layer_label, layer_ablation=0),
    ModelSpec('seq2seq', recurrent.Seq2SeqAttention, recurrent.RecurrentConfig,
              'Seq2Seq Attn.'),
    ModelSpec('hred', recurrent.HRED, recurrent.RecurrentConfig, 'H-LSTM'),
    ModelSpec('mnsrf', recurrent.MNSRF, recurrent.RecurrentConfig, 'M-NSRF'),
    ModelSpec('zam', zam.ZeroAttentionModel, zam.ZAMConfig, 'Zero attention family',
              zam.layer_label),
    ModelSpec('biencoder', polyencoder.DualEncoder, polyencoder.RankerConfig, 'Bi-encoder',
              polyencoder.layer_label),
    ModelSpec('polyencoder', functools.partial(polyencoder.DualEncoder, poly=True),
              polyencoder.RankerConfig, 'Poly-encoder', polyencoder.layer_label),
    ModelSpec('crossencoder', polyencoder.CrossEncoder, polyencoder.RankerConfig,
              'Cross-encoder', polyencoder.layer_label),
    ModelSpec('imdna', imdna.create, imdna.IMDNAConfig, 'IMDNA'),
)}


def spec(name: str) -> ModelSpec:
  if name not in REGISTRY:
    raise ValueError(f'config.model.name {name!r} is not a registered model; known: '
                     + ', '.join(REGISTRY))
  return REGISTRY[name]


def display_name(name: str) -> str:
  """A model's display name; an unknown name (an old results file) is shown as it is."""
  return REGISTRY[name].display_name if name in REGISTRY else name


def make_config(fields: Mapping[str, Any], **overrides) -> ModelConfig:
  """The config of the model `fields['name']` names, from a mapping that may hold other
  models' fields too (`config.model`, a checkpoint's saved model config); `overrides`
  (e.g. the data's `vocab_size` and `max_query_words`) win."""
  name = overrides.get('name', fields['name'])
  return spec(name).config_class.from_fields(fields, **overrides)


def create_model(cfg: ModelConfig) -> nn.Module:
  """The module of the model `cfg.name` names, built with `cfg`."""
  model_spec = spec(cfg.name)
  if type(cfg) is not model_spec.config_class:  # pylint: disable=unidiomatic-typecheck
    raise TypeError(f'model {cfg.name!r} takes a {model_spec.config_class.__name__}, got a '
                    f'{type(cfg).__name__}')
  return model_spec.module(config=cfg)
