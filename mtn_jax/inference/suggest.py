"""Suggestions from a trained checkpoint: offline over a file (`--mode=decode`), or typed
(`--mode=suggest`). Only the parameters are loaded, never the optimizer state.

`decode_file` reads `config.decode.input` (plain or gzip, told by its first bytes), in one of
two forms, told apart by its first non-empty line:
  sessions  one session a line, its queries separated by tabs; suggestions are made after the
            LAST query of each line;
  raw log   an AOL-format log (`AnonID` header line, or 3 or 5 tab-separated fields with a
            `YYYY-MM-DD HH:MM:SS` time in the third): read and sessionized by
            `mtn_jax.data.aol_log` with the data config's rules (session gap, successive
            duplicates removed), over-long queries cut rather than dropped and sessions of any
            length kept; suggestions are made after every query of every session, with the
            next query as the reference where there is one.
Queries are normalised as the corpus's are (`aol_log.normalize_query`: lower-cased, words on
single spaces), and a line that is not UTF-8 is read as Latin-1 (counted).
and writes `config.decode.output` (default `<workdir>/decode/<input name>.suggestions.jsonl`),
one JSON object per suggestion point:
  {"line": 3, "context": ["q1", "q2"], "suggestions": [{"query": "...", "score": -0.42}, ...]}
  {"user": 4945, "session": 0, "position": 1, "context": [...], "reference": "q3" or null,
   "suggestions": [...]}
with the `config.decode.top_k` best suggestions, best first. Every suggestion has a 'score',
the value its list is ordered by: the beam's length-normalised log-probability, a ranker's
score, or, where minimum Bayes risk reorders the list (`config.decode.rerank`,
`config.suggest.mbr`), its expected BLEU, the model's own score then kept as 'model_score' (a
session query MBR adds has none). The header line printed before decoding names the kind. Queries are words split on whitespace, as the log reader
splits them. What the model cannot take is adapted and counted, and the counts are printed at
the end: empty lines and empty queries are skipped, words outside the vocabulary become
`<unk>`, queries longer than the model's `max_query_words` are cut to their first words, and a
context longer than the model's query-position table (`model.max_session_queries`) keeps its
last queries.

Input is decoded in chunks of `CHUNK_BATCHES * config.decode.batch_sessions` sessions, each
chunk sorted by session length into batches `[batch_sessions, queries, tokens]` and written
out in input order before the next chunk is read, so memory stays bounded on any session file
(a raw log is held in memory as the log reader's flat columns, which sessionizing by user and
time needs).
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import os
import re
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TextIO

import ml_collections
import numpy as np

from mtn_jax import errors
from mtn_jax import inference
from mtn_jax.tasks import zero_attention
from mtn_jax.inference import retrieval
from mtn_jax.decoding import search
from mtn_jax.inference import pipeline
from mtn_jax import tasks
from mtn_jax.data import aol_log
from mtn_jax.data import extended
from mtn_jax.data.vocab import UNK_ID
from mtn_jax.data.vocab import Vocab

CHUNK_BATCHES = 8
PROGRESS_SECONDS = 10.0  # at most one progress line per this many seconds
_TIME = re.compile(r'\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}')
_GZIP_MAGIC = b'\x1f\x8b'


class DecodeInputError(errors.Error, ValueError):
  """A decode input file that cannot be read; the message names the file (and line)."""


@dataclasses.dataclass(frozen=True)
class Context:
  """One model input: a session's queries, and the positions to suggest after.

  Attributes:
    queries: the query texts the model reads (words joined by one space, each cut to
      max_query_words), at most the model's max_session_queries of them.
    first_output: suggestions are made after positions first_output..len(queries)-1.
    info: copied into every output record (the input line, or the user and session).
    first_position: the position in its session of queries[0] (> 0 when the context was cut).
    references: for a raw log, the next query after each position (None after the last).
    history: the user's earlier queries, oldest first (a raw log's earlier sessions of the
      same user; the sessions typed before this one in `suggest`), for models that
      personalise.
  """

  queries: tuple[str, ...]
  first_output: int
  info: dict
  first_position: int = 0
  references: tuple[str | None, ...] | None = None
  history: tuple[str, ...] = ()


class QueryReader:
  """Cleans and cuts query texts the way the model needs them, counting every change."""

  def __init__(self, vocab: Vocab, max_query_words: int, max_session_queries: int):
    self.vocab = vocab
    self.max_query_words = max_query_words
    self.max_session_queries = max_session_queries
    self.counts: collections.Counter = collections.Counter()

  def query(self, text: str) -> str:
    """A kept query's text: normalised as the corpus's queries are
    (`aol_log.normalize_query`: lower-case, single spaces), cut to its first
    max_query_words words (counted when cut, and its words outside the vocabulary counted)."""
    words = aol_log.normalize_query(text).split(' ') if text.split() else []
    if len(words) > self.max_query_words:
      self.counts['long_queries'] += 1
      words = words[:self.max_query_words]
    if self.vocab.kind == 'word':  # subword pieces leave no word unknown
      self.counts['oov_words'] += sum(self.vocab.id(w) == UNK_ID for w in words)
    return ' '.join(words)

  def session_line(self, line: str, number: int) -> Context | None:
    """A sessions-file line -> a Context suggesting after its last query (None: empty)."""
    texts = line.split('\t')
    kept = [t for t in texts if t.split()]
    if not kept:
      self.counts['empty_lines'] += 1
      return None
    self.counts['empty_queries'] += len(texts) - len(kept)
    if len(kept) > self.max_session_queries:
      self.counts['long_sessions'] += 1
      kept = kept[-self.max_session_queries:]
    queries = tuple(self.query(t) for t in kept)
    return Context(queries, first_output=len(queries) - 1, info={'line': number})

  def raw_session(self, texts: Sequence[str], info: dict,
                  history: tuple[str, ...] = ()) -> list[Context]:
    """A sessionized raw-log session -> Contexts suggesting after each of its queries.

    The first max_session_queries positions are decoded together from one context; each
    later position gets its own context of the last max_session_queries queries.
    """
    queries = [self.query(t) for t in texts]
    references = tuple(queries[1:]) + (None,)
    window = self.max_session_queries
    contexts = [Context(tuple(queries[:window]), 0, info, 0, references[:window], history)]
    if len(queries) > window:
      self.counts['long_sessions'] += 1
    for last in range(window, len(queries)):
      first = last - window + 1
      contexts.append(Context(tuple(queries[first:last + 1]), window - 1, info, first,
                              references[first:last + 1], history))
    return contexts


# ---------------------------------------------------------------------------------------------
# Reading decode input


def is_raw_log_line(line: str) -> bool:
  """Whether a line looks like an AOL log line or its header rather than a session."""
  if line.startswith('AnonID\t'):
    return True
  fields = line.rstrip('\r\n').split('\t')
  return (len(fields) in (3, 5) and fields[0].strip().isdigit()
          and _TIME.fullmatch(fields[2].strip()) is not None)


def _lines(path: str, strict: bool, counts: collections.Counter) -> Iterator[tuple[int, str]]:
  """(line number, text without its line end) of a text file. A line that is not UTF-8 is
  read as Latin-1, as the AOL log's few such queries are written, and counted
  ('latin1_lines'); `strict` is accepted for the callers' symmetry with the log reader."""
  del strict  # every byte string decodes as Latin-1: no line is skipped
  opener = gzip.open if _is_gzip(path) else open
  with opener(path, 'rb') as f:
    for number, raw in enumerate(f, 1):
      try:
        yield number, raw.decode('utf-8').rstrip('\r\n')
      except UnicodeDecodeError:
        counts['latin1_lines'] += 1
        yield number, raw.decode('latin-1').rstrip('\r\n')


def _is_gzip(path: str) -> bool:
  with open(path, 'rb') as f:
    return f.read(2) == _GZIP_MAGIC


def detect_format(path: str) -> str:
  """'raw' for an AOL-format log, 'sessions' for a file of tab-separated sessions."""
  opener = gzip.open if _is_gzip(path) else open
  with opener(path, 'rb') as f:
    if b'\0' in f.read(1 << 16):  # no text file holds a NUL byte; binary files mostly do
      raise DecodeInputError(f'{path}: not a text file (it holds NUL bytes): expected one '
                             'session a line (queries separated by tabs) or an AOL-format log')
  lines = 0
  for lines, line in _lines(path, strict=False, counts=collections.Counter()):
    if line.strip():
      return 'raw' if is_raw_log_line(line) else 'sessions'
  raise DecodeInputError(f'{path}: no session to decode (the file is empty'
                         + (f' but for {lines:,} blank lines)' if lines else ')'))


def read_sessions_file(path: str, reader: QueryReader, strict: bool) -> Iterator[Context]:
  """One Context per non-empty line of a sessions file."""
  for number, line in _lines(path, strict, reader.counts):
    context = reader.session_line(line, number)
    if context is not None:
      yield context


def read_raw_log(path: str, reader: QueryReader, data: ml_collections.ConfigDict,
                 chunk_sessions: int, whole_history: bool = False) -> Iterator[Context]:
  """Contexts for every query of every session of an AOL-format log.

  The log reader's line-level skips (header, malformed lines, empty queries) and removed
  successive duplicates are added to `reader.counts`. Each context's history is its user's
  last `data.history_queries` earlier queries, or all of them with `whole_history` (a user's
  habit query, `mtn_jax.habits`).
  """
  try:
    log = aol_log.read_log(path, strict=data.strict)
  except aol_log.LogFormatError as e:
    raise DecodeInputError(str(e)) from None
  reader.counts['lines_read'] += log.lines_read
  for reason, count in log.skipped.items():
    if count:
      reader.counts[f'skipped_{reason}'] += count
  # Every query is kept: long ones are cut (by QueryReader, which counts them) and sessions
  # of any length are suggested after.
  found = aol_log.sessionize(log.records, gap_minutes=data.session_gap_minutes,
                             max_query_words=reader.max_query_words, long_query='truncate',
                             min_queries=1, max_queries=max(len(log.records), 1))
  reader.counts['duplicate_queries'] += found.skipped['duplicate_query']
  # Sessions come in user, then time order: a user's history is the queries of their
  # sessions read so far, as preprocessing gives it (`data.history_queries` of them).
  kept = None if whole_history else data.history_queries
  user, earlier = None, collections.deque(maxlen=kept)
  for first in range(0, found.num_sessions, chunk_sessions):
    last = min(first + chunk_sessions, found.num_sessions)
    rows = found.record_index[found.starts[first]:found.starts[last]]
    texts = log.records.texts(rows)
    users = log.records.user[rows]
    for session in range(first, last):
      begin = int(found.starts[session] - found.starts[first])
      end = int(found.starts[session + 1] - found.starts[first])
      if int(users[begin]) != user:
        user = int(users[begin])
        earlier.clear()
      contexts = reader.raw_session(texts[begin:end], {'user': user, 'session': session},
                                    tuple(earlier) if kept != 0 else ())
      # The session's queries: the first context's, then each later context's last.
      earlier.extend(contexts[0].queries + tuple(c.queries[-1] for c in contexts[1:]))
      yield from contexts


# ---------------------------------------------------------------------------------------------
# Decoding


def encode_contexts(vocab: Vocab, contexts: Sequence[Context], rows: int, width: int,
                    max_query_words: int, history_queries: int = 0
                    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
  """(batch, lengths int64 [rows]): the batch's 'queries' and 'oov' (numbers of the words
  outside the vocabulary, `mtn_jax.data.extended`) are int32 [rows, width, max_query_words],
  'history' int32 [rows, history_queries, max_query_words] each context's last
  `history_queries` earlier queries of its user (zero rows in front where there are fewer);
  rows past the contexts are padding sessions of one all-padding query."""
  queries = np.zeros((rows, width, max_query_words), np.int32)
  oov = np.zeros((rows, width, max_query_words), np.int32)
  history = np.zeros((rows, history_queries, max_query_words), np.int32)
  lengths = np.ones(rows, np.int64)
  for row, context in enumerate(contexts):
    words = [text.split() for text in context.queries]
    for t, text in enumerate(context.queries):
      ids = vocab.encode_text(text)[:max_query_words]
      queries[row, t, :len(ids)] = ids
    earlier = context.history[-history_queries:] if history_queries else ()
    for j, text in enumerate(earlier, history_queries - len(earlier)):
      ids = vocab.encode_text(text)[:max_query_words]
      history[row, j, :len(ids)] = ids
    oov[row, :len(words)] = extended.oov_numbers(words, vocab, max_query_words)
    lengths[row] = len(context.queries)
  return {'queries': queries, 'oov': oov, 'history': history}, lengths


def ranker_inputs(retriever: retrieval.Retriever, contexts: Sequence[Context], rows: int,
                  history_queries: int) -> dict[str, np.ndarray]:
  """A ranker's per-session inputs beside `encode_contexts`': 'history_items' int32
  [rows, history_queries] (pool entries of the user's earlier queries, -1: none) and 'user'
  int32 [rows] (the training user a raw log's AnonID is, 0 for any other)."""
  items = np.full((rows, history_queries), -1, np.int32)
  users = np.zeros(rows, np.int32)
  task = retriever.trained.task
  train_users = (task.train_users if isinstance(task, zero_attention.ZeroAttentionTask)
                 else None)
  for row, context in enumerate(contexts):
    earlier = context.history[-history_queries:] if history_queries else ()
    if earlier:
      items[row, history_queries - len(earlier):] = retriever.history_items(earlier)
    if train_users is not None and 'user' in context.info:
      users[row] = zero_attention.user_index(train_users, np.array([context.info['user']]))[0]
  return {'history_items': items, 'user': users}


def decode_contexts(trained: inference.Trained, contexts: Sequence[Context], *,
                    positions: str, batch_rows: int, settings: search.SearchSettings,
                    history_queries: int = 0, width: int | None = None,
                    retriever: retrieval.Retriever | None = None,
                    rankers: pipeline.Rankers | None = None) -> list[list[list[dict]]]:
  """Suggestions for each context (in order) after each of its output positions.

  Contexts are sorted by length and decoded `batch_rows` at a time, each batch padded to its
  longest context (or to `width` queries, so that every batch has one shape): the models are
  causal over queries, so trailing padding queries change no earlier position. `positions`
  'last' decodes only each context's last query, 'all' every position (first_output onwards
  are kept). A ranker (`retriever`) suggests pool entries; a generative model searches;
  with `rankers`, the generative beam, the retriever's entries and the session's queries
  are reranked (`config.suggest.strategy='rerank'`, `mtn_jax.strategies`).
  """
  if rankers is not None:
    return _reranked(trained, contexts, positions=positions, batch_rows=batch_rows,
                     settings=settings, history_queries=history_queries, width=width,
                     rankers=rankers)
  n = trained.cfg.max_query_words
  order = sorted(range(len(contexts)), key=lambda i: len(contexts[i].queries))
  out: list[list[list[dict]] | None] = [None] * len(contexts)
  for start in range(0, len(order), batch_rows):
    group = order[start:start + batch_rows]
    group_contexts = [contexts[i] for i in group]
    batch, lengths = encode_contexts(
        trained.vocab, group_contexts, batch_rows,
        width or max(len(c.queries) for c in group_contexts), n, history_queries)
    if retriever is not None:
      batch.update(ranker_inputs(retriever, group_contexts, batch_rows, history_queries))
      lists = retriever.suggestions(
          batch, settings.top_k, [c.queries for c in group_contexts],
          exclude_session_queries=settings.exclude_session_queries)
      for row, (i, context) in enumerate(zip(group, group_contexts)):
        first = len(context.queries) - 1 if positions == 'last' else context.first_output
        out[i] = lists[row][first:]
      continue
    sequences, scores = trained.task.suggest(
        trained.params, {k: batch[k] for k in trained.task.input_keys}, settings,
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


def _reranked(trained: inference.Trained, contexts: Sequence[Context], *, positions: str,
              batch_rows: int, settings: search.SearchSettings, history_queries: int,
              width: int | None, rankers: pipeline.Rankers) -> list[list[list[dict]]]:
  """`decode_contexts` under the 'rerank' strategy: the top_k of the pooled candidates."""
  whole_lists = dataclasses.replace(settings, exclude_session_queries=False)
  common = dict(positions=positions, batch_rows=batch_rows, history_queries=history_queries,
                width=width)
  generated = decode_contexts(trained, contexts, **common,
                              settings=dataclasses.replace(whole_lists,
                                                           top_k=settings.beam_size))
  retrieved = None
  if rankers.retriever is not None:
    retrieved = decode_contexts(rankers.retriever.trained, contexts, **common,
                                settings=dataclasses.replace(whole_lists,
                                                             top_k=rankers.retrieved),
                                retriever=rankers.retriever)
  # The lists of every position 0..len-1 of each context; only the output positions hold
  # candidates.
  firsts = [len(c.queries) - 1 if positions == 'last' else c.first_output for c in contexts]
  full = lambda lists: [[[] for _ in range(first)] + [[s['query'] for s in at] for at in ranked]
                        for first, ranked in zip(firsts, lists)]
  sources = [full(generated)] + ([] if retrieved is None else [full(retrieved)])
  if rankers.proposer is not None:
    sources.append(_proposed(rankers, contexts, firsts))
  reranked = rankers.rerank([c.queries for c in contexts], sources, batch_rows=batch_rows,
                            exclude_session_queries=settings.exclude_session_queries,
                            histories=[c.history for c in contexts])
  return [[at[:settings.top_k] for at in ranked[first:]]
          for first, ranked in zip(firsts, reranked)]


def _proposed(rankers: pipeline.Rankers, contexts: Sequence[Context],
              firsts: Sequence[int]) -> list[list[list[str]]]:
  """[contexts][t] IMDNA's next queries after each output position t (none before
  firsts[i]); a context's 'user' (its info) keeps that user's own sessions out of reach."""
  at = [(i, t) for i, (c, first) in enumerate(zip(contexts, firsts))
        for t in range(first, len(c.queries))]
  users = [contexts[i].info.get('user') for i, _ in at]
  proposed = rankers.proposer.propose(
      [contexts[i].queries[:t + 1] for i, t in at], rankers.proposed,
      users=None if any(u is None for u in users) else users)
  out = [[[] for _ in c.queries] for c in contexts]
  for (i, t), queries in zip(at, proposed):
    out[i][t] = queries
  return out


def _strategy(config: ml_collections.ConfigDict, trained: inference.Trained, workdir: str
              ) -> tuple[inference.Trained, retrieval.Retriever | None,
                         pipeline.Rankers | None]:
  """(the model that suggests, its retriever if it is a ranker, the rankers of 'rerank')
  under `config.suggest.strategy`."""
  strategy = config.suggest.strategy
  if strategy == 'generate':
    return trained, _retriever(trained, workdir, config.suggest.index), None
  rankers = pipeline.Rankers.load(config, workdir, trained.vocab)
  if strategy == 'retrieve':
    return rankers.retriever.trained, rankers.retriever, None
  if isinstance(trained.task, tasks.RankingTask):
    raise errors.Error(f'config.suggest.strategy=\'rerank\' reranks a generative model\'s '
                       f'beam: {workdir} holds a {trained.cfg.name!r} ranker')
  return trained, None, rankers


def _retriever(trained: inference.Trained, workdir: str,
               index: str = 'exact') -> retrieval.Retriever | None:
  """The pool and candidate vectors of a ranker; None for a generative model."""
  if not isinstance(trained.task, tasks.RankingTask):
    return None
  return retrieval.Retriever(trained, workdir, index=index)


def score_kind(config: ml_collections.ConfigDict, retriever: retrieval.Retriever | None,
               rankers: pipeline.Rankers | None) -> str:
  """What a suggestion's 'score' is under `config`, in words (the lists' order)."""
  if rankers is not None:
    return 'expected BLEU (MBR)' if rankers.mbr else 'the ranker\'s score'
  if retriever is not None:
    return 'the ranker\'s score'
  if config.decode.rerank != 'none':
    return 'expected BLEU (MBR)'
  return 'length-normalised log-probability'


def _records(context: Context, suggestions: list[list[dict]]) -> Iterator[dict]:
  for t, ranked in zip(range(context.first_output, len(context.queries)), suggestions):
    record = dict(context.info)
    if context.references is not None:
      record['position'] = context.first_position + t
    record['context'] = list(context.queries[:t + 1])
    if context.references is not None:
      record['reference'] = context.references[t]
    record['suggestions'] = ranked
    yield record


def _chunked(items: Iterable[Context], size: int) -> Iterator[list[Context]]:
  chunk = []
  for item in items:
    chunk.append(item)
    if len(chunk) == size:
      yield chunk
      chunk = []
  if chunk:
    yield chunk


_COUNT_WORDS = {
    'latin1_lines': 'lines that are not UTF-8 read as Latin-1',
    'empty_lines': 'empty lines skipped',
    'empty_queries': 'empty queries skipped',
    'duplicate_queries': 'successive duplicate queries removed',
    'oov_words': 'words outside the vocabulary became <unk>',
    'long_queries': 'queries cut to {n} words',
    'long_sessions': 'contexts cut to their last {s} queries',
}


def describe_counts(counts: dict, max_query_words: int, max_session_queries: int) -> str:
  """The input changes in words, e.g. '3 empty lines skipped, 2 queries cut to 10 words'."""
  parts = []
  for key, words in _COUNT_WORDS.items():
    parts.append(f'{counts.get(key, 0):,} '
                 + words.format(n=max_query_words, s=max_session_queries))
  for key in sorted(k for k in counts if k.startswith('skipped_')):
    parts.append(f'{counts[key]:,} log lines skipped ({key[len("skipped_"):]})')
  return ', '.join(parts)


def _default_output(workdir: str, input_path: str) -> str:
  name = os.path.basename(input_path)
  for suffix in ('.gz', '.txt', '.tsv', '.jsonl'):
    name = name.removesuffix(suffix)
  return os.path.join(os.path.abspath(workdir), 'decode', f'{name}.suggestions.jsonl')


def decode_file(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Writes suggestions for every session of config.decode.input; returns the counts."""
  dc = config.decode
  if not dc.input:
    raise DecodeInputError('config.decode.input is empty: pass --config.decode.input=FILE '
                           '(one session a line, queries separated by tabs, or an AOL log)')
  if not os.path.isfile(dc.input):
    raise DecodeInputError(f'{dc.input}: no such decode input file')
  input_format = detect_format(dc.input)
  settings = search.SearchSettings.from_config(dc)
  trained = inference.load_trained(config, workdir, which='best')
  output = dc.output or _default_output(workdir, dc.input)
  os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  reader = QueryReader(trained.vocab, trained.cfg.max_query_words,
                       trained.cfg.max_session_queries)
  chunk_size = CHUNK_BATCHES * dc.batch_sessions
  if input_format == 'raw':
    contexts = read_raw_log(dc.input, reader, config.data, chunk_sessions=chunk_size,
                            whole_history=bool(config.suggest.habit_rate))
    positions = 'all'
  else:
    contexts = read_sessions_file(dc.input, reader, strict=config.data.strict)
    positions = 'last'
  trained, retriever, rankers = _strategy(config, trained, workdir)
  how = ('from the candidate pool' if retriever else
         f'beam {dc.beam_size}, reranked' if rankers else f'beam {dc.beam_size}')
  print(f'Decoding {dc.input} ({"AOL-format log" if input_format == "raw" else "sessions"}) '
        f'with {trained.cfg.name} (checkpoint step {trained.step}), {how}, '
        f'top {dc.top_k}; score = {score_kind(config, retriever, rankers)}.', flush=True)

  started = last_log = time.time()
  num_sessions = num_records = 0
  with open(output, 'w', encoding='utf-8') as out:
    for chunk in _chunked(contexts, chunk_size):
      suggestions = decode_contexts(trained, chunk, positions=positions,
                                    batch_rows=dc.batch_sessions, settings=settings,
                                    history_queries=config.data.history_queries,
                                    retriever=retriever, rankers=rankers)
      for context, ranked in zip(chunk, suggestions):
        for record in _records(context, ranked):
          out.write(json.dumps(record, ensure_ascii=False) + '\n')
          num_records += 1
        num_sessions += context.first_position == 0
      out.flush()
      if time.time() - last_log >= PROGRESS_SECONDS:
        last_log = time.time()
        print(f'  {num_sessions:,} sessions done '
              f'({num_sessions / (last_log - started):.1f} sessions/s)', flush=True)
  elapsed = time.time() - started
  counts = {'format': input_format, 'sessions': num_sessions, 'suggestion_points': num_records,
            **{k: reader.counts.get(k, 0) for k in _COUNT_WORDS},
            **{k: v for k, v in reader.counts.items() if k not in _COUNT_WORDS},
            'seconds': round(elapsed, 3), 'output': os.path.abspath(output)}
  print(f'Decoded {num_sessions:,} sessions ({num_records:,} suggestion points) in '
        f'{elapsed:.1f} s ({num_sessions / max(elapsed, 1e-9):.1f} sessions/s) into {output}.')
  print('Input changes: ' + describe_counts(counts, trained.cfg.max_query_words,
                                            trained.cfg.max_session_queries) + '.')
  print('Summary: ' + json.dumps(counts, sort_keys=True), flush=True)
  return counts


# ---------------------------------------------------------------------------------------------
# Interactive


def interactive(config: ml_collections.ConfigDict, workdir: str, stdin: TextIO = sys.stdin,
                stdout: TextIO = sys.stdout) -> None:
  """Suggestions after each query a person types; an empty line starts a new session.

  Every context is padded to the model's query-position table, so there is one compilation
  for the whole conversation (the models are causal over queries, so the padding changes
  nothing).
  """
  settings = search.SearchSettings.from_config(config.decode)
  trained = inference.load_trained(config, workdir, which='best')
  cfg = trained.cfg
  reader = QueryReader(trained.vocab, cfg.max_query_words, cfg.max_session_queries)
  prompt = stdin.isatty()

  def say(text: str = '') -> None:
    stdout.write(text + '\n')
    stdout.flush()

  trained, retriever, rankers = _strategy(config, trained, workdir)
  say(f'{cfg.name} (checkpoint step {trained.step}, {len(trained.vocab):,} words; score = '
      f'{score_kind(config, retriever, rankers)}). Type a query per line; an empty line '
      'starts a new session; end with Ctrl-D.')
  session: list[str] = []
  # The queries of the sessions typed before this one: the history of a model that
  # personalises.
  earlier: list[str] = []
  while True:
    if prompt:
      stdout.write('query> ')
      stdout.flush()
    line = stdin.readline()
    if not line:
      break
    if not line.strip():
      if session:
        say('-- new session --')
      earlier += session
      session = []
      continue
    oov_before, long_before = reader.counts['oov_words'], reader.counts['long_queries']
    session = (session + [reader.query(line)])[-cfg.max_session_queries:]
    context = Context(tuple(session), first_output=len(session) - 1, info={},
                      history=tuple(earlier))
    [[ranked]] = decode_contexts(trained, [context], positions='last', batch_rows=1,
                                 settings=settings,
                                 history_queries=config.data.history_queries,
                                 width=cfg.max_session_queries, retriever=retriever,
                                 rankers=rankers)
    unknown = reader.counts['oov_words'] - oov_before
    notes = [f'{unknown} word(s) outside the vocabulary read as <unk>'] if unknown else []
    if reader.counts['long_queries'] > long_before:
      notes.append(f'query cut to its first {cfg.max_query_words} words')
    note = f' ({"; ".join(notes)})' if notes else ''
    say(f'after {" | ".join(session)}{note}:')
    for rank, suggestion in enumerate(ranked, 1):
      say(f'  {rank}. {suggestion["query"]}  ({suggestion["score"]:.3f})')
  say()
