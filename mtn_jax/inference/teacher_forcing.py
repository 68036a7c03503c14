"""The generator as a scorer: its teacher-forced log-probability of candidates it did not
write (`candidate_log_probs`), and of those it did, read off its beam (`beam_log_probs`).

The learned ranker's features include how likely the generator finds each pooled candidate
after the session, whichever source proposed it. The candidates after one context are packed
in rows of decoder positions as a tree of their shared prefixes, so that the memory is
projected once for a few dozen tokens, a shared prefix ("bank of america ...") is read once,
and a call computes the real tokens rather than candidates padded to the longest.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import numpy as np

from mtn_jax import inference
from mtn_jax.data.vocab import BOS_ID
from mtn_jax.data.vocab import EOS_ID
from mtn_jax.data.vocab import UNK_ID
from mtn_jax.decoding import search
from mtn_jax.inference import sources as sources_lib
from mtn_jax.inference.inputs import Context


def _candidate_ids(vocab, text: str, copied: Sequence[str], length: int) -> list[int]:
  """A candidate's token ids for teacher forcing: its words (a copying model's words outside
  the vocabulary by extended id), then `</s>` where it fits in `length` (a hypothesis of
  `length` words ends there without it, as the search ends one)."""
  if vocab.kind == 'word':
    extended = {w: len(vocab) + k for k, w in enumerate(copied)}
    ids = [vocab.id(w) if vocab.id(w) != UNK_ID else extended.get(w, UNK_ID)
           for w in text.split()]
  else:
    ids = vocab.encode_text(text)
  return ids[:length] + ([EOS_ID] if len(ids) < length else [])


# The positions of a packed row: the candidates after one memory row share rows of this many
# decoder positions (a model that `packs_sequences`), laid as a tree of their prefixes, so that
# each row's memory is projected once for a few dozen tokens rather than once per candidate, a
# prefix that candidates share ("bank of america ...") is read once, and a call computes the
# real tokens rather than candidates padded to the longest.
PACKED_TOKENS = 64
# The candidates' tokens scored in a packed row, at most: each reads the distribution at its
# prefix's position, so a row of shared prefixes scores more tokens than it has positions.
PACKED_TARGETS = 4 * PACKED_TOKENS
# Positions teacher-forced by one call, at most: bounds its [rows, positions, vocabulary]
# logits. A call takes as many packed rows as the batch has contexts (within this bound): a
# lone request's candidates then fill a call or two of one row, and the padding of a call's
# last row is all that is computed for nothing.
SCORED_TOKENS = 4096


@functools.partial(jax.jit, static_argnames=('model',))
def _packed_log_probs(model, params, memory, rows: jax.Array, inputs: jax.Array,
                      parents: jax.Array, picks: jax.Array, targets: jax.Array) -> jax.Array:
  """`search.packed_token_log_probs` of packed rows [C, ...] given the memory's rows `rows`
  [C]."""
  return search.packed_token_log_probs(model, params, jax.tree.map(lambda x: x[rows], memory),
                                       inputs, parents, picks, targets)


@dataclasses.dataclass
class _Packing:
  """Token sequences packed in rows of `width` decoder positions as a tree of their shared
  prefixes (`layers.tree_positions_and_mask`), each row after one memory row and scoring at
  most `num_targets` tokens; with `one_per_row` (a model that cannot pack), each sequence in
  a row of its own. A sequence whose log-probability is `known` takes no room."""

  width: int
  num_targets: int
  one_per_row: bool
  inputs: list = dataclasses.field(default_factory=list)  # [rows] int lists, one per position
  parents: list = dataclasses.field(default_factory=list)
  picks: list = dataclasses.field(default_factory=list)  # [rows] int lists, one per target
  targets: list = dataclasses.field(default_factory=list)
  children: list = dataclasses.field(default_factory=list)  # [rows] {(parent, token): position}
  memory_rows: list = dataclasses.field(default_factory=list)
  spans: list = dataclasses.field(default_factory=list)  # per sequence (row, start, end) targets
  given: list = dataclasses.field(default_factory=list)  # per sequence: its known sum, or 0

  def known(self, log_prob: float, num_tokens: int) -> None:
    """Appends a sequence of `num_tokens` tokens whose sum of log p is known: not packed."""
    self.spans.append((-1, 0, num_tokens))
    self.given.append(log_prob)

  def _new_positions(self, tokens: Sequence[int]) -> int:
    """Positions the last row still lacks for the prefixes of `tokens`."""
    children, parent = self.children[-1], -1
    for depth, token in enumerate([BOS_ID, *tokens[:-1]]):
      parent = children.get((parent, token))
      if parent is None:
        return len(tokens) - depth
    return 0

  def add(self, memory_row: int, tokens: Sequence[int]) -> None:
    """Appends a sequence (its tokens, those that count) read after `memory_row`."""
    self.given.append(0.0)
    if (self.one_per_row or not self.memory_rows or self.memory_rows[-1] != memory_row
        or len(self.inputs[-1]) + self._new_positions(tokens) > self.width
        or len(self.targets[-1]) + len(tokens) > self.num_targets):
      for rows in (self.inputs, self.parents, self.picks, self.targets):
        rows.append([])
      self.children.append({})
      self.memory_rows.append(memory_row)
    row = len(self.targets) - 1
    inputs, parents, children = self.inputs[row], self.parents[row], self.children[row]
    start = len(self.targets[row])
    position = -1
    for token, target in zip([BOS_ID, *tokens[:-1]], tokens):
      key = (position, token)
      if key not in children:
        children[key] = len(inputs)
        inputs.append(token)
        parents.append(position)
      position = children[key]
      self.picks[row].append(position)
      self.targets[row].append(target)
    self.spans.append((row, start, start + len(tokens)))

  def arrays(self) -> tuple[np.ndarray, ...]:
    """(inputs, parents) int32 [rows, width], (picks, targets) int32 [rows, num_targets],
    memory rows int32 [rows]; padding: parent and pick -1, input and target 0."""
    def padded(lists, width, fill):
      out = np.full((len(lists), width), fill, np.int32)
      for row, values in enumerate(lists):
        out[row, :len(values)] = values
      return out
    return (padded(self.inputs, self.width, 0), padded(self.parents, self.width, -1),
            padded(self.picks, self.num_targets, -1), padded(self.targets, self.num_targets, 0),
            np.asarray(self.memory_rows, np.int32))


def candidate_log_probs(trained: inference.Trained, contexts: Sequence[Context],
                        candidates: Sequence[Sequence[Sequence[str]]], *, positions: str,
                        batch_rows: int, history_queries: int = 0,
                        widths: Sequence[int] | None = None,
                        known: Sequence[Sequence[dict[str, float]]] | None = None
                        ) -> list[list[np.ndarray]]:
  """The generator's teacher-forced log-probability of given candidates.

  The candidates after one context are packed in rows as a tree of their shared prefixes
  (`PACKED_TOKENS` positions, `PACKED_TARGETS` tokens a row), scored a fixed number of rows a
  call (one compiled shape per batch shape, whatever the candidates'
  number and lengths).

  Args:
    trained: a generative model.
    contexts: the sessions.
    candidates: [context][output position] candidate texts.
    positions: 'last' or 'all', as for `sources.generated`.
    batch_rows: contexts per batch.
    known: [context][output position] {text: sum of log p} of candidates whose
      log-probability is already known (the generator's own beam, `beam_log_probs`): those
      are not teacher forced again.
  Returns:
    [context][output position] float32 [candidates, 2]: the sum of log p over the
    candidate's tokens and `</s>` (`_candidate_ids`), and that sum per token. A word neither
    in the vocabulary nor copyable from the session is scored as `<unk>`, which the search
    never writes: such a figure says how likely an unknown word is there, not this one (the
    learned ranker reads it beside the candidate's count of unknown words).
  """
  task, params, vocab = trained.task, trained.params, trained.vocab
  length = trained.cfg.target_len
  packs = task.model.packs_sequences
  width = max(PACKED_TOKENS, length) if packs else length
  num_targets = max(PACKED_TARGETS, length) if packs else length
  chunk = max(1, min(SCORED_TOKENS // width, batch_rows if packs else 64 * batch_rows))
  out: list = [None] * len(contexts)
  for group, group_contexts, batch, lengths in sources_lib.batches(
      trained, contexts, batch_rows, widths, history_queries):
    num_queries = batch['queries'].shape[1]
    # Every row for 'all': None, as the beam search asks for them, so that scoring the beam's
    # batch finds its memory already encoded (`search.encoded`).
    rows = ((np.arange(batch_rows) * num_queries + lengths - 1).astype(np.int32)
            if positions == 'last' else None)
    packing = _Packing(width, num_targets, one_per_row=not packs)
    token_log_probs = np.zeros((0, num_targets), np.float32)
    for row, (i, context) in enumerate(zip(group, group_contexts)):
      first = len(context.queries) - 1 if positions == 'last' else context.first_output
      for p, texts in enumerate(candidates[i]):
        r = row if positions == 'last' else row * num_queries + first + p
        # The words the model can copy after position first + p: those typed so far (a later
        # query's word, given an extended id, would be scored -inf, a leak of what follows).
        copied = trained.copied_words(context.queries[:first + p + 1])
        already = known[i][p] if known is not None else {}
        for text in texts:
          ids = _candidate_ids(vocab, text, copied, length)
          if text in already:
            packing.known(already[text], len(ids))
          else:
            packing.add(r, ids)
    if packing.targets:
      memory = search.encoded(task.model, params, {key: batch[key] for key in task.context_keys},
                              rows)
      inputs, parents, picks, targets, memory_rows = packing.arrays()
      token_log_probs = np.zeros(targets.shape, np.float32)
      # `chunk` packed rows a call, the last call padded with its last row.
      for start in range(0, len(targets), chunk):
        take = np.minimum(np.arange(start, start + chunk), len(targets) - 1)
        token_log_probs[take] = np.asarray(_packed_log_probs(
            task.model, params, memory, memory_rows[take], inputs[take], parents[take],
            picks[take], targets[take]))
    # Each candidate's sum: from its first token to the next candidate's (padding adds 0);
    # a known one's (its span's row is -1) as given.
    spans = np.asarray(packing.spans, np.int64).reshape(-1, 3)
    forced = spans[:, 0] >= 0
    sums = np.asarray(packing.given, np.float64)
    if forced.any():
      sums[forced] = np.add.reduceat(token_log_probs.ravel(),
                                     spans[forced, 0] * num_targets + spans[forced, 1])
    values = np.stack([sums, sums / np.maximum(spans[:, 2] - spans[:, 1], 1)], axis=-1)
    taken = 0
    for i in group:
      out[i] = []
      for texts in candidates[i]:
        out[i].append(values[taken:taken + len(texts)].astype(np.float32))
        taken += len(texts)
  return out


def beam_log_probs(trained: inference.Trained, source: sources_lib.Generate,
                   contexts: Sequence[Context], lists: sources_lib.Lists
                   ) -> list[list[dict[str, float]]]:
  """[context][output position] {text: sum of log p} of the generator's own hypotheses, read
  off the beam's scores: the search already summed what teacher forcing would (the same
  tokens, `</s>` included, under the same softmax; equal to float rounding), so a lone
  request forces only the other sources' candidates. A hypothesis's score is its
  `search.length_normalize`d sum ('model_score' once reranked by MBR; the session's queries
  that MBR adds have none)."""
  key = 'model_score' if source.settings.mbr != 'none' else 'score'
  alpha = source.settings.length_penalty
  length = trained.cfg.target_len
  out = []
  for context, by_position in zip(contexts, lists):
    copied = trained.copied_words(context.queries)
    out.append([{c['query']: c[key] * search.length_penalty(len(_candidate_ids(
        trained.vocab, c['query'], copied, length)), alpha)
                 for c in candidates if key in c} for candidates in by_position])
  return out
