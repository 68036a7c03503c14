"""The learned ranker's training (`fit`, run by `--mode=train`): its data, cross-fitted, and
the LightGBM model learned from it; what it is and how it ranks: `learned`.

Cross-fitted, as a service meets unseen users: the training users are dealt into
`config.suggest.ranker_folds` folds; a generator trained without each fold
(`<workdir>/folds/fold<k>`, `config.train.user_folds`) proposes and scores that fold's contexts,
and the training log's counts come from the other folds' users only (`cross_fitted_groups`).
With a `history` source, each context is learned from with its user's past and again without
it (`learning_groups`), as a service meets both. The candidates and features are kept in the
ranker's folder (`cached_groups`): a refit on the same fold generators and sources reads them
back, and the studies (experiments/learned_ranker.py) score variants on them.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import json
import os
import shutil
import time
import zipfile
from collections.abc import Sequence

import ml_collections
import numpy as np

from mtn_jax import files
from mtn_jax import inference
from mtn_jax.data import preprocess
from mtn_jax.data import sessions
from mtn_jax.decoding import search
from mtn_jax.inference import habits
from mtn_jax.inference import learned
from mtn_jax.inference import popular
from mtn_jax.inference import sources as sources_lib


PROGRESS_SESSIONS = 1024  # sessions between two progress lines of the ranker's data


def fold_config(config: ml_collections.ConfigDict, fold: int) -> ml_collections.ConfigDict:
  """`config` for the generator trained without the users of `fold`."""
  c = ml_collections.ConfigDict(config.to_dict())
  c.train.user_folds = config.suggest.ranker_folds
  c.train.held_out_fold = fold
  return c


@dataclasses.dataclass
class Groups:
  """Learning-to-rank data: one group per (context, position), with rows only where the
  candidates hold the logged next query (no order of the others finds it: they are counted,
  with 0 rows).

  Attributes:
    features: float32 [rows, F]; labels: int32 [rows], 1 for the logged next query.
    sizes: int [groups] rows per group; folds: int [groups] the fold of each group's user.
    texts, references, sessions: [groups] the candidates, the logged next query, the
      session so far; lists: [groups] {source: its candidate texts} (each source alone).
  """

  features: np.ndarray
  labels: np.ndarray
  sizes: np.ndarray
  folds: np.ndarray
  texts: list[list[str]]
  references: list[str]
  sessions: list[tuple[str, ...]]
  lists: list[dict[str, list[str]]]


def cached_groups(config: ml_collections.ConfigDict, workdir: str, folder: str | None = None,
                  log=print) -> Groups:
  """The cross-fitted groups of `config`'s sources: those kept in `folder` (default: the
  workdir's ranker folder) where they were made from the same `groups_key`, else made
  (`cross_fitted_groups`, each fold's part kept under `folder`/parts until all are) and kept
  there."""
  folder = folder or learned.ranker_dir(workdir)
  key = groups_key(config, workdir)
  groups = load_groups(folder, key, log)
  if groups is not None:
    log('  ranker data: the candidates of the last fit (the same fold generators and sources)',
        flush=True)
    return groups
  parts = os.path.join(folder, 'parts')
  groups = cross_fitted_groups(config, workdir, key, parts, log)
  save_groups(groups, folder, key)
  shutil.rmtree(parts, ignore_errors=True)
  return groups


def cross_fitted_groups(config: ml_collections.ConfigDict, workdir: str, key: dict,
                        parts_dir: str, log=print) -> Groups:
  """Every training pair's candidates and features, cross-fitted: the pairs of fold k's
  users proposed and scored by the generator trained without them, the log's counts taken
  from the other folds' users (`Groups`: described where the next query is a candidate).
  Each fold's part is kept in `parts_dir`/fold<k> under its share of `key` (`groups_key`):
  a run stopped on the way makes again only the folds it had not finished."""
  folds = config.suggest.ranker_folds
  plan = learned.parse_sources(config.suggest.sources)
  data_dir = preprocess.data_dir(os.path.abspath(workdir))
  train = sessions.load_split(data_dir, 'train')
  fold_of = sessions.session_folds(train, folds, config.data.split_seed)
  # Each session's user's earlier queries, as evaluation reads them (a user's own: no fold's).
  histories = (habits.past_queries(data_dir, train, keep=config.suggest.past_queries)
               if sources_lib.reads_past(dict(plan)) else None)
  settings = search.SearchSettings.from_config(config.decode)
  parts, to_make = {}, []
  for k in range(folds):
    parts[k] = load_groups(os.path.join(parts_dir, f'fold{k}'), _fold_key(key, k), log)
    if parts[k] is None:
      to_make.append(k)
    else:
      log(f'  ranker data: fold {k}, the candidates made before (the same fold generator)',
          flush=True)
  left = sum(int((fold_of == k).sum()) for k in to_make)
  started, done = time.time(), 0
  for k in to_make:
    trained = inference.load_trained(fold_config(config, k), learned.fold_workdir(workdir, k))
    others = [train.session_texts(i) for i in np.flatnonzero(fold_of != k).tolist()]
    counts = popular.LogCounts.of_sessions(others)
    contexts = sources_lib.session_contexts(train, np.flatnonzero(fold_of == k).tolist(),
                                            histories)
    candidate_sources = learned.build_sources(plan, trained, counts, settings)
    out = collections.defaultdict(list)
    # A part of the sessions at a time, with a progress line and an ETA after each.
    part = max(PROGRESS_SESSIONS // config.decode.batch_sessions, 1) * config.decode.batch_sessions
    for start in range(0, len(contexts), part):
      some = contexts[start:start + part]
      by_source, pools = learned.lists_and_features(
          trained, some, candidate_sources, counts, positions='all',
          batch_rows=config.decode.batch_sessions,
          drop_session=True, keep=lambda i, p, texts, some=some: some[i].references[p] in texts)
      for i, context in enumerate(some):
        for p, pool in enumerate(pools[i]):
          reference = context.references[p]
          out['features'].append(pool.features)
          out['labels'].append(np.array([t == reference for t in pool.texts], np.int32))
          out['sizes'].append(len(pool.texts))
          out['texts'].append(pool.texts)
          out['references'].append(reference)
          out['sessions'].append(context.queries[:p + 1])
          out['lists'].append({name: [c['query'] for c in lists[i][p]]
                               for name, lists in by_source.items()})
      done += len(some)
      elapsed = time.time() - started
      log(f'  ranker data: fold {k}, {min(start + part, len(contexts)):,} of '
          f'{len(contexts):,} sessions; {elapsed:.0f} s, ETA '
          f'{elapsed / done * (left - done):.0f} s', flush=True)
    if not out['features']:  # a fold of no session
      out['features'], out['labels'] = [np.zeros((0, len(key['features'])), np.float32)], [
          np.zeros(0, np.int32)]
    parts[k] = Groups(np.concatenate(out['features']), np.concatenate(out['labels']),
                      np.asarray(out['sizes'], int), np.full(len(out['sizes']), k),
                      out['texts'], out['references'], out['sessions'], out['lists'])
    save_groups(parts[k], os.path.join(parts_dir, f'fold{k}'), _fold_key(key, k))
  return concatenate([parts[k] for k in range(folds)])


def concatenate(parts: Sequence[Groups]) -> Groups:
  """The groups of `parts`, one after another."""
  return Groups(np.concatenate([g.features for g in parts]),
                np.concatenate([g.labels for g in parts]),
                np.concatenate([g.sizes for g in parts]),
                np.concatenate([g.folds for g in parts]),
                [t for g in parts for t in g.texts], [r for g in parts for r in g.references],
                [s for g in parts for s in g.sessions], [x for g in parts for x in g.lists])


def _fold_key(key: dict, k: int) -> dict:
  """Fold k's share of `key` (`groups_key`): its generator's step, not the other folds'."""
  return {**{name: v for name, v in key.items() if name != 'fold_steps'}, 'fold': k,
          'fold_step': key['fold_steps'][k]}


def groups_key(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """What `cross_fitted_groups` makes its candidates from: the sources, the folds, the fold
  generators' best checkpoints, the decoding settings, and the features it computes."""
  plan = learned.parse_sources(config.suggest.sources)
  return {'sources': [list(x) for x in plan],
          'folds': config.suggest.ranker_folds, 'fold_steps': learned.fold_steps(config, workdir),
          'split_seed': config.data.split_seed, 'search': learned.search_key(config),
          'features': learned.feature_names([name for name, _ in plan]),
          'features_version': learned.FEATURES_VERSION, **learned.past_key(config)}


def save_groups(groups: Groups, folder: str, key: dict) -> None:
  """`groups` as `folder`/groups.npz (the arrays) and groups.json (the texts), each holding
  `key`, what they were made from (`groups_key`), for a later fit or a study (`load_groups`).
  Each file is written whole or not at all, but not the two together: the key in both tells
  a pair from two runs' halves."""
  os.makedirs(folder, exist_ok=True)
  for name in ('groups.npz', 'groups.json'):  # a killed run's half-written files
    files.remove_temporaries(os.path.join(folder, name))
  with files.atomic_path(os.path.join(folder, 'groups.npz'), suffix='.npz') as path:
    np.savez(path, features=groups.features, labels=groups.labels, sizes=groups.sizes,
             folds=groups.folds, key=np.array(json.dumps(key, sort_keys=True)))
  files.write_text(os.path.join(folder, 'groups.json'), json.dumps(
      {'key': key, 'texts': groups.texts,
       'references': groups.references, 'sessions': [list(s) for s in groups.sessions],
       'lists': groups.lists}))


def load_groups(folder: str, key: dict, log=print) -> Groups | None:
  """The groups `save_groups` wrote from `key` (both files), or None."""
  paths = [os.path.join(folder, name) for name in ('groups.npz', 'groups.json')]
  if not all(os.path.exists(p) for p in paths):
    return None
  # A cache: files that cannot be read, or that two runs wrote (one killed between its two
  # files), are made again, not refused.
  try:
    with open(paths[1], encoding='utf-8') as f:
      texts = json.load(f)
    saved = texts.get('key') if isinstance(texts, dict) else None
    if isinstance(saved, dict) and 'features' not in saved:
      log(f'  ranker data: {folder}\'s cached candidates were made by an older version, '
          'which did not record their features: made again', flush=True)
      return None
    if not isinstance(saved, dict) or {**saved, 'search': learned.search_as_written_now(
        saved.get('search'))} != key:
      return None
    with np.load(paths[0], allow_pickle=False) as arrays:
      if json.loads(str(arrays['key'])) != json.loads(json.dumps(saved)):
        return None
      return Groups(arrays['features'], arrays['labels'], arrays['sizes'], arrays['folds'],
                    texts['texts'], texts['references'],
                    [tuple(s) for s in texts['sessions']], texts['lists'])
  except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
    log(f'  ranker data: {folder}\'s cached candidates cannot be read ({type(e).__name__}): '
        'made again', flush=True)
    return None


def without_history(groups: Groups, names: Sequence[str]) -> Groups:
  """`groups` as contexts without a user's past would make them (a sessions file, a request
  naming no user): what the sources of the past (`sources.PAST_SOURCES`) alone proposed left
  out, their ranks and scores missing, and a group whose next query only they proposed
  emptied. The other sources and the features of a candidate do not read the past, so these
  are exactly the groups such contexts give."""
  past = [s for s in sources_lib.PAST_SOURCES if f'{s}_rank' in names]
  ranks = [names.index(f'{s}_rank') for s in past]
  scores = [names.index(f'{s}_score') for s in past]
  count = names.index('num_sources')
  ends = np.cumsum(groups.sizes)
  features, labels, sizes, texts = [], [], [], []
  for g, (start, end) in enumerate(zip((ends - groups.sizes).tolist(), ends.tolist())):
    proposed = {q for name, found in groups.lists[g].items() if name not in past
                for q in found}
    keep = [j for j, q in enumerate(groups.texts[g]) if q in proposed]
    if groups.references[g] not in {groups.texts[g][j] for j in keep}:
      keep = []  # no order of the others finds the next query: no rows, as learning keeps it
    x = groups.features[start:end][keep]  # (a copy: indexed by a list)
    x[:, count] -= (~np.isnan(x[:, ranks])).sum(1)
    x[:, ranks + scores] = np.nan
    features.append(x)
    labels.append(groups.labels[start:end][keep])
    sizes.append(len(keep))
    texts.append([groups.texts[g][j] for j in keep])
  return Groups(np.concatenate(features), np.concatenate(labels), np.asarray(sizes, int),
                groups.folds, texts, groups.references, groups.sessions,
                [{name: found for name, found in lists.items() if name not in past}
                 for lists in groups.lists])


def learning_groups(groups: Groups, names: Sequence[str]) -> Groups:
  """What the ranker learns from: `groups`, and with a source of the user's past the same
  contexts without it too (`without_history`), as a service meets both: learned from the
  first alone, it ranks the second's candidates below the ranker of a plan without it."""
  if not any(f'{s}_rank' in names for s in sources_lib.PAST_SOURCES):
    return groups
  return concatenate([groups, without_history(groups, names)])


def lightgbm_params(config: ml_collections.ConfigDict) -> dict:
  """LightGBM's listwise XE-NDCG objective with small, well-filled trees: few contexts of a
  fold hold the next query at the sample's size, and bigger trees or lambdarank fitted them
  less well for unseen users (docs/RESULTS.md, "A learned ranker")."""
  return {'objective': 'rank_xendcg', 'learning_rate': 0.05, 'num_leaves': 7,
          'min_data_in_leaf': 200, 'num_threads': len(os.sched_getaffinity(0)), 'seed': config.seed,
          'deterministic': True, 'force_row_wise': True, 'verbosity': -1}


def train_booster(groups: Groups, chosen: np.ndarray, config: ml_collections.ConfigDict,
                  names: Sequence[str], columns: Sequence[int] | None = None):
  """A LightGBM XE-NDCG model on the groups `chosen` (bool [groups]) that hold the logged
  next query (the others carry no ranking signal); `columns`: the features used (all)."""
  import lightgbm  # pylint: disable=import-outside-toplevel
  ends = np.cumsum(groups.sizes)
  starts = ends - groups.sizes
  positive = np.zeros(len(groups.sizes), bool)
  positive[np.repeat(np.arange(len(groups.sizes)), groups.sizes)[groups.labels > 0]] = True
  keep = chosen & positive
  rows = np.concatenate([np.arange(s, e) for s, e in zip(starts[keep], ends[keep])])
  x = groups.features[rows]
  if columns is not None:
    x = x[:, columns]
    names = [names[c] for c in columns]
  data = lightgbm.Dataset(x, groups.labels[rows], group=groups.sizes[keep],
                          feature_name=list(names), free_raw_data=True)
  return lightgbm.train(lightgbm_params(config), data,
                        num_boost_round=config.suggest.ranker_rounds)


def fit(config: ml_collections.ConfigDict, workdir: str, log=print) -> dict:
  """Trains the workdir's learned ranker on the cross-fitted training pairs and writes it to
  `<workdir>/ranker/`; returns its record (ranker.json)."""
  plan = learned.parse_sources(config.suggest.sources)
  names = learned.feature_names([name for name, _ in plan])
  trained = inference.load_trained(config, workdir)
  started = time.time()
  log('Learned ranker: candidates and features of the training users\' pairs, each fold '
      'by the generator that never saw it.', flush=True)
  groups = cached_groups(config, workdir, log=log)
  learning = learning_groups(groups, names)
  booster = train_booster(learning, np.ones(len(learning.sizes), bool), config, names)
  importance = booster.feature_importance(importance_type='gain')
  total = float(importance.sum()) or 1.0
  meta = {
      'checkpoint_step': int(trained.step),
      'vocab_fingerprint': trained.vocab.fingerprint,
      'features_version': learned.FEATURES_VERSION,
      'sources': [list(item) for item in plan],
      'features': names,
      'importance': {n: round(float(v) / total, 4) for n, v in
                     sorted(zip(names, importance.tolist()), key=lambda kv: -kv[1])},
      'folds': config.suggest.ranker_folds,
      'fold_steps': learned.fold_steps(config, workdir),
      'rounds': config.suggest.ranker_rounds,
      'search': learned.search_key(config),
      **learned.past_key(config),
      'groups': int(len(groups.sizes)),
      'rows': int(len(learning.labels)),
      'candidate_recall': float(np.mean([r in t for r, t in zip(groups.references,
                                                                  groups.texts)])),
      'seconds': round(time.time() - started, 1),
      'date': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
  }
  folder = learned.ranker_dir(workdir)
  os.makedirs(folder, exist_ok=True)
  for name in (learned.RANKER_MODEL, learned.RANKER_META):  # a killed fit's half-written files
    files.remove_temporaries(os.path.join(folder, name))
  with files.atomic_path(os.path.join(folder, learned.RANKER_MODEL)) as path:
    booster.save_model(path)
    meta['model_sha256'] = learned.file_sha256(path)
  files.write_text(os.path.join(folder, learned.RANKER_META), json.dumps(meta, indent=1) + '\n')
  top = ', '.join(f'{n} {v:.2f}' for n, v in list(meta['importance'].items())[:5])
  log(f'Learned ranker: {meta["groups"]:,} contexts, the next query among the candidates of '
      f'{100 * meta["candidate_recall"]:.1f} % of them ({meta["rows"]:,} candidates learned '
      f'from), {meta["seconds"]:.0f} s; most important: {top}. Written to {folder}', flush=True)
  return meta
