"""Reading sessions for suggestion: a file (`--mode=decode`), typed queries (`--mode=suggest`)
or a request, into `Context`s the suggestion pipeline takes, and contexts into model batches
(`context_batch`), and a whole split into evaluation's batches (`split_batches`): what the
model reads is its task's `context_inputs` in both.

Decode input (plain or gzip, told by its first bytes) is in one of two forms, told apart by
its first `FORMAT_LINES` non-empty lines (a first line that is the log's `AnonID` header
makes a log, else the form at least half of them have: a log whose first line is malformed is
still a log):
  sessions  one session a line, its queries separated by tabs; suggestions are made after the
            LAST query of each line;
  raw log   an AOL-format log (`AnonID` header line, or tab-separated fields, a user first
            and a `YYYY-MM-DD HH:MM:SS` time third, or an AnonID first and a time in another
            form third, a malformed line: a log of no other is refused, naming the form a
            time takes): read and sessionized by
            `mtn_jax.data.aol_log` with the data config's rules (session gap, successive
            duplicates removed), over-long queries cut rather than dropped and sessions of any
            length kept; suggestions are made after every query of every session, with the
            next query as the reference where there is one.
A sessions file's line that is a log's is skipped and counted (the form was told by the first
lines). Queries are normalised as the corpus's are (`aol_log.normalize_query`: lower-cased,
words on single spaces), a line that is not UTF-8 is read as Latin-1 (counted), and a line
holding an ASCII control character (NUL, ESC) is skipped and counted, as the log reader skips
a log's (a file of many control bytes is no text, refused). What the model
cannot take is adapted and counted: empty lines and empty queries are skipped, words outside
the vocabulary become `<unk>`, queries longer than the words the model reads
(`Trained.query_words`) are cut to their first words (with subword pieces, a query of more
pieces than the model's slots is counted: the model reads its first pieces, as the corpus's
were cut), and a context longer than the model's query-position table
(`model.max_session_queries`) keeps its last queries.
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import os
import re
import zlib
from collections.abc import Iterator, Sequence
from typing import BinaryIO

import ml_collections
import numpy as np

from mtn_jax import errors
from mtn_jax.data import aol_log
from mtn_jax.data import candidate_pool
from mtn_jax.data import input_pipeline
from mtn_jax.data import sessions
from mtn_jax.data.vocab import UNK_ID
from mtn_jax.data.vocab import Vocab

_TIME = re.compile(r'\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}')
# A date and a time of day in another form than the log's (ISO's `2006-03-01T15:58:56`,
# `2006/03/01 15:58`, `03/01/2006 3:58 PM`, ...): after an AnonID of digits, a log's line
# (`is_raw_log_line`) whose time the log reader counts as bad, not a session's queries.
_OTHER_TIME = re.compile(r'\d{1,4}[-/.]\d{1,2}[-/.]\d{1,4}[T\s]+\d{1,2}:\d{2}')
_ANON_ID = re.compile(r'[0-9]+')
# Characters a query may not hold: the log's control characters (`aol_log.CONTROL_CHARACTERS`:
# NUL, ESC, the C1 controls, ...), and lone surrogates (not text).
_REFUSED_CHARACTER = re.compile(rf'[{aol_log.CONTROL_CHARACTERS}\ud800-\udfff]')
_REFUSED_IN_A_FILE = re.compile(f'[{aol_log.ASCII_CONTROL_CHARACTERS}]')


def refused_character(text: str, in_a_file: bool = False) -> str | None:
  """The first character of `text` that no query may hold, named ('the control character
  U+0007', 'the lone surrogate U+D800'), else None: a typed query or a request holding one
  is asked again or refused. `in_a_file`: a decode input's line, whose ASCII control
  characters alone are refused, as the log reader's (`aol_log.ASCII_CONTROL_CHARACTERS`)."""
  found = (_REFUSED_IN_A_FILE if in_a_file else _REFUSED_CHARACTER).search(text)
  if found is None:
    return None
  code = ord(found.group())
  kind = 'lone surrogate' if 0xD800 <= code <= 0xDFFF else 'control character'
  return f'the {kind} U+{code:04X}'


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

  def __init__(self, vocab: Vocab, max_query_words: int, max_session_queries: int,
               token_slots: int | None = None):
    """`max_query_words`: the most words a query keeps (`Trained.query_words`);
    `token_slots`: with subword pieces, the model's slots a query (`ModelConfig`'s
    max_query_words)."""
    self.vocab = vocab
    self.max_query_words = max_query_words
    self.max_session_queries = max_session_queries
    self.token_slots = token_slots
    self.counts: collections.Counter = collections.Counter()

  @classmethod
  def for_model(cls, trained) -> QueryReader:
    """The reader of `trained`'s (an `inference.Trained`) queries, as its corpus read them."""
    return cls(trained.vocab, trained.query_words, trained.cfg.max_session_queries,
               trained.cfg.max_query_words)

  @property
  def limit(self) -> str:
    """What a query is cut to, in words: '10 words', or '10 words, the model reading its
    first 24 subword pieces'."""
    if self.vocab.kind == 'word' or self.token_slots is None:
      return f'{self.max_query_words} words'
    return (f'{self.max_query_words} words, the model reading its first {self.token_slots} '
            'subword pieces')

  def query(self, text: str) -> str:
    """A kept query's text: normalised as the corpus's queries are
    (`aol_log.normalize_query`: lower-case, single spaces), cut to its first max_query_words
    words (counted when cut, and its words outside the vocabulary counted). With subword
    pieces, a query of more pieces than the model's slots is counted too: the model reads its
    first pieces (`context_split`), as the corpus's queries were cut."""
    words = aol_log.normalize_query(text).split(' ') if text.split() else []
    kept = ' '.join(words[:self.max_query_words])
    if len(words) > self.max_query_words or (
        self.vocab.kind != 'word' and self.token_slots is not None
        and len(self.vocab.encode_text(kept)) > self.token_slots):
      self.counts['long_queries'] += 1
    if self.vocab.kind == 'word':  # subword pieces leave no word unknown
      self.counts['oov_words'] += sum(self.vocab.id(w) == UNK_ID for w in kept.split())
    return kept

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


def is_raw_log_line(line: str) -> bool:
  """Whether a line looks like an AOL log line or its header (`aol_log.is_header`) rather
  than a session: a user (one token), then a query and a time. A line of another field count,
  or whose user is no AnonID ('-7', 'u7', none), is a malformed log line, which the log reader
  counts by reason, not a session whose queries are a user id and a time; a first field of
  several words is a query. So is a line of 3 or 5 fields, an AnonID of digits first and a
  time in another form third (`_OTHER_TIME`): read as a session, its id and time would be
  suggested after; a log's, its time is refused by name."""
  if aol_log.is_header(line):
    return True
  fields = line.rstrip('\r\n').split('\t')
  if (len(fields) >= 3 and len(fields[0].split()) <= 1
      and _TIME.fullmatch(fields[2].strip()) is not None):
    return True
  return (len(fields) in (3, 5) and _ANON_ID.fullmatch(fields[0]) is not None
          and _OTHER_TIME.match(fields[2].strip()) is not None)


def _lines(path: str, counts: collections.Counter) -> Iterator[tuple[int, str]]:
  """(line number, text without its line end) of a text file (a UTF-8 byte-order mark
  before line 1 is no part of it). A query that is not UTF-8 is read as Latin-1, as the AOL
  log's few such queries are written, and its line counted ('latin1_lines'): every byte
  string decodes so, and no line is skipped. A line ends at LF, CR LF or a lone CR (a file
  of old Mac line ends is as many lines, not one)."""
  number = 0
  try:
    with _open(path) as f:
      for index, raw in enumerate(f):
        if not index:
          raw = raw.removeprefix(aol_log.UTF8_BOM)
        text, latin1 = aol_log.decode_fields(raw)
        if latin1:
          counts['latin1_lines'] += 1
        for line in text.rstrip('\r\n').split('\r'):
          number += 1
          yield number, line
  except (gzip.BadGzipFile, EOFError, zlib.error) as e:
    raise DecodeInputError(f'{path}: corrupt or truncated gzip data after line {number:,} '
                           f'({e})') from None


def _open(path: str) -> BinaryIO:
  try:
    return aol_log.open_bytes(path)
  except aol_log.LogFormatError as e:  # another compression: named as decode's input
    raise DecodeInputError(str(e)) from None


# The non-empty lines a decode input's form is told by (the module docstring).
FORMAT_LINES = 100
# A file whose first bytes are more than 1 / BINARY_SHARE control bytes, at least
# BINARY_MIN_BYTES of them, is no text.
BINARY_SHARE = 20
BINARY_MIN_BYTES = 8


def detect_format(path: str) -> str:
  """'raw' for an AOL-format log (its first non-empty line the `AnonID` header, or at least
  half of its first FORMAT_LINES non-empty lines a log's), 'sessions' for a file of
  tab-separated sessions."""
  if os.path.isdir(path):
    raise DecodeInputError(f'{path}: a folder, not a decode input file')
  if os.path.exists(path) and not os.path.isfile(path):
    # A pipe gives its lines once; the input is read twice (its format, then its lines).
    raise DecodeInputError(f'{path}: not a regular file (a pipe or a device): write the '
                           'input to a file and give that')
  with _open(path) as f:
    try:
      head = f.read(1 << 16)
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
      raise DecodeInputError(f'{path}: corrupt or truncated gzip data ({e})') from None
    # Text holds control bytes in a few lines (a stray NUL, a typed escape sequence: those
    # lines are skipped and counted), binary data and UTF-16 text throughout.
    controls = int(np.count_nonzero(aol_log.CONTROL_BYTE[np.frombuffer(head, np.uint8)]))
    if controls >= BINARY_MIN_BYTES and controls * BINARY_SHARE > len(head):
      raise DecodeInputError(f'{path}: not a text file ({controls:,} of its first '
                             f'{len(head):,} bytes are control bytes such as NUL): expected '
                             'one session a line (queries separated by tabs) or an AOL-format '
                             'log')
  lines = raw = read = 0
  for lines, line in _lines(path, collections.Counter()):
    if line.strip():
      if not read and aol_log.is_header(line):
        # The log's header: a log whatever its lines hold (the log reader counts, or names,
        # what is wrong with them), never sessions whose queries are its fields.
        return 'raw'
      raw += is_raw_log_line(line)
      read += 1
      if read == FORMAT_LINES:
        break
  if not read:
    raise DecodeInputError(f'{path}: no session to decode (the file is empty'
                           + (f' but for {lines:,} blank lines)' if lines else ')'))
  return 'raw' if 2 * raw >= read else 'sessions'


def read_sessions_file(path: str, reader: QueryReader, strict: bool) -> Iterator[Context]:
  """One Context per non-empty line of a sessions file. A line holding a control character
  (`refused_character`) or a line of an AOL log (`is_raw_log_line`: its user and time
  would be read as queries; the file's first lines read as sessions) is skipped and counted
  ('control_character_lines', 'log_lines'); with `strict`, the first raises naming it. Every
  line is counted ('lines_read'): sessions + empty_lines + control_character_lines +
  log_lines."""
  for number, line in _lines(path, reader.counts):
    reader.counts['lines_read'] += 1
    if is_raw_log_line(line):
      if strict:
        raise DecodeInputError(
            f'{path}:{number}: a line of an AOL-format log in a file read as sessions (most '
            f'of its first {FORMAT_LINES} lines are sessions): give the log or the sessions '
            'alone')
      reader.counts['log_lines'] += 1
      continue
    if refused := refused_character(line, in_a_file=True):
      if strict:
        raise DecodeInputError(f'{path}:{number}: the line holds {refused}')
      reader.counts['control_character_lines'] += 1
      continue
    context = reader.session_line(line, number)
    if context is not None:
      yield context


_LOG_COUNTS = {'empty_line': 'empty_lines', 'empty_query': 'empty_queries',
               'control_character': 'control_character_lines'}


def read_raw_log(path: str, reader: QueryReader, data: ml_collections.ConfigDict,
                 chunk_sessions: int, past_queries: int = 0) -> Iterator[Context]:
  """Contexts for every query of every session of an AOL-format log.

  The log reader's line-level skips (header, malformed lines, empty queries), its lines read
  as Latin-1 and the removed successive duplicates are added to `reader.counts`. Each
  context's history is its user's latest `past_queries` earlier queries (what the pipeline
  reads, `Pipeline.past_read`).
  """
  try:
    log = aol_log.read_log(path, strict=data.strict)
  except aol_log.LogFormatError as e:
    raise DecodeInputError(str(e)) from None
  reader.counts['lines_read'] += log.lines_read
  reader.counts['latin1_lines'] += log.latin1_lines
  # Its empty lines and queries and its lines holding a control character as a sessions
  # file's are counted; its other skips by reason.
  for reason, count in log.skipped.items():
    if count:
      reader.counts[_LOG_COUNTS.get(reason, f'skipped_{reason}')] += count
  # Every query is kept: long ones are cut (by QueryReader, which counts them) and sessions
  # of any length are suggested after.
  found = aol_log.sessionize(log.records, gap_minutes=data.session_gap_minutes,
                             max_query_words=reader.max_query_words, long_query='truncate',
                             min_queries=1, max_queries=max(len(log.records), 1))
  reader.counts['duplicate_queries'] += found.skipped['duplicate_query']
  # Sessions come in user, then time order: a user's history is the queries of their
  # sessions read so far, as preprocessing gives it (the latest `past_queries` of them).
  user, earlier = None, collections.deque(maxlen=past_queries)
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
                                    tuple(earlier))
      # The session's queries: the first context's, then each later context's last.
      earlier.extend(contexts[0].queries + tuple(c.queries[-1] for c in contexts[1:]))
      yield from contexts


def split_batches(task, vocab: Vocab, split: sessions.SessionSplit, *, queries_per_batch: int,
                  multiple_of: int = 1, process_index: int = 0, process_count: int = 1,
                  per_query: dict[str, np.ndarray] | None = None):
  """Evaluation's batches of a whole split (`input_pipeline.make_eval_iterator`), with the
  model inputs its task reads (`context_inputs`) and `per_query`'s arrays."""
  inputs = task.context_inputs(split, vocab)
  return input_pipeline.make_eval_iterator(
      split, queries_per_batch=queries_per_batch, multiple_of=multiple_of,
      process_index=process_index, process_count=process_count,
      per_query={**inputs.per_query, **(per_query or {})}, per_session=inputs.per_session)


def context_split(contexts: Sequence[Context], vocab: Vocab, max_query_words: int,
                  history_queries: int = 0, pool: candidate_pool.CandidatePool | None = None
                  ) -> sessions.SessionSplit:
  """`contexts` as a split of their own, with what preprocessing writes of a corpus's
  sessions: the queries encoded by `vocab` (cut to `max_query_words` tokens); 'history' each
  context's last `history_queries` earlier queries of its user, zero rows in front where
  there are fewer; with `pool`, 'history_items' their pool entries (-1: none, or outside the
  pool); 'users' the user its info names (-1: none)."""
  encode = lambda text: vocab.encode_text(text)[:max_query_words]
  texts = [text for context in contexts for text in context.queries]
  queries = np.zeros((len(texts), max_query_words), np.int32)
  for row, text in enumerate(texts):
    ids = encode(text)
    queries[row, :len(ids)] = ids
  starts = np.concatenate([[0], np.cumsum([len(c.queries) for c in contexts])]).astype(np.int64)
  history = np.zeros((len(contexts), history_queries, max_query_words), np.int32)
  items = (np.full((len(contexts), history_queries), -1, np.int32) if pool is not None
           else None)
  for i, context in enumerate(contexts):
    earlier = context.history[-history_queries:] if history_queries else ()
    first = history_queries - len(earlier)
    for j, text in enumerate(earlier, first):
      ids = encode(text)
      history[i, j, :len(ids)] = ids
    if items is not None and earlier:
      items[i, first:] = pool.ids_of(list(earlier))
  users = np.array([context.info.get('user', -1) for context in contexts], np.int64)
  return sessions.SessionSplit('contexts', queries, starts, users=users, history=history,
                               history_items=items, text_lines=tuple(texts))


def context_batch(task, vocab: Vocab, contexts: Sequence[Context], *, rows: int, width: int,
                  history_queries: int = 0, pool: candidate_pool.CandidatePool | None = None
                  ) -> tuple[dict[str, np.ndarray], np.ndarray]:
  """(batch, lengths int64 [rows]): the model inputs of `contexts` for `task`'s model, made
  by the task (`context_inputs`) from `context_split` as evaluation's are from the corpus,
  'queries' and the per-query inputs [rows, width, ...]; rows past the contexts are padding
  sessions of one all-padding query."""
  split = context_split(contexts, vocab, task.cfg.max_query_words, history_queries, pool)
  inputs = task.context_inputs(split, vocab)
  batch = input_pipeline.padded_batch(split, rows=rows, width=width,
                                      per_query=inputs.per_query,
                                      per_session=inputs.per_session)
  lengths = np.ones(rows, np.int64)
  lengths[:len(contexts)] = split.lengths
  return batch, lengths
