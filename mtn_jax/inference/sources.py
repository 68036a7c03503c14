"""Candidate sources: where the suggestion pipeline's candidates come from, behind one protocol.

A source proposes, for each context (`inputs.Context`) and each of its output positions, its
candidate next queries, best first, each with the source's own score:

    source.propose(contexts, positions=..., batch_rows=..., widths=...)
        -> [context][output position] [{'query': text, 'score': float}, ...]

'positions' is 'last' (after each context's last query) or 'all' (after first_output
onwards); `batch_rows` and `widths` say how a model-backed source batches its contexts (as
`generated` does); the others ignore them. `propose_all` is the one executor: every source of
a pipeline over the same contexts, for eval, decode, suggest and the service alike.

The sources:
  generate      the workdir's generative beam, in the generator's own order (`generated`);
  retrieve      a Bi- or Poly-encoder's best pool entries (`retrieval.Retriever`);
  imdna         the next queries of the most similar training sessions (`imdna_proposer`);
  popular       the training log's most popular next queries (MPC);
  cooccurring   the queries that most often followed the previous one in the training log,
                then the most popular;
  templates     reformulations of the previous query by the training log's most frequent
                edits (`templates`);
  matching      the training log's queries that best match the previous one (BM25);
  history       the user's own earlier queries (`Context.history`), the most issued first;
  history_about those of them about the session so far;
  session       the session's own queries so far, latest first.
A new source is a class with the three members of `Source` (its `name` is its name in a plan,
`config.suggest.sources`, and in a candidate's 'sources'; `proposes_past` where it proposes
the user's earlier queries, so that every mode hands them over); one that needs no model also
has `of_log` and joins `LOG_SOURCE_CLASSES`, which is all the learned ranker needs. Its
label goes in `LABELS` (how evaluation names its figures). BUILD.md lists the rest: the
USAGE page's list of sources and the tests every source meets."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import time
from collections.abc import Sequence
from typing import ClassVar, Protocol, runtime_checkable

import jax
import numpy as np

from mtn_jax import inference
from mtn_jax import parallel
from mtn_jax.data import bm25
from mtn_jax.data import sessions
from mtn_jax.decoding import search
from mtn_jax.inference import imdna_proposer
from mtn_jax.inference import inputs
from mtn_jax.inference import popular
from mtn_jax.inference import retrieval
from mtn_jax.inference import subjects
from mtn_jax.inference import templates as templates_lib
from mtn_jax.inference.inputs import Context

Lists = list[list[list[dict]]]  # [context][output position] candidates, best first


@runtime_checkable
class Source(Protocol):
  """Proposes candidates (see the module docstring): each query once in a list, best first.

  Attributes:
    name: its name in a plan (`config.suggest.sources`) and in a candidate's 'sources'.
    proposes_past: whether it proposes the user's own earlier queries (`Context.history`):
      a pipeline with such a source reads them (`Pipeline.past_read`), the learned ranker
      learns from contexts with them and without (`learned_training.without_history`), and what it
      proposes is a query a person typed, kept whatever the word-salad filter says
      (`presentation.typed_before`). A model-backed source that reads a user's past to write
      its own candidates (`history_queries`) proposes none of them.
  """

  name: ClassVar[str]
  proposes_past: ClassVar[bool]

  def propose(self, contexts: Sequence[Context], *, positions: str, batch_rows: int,
              widths: Sequence[int] | None = None) -> Lists:
    """[context][output position] its candidates ({'query', 'score'}), best first."""


def parse_plan(plan: str, names: Sequence[str]) -> tuple[tuple[str, int], ...]:
  """'popular:2,generate:7' -> (('popular', 2), ('generate', 7)): sources of `names` and how
  many candidates of each, in order.

  Raises:
    ValueError: not such a list of `names`, each once, with positive counts.
  """
  out = []
  for item in plan.split(','):
    name, _, count = item.strip().partition(':')
    if name not in names or not count.strip().isdigit() or int(count) < 1:
      raise ValueError(f'{item.strip()!r} is not SOURCE:N with SOURCE one of '
                       f'{", ".join(names)} and N >= 1')
    out.append((name, int(count)))
  if len({name for name, _ in out}) != len(out):
    raise ValueError(f'{plan!r} names a source twice')
  return tuple(out)


def first_outputs(contexts: Sequence[Context], positions: str) -> list[int]:
  """Each context's first output position."""
  return [len(c.queries) - 1 if positions == 'last' else c.first_output for c in contexts]


def sessions_so_far(contexts: Sequence[Context], positions: str) -> list[list[tuple[str, ...]]]:
  """[context][output position] the queries up to and including that position."""
  return [[c.queries[:t + 1] for t in range(first, len(c.queries))]
          for c, first in zip(contexts, first_outputs(contexts, positions))]


def propose_all(sources: Sequence[Source], contexts: Sequence[Context], *, positions: str,
                batch_rows: int, widths: Sequence[int] | None = None) -> dict[str, Lists]:
  """{source name: its lists} of every source over `contexts`, in the sources' order."""
  names = [s.name for s in sources]
  if len(set(names)) != len(names):
    raise ValueError(f'two candidate sources share a name: {names} (a name keys its lists)')
  return {s.name: s.propose(contexts, positions=positions, batch_rows=batch_rows,
                            widths=widths) for s in sources}


def session_contexts(split: sessions.SessionSplit, chosen: Sequence[int],
                     histories: Sequence[Sequence[str]] | None = None) -> list[Context]:
  """A context of each chosen session of `split`: its queries but the last, suggested after
  each (the last query is only ever a reference); `histories`: [split's sessions] each one's
  user's earlier queries, for a model that reads them."""
  out = []
  for i in chosen:
    texts = split.session_texts(int(i))
    info = {'session': int(i)}
    if split.users is not None:
      info['user'] = int(split.users[int(i)])
    history = tuple(histories[int(i)]) if histories is not None else ()
    out.append(Context(tuple(texts[:-1]), 0, info, 0, tuple(texts[1:]), history))
  return out


PROGRESS_SECONDS = 10.0  # at most one progress line of a long pass this often


def by_session_length(propose, contexts: Sequence[Context], *, queries_per_batch: int,
                      multiple_of: int = 1, log=None) -> list:
  """`propose(group, batch_rows)` over `contexts` ('all' positions: a whole split's), one
  session length at a time: a length's contexts `queries_per_batch` query slots a batch (rows
  a multiple of `multiple_of`, the devices'), as training's batches fill them, rather than
  every batch as few rows as the longest session allows. Returns the lists in `contexts`'
  order; `log` gets a progress line at most every `PROGRESS_SECONDS`."""
  out: list = [None] * len(contexts)
  by_length: dict[int, list[int]] = {}
  for i, context in enumerate(contexts):
    by_length.setdefault(len(context.queries), []).append(i)
  done, started, last_log = 0, time.time(), time.time()
  for length in sorted(by_length):
    rows = max(1, queries_per_batch // length)
    rows = -(-rows // multiple_of) * multiple_of
    chosen = by_length[length]
    for start in range(0, len(chosen), rows):
      group = chosen[start:start + rows]
      for i, lists in zip(group, propose([contexts[i] for i in group], rows)):
        out[i] = lists
      done += len(group)
      if log is not None and (time.time() - last_log >= PROGRESS_SECONDS
                              or done == len(contexts)):
        last_log = time.time()
        log(f'  decoded {done:,}/{len(contexts):,} sessions '
            f'({done / max(last_log - started, 1e-9):.1f} sessions/s)', flush=True)
  return out


# ---------------------------------------------------------------------------------------------
# Model-backed sources


def batches(trained: inference.Trained, contexts: Sequence[Context], batch_rows: int,
            widths: Sequence[int] | None, history_queries: int, pool=None):
  """(context indices, contexts, batch, lengths) of `contexts` sorted by length, `batch_rows`
  at a time, each batch padded to its longest context or to the first of `widths` that holds
  it (`inputs.context_batch`; `pool`: the candidate pool, for a ranker that reads it)."""
  order = sorted(range(len(contexts)), key=lambda i: len(contexts[i].queries))
  for start in range(0, len(order), batch_rows):
    group = order[start:start + batch_rows]
    group_contexts = [contexts[i] for i in group]
    longest = max(len(c.queries) for c in group_contexts)
    width = longest if widths is None else next(w for w in widths if w >= longest)
    batch, lengths = inputs.context_batch(trained.task, trained.vocab, group_contexts,
                                          rows=batch_rows, width=width,
                                          history_queries=history_queries, pool=pool)
    yield group, group_contexts, batch, lengths


def generated(trained: inference.Trained, contexts: Sequence[Context],
              settings: search.SearchSettings, *, positions: str, batch_rows: int,
              history_queries: int = 0, widths: Sequence[int] | None = None,
              mesh: jax.sharding.Mesh | None = None) -> Lists:
  """A generative model's suggestions for each context (in order) after each of its output
  positions, ordered and cut as `settings` says (`search.ranked_suggestions`).

  Contexts are sorted by length and decoded `batch_rows` at a time, each batch padded to
  its longest context (or to the first of `widths` that holds it, a fixed set of shapes): the
  models are causal over queries, so trailing padding queries change no earlier position.
  With `mesh` (this process's devices; `trained.params` replicated on them), each batch's
  rows are split over its devices.
  """
  out: list = [None] * len(contexts)
  for group, group_contexts, batch, lengths in batches(trained, contexts, batch_rows, widths,
                                                       history_queries):
    model_inputs = {k: batch[k] for k in trained.task.context_keys}
    if mesh is not None:
      model_inputs = parallel.shard_batch(model_inputs, mesh)
    sequences, scores = trained.task.suggest(
        trained.params, model_inputs, settings,
        positions=positions, lengths=lengths if positions == 'last' else None)
    sequences, scores = np.asarray(sequences), np.asarray(scores)
    for row, (i, context) in enumerate(zip(group, group_contexts)):
      # (output column, the context position it suggests after)
      kept = ([(0, len(context.queries) - 1)] if positions == 'last'
              else [(t, t) for t in range(context.first_output, len(context.queries))])
      copied = trained.copied_words(context.queries)
      out[i] = [search.ranked_suggestions(trained.vocab, sequences[row, p], scores[row, p],
                                          settings, context.queries[:t + 1], copied)
                for p, t in kept]
  return out


def retrieved(retriever: retrieval.Retriever, contexts: Sequence[Context], *, k: int,
              positions: str, batch_rows: int, history_queries: int = 0,
              widths: Sequence[int] | None = None) -> Lists:
  """A ranker's `k` best pool entries for each context (in order) after each of its output
  positions, nothing dropped (batched as `generated`)."""
  out: list = [None] * len(contexts)
  for group, group_contexts, batch, _ in batches(retriever.trained, contexts, batch_rows,
                                                 widths, history_queries, retriever.pool):
    lists = retriever.suggestions(batch, k, [c.queries for c in group_contexts],
                                  exclude_session_queries=False)
    for row, (i, first) in enumerate(zip(group, first_outputs(group_contexts, positions))):
      out[i] = lists[row][first:]
  return out


@dataclasses.dataclass
class Generate:
  """The workdir's generative beam, every hypothesis in the generator's own order; with
  `mesh`, each batch split over its devices (`on_local_devices`)."""

  trained: inference.Trained
  settings: search.SearchSettings  # the whole beam: `Settings.whole_beam`
  history_queries: int = 0
  name: ClassVar[str] = 'generate'
  proposes_past: ClassVar[bool] = False
  mesh: jax.sharding.Mesh | None = None

  def propose(self, contexts, *, positions, batch_rows, widths=None) -> Lists:
    return generated(self.trained, contexts, self.settings, positions=positions,
                     batch_rows=batch_rows, history_queries=self.history_queries,
                     widths=widths, mesh=self.mesh)

  def on_local_devices(self) -> Generate:
    """This source with its batches split over all of this process's devices (a whole
    split's evaluation; each process of a multi-host run decodes every context), or itself
    where there is one device."""
    devices = jax.local_devices()
    if len(devices) == 1:
      return self
    mesh = parallel.local_mesh()
    params = parallel.replicated_locally(self.trained.params, mesh)
    return dataclasses.replace(self, trained=dataclasses.replace(self.trained, params=params),
                               mesh=mesh)

  def propose_sessions(self, contexts: Sequence[Context], *, queries_per_batch: int,
                       log=None) -> list[Lists]:
    """[context][position] the beam after every position of whole sessions' contexts (a
    split's: `session_contexts`), on all of this process's devices, a session length at a
    time (`by_session_length`)."""
    beam = self.on_local_devices()
    return by_session_length(
        lambda group, rows: beam.propose(group, positions='all', batch_rows=rows), contexts,
        queries_per_batch=queries_per_batch, multiple_of=jax.local_device_count(), log=log)


@dataclasses.dataclass
class Retrieve:
  """A Bi- or Poly-encoder's `k` best pool entries."""

  retriever: retrieval.Retriever
  k: int
  history_queries: int = 0
  name: ClassVar[str] = 'retrieve'
  proposes_past: ClassVar[bool] = False

  def propose(self, contexts, *, positions, batch_rows, widths=None) -> Lists:
    return retrieved(self.retriever, contexts, k=self.k, positions=positions,
                     batch_rows=batch_rows, history_queries=self.history_queries,
                     widths=widths)


@dataclasses.dataclass
class IMDNA:
  """IMDNA's `k` next queries after each position; a context's 'user' (its info) keeps that
  user's own sessions out of reach."""

  proposer: imdna_proposer.NextQueryProposer
  k: int
  name: ClassVar[str] = 'imdna'
  proposes_past: ClassVar[bool] = False

  def propose(self, contexts, *, positions, batch_rows, widths=None) -> Lists:
    del batch_rows, widths
    at = [(i, t) for i, (c, first) in enumerate(zip(contexts, first_outputs(contexts, positions)))
          for t in range(first, len(c.queries))]
    users = [contexts[i].info.get('user') for i, _ in at]
    proposed = self.proposer.propose(
        [contexts[i].queries[:t + 1] for i, t in at], self.k,
        users=None if any(u is None for u in users) else users)
    out: Lists = [[] for _ in contexts]
    for (i, _), queries in zip(at, proposed):
      out[i].append([{'query': q, 'score': -float(rank)} for rank, q in enumerate(queries, 1)])
    return out


# ---------------------------------------------------------------------------------------------
# Sources read from the training log


def _per_position(contexts, positions, propose_one) -> Lists:
  return [[propose_one(so_far) for so_far in session]
          for session in sessions_so_far(contexts, positions)]


@dataclasses.dataclass
class Popular:
  """The training log's `k` most popular next queries (MPC); score: the times logged."""

  counts: popular.LogCounts
  k: int
  name: ClassVar[str] = 'popular'
  proposes_past: ClassVar[bool] = False

  @classmethod
  def of_log(cls, counts: popular.LogCounts, k: int) -> Source:
    return cls(counts, k)

  def propose(self, contexts, *, positions, batch_rows=0, widths=None) -> Lists:
    top = [{'query': q, 'score': float(self.counts.issued[q])}
           for q in self.counts.most_popular(self.k)]
    return _per_position(contexts, positions, lambda so_far: list(top))


@dataclasses.dataclass
class Cooccurring:
  """The `k` queries that most often followed the previous one in the training log, then the
  most popular; score: the times that pair was logged (0 for the popular fallback)."""

  counts: popular.LogCounts
  k: int
  name: ClassVar[str] = 'cooccurring'
  proposes_past: ClassVar[bool] = False

  @classmethod
  def of_log(cls, counts: popular.LogCounts, k: int) -> Source:
    return cls(counts, k)

  def propose(self, contexts, *, positions, batch_rows=0, widths=None) -> Lists:
    def one(so_far):
      after = self.counts.after.get(so_far[-1], {})
      return [{'query': q, 'score': float(after.get(q, 0))}
              for q in self.counts.cooccurring(so_far[-1], self.k)]
    return _per_position(contexts, positions, one)


@dataclasses.dataclass
class Templates:
  """The previous query rewritten by the training log's `k` most frequent applicable edits;
  score: how many training pairs the edit rewrote."""

  templates: templates_lib.Templates
  k: int
  name: ClassVar[str] = 'templates'
  proposes_past: ClassVar[bool] = False

  @classmethod
  def of_log(cls, counts: popular.LogCounts, k: int) -> Source:
    return cls(counts.templates, k)

  def propose(self, contexts, *, positions, batch_rows=0, widths=None) -> Lists:
    return _per_position(contexts, positions, lambda so_far: [
        {'query': q, 'score': float(n), 'template': t}
        for q, t, n in self.templates.propose(so_far[-1], self.k)])


@dataclasses.dataclass
class Matching:
  """The `k` queries of the training log that best match the previous query by BM25 over
  their words (the log's rare words weigh most), the previous query itself left out: real
  queries about what the session is about ("bank of america" -> "bank of america online
  banking"), where the generator may garble and the log's lists know nothing of the session;
  score: the BM25 score."""

  counts: popular.LogCounts
  k: int
  name: ClassVar[str] = 'matching'
  proposes_past: ClassVar[bool] = False

  @classmethod
  def of_log(cls, counts: popular.LogCounts, k: int) -> Source:
    return cls(counts, k)

  def __post_init__(self):
    # The logged next queries, in the log's order of first appearance (ties: the first seen).
    self._queries = list(self.counts.issued)
    self._index = bm25.memory_index(self._queries) if self._queries else None

  def propose(self, contexts, *, positions, batch_rows=0, widths=None) -> Lists:
    def one(so_far):
      if self._index is None:
        return []
      ids, scores = self._index.top_k([so_far[-1]], self.k + 1)
      found = [{'query': self._queries[i], 'score': float(score)}
               for i, score in zip(ids[0].tolist(), scores[0].tolist())
               if i >= 0 and self._queries[i] != so_far[-1]]
      return found[:self.k]
    return _per_position(contexts, positions, one)


@dataclasses.dataclass
class Session:
  """The session's own queries so far, latest first; score: minus the steps back."""

  name: ClassVar[str] = 'session'
  proposes_past: ClassVar[bool] = False

  @classmethod
  def of_log(cls, counts: popular.LogCounts, k: int) -> Source:
    del counts, k  # all of the session's queries so far
    return cls()

  def propose(self, contexts, *, positions, batch_rows=0, widths=None) -> Lists:
    return _per_position(contexts, positions, lambda so_far: [
        {'query': q, 'score': -float(back)}
        for back, q in enumerate(dict.fromkeys(reversed(so_far)))])


@dataclasses.dataclass
class History:
  """The user's own earlier queries (`Context.history`: their earlier sessions' latest
  `config.suggest.past_queries`, `Pipeline.past_read`), the session's so far left out: the `k`
  most issued, on a tie the latest issued first; score: the times issued. Many users come back
  to the same queries (docs/RESULTS.md, "A user's habits"), and what a user searched before is
  a query a person typed, never word salad. A context without a history (a sessions file, a
  request naming no user) gets none. With `about`, only those about the session so far
  (`HistoryAbout`)."""

  k: int
  name: ClassVar[str] = 'history'
  proposes_past: ClassVar[bool] = True
  about: ClassVar[bool] = False

  @classmethod
  def of_log(cls, counts: popular.LogCounts, k: int) -> Source:
    del counts  # the user's own queries, none of the log's
    return cls(k)

  def propose(self, contexts, *, positions, batch_rows=0, widths=None) -> Lists:
    out = []
    for context, session in zip(contexts, sessions_so_far(contexts, positions)):
      issued = collections.Counter(context.history)
      latest = {q: i for i, q in enumerate(context.history)}
      ranked = sorted(issued, key=lambda q: (-issued[q], -latest[q]))
      lists = []
      for so_far in session:
        about = subjects.about_session(so_far) if self.about else None
        chosen = (q for q in ranked if q not in so_far and (about is None or about(q)))
        lists.append([{'query': q, 'score': float(issued[q])}
                      for q in itertools.islice(chosen, self.k)])
      out.append(lists)
    return out


@dataclasses.dataclass
class HistoryAbout(History):
  """The user's earlier queries about the session so far (`subjects.about_session`), the `k`
  most issued: a person's own related queries, which the most issued often leave out."""

  name: ClassVar[str] = 'history_about'
  about: ClassVar[bool] = True


# The sources that need no model: a new one joins this tuple.
LOG_SOURCE_CLASSES = (Popular, Cooccurring, Templates, Matching, History, HistoryAbout, Session)
# By name: (the training log's LogCounts, depth) -> the source.
LOG_SOURCES = {cls.name: cls.of_log for cls in LOG_SOURCE_CLASSES}
MODEL_SOURCES = (Generate.name, Retrieve.name, IMDNA.name)
NAMES = MODEL_SOURCES + tuple(LOG_SOURCES)
if len(set(NAMES)) != len(LOG_SOURCE_CLASSES) + len(MODEL_SOURCES):
  raise ImportError(f'two candidate sources share a name: {NAMES} (a name keys its lists)')
# The sources of the user's own earlier queries: a pipeline with one reads their latest
# `config.suggest.past_queries` (`Pipeline.past_read`).
PAST_SOURCES = tuple(cls.name for cls in LOG_SOURCE_CLASSES if cls.proposes_past)


def reads_past(source_names: Sequence[str]) -> bool:
  """Whether any of `source_names` proposes the user's own earlier queries."""
  return any(name in PAST_SOURCES for name in source_names)


# Each source as evaluation names its figures, scored beside the strategy that pools it.
LABELS = {'generate': 'Generate (the workdir\'s model)',
          'retrieve': 'Retrieve (the ranker\'s pool entries)',
          'imdna': 'IMDNA (next queries of similar sessions)',
          'popular': 'Popular next queries (a source)',
          'cooccurring': 'Co-occurring next queries, then MPC (a source)',
          'templates': 'Reformulation templates (a source)',
          'matching': 'Logged queries matching the previous one (a source)',
          'history': 'The user\'s earlier queries (a source)',
          'history_about': 'The user\'s earlier queries about the session (a source)',
          'session': 'The session\'s own queries (a source)'}
if set(LABELS) != set(NAMES):  # a source added without its label fails at once, not in eval
  raise ImportError(f'sources.LABELS misses {sorted(set(NAMES) - set(LABELS))} or names '
                    f'{sorted(set(LABELS) - set(NAMES))}, which are no sources')
