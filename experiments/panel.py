"""A blind panel of suggestion lists: what a person sees in the top 5.

  python experiments/panel.py make --workdir=W --out=P [--contexts=80] [--seed=0]
      [--not_in=P0,P1] [--baseline=W0 --baseline_sources=PLAN] [--no_past]
      [--lists_from=P_OTHER] [config flags]
  python experiments/panel.py score --out=P --judgments=J1.json,J2.json

`make` draws `--contexts` (session prefix -> next query) contexts of the validation split
(seeded; none that the panels of --not_in showed: a rule chosen on them is checked on
others), each with its user's earlier queries (which the judges do not see), asks each
suggester for its top 5 under the user-facing protocol, and writes P/items.md (each
context's session and its lists shuffled, named A, B, C, ... per context, no system named)
and P/rubric.md (`RUBRIC`: what a judge is told, and all) for the judges, and P/key.json (which
list is which system) for `score`. Judges work apart, each given the two files alone.
Suggesters: the workdir's pipeline with each setting of SUGGESTERS, the learned ranker of
`--baseline` (another workdir, e.g. one whose ranker has other sources) where given, the
learned ranker of the same contexts without the user's past where `--no_past` is given (what a
sessions file or a request naming no user gets), and MPC (the training log's most popular next
queries). `--lists_from` adds the lists of another panel folder made on the same contexts
(the same workdir, --seed and --not_in, e.g. by the code before a change), each that differs
from this one's named `before_<system>`: a change is judged blind beside what it replaces.

A judge returns JSON: {"<context number>": {"<list letter>": ["U"|"G"|"N", ... one per
suggestion]}}: U useful, G garbled, N neither. `score` prints per system and judge the useful
and garbled shares of the top 5 and the share of lists with at least two useful suggestions.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
from absl import flags
from ml_collections import config_flags

from mtn_jax.data import preprocess
from mtn_jax.data import sessions
from mtn_jax.inference import habits
from mtn_jax.inference import pipeline
from mtn_jax.inference import popular
from mtn_jax.inference.inputs import Context
# pylint: enable=wrong-import-position

# (name, config.suggest overrides) of each pipeline shown.
SUGGESTERS = (
    ('learned', {'strategy': 'learned'}),
    ('generate', {'strategy': 'generate'}))
SHOWN = 5
# What each judge is given beside items.md, and nothing else: recall counts only the logged next
# query, and a panel measures the rest of what a person sees.
RUBRIC = """# How to rate the suggestions

Each context is the start of a real search session (its queries, oldest first) and several
lists of suggestions for the next query, in no particular order. Rate every suggestion:

- **U (useful)**: a well-formed query that a person who typed this session could plausibly
  want to search next: a refinement, a related topic, a likely follow-up. A generic popular
  query unrelated to the session ("google", "ebay", "yahoo", "myspace" after a session about
  the weather) is not useful, unless the session itself is about that site.
- **G (garbled)**: malformed or nonsensical as a query: word salad, scrambled order ("potter
  harry"), fragments ("cheap flights i"), odd insertions ("harry city potter"), two unrelated
  queries mashed together ("final fantasy bank").
- **N (neither)**: well-formed, but not about the session.

Answer with one JSON object: {"<context number>": {"<list letter>": ["U", "G", "N", ...]}},
one mark per suggestion in the list's order.
"""


def draw(workdir: str, count: int, seed: int, not_in: str | None
         ) -> tuple[list[Context], list[str], random.Random]:
  """(contexts, their next queries, the generator that drew them): `count` (session prefix ->
  next query) contexts of the validation split, none that the panels of `not_in` (folders,
  comma-separated) showed: a rule chosen on them is checked on others."""
  valid = sessions.load_split(preprocess.data_dir(os.path.abspath(workdir)), 'valid')
  pairs = [(i, t) for i in range(valid.num_sessions)
           for t in range(int(valid.lengths[i]) - 1)]
  shown_before = set()
  for earlier in filter(None, (not_in or '').split(',')):
    if not os.path.isfile(os.path.join(earlier, 'key.json')):
      sys.exit(f'--not_in: {earlier} holds no key.json (a folder `make` wrote)')
    with open(os.path.join(earlier, 'key.json'), encoding='utf-8') as f:
      shown_before |= {tuple(c) for c in json.load(f)['contexts']}
  if shown_before:
    pairs = [(i, t) for i, t in pairs
             if tuple(valid.session_texts(i)[:t + 1]) not in shown_before]
  rng = random.Random(seed)
  chosen = sorted(rng.sample(pairs, min(count, len(pairs))))
  # Each context with its user's earlier queries, as evaluation gives them (the judges see
  # the session alone, as a panel of people who did not type the earlier ones would).
  pasts = habits.past_queries(preprocess.data_dir(os.path.abspath(workdir)), valid)
  return ([Context(tuple(valid.session_texts(i)[:t + 1]), t, {}, history=tuple(pasts[i]))
           for i, t in chosen],
          [valid.session_texts(i)[t + 1] for i, t in chosen], rng)


def make(args, config) -> None:
  contexts, references, rng = draw(args.workdir, args.contexts, args.seed, args.not_in)
  lists = {}
  config.decode.exclude_session_queries = True
  for name, overrides in SUGGESTERS:
    variant = config.copy_and_resolve_references()
    variant.suggest.update(overrides)
    pipe = pipeline.Pipeline.load(variant, args.workdir)
    shown = pipe.suggest(contexts, positions='last')
    lists[name] = [[c['query'] for c in at[0]][:SHOWN] for at in shown]
  if args.baseline:
    # Another workdir's learned ranker (other sources, say), shown beside this one's.
    variant = config.copy_and_resolve_references()
    variant.suggest.strategy = 'learned'
    if args.baseline_sources:
      variant.suggest.sources = args.baseline_sources
    shown = pipeline.Pipeline.load(variant, args.baseline).suggest(contexts, positions='last')
    lists['learned_baseline'] = [[c['query'] for c in at[0]][:SHOWN] for at in shown]
  if args.no_past:
    # The same contexts as a sessions file or a request naming no user gives them.
    variant = config.copy_and_resolve_references()
    variant.suggest.strategy = 'learned'
    shown = pipeline.Pipeline.load(variant, args.workdir).suggest(
        [dataclasses.replace(c, history=()) for c in contexts], positions='last')
    lists['learned_no_past'] = [[c['query'] for c in at[0]][:SHOWN] for at in shown]
  counts = popular.LogCounts.of_workdir(args.workdir)
  lists['mpc'] = [[q for q in counts.most_popular(SHOWN + len(c.queries))
                   if q not in c.queries][:SHOWN] for c in contexts]
  if args.lists_from:
    with open(os.path.join(args.lists_from, 'key.json'), encoding='utf-8') as f:
      other = json.load(f)
    if other['contexts'] != [list(c.queries) for c in contexts]:
      sys.exit(f'--lists_from: {args.lists_from} holds other contexts (another workdir, --seed '
               'or --not_in)')
    lists |= {f'before_{name}': shown for name, shown in other['lists'].items()
              if shown != lists.get(name)}
  os.makedirs(args.out, exist_ok=True)
  key, lines = {}, ['# Suggestion lists to judge', '',
                    'For each context: the session so far (oldest first), then lists of up to '
                    '5 suggestions. Rate every suggestion U (useful), G (garbled) or N '
                    '(neither), as the rubric says.', '']
  names = list(lists)
  for n, context in enumerate(contexts, 1):
    order = names[:]
    rng.shuffle(order)
    key[str(n)] = {chr(65 + j): name for j, name in enumerate(order)}
    lines += [f'## Context {n}', '', 'Session: ' + ' | '.join(context.queries), '']
    for j, name in enumerate(order):
      shown = lists[name][n - 1]
      lines.append(f'- List {chr(65 + j)}: ' + ('; '.join(f'{k}. {q}' for k, q in
                                                         enumerate(shown, 1)) or '(empty)'))
    lines.append('')
  with open(os.path.join(args.out, 'items.md'), 'w', encoding='utf-8') as f:
    f.write('\n'.join(lines))
  with open(os.path.join(args.out, 'rubric.md'), 'w', encoding='utf-8') as f:
    f.write(RUBRIC)
  with open(os.path.join(args.out, 'key.json'), 'w', encoding='utf-8') as f:
    json.dump({'key': key, 'lists': lists,
               'contexts': [list(c.queries) for c in contexts],
               'references': references}, f, indent=1)
  print(f'{len(contexts)} contexts, {len(names)} lists each: {args.out}/items.md and rubric.md')


def score(args) -> None:
  with open(os.path.join(args.out, 'key.json'), encoding='utf-8') as f:
    record = json.load(f)
  key = record['key']
  print('| system | judge | useful % | garbled % | lists with >= 2 useful % |\n'
        '|---|---|---:|---:|---:|')
  systems = sorted({name for letters in key.values() for name in letters.values()})
  for path in args.judgments.split(','):
    with open(path, encoding='utf-8') as f:
      marks = _checked_marks(path, json.load(f), record)
    for system in systems:
      useful = garbled = total = two = lists = 0
      for n, letters in key.items():
        letter = next(l for l, name in letters.items() if name == system)
        labels = [m.upper()[:1] for m in marks.get(n, {}).get(letter, [])]
        shown = len(record['lists'][system][int(n) - 1])
        labels = labels[:shown]
        useful += labels.count('U')
        garbled += labels.count('G')
        total += SHOWN
        lists += 1
        two += labels.count('U') >= 2
      print(f'| {system} | {os.path.basename(path)} | {100 * useful / total:.1f} | '
            f'{100 * garbled / total:.1f} | {100 * two / lists:.1f} |')


def _checked_marks(path: str, marks, record: dict) -> dict:
  """A judge's marks, list letters upper-cased; exits naming the file and the first context
  or list that does not match key.json (a mismatch would score as no useful suggestion)."""
  if not isinstance(marks, dict):
    sys.exit(f'{path}: expected {{"<context number>": {{"<list letter>": ["U"|"G"|"N", ...]}}}}')
  key = record['key']
  unknown = [n for n in marks if n not in key]
  if unknown:
    sys.exit(f'{path}: context {unknown[0]!r} is not in key.json (contexts "1" to '
             f'"{len(key)}")')
  checked = {}
  for n, letters in key.items():
    given = {str(letter).upper(): m for letter, m in marks.get(n, {}).items()}
    for letter, system in letters.items():
      shown = len(record['lists'][system][int(n) - 1])
      got = given.get(letter)
      if not isinstance(got, list) or len(got) < shown:
        sys.exit(f'{path}: context {n}, list {letter}: {len(got) if isinstance(got, list) else 0}'
                 f' marks for its {shown} suggestions')
      if any(str(m).upper()[:1] not in 'UGN' for m in got[:shown]):
        sys.exit(f'{path}: context {n}, list {letter}: marks are U, G or N, got {got[:shown]}')
    checked[n] = given
  return checked


def run(description: str, make_fn, score_fn, *, contexts: int, seed: int,
        add_arguments=lambda parser: None) -> None:
  """The command line of a study of judged contexts: `make` (the config flags after the
  study's own) or `score`, with the flags every such study takes and `add_arguments`'."""
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument('command', choices=('make', 'score'))
  parser.add_argument('--workdir')
  parser.add_argument('--out', required=True)
  parser.add_argument('--contexts', type=int, default=contexts)
  parser.add_argument('--seed', type=int, default=seed)
  parser.add_argument('--not_in', help='earlier --out folders, comma-separated: their '
                      'contexts are not drawn again')
  parser.add_argument('--judgments', default='', help='score: comma-separated JSON files')
  add_arguments(parser)
  args, rest = parser.parse_known_args()
  if args.command == 'score':
    if rest:
      parser.error(f'unrecognized arguments: {" ".join(rest)}')
    if not args.judgments:
      parser.error('score needs --judgments=J1.json[,J2.json]')
    score_fn(args)
    return
  if not args.workdir:
    parser.error('make needs --workdir=W')
  config_flags.DEFINE_config_file('config', 'configs/aol.py:small')
  try:
    flags.FLAGS([sys.argv[0], *rest])
  except flags.Error as e:  # a mistyped flag: one line, not a traceback
    parser.error(str(e))
  make_fn(args, flags.FLAGS.config)


def _baseline_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument('--baseline', help='make: a workdir whose learned ranker is shown too '
                      "('learned_baseline')")
  parser.add_argument('--baseline_sources', help="make: the baseline's config.suggest.sources")
  parser.add_argument('--lists_from', help='make: a panel folder of the same contexts whose '
                      "differing lists are shown too ('before_<system>')")
  parser.add_argument('--no_past', action='store_true', help="make: the learned ranker's lists "
                      "of the same contexts without the user's past too ('learned_no_past')")


if __name__ == '__main__':
  run(' '.join(__doc__.split('\n\n')[0].split()), make, score, contexts=80, seed=0,
      add_arguments=_baseline_arguments)
