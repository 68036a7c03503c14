"""Generated candidates for a ranker to learn from: cross-fitted generators' suggestions.

Reranking (`mtn_jax.strategies`) orders a generator's beam together with the session's own
queries, so the ranker must know how often a hypothesis is a better suggestion than, say,
the previous query. No negative drawn from the logged queries teaches that: a hypothesis is
built from the session's words and is wrong in its own ways. So the ranker learns from the
generator's suggestions on the training sessions (`config.train.hypotheses_from`, every
ranker, `ranking_tasks`).

A generator's suggestions on its own training sessions are better than on an unseen user's
(it has fitted them), and would teach the ranker to trust hypotheses too much. Hence
cross-fitting: K generators, each trained without one fold of the training users
(`config.train.user_folds=K`, `held_out_fold=k`, `sessions.user_folds`), and every training
session's suggestions come from the generator that never saw its user, just as a
validation or test user's suggestions are made. Those of the other splits come from the
first generator (no generator saw their users).

Each generator decodes with its own run's `config.decode` (the settings `--mode=eval` with
its config uses, and so the candidates reranking sees), whole beam kept. The suggestions are
cached in `<generator workdir>/hypotheses/<split>.jsonl`: a header line with what they
depend on (checkpoint step, search settings, the sessions' fingerprint), then one JSON list
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
from mtn_jax import evaluate
from mtn_jax import inference
from mtn_jax import search
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

  def settings(self) -> search.SearchSettings:
    # The full lists, as evaluation decodes them before any strategy drops a candidate.
    return dataclasses.replace(search.SearchSettings.from_config(self.config.decode),
                               exclude_session_queries=False)

  def suggestions(self, split: sessions.SessionSplit, log=print) -> list[list[str]]:
    """[num_queries of `split`] the suggestions after each query, best first (cached)."""
    path = os.path.join(self.workdir, 'hypotheses', f'{split.name}.jsonl')
    trained = inference.load_trained(self.config, self.workdir, which='best')
    settings = self.settings()
    header = {'checkpoint_step': int(trained.step), 'settings': settings.to_dict(),
              'sessions': fingerprint(split)}
    cached = _read(path, header)
    if cached is not None and len(cached) == len(split.queries):
      return cached
    log(f'Decoding {split.num_sessions:,} {split.name} sessions with {self.workdir} (users '
        f'of fold {self.held_out} of {self.folds} held out of its training) for the '
        'ranker\'s candidates.', flush=True)
    decode = self.config.decode
    by_pair, _ = evaluate.decode_split(
        trained, split, settings,
        queries_per_batch=decode.batch_sessions * self.config.data.max_session_queries,
        log=log)
    rows: list[list[str]] = []
    pair = 0
    for length in split.lengths.tolist():
      rows += by_pair[pair:pair + length - 1] + [[]]
      pair += length - 1
    _write(path, header, rows)
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
    with open(path, encoding='utf-8') as f:
      config = ml_collections.ConfigDict(json.load(f)['config'])
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


def split_suggestions(found: list[Generator], split: sessions.SessionSplit,
                      log=print) -> list[list[str]]:
  """[num_queries] the suggestions after each query of `split`: for the training split,
  each session's by the generator that held its user out, else the first generator's."""
  if split.name != 'train':
    return found[0].suggestions(split, log=log)
  fold_of_session = sessions.session_folds(split, found[0].folds,
                                           found[0].config.data.split_seed)
  rows: list[list[str]] = [[] for _ in range(len(split.queries))]
  for generator in found:
    held_out = np.flatnonzero(fold_of_session == generator.held_out)
    if not len(held_out):  # fewer users than folds
      continue
    part = generator.suggestions(sessions.select_sessions(split, held_out), log=log)
    for row, texts in zip(sessions.session_rows(split, held_out).tolist(), part):
      rows[row] = texts
  return rows


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


def _read(path: str, header: dict) -> list[list[str]] | None:
  """The cached rows of `path` when its header is `header`, else None."""
  try:
    with open(path, encoding='utf-8') as f:
      if json.loads(f.readline()) != header:
        return None
      return [json.loads(line) for line in f]
  except (OSError, ValueError):
    return None


def _write(path: str, header: dict, rows: list[list[str]]) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  temporary = f'{path}.tmp{os.getpid()}'
  with open(temporary, 'w', encoding='utf-8') as f:
    f.write(json.dumps(header) + '\n')
    f.write(''.join(json.dumps(texts, ensure_ascii=False) + '\n' for texts in rows))
  os.replace(temporary, path)
