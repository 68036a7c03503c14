"""Word vocabulary with the special tokens every model shares.

Ids 0..4 are fixed so that padding is always 0 and models can build decoder inputs
(`<s>` + query) and targets (query + `</s>`) without looking anything up.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Sequence

import numpy as np

PAD_ID, UNK_ID, BOS_ID, EOS_ID, SEP_ID = 0, 1, 2, 3, 4
SPECIAL_TOKENS = ('<pad>', '<unk>', '<s>', '</s>', '<sep>')


@dataclasses.dataclass(frozen=True)
class Vocab:
  """An immutable id <-> word table; `words[i]` is the word of id `i`."""

  words: tuple[str, ...]

  def __post_init__(self):
    if tuple(self.words[:len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
      raise ValueError(f'a vocabulary must start with {SPECIAL_TOKENS}')
    object.__setattr__(self, '_ids', {w: i for i, w in enumerate(self.words)})
    if len(self._ids) != len(self.words):
      raise ValueError('a vocabulary holds each word once')

  @classmethod
  def from_counts(cls, counts: dict[str, int], min_count: int) -> Vocab:
    """Words seen at least `min_count` times, most frequent first (ties by word)."""
    kept = sorted((w for w, c in counts.items()
                   if c >= min_count and w not in SPECIAL_TOKENS),
                  key=lambda w: (-counts[w], w))
    return cls(SPECIAL_TOKENS + tuple(kept))

  def __len__(self) -> int:
    return len(self.words)

  def id(self, word: str) -> int:
    return self._ids.get(word, UNK_ID)

  def encode(self, words: Iterable[str]) -> list[int]:
    return [self._ids.get(w, UNK_ID) for w in words]

  def decode(self, ids: Sequence[int] | np.ndarray,
             extended_words: Sequence[str] = ()) -> list[str]:
    """Words of `ids` up to the first `</s>` or `<pad>`; `<s>` is dropped. An id past the
    vocabulary, len(self) + k, is an extended id (a word copied from the context):
    `extended_words[k]`."""
    out = []
    for i in np.asarray(ids).tolist():
      if i in (EOS_ID, PAD_ID):
        break
      if i != BOS_ID:
        out.append(self.words[i] if i < len(self.words)
                   else extended_words[i - len(self.words)])
    return out

  @property
  def fingerprint(self) -> str:
    """A short hash of the word list: checkpoints record it to refuse a foreign vocabulary."""
    return hashlib.sha256('\n'.join(self.words).encode()).hexdigest()[:16]

  def save(self, path: str) -> None:
    with open(path, 'w', encoding='utf-8') as f:
      json.dump({'words': list(self.words), 'fingerprint': self.fingerprint}, f,
                ensure_ascii=False)

  @classmethod
  def load(cls, path: str) -> Vocab:
    with open(path, encoding='utf-8') as f:
      return cls(tuple(json.load(f)['words']))
