"""The one suggestion pipeline: a trained model turned into suggestions, for every mode.

`Pipeline.load(config, workdir)` builds it once from `Settings` (config.suggest and
config.decode, read in one place), the protocol as its caller set it (each mode's default:
`suggest.with_protocol`; from Python, `mtn_jax.api` sets the service's). It never trains or
fits anything. Three stages:

1. Candidate sources, for each context and position (`mtn_jax.inference.sources`, one
   protocol): the workdir's generative beam (every hypothesis, in the generator's own order:
   beam score, or MBR with `config.decode.mbr`), the training log's lists (popular,
   co-occurring, reformulation templates, matching queries), the user's past (`history`,
   `history_about`), a ranker's best pool entries (`mtn_jax.inference.retrieval`), IMDNA's
   proposals (the queries that follow in the most similar training sessions,
   `imdna_proposer`) and the session's own queries.
2. An order, by `config.suggest.strategy`:
   - 'generate': the workdir's own model as it is (a generative model's beam, or a ranker's
     retrieved pool entries);
   - 'retrieve': the pool entries a trained Bi- or Poly-encoder (`config.suggest.ranker_workdir`)
     retrieves: real logged queries, never an unknown word;
   - 'rerank': the sources pooled and deduplicated by text, scored by the ranker
     (`ScoresCandidates`: a Bi-, Poly- or Cross-encoder) and sorted, best first; then the
     rules in turn: MBR under the ranker's softmax (`config.decode.mbr` 'ranker'), a user's
     habit query first (`config.suggest.habit_rate`, `habits`);
   - 'blend': the generator's beam and the training log's lists (`popular`: the most popular
     next queries; `cooccurring`: those that followed the previous query) by quotas,
     `config.suggest.blend` (`blended`);
   - 'learned': the sources of `config.suggest.sources` as the workdir's ranker was trained
     on them (`mtn_jax.inference.sources`: the beam and the log's sources, pooled) ordered by
     that ranker (`learned`), then what is shown first (`presentation`).
3. What is shown (`show`): with the user-facing protocol (`exclude_session_queries`) the
   queries the session holds and any empty one are dropped, then the first `top_k` are
   kept.

`suggest` runs the three stages on `Context`s (decode, suggest, a service); `split_lists`
runs stages 1-2 on a whole split's sessions as contexts (evaluation, which then shows both
protocols with `show`), the generator's beam through the same source, a session length at a
time over all of this process's devices: the same candidates, the same order and the same
`show`, so evaluation scores exactly the lists decode and suggest write.

The rankers must read the workdir's vocabulary (the same corpus, preprocessed alike): a
candidate is given to the ranker as token ids, and ids of another vocabulary would be other
words. `load` refuses a mismatch with a one-line error naming both workdirs. IMDNA hands over
texts, so its vocabulary may differ; its sessions may not (its documents are its training
sessions, which must not hold the sessions being scored).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from mtn_jax import errors
from mtn_jax import inference
from mtn_jax import tasks
from mtn_jax.data import preprocess
from mtn_jax.data import sessions
from mtn_jax.data.vocab import Vocab
from mtn_jax.decoding import mbr
from mtn_jax.decoding import search
from mtn_jax.inference import habits
from mtn_jax.inference import imdna_proposer
from mtn_jax.inference import learned
from mtn_jax.inference import popular
from mtn_jax.inference import presentation
from mtn_jax.inference import retrieval
from mtn_jax.inference import sources as inference_sources
from mtn_jax.inference.inputs import Context
from mtn_jax.training import checkpoints

CANDIDATE_BUCKET = 8  # candidate lists are padded to a multiple of this (fewer compilations)
# Sessions whose candidate lists are scored at a time in reranking: a Cross-encoder encodes
# sessions x positions x candidates joint sequences at once.
RERANK_SESSIONS = 16
STRATEGIES = ('generate', 'retrieve', 'rerank', 'blend', 'learned')
# The sources a blend draws from (config.suggest.blend).
BLEND_SOURCES = ('generate', 'popular', 'cooccurring')
# The candidate sources of 'rerank', in the order they are pooled (on a tie of the ranker's
# scores the earlier stands), each named as evaluation scores it.
SOURCES = ('generate', 'retrieve', 'imdna', 'popular', 'cooccurring')


@dataclasses.dataclass(frozen=True)
class Settings:
  """`config.suggest` and `config.decode`, read once (configs/default.py says what each is)."""

  strategy: str
  search: search.SearchSettings
  ranker_workdir: str
  retriever_workdir: str
  retrieved: int
  imdna_workdir: str
  imdna_proposed: int
  popular: int
  cooccurring: int
  mbr: bool
  habit_rate: float
  habit_min_past: int
  index: str
  batch_sessions: int
  history_queries: int
  past_queries: int = 0
  blend: tuple[tuple[str, int], ...] = ()
  session_first: int = 0
  unrelated_first: int = 0
  attested_only: bool = False

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> Settings:
    s = config.suggest
    return cls(strategy=s.strategy, search=search.SearchSettings.from_config(config.decode),
               ranker_workdir=s.ranker_workdir, retriever_workdir=s.retriever_workdir,
               retrieved=s.retrieved, imdna_workdir=s.imdna_workdir,
               imdna_proposed=s.imdna_proposed, popular=s.popular,
               cooccurring=s.cooccurring, mbr=mbr.from_decode(config.decode)[1],
               habit_rate=float(s.habit_rate), habit_min_past=int(s.habit_min_past),
               index=s.index, batch_sessions=config.decode.batch_sessions,
               history_queries=config.data.history_queries,
               past_queries=int(config.suggest.past_queries),
               blend=parse_blend(s.blend) if s.strategy in ('blend', 'learned') else (),
               session_first=int(s.session_first), unrelated_first=int(s.unrelated_first),
               attested_only=bool(s.attested_only))

  @property
  def top_k(self) -> int:
    return self.search.top_k

  @property
  def exclude_session_queries(self) -> bool:
    return self.search.exclude_session_queries

  @property
  def whole_beam(self) -> search.SearchSettings:
    """The generator's candidates, which `show` (or reranking) cuts."""
    return self.search.whole_beam()


def parse_blend(plan: str) -> tuple[tuple[str, int], ...]:
  """'popular:2,generate:7,cooccurring:10' -> (('popular', 2), ('generate', 7), ...).

  Raises:
    ValueError: not such a list of BLEND_SOURCES, each once, with positive counts.
  """
  return inference_sources.parse_plan(plan, BLEND_SOURCES)


def beam_place(plan: Sequence[tuple[str, int]]) -> int | None:
  """The places a blend's quotas give the log's lists before the beam's first candidate
  (fewer where a list is shorter than its quota); None: the plan holds no beam."""
  names = [name for name, _ in plan]
  if 'generate' not in names:
    return None
  return sum(quota for _, quota in plan[:names.index('generate')])


def blended(sources: dict[str, Sequence[str]], plan: Sequence[tuple[str, int]],
            session_so_far: Sequence[str]) -> list[dict]:
  """The candidates of `sources` by quotas: the first n of each source of `plan` in turn
  (one another source gave already stays where it first came), then the rest of each in the
  same order, each text once. A query of the session counts towards no quota (what the
  user-facing protocol shows is the quotas' exactly) but keeps its place for the paper's
  protocol. 'score' is 1 / rank in the blend."""
  seen, order = set(session_so_far), {}
  for with_quota in (True, False):
    for name, quota in plan:
      fresh = 0
      for query in sources[name]:
        if with_quota and fresh == quota:
          break
        order.setdefault(query, name)
        fresh += search.shown_to_user(query, seen)
  return [{'query': q, 'score': 1 / rank, 'source': name}
          for rank, (q, name) in enumerate(order.items(), 1)]


# The labels of the blend's lists that are not `sources.LABELS`' lists (`blend_sources`): its
# co-occurring queries are the previous query's followers alone, popular ones being a quota of
# their own.
BLEND_LABELS = {'cooccurring': 'Co-occurring next queries alone (a source)'}


def blend_sources(beam: Sequence[str], context: Sequence[str], counts: popular.LogCounts,
                  top_k: int) -> dict[str, list[str]]:
  """The sources of 'blend' after `context`: the beam, and the training log's lists
  (`counts`) deep enough to fill `top_k` once the session's queries are dropped."""
  depth = top_k + len(context)
  return {'generate': list(beam), 'popular': counts.most_popular(depth),
          'cooccurring': counts.followers(context[-1], depth)}


def show(ranked: Sequence[dict], session_so_far: Sequence[str], exclude_session_queries: bool,
         top_k: int, scored_by_place: bool = False) -> list[dict]:
  """What is shown of an ordered list after the queries `session_so_far`: with the
  user-facing protocol, none the session holds and none empty (`search.shown_to_user`);
  then the first `top_k`. A list `scored_by_place` (its 'score' 1 / place: the blend's, the learned
  ranker's) is scored by the places shown, so that the dropped queries of the session leave
  no gaps."""
  if exclude_session_queries:
    seen = set(session_so_far)
    ranked = [c for c in ranked if search.shown_to_user(c['query'], seen)]
  shown = list(ranked[:top_k])
  if scored_by_place:
    shown = [{**c, 'score': 1 / place} for place, c in enumerate(shown, 1)]
  return shown


@functools.partial(jax.jit, static_argnames=('task',))
def _score(params, queries: jax.Array, candidates: jax.Array, *, task) -> jax.Array:
  return task.score_candidates(params, {'queries': queries}, candidates)


def _check_vocab(ranker: inference.Trained, vocab: Vocab, key: str, where: str,
                 workdir: str) -> None:
  if ranker.vocab.fingerprint != vocab.fingerprint or ranker.vocab.kind != vocab.kind:
    # The settings that made the two corpora differ, where their records say.
    settings = preprocess.corpus_differences(where, workdir)
    raise errors.Error(
        f'config.suggest.{key}={where}: its vocabulary ({len(ranker.vocab):,} '
        f'{ranker.vocab.kind} tokens, fingerprint {ranker.vocab.fingerprint}) is not the one of '
        f'{workdir} ({len(vocab):,} {vocab.kind} tokens, fingerprint {vocab.fingerprint})'
        + (f', their corpora built with other settings ({", ".join(settings)})'
           if settings else '')
        + ': train the ranker on the same corpus, preprocessed with the same config.data')


@dataclasses.dataclass
class Rankers:
  """The ranker of 'rerank' and the rules applied after its scores.

  Attributes:
    ranker: scores candidates given by their words.
    mbr: order the pooled candidates by their expected BLEU under the ranker's distribution
      (`mtn_jax.decoding.mbr`, p = softmax of the ranker's scores, as in its training loss)
      instead of by score.
    habit_rate, habit_min_past: the user's habit query goes first where their habit rate is
      at least `habit_rate` over at least `habit_min_past` past queries (`habits`); 0: never.
  """

  ranker: inference.Trained
  mbr: bool = False
  habit_rate: float = 0.0
  habit_min_past: int = 0

  def score_lists(self, sessions_queries: Sequence[Sequence[str]],
                  candidate_lists: Sequence[Sequence[Sequence[str]]], *,
                  batch_rows: int) -> list[list[np.ndarray]]:
    """The ranker's score of every candidate after every position.

    Args:
      sessions_queries: [R] each session's query texts, its positions 0..len-1.
      candidate_lists: [R][t] the candidate texts after position t, for t < len(session).
      batch_rows: sessions scored at a time.
    Returns:
      [R][t] float32 [len(candidate_lists[r][t])] scores.
    """
    trained = self.ranker
    vocab, n = trained.vocab, trained.cfg.max_query_words
    encode = lambda text: vocab.encode_text(text)[:n]
    out = []
    for start in range(0, len(sessions_queries), batch_rows):
      group = range(start, min(start + batch_rows, len(sessions_queries)))
      # One padding query after each session: the score after its last query is a position.
      width = max(len(sessions_queries[r]) for r in group) + 1
      most = max(len(c) for r in group for c in candidate_lists[r])
      k = -(-max(most, 1) // CANDIDATE_BUCKET) * CANDIDATE_BUCKET
      queries = np.zeros((batch_rows, width, n), np.int32)
      cands = np.zeros((batch_rows, width - 1, k, n), np.int32)
      for row, r in enumerate(group):
        for t, text in enumerate(sessions_queries[r]):
          ids = encode(text)
          queries[row, t, :len(ids)] = ids
        for t, texts in enumerate(candidate_lists[r]):
          for j, text in enumerate(texts):
            ids = encode(text)
            cands[row, t, j, :len(ids)] = ids
      scores = np.asarray(_score(trained.params, jnp.asarray(queries), jnp.asarray(cands),
                                 task=trained.task))
      for row, r in enumerate(group):
        out.append([scores[row, t, :len(texts)] for t, texts in enumerate(candidate_lists[r])])
    return out

  def order(self, sessions_queries: Sequence[Sequence[str]],
            sources: Sequence[Sequence[Sequence[Sequence[str]]]], *, batch_rows: int,
            histories: Sequence[Sequence[str]] | None = None) -> list[list[list[dict]]]:
    """[R][t] every pooled candidate ({'query', 'score'}), best first.

    Args:
      sessions_queries: [R] each session's query texts.
      sources: each source's candidates [R][t] after position t (the generator's first: on
        a tie its order stands); the session's queries up to t are added last, then the
        user's habit query where it goes first. Every pooled candidate is scored, the
        session's queries too: a candidate's score depends on the session and on it alone,
        so what `show` drops changes no other score.
      histories: [R] each session's user's earlier queries, oldest first (`habit_rate`).
    """
    if self.habit_rate and histories is None:
      raise ValueError('config.suggest.habit_rate needs each session\'s user\'s history')
    pooled, habit_firsts = [], []
    users = habits.carried(histories) if self.habit_rate else None
    for r, queries in enumerate(sessions_queries):
      user = next(users) if users is not None else None
      firsts = [None if user is None else
                user.first(queries[:t + 1], self.habit_rate, self.habit_min_past)
                for t in range(len(queries))]
      lists = []
      for t in range(len(queries)):
        candidates = [*(source[r][t] for source in sources), list(queries[:t + 1]),
                      [firsts[t]] if firsts[t] else []]
        lists.append([q for q in dict.fromkeys(q for source in candidates for q in source)
                      if q.strip()])
      pooled.append(lists)
      habit_firsts.append(firsts)
    scores = self.score_lists(sessions_queries, pooled, batch_rows=batch_rows)
    return [[self._order(texts, values, habit_firsts[r][t])
             for t, (texts, values) in enumerate(zip(lists, session_scores))]
            for r, (lists, session_scores) in enumerate(zip(pooled, scores))]

  def _order(self, texts: Sequence[str], values: np.ndarray,
             habit_first: str | None) -> list[dict]:
    """The candidates `texts` scored `values` [len(texts)], best first (MBR's evidence is
    every candidate, as the generator's own MBR has it); `habit_first` (never a query of the
    session) before the rest."""
    # A stable sort: on a tie the generator's order stands.
    order = np.argsort(-values, kind='stable')
    ranked = [{'query': texts[i], 'score': float(values[i])} for i in order]
    if self.mbr:
      ranked = mbr.rerank(ranked)
    if habit_first is not None:
      first = next(i for i, c in enumerate(ranked) if c['query'] == habit_first)
      ranked = [ranked[first], *ranked[:first], *ranked[first + 1:]]
    return ranked


@dataclasses.dataclass
class SplitLists:
  """Every pair of a split through stages 1-2, in pair order (`evaluation` shows both
  protocols of `ordered` with `show`).

  Attributes:
    ordered: [pairs] the strategy's whole ordered list ({'query', 'score', ...}).
    sources: {source: [pairs] its candidates' texts in its own order} for every strategy
      but 'generate' (scored beside the strategy).
  """

  ordered: list[list[dict]]
  sources: dict[str, list[list[str]]]


class Pipeline:
  """The suggestion pipeline of one workdir (see the module docstring).

  Attributes:
    settings: what it was built with.
    trained: the workdir's model.
    suggester: the model whose candidates the strategy shows first ('retrieve': the
      ranker; else the workdir's).
    retriever: the pool entries of a ranker: the suggestions themselves ('generate' of a
      ranker, 'retrieve'), or a source of 'rerank' (None where there is none).
    rankers: the ranker and rules of 'rerank' (None for the other strategies).
    proposer: IMDNA's next queries, a source of 'rerank' (None unless configured).
    learned_ranker: the LightGBM ranker of 'learned' (None for the other strategies, and
      where the workdir has none: 'blend' then).
    log_counts: the training log's counts behind the log's sources ('blend', 'learned',
      and 'rerank' with `popular` or `cooccurring`; else None).
  """

  def __init__(self, settings: Settings, trained: inference.Trained,
               suggester: inference.Trained, retriever: retrieval.Retriever | None,
               rankers: Rankers | None, proposer: imdna_proposer.NextQueryProposer | None,
               workdir: str, learned_ranker: learned.LearnedRanker | None = None):
    self.settings, self.trained, self.suggester = settings, trained, suggester
    self.retriever, self.rankers, self.proposer = retriever, rankers, proposer
    self.learned_ranker = learned_ranker
    self.workdir = os.path.abspath(workdir)
    needs_counts = (settings.strategy in ('blend', 'learned')
                    or (rankers is not None and bool(settings.popular or settings.cooccurring)))
    self.log_counts = popular.LogCounts.of_workdir(workdir) if needs_counts else None
    self.sources = (learned.build_sources(learned_ranker.sources, trained, self.log_counts,
                                          learned_ranker.candidate_search(settings.search),
                                          settings.history_queries)
                    if learned_ranker is not None else [])

  @classmethod
  def load(cls, config: ml_collections.ConfigDict, workdir: str, log=print,
           trained: inference.Trained | None = None) -> Pipeline:
    """The pipeline `config` describes over the best checkpoint of `workdir` (or `trained`,
    already loaded from it)."""
    settings = Settings.from_config(config)
    trained = trained or inference.load_trained(config, workdir)
    if (settings.strategy in ('generate', 'learned', 'blend')
        and not isinstance(trained.task, (tasks.Suggests, tasks.ScoresPool))):
      raise errors.Error(_no_suggestions_of_its_own(trained, workdir))
    if settings.strategy == 'learned':
      if not isinstance(trained.task, tasks.Suggests):
        raise errors.Error('config.suggest.strategy=\'learned\' ranks a generative model\'s '
                           f'candidates: {workdir} holds a {trained.cfg.name!r} ranker')
      ranker = learned.LearnedRanker.load(workdir, trained)
      if ranker is not None:
        differs = []
        if learned.parse_sources(config.suggest.sources) != ranker.sources:
          differs.append(f'sources {learned.plan_text(ranker.sources)!r}, not the config\'s '
                         f'{config.suggest.sources!r}')
        if config.suggest.ranker_rounds != ranker.meta.get('rounds'):
          differs.append(f'{ranker.meta.get("rounds")} rounds, not the config\'s '
                         f'{config.suggest.ranker_rounds}')
        # The generator's features of a candidate depend on the search that made the beam.
        own = ranker.candidate_search(settings.search).to_dict()
        asked = learned.generator_settings(ranker.sources, settings.search).to_dict()
        differs += [f'config.decode.{k}={own[k]!r}, not the config\'s {asked[k]!r}'
                    for k in own if own[k] != asked[k]]
        if differs:
          log(f'Note: the learned ranker in {learned.ranker_dir(workdir)} was trained with '
              f'{" and ".join(differs)}: its own are used (--mode=train refits it to the '
              'config).')
        depth = dict(ranker.sources).get('generate')
        if depth is not None and depth != settings.search.beam_size:
          log(f'Note: the learned strategy\'s generator searches a beam of {depth} (the '
              f'ranker\'s source generate:{depth}), not config.decode.beam_size='
              f'{settings.search.beam_size}: a plan\'s generate:N sets the depth.')
        return cls(settings, trained, trained, None, None, None, workdir, ranker)
      log(f'Note: {workdir} has no learned ranker ({learned.RANKER_DIR}/ranker.json, made by '
          f'--mode=train): suggesting by the blend {config.suggest.blend!r} instead.')
      settings = dataclasses.replace(settings, strategy='blend')
    if settings.strategy == 'blend':
      if not isinstance(trained.task, tasks.Suggests):
        raise errors.Error('config.suggest.strategy=\'blend\' blends a generative model\'s '
                           f'beam: {workdir} holds a {trained.cfg.name!r} ranker')
      before = beam_place(settings.blend)
      if before is None or before >= settings.top_k:
        log(f'Note: config.suggest.blend={config.suggest.blend!r} leaves the beam no place '
            f'of the {settings.top_k} shown (config.decode.top_k) where the training log\'s '
            'lists fill their quotas.')
      return cls(settings, trained, trained, None, None, None, workdir)
    if settings.strategy == 'generate':
      retriever = (retrieval.Retriever(trained, workdir, log=log, index=settings.index)
                   if isinstance(trained.task, tasks.ScoresPool) else None)
      return cls(settings, trained, trained, retriever, None, None, workdir)
    ranker = _load(config, settings.ranker_workdir, 'ranker_workdir')
    if not isinstance(ranker.task, tasks.ScoresCandidates):
      raise errors.Error(f'config.suggest.ranker_workdir={settings.ranker_workdir} holds a '
                         f'{ranker.cfg.name!r} model, which cannot score given candidates: '
                         'name a Bi-, Poly- or Cross-encoder run')
    _check_vocab(ranker, trained.vocab, 'ranker_workdir', settings.ranker_workdir, workdir)
    retriever_workdir = settings.retriever_workdir or settings.ranker_workdir
    retriever = None
    if settings.strategy == 'rerank' and settings.retrieved == 0:
      log('Note: config.suggest.retrieved=0: no pool entries join the candidates.')
    else:
      retriever_trained = (ranker if not settings.retriever_workdir
                           else _load(config, settings.retriever_workdir, 'retriever_workdir'))
      if isinstance(retriever_trained.task, tasks.ScoresPool):
        _check_vocab(retriever_trained, trained.vocab, 'retriever_workdir', retriever_workdir,
                     workdir)
        retriever = retrieval.Retriever(retriever_trained, retriever_workdir, log=log,
                                        index=settings.index)
      elif settings.strategy == 'retrieve' or settings.retriever_workdir:
        raise errors.Error(f'config.suggest: {retriever_workdir} holds a '
                           f'{retriever_trained.cfg.name!r} model, which cannot retrieve '
                           'from the pool: name a Bi- or Poly-encoder run')
      else:
        log(f'Note: {settings.ranker_workdir} cannot retrieve from the pool (a '
            'Cross-encoder): the candidates are the beam and the session\'s queries (name a '
            'Bi- or Poly-encoder in config.suggest.retriever_workdir to add pool entries).')
    if settings.strategy == 'retrieve':
      return cls(settings, trained, retriever.trained, retriever, None, None, workdir)
    if not isinstance(trained.task, tasks.Suggests):
      raise errors.Error('config.suggest.strategy=\'rerank\' reranks a generative model\'s '
                         f'beam: {workdir} holds a {trained.cfg.name!r} ranker')
    proposer = (_load_proposer(config, settings.imdna_workdir, workdir)
                if settings.imdna_workdir else None)
    rankers = Rankers(ranker, settings.mbr, settings.habit_rate, settings.habit_min_past)
    return cls(settings, trained, trained, retriever, rankers, proposer, workdir)

  # -------------------------------------------------------------------------------------------
  # What it is

  @functools.cached_property
  def past_read(self) -> int:
    """How many of a user's latest earlier queries the pipeline reads (0: none): a model's
    `history_queries`, and `past_queries` for the habit rule or the learned ranker's sources
    of the past. Every context's history is cut to them (`latest_past`), so a caller may
    give more."""
    s = self.settings
    reads_past = ((self.rankers is not None and bool(self.rankers.habit_rate))
                  or (self.learned_ranker is not None
                      and inference_sources.reads_past(self.learned_ranker.source_names)))
    return max(s.history_queries, s.past_queries if reads_past else 0)

  def latest_past(self, history: Sequence[str]) -> tuple[str, ...]:
    """The part of a user's earlier queries (oldest first) that the pipeline reads."""
    return tuple(history[max(0, len(history) - self.past_read):]) if self.past_read else ()

  @property
  def beam_size(self) -> int:
    """The beam the generator searches with: the learned ranker's generate source's depth in
    its plan, else config.decode's."""
    search_settings = self.settings.search
    if self.learned_ranker is not None:
      search_settings = learned.generator_settings(self.learned_ranker.sources, search_settings)
    return search_settings.beam_size

  def how(self) -> str:
    s = self.settings
    if self.learned_ranker is not None:
      return f'{", ".join(n for n, _ in self.learned_ranker.sources)}, by the learned ranker'
    if s.strategy == 'blend':
      return f'beam {s.search.beam_size} blended with the training log\'s lists'
    if self.rankers is not None:
      return f'beam {s.search.beam_size}, reranked'
    if self.retriever is not None:
      return 'from the candidate pool'
    return f'beam {s.search.beam_size}'

  def score_kind(self) -> str:
    """What a suggestion's 'score' is, in words (the lists' order)."""
    if self.learned_ranker is not None:
      return '1 / place in the presented list (the learned ranker\'s score: model_score)'
    if self.settings.strategy == 'blend':
      return '1 / rank in the blend'
    if self.rankers is not None:
      return 'expected BLEU (MBR)' if self.rankers.mbr else 'the ranker\'s score'
    if self.retriever is not None:
      return 'the ranker\'s score'
    if self.settings.search.mbr != 'none':
      return 'expected BLEU (MBR)'
    return 'length-normalised log-probability'

  # -------------------------------------------------------------------------------------------
  # Contexts: decode, suggest, a service

  @property
  def scored_by_place(self) -> bool:
    """Whether a suggestion's 'score' is 1 / its place in the list (`score_kind`)."""
    return self.learned_ranker is not None or self.settings.strategy == 'blend'

  def show(self, ranked: Sequence[dict], session_so_far: Sequence[str],
           exclude_session_queries: bool | None = None, top_k: int | None = None
           ) -> list[dict]:
    """`show` with this pipeline's protocol and top_k, unless given."""
    exclude = (self.settings.exclude_session_queries if exclude_session_queries is None
               else exclude_session_queries)
    return show(ranked, session_so_far, exclude, top_k or self.settings.top_k,
                self.scored_by_place)

  def suggest(self, contexts: Sequence[Context], *, positions: str,
              batch_rows: int | None = None, widths: Sequence[int] | None = None
              ) -> list[list[list[dict]]]:
    """The suggestions shown for each context (in order) after each of its output
    positions ('last': its last query only; 'all': first_output onwards). Contexts are
    decoded `batch_rows` at a time (default `config.decode.batch_sessions`), each batch
    padded to its longest context, or with `widths` (ascending) to the first of them that
    holds it (a fixed set of shapes, e.g. one for every call)."""
    ordered = self.ordered(contexts, positions=positions, batch_rows=batch_rows, widths=widths)
    firsts = inference_sources.first_outputs(contexts, positions)
    return [[self.show(ranked, context.queries[:first + t + 1])
             for t, ranked in enumerate(lists)]
            for context, first, lists in zip(contexts, firsts, ordered)]

  def ordered(self, contexts: Sequence[Context], *, positions: str,
              batch_rows: int | None = None, widths: Sequence[int] | None = None
              ) -> list[list[list[dict]]]:
    """Stages 1-2 for `contexts`: [context][output position] the whole ordered list."""
    s = self.settings
    contexts = [c if len(c.history) <= self.past_read
                else dataclasses.replace(c, history=self.latest_past(c.history))
                for c in contexts]
    common = dict(positions=positions, batch_rows=batch_rows or s.batch_sessions,
                  widths=widths)
    if self.learned_ranker is not None:
      return self._learned(contexts, positions=positions,
                           batch_rows=batch_rows or s.batch_sessions, widths=widths)[0]
    if self.settings.strategy == 'blend':
      firsts = inference_sources.first_outputs(contexts, positions)
      beams = self._generate().propose(contexts, **common)
      return [[self._blend([c['query'] for c in beam], context.queries[:first + t + 1])
               for t, beam in enumerate(lists)]
              for context, first, lists in zip(contexts, firsts, beams)]
    if self.rankers is None:
      if self.retriever is not None:
        return inference_sources.Retrieve(self.retriever, self._retrieved_k(),
                                          s.history_queries).propose(contexts, **common)
      return self._generate().propose(contexts, **common)
    firsts = inference_sources.first_outputs(contexts, positions)
    lists = inference_sources.propose_all(self.rerank_sources(), contexts, **common)
    # Each source's texts at every position of the session (none before the first output).
    sources = [[[[] for _ in range(first)] + [[c['query'] for c in at] for at in ranked]
                for first, ranked in zip(firsts, by_context)] for by_context in lists.values()]
    # One context (typed, or a lone request) is scored alone, not in a padded batch.
    ordered = self.rankers.order([c.queries for c in contexts], sources,
                                 batch_rows=1 if len(contexts) == 1 else RERANK_SESSIONS,
                                 histories=[c.history for c in contexts])
    return [lists[first:] for first, lists in zip(firsts, ordered)]

  def _learned(self, contexts: Sequence[Context], *, positions: str, batch_rows: int,
               widths: Sequence[int] | None = None
               ) -> tuple[list[list[list[dict]]], dict[str, list[list[list[dict]]]]]:
    """The learned ranker's order of the pooled candidates, as `presented`, and each
    source's own lists: ([context][position] ordered, {source: [context][position] list})."""
    s = self.settings
    by_source, pools = learned.lists_and_features(
        self.trained, contexts, self.sources, self.log_counts, positions=positions,
        batch_rows=batch_rows, history_queries=s.history_queries, widths=widths)
    so_far = inference_sources.sessions_so_far(contexts, positions)
    # One prediction over every position's candidates (a batch), split back by position.
    flat = [pool for context_pools in pools for pool in context_pools]
    scores = (self.learned_ranker.scores(np.concatenate([p.features for p in flat])) if flat
              else np.zeros(0))
    by_position = iter(np.split(scores, np.cumsum([len(p.texts) for p in flat])[:-1]))
    out = []
    for i, context_pools in enumerate(pools):
      lists = []
      for p, pool in enumerate(context_pools):
        scores = next(by_position)
        origin = learned.proposers({name: lists_[i][p] for name, lists_ in by_source.items()})
        ranked = [{'query': pool.texts[j], 'score': float(scores[j]),
                   'sources': origin[pool.texts[j]]}
                  for j in np.argsort(-scores, kind='stable')]
        shown = presentation.presented(ranked, so_far[i][p], self.log_counts,
                                       session_first=s.session_first,
                                       unrelated_first=s.unrelated_first,
                                       attested_only=s.attested_only)
        # The presentation reorders the ranker's list: a suggestion's score is its place
        # (1 / place, as the blend's), the ranker's own kept as 'model_score' (as MBR keeps
        # the beam's), so that a list is always in the order of its scores.
        lists.append([{**c, 'score': 1 / place, 'model_score': c['score']}
                      for place, c in enumerate(shown, 1)])
      out.append(lists)
    return out, by_source

  def _blend(self, beam: list[str], context: Sequence[str]) -> list[dict]:
    return blended(blend_sources(beam, context, self.log_counts, self.settings.top_k),
                   self.settings.blend, context)

  def _log_sources(self) -> list[tuple[str, int]]:
    """(LogCounts source, candidates) of the training log's sources in use."""
    if self.log_counts is None:
      return []
    return [(name, k) for name, k in (('popular', self.settings.popular),
                                      ('cooccurring', self.settings.cooccurring)) if k]

  def pool_depth(self) -> int:
    """Pool entries retrieved per position: the suggestions' `_retrieved_k`, or the
    rankers' `config.suggest.retrieved` candidates."""
    return self._retrieved_k() if self.rankers is None else self.settings.retrieved

  def _retrieved_k(self) -> int:
    """Pool entries kept per position where they are the suggestions: enough that `show`
    still has top_k after dropping the session's queries."""
    return self.settings.top_k + self.suggester.cfg.max_session_queries

  def _generate(self) -> inference_sources.Generate:
    return inference_sources.Generate(self.trained, self.settings.whole_beam,
                                      self.settings.history_queries)

  def rerank_sources(self) -> list[inference_sources.Source]:
    """The candidate sources of 'rerank', in the order they are pooled (`SOURCES`)."""
    s = self.settings
    out: list[inference_sources.Source] = [self._generate()]
    if self.retriever is not None:
      out.append(inference_sources.Retrieve(self.retriever, s.retrieved, s.history_queries))
    if self.proposer is not None:
      out.append(inference_sources.IMDNA(self.proposer, s.imdna_proposed))
    out += [inference_sources.LOG_SOURCES[name](self.log_counts, k)
            for name, k in self._log_sources()]
    return out

  # -------------------------------------------------------------------------------------------
  # A whole split: evaluation

  def split_lists(self, split: sessions.SessionSplit, *, queries_per_batch: int,
                  retrieved: tuple[Sequence[Sequence[str]], np.ndarray] | None = None,
                  histories: Sequence[Sequence[str]] | None = None,
                  log=print) -> SplitLists:
    """Stages 1-2 for every (prefix -> next query) pair of `split`, in pair order: its
    sessions as contexts (`sources.session_contexts`), the generator's beam a session length
    at a time on every device of this process (`sources.Generate.propose_sessions`).

    Args:
      split: the sessions; pair (i, t) predicts query t+1 of session i after 0..t.
      queries_per_batch: query slots per batch of the generator's search.
      retrieved: where the pipeline retrieves, ([pairs] texts, float [pairs, pool_depth()]
        scores): the retriever's best pool entries for every pair of `split` (evaluation
        ranks the whole pool exactly, and keeps the ranks for its figures).
      histories: [sessions] each session's user's earlier queries (the habit rule; the
        model's input where it personalises).
    """
    s = self.settings
    # Each session's contexts: its queries but the last (which only ever is a reference).
    contexts = [split.session_texts(i)[:-1] for i in range(split.num_sessions)]
    first_pair = np.cumsum(split.lengths - 1) - (split.lengths - 1)
    per_session = lambda pairs: [[pairs[first_pair[i] + t] for t in range(len(queries))]
                                 for i, queries in enumerate(contexts)]
    texts = lambda lists: [[c['query'] for c in ranked] for ranked in lists]
    # Each pair's session and position in it, and its context (built where a source reads it).
    session_of = np.repeat(np.arange(split.num_sessions), split.lengths - 1)
    position_of = np.arange(len(session_of)) - first_pair[session_of]
    pair_contexts = lambda: [contexts[i][:t + 1] for i, t in zip(session_of.tolist(),
                                                                 position_of.tolist())]
    sources: dict[str, list[list[str]]] = {}
    flat = lambda lists: [at for session in lists for at in session]
    if s.history_queries and histories is None:
      raise ValueError('split_lists of a model that reads users\' histories needs them')
    if histories is not None:
      histories = [self.latest_past(h) for h in histories] if self.past_read else None
    session_contexts = inference_sources.session_contexts(split, range(split.num_sessions),
                                                          histories)
    if self.learned_ranker is not None:
      ordered, by_source = self._learned(
          session_contexts, positions='all',
          batch_rows=max(1, queries_per_batch // split.lengths.max()))
      return SplitLists(flat(ordered), {name: texts(flat(lists))
                                        for name, lists in by_source.items()})
    beams = None
    if isinstance(self.trained.task, tasks.Suggests):
      beams = flat(self._generate().propose_sessions(
          session_contexts, queries_per_batch=queries_per_batch, log=log))
    if s.strategy == 'blend':
      at_pairs = pair_contexts()
      by_source = [blend_sources(beam, context, self.log_counts, self.settings.top_k)
                   for beam, context in zip(texts(beams), at_pairs)]
      for name in BLEND_SOURCES:
        sources[name] = [pair[name] for pair in by_source]
      return SplitLists([blended(pair, s.blend, context)
                         for pair, context in zip(by_source, at_pairs)], sources)
    if self.rankers is None and self.retriever is None:
      return SplitLists(beams, sources)
    if beams is not None:
      sources['generate'] = texts(beams)
    if self.retriever is not None:
      if retrieved is None:
        raise ValueError('split_lists of a retrieving pipeline needs the retrieved entries')
      found, scores = retrieved
      pool_lists = [[{'query': q, 'score': float(v)} for q, v in zip(row, row_scores)]
                    for row, row_scores in zip(found, np.asarray(scores).tolist())]
      if self.rankers is None:  # the ranker's entries are the suggestions
        if s.strategy == 'retrieve':
          sources['retrieve'] = texts(pool_lists)
        return SplitLists(pool_lists, sources)
      sources['retrieve'] = texts(pool_lists)
    if self.proposer is not None:
      started = time.time()
      sources['imdna'] = self.proposer.propose(
          pair_contexts(), s.imdna_proposed,
          users=None if split.users is None else np.asarray(split.users)[session_of])
      log(f'  IMDNA proposed next queries for {len(sources["imdna"]):,} contexts in '
          f'{time.time() - started:.1f} s', flush=True)
    if self._log_sources():
      at_pairs = pair_contexts()
      for name, k in self._log_sources():
        sources[name] = self.log_counts.lists(at_pairs, k, name)
    started = time.time()
    ordered = self.rankers.order(
        contexts, [per_session(sources[name]) for name in SOURCES if name in sources],
        batch_rows=RERANK_SESSIONS, histories=histories)
    by_pair = [ranked for session in ordered for ranked in session]
    log(f'  reranked {len(by_pair):,} candidate lists in {time.time() - started:.1f} s',
        flush=True)
    return SplitLists(by_pair, sources)


def _load_proposer(config: ml_collections.ConfigDict, imdna_workdir: str,
                   workdir: str) -> imdna_proposer.NextQueryProposer:
  """The IMDNA run of `config.suggest.imdna_workdir`, checked to read `workdir`'s sessions."""
  if not os.path.isdir(imdna_workdir):
    raise errors.Error(f'config.suggest.imdna_workdir={imdna_workdir}: no such folder (a '
                       'trained configs/imdna_aol.py run)')
  _check_sessions(imdna_workdir, workdir)
  trained = inference.load_trained(config, imdna_workdir, of_the_config=False)
  if not isinstance(trained.task, tasks.AnswersQuestions):
    raise errors.Error(f'config.suggest.imdna_workdir={imdna_workdir} holds a '
                       f'{trained.cfg.name!r} model, not an IMDNA run')
  return imdna_proposer.NextQueryProposer(trained, imdna_workdir)


def _check_sessions(imdna_workdir: str, workdir: str) -> None:
  """Refuses an IMDNA run on other sessions than `workdir`'s: its documents are its
  training sessions, which must not hold the sessions being scored."""
  folders = [preprocess.data_dir(os.path.abspath(w)) for w in (imdna_workdir, workdir)]
  if not os.path.exists(os.path.join(folders[0], 'manifest.json')):
    raise errors.Error(f'config.suggest.imdna_workdir={imdna_workdir}: no corpus of sessions '
                       f'in {folders[0]} (a configs/imdna_aol.py run trained on the sessions of '
                       f'{workdir}; a configs/imdna_movies.py run answers questions on movies)')
  difference = preprocess.session_difference(*folders)
  if difference:
    raise errors.Error(f'config.suggest.imdna_workdir={imdna_workdir} was trained on other '
                       f'sessions than {workdir} ({difference}): train it with the same '
                       'config.data')


def _no_suggestions_of_its_own(trained: inference.Trained, workdir: str) -> str:
  """Why `workdir`'s model suggests nothing itself, and where it serves instead."""
  if isinstance(trained.task, tasks.AnswersQuestions):
    return (f'{workdir} holds an IMDNA model ({trained.cfg.name!r}), which answers its own '
            'questions (--mode=eval) and suggests nothing itself: a generator\'s workdir uses '
            'an IMDNA run on its sessions (configs/imdna_aol.py) as '
            '--config.suggest.imdna_workdir of --config.suggest.strategy=rerank')
  return (f'{workdir} holds a {trained.cfg.name!r} model, which scores given candidates and '
          'suggests nothing itself (a Cross-encoder): a generator\'s workdir uses it as '
          '--config.suggest.ranker_workdir of --config.suggest.strategy=rerank')


def _load(config: ml_collections.ConfigDict, workdir: str, key: str) -> inference.Trained:
  if not os.path.isdir(workdir):
    raise errors.Error(f'config.suggest.{key}={workdir}: no such folder (a trained ranker\'s '
                       'workdir)')
  if not os.path.isdir(checkpoints.checkpoint_dir(workdir)):
    parent = os.path.dirname(os.path.abspath(workdir))
    hint = (f'; {parent} holds them: name it'
            if os.path.isdir(checkpoints.checkpoint_dir(parent)) else '')
    raise errors.Error(f'config.suggest.{key}={workdir}: no checkpoints there (the workdir of '
                       f'a trained Bi-, Poly- or Cross-encoder run, which holds checkpoints/)'
                       f'{hint}')
  trained = inference.load_trained(config, workdir, of_the_config=False)
  if not isinstance(trained.task, (tasks.ScoresCandidates, tasks.ScoresPool)):
    raise errors.Error(f'config.suggest.{key}={workdir} holds a {trained.cfg.name!r} model, '
                       'not a ranker (a Bi-, Poly- or Cross-encoder)')
  return trained
