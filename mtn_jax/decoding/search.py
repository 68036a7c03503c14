"""The search for suggestions: batched beam search and greedy decoding for every model.

Flows in: a model of `mtn_jax.models` with its params, and either encoder `memory` (a dict
whose leaves lead with N, one context per row) or a session batch (`queries` int32
[batch, queries, tokens]) for `search_sessions`. Flows out: hypotheses int32
[N, beam, max_len] (the words after `<s>`, ending with `</s>` when the hypothesis finished,
0-padded) and their scores float32 [N, beam], best first; `suggestion_list` turns one row of
them into the ranked suggestions the modes write. `SearchSettings` is `config.decode`'s search
part, read in one place.

Scores are GNMT-normalised log-probabilities (Wu et al. 2016): the sum of the token
log-probabilities, `</s>` included, divided by ((5 + L) / 6) ** alpha, L = tokens generated.
A hypothesis that reaches `max_len` tokens without `</s>` is finished there (L = max_len),
so every returned sequence is a complete suggestion. `<pad>`, `<s>` and `<sep>` are never
emitted, nor is `<unk>` unless asked for (`emit_unk`): a suggestion holding `<unk>` tells a
user nothing and can never match a logged query, yet on a log with many rare words `<unk>` is
often the single likeliest token. Their probability mass is removed, not redistributed, so a
score is exactly what `sequence_log_prob` gives the same tokens.

The encoder runs once; beams then decode step by step from the model's 'cache' collection
(key/value caches, or a recurrent state) inside one `lax.while_loop`. Every entry point is
`jax.jit`-compiled with the model and the sizes static, so it compiles once per (model,
shapes) and later calls reuse the executable. The search is written here because no
maintained library offers one over a Linen cache: flax has it as example code (examples/wmt,
whose state layout this follows) and t5x only inside its own framework.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from mtn_jax.data.vocab import BOS_ID
from mtn_jax.data.vocab import EOS_ID
from mtn_jax.data.vocab import PAD_ID
from mtn_jax.data.vocab import SEP_ID
from mtn_jax.data.vocab import UNK_ID
from mtn_jax.data.vocab import Vocab
from mtn_jax.decoding import mbr

NEVER_EMITTED = (PAD_ID, BOS_ID, SEP_ID)
# After every position of sessions S queries wide, `search_sessions` searches at most this
# // S positions of each session a call (one at least): a call's memory grows with its rows
# times their width.
SEARCH_POSITIONS_BY_WIDTH = 25

Memory = Any  # a pytree of arrays, every leaf [N, ...]


@dataclasses.dataclass(frozen=True)
class SearchSettings:
  """How suggestions are searched and how many are kept: `config.decode`'s search keys."""

  beam_size: int
  max_len: int  # most tokens generated, `</s>` included
  length_penalty: float  # GNMT alpha
  emit_unk: bool
  top_k: int  # suggestions kept per context, best first (<= beam_size)
  # A word is not emitted twice in one suggestion: queries almost never repeat a word, and a
  # copy mixture otherwise loops on the word it copies ("schools schools schools").
  block_repeats: bool = False
  # The beam's suggestions reordered by minimum Bayes risk (`mtn_jax.decoding.mbr`): 'none', 'beam' (among
  # the hypotheses), 'beam+session' (the session's queries are candidates too).
  mbr: str = 'none'
  # The user-facing protocol: no suggestion repeats a query the session already holds, none
  # is empty (decode and suggest output; evaluation reports both protocols whatever this
  # says).
  exclude_session_queries: bool = False

  @classmethod
  def from_config(cls, decode: ml_collections.ConfigDict) -> SearchSettings:
    values = {f.name: decode[f.name] for f in dataclasses.fields(cls) if f.name != 'mbr'}
    return cls(**values, mbr=mbr.from_decode(decode)[0])

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)

  def whole_beam(self) -> SearchSettings:
    """This search keeping every hypothesis in the generator's own order, nothing dropped:
    the candidates that a strategy, reranking or the user-facing protocol then cuts."""
    return dataclasses.replace(self, exclude_session_queries=False, top_k=self.beam_size)


def length_penalty(length, alpha):
  """GNMT's length penalty ((5 + length) / 6) ** alpha, element-wise (arrays or numbers)."""
  return ((5.0 + length) / 6.0) ** alpha


def length_normalize(log_prob: jax.Array, length: jax.Array,
                     alpha: float | jax.Array) -> jax.Array:
  """log_prob / `length_penalty`, element-wise."""
  return log_prob / length_penalty(length, alpha)


def sequence_lengths(sequences: jax.Array) -> jax.Array:
  """int32 [...] tokens that count in a score, for sequences int [..., L] as decoded here.

  Up to and including the first `</s>`; a sequence without `</s>` (finished at max_len, or
  given by a caller) counts its non-padding tokens.
  """
  is_end = sequences == EOS_ID
  return jnp.where(is_end.any(-1), jnp.argmax(is_end, axis=-1) + 1,
                   (sequences != PAD_ID).sum(-1)).astype(jnp.int32)


def to_words(vocab: Vocab, sequence: Sequence[int] | np.ndarray | jax.Array,
             oov_words: Sequence[str] = ()) -> list[str]:
  """The words of one decoded sequence int [L], up to `</s>`; an extended id V + k (a copied
  word outside the vocabulary) is the context's k-th such word, `oov_words[k]`."""
  return vocab.decode(np.asarray(sequence), oov_words)


def suggestion_list(vocab: Vocab, sequences: np.ndarray, scores: np.ndarray,
                    top_k: int, oov_words: Sequence[str] = ()) -> list[dict]:
  """The first `top_k` hypotheses (int [beam, max_len], scores [beam], best first) as
  [{'query': words joined by spaces, 'score': float}]; empty beam slots are left out, and
  so is a subword text holding U+FFFD (byte pieces that make no character: a cut one).
  `oov_words`: the context's words outside the vocabulary (`to_words`)."""
  out = []
  for k in range(len(scores)):
    if len(out) == top_k:
      break
    if np.isfinite(scores[k]):
      text = vocab.decode_text(sequences[k], oov_words)
      if vocab.kind == 'word' or BROKEN_CHARACTER not in text:
        out.append({'query': text, 'score': float(scores[k])})
  return out


BROKEN_CHARACTER = '\ufffd'  # what a decoder writes for bytes that make no character


def shown_to_user(query: str, typed: set[str] | frozenset[str]) -> bool:
  """Whether the user-facing protocol shows `query` after a session whose queries are
  `typed`: it is not one of them, nor empty (a model that ends the query at once writes '';
  a person is offered nothing to click). The one rule of `ranked_suggestions`, the
  pipeline's lists (`pipeline.show`, the blend's quotas) and their scores
  (`metrics.without_session_queries`)."""
  return bool(query) and query not in typed


def ranked_suggestions(vocab: Vocab, sequences: np.ndarray, scores: np.ndarray,
                       settings: SearchSettings, session: Sequence[str] = (),
                       oov_words: Sequence[str] = ()) -> list[dict]:
  """A context's suggestions as the modes write them: the beam's hypotheses (int
  [beam, max_len], scores [beam]) as [{'query', 'score', ...}], reranked as
  `settings.mbr` says (with the whole beam as evidence), the first `settings.top_k`.
  `session`: the context's queries (candidates for 'beam+session'; left out with
  `settings.exclude_session_queries`)."""
  # Reranking reads the whole beam and exclusion may drop some: else top_k are all we need.
  whole_beam = settings.mbr != 'none' or settings.exclude_session_queries
  ranked = suggestion_list(vocab, sequences, scores, len(scores) if whole_beam
                           else settings.top_k, oov_words)
  if settings.mbr != 'none':
    ranked = mbr.rerank(ranked, session if settings.mbr == 'beam+session' else ())
  if settings.exclude_session_queries:
    typed = set(session)
    ranked = [r for r in ranked if shown_to_user(r['query'], typed)]
  return ranked[:settings.top_k]


# ---------------------------------------------------------------------------------------------
# Model steps


def _num_rows(memory: Memory) -> int:
  leaves = jax.tree.leaves(memory)
  if not leaves:
    raise ValueError('memory has no arrays')
  rows = {x.shape[0] if x.ndim else None for x in leaves}
  if len(rows) != 1 or None in rows:
    raise ValueError('every memory leaf must lead with the number of rows N, got shapes '
                     f'{[x.shape for x in leaves]}')
  return rows.pop()


def _repeat_rows(memory: Memory, times: int) -> Memory:
  """[N, ...] -> [N * times, ...], row n * times + k = row n: one copy per beam."""
  return jax.tree.map(lambda x: jnp.repeat(x, times, axis=0), memory)


def _apply_decode(model, params, cache, memory: Memory, tokens: jax.Array):
  """One `decode=True` call: (logits float32 [R, T', V], the updated cache).

  Without a cache this is the creating call (tokens [R, max_len]); with one, a step
  (tokens [R, 1]).
  """
  variables = {'params': params} if cache is None else {'params': params, 'cache': cache}
  logits, updated = model.apply(variables, memory, tokens, decode=True, mutable=['cache'],
                                method='decode')
  return logits, updated['cache']


def _create_cache(model, params, memory: Memory, max_len: int):
  """The model's decoding cache for `memory` rows [R, ...], before the first step."""
  tokens = jnp.zeros((_num_rows(memory), max_len), jnp.int32)
  return _apply_decode(model, params, None, memory, tokens)[1]


def _cache_row_axes(model, params, memory: Memory, max_len: int, cache):
  """The axis of each leaf of `cache` (made for `memory` rows [R, ...]) that indexes R.

  Caches differ by model (a scanned layer stack puts its layer axis first, a step counter has
  no row axis, a recurrent state has only rows), so the row axis is found rather than assumed:
  it is the one axis whose size changes when the cache is made for one more row. The probe is
  `jax.eval_shape`, which costs a trace and no computation.
  Returns:
    the cache's structure with an int axis, or None, per leaf.
  """
  grown = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct((x.shape[0] + 1, *x.shape[1:]), x.dtype), memory)
  grown_cache = jax.eval_shape(
      functools.partial(_create_cache, model, max_len=max_len), params, grown)

  def row_axis(leaf, grown_leaf):
    changed = [a for a, (s, g) in enumerate(zip(leaf.shape, grown_leaf.shape)) if s != g]
    if len(changed) > 1:
      raise ValueError(f'a cache leaf of shape {leaf.shape} grows along several axes with the '
                       'number of decoded rows; expected one row axis')
    return changed[0] if changed else None

  return jax.tree.map(row_axis, cache, grown_cache)


# Cache entries projected from the memory once per search: the same for every beam of a row.
_MEMORY_PROJECTIONS = ('memory_key', 'memory_value', 'copy_keys')


def _take_rows(cache, axes, rows: jax.Array, *, reorder: bool = False):
  """Every cache leaf's rows picked by `rows` int [R'] along its row axis.

  With `reorder` (beams re-sorted within their row), the keys/values projected from the
  memory (cross-attention's, the copy head's) are left alone: they are the same for every
  beam of a row, so gathering them would copy them for nothing at every step.
  """
  def take(path, axis, x):
    if axis is None:
      return x
    if reorder and any(getattr(k, 'key', None) in _MEMORY_PROJECTIONS for k in path):
      return x
    return jnp.take(x, rows, axis=axis)
  return jax.tree_util.tree_map_with_path(lambda p, a, x: take(p, a, x), axes, cache,
                                          is_leaf=lambda a: a is None)


def never_emitted(emit_unk: bool) -> tuple[int, ...]:
  """The ids a search never emits: NEVER_EMITTED, and `<unk>` unless `emit_unk`."""
  return NEVER_EMITTED if emit_unk else NEVER_EMITTED + (UNK_ID,)


def _emittable_log_probs(logits: jax.Array, emit_unk: bool) -> jax.Array:
  """float32 [..., V] log-softmax over the whole vocabulary, -inf on `never_emitted` ids."""
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  never = jnp.zeros(log_probs.shape[-1], bool).at[jnp.array(never_emitted(emit_unk))].set(True)
  return jnp.where(never, -jnp.inf, log_probs)


def _set_column(sequences: jax.Array, column: jax.Array, tokens: jax.Array) -> jax.Array:
  """sequences int32 [..., L] with `column` (traced int) set to tokens int32 [...]."""
  return jnp.where(jnp.arange(sequences.shape[-1]) == column, tokens[..., None], sequences)


def _check_positive(**sizes: int) -> None:
  for name, value in sizes.items():
    if value < 1:
      raise ValueError(f'{name} must be at least 1, got {value}')


# ---------------------------------------------------------------------------------------------
# Beam search


@flax.struct.dataclass
class _BeamState:
  """The while-loop carry; N rows, K = beam size, `-inf` marks an empty slot."""

  step: jax.Array  # int32 []: tokens generated so far
  live_log_probs: jax.Array  # float32 [N, K], hypotheses still growing
  live_sequences: jax.Array  # int32 [N, K, max_len + 1], column 0 is <s>
  finished_scores: jax.Array  # float32 [N, K], length-normalised, best first
  finished_sequences: jax.Array  # int32 [N, K, max_len + 1]
  cache: Any  # the model's 'cache' collection for the N * K live rows


@functools.partial(jax.jit, static_argnames=('model', 'beam_size', 'max_len', 'emit_unk',
                                             'block_repeats'))
def beam_search(model, params, memory: Memory, *, beam_size: int, max_len: int,
                length_penalty: float, emit_unk: bool = False,
                block_repeats: bool = False) -> tuple[jax.Array, jax.Array]:
  """The `beam_size` best suggestions of every memory row.

  At each step the live hypotheses' 2K best continuations are ranked; one ending in `</s>`
  (or reaching `max_len`) is finished when it ranks among the first K, as in fairseq, and the
  best K that do not end stay live. With K = 1 and no length penalty this is greedy
  decoding. The loop stops early once no live hypothesis can still beat the K-th finished
  one, which returns the same result as running to `max_len`.

  Args:
    model: a module of `mtn_jax.models` (static: one compilation per model and shapes).
    params: its parameters.
    memory: its `encode` output, leaves [N, ...].
    beam_size: K, hypotheses kept (and returned) per row.
    max_len: most tokens generated, `</s>` included; at most what the model's decoder
      positions allow (`ModelConfig.target_len` with learned positions).
    length_penalty: GNMT alpha (0: plain log-probability).
    emit_unk: whether `<unk>` may be suggested (see the module docstring).
    block_repeats: a hypothesis never emits a word it already holds (`SearchSettings`); its
      score stays the model's log-probability of its tokens.
  Returns:
    sequences: int32 [N, K, max_len], tokens after `<s>`, `</s>` included, 0-padded.
    scores: float32 [N, K], `length_normalize(log p, length, length_penalty)`, best first.
      A slot is empty (score -inf, sequence all padding) only when the search met fewer
      than K hypotheses, which takes a vocabulary and max_len too small to make K sequences.
  """
  _check_positive(beam_size=beam_size, max_len=max_len)
  num_rows = _num_rows(memory)
  beam_memory = _repeat_rows(memory, beam_size)
  cache = _create_cache(model, params, beam_memory, max_len)
  row_axes = _cache_row_axes(model, params, beam_memory, max_len, cache)
  group_starts = jnp.arange(num_rows)[:, None] * beam_size
  ranks = jnp.arange(2 * beam_size)

  def upper_bound(live_log_probs, step):
    # Future tokens only lower a log-probability (<= 0), and the penalty is monotonic in the
    # length, so the best score a live hypothesis can still reach is its log-probability
    # normalised at one end of the lengths that remain.
    best = live_log_probs.max(axis=1)
    return jnp.maximum(length_normalize(best, step + 1, length_penalty),
                       length_normalize(best, max_len, length_penalty))

  def not_done(state: _BeamState) -> jax.Array:
    best_live = upper_bound(state.live_log_probs, state.step)  # -inf without live ones
    worst_finished = state.finished_scores.min(axis=1)  # -inf until K have finished
    return (state.step < max_len) & jnp.any(best_live > worst_finished)

  def advance(state: _BeamState) -> _BeamState:
    last_tokens = jax.lax.dynamic_index_in_dim(state.live_sequences, state.step, axis=2,
                                               keepdims=False)  # [N, K]
    logits, cache = _apply_decode(model, params, state.cache, beam_memory,
                                  last_tokens.reshape(num_rows * beam_size, 1))
    log_probs = _emittable_log_probs(logits[:, 0], emit_unk).reshape(num_rows, beam_size, -1)
    vocab_size = log_probs.shape[-1]
    if block_repeats:
      # Column 0 is <s> and unwritten columns are padding: neither is ever emitted anyway.
      held = jnp.zeros(log_probs.shape, bool).at[
          jnp.arange(num_rows)[:, None, None], jnp.arange(beam_size)[None, :, None],
          state.live_sequences].set(True)
      log_probs = jnp.where(held, -jnp.inf, log_probs)
    continuations = (state.live_log_probs[..., None] + log_probs).reshape(num_rows, -1)
    top_log_probs, top_ids = jax.lax.top_k(continuations, 2 * beam_size)  # [N, 2K]
    origins, tokens = top_ids // vocab_size, top_ids % vocab_size
    sequences = _set_column(
        jnp.take_along_axis(state.live_sequences, origins[..., None], axis=1),
        state.step + 1, tokens)  # [N, 2K, max_len + 1]
    length = state.step + 1
    ends = tokens == EOS_ID

    live_log_probs, live_ids = jax.lax.top_k(jnp.where(ends, -jnp.inf, top_log_probs),
                                             beam_size)
    live_origins = jnp.take_along_axis(origins, live_ids, axis=1)
    cache = _take_rows(cache, row_axes, (group_starts + live_origins).reshape(-1),
                        reorder=True)

    finishing = (ends | (length == max_len)) & (ranks < beam_size)
    new_scores = jnp.where(finishing, length_normalize(top_log_probs, length, length_penalty),
                           -jnp.inf)
    finished_scores, finished_ids = jax.lax.top_k(
        jnp.concatenate([state.finished_scores, new_scores], axis=1), beam_size)
    finished_sequences = jnp.take_along_axis(
        jnp.concatenate([state.finished_sequences, sequences], axis=1),
        finished_ids[..., None], axis=1)
    return _BeamState(
        step=length, live_log_probs=live_log_probs,
        live_sequences=jnp.take_along_axis(sequences, live_ids[..., None], axis=1),
        finished_scores=finished_scores, finished_sequences=finished_sequences, cache=cache)

  empty_sequences = jnp.zeros((num_rows, beam_size, max_len + 1), jnp.int32)
  # Only the first slot is live at the start, so the first step expands one hypothesis.
  first_live = jnp.where(jnp.arange(beam_size) == 0, 0.0, -jnp.inf)
  state = _BeamState(
      step=jnp.array(0, jnp.int32),
      live_log_probs=jnp.broadcast_to(first_live, (num_rows, beam_size)),
      live_sequences=empty_sequences.at[:, :, 0].set(BOS_ID),
      finished_scores=jnp.full((num_rows, beam_size), -jnp.inf),
      finished_sequences=empty_sequences, cache=cache)
  state = jax.lax.while_loop(not_done, advance, state)
  filled = jnp.isfinite(state.finished_scores)
  sequences = jnp.where(filled[..., None], state.finished_sequences[:, :, 1:], PAD_ID)
  return sequences, state.finished_scores


# ---------------------------------------------------------------------------------------------
# Greedy decoding


@flax.struct.dataclass
class _GreedyState:
  step: jax.Array  # int32 []: tokens generated so far
  sequences: jax.Array  # int32 [N, max_len + 1], column 0 is <s>
  log_probs: jax.Array  # float32 [N]
  done: jax.Array  # bool [N]: `</s>` emitted
  cache: Any


@functools.partial(jax.jit, static_argnames=('model', 'max_len', 'emit_unk'))
def greedy(model, params, memory: Memory, *, max_len: int,
           emit_unk: bool = False) -> tuple[jax.Array, jax.Array]:
  """The most likely next token at every step, until `</s>` or `max_len` tokens.

  Args:
    model, params, memory, max_len, emit_unk: as for `beam_search`.
  Returns:
    sequences: int32 [N, max_len], tokens after `<s>`, `</s>` included, 0-padded.
    scores: float32 [N], the sum of the tokens' log-probabilities (no length penalty).
  """
  _check_positive(max_len=max_len)
  num_rows = _num_rows(memory)
  cache = _create_cache(model, params, memory, max_len)

  def not_done(state: _GreedyState) -> jax.Array:
    return (state.step < max_len) & ~jnp.all(state.done)

  def advance(state: _GreedyState) -> _GreedyState:
    last_tokens = jax.lax.dynamic_index_in_dim(state.sequences, state.step, axis=1,
                                               keepdims=False)  # [N]
    logits, cache = _apply_decode(model, params, state.cache, memory, last_tokens[:, None])
    log_probs = _emittable_log_probs(logits[:, 0], emit_unk)  # [N, V]
    tokens = jnp.argmax(log_probs, axis=-1)
    token_log_probs = jnp.take_along_axis(log_probs, tokens[:, None], axis=-1)[:, 0]
    tokens = jnp.where(state.done, PAD_ID, tokens).astype(jnp.int32)
    return _GreedyState(
        step=state.step + 1,
        sequences=_set_column(state.sequences, state.step + 1, tokens),
        log_probs=state.log_probs + jnp.where(state.done, 0.0, token_log_probs),
        done=state.done | (tokens == EOS_ID), cache=cache)

  sequences = jnp.zeros((num_rows, max_len + 1), jnp.int32).at[:, 0].set(BOS_ID)
  state = _GreedyState(step=jnp.array(0, jnp.int32), sequences=sequences,
                       log_probs=jnp.zeros(num_rows, jnp.float32),
                       done=jnp.zeros(num_rows, bool), cache=cache)
  state = jax.lax.while_loop(not_done, advance, state)
  return state.sequences[:, 1:], state.log_probs


# ---------------------------------------------------------------------------------------------
# Scoring given sequences


@functools.partial(jax.jit, static_argnames=('model',))
def sequence_log_prob(model, params, memory: Memory, sequences: jax.Array) -> jax.Array:
  """Teacher-forced log-probability of given suggestions, to check or re-score a search.

  Args:
    model, params: as for `beam_search`.
    memory: leaves [N, ...].
    sequences: int [N, K, L], tokens after `<s>`; what counts is `sequence_lengths`.
  Returns:
    float32 [N, K]: the sum of log p(token | memory, earlier tokens) over the counted tokens,
    under the full softmax (the search's scores before `length_normalize`).
  """
  num_rows, per_row, length = sequences.shape
  if _num_rows(memory) != num_rows:
    raise ValueError(f'memory has {_num_rows(memory)} rows but sequences {num_rows}')
  targets = sequences.reshape(num_rows * per_row, length).astype(jnp.int32)
  decoder_inputs = jnp.concatenate(
      [jnp.full((targets.shape[0], 1), BOS_ID, jnp.int32), targets[:, :-1]], axis=1)
  logits = model.apply({'params': params}, _repeat_rows(memory, per_row), decoder_inputs,
                       method='decode')
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  token_log_probs = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  counted = jnp.arange(length) < sequence_lengths(targets)[:, None]
  return jnp.where(counted, token_log_probs, 0.0).sum(-1).reshape(num_rows, per_row)


def packed_token_log_probs(model, params, memory: Memory, inputs: jax.Array,
                           parents: jax.Array, picks: jax.Array,
                           targets: jax.Array) -> jax.Array:
  """Teacher-forced log-probabilities of sequences packed as a tree of their shared prefixes,
  as `sequence_log_prob` gives each alone.

  Args:
    model, params: as for `beam_search`; several sequences share a row only where the
      model `packs_sequences` (else each row holds one, from position 0, and `parents` is
      not read).
    memory: leaves [N, ...], row n the context of every sequence of row n.
    inputs: int [N, P], the decoder inputs: each distinct prefix of the row's sequences
      (`<s>` and the tokens before) once, at the position that reads its last token.
    parents: int [N, P], each position's parent (`layers.tree_positions_and_mask`).
    picks: int [N, M], the position whose next-token distribution scores each target; -1
      marks padding.
    targets: int [N, M], each sequence's tokens (those that count in its score), each after
      the position of its prefix.
  Returns:
    float32 [N, M]: log p(target | memory, the sequence's earlier tokens) under the full
    softmax; 0 at padding.
  """
  packed = parents if model.packs_sequences else None
  logits = model.apply({'params': params}, memory, inputs.astype(jnp.int32), method='decode',
                       parents=packed)
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # [N, P, V']
  rows = jnp.arange(log_probs.shape[0])[:, None]
  token_log_probs = log_probs[rows, jnp.maximum(picks, 0), targets.astype(jnp.int32)]
  return jnp.where(picks >= 0, token_log_probs, 0.0)


# ---------------------------------------------------------------------------------------------
# Sessions in, suggestions out


@functools.partial(jax.jit, static_argnames=('model',))
def encode_sessions(model, params, batch: Mapping[str, jax.Array],
                    rows: jax.Array | None = None) -> Memory:
  """The model's encoder, compiled: batch (queries int32 [B, S, n]) -> memory leaves
  [B*S, ...].

  With `rows` int [R], only those rows of the memory ([R, ...]); row b*S + t is the context
  after query t of session b.
  """
  memory = model.apply({'params': params}, batch, method='encode')
  if rows is None:
    return memory
  return jax.tree.map(lambda x: x[rows], memory)


class _LastEncoding(threading.local):
  """The last host batch `encoded` on this thread: its model and params (held, so that no
  other object takes their ids), its inputs' bytes and rows, and its memory."""
  model = params = inputs = memory = None


_last_encoding = _LastEncoding()


def encoded(model, params, batch: Mapping[str, np.ndarray], rows: np.ndarray | None = None
            ) -> Memory:
  """`encode_sessions`, its last result kept on the calling thread: the beam and the scoring
  of the candidates of one request encode the same sessions, one after the other
  (`mtn_jax.inference.learned`), and the second call costs nothing.

  Host arrays only (numpy; a device array is encoded anew each time): the same model and
  params (by identity) and equal arrays and rows return the last memory.
  """
  if not all(isinstance(v, np.ndarray) for v in batch.values()):
    return encode_sessions(model, params, batch, rows)
  inputs = (None if rows is None else (rows.dtype.str, rows.tobytes()),
            tuple((k, v.shape, v.dtype.str, v.tobytes()) for k, v in sorted(batch.items())))
  last = _last_encoding
  if not (last.model is model and last.params is params and last.inputs == inputs):
    last.memory = encode_sessions(model, params, batch, rows)
    last.model, last.params, last.inputs = model, params, inputs
  return last.memory


def search_sessions(model, params, batch: Mapping[str, jax.Array | np.ndarray],
                    settings: SearchSettings, *, positions: str = 'all',
                    lengths: jax.Array | np.ndarray | None = None
                    ) -> tuple[jax.Array, jax.Array]:
  """Beam-searched next queries for a batch of sessions; the encoder runs once.

  Args:
    model, params: as for `beam_search`.
    batch: the model's inputs: `queries` int32 [B, S, n] word ids, 0-padded; shorter
      sessions end in all-padding rows.
    settings: beam size, length, length penalty and `<unk>` (`top_k` is the caller's).
    positions: 'all': suggest after every position t = 0..S-1 (P = S, padding positions
      included; searched SEARCH_POSITIONS_BY_WIDTH // S positions at a time, all of them
      where S is short); 'last': only after each session's last real query (P = 1).
    lengths: int [B], real queries per session, 1..S; needed for positions='last'.
  Returns:
    sequences: int32 [B, P, beam_size, max_len], as `beam_search` returns them.
    scores: float32 [B, P, beam_size], best first.
  """
  # No eager jax.numpy op on the way (each is a slow dispatch of its own, a real share of a
  # lone served request's time): host arrays go to the compiled calls as they are, device
  # arrays (a sharded evaluation batch) stay where they are.
  queries = batch['queries']
  if not isinstance(queries, jax.Array):
    batch = {**batch, 'queries': np.asarray(queries, np.int32)}
    queries = batch['queries']
  if queries.ndim != 3:
    raise ValueError(f'queries must be [batch, queries, tokens], got shape {queries.shape}')
  num_sessions, num_queries, _ = queries.shape
  if positions == 'all':
    rows, per_session = None, num_queries
  elif positions == 'last':
    if lengths is None:
      raise ValueError("positions='last' needs lengths: the real queries of each session")
    lengths = np.asarray(lengths)
    if lengths.shape != (num_sessions,) or not np.issubdtype(lengths.dtype, np.integer):
      raise ValueError(f'lengths must be int [{num_sessions}], got {lengths.dtype} '
                       f'{lengths.shape}')
    if lengths.min() < 1 or lengths.max() > num_queries:
      raise ValueError(f'lengths must lie in 1..{num_queries} (the queries per session), '
                       f'got {lengths.min()}..{lengths.max()}')
    rows, per_session = (np.arange(num_sessions) * num_queries + lengths - 1).astype(np.int32), 1
  else:
    raise ValueError(f"positions must be 'all' or 'last', got {positions!r}")
  memory = encoded(model, params, batch, rows)
  search = functools.partial(beam_search, model, params, beam_size=settings.beam_size,
                             max_len=settings.max_len, length_penalty=settings.length_penalty,
                             emit_unk=settings.emit_unk, block_repeats=settings.block_repeats)
  # A search holds its rows' memory once per beam (and the cache projected from it), and a
  # row's memory grows with the session's width S (a copying model's is every word of the
  # session): all B * S rows at once cost the square of the width, a log's long sessions
  # gigabytes. So a call takes `group` positions of every session, at most
  # SEARCH_POSITIONS_BY_WIDTH // S of them: sessions as short as a corpus's in one call, as
  # before, a long one's positions a few at a time. Position slices keep each call's rows
  # spread as the batch's sessions are (over the devices of a sharded batch).
  group = max(1, SEARCH_POSITIONS_BY_WIDTH // per_session)
  found = ([search(memory)] if group >= per_session else
           [search(_positions(memory, num_sessions, start, min(group, per_session - start)))
            for start in range(0, per_session, group)])
  return (_joined([f[0] for f in found], num_sessions),
          _joined([f[1] for f in found], num_sessions))


@functools.partial(jax.jit, static_argnums=(1, 3))
def _positions(memory: Memory, num_sessions: int, start: int, count: int) -> Memory:
  """Rows b * S + t, t in [start, start + count), of memory leaves [B * S, ...] ->
  [B * count, ...], session-major. `start` is traced: one program for every group of a
  size, not one for each start (a log's wide sessions have many)."""
  return jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(
      x.reshape(num_sessions, -1, *x.shape[1:]), start, count, axis=1
  ).reshape(-1, *x.shape[1:]), memory)


@functools.partial(jax.jit, static_argnums=(1,))
def _joined(groups: list[jax.Array], num_sessions: int) -> jax.Array:
  """Arrays [B * count_i, ...] of consecutive position groups (one: every position) ->
  [B, sum count_i, ...]."""
  return jnp.concatenate([g.reshape(num_sessions, -1, *g.shape[1:]) for g in groups], axis=1)
