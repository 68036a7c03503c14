"""Extended ids: a session's words outside the vocabulary, numbered so they can be copied.

A copying model (`mtn_jax.models.copying`) may write out a word of the session that the
vocabulary lacks. Such words get per-session numbers by first appearance: the k-th distinct
out-of-vocabulary word of a session has number k + 1 (0: a vocabulary word, or padding), and
the model's extended id V + k. Numbering by first appearance makes "can the context after
query t copy it" a comparison with the largest number seen so far.

- `oov_numbers(session_words, vocab, width)`: one session's queries (lists of words) ->
  int32 [queries, width], the batch key 'oov'.
- `oov_words(session_words, vocab)`: the words themselves, index k for number k + 1, to write
  a decoded extended id back as text.
- `split_oov_numbers(split, vocab)`: the numbers of every query row of a split, for batches.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mtn_jax.data.sessions import SessionSplit
from mtn_jax.data.vocab import SPECIAL_TOKENS
from mtn_jax.data.vocab import UNK_ID
from mtn_jax.data.vocab import Vocab


def oov_words(session_words: Sequence[Sequence[str]], vocab: Vocab) -> list[str]:
  """The session's distinct words outside `vocab`, in order of first appearance (none for
  subword pieces, which write every word)."""
  if vocab.kind != 'word':
    return []
  seen: dict[str, None] = {}
  for words in session_words:
    for word in words:
      if _copyable(word, vocab):
        seen.setdefault(word)
  return list(seen)


def _copyable(word: str, vocab: Vocab) -> bool:
  """Whether `word` is outside `vocab` and may be copied: a special token's spelling typed
  as a word ("<unk>", "</s>") is `<unk>`, never text a suggestion writes."""
  return vocab.id(word) == UNK_ID and word not in SPECIAL_TOKENS


def oov_numbers(session_words: Sequence[Sequence[str]], vocab: Vocab,
                width: int) -> np.ndarray:
  """int32 [len(session_words), width]: each word's number (0, or k + 1 for the k-th distinct
  word outside `vocab`); words past `width` in a query are left out."""
  numbers = np.zeros((len(session_words), width), np.int32)
  if vocab.kind != 'word':
    return numbers  # ids are pieces, not words, and none is unknown
  seen: dict[str, int] = {}
  for row, words in enumerate(session_words):
    for column, word in enumerate(words[:width]):
      if _copyable(word, vocab):
        numbers[row, column] = seen.setdefault(word, len(seen) + 1)
  return numbers


def split_oov_numbers(split: SessionSplit, vocab: Vocab) -> np.ndarray:
  """int32 [num_queries, max_query_words]: `oov_numbers` of every session of `split`, row
  for row with `split.queries`. Reads the split's texts (one pass, a dict lookup a word)."""
  numbers = np.zeros(split.queries.shape, np.int32)
  if vocab.kind != 'word':
    return numbers
  texts = split.texts
  for i in range(split.num_sessions):
    begin, end = int(split.starts[i]), int(split.starts[i + 1])
    numbers[begin:end] = oov_numbers([t.split() for t in texts[begin:end]], vocab,
                                     split.max_query_words)
  return numbers
