"""The PyTorch peer of MTN: the same network, optimizer and loss from stock `torch.nn` layers.

PyTorch is not a dependency of mtn_jax; install it to use this module: `pip install torch`
(a CPU-only build is enough to compare on a CPU). `launch/bench_train.py --peer` times it
against the JAX train step on the same batches, and `--check_equivalence` shows that both
compute the same loss from the same weights.

The peer is the straightforward PyTorch implementation: `nn.TransformerEncoderLayer` stacks
(post-norm, ReLU, batch_first) for the query encoder and the causally masked session encoder,
`nn.TransformerDecoderLayer` for the decoder, plus what the paper adds (the query projection
over n token slots, query positions, Add & Norm). Everything else follows MTN in `mtn_jax.models`
exactly: separate or shared word tables (emb_dim -> d_model projection when they differ),
the same position encodings, the same output layer, LayerNorm epsilon 1e-6, dropout on the
embeddings and sublayer outputs only. It runs in eager mode unless compiled by the caller.

In and out (B sessions of S queries of n tokens, T = n + 1 decoder positions, V words):
  `TorchMTN(cfg)(queries int64 [B, S, n], decoder_inputs int64 [B*(S-1), T])`
    -> float32 logits [B, S-1, T, V] for the pairs (queries 0..t -> query t+1);
  `load_flax_params(model, params)` copies a Flax MTN parameter tree into the peer;
  `PeerTrainer(model, train_config, cfg, device, total_steps)`: `batch(queries int32 numpy
    [B, S, n])` -> tensors on the device, `step(batch)` -> the loss of one Adam step (betas,
    epsilon and the learning-rate schedule of `config.train`, label smoothing);
  `check_equivalence(config, cfg, queries, bind_step)`: the label-smoothed loss of the JAX
    train step and of the peer from the same weights (dropout off), before and after one
    optimizer step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import torch
from torch import nn

from mtn_jax import models
from mtn_jax import parallel
from mtn_jax import tasks
from mtn_jax.data.vocab import PAD_ID
from mtn_jax.models import layers
from mtn_jax.models.base import ModelConfig
from mtn_jax.training import train

# Flax's LayerNorm default; torch's is 1e-5.
_LAYER_NORM_EPS = 1e-6


def _check_supported(cfg: ModelConfig) -> None:
  if cfg.name != 'mtn':
    raise ValueError(f'the PyTorch peer implements MTN only; config.model.name is {cfg.name!r}')


def _sinusoid_table(length: int, dim: int) -> torch.Tensor:
  """float32 [length, dim]: the model's own sinusoid encodings, so both sides add the same."""
  return torch.from_numpy(np.asarray(layers.sinusoid(jnp.arange(length), dim)).copy())


class PositionTable(nn.Module):
  """Positions 0..length-1 -> encodings [length, d]: a learned table or fixed sinusoids."""

  def __init__(self, cfg: ModelConfig, length: int):
    super().__init__()
    self.learned = cfg.learned_positions
    if self.learned:
      self.table = nn.Parameter(torch.randn(length, cfg.d_model) * 0.02)
    else:
      self.register_buffer('table', _sinusoid_table(length, cfg.d_model), persistent=False)

  def forward(self, length: int) -> torch.Tensor:
    return self.table[:length]


class WordTable(nn.Module):
  """ids [...] -> [..., d_model]: emb_dim vectors, projected when emb_dim != d_model."""

  def __init__(self, cfg: ModelConfig):
    super().__init__()
    self.table = nn.Parameter(torch.randn(cfg.vocab_size, cfg.emb_dim))
    self.projection = (nn.Parameter(torch.randn(cfg.emb_dim, cfg.d_model) * cfg.emb_dim**-0.5)
                       if cfg.emb_dim != cfg.d_model else None)
    self.d_model = cfg.d_model

  def forward(self, ids: torch.Tensor) -> torch.Tensor:
    x = nn.functional.embedding(ids, self.table)
    return x if self.projection is None else x @ self.projection

  def attend(self, hidden: torch.Tensor) -> torch.Tensor:
    """Tied output layer: [..., d_model] -> logits [..., V], as `WordEmbedding.attend`."""
    if self.projection is not None:
      hidden = hidden @ self.projection.T
    return hidden @ self.table.T / self.d_model**0.5


def _match_flax_dropout(layer: nn.Module) -> nn.Module:
  """Drops only what the Flax layers drop: sublayer outputs, not attention weights and not the
  feed-forward's hidden units, which the stock torch layers would also drop."""
  for attention in ('self_attn', 'multihead_attn'):
    if hasattr(layer, attention):
      getattr(layer, attention).dropout = 0.0
  layer.dropout = nn.Identity()
  return layer


def _encoder_stack(cfg: ModelConfig, num_layers: int) -> nn.TransformerEncoder:
  layer = _match_flax_dropout(nn.TransformerEncoderLayer(
      cfg.d_model, cfg.num_heads, cfg.ff_dim, cfg.dropout, activation='relu',
      layer_norm_eps=_LAYER_NORM_EPS, batch_first=True, norm_first=cfg.pre_norm))
  final_norm = nn.LayerNorm(cfg.d_model, eps=_LAYER_NORM_EPS) if cfg.pre_norm else None
  return nn.TransformerEncoder(layer, num_layers, norm=final_norm, enable_nested_tensor=False)


def _causal_mask(length: int, device) -> torch.Tensor:
  """bool [length, length], True where attention may NOT look (torch's convention)."""
  return torch.ones(length, length, dtype=torch.bool, device=device).triu(1)


class SessionLevel(nn.Module):
  """tokens [B, S, n, d], token mask bool [B, S, n] -> [B, S, n, d], as `mtn.SessionLevel`."""

  def __init__(self, cfg: ModelConfig):
    super().__init__()
    n = cfg.max_query_words
    self.query_projection = nn.Parameter(torch.randn(n) * n**-0.5)
    self.query_positions = PositionTable(cfg, cfg.max_session_queries)
    self.session_encoder = _encoder_stack(cfg, cfg.session_layers)
    self.add_norm = nn.LayerNorm(cfg.d_model, eps=_LAYER_NORM_EPS)
    self.dropout = nn.Dropout(cfg.dropout)

  def forward(self, tokens: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
    num_queries = tokens.shape[1]
    zero_padded = tokens * token_mask[..., None]
    query_vectors = torch.einsum('bsnd,n->bsd', zero_padded, self.query_projection)
    query_vectors = query_vectors + self.query_positions(num_queries)
    session = self.session_encoder(self.dropout(query_vectors),
                                   mask=_causal_mask(num_queries, tokens.device),
                                   is_causal=True)
    return self.add_norm(tokens + self.dropout(session)[:, :, None, :])


class TorchMTN(nn.Module):
  """K-level MTN: (queries [B, S, n], decoder_inputs [B*(S-1), T]) -> logits [B, S-1, T, V].

  Every query of a batch needs at least one word: torch's attention turns a row whose keys
  are all padding into NaN, where the Flax layers attend uniformly.
  """

  def __init__(self, cfg: ModelConfig):
    super().__init__()
    _check_supported(cfg)
    self.cfg = cfg
    self.encoder_embedding = WordTable(cfg)
    self.decoder_embedding = self.encoder_embedding if cfg.share_embeddings else WordTable(cfg)
    self.token_positions = PositionTable(cfg, cfg.max_query_words)
    self.target_positions = PositionTable(cfg, cfg.target_len)
    self.query_encoder = _encoder_stack(cfg, cfg.query_layers)
    self.session_levels = nn.ModuleList(SessionLevel(cfg) for _ in range(cfg.num_levels - 1))
    decoder_layer = _match_flax_dropout(nn.TransformerDecoderLayer(
        cfg.d_model, cfg.num_heads, cfg.ff_dim, cfg.dropout, activation='relu',
        layer_norm_eps=_LAYER_NORM_EPS, batch_first=True, norm_first=cfg.pre_norm))
    self.decoder = nn.TransformerDecoder(
        decoder_layer, cfg.decoder_layers,
        norm=nn.LayerNorm(cfg.d_model, eps=_LAYER_NORM_EPS) if cfg.pre_norm else None)
    self.output = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size)
    self.dropout = nn.Dropout(cfg.dropout)

  def encode(self, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """queries [B, S, n] -> (tokens [B*S, n, d], padding bool [B*S, n], True on padding)."""
    batch, num_queries, num_tokens = queries.shape
    tokens = queries.reshape(batch * num_queries, num_tokens)
    padding = tokens == PAD_ID
    x = self.encoder_embedding(tokens) + self.token_positions(num_tokens)
    x = self.query_encoder(self.dropout(x), src_key_padding_mask=padding)
    x = x.reshape(batch, num_queries, num_tokens, -1)
    token_mask = (~padding).reshape(batch, num_queries, num_tokens).to(x.dtype)
    for level in self.session_levels:
      x = level(x, token_mask)
    return x.reshape(batch * num_queries, num_tokens, -1), padding

  def forward(self, queries: torch.Tensor, decoder_inputs: torch.Tensor) -> torch.Tensor:
    batch, num_queries, _ = queries.shape
    # As in the Flax model: the last query is no pair's context, so it is not encoded.
    memory, memory_padding = self.encode(queries[:, :-1])
    length = decoder_inputs.shape[-1]
    y = self.decoder_embedding(decoder_inputs) + self.target_positions(length)
    y = self.decoder(self.dropout(y), memory, tgt_mask=_causal_mask(length, y.device),
                     tgt_is_causal=True, memory_key_padding_mask=memory_padding)
    logits = self.decoder_embedding.attend(y) if self.output is None else self.output(y)
    return logits.float().reshape(batch, num_queries - 1, length, -1)


# ---------------------------------------------------------------------------------------------
# Flax -> torch weights


def _tensor(x) -> torch.Tensor:
  return torch.from_numpy(np.array(x, dtype=np.float32))


def _copy(target: torch.Tensor, value: torch.Tensor, name: str) -> None:
  if tuple(target.shape) != tuple(value.shape):
    raise ValueError(f'{name}: Flax shape {tuple(value.shape)} does not fit the peer\'s '
                     f'{tuple(target.shape)}')
  with torch.no_grad():
    target.copy_(value)


def _copy_dense(linear: nn.Linear, flax_dense: dict, name: str) -> None:
  """Flax kernel [in, out] -> torch weight [out, in]."""
  _copy(linear.weight, _tensor(flax_dense['kernel']).T, f'{name}/kernel')
  _copy(linear.bias, _tensor(flax_dense['bias']), f'{name}/bias')


def _copy_norm(norm: nn.LayerNorm, flax_norm: dict, name: str) -> None:
  _copy(norm.weight, _tensor(flax_norm['scale']), f'{name}/scale')
  _copy(norm.bias, _tensor(flax_norm['bias']), f'{name}/bias')


def _copy_attention(attention: nn.MultiheadAttention, flax_attention: dict, name: str) -> None:
  """Flax q/k/v kernels [d, heads, head_dim] -> rows of torch's packed in_proj [3d, d]; the
  out kernel [heads, head_dim, d] -> out_proj [d, d]. Heads are contiguous in both."""
  d = attention.embed_dim
  weights = [_tensor(flax_attention[p]['kernel']).reshape(d, d).T for p in ('query', 'key',
                                                                             'value')]
  biases = [_tensor(flax_attention[p]['bias']).reshape(d) for p in ('query', 'key', 'value')]
  _copy(attention.in_proj_weight, torch.cat(weights), f'{name}/query,key,value kernels')
  _copy(attention.in_proj_bias, torch.cat(biases), f'{name}/query,key,value biases')
  _copy(attention.out_proj.weight, _tensor(flax_attention['out']['kernel']).reshape(d, d).T,
        f'{name}/out/kernel')
  _copy(attention.out_proj.bias, _tensor(flax_attention['out']['bias']), f'{name}/out/bias')


def _copy_stack(stack: nn.Module, flax_stack: dict, name: str) -> None:
  """A LayerStack in the loop layout ('layers_0', ...) -> nn.TransformerEncoder/Decoder."""
  for i, layer in enumerate(stack.layers):
    flax_layer = flax_stack[f'layers_{i}']
    where = f'{name}/layers_{i}'
    cross = isinstance(layer, nn.TransformerDecoderLayer)
    _copy_attention(layer.self_attn, flax_layer['self_attention'], f'{where}/self_attention')
    _copy_norm(layer.norm1, flax_layer['self_attention_norm'], f'{where}/self_attention_norm')
    if cross:
      _copy_attention(layer.multihead_attn, flax_layer['cross_attention'],
                      f'{where}/cross_attention')
      _copy_norm(layer.norm2, flax_layer['cross_attention_norm'],
                 f'{where}/cross_attention_norm')
    _copy_dense(layer.linear1, flax_layer['ff_hidden'], f'{where}/ff_hidden')
    _copy_dense(layer.linear2, flax_layer['ff_output'], f'{where}/ff_output')
    _copy_norm(layer.norm3 if cross else layer.norm2, flax_layer['feed_forward_norm'],
               f'{where}/feed_forward_norm')
  if stack.norm is not None:
    _copy_norm(stack.norm, flax_stack['final_norm'], f'{name}/final_norm')


def _copy_word_table(table: WordTable, flax_table: dict, name: str) -> None:
  _copy(table.table, _tensor(flax_table['embedding']), f'{name}/embedding')
  if table.projection is not None:
    _copy(table.projection, _tensor(flax_table['projection']), f'{name}/projection')


def _copy_positions(positions: PositionTable, flax_module: dict | None, name: str) -> None:
  if positions.learned:
    _copy(positions.table, _tensor(flax_module['positions']), f'{name}/positions')


def load_flax_params(model: TorchMTN, params: Any) -> None:
  """Copies a Flax MTN parameter tree (either layer-stack layout) into `model`."""
  params = layers.scan_to_loop_params(jax.tree.map(np.asarray, params))
  try:
    if model.cfg.share_embeddings:
      _copy_word_table(model.encoder_embedding, params['word_embedding'], 'word_embedding')
    else:
      _copy_word_table(model.encoder_embedding, params['encoder_embedding'],
                       'encoder_embedding')
      _copy_word_table(model.decoder_embedding, params['decoder_embedding'],
                       'decoder_embedding')
    _copy_positions(model.token_positions, params.get('token_positions'), 'token_positions')
    _copy_stack(model.query_encoder, params['query_encoder'], 'query_encoder')
    for i, level in enumerate(model.session_levels):
      flax_level = params[f'session_levels_{i}']
      where = f'session_levels_{i}'
      _copy(level.query_projection, _tensor(flax_level['query_projection']),
            f'{where}/query_projection')
      _copy_positions(level.query_positions, flax_level.get('query_positions'),
                      f'{where}/query_positions')
      _copy_stack(level.session_encoder, flax_level['session_encoder'],
                  f'{where}/session_encoder')
      _copy_norm(level.add_norm, flax_level['add_norm'], f'{where}/add_norm')
    _copy_positions(model.target_positions, params['decoder'].get('positions'),
                    'decoder/positions')
    _copy_stack(model.decoder, params['decoder']['stack'], 'decoder/stack')
    if model.output is not None:
      _copy_dense(model.output, params['logits'], 'logits')
  except KeyError as e:
    raise ValueError(f'the Flax parameter tree has no {e} where the peer expects one: the '
                     'Flax MTN and the peer differ in structure') from None


# ---------------------------------------------------------------------------------------------
# Training


class PeerTrainer:
  """Adam with `config.train`'s betas, epsilon and schedule, label-smoothed cross-entropy.

  `total_steps` bounds the learning-rate table, taken from
  `mtn_jax.training.train.learning_rate_schedule` so that both sides step with the same
  rates. With `bfloat16`, the forward pass runs under autocast (float32 weights, bfloat16
  matmuls, float32 loss), like the JAX compute dtype.
  """

  def __init__(self, model: TorchMTN, train_config: ml_collections.ConfigDict,
               cfg: ModelConfig, device: torch.device, total_steps: int):
    if train_config.entropy_weight:
      raise ValueError('the PyTorch peer has no entropy regulariser '
                       '(config.train.entropy_weight must be 0)')
    self.model = model.to(device).train()
    self.device = device
    self.label_smoothing = float(train_config.label_smoothing)
    self.grad_clip_norm = float(train_config.grad_clip_norm)
    self.autocast_dtype = torch.bfloat16 if cfg.compute_dtype == 'bfloat16' else None
    schedule = train.learning_rate_schedule(train_config, cfg.d_model)
    steps = np.arange(max(total_steps, 1))
    rates = np.broadcast_to(np.asarray(schedule(jnp.asarray(steps)), np.float64), steps.shape)
    self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1.0,
                                      betas=(train_config.adam_b1, train_config.adam_b2),
                                      eps=train_config.adam_eps)
    self.scheduler = torch.optim.lr_scheduler.LambdaLR(
        self.optimizer, lambda step: float(rates[min(step, len(rates) - 1)]))

  def batch(self, queries: np.ndarray) -> dict[str, torch.Tensor]:
    """int32 [B, S, n] -> queries, decoder inputs [B*(S-1), T] and targets, on the device."""
    if ((queries != PAD_ID).sum(-1) == 0).any():
      raise ValueError('the PyTorch peer needs at least one word in every query (an all-'
                       'padding query makes its attention NaN)')
    decoder_inputs, targets, _ = models.decoder_io(jnp.asarray(queries))
    to_device = lambda x: torch.from_numpy(np.asarray(x, np.int64)).to(self.device)
    return {'queries': to_device(queries),
            'decoder_inputs': to_device(decoder_inputs).flatten(0, 1),
            'targets': to_device(targets)}

  def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Label-smoothed cross-entropy per real target token ( `</s>` included)."""
    autocast = (torch.autocast(self.device.type, dtype=self.autocast_dtype)
                if self.autocast_dtype is not None else contextlib.nullcontext())
    with autocast:
      logits = self.model(batch['queries'], batch['decoder_inputs'])
    return nn.functional.cross_entropy(logits.flatten(0, -2), batch['targets'].flatten(),
                                       ignore_index=PAD_ID,
                                       label_smoothing=self.label_smoothing)

  def step(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """One optimizer step; returns the loss before it (not synchronised with the device)."""
    self.optimizer.zero_grad(set_to_none=True)
    loss = self.loss(batch)
    loss.backward()
    if self.grad_clip_norm > 0:
      nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip_norm)
    self.optimizer.step()
    self.scheduler.step()
    return loss.detach()


def check_equivalence(config: ml_collections.ConfigDict, cfg: ModelConfig,
                      queries: np.ndarray, bind_step: Callable[..., Callable],
                      seed: int = 0) -> dict[str, float]:
  """The JAX train step and the peer, from the same weights with dropout off, on one batch.

  `bind_step(task, optimizer)` gives `train.train_step` with the trainer's static arguments
  bound (`bench_train.step_function`). Returns the label-smoothed training loss of
  both before and after one optimizer step (the second shows that gradients, Adam and the
  schedule agree too) and the largest relative difference. queries: int32 [B, S, n].
  """
  cfg = cfg.replace(dropout=0.0)
  task = tasks.make_task(cfg, config.train)
  mesh = parallel.make_mesh()
  optimizer = train.make_optimizer(config.train, cfg.d_model)
  state = train.create_state(task, optimizer, seed, mesh)
  peer = TorchMTN(cfg)
  load_flax_params(peer, state.params)
  step_fn = jax.jit(bind_step(task, optimizer))
  trainer = PeerTrainer(peer, config.train, cfg, torch.device('cpu'), total_steps=2)
  batch = trainer.batch(queries)
  result = {}
  for name in ('loss_before_step', 'loss_after_step'):
    state, sums = step_fn(state, {'queries': jnp.asarray(queries)})
    result[f'jax_{name}'] = float(sums['loss'] / sums['tokens'])
    result[f'torch_{name}'] = float(trainer.step(batch))
  result['max_relative_difference'] = max(
      abs(result[f'jax_{n}'] - result[f'torch_{n}']) / abs(result[f'jax_{n}'])
      for n in ('loss_before_step', 'loss_after_step'))
  return result
