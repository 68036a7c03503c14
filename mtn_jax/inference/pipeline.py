"""Suggestion strategies (`config.suggest.strategy`): generate, retrieve, or generate then rerank.

- 'generate': the workdir's own model, as it is (a generative model's beam, or a ranker's
  retrieved pool entries).
- 'retrieve': the pool entries a trained Bi- or Poly-encoder (`config.suggest.ranker_workdir`)
  retrieves (`mtn_jax.ranking`): real logged queries, never an unknown word.
- 'rerank': for each context, the candidates of its sources pooled -- the workdir's
  generative beam (every hypothesis, `config.decode.beam_size`), the `config.suggest.retrieved`
  best pool entries of a retriever (`config.suggest.retriever_workdir`, by default the ranker
  itself when it can score the pool; 0: none), with `config.suggest.imdna_workdir` the
  `config.suggest.imdna_proposed` best next queries of an IMDNA run on the same sessions (the
  queries that follow in the most similar training sessions, `mtn_jax.imdna_task`), and the
  session's own queries so far (a user often returns to one) and, with
  `config.suggest.habit_rate`, the user's habit query where it goes first (`mtn_jax.habits`)
  -- then deduplicated by text, scored by the ranker
  (`task.score_candidates`: a Bi-, Poly- or Cross-encoder) and sorted, best first. The
  generator proposes words the pool has never seen, the retriever well-formed logged queries,
  IMDNA what followed in sessions like this one, and the ranker, which reads the whole
  session against each candidate, decides.

The rankers must read the workdir's vocabulary (the same corpus, preprocessed alike): a
candidate is given to the ranker as token ids, and ids of another vocabulary would be other
words. `Rankers.load` refuses a mismatch with a one-line error naming both workdirs. IMDNA
hands over texts, so its vocabulary may differ; its sessions may not (its documents are its
training sessions, which must not hold the sessions being scored).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from mtn_jax import errors
from mtn_jax.inference import habits
from mtn_jax.tasks import imdna
from mtn_jax import inference
from mtn_jax.decoding import mbr
from mtn_jax.inference import retrieval
from mtn_jax import tasks
from mtn_jax.data import preprocess
from mtn_jax.data.vocab import Vocab

CANDIDATE_BUCKET = 8  # candidate lists are padded to a multiple of this (fewer compilations)


@functools.partial(jax.jit, static_argnames=('task',))
def _score(params, queries: jax.Array, candidates: jax.Array, *, task) -> jax.Array:
  return task.score_candidates(params, {'queries': queries}, candidates)


def _check_vocab(ranker: inference.Trained, vocab: Vocab, key: str, where: str,
                 workdir: str) -> None:
  if ranker.vocab.fingerprint != vocab.fingerprint or ranker.vocab.kind != vocab.kind:
    raise errors.Error(
        f'config.suggest.{key}={where}: its vocabulary ({len(ranker.vocab):,} '
        f'{ranker.vocab.kind} tokens, fingerprint {ranker.vocab.fingerprint}) is not the one of '
        f'{workdir} ({len(vocab):,} {vocab.kind} tokens, fingerprint {vocab.fingerprint}): '
        'train the ranker on the same corpus, preprocessed with the same config.data')


@dataclasses.dataclass
class Rankers:
  """The trained rankers a strategy uses.

  Attributes:
    ranker: scores candidates given by their words ('rerank'), and retrieves ('retrieve').
    retriever: the pool entries added to the candidates ('rerank'); None where the ranker
      cannot score the pool (a Cross-encoder) and no retriever is named.
    retriever_workdir: where the retriever's pool and candidate cache are.
    retrieved: the retriever's entries added to each context's candidates.
    proposed: the proposer's next queries added to each context's candidates.
    proposer: IMDNA's next queries added to the candidates ('rerank'); None unless
      `config.suggest.imdna_workdir` names a run.
    mbr: order the pooled candidates by their expected BLEU under the ranker's distribution
      (`mtn_jax.mbr`, p = softmax of the ranker's scores, as in its training loss) instead of
      by score.
    habit_rate, habit_min_past: the user's habit query goes first where their habit rate is
      at least `habit_rate` over at least `habit_min_past` past queries (`mtn_jax.habits`);
      0: never.
  """

  ranker: inference.Trained
  retriever: retrieval.Retriever | None
  retriever_workdir: str
  retrieved: int
  proposed: int
  proposer: imdna.NextQueryProposer | None = None
  mbr: bool = False
  habit_rate: float = 0.0
  habit_min_past: int = 0

  @classmethod
  def load(cls, config: ml_collections.ConfigDict, workdir: str, vocab: Vocab,
           log=print) -> Rankers:
    """The rankers `config.suggest` names, checked against `vocab` (the workdir's)."""
    s = config.suggest
    ranker = _load(config, s.ranker_workdir, 'ranker_workdir')
    if not isinstance(ranker.task, tasks.ScoresCandidates):
      raise errors.Error(f'config.suggest.ranker_workdir={s.ranker_workdir} holds a '
                         f'{ranker.cfg.name!r} model, which cannot score given candidates: '
                         'name a Bi-, Poly- or Cross-encoder run')
    _check_vocab(ranker, vocab, 'ranker_workdir', s.ranker_workdir, workdir)
    retriever_workdir = s.retriever_workdir or s.ranker_workdir
    retriever = None
    if s.strategy == 'rerank' and s.retrieved == 0:
      log('Note: config.suggest.retrieved=0: no pool entries join the candidates.')
    else:
      retriever_trained = (ranker if not s.retriever_workdir
                           else _load(config, s.retriever_workdir, 'retriever_workdir'))
      if isinstance(retriever_trained.task, tasks.ScoresPool):
        _check_vocab(retriever_trained, vocab, 'retriever_workdir', retriever_workdir, workdir)
        retriever = retrieval.Retriever(retriever_trained, retriever_workdir, log=log,
                                      index=s.index)
      elif s.strategy == 'retrieve' or s.retriever_workdir:
        raise errors.Error(f'config.suggest: {retriever_workdir} holds a '
                           f'{retriever_trained.cfg.name!r} model, which cannot retrieve from '
                           'the pool: name a Bi- or Poly-encoder run')
      else:
        log(f'Note: {s.ranker_workdir} cannot retrieve from the pool (a Cross-encoder): the '
            'candidates are the beam and the session\'s queries (name a Bi- or Poly-encoder '
            'in config.suggest.retriever_workdir to add pool entries).')
    proposer = _load_proposer(config, s.imdna_workdir, workdir) if s.imdna_workdir else None
    return cls(ranker, retriever, os.path.abspath(retriever_workdir), s.retrieved,
               s.imdna_proposed, proposer, s.mbr, s.habit_rate, s.habit_min_past)

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

  def rerank(self, sessions_queries: Sequence[Sequence[str]],
             sources: Sequence[Sequence[Sequence[Sequence[str]]]], *, batch_rows: int,
             exclude_session_queries: bool = False,
             histories: Sequence[Sequence[str]] | None = None) -> list[list[list[dict]]]:
    """[R][t] every pooled candidate ({'query', 'score'}), best first.

    Args:
      sessions_queries: [R] each session's query texts.
      sources: each source's candidates [R][t] after position t (the generator's first: on
        a tie its order stands); the session's queries up to t are added last, then the
        user's habit query where it goes first.
      exclude_session_queries: drop the candidates the session holds up to t (the
        user-facing protocol).
      histories: [R] each session's user's earlier queries, oldest first (`habit_rate`).
    """
    return self._rerank(sessions_queries, sources, batch_rows, (exclude_session_queries,),
                        histories)[0]

  def rerank_both_protocols(self, sessions_queries: Sequence[Sequence[str]],
                            sources: Sequence[Sequence[Sequence[Sequence[str]]]], *,
                            batch_rows: int, histories: Sequence[Sequence[str]] | None = None
                            ) -> tuple[list[list[list[dict]]], list[list[list[dict]]]]:
    """`rerank`'s lists without and with `exclude_session_queries`, the candidates scored
    once (evaluation scores both protocols)."""
    return tuple(self._rerank(sessions_queries, sources, batch_rows, (False, True), histories))

  def _rerank(self, sessions_queries: Sequence[Sequence[str]],
              sources: Sequence[Sequence[Sequence[Sequence[str]]]], batch_rows: int,
              protocols: Sequence[bool], histories: Sequence[Sequence[str]] | None
              ) -> list[list[list[list[dict]]]]:
    """`rerank`'s lists for each value of `exclude_session_queries` in `protocols`. Every
    pooled candidate is scored, the session's queries too: a candidate's score depends on the
    session and on it alone, so one scoring serves both protocols."""
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
    return [[[self._order(queries, t, texts, values, exclude, habit_firsts[r][t])
              for t, (texts, values) in enumerate(zip(lists, session_scores))]
             for r, (queries, lists, session_scores) in enumerate(zip(sessions_queries, pooled,
                                                                      scores))]
            for exclude in protocols]

  def _order(self, queries: Sequence[str], t: int, texts: Sequence[str], values: np.ndarray,
             exclude_session_queries: bool, habit_first: str | None) -> list[dict]:
    """The candidates `texts` after position t of the session `queries`, scored `values`
    [len(texts)], best first; with `exclude_session_queries` those the session does not hold
    (MBR's evidence stays every candidate, as the generator's own MBR has it);
    `habit_first` (never a query of the session) before the rest."""
    # A stable sort: on a tie the generator's order stands.
    order = np.argsort(-values, kind='stable')
    ranked = [{'query': texts[i], 'score': float(values[i])} for i in order]
    if self.mbr:
      ranked = mbr.rerank(ranked)
    if exclude_session_queries:
      seen = set(queries[:t + 1])
      ranked = [c for c in ranked if c['query'] not in seen]
    if habit_first is not None:
      first = next(i for i, c in enumerate(ranked) if c['query'] == habit_first)
      ranked = [ranked[first], *ranked[:first], *ranked[first + 1:]]
    return ranked


def _load_proposer(config: ml_collections.ConfigDict, imdna_workdir: str,
                   workdir: str) -> imdna.NextQueryProposer:
  """The IMDNA run of `config.suggest.imdna_workdir`, checked to read `workdir`'s sessions."""
  if not os.path.isdir(imdna_workdir):
    raise errors.Error(f'config.suggest.imdna_workdir={imdna_workdir}: no such folder (a '
                       'trained configs/imdna_aol.py run)')
  _check_sessions(imdna_workdir, workdir)
  trained = inference.load_trained(config, imdna_workdir, which='best')
  if not isinstance(trained.task, imdna.IMDNATask):
    raise errors.Error(f'config.suggest.imdna_workdir={imdna_workdir} holds a '
                       f'{trained.cfg.name!r} model, not an IMDNA run')
  return imdna.NextQueryProposer(trained, imdna_workdir)


def _check_sessions(imdna_workdir: str, workdir: str) -> None:
  """Refuses an IMDNA run on other sessions than `workdir`'s: its documents are its
  training sessions, which must not hold the sessions being scored."""
  folders = [preprocess.data_dir(os.path.abspath(w)) for w in (imdna_workdir, workdir)]
  if not os.path.exists(os.path.join(folders[0], 'manifest.json')):
    raise errors.Error(f'config.suggest.imdna_workdir={imdna_workdir}: no corpus in '
                       f'{folders[0]} (a trained configs/imdna_aol.py run)')
  difference = preprocess.session_difference(*folders)
  if difference:
    raise errors.Error(f'config.suggest.imdna_workdir={imdna_workdir} was trained on other '
                       f'sessions than {workdir} ({difference}): train it with the same '
                       'config.data')


def _load(config: ml_collections.ConfigDict, workdir: str, key: str) -> inference.Trained:
  if not os.path.isdir(workdir):
    raise errors.Error(f'config.suggest.{key}={workdir}: no such folder (a trained ranker\'s '
                       'workdir)')
  trained = inference.load_trained(config, workdir, which='best')
  if not isinstance(trained.task, tasks.RankingTask):
    raise errors.Error(f'config.suggest.{key}={workdir} holds a {trained.cfg.name!r} model, '
                       'not a ranker (a Bi-, Poly- or Cross-encoder)')
  return trained
