"""Respellings of the previous query: one of its words replaced by a more frequent word of the
training log within a small edit distance ("the myth of the pheonix" -> "the myth of the
phoenix", "jcpenny optical" -> "jcpenney optical", "roanoke time" -> "roanoke times").

People retype a query to mend a typo or to change a word's form, and a log holds the right
spelling more often than any one wrong one; so a word is replaced only by a word the log's
next queries use more often than it. Edit distance: at most 1 for words of up to 4
characters, 2 for longer ones (Damerau-Levenshtein, SymSpell's symmetric deletes: the
`symspellpy` library), words of 3 or more characters, no digits. Score: log((uses of the
new word + 1) / (uses of the old one + 1)), the most lopsided first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import symspellpy

MIN_WORD_CHARS = 3
SHORT_WORD_CHARS = 4  # up to this long: one edit, else two


def max_edits(word: str) -> int:
  return 1 if len(word) <= SHORT_WORD_CHARS else 2


def respellable(word: str) -> bool:
  """Whether a word is one a typo may have changed (numbers and short words are not read)."""
  return len(word) >= MIN_WORD_CHARS and not any(ch.isdigit() for ch in word)


class Respeller:
  """The log's words by their uses, indexed for near spellings.

  Args:
    word_uses: {word: times the log's next queries use it}.
  """

  def __init__(self, word_uses: Mapping[str, int]):
    self.uses = {w: n for w, n in word_uses.items() if n > 0 and respellable(w)}
    self._index = symspellpy.SymSpell(max_dictionary_edit_distance=2)
    for word, uses in self.uses.items():
      self._index.create_dictionary_entry(word, uses)

  def alternatives(self, word: str) -> list[tuple[str, float]]:
    """(a more used word within `max_edits(word)`, its score), best first; ties by the word."""
    if not respellable(word):
      return []
    own = self.uses.get(word, 0)
    found = self._index.lookup(word, symspellpy.Verbosity.ALL, max_edit_distance=max_edits(word))
    out = [(s.term, math.log((s.count + 1) / (own + 1))) for s in found
           if s.term != word and s.count > own and respellable(s.term)
           and s.distance <= max_edits(min(word, s.term, key=len))]
    return sorted(out, key=lambda t: (-t[1], t[0]))

  def propose(self, previous: str, k: int) -> list[tuple[str, float]]:
    """(the previous query with one word respelled, its score): the k best, each once, none
    that repeats a word the query already holds."""
    words = previous.split()
    out = []
    for i, word in enumerate(words):
      for new, score in self.alternatives(word):
        if new not in words:
          out.append((' '.join(words[:i] + [new] + words[i + 1:]), score))
    out.sort(key=lambda t: (-t[1], t[0]))
    best = dict(reversed(out))  # each query with its best score (the first in `out`)
    return sorted(best.items(), key=lambda t: (-t[1], t[0]))[:k]
