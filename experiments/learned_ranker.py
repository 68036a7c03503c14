"""Does a learned ranker over the pooled candidate sources suggest better for unseen users than
the quota blend, the most popular list and a rule list, on the training users, cross-fitted?

  python experiments/learned_ranker.py --workdir=W [--counts=whole_log] \
      [--config=configs/aol.py:small ...]

In: a workdir trained by `--mode=train` with `config.suggest.strategy='learned'` (its fold
generators in W/folds/). Every training pair's candidates and features are made as the
ranker's training makes them (`learned_training.cross_fitted_groups`: fold k's users proposed
and scored by the generator trained without them, the log's counts from the other folds'
users). Then a ranker is trained on the pairs of one fold of users and scored on the other's
(2-fold over users, the figures of both folds pooled), so no figure comes from a pair its
ranker saw.

User-facing protocol (no query of the session suggested; the candidates hold none): per
suggester EM@1, R@10 and MRR@10 (%), and each source's candidate recall (the next query among
its candidates at all). Suggesters: the learned ranker as shown (`presentation.presented`
with the config's rules), without each rule, with the session-first rule over fewer places,
alone without each feature group (the ablation; with and without the user's past); each source alone; MPC; the quota blend
`popular:3,cooccurring:5,generate:10`; the rule list (MPC's first 3, then the 5 most frequent
edit templates of the previous query, then MPC). Writes <workdir>/ranker/cross_fitted.json
(with --skip_ablation: cross_fitted_no_ablation.json; with --counts=whole_log, the log's
counts taken from every session of two or more queries the raw log holds for the training
users, not only the kept ones: cross_fitted_whole_log*.json); prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
from absl import flags
from ml_collections import config_flags

from mtn_jax.data import aol_log
from mtn_jax.data import preprocess
from mtn_jax.data import sessions
from mtn_jax.evaluation import metrics
from mtn_jax.inference import learned
from mtn_jax.inference import learned_training
from mtn_jax.inference import pipeline
from mtn_jax.inference import popular
from mtn_jax.inference import presentation
# pylint: enable=wrong-import-position

TOP_K = 10
# The sources' rows under RESULTS.md's names for them.
SOURCE_ROWS = {'generate': 'MTN + copy alone',
               'popular': 'MPC (10 most popular next queries)',
               'cooccurring': 'co-occurrence, then MPC',
               'templates': 'reformulation templates alone',
               'history': "the user's earlier queries alone (the most issued first)"}


def ranking(lists, references, sessions_so_far) -> dict[str, float]:
  """EM@1, R@10, MRR@10 (%) of ranked lists [pairs][k] against the references, as the
  evaluation scores them (`metrics.suggestion_ranking`: over the distinct suggestions)."""
  scores = metrics.suggestion_ranking([lst[:TOP_K] for lst in lists], references,
                                      sessions_so_far)
  return {'em1': scores.exact_match, 'r10': scores.recall_at_10, 'mrr10': scores.mrr_at_10}


def other_folds_sessions(config, workdir: str) -> list[list[tuple[str, ...]]]:
  """[folds] the training sessions' query texts of every other fold's users: what each fold's
  pairs were proposed with."""
  train = sessions.load_split(preprocess.data_dir(os.path.abspath(workdir)), 'train')
  fold_of = sessions.session_folds(train, config.suggest.ranker_folds, config.data.split_seed)
  return [[train.session_texts(i) for i in np.flatnonzero(fold_of != k).tolist()]
          for k in range(config.suggest.ranker_folds)]


def whole_log_other_folds_sessions(config, workdir: str) -> list[list[list[str]]]:
  """[folds] as `other_folds_sessions`, but every session of two or more queries the raw log
  holds for those users (cut by the corpus's rules, no bound on its length): the log's
  counts of every (query, next query) pair of the training users, not only of the sessions
  preprocessing keeps."""
  train = sessions.load_split(preprocess.data_dir(os.path.abspath(workdir)), 'train')
  fold_of_user = dict(zip(train.users.tolist(), sessions.session_folds(
      train, config.suggest.ranker_folds, config.data.split_seed).tolist()))
  d = config.data
  records = aol_log.read_logs(aol_log.expand_paths(d.raw_files)).records
  cut = aol_log.sessionize(records, gap_minutes=d.session_gap_minutes,
                           max_query_words=d.max_query_words, long_query=d.long_query,
                           min_queries=2, max_queries=2**31)
  out = [[] for _ in range(config.suggest.ranker_folds)]
  starts = cut.starts.tolist()
  for i in range(cut.num_sessions):
    rows = cut.record_index[starts[i]:starts[i + 1]]
    fold = fold_of_user.get(int(records.user[rows[0]]))
    if fold is None:  # a user of another split, or left out
      continue
    texts = records.texts(rows)
    for k in range(len(out)):
      if k != fold:
        out[k].append(texts)
  return out


def fold_counts(others: list) -> list[popular.LogCounts]:
  """[folds] the log's counts each fold's pairs were proposed with (`other_folds_sessions`)."""
  return [popular.LogCounts.of_sessions(sessions_of_others) for sessions_of_others in others]


def cross_fitted_scores(groups: learned_training.Groups, config, names, columns=None,
                        scored: learned_training.Groups | None = None) -> list:
  """[groups] the ranker's scores of each group's candidates, each fold's groups scored by a
  ranker trained on the other folds' (as `learned_training.fit` learns:
  `learned_training.learning_groups`; `columns`: the features used, all by default; `scored`:
  other groups of the same contexts to score, `groups` by default)."""
  scored = groups if scored is None else scored
  ends = np.cumsum(scored.sizes)
  starts = ends - scored.sizes
  out = [None] * len(scored.sizes)
  learning = learned_training.learning_groups(groups, names)
  for k in range(config.suggest.ranker_folds):
    booster = learned_training.train_booster(learning, learning.folds != k, config, names, columns)
    for g in np.flatnonzero(scored.folds == k).tolist():
      x = scored.features[starts[g]:ends[g]]
      if columns is not None:
        x = x[:, columns]
      out[g] = booster.predict(x) if len(x) else np.zeros(0)
  return out


def presentations(config) -> dict[str, dict]:
  """{'alone': the ranker's order as it is, 'as shown': `config.suggest`'s presentation
  rules}: the keyword arguments of `presented_lists` for each."""
  return {'alone': dict(session_first=0, attested_only=False, unrelated_first=0),
          'as shown': dict(session_first=config.suggest.session_first,
                           attested_only=config.suggest.attested_only,
                           unrelated_first=config.suggest.unrelated_first)}


def presented_lists(groups: learned_training.Groups, scores, counts, *, session_first: int,
                    attested_only: bool, unrelated_first: int) -> list[list[str]]:
  """Every group's list as `presentation.presented` shows it, its candidates in the order of
  `scores` (`cross_fitted_scores`)."""
  out = []
  for g, values in enumerate(scores):
    origin = learned.proposers({n: [{'query': q} for q in lst]
                                for n, lst in groups.lists[g].items()})
    ranked = [{'query': groups.texts[g][j], 'sources': origin[groups.texts[g][j]]}
              for j in np.argsort(-values, kind='stable')]
    shown = presentation.presented(ranked, groups.sessions[g], counts[groups.folds[g]],
                                   session_first=session_first, attested_only=attested_only,
                                   unrelated_first=unrelated_first)
    out.append([c['query'] for c in shown])
  return out


def study_config(program: str, parser: argparse.ArgumentParser):
  """`parser`'s arguments, and the config that the other arguments name (`--config`,
  configs/aol.py:small by default, and its `--config.KEY=VALUE` overrides) with the learned
  strategy: (args, config)."""
  args, rest = parser.parse_known_args()
  config_flags.DEFINE_config_file('config', 'configs/aol.py:small')
  try:
    flags.FLAGS([program, *rest])
  except flags.Error as e:  # a mistyped flag: one line, not a traceback
    parser.error(str(e))
  config = flags.FLAGS.config
  config.suggest.strategy = 'learned'
  return args, config


def main() -> None:
  parser = argparse.ArgumentParser(description=' '.join(__doc__.split('\n\n')[0].split()))
  parser.add_argument('--workdir', required=True)
  parser.add_argument('--skip_ablation', action='store_true')
  parser.add_argument('--counts', choices=('kept', 'whole_log'), default='kept',
                      help="the log's counts (popular, co-occurring, templates, "
                      "well-formedness) from the kept sessions' pairs, as the product counts "
                      "them, or from every session of the training users in the raw log")
  args, config = study_config('learned_ranker', parser)
  started = time.time()
  plan = learned.parse_sources(config.suggest.sources)
  folder = learned.ranker_dir(args.workdir)
  if args.counts == 'kept':
    counts = fold_counts(other_folds_sessions(config, args.workdir))
    # The candidates `fit` made (when it made them for these sources), or made again and
    # kept apart from the fit's (the next fit would otherwise make its own again).
    key = learned_training.groups_key(config, args.workdir)
    groups = (learned_training.load_groups(folder, key) or learned_training.cached_groups(
        config, args.workdir, os.path.join(folder, 'study')))
  else:
    counts = fold_counts(whole_log_other_folds_sessions(config, args.workdir))
    # `cross_fitted_groups` counts each fold's other users' kept sessions, fold by fold in
    # order: here it is handed the whole log's counts of the same users instead.
    handed = iter(counts)
    of_sessions = popular.LogCounts.of_sessions
    popular.LogCounts.of_sessions = classmethod(lambda cls, others, keep=100: next(handed))
    try:
      groups = learned_training.cached_groups(config, args.workdir,
                                     os.path.join(folder, 'study_whole_log'))
    finally:
      popular.LogCounts.of_sessions = of_sessions
  names = learned.feature_names([n for n, _ in plan])
  references = groups.references
  score = lambda lists: ranking(lists, references, groups.sessions)
  scored = {}

  def learned_lists(columns=None, session_first=config.suggest.session_first,
                    attested_only=config.suggest.attested_only,
                    unrelated_first=config.suggest.unrelated_first):
    key = None if columns is None else tuple(columns)
    if key not in scored:
      scored[key] = cross_fitted_scores(groups, config, names, columns)
    return presented_lists(groups, scored[key], counts, session_first=session_first,
                           attested_only=attested_only, unrelated_first=unrelated_first)

  rows = {}
  rows['learned ranker (the default)'] = score(learned_lists())
  if 'history' in dict(plan):
    # The same ranker where no user's past is known (a sessions file, a request naming no
    # user): trained on both kinds of context, as `learned_training.fit` trains it.
    bare = learned_training.without_history(groups, names)
    rows["the default, no user's past"] = score(presented_lists(
        bare, cross_fitted_scores(groups, config, names, scored=bare), counts,
        **presentations(config)['as shown']))
  rows['learned ranker, attested only, no first places'] = score(
      learned_lists(session_first=0))
  rows['learned ranker, nothing kept out or moved'] = score(
      learned_lists(session_first=0, attested_only=False))
  for places in (3, 5):
    for unrelated in (0, 1, 2):
      others = 'no unrelated query' if unrelated == 0 else f'at most {unrelated} unrelated'
      rows[f'learned ranker, first {places} with {others}'] = score(
          learned_lists(session_first=places, unrelated_first=unrelated))
  if not args.skip_ablation:
    alone = presentations(config)['alone']
    if 'history' in dict(plan):
      rows["learned ranker alone, no user's past"] = score(presented_lists(
          bare, cross_fitted_scores(groups, config, names, scored=bare), counts, **alone))
    for group, members in learned.feature_groups([n for n, _ in plan]).items():
      columns = [i for i, n in enumerate(names) if n not in members]
      rows[f'learned ranker alone without the {group} features'] = score(
          learned_lists(columns, session_first=0, attested_only=False))
      if 'history' in dict(plan):
        # The same where no past is known: what a group gives the contexts most requests are.
        rows[f"learned ranker alone without the {group} features, no user's past"] = score(
            presented_lists(bare, cross_fitted_scores(groups, config, names, columns,
                                                      scored=bare), counts, **alone))
  not_session = lambda lst, g: [q for q in lst if q not in groups.sessions[g]]
  for name, _ in plan:
    lists = [not_session(groups.lists[g][name], g) for g in range(len(references))]
    row = rows[SOURCE_ROWS.get(name, f'{name} alone')] = score(lists)
    row['candidate_recall'] = 100 * float(np.mean(
        [r in lst for r, lst in zip(references, lists)]))
  pool_recall = 100 * float(np.mean([r in t for r, t in zip(references, groups.texts)]))
  # The blend as the pipeline builds it: the beam, and the log's lists of its own depth
  # (co-occurring: the previous query's followers alone), from the fold's counts.
  blend = pipeline.parse_blend('popular:3,cooccurring:5,generate:10')
  rows['quota blend popular:3,cooccurring:5,generate:10'] = score(
      [[c['query'] for c in pipeline.blended(
          pipeline.blend_sources(groups.lists[g].get('generate', []), groups.sessions[g],
                                 counts[groups.folds[g]], TOP_K), blend, groups.sessions[g])
        if c['query'] not in groups.sessions[g]]
       for g in range(len(references))])
  rules = []
  for g in range(len(references)):
    mpc = not_session(groups.lists[g]['popular'], g)
    edits = not_session(groups.lists[g].get('templates', []), g)
    rules.append(list(dict.fromkeys(mpc[:3] + edits[:5] + mpc[3:])))
  rows['rule list (MPC 3, then 5 edit templates, then MPC)'] = score(rules)
  record = {'pairs': len(references), 'pool_candidate_recall': pool_recall,
            'counts': args.counts,
            'sources': config.suggest.sources, 'rounds': config.suggest.ranker_rounds,
            'session_first': config.suggest.session_first,
            'attested_only': config.suggest.attested_only,
            'unrelated_first': config.suggest.unrelated_first, 'rows': rows,
            'seconds': round(time.time() - started, 1)}
  # A run without the ablation keeps the whole record of the last full run.
  path = os.path.join(learned.ranker_dir(args.workdir), 'cross_fitted'
                      + ('_whole_log' if args.counts == 'whole_log' else '')
                      + ('_no_ablation' if args.skip_ablation else '') + '.json')
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(record, f, indent=1)
  print(f'Training users, cross-fitted ({len(references):,} pairs; the next query among the '
        f'pooled candidates for {pool_recall:.2f} %), user-facing protocol, %:\n')
  print('| suggester | EM@1 | R@10 | MRR@10 | candidate recall |\n|---|---:|---:|---:|---:|')
  for name, row in rows.items():
    recall = f'{row["candidate_recall"]:.2f}' if 'candidate_recall' in row else ''
    print(f'| {name} | {row["em1"]:.2f} | {row["r10"]:.2f} | {row["mrr10"]:.2f} | {recall} |')
  print(f'\n({record["seconds"]:.0f} s; written to {path})')


if __name__ == '__main__':
  main()
