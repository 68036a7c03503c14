"""Generated candidates for a ranker to learn from: cross-fitted generators' suggestions,
as files the ranker's training reads.

Reranking (`mtn_jax.inference.pipeline`) orders a generator's beam together with the
session's own queries, so the ranker must know how often a hypothesis is a better suggestion
than, say, the previous query. No negative drawn from the logged queries teaches that: a
hypothesis is built from the session's words and is wrong in its own ways. So the ranker
learns from the generator's suggestions on the training sessions
(`config.train.hypotheses_from`, every ranker, `mtn_jax.tasks.rankers`).

A generator's suggestions on its own training sessions are better than on an unseen user's
(it has fitted them), and would teach the ranker to trust hypotheses too much. Hence
cross-fitting: K generators, each trained without one fold of the training users
(`config.train.user_folds=K`, `held_out_fold=k`, `sessions.user_folds`), and every training
session's suggestions come from the generator that never saw its user, just as a
validation or test user's suggestions are made. Those of the other splits come from the
first generator (no generator saw their users).

The files are made by a preparation step before training or evaluation
(`mtn_jax.inference.hypothesis_decoding.prepare`, which decodes); here they are only named, checked
and read. Each is `<generator workdir>/hypotheses/<split>.jsonl`: a header line with what it
depends on (checkpoint step, search settings, the sessions' fingerprint), then one JSON list
of texts per query row, the suggestions after that query ([] after a session's last).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import ml_collections
import numpy as np

from mtn_jax import errors
from mtn_jax import files
from mtn_jax.data import preprocess
from mtn_jax.data import sessions
from mtn_jax.data.vocab import Vocab

KEY = 'config.train.hypotheses_from'


@dataclasses.dataclass(frozen=True)
class Generator:
  """A generator trained without the users of fold `held_out` of `folds`."""

  workdir: str
  config: ml_collections.ConfigDict  # its run's config
  folds: int
  held_out: int

  def path(self, split_name: str) -> str:
    """Its suggestions' file for the split `split_name` (or its part of it)."""
    return os.path.join(self.workdir, 'hypotheses', f'{split_name}.jsonl')


def sessions_of(found: list[Generator], split: sessions.SessionSplit
                ) -> list[tuple[Generator, np.ndarray]]:
  """(generator, the sessions of `split` it suggests for): for the training split each
  session goes to the generator that held its user out, for any other split all go to the
  first generator. A generator with no session (fewer users than folds) is left out."""
  if split.name != 'train':
    return [(found[0], np.arange(split.num_sessions))]
  fold_of_session = sessions.session_folds(split, found[0].folds,
                                           found[0].config.data.split_seed)
  out = []
  for generator in found:
    held_out = np.flatnonzero(fold_of_session == generator.held_out)
    if len(held_out):
      out.append((generator, held_out))
  return out


def split_suggestions(found: list[Generator], split: sessions.SessionSplit
                      ) -> list[list[str]]:
  """[num_queries] the suggestions after each query of `split`, read from the generators'
  files (`sessions_of` says whose).

  Raises:
    errors.Error: a file is missing or was made for other sessions (the preparation step,
      which runs before training and evaluation, makes it).
  """
  rows: list[list[str]] = [[] for _ in range(len(split.queries))]
  for generator, chosen in sessions_of(found, split):
    part = split if len(chosen) == split.num_sessions else sessions.select_sessions(
        split, chosen)
    path = generator.path(split.name)
    header, cached = read(path)
    if header is None or header.get('sessions') != fingerprint(part) or len(cached) != len(
        part.queries):
      raise errors.Error(f'{KEY}: {path} does not hold the suggestions for the {split.name} '
                         'sessions of this run: --mode=train and --mode=eval make it before '
                         'they start')
    for row, texts in zip(sessions.session_rows(split, chosen).tolist(), cached):
      rows[row] = texts
  return rows


def generators(hypotheses_from: str, data_dir: str) -> list[Generator]:
  """The generators `hypotheses_from` names (comma-separated workdirs), one per fold.

  Raises:
    errors.Error: a workdir is not a trained run on the corpus of `data_dir`, or the runs
      are not the K folds of one `config.train.user_folds=K` (each held out once).
  """
  found = []
  for workdir in (w.strip() for w in hypotheses_from.split(',')):
    if not workdir:
      continue
    workdir = os.path.abspath(workdir)
    path = os.path.join(workdir, 'config.json')
    if not os.path.exists(path):
      raise errors.Error(f'{KEY}: {workdir} has no config.json (a trained generator\'s '
                         'workdir, --mode=train)')
    try:
      with open(path, encoding='utf-8') as f:
        config = ml_collections.ConfigDict(json.load(f)['config'])
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # JSON's errors are ValueErrors
      raise errors.Error(f'{KEY}: {path} is not the config record --mode=train writes '
                         f'({type(e).__name__}: {e}): restore it from a copy, or train that '
                         'generator again') from None
    difference = preprocess.session_difference(preprocess.data_dir(workdir), data_dir)
    if difference:
      raise errors.Error(f'{KEY}: {workdir} was trained on other sessions than this run '
                         f'({difference}): train it with the same config.data')
    folds = config.train.get('user_folds', 0)
    if not folds:
      raise errors.Error(f'{KEY}: {workdir} was trained on every training session, so its '
                         'suggestions on them are better than on unseen users: train K '
                         'generators with config.train.user_folds=K and held_out_fold=0..K-1')
    found.append(Generator(workdir, config, folds, config.train.held_out_fold))
  if not found:
    raise errors.Error(f'{KEY} names no workdir')
  folds = found[0].folds
  held_out = sorted(g.held_out for g in found)
  seeds = {g.config.data.split_seed for g in found}
  if {g.folds for g in found} != {folds} or held_out != list(range(folds)) or len(seeds) > 1:
    raise errors.Error(
        f'{KEY}: the generators must hold out each fold of one user_folds=K once, with one '
        'data.split_seed; got ' + ', '.join(
            f'{g.workdir} (fold {g.held_out} of {g.folds}, split_seed '
            f'{g.config.data.split_seed})' for g in found))
  return found


def encode(suggestions: list[list[str]], vocab: Vocab, max_words: int) -> np.ndarray:
  """int32 [num_queries, H, max_words] token ids (H: the longest list), padding 0."""
  most = max((len(texts) for texts in suggestions), default=0)
  out = np.zeros((len(suggestions), max(most, 1), max_words), np.int32)
  for row, texts in enumerate(suggestions):
    for j, text in enumerate(texts):
      ids = vocab.encode_text(text)[:max_words]
      out[row, j, :len(ids)] = ids
  return out


def fingerprint(split: sessions.SessionSplit) -> str:
  digest = hashlib.sha256('\n'.join(split.texts).encode('utf-8'))
  digest.update(np.asarray(split.starts, np.int64).tobytes())
  return digest.hexdigest()[:16]


def read(path: str) -> tuple[dict | None, list[list[str]]]:
  """(header, rows) of a suggestions file; (None, []) when it is missing or unreadable."""
  try:
    with open(path, encoding='utf-8') as f:
      header = json.loads(f.readline())
      return header, [json.loads(line) for line in f]
  except (OSError, ValueError):
    return None, []


def write(path: str, header: dict, rows: list[list[str]]) -> None:
  files.write_text(path, json.dumps(header) + '\n'
                   + ''.join(json.dumps(texts, ensure_ascii=False) + '\n' for texts in rows))
