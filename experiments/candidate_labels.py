"""Which of the learned ranker's candidates a person finds useful or garbled, by kind.

  python experiments/candidate_labels.py make --workdir=W --out=L [--contexts=60] [--seed=7]
      [--not_in=P0,P1] [config flags]
  python experiments/candidate_labels.py score --out=L --judgments=J1.json,J2.json

A panel (experiments/panel.py) rates the top 5 a presentation shows; it cannot say what
another presentation of the same candidates would have shown. `make` draws validation
contexts as `panel.py` does (none that the panels of --not_in showed), asks the workdir's
learned pipeline for its whole ranked pool, and writes for each context its session and up
to `--candidates` of the pool, shuffled: the ranker's top 10 and then the best well-formed
candidates sharing a word with the session (`presentation.well_formed`, `shares_word`), the
ones a presentation chooses its first places from. Judges rate each candidate U / G / N
under the rubric of ../shared/JUDGING.md. `score` prints the useful and garbled shares by kind of
candidate (who proposed it, which template, logged or not, well-formed, about the session),
and the top 5 that each presentation rule of RULES would show, scored by the judges' labels
(a candidate no judge saw counts as neither: a lower bound on useful and garbled alike), and
checks whether the default's rule (as chosen on 2026-11-28) gives the pipeline's own top 5,
which it scores beside them.

A judge returns JSON: {"<context number>": {"<candidate number>": "U"|"G"|"N"}}.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import sys
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
from mtn_jax.inference import pipeline
from mtn_jax.inference import popular
from mtn_jax.inference import presentation
from mtn_jax.inference import subjects
import panel  # experiments/panel.py, beside this script
# pylint: enable=wrong-import-position

SHOWN = 5
RANKER_TOP = 10


def shares_word(so_far) -> Callable[[str], bool]:
  """`subjects.about_session` before the sites of short queries counted: a shared word
  (a site's name standing for its address), not one word of the session alone. The candidates
  shown to the judges are chosen by it, so that a context drawn again shows the same ones."""
  typed = {w for q in so_far for w in q.split()}
  session = set().union(*(subjects.site_words(q) for q in so_far))
  return lambda text: bool(subjects.site_words(text) & session) and not (
      len(text.split()) == 1 and text in typed)


def cohesion(text: str, previous: str, counts: popular.LogCounts, ends: dict) -> float:
  """For a cut of the previous query (a run of its words, not all), the largest share of
  either word's uses that the word pair it cuts across takes in the log's queries (1: the
  two words always go together), else 0."""
  def share(pair):
    n = counts.bigrams.get(pair, 0)
    return max(n / max(counts.bigram_starts.get(pair[0], 0), 1), n / max(ends.get(pair[1], 0), 1))
  words, cut = previous.split(), text.split()
  for i in range(len(words)):
    for j in range(i + 1, len(words) + 1):
      if words[i:j] == cut and (i, j) != (0, len(words)):
        pairs = ([(words[i - 1], words[i])] if i else []) + (
            [(words[j - 1], words[j])] if j < len(words) else [])
        return max((share(pair) for pair in pairs), default=0.0)
  return 0.0


def kind(candidate: dict, counts: popular.LogCounts, so_far, templates: dict, ends) -> dict:
  """What a candidate is: its proposers, template, whether logged, well-formed, about the
  session by a shared word, a short session query's site, the previous query with words
  added, a lone word of the session, how cohesive the pair a cut splits is."""
  text = candidate['query']
  typed = {w for q in so_far for w in q.split()}
  return {'sources': candidate['sources'], 'template': templates.get(text, ''),
          'logged': bool(counts.issued.get(text)),
          'well_formed': presentation.well_formed(counts, so_far)(text),
          'about': shares_word(so_far)(text),
          'short_site': (subjects.about_session(so_far)(text)
                         and not shares_word(so_far)(text)),
          'added': presentation.added_to(text, so_far[-1]),
          'lone_word': len(text.split()) == 1 and text in typed,
          'cohesion': cohesion(text, so_far[-1], counts, ends),
          'head': text in set(counts.most_popular(20)),
          'rank': candidate['rank']}


def make(args, config) -> None:
  contexts, references, _ = panel.draw(args.workdir, args.contexts, args.seed, args.not_in)
  config.decode.exclude_session_queries = True
  config.suggest.strategy = 'learned'
  config.suggest.session_first = 0
  config.suggest.attested_only = False
  pipe = pipeline.Pipeline.load(config, args.workdir)
  ranked_lists, by_source = pipe._learned(contexts, positions='last',  # pylint: disable=protected-access
                                          batch_rows=config.decode.batch_sessions)
  counts = pipe.log_counts
  ends = collections.Counter()  # {word: times it ends a word pair of the log's queries}
  for (_, second), n in counts.bigrams.items():
    ends[second] += n
  rng = random.Random(args.seed)
  lines = ['# Candidates to judge', '',
           'For each context: the session so far (oldest first), then numbered candidate next '
           'queries. Rate every candidate U (useful), G (garbled) or N (neither), as the '
           'rubric says.', '']
  record = {'contexts': [list(c.queries) for c in contexts], 'references': references,
            'candidates': []}
  for n, (context, ranked) in enumerate(zip(contexts, ranked_lists), 1):
    so_far = context.queries
    ranked = [dict(c, rank=r) for r, c in enumerate(
        (c for c in ranked[0] if c['query'] not in so_far), 1)]
    templates = {c['query']: c.get('template', '') for c in by_source['templates'][n - 1][0]}
    about = shares_word(so_far)
    picked = ranked[:RANKER_TOP] + [
        c for c in ranked[RANKER_TOP:]
        if presentation.well_formed(counts, so_far)(c['query']) and about(c['query'])]
    picked = picked[:args.candidates]
    described = [dict(kind(c, counts, so_far, templates, ends), query=c['query'])
                 for c in picked]
    # The whole ranked pool, for the rules of `score` (unjudged ones count as neither).
    pool = [dict(kind(c, counts, so_far, templates, ends), query=c['query'])
            for c in ranked]
    shuffled = described[:]
    rng.shuffle(shuffled)
    default = presentation.presented(ranked, so_far, counts, session_first=SHOWN,
                                     unrelated_first=1, attested_only=True)
    record['candidates'].append({'shown': [c['query'] for c in shuffled], 'pool': pool,
                                 'default': [c['query'] for c in default[:SHOWN]]})
    lines += [f'## Context {n}', '', 'Session: ' + ' | '.join(so_far), '']
    lines += [f'{k}. {c["query"]}' for k, c in enumerate(shuffled, 1)] + ['']
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, 'items.md'), 'w', encoding='utf-8') as f:
    f.write('\n'.join(lines))
  with open(os.path.join(args.out, 'key.json'), 'w', encoding='utf-8') as f:
    json.dump(record, f, indent=1)
  print(f'{len(contexts)} contexts, {sum(len(c["shown"]) for c in record["candidates"])} '
        f'candidates: {args.out}/items.md')


def candidate_kind(c: dict) -> str:
  if c['head']:
    return 'head query'
  only = c['sources']
  if c['template']:
    name = c['template'].split(':')[0]
    return f'template {name}' + (' (logged)' if c['logged'] else '')
  if only == ['generate']:
    return 'generator only' + (', logged' if c['logged'] else
                               ', well-formed' if c['well_formed'] else ', not well-formed')
  return '+'.join(only) + (' (logged)' if c['logged'] else '')


# Presentation rules over the ranked pool (what only the generator wrote kept only if
# well-formed; the first 5 places to the best well-formed candidates `about` the session, at
# most `unrelated_first` others; then the rest in order, what is not well-formed dropped):
# each returns the top 5 shown.
def _first_places(pool, unrelated_first=1, about=lambda c: c['about'], admit=lambda c: True):
  pool = [c for c in pool if c['sources'] != ['generate'] or c['well_formed']]
  first, unrelated = [], 0
  for c in pool:
    if len(first) == SHOWN:
      break
    if not c['well_formed'] or not admit(c):
      continue
    if about(c):
      first.append(c)
    elif unrelated < unrelated_first:
      first.append(c)
      unrelated += 1
  others = [c for c in pool if c not in first and c['well_formed']]
  return (first + others)[:SHOWN]


def _lone_words(pool):
  """The default's first places, then lone words of the session, then head queries."""
  about = [c for c in _first_places(pool, about=_SITE, admit=_NOT_ADDED, unrelated_first=0)
           if _SITE(c)]
  lone = [c for c in pool if c['lone_word'] and c['well_formed'] and c not in about]
  rest = [c for c in _first_places(pool, about=_SITE, admit=_NOT_ADDED) if c not in about]
  return (about + lone + rest)[:SHOWN]


def _others_before_heads(pool):
  """The default's first places, its head queries moved after the other well-formed
  candidates (the sites of long queries left out: "conenebula.com" reads as garbled)."""
  default = RULES[DEFAULT](pool)
  first = [c for c in default if not c['head']]
  others = [c for c in pool if c['well_formed'] and not c['head'] and c not in first
            and _NOT_ADDED(c) and not (c['template'] or '').startswith('dotcom')]
  return (first + others + [c for c in default if c['head']])[:SHOWN]


_SITE = lambda c: c['about'] or c['short_site']
_NOT_ADDED = lambda c: not (c['added'] and not c['logged'])
DEFAULT = 'first 5 about, <= 1 head, a short query\'s site about, no unlogged words added'
OWN = 'the pipeline\'s own top 5 (the product now)'
BEFORE = 'first 5 about, <= 1 head (the default before 2026-11-28)'
RULES = {
    BEFORE: _first_places,
    '+ a short query\'s site is about the session': lambda pool: _first_places(pool, about=_SITE),
    DEFAULT: lambda pool: _first_places(pool, about=_SITE, admit=_NOT_ADDED),
    '+ no cut across a word pair the log links (>= 50 % of either word\'s uses)': (
        lambda pool: _first_places(pool, about=_SITE, admit=lambda c: _NOT_ADDED(c) and (
            c['logged'] or c['cohesion'] < 0.5))),
    '+ lone words of the session before head queries': _lone_words,
    '+ the other well-formed candidates before head queries': _others_before_heads,
    'ranker order, well-formed only': lambda pool: [c for c in pool if c['well_formed']][:SHOWN],
}


def read_labels(out: str, judgments: str) -> tuple[dict, list[dict[str, list[str]]]]:
  """(`make`'s key.json record of the folder `out`, [context] {candidate: the label each
  judge of `judgments`, comma-separated JSON files, gave it}); a judgment that leaves a
  context or candidate out is refused (`_checked_labels`)."""
  with open(os.path.join(out, 'key.json'), encoding='utf-8') as f:
    record = json.load(f)
  judges = []
  for path in judgments.split(','):
    with open(path, encoding='utf-8') as f:
      judges.append(_checked_labels(path, json.load(f), record))
  labels = []
  for n, entry in enumerate(record['candidates'], 1):
    at = collections.defaultdict(list)
    for marks in judges:
      for k, query in enumerate(entry['shown'], 1):
        at[query].append(str(marks.get(str(n), {}).get(str(k), 'N')).upper()[:1])
    labels.append(at)
  return record, labels


def _checked_labels(path: str, marks, record: dict) -> dict:
  """A judge's {context: {candidate number: mark}}; exits naming the file and the first
  context or candidate that does not match key.json (left out, it would score as 'N')."""
  if not isinstance(marks, dict):
    sys.exit(f'{path}: expected {{"<context number>": {{"<candidate number>": "U"|"G"|"N"}}}}')
  for n, entry in enumerate(record['candidates'], 1):
    given = marks.get(str(n))
    if not isinstance(given, dict):
      sys.exit(f'{path}: context {n} has no marks ({len(record["candidates"])} contexts)')
    for k in range(1, len(entry['shown']) + 1):
      if str(given.get(str(k), '')).upper()[:1] not in ('U', 'G', 'N') or not given.get(str(k)):
        sys.exit(f'{path}: context {n}, candidate {k}: marks are U, G or N, got '
                 f'{given.get(str(k))!r}')
  return marks


def score(args) -> None:
  record, labels = read_labels(args.out, args.judgments)
  judges = range(len(args.judgments.split(',')))
  by_kind = collections.defaultdict(lambda: [0, 0, 0])
  for entry, at in zip(record['candidates'], labels):
    for c in entry['pool']:
      if c['query'] in at:
        marks = at[c['query']]
        row = by_kind[candidate_kind(c)]
        row[0] += len(marks)
        row[1] += marks.count('U')
        row[2] += marks.count('G')
  print('| kind of candidate | judgments | useful % | garbled % |\n|---|---:|---:|---:|')
  for name, (total, useful, garbled) in sorted(by_kind.items(), key=lambda x: -x[1][0]):
    print(f'| {name} | {total} | {100 * useful / total:.1f} | {100 * garbled / total:.1f} |')
  same = sum([c['query'] for c in RULES[DEFAULT](e['pool'])] == e['default']
             for e in record['candidates'])
  print(f'\n{DEFAULT}: the pipeline\'s own top 5 in {same} of {len(labels)} contexts')
  if same < len(labels):
    # The rule as it was chosen (2026-11-28); the product's presentation has moved on since
    # (the user's past, at most one unrelated query): the last row is what it shows.
    print(f'WARNING: the rule named the default is not the product\'s presentation now in '
          f'{len(labels) - same} contexts: the row "{OWN}" scores what the pipeline shows')
  shows = {rule: (lambda entry, show=show: show(entry['pool'])) for rule, show in RULES.items()}
  shows[OWN] = lambda entry: [{'query': query} for query in entry['default']]
  print('\n| rule | judge | useful % | garbled % | lists with >= 2 useful % | unjudged % |\n'
        '|---|---|---:|---:|---:|---:|')
  for rule, show in shows.items():
    for j in range(len(judges)):
      useful = garbled = two = unjudged = 0
      for entry, at in zip(record['candidates'], labels):
        shown = show(entry)
        marks = [at[c['query']][j] if c['query'] in at else '?' for c in shown]
        useful += marks.count('U')
        garbled += marks.count('G')
        unjudged += marks.count('?')
        two += marks.count('U') >= 2
      total = SHOWN * len(labels)
      print(f'| {rule} | {j + 1} | {100 * useful / total:.1f} | {100 * garbled / total:.1f} | '
            f'{100 * two / len(labels):.1f} | {100 * unjudged / total:.1f} |')


def _arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument('--candidates', type=int, default=20)


if __name__ == '__main__':
  panel.run(' '.join(__doc__.split('\n\n')[0].split()), make, score, contexts=60, seed=7,
            add_arguments=_arguments)
