"""Reformulation templates: the edits that turn a previous query into the next one, learned
from a training log's (previous, next) pairs and ranked by how often each edit occurs.

What transfers between users of a query log is less the queries than the ways people rewrite
them: they add a word ("weather" -> "weather chicago"), drop one, swap one ("cheap flights"
-> "cheap hotels"), or turn a name into a site ("ebay" -> "ebay.com", "www.ebay.com").
A template is one such edit, with its word where it has one:

  append:W       the previous query, then the word W (a word it does not hold)
  prepend:W      the word W (a word it does not hold), then the previous query
  drop_last      the previous query without its last word (queries of 2+ words)
  drop_first     the previous query without its first word (queries of 2+ words)
  substitute:A>B the word A of the previous query replaced by B (queries of 2+ words)
  join           the previous query's words written together ("e bay" -> "ebay")
  dotcom         the previous query's words joined, then ".com" (where they can name a site:
                 letters, digits, hyphens and dots, at most 63 characters)
  www            "www.", the previous query's words joined, then ".com" (the same)
  strip_site     "www." and ".com" (or ".org", ".net") taken off a one-word query

The templates of a training log count, for every (previous, next) pair, each template that
rewrites the previous query into exactly the next one (`templates_of`; `popular.LogCounts`
counts them in its one pass over the pairs, `Templates.of_counts` keeps those seen twice;
`Templates.learn(pairs)` does both alone); `propose(previous, k)` applies every template
that applies to `previous` and returns the k distinct results of the most frequent
templates. Written here because no library learns query-rewrite patterns of this kind: it is
a count over a log.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable, Iterator

_SITE = re.compile(r'^(?:www\.)?(.+?)\.(?:com|org|net)$')
# What can stand before ".com" in an address: letters, digits, hyphens and dots, at most the
# 63 characters of a DNS label. A query of other characters ("<b>", "東京天気", a pasted
# paragraph) names no site, and the log's own site queries hold nothing else.
_SITE_NAME = re.compile(r'^[a-z0-9][a-z0-9.-]{0,62}$')
_WORDLESS = ('drop_last', 'drop_first', 'join', 'dotcom', 'www', 'strip_site')


def edits(previous: str) -> Iterator[tuple[str, str]]:
  """(template, result) of every wordless template that applies to `previous`."""
  words = previous.split()
  if len(words) >= 2:
    yield 'drop_last', ' '.join(words[:-1])
    yield 'drop_first', ' '.join(words[1:])
    yield 'join', ''.join(words)
  name, site = ''.join(words), _SITE.match(previous)
  if _SITE_NAME.match(name) and not site:
    yield 'dotcom', name + '.com'
    yield 'www', 'www.' + name + '.com'
  if len(words) == 1 and site:
    yield 'strip_site', site.group(1)


def templates_of(previous: str, following: str) -> list[str]:
  """The templates that rewrite `previous` into exactly `following` (none, one or a few)."""
  if previous == following:
    return []
  found = [name for name, result in edits(previous) if result == following]
  before, after = previous.split(), following.split()
  if len(after) == len(before) + 1:
    if after[:-1] == before:
      found.append(f'append:{after[-1]}')
    if after[1:] == before:
      found.append(f'prepend:{after[0]}')
  if len(after) == len(before) >= 2:  # one word for another: co-occurrence, not an edit
    changed = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
    if len(changed) == 1:
      i = changed[0]
      found.append(f'substitute:{before[i]}>{after[i]}')
  return found


def apply(template: str, previous: str) -> str | None:
  """`template` applied to `previous`, or None where it does not apply."""
  kind, _, word = template.partition(':')
  words = previous.split()
  if not words:
    return None
  if kind in ('append', 'prepend') and word in words:  # "chicago weather chicago"
    return None
  if kind == 'append':
    return f'{previous} {word}'
  if kind == 'prepend':
    return f'{word} {previous}'
  if kind == 'substitute':
    old, _, new = word.partition('>')
    if len(words) < 2 or old not in words or new in words:
      return None
    return ' '.join(new if w == old else w for w in words)
  return dict(edits(previous)).get(kind)


class Templates:
  """The training log's reformulation templates and how often each occurred.

  Attributes:
    counts: {template: the training pairs it rewrites}, most frequent first.
    total: the pairs counted.
  """

  def __init__(self, counts: dict[str, int], total: int, *, keep_per_kind: int = 200):
    self.total = total
    self.counts = dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    # The wordless templates apply to any query, and so do the `keep_per_kind` most frequent
    # appends and prepends; a substitution only where its word stands.
    self._general, kinds = [], collections.Counter()
    for template in self.counts:
      kind = template.split(':')[0]
      if template in _WORDLESS or (kind in ('append', 'prepend')
                                   and kinds[kind] < keep_per_kind):
        kinds[kind] += 1
        self._general.append(template)
    self._substitutions: dict[str, list[str]] = {}
    for template in self.counts:
      if template.startswith('substitute:'):
        old = template[len('substitute:'):].split('>')[0]
        self._substitutions.setdefault(old, []).append(template)

  @classmethod
  def learn(cls, pairs: Iterable[tuple[str, str]], min_count: int = 2) -> Templates:
    """The templates of (previous, next) `pairs`."""
    counts: collections.Counter = collections.Counter()
    total = 0
    for previous, following in pairs:
      total += 1
      counts.update(templates_of(previous, following))
    return cls.of_counts(counts, total, min_count)

  @classmethod
  def of_counts(cls, counts: dict[str, int], total: int, min_count: int = 2) -> Templates:
    """The templates counted `counts` over `total` pairs, those seen at least `min_count`
    times (once is one user's habit, not a pattern)."""
    return cls({t: n for t, n in counts.items() if n >= min_count}, total)

  def propose(self, previous: str, k: int) -> list[tuple[str, str, int]]:
    """[(query, template, count)] the k distinct rewrites of `previous` by the most frequent
    templates that apply, most frequent first (a tie: the template's name)."""
    words = set(previous.split())
    candidates = list(self._general)
    for word in words:
      candidates += self._substitutions.get(word, [])
    candidates.sort(key=lambda t: (-self.counts[t], t))
    out, seen = [], {previous}
    for template in candidates:
      result = apply(template, previous)
      if result is None or result in seen:
        continue
      seen.add(result)
      out.append((result, template, self.counts[template]))
      if len(out) == k:
        break
    return out
