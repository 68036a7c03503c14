"""What every model shares: its config, the pair layout of a session, the entry points.

A session batch is a dict of arrays (`mtn_jax.data.input_pipeline`); the models read `queries` int32
`[batch, S, n]` (0 = padding). Pair t (t = 0..S-2) predicts query t+1 after queries 0..t. The
decoder reads `<s>` + next query and predicts next query + `</s>`, so its length is T = n + 1.

- `ModelConfig`: the fields every model has; each model extends it with its own (one config
  per model, registered with it in `mtn_jax.models`), so a checkpoint records, and is checked
  against, only the fields its model reads; its `check` refuses the values of `config.model`
  its model cannot work with.
- `decoder_io`: queries [B, S, n] -> decoder inputs, targets, weights [B, S-1, T].
- `session_sources`: queries [B, S, n] -> `q_0 <sep> ... <sep> q_t` sources [B*S, L] and their
  lengths [B*S], L = S*(n+1) - 1: the flat source of the Transformer and Seq2Seq baselines.
- `SessionModel`: the entry points every model has, given its `encode`, `decode_hidden`,
  `output_logits` and `output_modules` (N decoder rows, T' steps, H hidden features,
  V words):
    `encode(batch, *, train=False)` -> memory, leaves leading with B*S;
    `decode_hidden(memory, decoder_inputs int32 [N, T'], *, train=False, decode=False)`
      -> hidden [N, T', H], what the output layer reads (dropout included);
    `output_logits(hidden [..., H])` -> float32 logits [..., V];
    `output_head()` -> (logits function of (head params, hidden), head params): the output
      layer as a pure function, for the fused loss (`mtn_jax.tasks.losses.output_layer_losses`);
    `decode(memory, decoder_inputs [N, T'], *, train=False, decode=False)` -> next-token
      scores [N, T', V'] (logits; a copying model's log-probabilities over V' >= V);
    `session_outputs(batch, *, train)` -> the loss's inputs: hidden [B, S-1, T, H] of every
      pair, and a copying model's gate and copy attention;
    `__call__(batch, *, train)` -> float32 scores [B, S-1, T, V'].
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from mtn_jax import errors
from mtn_jax.data.vocab import BOS_ID
from mtn_jax.data.vocab import EOS_ID
from mtn_jax.data.vocab import PAD_ID
from mtn_jax.data.vocab import SEP_ID
from mtn_jax.models import user_memory

Batch = Mapping[str, jax.Array]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
  """Static hyper-parameters every model has (hashable, so modules can hold it).

  Each model's config extends this one (`mtn_jax.models.REGISTRY` pairs them); the data
  decides `vocab_size` and `max_query_words`, `config.model` the rest.
  """

  name: str
  vocab_size: int
  max_query_words: int  # n: tokens per query; MTN's query projection has n weights
  max_session_queries: int  # queries a context may hold (query-position tables)
  emb_dim: int
  dropout: float
  share_embeddings: bool  # one word table for encoder and decoder (False: one each)
  tie_embeddings: bool  # the output layer reuses the decoder's word table
  compute_dtype: str

  # Fields that change neither the parameters nor their meaning: a checkpoint is restored
  # under any values of these (`mtn_jax.training.checkpoints.architecture`).
  RUNTIME_FIELDS = ('dropout', 'compute_dtype')
  # Whether the model has a memory of the user's earlier queries (`config.model.user_memory`).
  HAS_USER_MEMORY = False
  # Fields the data decides, never a key of `config.model` (`config_keys`).
  DATA_FIELDS = ('vocab_size', 'max_query_words', 'num_items', 'num_users')
  # Fields every model's config holds (configs/default.py) that this model does not read, each
  # with the value that says so: set to another, they would change nothing (`check` refuses
  # it), and a checkpoint is not compared on them (`unread_fields`).
  INERT_FIELDS: ClassVar[Mapping[str, Any]] = {}

  @classmethod
  def check(cls, model: Mapping[str, Any]) -> None:
    """Raises `errors.ConfigError` naming the first key of `model` (the run's `config.model`,
    which holds its family's keys, configs/families.py) whose value this model cannot work
    with. Each model's
    config adds its own fields' rules; rules that involve other sections are
    `mtn_jax.config_lib.validate`'s."""
    check_positive(model, 'emb_dim', 'max_session_queries')
    if not 0 <= model.dropout < 1:
      raise errors.ConfigError(f'config.model.dropout must be in [0, 1), got {model.dropout}')
    check_choice(model, 'compute_dtype', ('float32', 'bfloat16'))
    for key, inert in cls.INERT_FIELDS.items():
      if model[key] != inert:
        raise errors.ConfigError(f'config.model.{key}={model[key]!r}: {model.name!r} does not '
                                 f'read it (leave it at {inert!r})')
    if cls.HAS_USER_MEMORY:
      check_choice(model, 'user_memory', user_memory.USER_MEMORIES)
    elif model.get('user_memory', 'none') != 'none':
      raise errors.ConfigError('config.model.user_memory is an option of MTN and the '
                               f"Transformer; {model.name!r} has none (set it to 'none')")

  def unread_fields(self) -> tuple[str, ...]:
    """Fields of this config that the model it names does not read (a family's keys that
    only some of its models use): they fix nothing, and a checkpoint is not compared on
    them (`mtn_jax.training.checkpoints.architecture`)."""
    return tuple(self.INERT_FIELDS)

  @classmethod
  def reads_user_history(cls, model: Mapping[str, Any]) -> bool:
    """Whether the model, as `model` sets it, reads each user's earlier queries
    (`config.data.history_queries`)."""
    return cls.HAS_USER_MEMORY and model.user_memory != 'none'

  @classmethod
  def copies(cls, model: Mapping[str, Any]) -> bool:
    """Whether the model, as `model` sets it, mixes copied session words into its output."""
    del model
    return False

  @classmethod
  def field_names(cls) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))

  @classmethod
  def config_keys(cls) -> tuple[str, ...]:
    """The keys of `config.model` this model reads: its fields but the data's."""
    return tuple(k for k in cls.field_names() if k not in cls.DATA_FIELDS)

  @classmethod
  def from_fields(cls, fields: Mapping[str, Any], **overrides) -> ModelConfig:
    """This config from a mapping that may hold other models' fields too (`config.model`,
    a checkpoint's saved model config); `overrides` win. A field with a default (one added
    after older checkpoints were written) may be missing; any other raises KeyError."""
    defaults = {f.name for f in dataclasses.fields(cls)
                if f.default is not dataclasses.MISSING}
    merged = {k: fields[k] for k in cls.field_names()
              if k not in overrides and (k in fields or k not in defaults)}
    return cls(**merged, **overrides)

  def replace(self, **changes) -> ModelConfig:
    return dataclasses.replace(self, **changes)

  @property
  def target_len(self) -> int:
    """T: decoder positions, the next query's words plus `</s>`."""
    return self.max_query_words + 1

  @property
  def dtype(self):
    return jnp.bfloat16 if self.compute_dtype == 'bfloat16' else jnp.float32


def check_positive(model: Mapping[str, Any], *keys: str) -> None:
  """Refuses the first of `keys` of `config.model` that is not above 0."""
  errors.check_positive(model, 'config.model', *keys)


def check_choice(model: Mapping[str, Any], key: str, choices: tuple[str, ...]) -> None:
  """Refuses `config.model.<key>` unless it is one of `choices`."""
  errors.check_choice(model, 'config.model', key, choices)


def decoder_io(queries: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Teacher-forcing inputs for every pair of a session batch.

  Args:
    queries: int32 [B, S, n] word ids, 0-padded.
  Returns:
    decoder_inputs: int32 [B, S-1, n+1], `<s>` + query t+1.
    targets: int32 [B, S-1, n+1], query t+1 + `</s>`, 0-padded.
    weights: float32 [B, S-1, n+1], 1 on real target tokens (`</s>` included); a pair whose
      next query is all padding (a padding row) weighs 0 everywhere.
  """
  nxt = queries[:, 1:]
  b, p, n = nxt.shape
  lengths = (nxt != PAD_ID).sum(-1)  # [B, S-1]
  padded = jnp.concatenate([nxt, jnp.zeros((b, p, 1), nxt.dtype)], axis=-1)
  positions = jnp.arange(n + 1)
  targets = jnp.where(positions == lengths[..., None], EOS_ID, padded)
  targets = jnp.where(lengths[..., None] > 0, targets, PAD_ID)
  decoder_inputs = jnp.concatenate([jnp.full((b, p, 1), BOS_ID, nxt.dtype), nxt], axis=-1)
  weights = (targets != PAD_ID).astype(jnp.float32)
  return decoder_inputs, targets, weights


def session_sources(queries: jax.Array) -> tuple[jax.Array, jax.Array]:
  """For each session position t, queries 0..t joined by `<sep>` into one flat source.

  Args:
    queries: int32 [B, S, n] word ids, 0-padded.
  Returns:
    sources: int [B * S, L], L = S * (n + 1) - 1, the dtype of `queries`: row b * S + t holds
      `q_0 <sep> q_1 ... <sep> q_t` of session b from column 0 with no padding gaps, then
      padding. An empty query (a padding row) adds neither words nor a `<sep>`, so its source
      equals that of the last real query before it.
    lengths: int32 [B * S], real tokens of each source.
  """
  batch, num_queries, num_tokens = queries.shape
  query_lengths = (queries != PAD_ID).sum(-1)  # [B, S]
  # Each query gets a trailing <sep> slot, real when the query is not empty.
  with_sep = jnp.concatenate(
      [queries, jnp.full((batch, num_queries, 1), SEP_ID, queries.dtype)], axis=-1)
  real = jnp.concatenate([queries != PAD_ID, (query_lengths > 0)[..., None]], axis=-1)
  flat_tokens = with_sep.reshape(batch, num_queries * (num_tokens + 1))
  flat_real = real.reshape(batch, num_queries * (num_tokens + 1))
  # A stable sort on "is padding" moves the real tokens to the front, in session order. The
  # last query's <sep> ends no source, so the compacted length drops that slot.
  order = jnp.argsort(~flat_real, axis=-1, stable=True)
  session_tokens = jnp.take_along_axis(flat_tokens, order, axis=-1)[:, :-1]  # [B, L]
  # Source t ends where the <sep> after its last non-empty query would start.
  ends = jnp.cumsum(query_lengths + (query_lengths > 0), axis=-1) - 1  # [B, S]
  lengths = jnp.maximum(ends, 0).astype(jnp.int32)
  is_source = jnp.arange(session_tokens.shape[-1]) < lengths[..., None]  # [B, S, L]
  sources = jnp.where(is_source, session_tokens[:, None], PAD_ID)
  return sources.reshape(batch * num_queries, -1), lengths.reshape(batch * num_queries)


def word_embeddings(config: ModelConfig, make_table: Callable[..., nn.Module]
                    ) -> tuple[nn.Module, nn.Module]:
  """(encoder's, decoder's) word tables, made by `make_table(name=...)` inside a `setup`.

  With `config.share_embeddings` both are one module, 'word_embedding'; otherwise the encoder
  and decoder each learn their own, 'encoder_embedding' and 'decoder_embedding', as in the
  paper's (standard Transformer) setup with separate source and target embeddings.
  """
  if config.share_embeddings:
    table = make_table(name='word_embedding')
    return table, table
  return make_table(name='encoder_embedding'), make_table(name='decoder_embedding')


class SessionModel(nn.Module):
  """The session-level entry points, shared by every model (see the module docstring).

  A subclass defines `encode`, CAUSAL over queries (row b*S + t of its memory depends on
  queries 0..t of session b only), `decode_hidden`, `output_logits` and `output_modules`.
  """

  config: ModelConfig

  def output_modules(self) -> tuple[nn.Module, ...]:
    """The submodules `output_logits` reads, and no others."""
    raise NotImplementedError

  def output_head(self) -> tuple[Callable[[Any, jax.Array], jax.Array], dict]:
    """The output layer as a pure function and its parameters, for the fused loss.

    Returns:
      logits_fn: (head params, hidden [..., H]) -> float32 logits [..., V], what
        `output_logits` computes;
      head params: the parameters of `output_modules()`, by their names. The fused loss
        differentiates the output layer inside its own loop over chunks of tokens
        (`mtn_jax.tasks.losses.output_layer_losses`), so it takes them as an explicit argument;
        under `jax.grad` of the whole model they are the model's own parameters, and their
        gradients reach the model's.
    """
    params = {module.name: module.variables['params'] for module in self.output_modules()}
    unbound = self.clone(parent=None)
    return (lambda head_params, hidden: unbound.apply({'params': head_params}, hidden,
                                                      method='output_logits')), params

  def output_scores(self, hidden: jax.Array, memory, *, decode: bool = False) -> jax.Array:
    """hidden [N, T', H] of memory rows [N, ...] -> float32 [N, T', V'], the next-token
    scores whose log-softmax is the next-token distribution: the logits, or for a model that
    copies, the log-probabilities over its extended vocabulary (`copying`)."""
    del memory, decode
    return self.output_logits(hidden)

  def copy_inputs(self, hidden: jax.Array, memory) -> dict[str, jax.Array]:
    """What the copy mixture adds to the loss's inputs (`losses.copy_token_losses`): 'gate'
    [N, T'], 'copy_scores' [N, T', L] and 'copy_ids' [N, L]; nothing for a model that does
    not copy."""
    del hidden, memory
    return {}

  # Whether a decoder row may hold several sequences as a tree of their shared prefixes
  # (`decode`'s `parents`): an attention decoder masks each to its own ancestors; a recurrent
  # one would carry its state across.
  packs_sequences = False

  def decode(self, memory, decoder_inputs: jax.Array, *, train: bool = False,
             decode: bool = False, parents: jax.Array | None = None) -> jax.Array:
    """Memory of N rows, decoder_inputs int32 [N, T'] -> float32 scores [N, T', V']
    (`output_scores`).

    With `decode`, the call that creates the 'cache' collection (inputs [N, max_len])
    computes as without it; later calls take one step [N, 1] each and continue from it.
    With `parents` int32 [N, T'] (a model that `packs_sequences`), row n holds several
    sequences as a tree of their prefixes, each starting with `<s>` at a root (-1):
    parents[n, t] is the position whose token position t follows, and each sequence is
    scored as if it were alone after memory row n (`layers.tree_positions_and_mask`).
    """
    if parents is None:
      hidden = self.decode_hidden(memory, decoder_inputs, train=train, decode=decode)
    elif not self.packs_sequences:
      raise ValueError(f'{type(self).__name__} reads one sequence per row: it takes no '
                       'parents')
    else:
      hidden = self.decode_hidden(memory, decoder_inputs, train=train, decode=decode,
                                  parents=parents)
    return self.output_scores(hidden, memory, decode=decode)

  def _pairs(self, batch: Batch, train: bool):
    """(memory of the contexts [B*(S-1), ...], decoder inputs int32 [B*(S-1), n+1]) of the
    pairs t = 0..S-2 of batch['queries'] int32 [B, S, n]."""
    queries = batch['queries']
    if queries.ndim != 3 or not jnp.issubdtype(queries.dtype, jnp.integer):
      raise ValueError(f'queries must be integer word ids [batch, queries, tokens], '
                       f'got shape {queries.shape} and dtype {queries.dtype}')
    num_sessions, num_queries, _ = queries.shape
    if num_queries < 2:
      raise ValueError(f'a session batch needs at least 2 queries per session to form a '
                       f'(previous queries -> next query) pair, got {num_queries}')
    # Position t's context reads queries 0..t only, so the last query, which no pair reads as
    # context, is left out of the encoder rather than encoded and discarded.
    memory = self.encode(context_batch(batch), train=train)
    decoder_inputs, _, _ = decoder_io(queries)
    return memory, decoder_inputs.reshape(num_sessions * (num_queries - 1), -1)

  def session_outputs(self, batch: Batch, *, train: bool) -> dict[str, jax.Array]:
    """What the loss reads for every pair t = 0..S-2 of batch['queries'] int32 [B, S, n]:
    'hidden' [B, S-1, n+1, H], the decoder states the output layer maps to the vocabulary,
    and a copying model's `copy_inputs`, each with the leading [B, S-1]."""
    memory, decoder_inputs = self._pairs(batch, train)
    hidden = self.decode_hidden(memory, decoder_inputs, train=train)
    outputs = {'hidden': hidden, **self.copy_inputs(hidden, memory)}
    lead = batch['queries'].shape[:1] + (batch['queries'].shape[1] - 1,)
    return {k: v.reshape(lead + v.shape[1:]) for k, v in outputs.items()}

  def __call__(self, batch: Batch, *, train: bool) -> jax.Array:
    """batch['queries'] int32 [B, S, n] -> float32 scores [B, S-1, n+1, V'] of pairs
    0..S-2 (`output_scores`: logits, or a copying model's log-probabilities)."""
    memory, decoder_inputs = self._pairs(batch, train)
    scores = self.decode(memory, decoder_inputs, train=train)
    return scores.reshape(batch['queries'].shape[:1] + (-1,) + scores.shape[1:])


def context_batch(batch: Batch) -> dict:
  """The batch without each session's last query: the contexts of positions 0..S-2.

  Every per-query key ([B, S, ...]) loses its last query; others pass unchanged.
  """
  return {k: v[:, :-1] if k in PER_QUERY_KEYS else v for k, v in batch.items()}


# Batch keys whose second axis is the session's queries (`context_batch` cuts them).
PER_QUERY_KEYS = ('queries', 'oov')


def count_params(params) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


def size_mb(params) -> float:
  """Model size as the paper's Table 2 gives it: fp32 bytes, in MB (2**20 bytes)."""
  return count_params(params) * 4 / 2**20
