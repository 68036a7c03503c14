"""Which blend of the generator's beam and the training log's lists suggests best for unseen
users, under the user-facing protocol (no query of the session suggested again)?

  python experiments/blend_sources.py --workdir=W                       # choose, on validation
  python experiments/blend_sources.py --workdir=W --folds=F0,F1        # choose on training users
  python experiments/blend_sources.py --workdir=W --folds=F0,F1 --test # then on test, once

In: a workdir of `configs/aol.py:small` trained with `config.data.split_by='user'` and
evaluated on the validation split by the generator's own beam (`--mode=eval
--config.decode.eval_split=valid --config.suggest.strategy=generate`, which writes
eval/valid_lists.jsonl: every pair's context, reference and the generator's ordered list);
with `--test` also evaluated on test (eval/lists.jsonl). The training log's lists come
from the workdir's training split (`popular.LogCounts`).

The candidates of a pair: the beam (in the generator's order), the most popular next queries
of the training log (MPC) and the queries that followed the previous one there
(co-occurrence), each with the session's queries dropped. Blends measured:
  - each source alone, and co-occurrence with MPC as its fallback (the trivial suggesters);
  - fixed quotas: the first a of one source, then b of another, then the rest;
  - a fourth source tried here only, 'topical': the most popular next queries that share a
    word with the previous query;
  - calibrated interleaving: each candidate scored by the chance that a source's r-th
    candidate is the next query, estimated per (source, rank) on pairs of other sessions,
    combined over the sources proposing it as a noisy-or, best first.
A blend with a choice (quota, calibration) is scored by 2-fold cross-fitting over the
users it is chosen on: chosen or estimated on one half of the users, scored on the other's
pairs, the two halves' figures pooled (until 2026-11-29 the halves were of sessions, so one
user's sessions could be on both sides). It is chosen on the validation split, or with
`--folds` on the training users' pairs, each with the beam of a generator trained without that user
(`config.train.user_folds=2`, F0 and F1 holding out fold 0 and 1) and the log counts of the
other fold's users: ~15x the validation split's pairs; validation then checks the choice.
`--test` scores the blends so chosen on test, once.

Out (stdout): per blend EM@1, R@5, R@10 and MRR@10 (%, as the evaluation scores them), the
pairs, and with `--test` both splits. Nothing is written.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import sys

import ml_collections
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
from mtn_jax import errors
from mtn_jax import parallel
from mtn_jax.data import hypothesis_files
from mtn_jax.data import preprocess
from mtn_jax.data import sessions
from mtn_jax.decoding import search
from mtn_jax.evaluation import metrics
from mtn_jax.inference import hypothesis_decoding
from mtn_jax.inference import pipeline
from mtn_jax.inference import popular
# pylint: enable=wrong-import-position

TOP_K = 10
SOURCES = ('generate', 'popular', 'cooccurring', 'topical')
RANK_BINS = (1, 2, 3, 4, 5, 6, 8, 11, 16, 31)  # calibration bins: ranks [1], [2], ..., [16, 30]


class LogLists:
  """The training log's lists: LogCounts' popular and co-occurring next queries, and
  'topical': the most popular next queries that share a word with the previous query (a
  study-only source, not in the pipeline)."""

  def __init__(self, session_texts: list[list[str]]):
    self.counts = popular.LogCounts.of_sessions(session_texts)
    issued = collections.Counter(q for texts in session_texts for q in texts[1:])
    by_word: dict[str, list[str]] = collections.defaultdict(list)
    for query, _ in issued.most_common():
      for word in set(query.split()):
        if len(by_word[word]) < 50:
          by_word[word].append(query)
    self.issued, self.by_word = issued, by_word

  def topical(self, previous: str, k: int) -> list[str]:
    found = {q for word in set(previous.split()) for q in self.by_word.get(word, ())}
    return sorted(found, key=lambda q: -self.issued[q])[:k]


def make_pair(session: int, user: int, context: list[str], reference: str, beam: list[str],
              log: LogLists) -> dict:
  """A pair with its sources' candidates, the session's queries dropped."""
  seen = set(context)
  fresh = lambda queries: [q for q in dict.fromkeys(queries) if search.shown_to_user(q, seen)]
  depth = TOP_K + len(context)  # as deep as the pipeline reads them
  return {'session': session, 'user': user, 'context': context, 'reference': reference,
          'generate': fresh(beam),
          'popular': fresh(log.counts.most_popular(depth)),
          'cooccurring': fresh(log.counts.followers(context[-1], depth)),
          'topical': fresh(log.topical(context[-1], depth))}


def read_pairs(path: str, split: sessions.SessionSplit, counts: LogLists) -> list[dict]:
  """Every pair of an evaluation's lists.jsonl of `split` (the generator's whole beam in
  order)."""
  if split.users is None:
    sys.exit(f'the {split.name} split has no users (a corpus written before they were kept): '
             'run --mode=preprocess again')
  if not os.path.exists(path):
    # The generator's own lists of the whole split: an eval with config.suggest.strategy=generate
    # (a learned or blend eval, or one of the first N sessions, writes files of other names).
    split_flag = '' if split.name == 'test' else f' --config.decode.eval_split={split.name}'
    sys.exit(f'{path}: missing; make it with python -m mtn_jax.main ... --workdir=WORKDIR '
             f'--mode=eval --config.suggest.strategy=generate{split_flag}')
  with open(path, encoding='utf-8') as f:
    rows = [json.loads(line) for line in f]
  return [make_pair(row['session'], int(split.users[row['session']]), row['context'],
                    row['reference'], [s['query'] for s in row['suggestions']], counts)
          for row in rows]


def cross_fitted_training_pairs(workdir: str, fold_workdirs: str) -> list[dict]:
  """Every pair of the training split, each with the beam of the generator that never saw
  its user (`config.train.user_folds`, decoded once and cached by the preparation step of
  `config.train.hypotheses_from`) and the log counts of the other folds' users only: what an
  unseen user gets, on ~15x the validation split's pairs."""
  with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
    config = ml_collections.ConfigDict(json.load(f)['config'])
  config.train.hypotheses_from = fold_workdirs
  data_dir = preprocess.data_dir(os.path.abspath(workdir))
  try:
    hypothesis_decoding.prepare(config, workdir, ('train',))
    found = hypothesis_files.generators(fold_workdirs, data_dir)
  except errors.Error as e:  # it names the key --folds sets
    sys.exit(f'--folds: {str(e).removeprefix(hypothesis_files.KEY + ": ")}')
  train = sessions.load_split(data_dir, 'train')
  beams = hypothesis_files.split_suggestions(found, train)
  fold_of = sessions.session_folds(train, found[0].folds, found[0].config.data.split_seed)
  texts = [train.session_texts(i) for i in range(train.num_sessions)]
  counts = [LogLists([t for t, f in zip(texts, fold_of) if f != held_out])
            for held_out in range(found[0].folds)]
  return [make_pair(i, int(train.users[i]), queries[:t + 1], queries[t + 1],
                    beams[train.starts[i] + t], counts[fold_of[i]])
          for i, queries in enumerate(texts) for t in range(len(queries) - 1)]


def figures(lists: list[list[str]], pairs: list[dict]) -> dict[str, float]:
  """EM@1, R@5, R@10, MRR@10 (%) of the first TOP_K of each list, as the evaluation scores
  them (`metrics.suggestion_ranking`)."""
  scores = metrics.suggestion_ranking([shown[:TOP_K] for shown in lists],
                                      [p['reference'] for p in pairs],
                                      [p['context'] for p in pairs])
  return {'EM@1': scores.exact_match, 'R@5': scores.recall_at_5, 'R@10': scores.recall_at_10,
          'MRR@10': scores.mrr_at_10, 'pairs': len(pairs)}


def chained(*lists: list[str]) -> list[str]:
  return list(dict.fromkeys(itertools.chain(*lists)))


def quota(pair: dict, plan: tuple[tuple[str, int], ...]) -> list[str]:
  """The first n of each source in `plan`'s order (a text once), then the rest of each: the
  pipeline's 'blend' itself (`pipeline.blended`) on lists the session's queries are out of."""
  return [c['query'] for c in pipeline.blended(pair, plan, session_so_far=())]


def _bin(rank: int) -> int:
  return int(np.searchsorted(RANK_BINS, rank, side='right')) - 1


def calibrate(pairs: list[dict]) -> dict[tuple[str, int], float]:
  """(source, rank bin) -> the share of its candidates there that were the next query
  (add-one smoothed towards 0)."""
  hits, seen = collections.Counter(), collections.Counter()
  for pair in pairs:
    for source in SOURCES:
      for rank, query in enumerate(pair[source], 1):
        key = (source, _bin(rank))
        seen[key] += 1
        hits[key] += query == pair['reference']
  return {key: hits[key] / (seen[key] + 1) for key in seen}


def calibrated(pair: dict, chance: dict[tuple[str, int], float]) -> list[str]:
  """The candidates by the noisy-or of their sources' calibrated chances, best first (on a
  tie the source order of SOURCES, then rank)."""
  miss: dict[str, float] = {}
  order: dict[str, tuple[int, int]] = {}
  for s, source in enumerate(SOURCES):
    for rank, query in enumerate(pair[source], 1):
      miss[query] = miss.get(query, 1.0) * (1 - chance.get((source, _bin(rank)), 0.0))
      order.setdefault(query, (s, rank))
  return sorted(miss, key=lambda q: (miss[q], order[q]))


def plans() -> list[tuple[tuple[str, int], ...]]:
  """Quota plans: two or three sources in an order, each but the last with a quota of 1, 2,
  3 or 5, the last filling the list."""
  out = []
  for size in (2, 3):
    for order in itertools.permutations(SOURCES, size):
      for quotas in itertools.product((1, 2, 3, 5), repeat=size - 1):
        out.append(tuple(zip(order, (*quotas, TOP_K))))
  return out


def halves(pairs: list[dict]) -> tuple[list[dict], list[dict]]:
  """Two halves of the pairs by user (every pair of a user in one half: a choice is scored
  on users it was not made on)."""
  folds = sessions.user_folds(np.array([p['user'] for p in pairs]), 2, seed=0)
  if len(set(folds.tolist())) < 2:
    sys.exit(f'{len(pairs)} pairs of a single user: too few users to choose on one half and '
             'score on the other')
  return ([p for p, f in zip(pairs, folds) if f == 0],
          [p for p, f in zip(pairs, folds) if f == 1])


def cross_fitted(pairs: list[dict], choose, apply) -> dict[str, float]:
  """Figures of `apply(pair, choose(other half))` over both halves, pooled."""
  lists, ordered = [], []
  for held, fit in (halves(pairs), halves(pairs)[::-1]):
    chosen = choose(fit)
    lists += [apply(p, chosen) for p in held]
    ordered += held
  return figures(lists, ordered)


def best_plan(pairs: list[dict]):
  """The quota plan of the highest R@10 among those whose MRR@10 is at least MPC's (the two
  targets: more next queries in the list, none ranked lower than the popular list ranks
  them); the highest MRR@10 where none is."""
  mpc = figures([p['popular'] for p in pairs], pairs)['MRR@10']
  scored = [(figures([quota(p, plan) for p in pairs], pairs), plan) for plan in plans()]
  eligible = [(f['R@10'], f['MRR@10'], plan) for f, plan in scored if f['MRR@10'] >= mpc]
  if eligible:
    return max(eligible, key=lambda item: item[:2])[2]
  return max(scored, key=lambda item: (item[0]['MRR@10'], item[0]['R@10']))[1]


def report(name: str, f: dict[str, float]) -> None:
  print(f'| {name} | {f["EM@1"]:.2f} | {f["R@5"]:.2f} | {f["R@10"]:.2f} | {f["MRR@10"]:.2f} |',
        flush=True)


TRIVIAL = {
    'MTN alone': lambda p: p['generate'],
    'MPC (most popular next queries)': lambda p: p['popular'],
    'co-occurrence, then MPC': lambda p: chained(p['cooccurring'], p['popular']),
    'MTN, then MPC': lambda p: chained(p['generate'], p['popular']),
    'MPC 5, then MTN (untuned)': lambda p: quota(p, (('popular', 5), ('generate', 10))),
    'topical MPC (sharing a word with the previous query), then MPC':
        lambda p: chained(p['topical'], p['popular'])}


def table(title: str, pairs: list[dict], plan=None, chance=None) -> None:
  """The trivial blends, and the chosen ones: `plan` and `chance` as given, else chosen by
  2-fold cross-fitting over `pairs`' users."""
  print(f'\n{title}: {len(pairs):,} pairs (user-facing protocol, %)')
  print('| blend | EM@1 | R@5 | R@10 | MRR@10 |\n|---|---:|---:|---:|---:|')
  for name, blend in TRIVIAL.items():
    report(name, figures([blend(p) for p in pairs], pairs))
  if plan is None:
    report('quotas, chosen on the other half (2-fold)', cross_fitted(pairs, best_plan, quota))
    report('calibrated interleaving, estimated on the other half (2-fold)',
           cross_fitted(pairs, calibrate, calibrated))
  else:
    report(f'quotas {plan}', figures([quota(p, plan) for p in pairs], pairs))
    report('calibrated interleaving', figures([calibrated(p, chance) for p in pairs], pairs))


def main() -> None:
  parser = argparse.ArgumentParser(description=' '.join(__doc__.split('\n\n')[0].split()))
  parser.add_argument('--workdir', required=True)
  parser.add_argument('--folds', default='',
                      help='comma-separated workdirs of the generators trained with '
                      'config.train.user_folds=K: choose on the cross-fitted training pairs')
  parser.add_argument('--test', action='store_true',
                      help='also score the chosen blends on test, once')
  args = parser.parse_args()
  parallel.set_cpu_devices(0)  # the generators decode on one device per core, as the CLI does
  data_dir = preprocess.data_dir(os.path.abspath(args.workdir))
  train = sessions.load_split(data_dir, 'train')
  counts = LogLists([train.session_texts(i) for i in range(train.num_sessions)])
  valid = read_pairs(os.path.join(args.workdir, 'eval', 'valid_lists.jsonl'),
                     sessions.load_split(data_dir, 'valid'), counts)
  chosen_on = valid
  if args.folds:
    chosen_on = cross_fitted_training_pairs(args.workdir, args.folds)
    table('training users, each scored by the generator that never saw them', chosen_on)
  else:
    table('validation', valid)
  plan, chance = best_plan(chosen_on), calibrate(chosen_on)
  print(f'\nquota plan chosen: {plan}')
  print('calibrated chances (source, rank bin start): ' + ', '.join(
      f'{s}@{RANK_BINS[b]} {v:.4f}' for (s, b), v in sorted(chance.items())))
  if args.folds:
    table('validation, blends chosen on the training users', valid, plan, chance)
  if args.test:
    test = read_pairs(os.path.join(args.workdir, 'eval', 'lists.jsonl'),
                      sessions.load_split(data_dir, 'test'), counts)
    table('test, blends chosen before', test, plan, chance)


if __name__ == '__main__':
  main()
