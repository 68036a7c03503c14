"""Does the generator suggest better for unseen users when it learns from every session of the
training users, not only the 3- to 5-query sessions the paper keeps?

  python experiments/every_training_session.py make --workdir=W2 [config flags: the log]
  python -m mtn_jax.main [the same config flags] --workdir=W2 --mode=train
  python experiments/every_training_session.py compare --workdirs=W,W2 [config flags]

`make` preprocesses W2 as `--mode=preprocess` would (the same splits: users are split on the
paper's sessions, so the validation and test users and sessions stay those of any workdir of
this config), then rebuilds its training split from every session of the training users of
two or more queries, a session of more than `config.data.max_session_queries` cut into
consecutive windows of at most that many (a window of one query dropped), in the log's order,
with the corpus's own vocabulary (validation, test and the vocabulary stay as preprocessing
made them), and gives each fold generator's workdir (`<W2>/folds/fold<k>`) a copy.
`--mode=train` then trains everything the learned strategy needs on it: the generator, the
fold generators and the ranker, all of whose counts and contexts now come from the larger
split.

`compare` scores each workdir's learned ranker cross-fitted, on the candidates its ranker was
fitted on (`experiments/learned_ranker.py`'s `cross_fitted_scores`, the ranker alone and as
shown), on the first workdir's training pairs (the paper's sessions: each is a window of W2's
split too) and on all of each workdir's own.
Prints EM@1 / R@10 / MRR@10 (%) and the pool's candidate recall on those pairs.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
from mtn_jax.data import aol_log
from mtn_jax.data import candidate_pool
from mtn_jax.data import preprocess
from mtn_jax.data import sessions
from mtn_jax.data.vocab import Vocab
from mtn_jax.inference import learned
from mtn_jax.inference import learned_training
import learned_ranker  # experiments/learned_ranker.py, beside this script
# pylint: enable=wrong-import-position


def training_windows(cfg, train_users: set[int]):
  """(record rows [windows], users, start times) of every session of `train_users` of two or
  more queries, cut into consecutive windows of at most `cfg.max_session_queries`, each of
  two or more queries."""
  log = aol_log.read_logs(aol_log.expand_paths(cfg.raw_files))
  cut = aol_log.sessionize(log.records, gap_minutes=cfg.session_gap_minutes,
                           max_query_words=cfg.max_query_words, long_query=cfg.long_query,
                           min_queries=2, max_queries=2**31)
  rows, users, times = [], [], []
  starts = cut.starts.tolist()
  for i in range(len(starts) - 1):
    session = cut.record_index[starts[i]:starts[i + 1]]
    user = int(log.records.user[session[0]])
    if user not in train_users:
      continue
    for w in range(0, len(session), cfg.max_session_queries):
      window = session[w:w + cfg.max_session_queries]
      if len(window) >= 2:
        rows.append(window)
        users.append(user)
        times.append(int(log.records.time[window[0]]))
  return log.records, rows, np.asarray(users, np.int64), np.asarray(times, np.int64)


def make(config, workdir: str) -> None:
  cfg = config.data
  if cfg.history_queries or cfg.tokenizer != 'word':
    sys.exit('every_training_session.py make: a word vocabulary and no user history only')
  preprocess.prepare(config, workdir)
  folder = preprocess.data_dir(workdir)
  paper = sessions.load_split(folder, 'train')
  paper_sessions = [tuple(paper.session_texts(i)) for i in range(len(paper.users))]
  paper_pairs = int(paper.starts[-1]) - len(paper.users)
  records, windows, users, times = training_windows(cfg, set(paper.users.tolist()))
  rows = np.concatenate(windows)
  words = records.num_words[rows]
  # pylint: disable=protected-access
  # Preprocessing's own cut and encoding of the queries, as the paper's sessions had.
  texts = preprocess._cut(records.texts(rows), words, cfg.max_query_words)
  queries = preprocess._encode(texts, np.minimum(words, cfg.max_query_words),
                               Vocab.load(os.path.join(folder, 'vocab.json')), cfg.max_query_words)
  # pylint: enable=protected-access
  starts = np.concatenate([[0], np.cumsum([len(w) for w in windows])]).astype(np.int64)
  sessions.save_split(folder, 'train', queries, starts, texts, users, times)
  pool, _ = candidate_pool.build_pool(texts, queries)
  candidate_pool.save_pool(folder, pool)
  # The corpus's record of itself: the new split's counts, and the files' sizes (what
  # preprocessing checks to reuse the corpus rather than build it again).
  stats_path, manifest_path = (os.path.join(folder, n) for n in ('stats.json', 'manifest.json'))
  with open(stats_path, encoding='utf-8') as f:
    stats = json.load(f)
  stats['train'] = {'sessions': len(windows), 'pairs': int(starts[-1]) - len(windows)}
  stats['candidates'] = len(pool)
  with open(stats_path, 'w', encoding='utf-8') as f:
    json.dump(stats, f, indent=1)
  with open(manifest_path, encoding='utf-8') as f:
    manifest = json.load(f)
  manifest['sizes'] = {n: os.path.getsize(os.path.join(folder, n))
                       for n in preprocess._written_files()}  # pylint: disable=protected-access
  with open(manifest_path, 'w', encoding='utf-8') as f:
    json.dump(manifest, f)
  # Every paper session is a window of the new split, in the same order.
  new = sessions.load_split(folder, 'train')
  windows_text = iter(tuple(new.session_texts(i)) for i in range(len(new.users)))
  missing = sum(not any(w == session for w in windows_text) for session in paper_sessions)
  # The fold generators' workdirs read the same corpus (`--mode=train` would otherwise build
  # them the paper's).
  for k in range(config.suggest.ranker_folds):
    fold_data = preprocess.data_dir(learned.fold_workdir(workdir, k))
    shutil.rmtree(fold_data, ignore_errors=True)
    shutil.copytree(folder, fold_data)
  print(f'{folder}: training split of {stats["train"]["sessions"]:,} sessions '
        f'({stats["train"]["pairs"]:,} pairs) against the paper\'s {len(paper_sessions):,} '
        f'({paper_pairs:,}); paper sessions not among its windows, in order: {missing}')


def fitted_groups(workdir: str) -> learned_training.Groups:
  """The cross-fitted candidates the workdir's ranker was fitted on
  (`learned_training.save_groups`'s files), as they are: a workdir fitted before its cache
  recorded the features' names is read too (`learned_training.cached_groups` would make them
  again)."""
  folder = learned.ranker_dir(workdir)
  if not os.path.exists(os.path.join(folder, 'groups.json')):
    sys.exit(f'{workdir}: no fitted learned ranker ({folder}/groups.json): train it first '
             '(--mode=train)')
  with open(os.path.join(folder, 'groups.json'), encoding='utf-8') as f:
    texts = json.load(f)
  with np.load(os.path.join(folder, 'groups.npz'), allow_pickle=False) as arrays:
    if 'key' in arrays and json.loads(str(arrays['key'])) != texts.get('key'):
      sys.exit(f'{folder}: groups.npz and groups.json are of two fits: run --mode=train again')
    return learned_training.Groups(arrays['features'], arrays['labels'], arrays['sizes'],
                          arrays['folds'], texts['texts'], texts['references'],
                          [tuple(s) for s in texts['sessions']], texts['lists'])


def compare(config, workdirs: list[str]) -> None:
  plan = learned.parse_sources(config.suggest.sources)
  names = learned.feature_names([n for n, _ in plan])
  rules = learned_ranker.presentations(config)
  print('| workdir | ranker | the first\'s pairs: pool recall | EM@1 | R@10 | MRR@10 | its own '
        'pairs | EM@1 | R@10 | MRR@10 |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|')
  first = None
  for workdir in workdirs:
    groups = fitted_groups(workdir)
    counts = learned_ranker.fold_counts(learned_ranker.other_folds_sessions(config, workdir))
    keys = list(zip(groups.sessions, groups.references))
    first = first or collections.Counter(keys)
    left, chosen = collections.Counter(first), []
    for g, key in enumerate(keys):
      if left[key] > 0:
        left[key] -= 1
        chosen.append(g)
    recall = 100 * np.mean([groups.references[g] in groups.texts[g] for g in chosen])
    scores = learned_ranker.cross_fitted_scores(groups, config, names)
    for rule, settings in rules.items():
      lists = learned_ranker.presented_lists(groups, scores, counts, **settings)
      lists = [[q for q in lst if q not in groups.sessions[g]] for g, lst in enumerate(lists)]
      on_first = learned_ranker.ranking([lists[g] for g in chosen],
                                        [groups.references[g] for g in chosen],
                                        [groups.sessions[g] for g in chosen])
      own = learned_ranker.ranking(lists, groups.references, groups.sessions)
      print(f'| {workdir} | {rule} | {len(chosen):,}: {recall:.2f} | {on_first["em1"]:.2f} | '
            f'{on_first["r10"]:.2f} | {on_first["mrr10"]:.2f} | {len(keys):,} | '
            f'{own["em1"]:.2f} | {own["r10"]:.2f} | {own["mrr10"]:.2f} |', flush=True)


def main() -> None:
  parser = argparse.ArgumentParser(description=' '.join(__doc__.split('\n\n')[0].split()))
  parser.add_argument('action', choices=('make', 'compare'))
  parser.add_argument('--workdir', help='make: the workdir to make')
  parser.add_argument('--workdirs', help='compare: trained workdirs, the paper\'s first')
  args, config = learned_ranker.study_config('every_training_session', parser)
  needed = 'workdir' if args.action == 'make' else 'workdirs'
  if not getattr(args, needed):
    parser.error(f'{args.action} needs --{needed}')
  if args.action == 'make':
    make(config, args.workdir)
  else:
    compare(config, args.workdirs.split(','))


if __name__ == '__main__':
  main()
