"""The learned ranker (`config.suggest.strategy='learned'`): gradient-boosted trees with a
ranking objective over the pooled candidates of every source.

Each (context, candidate) is described by `feature_groups`: each source's rank and score; the
generator's length-normalised log-probability of the candidate given the session
(`teacher_forcing`: it scores candidates it did not write); how well formed the candidate is
as a query (the training log's word bigrams, whether the log holds it); its popularity and
co-occurrence with the previous query; its template's frequency; its word overlap with the
previous query and the session; its length and the position in the session. LightGBM's
listwise XE-NDCG objective (`rank_xendcg`) learns the order (a library: boosted trees with a
listwise objective are the standard learning-to-rank model, and its text model files load
without pickle). What a person is shown of the order: `presentation`.

Its training, cross-fitted over folds of the training users (`--mode=train`):
`learned_training`.

The ranker lives beside the checkpoint, `<workdir>/ranker/model.txt` (LightGBM's text
format) and `ranker.json` (what it was trained for: the checkpoint step, the vocabulary's
fingerprint, the sources and their depths, the features, their importances).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Sequence

import ml_collections
import numpy as np

from mtn_jax import errors
from mtn_jax import files
from mtn_jax import inference
from mtn_jax.data.vocab import UNK_ID
from mtn_jax.decoding import search
from mtn_jax.inference import popular
from mtn_jax.inference import presentation
from mtn_jax.inference import sources as sources_lib
from mtn_jax.inference import teacher_forcing
from mtn_jax.inference.inputs import Context
from mtn_jax.training import checkpoints

RANKER_DIR = 'ranker'
# The ranker's two files in RANKER_DIR: LightGBM's model and what it was trained for.
RANKER_MODEL = 'model.txt'
RANKER_META = 'ranker.json'
# How a candidate's features are computed, where the names alone do not say (a ranker or
# cached candidates of another version are made again by --mode=train). 2: the generator's
# figure of a candidate reads only the words typed up to its position (1 read a later query's
# words too, which told evaluation's and training's contexts what followed).
FEATURES_VERSION = 2


# What `config.suggest.sources` may name: the generator and the sources that need no model,
# but the session's own queries.
RANKER_SOURCES = ('generate',) + tuple(n for n in sources_lib.LOG_SOURCES if n != 'session')


def parse_sources(plan: str) -> tuple[tuple[str, int], ...]:
  """'generate:10,popular:20' -> (('generate', 10), ('popular', 20)).

  Raises:
    ValueError: not such a list of sources the learned ranker can read, each once, N >= 1.
  """
  if 'session' in (item.strip().partition(':')[0] for item in plan.split(',')):
    # Its training pools hold none of the session's queries (`lists_and_features`'
    # `drop_session`): the ranker would meet them first when it suggests.
    raise ValueError(f"{plan!r}: 'session' is no source of the learned ranker (it learns from "
                     "candidates without the session's queries, which the user-facing "
                     'protocol never shows)')
  out = sources_lib.parse_plan(plan, RANKER_SOURCES)
  if out[0][0] != 'generate':
    raise ValueError(f'{plan!r}: the generator comes first (it scores every candidate)')
  return out


def plan_text(plan: Sequence[tuple[str, int]]) -> str:
  """`plan` as `config.suggest.sources` writes it: 'generate:10,popular:10'."""
  return ','.join(f'{name}:{k}' for name, k in plan)


def feature_groups(source_names: Sequence[str]) -> dict[str, list[str]]:
  """{group: its features}, in the order of the feature matrix's columns."""
  return {
      'sources': [f'{s}_{what}' for s in source_names for what in ('rank', 'score')]
                 + ['num_sources'],
      'generator': ['generator_log_prob', 'generator_token_log_prob', 'unknown_words'],
      'well_formed': ['logged', 'unseen_bigrams', 'bigram_log_prob', 'min_bigram_count'],
      'popularity': ['popularity', 'cooccurrence', 'previous_followed'],
      'template': ['template_frequency'],
      'overlap': ['shares_previous', 'overlap_previous', 'overlap_session', 'extends_previous'],
      'shape': ['words', 'characters', 'position', 'previous_words'],
  }


def feature_names(source_names: Sequence[str]) -> list[str]:
  return [name for group in feature_groups(source_names).values() for name in group]


def proposers(by_source: dict[str, list[dict]]) -> dict[str, list[str]]:
  """{candidate: the sources proposing it, in the sources' order}."""
  out: dict[str, list[str]] = {}
  for name, candidates in by_source.items():
    for c in candidates:
      if name not in out.setdefault(c['query'], []):
        out[c['query']].append(name)
  return out


# ---------------------------------------------------------------------------------------------
# Features


@dataclasses.dataclass
class Pool:
  """One context position's pooled candidates and their features.

  Attributes:
    texts: [C] the candidates, in the sources' order (first proposal first), each once.
    features: float32 [C, F], columns `feature_names`.
  """

  texts: list[str]
  features: np.ndarray


def pool_texts(by_source: dict[str, list[dict]], so_far: Sequence[str],
               drop_session: bool) -> list[str]:
  """The distinct non-empty candidates of every source in order (none of the session's with
  `drop_session`)."""
  session = set(so_far) if drop_session else set()
  return [q for q in dict.fromkeys(c['query'] for lst in by_source.values() for c in lst)
          if q.strip() and q not in session]


def features(texts: Sequence[str], by_source: dict[str, list[dict]], so_far: Sequence[str],
             position: int, counts: popular.LogCounts, generator: np.ndarray,
             source_names: Sequence[str], vocab) -> np.ndarray:
  """float32 [len(texts), F]: the features (`feature_names(source_names)`) of each candidate
  after the session `so_far` (its last query at `position` of the session).

  Args:
    generator: float32 [len(texts), 2], `teacher_forcing.candidate_log_probs`' figures of the texts.
  """
  nan = float('nan')
  previous = so_far[-1]
  previous_words = set(previous.split())
  session_words = set(' '.join(so_far).split())
  after = counts.after.get(previous, {})
  followed = sum(after.values())
  template_of = {c['query']: c['score'] for c in by_source.get('templates', [])}
  rank_of = {name: {} for name in source_names}
  for name in source_names:
    for rank, c in enumerate(by_source.get(name, []), 1):
      rank_of[name].setdefault(c['query'], (rank, c['score']))
  log_pairs = math.log(counts.pairs + 1)
  rows = []
  for text, (log_prob, token_log_prob) in zip(texts, generator.tolist()):
    words = text.split()
    bigrams = popular.word_bigrams(text)
    seen = [counts.bigrams.get(pair, 0) for pair in bigrams]
    bigram_log_prob = sum(math.log((n + 0.1) / (counts.bigram_starts.get(pair[0], 0) + 1.0))
                          for n, pair in zip(seen, bigrams)) / len(bigrams)
    row = []
    for name in source_names:
      rank, score = rank_of[name].get(text, (nan, nan))
      row += [rank, score]
    row.append(sum(text in rank_of[name] for name in source_names))
    row += [log_prob, token_log_prob,
            float(sum(vocab.id(w) == UNK_ID for w in words)) if vocab.kind == 'word' else 0.0]
    row += [float(bool(counts.issued.get(text))), float(sum(n == 0 for n in seen)),
            bigram_log_prob, math.log1p(min(seen))]
    row += [math.log(counts.issued.get(text, 0) + 1) - log_pairs,
            math.log(after.get(text, 0) + 1) - math.log(followed + 1), math.log1p(followed)]
    row.append(math.log(template_of[text] + 1) - log_pairs if text in template_of else nan)
    shared = previous_words & set(words)
    row += [float(bool(shared)), len(shared) / max(len(previous_words | set(words)), 1),
            len(set(words) & session_words) / max(len(set(words)), 1),
            float(presentation.added_to(text, previous))]
    row += [len(words), len(text), position, len(previous.split())]
    rows.append(row)
  return np.asarray(rows, np.float32).reshape(len(texts), len(feature_names(source_names)))


# ---------------------------------------------------------------------------------------------
# The ranker


@dataclasses.dataclass
class LearnedRanker:
  """A trained ranker and what it was trained for (`ranker.json`)."""

  booster: object  # lightgbm.Booster
  meta: dict

  @property
  def sources(self) -> tuple[tuple[str, int], ...]:
    return tuple((name, int(k)) for name, k in self.meta['sources'])

  @property
  def source_names(self) -> list[str]:
    return [name for name, _ in self.sources]

  def candidate_search(self, default: search.SearchSettings) -> search.SearchSettings:
    """The search its candidates were made with (ranker.json's `search`: the generator's
    features depend on it), `default` for a record that holds none (written before it was
    kept) and for a field it lacks."""
    made = generator_settings(self.sources, default)
    recorded = search_as_written_now(self.meta.get('search'))
    if not isinstance(recorded, dict):
      return made
    fields = {f.name for f in dataclasses.fields(search.SearchSettings)}
    return dataclasses.replace(made, **{k: v for k, v in recorded.items() if k in fields})

  def scores(self, matrix: np.ndarray) -> np.ndarray:
    """float [rows]: the ranker's score of each feature row (higher first)."""
    if not len(matrix):
      return np.zeros(0)
    return self.booster.predict(matrix, num_threads=1)

  @staticmethod
  def read_meta(workdir: str) -> dict | None:
    """`<workdir>/ranker/ranker.json`, or None where there is none; a file that is not a
    JSON record is refused in one line naming it."""
    path = os.path.join(ranker_dir(workdir), RANKER_META)
    if not os.path.exists(path):
      return None
    try:
      with open(path, encoding='utf-8') as f:
        meta = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
      raise DamagedRanker(f'{path}: not a readable ranker record ({e}): run --mode=train '
                          'again to refit the ranker') from None
    if not isinstance(meta, dict):
      raise DamagedRanker(f'{path}: not a ranker record (a JSON object): run --mode=train '
                          'again to refit the ranker')
    return meta

  @staticmethod
  def model_problem(workdir: str, meta: dict) -> str | None:
    """Why `<workdir>/ranker/model.txt` is not the model `meta` was written with (missing,
    or another file: `meta['model_sha256']`), or None. LightGBM aborts the process on some
    damaged model files instead of raising, so the file is checked before it reads it."""
    path = os.path.join(ranker_dir(workdir), RANKER_MODEL)
    if not os.path.exists(path):
      return f'{path}: missing'
    if 'model_sha256' in meta and file_sha256(path) != meta['model_sha256']:
      return (f'{path}: not the model {RANKER_META} was written with (its SHA-256 differs: '
              'damaged or replaced)')
    return None

  @classmethod
  def is_current(cls, workdir: str, trained: inference.Trained,
                 config: ml_collections.ConfigDict) -> bool:
    """Whether `workdir`'s ranker was trained for its best checkpoint and its fold
    generators' with `config`'s sources, folds, rounds and candidates' search, on the
    features this code computes, and its files are whole (a damaged one is refitted)."""
    try:
      meta = cls.read_meta(workdir)
    except DamagedRanker:
      return False
    plan = parse_sources(config.suggest.sources)
    searched = search_key(config)
    steps = fold_steps(config, workdir)
    return bool(meta) and (
        meta.get('checkpoint_step') == int(trained.step)
        and meta.get('vocab_fingerprint') == trained.vocab.fingerprint
        and [tuple(x) for x in meta.get('sources', [])] == list(plan)
        and meta.get('folds') == config.suggest.ranker_folds
        and meta.get('rounds') == config.suggest.ranker_rounds
        and meta.get('features') == feature_names([name for name, _ in plan])
        and meta.get('features_version', 1) == FEATURES_VERSION
        # (a record written before the search or the fold generators' steps were kept:
        # taken as made with these)
        and search_as_written_now(meta.get('search', searched)) == searched
        and meta.get('fold_steps', steps) == steps
        and meta.get('past_queries') == past_key(config).get('past_queries')
        and cls.model_problem(workdir, meta) is None)

  @classmethod
  def load(cls, workdir: str, trained: inference.Trained) -> LearnedRanker | None:
    """`workdir`'s ranker (None where it has none), refused in one line when it was trained
    for another checkpoint or vocabulary, or when its files are damaged."""
    folder = ranker_dir(workdir)
    meta_path = os.path.join(folder, RANKER_META)
    meta = cls.read_meta(workdir)
    if meta is None:
      return None
    import lightgbm  # pylint: disable=import-outside-toplevel
    if (meta.get('checkpoint_step') != int(trained.step)
        or meta.get('vocab_fingerprint') != trained.vocab.fingerprint):
      raise errors.Error(
          f'{meta_path}: the ranker was trained for checkpoint step '
          f'{meta.get("checkpoint_step")} and vocabulary {meta.get("vocab_fingerprint")}, '
          f'not for this workdir\'s best checkpoint (step {trained.step}, vocabulary '
          f'{trained.vocab.fingerprint}): run --mode=train again to retrain it')
    try:  # sources this code no longer learns from (the session's queries)
      parse_sources(plan_text(meta.get('sources', [])))
    except (ValueError, TypeError) as e:
      raise errors.Error(f'{meta_path}: the ranker was trained with sources this code does '
                         f'not rank ({e}): run --mode=train again to refit it') from None
    computed = feature_names([name for name, _ in meta.get('sources', [])])
    if meta.get('features') != computed:
      raise errors.Error(
          f'{meta_path}: the ranker was trained on other features than this code computes '
          f'({_feature_difference(meta.get("features"), computed)}): run --mode=train again '
          'to refit it')
    problem = cls.model_problem(workdir, meta)
    if problem:
      raise DamagedRanker(f'{problem}: run --mode=train again to refit the ranker')
    try:
      booster = lightgbm.Booster(model_file=os.path.join(folder, RANKER_MODEL))
    except lightgbm.basic.LightGBMError as e:  # a ranker written before the checksum
      raise DamagedRanker(f'{os.path.join(folder, RANKER_MODEL)}: not a LightGBM model '
                          f'({str(e).strip()}): run --mode=train again to refit the ranker'
                          ) from None
    return cls(booster, meta)


class DamagedRanker(errors.Error):
  """A ranker's files that cannot be read as the ranker they say they are."""


def _feature_difference(recorded, computed: Sequence[str]) -> str:
  """What tells a record's feature list from `computed`, in words."""
  if not isinstance(recorded, list):
    return 'its record lists none'
  missing = [n for n in computed if n not in recorded]
  extra = [n for n in recorded if n not in computed]
  if missing or extra:
    return '; '.join(part for part in (
        missing and 'not trained on ' + ', '.join(missing),
        extra and 'trained on ' + ', '.join(extra) + ', no longer computed') if part)
  return 'the same features in another order'


def fold_steps(config: ml_collections.ConfigDict, workdir: str) -> list[int | None]:
  """Each fold generator's best checkpoint step (None: none yet), read from its checkpoints'
  meta files alone."""
  return [checkpoints.named_best_step(fold_workdir(workdir, k))
          for k in range(config.suggest.ranker_folds)]


def file_sha256(path: str) -> str:
  with open(path, 'rb') as f:
    return hashlib.file_digest(f, 'sha256').hexdigest()


def lists_and_features(trained: inference.Trained, contexts: Sequence[Context],
                       candidate_sources: Sequence[sources_lib.Source],
                       counts: popular.LogCounts, *, positions: str, batch_rows: int,
                       history_queries: int = 0,
                       widths: Sequence[int] | None = None, drop_session: bool = False,
                       keep=None):
  """The sources' lists and every position's `Pool` for `contexts`.

  `keep(context index, position, candidate texts) -> bool`, where given, says which pools are
  scored and described; the others are left empty (learning needs only the pools that hold
  the logged next query: no order of the others finds it).

  Returns:
    (by_source {name: [context][position] lists}, pools [context][position] Pool).
  """
  names = [s.name for s in candidate_sources]
  by_source = sources_lib.propose_all(candidate_sources, contexts, positions=positions,
                                      batch_rows=batch_rows, widths=widths)
  so_far = sources_lib.sessions_so_far(contexts, positions)
  firsts = sources_lib.first_outputs(contexts, positions)
  texts = [[pool_texts({n: by_source[n][i][p] for n in names}, so_far[i][p], drop_session)
            for p in range(len(so_far[i]))] for i in range(len(contexts))]
  if keep is not None:
    texts = [[at if keep(i, p, at) else [] for p, at in enumerate(lists)]
             for i, lists in enumerate(texts)]
  generator = [s for s in candidate_sources if isinstance(s, sources_lib.Generate)]
  known = (teacher_forcing.beam_log_probs(trained, generator[0], contexts,
                                          by_source[generator[0].name])
           if generator else None)
  scored = teacher_forcing.candidate_log_probs(
      trained, contexts, texts, positions=positions, batch_rows=batch_rows,
      history_queries=history_queries, widths=widths, known=known)
  pools = [[Pool(texts[i][p], features(texts[i][p], {n: by_source[n][i][p] for n in names},
                                       so_far[i][p], firsts[i] + p + contexts[i].first_position,
                                       counts, scored[i][p], names, trained.vocab))
            for p in range(len(so_far[i]))] for i in range(len(contexts))]
  return by_source, pools


# ---------------------------------------------------------------------------------------------
# Where a ranker lives, and what it was trained for (its training: `learned_training`)

def ranker_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), RANKER_DIR)


def fold_workdir(workdir: str, fold: int) -> str:
  """Where the generator trained without the users of `fold` lives."""
  return os.path.join(os.path.abspath(workdir), 'folds', f'fold{fold}')


def build_sources(plan: Sequence[tuple[str, int]], trained: inference.Trained,
                  counts: popular.LogCounts, settings: search.SearchSettings,
                  history_queries: int = 0) -> list[sources_lib.Source]:
  """The learned ranker's sources: the generator's whole beam (`settings.beam_size` is the
  plan's depth) and the training log's."""
  out: list[sources_lib.Source] = []
  for name, k in plan:
    if name == 'generate':
      out.append(sources_lib.Generate(trained, generator_settings(plan, settings),
                                      history_queries))
    else:
      out.append(sources_lib.LOG_SOURCES[name](counts, k))
  return out


def generator_settings(plan: Sequence[tuple[str, int]],
                       settings: search.SearchSettings) -> search.SearchSettings:
  """The search of the plan's `generate` source: its whole beam of the plan's depth, the
  session's queries kept (what is shown is chosen after ranking)."""
  k = dict(plan).get('generate', settings.beam_size)
  return dataclasses.replace(settings, beam_size=k).whole_beam()


def search_key(config: ml_collections.ConfigDict) -> dict:
  """The decoding settings the candidates are made with (those `build_sources` passes on:
  `config.decode`'s beam size and top k are the plan's, so not these)."""
  settings = generator_settings(parse_sources(config.suggest.sources),
                                search.SearchSettings.from_config(config.decode))
  return json.loads(json.dumps(settings.to_dict()))  # as ranker.json reads it back


def search_as_written_now(search):
  """A record's search (`search_key`) as `search_key` writes it now: records written before
  the generator source's search kept the session's queries explicitly (2026-11-28) hold the
  protocol unset, which searched alike."""
  if not isinstance(search, dict):
    return search
  return {**search, 'exclude_session_queries': bool(search.get('exclude_session_queries'))}


def past_key(config: ml_collections.ConfigDict) -> dict:
  """How much of a user's past the ranker's training contexts read, where its sources read
  any (the key of no other plan changes with it)."""
  plan = parse_sources(config.suggest.sources)
  return ({'past_queries': int(config.suggest.past_queries)}
          if sources_lib.reads_past(dict(plan)) else {})
