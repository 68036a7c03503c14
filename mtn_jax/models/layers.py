"""Transformer building blocks shared by MTN and the Transformer baseline.

- `TransformerConfig`: the fields these layers read, beside the ones every model has.

Shapes: `B` batch rows, `T` query (target) positions, `L` key/value (source) positions,
`d` = `d_model`, `V` = vocabulary size; masks are boolean and True where attention may look.

- `WordEmbedding`: ids int [..., T] -> [..., T, d] (`emb_dim` vectors projected to `d_model`
  when the sizes differ), and `attend`: [..., T, d] -> tied vocabulary logits float32 [..., T, V].
- `PositionEncoding`: int positions [..., T] -> [..., T, d], sinusoidal or learned.
- `Attention`: multi-head attention [B, T, d] x [B, L, d] -> [B, T, d]; when decoding, an
  autoregressive key/value cache (self-attention) or the memory's keys/values projected once
  (cross-attention), in the 'cache' collection.
- `TransformerLayer`: self-attention, optional cross-attention, feed-forward; `LayerStack`
  repeats it, as a Python loop or under `nn.scan`, optionally rematerialised.
- `Decoder`: the standard Transformer decoder both models share:
  (memory [B, L, d], memory mask [B, L], decoder inputs int [B, T]) -> hidden [B, T, d].
- `loop_to_scan_params` / `scan_to_loop_params` convert parameter trees between the two
  layer-stack layouts, so a checkpoint trained with one runs with the other.
- `KERNELS`: the kernel choices of `config.model.kernels` (the loss head's gradient products
  in bfloat16), each a change of how a step runs, none of the parameters.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from mtn_jax import errors
from mtn_jax.models.base import ModelConfig
from mtn_jax.models.base import check_choice
from mtn_jax.models.base import check_positive
from mtn_jax.models.dropout import Dropout

@dataclasses.dataclass(frozen=True, kw_only=True)
class TransformerConfig(ModelConfig):
  """A Transformer encoder-decoder's fields (the paper's Sec. 5.2 names)."""

  d_model: int
  num_heads: int
  ff_dim: int
  query_layers: int  # MTN's query encoder / the Transformer baseline's encoder depth
  decoder_layers: int
  pre_norm: bool
  learned_positions: bool
  scan_layers: bool  # one layout of the parameters or the other: see `loop_to_scan_params`
  # Under `scan_layers`, the layers one iteration of the compiled loop runs (`jax.lax.scan`'s
  # `unroll`): the parameters, their initialisation and the dropout masks stay the scan's.
  scan_unroll: int = 1
  remat: str
  # A copy head mixes session words into the output (`copying`); checkpoints from before it
  # existed have none.
  copy: bool = False
  # A memory of the user's earlier queries (`user_memory`): 'none', 'attention' or
  # 'zero_attention', with its attention's hidden units; checkpoints from before it have none.
  user_memory: str = 'none'
  attention_hidden: int = 8
  # Kernel choices for a GPU (`KERNELS`), comma-separated; '' runs XLA's own kernels
  # throughout. Checkpoints from before the choice existed have none.
  kernels: str = ''

  @property
  def extended_vocab_size(self) -> int:
    """The output's size: V, plus with `copy` one extended id per token slot a context can
    hold (`max_session_queries * max_query_words`)."""
    extra = self.max_session_queries * self.max_query_words if self.copy else 0
    return self.vocab_size + extra

  RUNTIME_FIELDS = ModelConfig.RUNTIME_FIELDS + ('remat', 'scan_layers', 'scan_unroll',
                                                 'kernels')
  HAS_USER_MEMORY = True

  @classmethod
  def check(cls, model) -> None:
    super().check(model)
    check_positive(model, 'd_model', 'num_heads', 'ff_dim', 'query_layers', 'decoder_layers',
                   'scan_unroll')
    if model.d_model % model.num_heads:
      raise errors.ConfigError(f'config.model.num_heads ({model.num_heads}) must divide '
                               f'config.model.d_model ({model.d_model})')
    check_choice(model, 'remat', ('none', *REMAT_POLICIES))
    chosen = kernel_set(model.get('kernels', ''))
    unknown = sorted(chosen - set(KERNELS))
    if unknown:
      raise errors.ConfigError(f'config.model.kernels: unknown {", ".join(map(repr, unknown))} '
                               f'(comma-separated, of {", ".join(KERNELS)}; \'\' for none)')
    if chosen and model.compute_dtype != 'bfloat16':  # every choice of `KERNELS` needs it
      raise errors.ConfigError(f'config.model.kernels={",".join(sorted(chosen))!r} needs '
                               "config.model.compute_dtype='bfloat16', got "
                               f'{model.compute_dtype!r}')

  def uses(self, kernel: str) -> bool:
    """Whether `config.model.kernels` chooses `kernel` (one of `KERNELS`)."""
    return kernel in kernel_set(self.kernels)

  @classmethod
  def copies(cls, model) -> bool:
    return bool(model.copy)


# What `config.model.kernels` may choose, measured on a GPU against XLA's own kernels
# (launch/bench_kernels.py):
#  'bf16_head_grads': the output layer's two gradient products (the logits' gradient times
#    the weights, and times the decoder states) in bfloat16 instead of float32, as PyTorch's
#    autocast runs them; the logits and the loss stay float32. It needs bfloat16 compute.
# Two other choices, cuDNN's fused attention and a Pallas Triton layer norm, were measured
# slower than XLA's kernels on a GPU, and failed under XLA's CUDA-graph command buffers, so
# they were removed (docs/PERFORMANCE.md, "The targets' rows").
KERNELS = ('bf16_head_grads',)


def kernel_set(kernels: str) -> frozenset[str]:
  """The choices of a `config.model.kernels` value ('a,b')."""
  return frozenset(k.strip() for k in kernels.split(',') if k.strip())


REMAT_POLICIES = {
    'full': None,  # save nothing: recompute the whole layer in the backward pass
    'dots': jax.checkpoint_policies.checkpoint_dots,
}


def causal_mask(length: int) -> jax.Array:
  """bool [1, 1, T, T]: position i sees positions 0..i."""
  return jnp.tril(jnp.ones((length, length), dtype=bool))[None, None]


def tree_positions_and_mask(parents: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Sequences packed in a row as a tree of their shared prefixes, each read as if alone.

  Sequences laid side by side are the case where no prefix is shared: each position's parent
  is the one before it, and each sequence's `<s>` a root. Where several sequences start alike
  ("bank of america online", "bank of america login"), their common prefix lies in the row
  once, and each token attends to its own ancestors only (tree attention): the same states as
  each sequence alone, for fewer positions.

  Args:
    parents: int [B, T], each position's parent in its row (the position whose token it
      follows), -1 at a root; a parent lies before its children. Padding is a root that
      nothing else names.
  Returns:
    (positions int32 [B, T]: each position's depth, its index within its own sequences,
     self-attention mask bool [B, 1, T, T]: position i sees i and its ancestors).
  """
  length = parents.shape[-1]
  index = jnp.arange(length, dtype=parents.dtype)
  sees = (parents[:, :, None] == index) | (index[:, None] == index)[None]  # one step up
  # Ancestors by squaring: after k rounds, every ancestor up to 2**k steps up.
  for _ in range(max(length - 1, 1).bit_length()):
    sees = sees | (jnp.einsum('bij,bjk->bik', sees.astype(jnp.float32),
                              sees.astype(jnp.float32)) > 0)
  return (sees.sum(-1) - 1).astype(jnp.int32), sees[:, None]


def padding_mask(valid: jax.Array) -> jax.Array:
  """bool [B, 1, 1, L] from `valid` bool [B, L]: attend only to real keys."""
  return valid[:, None, None, :]


def sinusoid(positions: jax.Array, dim: int) -> jax.Array:
  """float32 [..., dim] encodings of int `positions` [...] (Vaswani et al. 2017, Sec. 3.5).

  Computed from the positions themselves rather than read from a table, so that a decoding
  step at a traced position needs no table length.
  """
  half = (dim + 1) // 2
  inverse_wavelengths = jnp.exp(-math.log(10000.0) * jnp.arange(half, dtype=jnp.float32) / half)
  angles = positions[..., None].astype(jnp.float32) * inverse_wavelengths
  return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)[..., :dim]


def _dense(config: TransformerConfig, features, **kwargs) -> nn.DenseGeneral:
  return nn.DenseGeneral(features, dtype=config.dtype, param_dtype=jnp.float32, **kwargs)


# nn.LayerNorm's default.
LAYER_NORM_EPSILON = 1e-6


def layer_norm(config: TransformerConfig, name: str) -> nn.Module:
  """nn.LayerNorm in the compute dtype, its parameters ('scale', 'bias') float32."""
  # Flax reduces the statistics in float32 even for bfloat16 inputs.
  return nn.LayerNorm(epsilon=LAYER_NORM_EPSILON, dtype=config.dtype, param_dtype=jnp.float32,
                      name=name)


def _logits_dot(lhs: jax.Array, rhs: jax.Array, contract_rhs: int) -> jax.Array:
  """lhs [..., k] x rhs (contracting axis `contract_rhs`) with float32 accumulation and output.

  The vocabulary projection is the widest matmul of the model; bfloat16 inputs keep it fast
  while float32 accumulation keeps the log-likelihoods exact to float32 rounding of the result.
  """
  return jax.lax.dot_general(lhs, rhs, (((lhs.ndim - 1,), (contract_rhs,)), ((), ())),
                             preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _logits_dot_low_precision_grads(lhs: jax.Array, rhs: jax.Array, contract_rhs: int
                                    ) -> jax.Array:
  """`_logits_dot`, whose backward pass multiplies the output's gradient in the inputs'
  dtype (bfloat16) rather than in float32.

  By default JAX differentiates the float32 output into a float32 gradient, and so runs both
  gradient products (with the weights, with the inputs) as float32 matrix products, the
  slowest kind on a GPU. Here the gradient is rounded to the inputs' dtype first, as PyTorch's
  autocast does; the products still accumulate in float32, and their results are rounded to
  the inputs' dtype (the weights' gradient too, as autocast's).
  """
  return _logits_dot(lhs, rhs, contract_rhs)


def _low_precision_grads_fwd(lhs, rhs, contract_rhs):
  return _logits_dot(lhs, rhs, contract_rhs), (lhs, rhs)


def _low_precision_grads_bwd(contract_rhs, residuals, g):
  lhs, rhs = residuals
  g = g.astype(lhs.dtype)
  d_lhs = jax.lax.dot_general(g, rhs, (((g.ndim - 1,), (1 - contract_rhs,)), ((), ())),
                              preferred_element_type=jnp.float32)  # [..., k]
  lead = tuple(range(lhs.ndim - 1))
  operands = (lhs, g) if contract_rhs == 0 else (g, lhs)  # rhs [k, n] or [n, k]
  d_rhs = jax.lax.dot_general(*operands, ((lead, lead), ((), ())),
                              preferred_element_type=jnp.float32)
  return d_lhs.astype(lhs.dtype), d_rhs.astype(rhs.dtype)


_logits_dot_low_precision_grads.defvjp(_low_precision_grads_fwd, _low_precision_grads_bwd)


def logits_dot(config: TransformerConfig) -> Callable[[jax.Array, jax.Array, int], jax.Array]:
  """The output layer's product (lhs [..., k], rhs 2-D, contract_rhs) -> float32, as the
  'bf16_head_grads' kernel choice has it."""
  if config.uses('bf16_head_grads'):
    return _logits_dot_low_precision_grads
  return _logits_dot


def head_dot_general(config: TransformerConfig) -> Callable[..., jax.Array]:
  """`nn.Dense`'s `dot_general` for an output layer: float32 accumulation and output, and with
  'bf16_head_grads' bfloat16 gradient products (`_logits_dot_low_precision_grads`)."""
  if not config.uses('bf16_head_grads'):
    return functools.partial(jax.lax.dot_general, preferred_element_type=jnp.float32)

  def dot_general(lhs, rhs, dimension_numbers, precision=None, **unused):
    del precision, unused
    if (tuple(map(tuple, dimension_numbers[0])) != ((lhs.ndim - 1,), (0,))
        or rhs.ndim != 2 or any(dimension_numbers[1])):
      raise ValueError(f'an output layer contracts its input\'s last axis with the kernel\'s '
                       f'first, got {dimension_numbers}')
    return _logits_dot_low_precision_grads(lhs, rhs, 0)
  return dot_general


class WordEmbedding(nn.Module):
  """A word table: the encoder's input, the decoder's input and (when tied) its output layer.

  Hand-written rather than `nn.Embed` + `nn.Dense` because tying must pass through the
  emb_dim -> d_model projection in both directions with the same weights.
  """

  config: TransformerConfig

  def setup(self):
    cfg = self.config
    # Unit-variance rows, as in the flax WMT example: comparable to the sinusoid's scale.
    self.table = self.param('embedding', nn.initializers.normal(stddev=1.0),
                            (cfg.vocab_size, cfg.emb_dim), jnp.float32)
    if cfg.emb_dim != cfg.d_model:
      self.projection = self.param('projection', nn.initializers.lecun_normal(),
                                   (cfg.emb_dim, cfg.d_model), jnp.float32)

  def __call__(self, ids: jax.Array) -> jax.Array:
    """int [...] -> [..., d_model] in the compute dtype."""
    dtype = self.config.dtype
    x = jnp.take(self.table, ids, axis=0).astype(dtype)
    if self.config.emb_dim != self.config.d_model:
      x = x @ self.projection.astype(dtype)
    return x

  def attend(self, y: jax.Array) -> jax.Array:
    """Tied output layer: [..., d_model] -> float32 logits [..., vocab]."""
    dtype = self.config.dtype
    product = logits_dot(self.config)
    y = y.astype(dtype)
    if self.config.emb_dim != self.config.d_model:
      y = product(y, self.projection.astype(dtype), 1).astype(dtype)
    # Rows of the table have unit variance: rescale so logits start at unit variance too.
    return product(y, self.table.astype(dtype), 1) / np.sqrt(self.config.d_model)


class PositionEncoding(nn.Module):
  """int positions [...] -> encodings [..., d_model] in the compute dtype.

  Attributes:
    max_len: rows of the learned table (unused for sinusoids, which have no limit).
    size_source: what fixes `max_len`, named in the error when positions exceed it.
  """

  config: TransformerConfig
  max_len: int
  size_source: str

  @nn.compact
  def __call__(self, positions: jax.Array, longest: int | None = None) -> jax.Array:
    """`longest` (static): how many positions from 0 `positions` may reach; by default its
    last axis' length (positions counted along it)."""
    cfg = self.config
    if not cfg.learned_positions:
      return sinusoid(positions, cfg.d_model).astype(cfg.dtype)
    longest = positions.shape[-1] if longest is None else longest
    if longest > self.max_len:
      raise ValueError(f'{longest} positions exceed the learned position table '
                       f'of {self.max_len} rows, fixed by {self.size_source}')
    table = self.param('positions', nn.initializers.normal(stddev=0.02),
                       (self.max_len, cfg.d_model), jnp.float32)
    return jnp.take(table, positions, axis=0).astype(cfg.dtype)


# What `jax.nn.dot_product_attention` gives a masked key's score (float32): far below any real
# score, yet finite, so that a row with every key masked averages them rather than making NaN.
MASKED_ATTENTION_SCORE = -0.7 * float(np.finfo(np.float32).max)


def _cached_attention(query: jax.Array, key: jax.Array, value: jax.Array, mask: jax.Array
                      ) -> jax.Array:
  """`jax.nn.dot_product_attention` (XLA's) over heads-major keys and values.

  Args:
    query: [B, T, heads, head_dim].
    key, value: [B, heads, L, head_dim].
    mask: bool, broadcastable to [B, heads, T, L].
  Returns:
    [B, T, heads, head_dim].
  """
  scores = jnp.einsum('bthd,bhld->bhtl', query, key, preferred_element_type=jnp.float32)
  scores = jnp.where(mask, scores * query.shape[-1] ** -0.5, MASKED_ATTENTION_SCORE)
  weights = jax.nn.softmax(scores, axis=-1).astype(value.dtype)
  return jnp.einsum('bhtl,bhld->bthd', weights, value)


class Attention(nn.Module):
  """Multi-head attention: inputs_q [B, T, d], inputs_kv [B, L, d], mask -> [B, T, d].

  No dropout on the attention probabilities: dropout acts on the sublayer outputs and the
  embeddings, as in Vaswani et al.

  With `decode`, a first call with the full-length inputs creates the layer's part of the
  'cache' collection and computes as without it; each later call feeds one position [B, 1, d].
  Self-attention then attends causally over a key/value cache (cached_key / cached_value
  [B, heads, max_len, head_dim], cache_index), the given mask replaced by "cached positions
  so far". Cross-attention (`cross`) keeps the keys and values of its fixed memory
  (memory_key / memory_value [B, heads, L, head_dim]), projected once at cache creation
  instead of at every step; later calls ignore `inputs_kv`. The caches are heads-major, the
  layout the attention's products read, and decoding attends by `_cached_attention`:
  `jax.nn.dot_product_attention` takes keys [B, L, heads, head_dim], and XLA then copied
  every cache into heads-major at every step of a search (a transposing copy per cache per
  layer, the costliest operations of a CPU's beam step after the output layer).
  """

  config: TransformerConfig
  decode: bool = False
  cross: bool = False

  @nn.compact
  def __call__(self, inputs_q: jax.Array, inputs_kv: jax.Array, mask: jax.Array
               ) -> jax.Array:
    cfg = self.config
    head_dim = cfg.d_model // cfg.num_heads
    project = functools.partial(_dense, cfg, (cfg.num_heads, head_dim), axis=-1)
    query = project(name='query')(inputs_q)  # [B, T, heads, head_dim]
    if self.decode:
      heads_major = lambda x: jnp.swapaxes(x, 1, 2)  # [B, L, heads, hd] -> [B, heads, L, hd]
      project_kv = lambda: (heads_major(project(name='key')(inputs_kv)),
                            heads_major(project(name='value')(inputs_kv)))
      if self.cross:
        key, value = self._memory_keys_values(project_kv)
      else:
        key, value, mask = self._update_cache(*project_kv(), mask)
      return _dense(cfg, cfg.d_model, axis=(-2, -1), name='out')(
          _cached_attention(query, key, value, mask))
    key = project(name='key')(inputs_kv)
    value = project(name='value')(inputs_kv)
    # XLA's implementation: the sequences are short (a query's <= 11 tokens, a session's few
    # queries), and cuDNN's fused attention was measured slower on a GPU (see `KERNELS`).
    out = jax.nn.dot_product_attention(query, key, value, mask=mask, implementation='xla')
    return _dense(cfg, cfg.d_model, axis=(-2, -1), name='out')(out)

  def _memory_keys_values(self, project_memory: Callable[[], tuple[jax.Array, jax.Array]]
                          ) -> tuple[jax.Array, jax.Array]:
    if self.has_variable('cache', 'memory_key'):
      return self.get_variable('cache', 'memory_key'), self.get_variable('cache', 'memory_value')
    key, value = project_memory()
    self.put_variable('cache', 'memory_key', key)
    self.put_variable('cache', 'memory_value', value)
    return key, value

  def _update_cache(self, key: jax.Array, value: jax.Array, mask: jax.Array
                    ) -> tuple[jax.Array, jax.Array, jax.Array]:
    initialized = self.has_variable('cache', 'cached_key')
    cached_key = self.variable('cache', 'cached_key', jnp.zeros, key.shape, key.dtype)
    cached_value = self.variable('cache', 'cached_value', jnp.zeros, value.shape, value.dtype)
    cache_index = self.variable('cache', 'cache_index', lambda: jnp.array(0, jnp.int32))
    if not initialized:
      return key, value, mask
    batch, heads, max_len, head_dim = cached_key.value.shape
    if key.shape != (batch, heads, 1, head_dim):
      raise ValueError(f'a decoding step takes one position per row: expected keys of shape '
                       f'{(batch, heads, 1, head_dim)}, got {key.shape}')
    index = cache_index.value
    cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, key, (0, 0, index, 0))
    cached_value.value = jax.lax.dynamic_update_slice(cached_value.value, value,
                                                      (0, 0, index, 0))
    cache_index.value = index + 1
    seen = (jnp.arange(max_len) <= index)[None, None, None, :]
    return cached_key.value, cached_value.value, seen


class TransformerLayer(nn.Module):
  """Self-attention, then cross-attention when `cross_attention`, then a ReLU feed-forward.

  Each sublayer is wrapped in Add & Norm: post-norm LayerNorm(x + Dropout(f(x))) as in the
  paper, or pre-norm x + Dropout(f(LayerNorm(x))) with `config.pre_norm`. Called as
  (x [B, T, d], self_mask, memory [B, L, d] | None, memory_mask | None) -> (x, None), the
  carry signature `nn.scan` needs.
  """

  config: TransformerConfig
  cross_attention: bool
  train: bool
  decode: bool = False

  def _add_norm(self, x: jax.Array, sublayer: Callable[[jax.Array], jax.Array],
                name: str) -> jax.Array:
    cfg = self.config
    dropout = Dropout(cfg.dropout, deterministic=not self.train)
    if cfg.pre_norm:
      return x + dropout(sublayer(layer_norm(cfg, f'{name}_norm')(x)))
    return layer_norm(cfg, f'{name}_norm')(x + dropout(sublayer(x)))

  @nn.compact
  def __call__(self, x: jax.Array, self_mask: jax.Array, memory: jax.Array | None = None,
               memory_mask: jax.Array | None = None) -> tuple[jax.Array, None]:
    cfg = self.config
    self_attention = Attention(cfg, decode=self.decode, name='self_attention')
    x = self._add_norm(x, lambda h: self_attention(h, h, self_mask), 'self_attention')
    if self.cross_attention:
      cross_attention = Attention(cfg, decode=self.decode, cross=True, name='cross_attention')
      x = self._add_norm(x, lambda h: cross_attention(h, memory, memory_mask),
                         'cross_attention')
    hidden = _dense(cfg, cfg.ff_dim, name='ff_hidden')
    output = _dense(cfg, cfg.d_model, name='ff_output')
    x = self._add_norm(x, lambda h: output(nn.relu(hidden(h))), 'feed_forward')
    return x, None


class LayerStack(nn.Module):
  """`num_layers` TransformerLayers: [B, T, d] -> [B, T, d] (+ final LayerNorm when pre-norm).

  With `config.scan_layers` the layers run under `nn.scan` (parameters and cache stacked on a
  leading layer axis under 'layers'), so compile time stays flat as depth grows, and
  `config.scan_unroll` of them run per iteration of the compiled loop; otherwise a Python
  loop ('layers_0', 'layers_1', ...), whose parameters draw other initial values and dropout
  masks (each layer's random keys follow from its name, not from the scan's split).
  `config.remat` rematerialises each layer in training. Both layouts compute the same
  function of the same parameters; see `loop_to_scan_params`.
  """

  config: TransformerConfig
  num_layers: int
  cross_attention: bool = False

  @nn.compact
  def __call__(self, x: jax.Array, self_mask: jax.Array, memory: jax.Array | None = None,
               memory_mask: jax.Array | None = None, *, train: bool,
               decode: bool = False) -> jax.Array:
    cfg = self.config
    layer_cls = TransformerLayer
    if cfg.remat != 'none' and train:
      # Inside scan, CSE cannot merge the recomputation away, so prevent_cse is not needed.
      layer_cls = nn.remat(TransformerLayer, policy=REMAT_POLICIES[cfg.remat],
                           prevent_cse=not cfg.scan_layers)
    layer_args = (self_mask,) if memory is None else (self_mask, memory, memory_mask)
    layer_kwargs = dict(config=cfg, cross_attention=self.cross_attention, train=train,
                        decode=decode)
    if cfg.scan_layers:
      scanned = nn.scan(layer_cls, variable_axes={'params': 0, 'cache': 0},
                        split_rngs={'params': True, 'dropout': True},
                        in_axes=(nn.broadcast,) * len(layer_args), length=self.num_layers,
                        unroll=cfg.scan_unroll)
      x, _ = scanned(**layer_kwargs, name='layers')(x, *layer_args)
    else:
      for i in range(self.num_layers):
        x, _ = layer_cls(**layer_kwargs, name=f'layers_{i}')(x, *layer_args)
    if cfg.pre_norm:
      x = layer_norm(cfg, 'final_norm')(x)
    return x


def loop_to_scan_params(tree: Any) -> Any:
  """Stacks every LayerStack's 'layers_0..k' subtrees into one 'layers' subtree (axis 0).

  Works on any pytree of dicts, tuples and named tuples, such as an optimizer state whose
  moments mirror the parameters; other leaves pass unchanged.
  """
  if isinstance(tree, tuple):
    return _rebuild_tuple(tree, map(loop_to_scan_params, tree))
  if not isinstance(tree, dict):
    return tree
  if 'layers_0' in tree:
    count = sum(1 for k in tree if k.startswith('layers_'))
    rest = {k: loop_to_scan_params(v) for k, v in tree.items() if not k.startswith('layers_')}
    per_layer = [tree[f'layers_{i}'] for i in range(count)]
    return {**rest, 'layers': jax.tree.map(lambda *xs: jnp.stack(xs), *per_layer)}
  return {k: loop_to_scan_params(v) for k, v in tree.items()}


def scan_to_loop_params(tree: Any) -> Any:
  """The inverse of `loop_to_scan_params`: unstacks every 'layers' subtree of a LayerStack."""
  if isinstance(tree, tuple):
    return _rebuild_tuple(tree, map(scan_to_loop_params, tree))
  if not isinstance(tree, dict):
    return tree
  if 'layers' in tree and isinstance(tree['layers'], dict):
    count = jax.tree.leaves(tree['layers'])[0].shape[0]
    rest = {k: scan_to_loop_params(v) for k, v in tree.items() if k != 'layers'}
    return {**rest, **{f'layers_{i}': jax.tree.map(lambda x, i=i: x[i], tree['layers'])
                       for i in range(count)}}
  return {k: scan_to_loop_params(v) for k, v in tree.items()}


def _rebuild_tuple(original: tuple, items) -> tuple:
  items = tuple(items)
  return type(original)(*items) if hasattr(original, '_fields') else type(original)(items)


def convert_layer_layout(tree: Any, *, scan_layers: bool) -> Any:
  """A parameter (or optimizer-state) tree in the layout `scan_layers` asks for, whichever
  layout it is in: a checkpoint trained with one layout runs and resumes with the other."""
  return loop_to_scan_params(tree) if scan_layers else scan_to_loop_params(tree)


class Decoder(nn.Module):
  """The standard Transformer decoder: it reads one memory row to generate the next query.

  (memory [B, L, d], memory_mask bool [B, L], decoder_inputs int [B, T]) -> hidden [B, T, d],
  the states the output layer maps to the vocabulary.
  Self-attention is causal only: with `<s>` first and padding last, later padding never
  reaches a real position, and the teacher-forced pass is exactly the step-by-step decode.
  With `decode`, see `Attention`: the first call (inputs [B, max_len]) creates the cache,
  then each call takes [B, 1]; the next position is kept in the cache too.
  With `parents` int [B, T] (not when decoding), a row holds several sequences as a tree of
  their shared prefixes (`tree_positions_and_mask`), each computed exactly as alone in a row
  of its own: scoring many candidates after one memory row then projects that row's memory
  once per row, not once per candidate, and reads a shared prefix once.
  """

  config: TransformerConfig
  embedding: WordEmbedding

  @nn.compact
  def __call__(self, memory: jax.Array, memory_mask: jax.Array, decoder_inputs: jax.Array, *,
               train: bool, decode: bool, parents: jax.Array | None = None) -> jax.Array:
    cfg = self.config
    length = decoder_inputs.shape[-1]
    positions, self_mask = jnp.arange(length), causal_mask(length)
    longest = length
    if parents is not None:
      if decode:
        raise ValueError('packed sequences (parents) are read whole, not decoded step by step')
      positions, self_mask = tree_positions_and_mask(parents)
      # A packed row's positions are its sequences' depths, not its width: each sequence is
      # a target of at most `target_len` tokens, as an unpacked row is (the packer cuts them
      # so: `teacher_forcing._candidate_ids`; a deeper one would read past the table).
      longest = min(length, cfg.target_len)
    if decode:
      initialized = self.has_variable('cache', 'next_position')
      next_position = self.variable('cache', 'next_position', lambda: jnp.array(0, jnp.int32))
      if initialized:
        positions = positions + next_position.value
        next_position.value = next_position.value + length
    x = self.embedding(decoder_inputs)
    x = x + PositionEncoding(cfg, cfg.target_len,
                             'config.data.max_query_words + 1 (the words and </s>)',
                             name='positions')(positions, longest)
    x = Dropout(cfg.dropout, deterministic=not train)(x)
    return LayerStack(cfg, cfg.decoder_layers, cross_attention=True, name='stack')(
        x, self_mask, memory, padding_mask(memory_mask), train=train, decode=decode)
