"""What the training log says without a model: the most popular next queries (MPC, the
standard first baseline of query suggestion and auto-completion, Bar-Yossef & Kraus 2011),
and the queries that most often followed the previous one (co-occurrence, the "ADJ"
candidates of HRED-qs, Sordoni et al. 2015), the popular list as its fallback.

Both count the training split's NEXT queries (every query but a session's first, what a
suggester has to predict), by their raw text as logged; ties go to the query seen first.
They are candidate sources of the suggestion pipeline (`config.suggest.popular`,
`config.suggest.cooccurring`, `config.suggest.strategy='blend'`) and suggesters of their own
in every evaluation table.

Every pair is counted (a service is asked after any query); what that costs on an AOL-size
training split: docs/notes/2026-11-27-figures-from-code-comments.md.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from mtn_jax.data import preprocess
from mtn_jax.data import sessions
from mtn_jax.inference import templates


def next_query_pairs(train: sessions.SessionSplit) -> Iterator[tuple[str, str]]:
  """(previous query, next query) of every pair of `train`, by raw text as logged, its text
  file streamed (the full AOL training split's texts are never all in memory)."""
  if train.text_path is None:
    raise ValueError(f'split {train.name!r} has no text file')
  session_start = np.zeros(len(train.queries) + 1, bool)
  session_start[train.starts] = True
  with open(train.text_path, encoding='utf-8') as f:
    before = None
    for row, line in enumerate(f):
      if row >= len(train.queries):
        break
      text = line.rstrip('\n')
      if not session_start[row]:
        yield before, text
      before = text


def word_bigrams(text: str) -> list[tuple[str, str]]:
  """The query's consecutive word pairs, its start ('<s>') and end ('</s>') included."""
  words = ['<s>', *text.split(), '</s>']
  return list(zip(words, words[1:]))


class LogCounts:
  """The training split's next queries, counted once, and by the query before them.

  Attributes:
    popular: the next queries by how often they were logged, most first (ties: first seen).
    following: {previous query: its next queries, most frequent first}.
    issued: {next query: times logged}; after: {previous query: {next query: times}};
    pairs: the pairs counted; templates: their reformulation templates (`templates`);
    bigrams: {(word, word): times in the logged next queries} (`word_bigrams`);
    bigram_starts: {word: times it starts a bigram}.
  """

  def __init__(self, train: sessions.SessionSplit, keep: int = 100):
    """Counts `train`'s pairs (its text file streamed). `keep`: the most popular kept, and
    per previous query the most frequent kept (more than any list needs)."""
    self._count(next_query_pairs(train), keep)

  @classmethod
  def of_sessions(cls, session_texts: Iterable[Sequence[str]], keep: int = 100) -> LogCounts:
    """The counts of sessions given as their query texts (e.g. some users' sessions only)."""
    counts = cls.__new__(cls)
    counts._count(((s[t], s[t + 1]) for s in session_texts for t in range(len(s) - 1)), keep)
    return counts

  def _count(self, pairs: Iterable[tuple[str, str]], keep: int) -> None:
    issued: collections.Counter = collections.Counter()
    after: dict[str, collections.Counter] = {}
    edits: collections.Counter = collections.Counter()
    total = 0
    for before, text in pairs:
      issued[text] += 1
      after.setdefault(before, collections.Counter())[text] += 1
      edits.update(templates.templates_of(before, text))
      total += 1
    # most_common sorts by count, stably over insertion order: the first seen wins a tie.
    self.popular = [q for q, _ in issued.most_common(keep)]
    self.following = {p: [q for q, _ in c.most_common(keep)] for p, c in after.items()}
    # The counts themselves, for the learned ranker's features.
    self.issued, self.after, self.pairs = issued, after, total
    self.templates = templates.Templates.of_counts(edits, total)
    self.bigrams: collections.Counter = collections.Counter()
    self.bigram_starts: collections.Counter = collections.Counter()
    for text, count in issued.items():
      for pair in word_bigrams(text):
        self.bigrams[pair] += count
        self.bigram_starts[pair[0]] += count

  @classmethod
  def of_workdir(cls, workdir: str) -> LogCounts:
    """The counts of the training split of `workdir`'s corpus."""
    return cls(sessions.load_split(preprocess.data_dir(os.path.abspath(workdir)), 'train'))

  def most_popular(self, k: int) -> list[str]:
    """MPC: the k most popular next queries, whatever the session."""
    return self.popular[:k]

  def followers(self, previous: str, k: int) -> list[str]:
    """The k queries that most often followed `previous` (fewer, or none, where it was
    rarely or never followed), no fallback."""
    return self.following.get(previous, [])[:k]

  def cooccurring(self, previous: str, k: int) -> list[str]:
    """The k queries that most often followed `previous`, then the most popular ones, each
    text once."""
    listed = list(dict.fromkeys(self.following.get(previous, [])[:k] + self.popular[:k]))
    return listed[:k]

  def lists(self, contexts: Sequence[Sequence[str]], k: int, source: str
            ) -> list[list[str]]:
    """[contexts] `source`'s ('popular' or 'cooccurring') k candidates after each context."""
    if source == 'popular':
      top = self.most_popular(k)
      return [list(top) for _ in contexts]
    return [self.cooccurring(context[-1], k) for context in contexts]
