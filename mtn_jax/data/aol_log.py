"""Reads AOL-format query logs into columnar records and cuts them into sessions.

In: log files in the AOL collection's tab-separated form, one query event a line,

    AnonID <TAB> Query <TAB> QueryTime [<TAB> ItemRank <TAB> ClickURL]

(3 or 5 fields; ItemRank and ClickURL may be empty; QueryTime is `YYYY-MM-DD HH:MM:SS`),
optional `AnonID ...` header lines (a file's first, and any inside it where files were
joined), plain or gzip (told by the magic bytes, not the name), `\\n` or `\\r\\n` line ends
(lone `\\r` ones too, as old Mac files end lines, where the file's first block holds no
`\\n`), users interleaved and lines in any order.

Out of `read_logs`: `LogLines`, holding `Records` (one row per line that parses and holds a
query, as flat numpy columns `[num_records]`, plus the cleaned texts back to back in one byte
array) and the count of lines skipped by each line-level reason. Out of `sessionize`:
`Sessions`, the record indices of every kept session (`[num_kept_queries]`, session after
session, in user then time order) with row offsets `[num_sessions + 1]`, and the count of
records dropped by each session-level reason.

Query cleaning (`normalize_query`, shared with the decode and suggest input): a query is in
Unicode's NFKC form (where that is no longer), without bidirectional controls, lower-cased,
its words are its whitespace-separated tokens (Python's `str.split()`, so any Unicode
whitespace separates), and its text is those words joined by one space; punctuation is left
untouched. A line that is not
UTF-8 is no bad line: each of its fields that is not UTF-8 is read as Latin-1 (`decode_text`;
the AOL log's few such queries are Latin-1), so its query is kept like any other, and the line
is counted in `LogLines.latin1_lines` (beside, not among, the skip reasons: such a line is then
kept or skipped like any other, and still `lines_read` = kept queries + skipped lines). This is
what reproduces the documented figures of the real 500-user AOL sample: 11,231 sessions, 28,914
pairs, 2,851 words seen at least 8 times in them, and `BLEU = 11.89, 25.2/14.8/9.2/6.2` for
suggesting the previous query again, over all pairs. Replacing every non-alphanumeric character
with a space (which would turn `www.myspace.com` into the paper's `www myspace com`) gives
11,217 sessions, 28,877 pairs and `BLEU = 12.10, 25.5/14.9/9.4/6.3` instead, so the sample
was not made that way.
The AOL log is lower-case already: lower-casing changes one query of the sample's 157,074
(line 83,527, `hermTs gardens & homes houston`, a session of one query, so the corpus stays
the same); it makes a typed `CHEAP FLIGHTS` read as the log's `cheap flights`.

Rules, in order. Every line read is counted exactly once: as a query of a kept session, or
under the first reason of `REASONS` that applies to it.
1. Line checks (`read_logs`): `header` (a line whose first field is `AnonID`: a file's
   first, or one inside a file where logs were joined; a UTF-8 byte-order mark before it is
   no part of it), `empty_line` (nothing on the line),
   `bad_field_count` (not 3 or 5 tab-separated fields), `bad_user_id` (AnonID is not 1 to 18
   digits), `bad_time` (not a valid `YYYY-MM-DD HH:MM:SS`), `control_character` (the query
   holds an ASCII control character other than whitespace, such as NUL or ESC: no typed
   query does, and the service refuses them, `ASCII_CONTROL_CHARACTERS`), `empty_query` (no
   words, or the log's `-` placeholder for a removed query). The four before `empty_query` are
   malformed lines: with `strict=True` the first of them raises
   `LogFormatError` naming `file:line` and the reason (`-` queries are the real log's own
   content, so strict mode only counts them). Lines skipped here take no part in sessions.
2. Sessions (`sessionize`): per user, records in time order; equal times keep their input
   order (files in the order given). A record starts a new session when it comes
   `gap_minutes` or more after the user's previous record: a gap of exactly 30:00 splits, 29:59
   does not. Records dropped in the steps below still count as activity for this gap, as the
   sample's documented figures require (measuring gaps between surviving queries only gives
   11,171 sessions).
3. `duplicate_query`: a record whose text equals that of the record just before it in its
   session (the log repeats a query for every click). A query that comes back after another
   one stays. Texts are compared by byte length and a 64-bit hash that weights each byte by a
   pseudo-random number of its position: two different texts of equal length collide with
   odds of at most about 2^-57 per comparison, so no wrong merge is expected over the whole
   AOL log.
4. `long_query`, for a query of more than `max_query_words` words (step 3 compares full
   queries, before any truncation):
   - `drop_session` (the paper's "considered queries with length at most 10", default): the
     whole session is discarded and all its remaining records are counted as `long_query`;
   - `split_session`: the long query is dropped (`long_query`) and its session is cut in two
     there; each piece is then filtered as a session of its own;
   - `truncate`: the query keeps its first `max_query_words` words; nothing is dropped.
5. `session_too_short` / `session_too_long`: sessions with fewer than `min_queries` or more
   than `max_queries` queries are discarded with all their records.

Speed: the parsing is numpy over 16 MiB chunks of whole lines, with no Python object per
line (only the rare non-ASCII or oddly spaced queries go through `str.split()`); large inputs
are read one file per process (so a script that calls this on them needs the usual
`if __name__ == '__main__':` guard); sorted input, like the AOL files, is sessionized without
sorting. docs/PERFORMANCE.md has the figures.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import glob
import gzip
import itertools
import multiprocessing
import os
import re
import tempfile
import unicodedata
import zlib
from collections.abc import Iterator, Sequence
from typing import BinaryIO

import numpy as np

from mtn_jax import errors

LINE_REASONS = ('header', 'empty_line', 'bad_field_count', 'bad_user_id', 'bad_time',
                'control_character', 'empty_query')
SESSION_REASONS = ('duplicate_query', 'long_query', 'session_too_short', 'session_too_long')
REASONS = LINE_REASONS + SESSION_REASONS
MALFORMED = ('bad_field_count', 'bad_user_id', 'bad_time', 'control_character')
LONG_QUERY_POLICIES = ('drop_session', 'split_session', 'truncate')

_WHY = {
    'bad_field_count': 'expected 3 or 5 tab-separated fields '
                       '(AnonID, Query, QueryTime[, ItemRank, ClickURL])',
    'bad_user_id': 'AnonID is not a number of 1 to 18 digits',
    'bad_time': 'QueryTime is not a valid YYYY-MM-DD HH:MM:SS',
    'control_character': 'the query holds an ASCII control character (NUL, ESC, ...)',
}
# Characters no query may hold: the control characters other than whitespace (NUL, BEL, ESC,
# DEL, and for a typed query or a request the C1 controls too). Whitespace, tab and newline
# included, separates words. Regular expression class bodies, in the syntax Python and JSON
# Schema (ECMA-262) share (the service's OpenAPI description). A file's lines are checked for
# the ASCII ones (the C1 controls are in a log's Latin-1 lines the Windows code page's
# punctuation, kept).
ASCII_CONTROL_CHARACTERS = r'\x00-\x08\x0e-\x1b\x7f'
CONTROL_CHARACTERS = ASCII_CONTROL_CHARACTERS + r'\x80-\x84\x86-\x9f'
# bool [256]: the ASCII control characters, by byte.
CONTROL_BYTE = np.array([re.fullmatch(f'[{ASCII_CONTROL_CHARACTERS}]', chr(b)) is not None
                         for b in range(0x100)])
# A line's status: 0 for a record, else 1 + the index of its reason in LINE_REASONS.
_RECORD = 0
_CODE = {reason: i + 1 for i, reason in enumerate(LINE_REASONS)}
_MALFORMED_CODES = np.array([_CODE[r] for r in MALFORMED])
# Lines whose AnonID and QueryTime parse: a file without any is not a query log.
_PARSED_CODES = np.array([_RECORD, _CODE['control_character'], _CODE['empty_query']])

# Big enough that numpy's per-call overhead vanishes, small enough that the per-byte
# temporaries of a chunk stay a small part of a machine's memory.
CHUNK_BYTES = 16 << 20
# Below this much input, starting worker processes costs more than it saves.
PARALLEL_MIN_BYTES = 32 << 20
# A file none of whose first lines parses is not a query log: stop reading it there.
_SNIFF_LINES = 1000
_MAX_USER_DIGITS = 18  # any such number fits in int64
_DEL = 0x7f
_TIME_LEN = len('2006-03-01 15:58:56')
_TIME_DIGITS = np.array([0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18])
_TIME_SEPARATORS = {4: ord('-'), 7: ord('-'), 10: ord(' '), 13: ord(':'), 16: ord(':')}
# Bytes that make a query need str.split() itself: the whitespace it knows besides the space
# (tabs and newlines never occur inside a field), and non-ASCII bytes, as UTF-8 has more.
_NEEDS_STR_SPLIT = np.zeros(256, bool)
_NEEDS_STR_SPLIT[[11, 12, 13, 28, 29, 30, 31]] = True
_NEEDS_STR_SPLIT[0x80:] = True
_NEWLINE, _TAB, _CR, _SPACE, _DASH = (ord(c) for c in '\n\t\r -')
_GZIP_MAGIC = b'\x1f\x8b'
# What a file of another compression starts with: refused by name, not read as text.
_OTHER_COMPRESSIONS = {b'BZh': 'bzip2', b'\xfd7zXZ\x00': 'xz', b'PK\x03\x04': 'zip',
                       b'\x28\xb5\x2f\xfd': 'zstd', b'7z\xbc\xaf\x27\x1c': '7z'}
_HEADER_FIELD = 'AnonID'
UTF8_BOM = b'\xef\xbb\xbf'
# A refused file's first bad line is shown cut to this many characters (a line may be long).
_SHOWN_CHARACTERS = 80


# Characters whose lower case is longer in UTF-8 than they are (Unicode 14; a test checks the
# running Python's tables). The reader cleans a query inside its field, which cannot grow, so
# these get a lower case of their own: the Turkish dotted capital I becomes the plain 'i' a
# user types (`str.lower` adds a combining dot above), the two rare letters keep their case.
_LOWER_CASE_EXCEPTIONS = {'\u0130': 'i', '\u023a': '\u023a', '\u023e': '\u023e'}
_LOWER_CASE_EXCEPTION = re.compile('([' + ''.join(_LOWER_CASE_EXCEPTIONS) + '])')
# Unicode's bidirectional embeddings, overrides and isolates: invisible, and a query holding
# one shows its text (or a suggestion made of it, the text after it) in another order than
# it reads ("Trojan Source"). No query needs them: they are dropped.
_BIDI_CONTROLS = re.compile('[\u202a-\u202e\u2066-\u2069]')


def normalize_query(text: str) -> str:
  """A query as the corpus holds it: in Unicode's compatibility composition (NFKC), its
  bidirectional controls dropped, lower-cased, words split on any whitespace and joined by
  one space (`CHEAP\u00a0 Flights ` -> `cheap flights`); punctuation is left as it is.

  The log reader cleans every log line this way (vectorised for plain ASCII), and the decode
  and suggest input should too, so that typed queries meet the vocabulary's words. The UTF-8
  result is never longer than `text`'s: `str.lower()` except for `_LOWER_CASE_EXCEPTIONS`,
  and NFKC only where it is not longer.
  """
  if not text.isascii():
    # One spelling of what looks the same, as search engines fold queries: a 'u' and a
    # combining diaeresis (macOS and iOS keyboards) is the one 'ü', full-width 'ｉｐｈｏｎｅ' is
    # 'iphone'. The reader cleans a query inside its field, which cannot grow: the rare
    # query NFKC would lengthen ('½' -> '1⁄2') keeps its form, here as in every reader.
    folded = unicodedata.normalize('NFKC', text)
    size = lambda t: len(t.encode('utf-8', 'surrogatepass'))
    if size(folded) <= size(text):
      text = folded
    text = _BIDI_CONTROLS.sub('', text)
  if _LOWER_CASE_EXCEPTION.search(text):
    pieces = _LOWER_CASE_EXCEPTION.split(text)  # odd positions hold the exceptions
    text = ''.join(_LOWER_CASE_EXCEPTIONS[p] if i % 2 else p.lower()
                   for i, p in enumerate(pieces))
  else:
    text = text.lower()
  return ' '.join(text.split())


def decode_text(raw: bytes) -> tuple[str, bool]:
  """(text, was_latin1): `raw` decoded as UTF-8 where it is valid UTF-8, else as Latin-1.

  Every byte string is valid Latin-1 (each byte is one character), which is how the AOL
  log's few non-UTF-8 queries are written (`caf\\xe9` is `caf\u00e9`), so nothing is lost or
  refused. For a line of several fields, decode each field on its own (as the log reader
  does), so that one Latin-1 field leaves a UTF-8 query as it is.
  """
  try:
    return raw.decode('utf-8'), False
  except UnicodeDecodeError:
    return raw.decode('latin-1'), True


def _latin1_lines_to_utf8(buf: bytearray) -> tuple[bytearray, int]:
  """`buf` (whole lines) in UTF-8, and the number of lines that were not.

  In such a line each tab-separated field that is not UTF-8 is read as Latin-1
  (`decode_text`) and re-encoded; its other fields stay as they are. Checked a chunk at a
  time, as almost every chunk is ASCII or UTF-8 throughout.
  """
  if not np.count_nonzero(np.frombuffer(buf, np.uint8) >= 0x80):
    return buf, 0
  try:
    buf.decode('utf-8')
    return buf, 0
  except UnicodeDecodeError:
    pass
  lines, count = bytes(buf).split(b'\n'), 0
  for i, line in enumerate(lines):
    text, latin1 = decode_fields(line)
    if latin1:
      lines[i] = text.encode('utf-8')
      count += 1
  return bytearray(b'\n'.join(lines)), count


def is_header(line: str) -> bool:
  """Whether a log's line (its text without the line end) is an `AnonID` header line: its
  first field is `AnonID` (a UTF-8 byte-order mark before it no part of it, as where files
  were joined). The reader skips such lines, and decode reads a file that starts with one as
  a log."""
  return line.removeprefix('\ufeff').split('\t', 1)[0] == _HEADER_FIELD


def decode_fields(line: bytes) -> tuple[str, bool]:
  """(text, was_latin1) of a line of tab-separated fields: where the line is not UTF-8, each
  field that is not is read as Latin-1 (`decode_text`), the others as they are."""
  text, latin1 = decode_text(line)
  if latin1:
    text = '\t'.join(decode_text(field)[0] for field in line.split(b'\t'))
  return text, latin1


class LogFormatError(errors.Error, ValueError):
  """A file that cannot be read as a query log; the message names the file (and line)."""


class MissingLogError(errors.Error, FileNotFoundError):
  """A log file that does not exist, or a glob that matches none."""


class LogListError(errors.Error, ValueError):
  """A list of log files that names one file twice (its lines would count twice)."""


@dataclasses.dataclass(frozen=True)
class Records:
  """Lines that passed the line checks, in input order, as flat columns.

  `user` int64, `time` int64 (seconds since 1970-01-01 00:00:00 on the log's clock),
  `num_words` int32, `text_len` int32 (bytes of the cleaned text), `text_hash` uint64: each
  `[num_records]`; `text` uint8 `[sum(text_len + 1)]`: the cleaned UTF-8 texts back to back,
  each followed by a newline.
  """

  user: np.ndarray
  time: np.ndarray
  num_words: np.ndarray
  text_len: np.ndarray
  text_hash: np.ndarray
  text: np.ndarray

  def __len__(self) -> int:
    return len(self.user)

  @classmethod
  def concatenate(cls, parts: Sequence[Records]) -> Records:
    return cls(*(np.concatenate([getattr(p, f.name) for p in parts])
                 for f in dataclasses.fields(cls)))

  @functools.cached_property
  def text_offsets(self) -> np.ndarray:
    """int64 [num_records + 1]: record i's text and newline are `text[o[i]:o[i + 1]]`."""
    offsets = np.zeros(len(self) + 1, np.int64)
    np.cumsum(self.text_len + 1, out=offsets[1:])
    return offsets

  def texts(self, index: np.ndarray, batch: int = 1 << 20) -> list[str]:
    """The cleaned texts of records `index` (int [k]), in that order."""
    out = []
    for begin in range(0, len(index), batch):
      out += self._texts(index[begin:begin + batch])
    return out

  def _texts(self, index: np.ndarray) -> list[str]:
    # One gather and one decode for the whole batch: a Python slice and decode per record
    # would be the slowest step of preprocessing the full log.
    if not len(index):
      return []
    begin, end = self.text_offsets[index], self.text_offsets[index + 1]
    if np.all(index[1:] > index[:-1]):  # sessions of sorted input: a mask, no byte indices
      first = begin[0]
      joined = self.text[first:end[-1]][_runs_mask(begin - first, end - first,
                                                   end[-1] - first)]
    else:
      lengths = end - begin
      joined = self.text[np.arange(int(lengths.sum()))
                         + np.repeat(begin - (np.cumsum(lengths) - lengths), lengths)]
    return joined.tobytes().decode('utf-8').split('\n')[:-1]


@dataclasses.dataclass(frozen=True)
class LogLines:
  """What reading gave: the records, and the lines skipped by each of LINE_REASONS."""

  records: Records
  skipped: dict[str, int]
  lines_read: int
  # Lines holding bytes that are not UTF-8, whose such fields were read as Latin-1; each is
  # also a record or a skipped line, like any other line.
  latin1_lines: int = 0


@dataclasses.dataclass(frozen=True)
class Sessions:
  """Kept sessions: session i is records `record_index[starts[i]:starts[i + 1]]`.

  `record_index` int64 [num_kept_queries], `starts` int64 [num_sessions + 1]; `skipped`
  counts the records dropped by each of SESSION_REASONS.
  """

  record_index: np.ndarray
  starts: np.ndarray
  skipped: dict[str, int]

  @property
  def num_sessions(self) -> int:
    return len(self.starts) - 1


def expand_paths(spec: str) -> list[str]:
  """Files of a comma-separated list of paths and globs; each glob's matches sorted."""
  paths = []
  for item in (s.strip() for s in spec.split(',')):
    if not item:
      continue
    if glob.has_magic(item) and not os.path.exists(item):  # a file named `log[1].tsv` is a file
      matches = sorted(glob.glob(item))
      if not matches:
        raise MissingLogError(f'log glob {item!r} matches no file')
      paths += matches
    else:
      paths.append(item)
  if not paths:
    raise MissingLogError(f'no log file given ({spec!r})')
  for path in paths:
    if os.path.isdir(path):
      raise MissingLogError(f'{path}: a folder, not a log file (give its files, e.g. '
                            f'{os.path.join(path, "*.txt.gz")!r})')
    if not os.path.isfile(path):
      where = '' if os.path.isabs(path) else f' (from {os.getcwd()})'  # a relative path
      raise MissingLogError(f'{path}: not a regular file' if os.path.exists(path)
                            else f'{path}: no such log file{where}')
  resolved = [os.path.realpath(p) for p in paths]
  if len(set(resolved)) < len(resolved):
    twice = next(p for i, p in enumerate(paths) if resolved[i] in resolved[:i])
    raise LogListError(f'{twice}: log file given twice in {spec!r}')
  return paths


def open_bytes(path: str) -> BinaryIO:
  """`path` opened for its bytes, gzip told by its magic bytes, not its name; a file of another
  compression is refused by name (its bytes would be read as lines that are no log's)."""
  with open(path, 'rb') as raw:
    head = raw.read(8)
  for magic, name in _OTHER_COMPRESSIONS.items():
    if head.startswith(magic):
      raise LogFormatError(f'{path}: {name}-compressed: only plain text or gzip is read; '
                           'decompress it first')
  return gzip.open(path, 'rb') if head.startswith(_GZIP_MAGIC) else open(path, 'rb')


def _chunks(path: str) -> Iterator[bytearray]:
  """Whole lines of `path` (plain or gzip), CHUNK_BYTES at a time, each ending in a newline.
  A file whose first block holds a carriage return but no newline ends its lines with lone
  carriage returns: they are read as newlines (as a sessions file's are: `inputs`), not as
  one line of the whole file."""
  try:
    with open_bytes(path) as f:
      carry = bytearray()
      first = f.read(CHUNK_BYTES)
      # A byte-order mark, as some editors start a UTF-8 file with, is no part of line 1.
      blocks = itertools.chain([first.removeprefix(UTF8_BOM)],
                               iter(lambda: f.read(CHUNK_BYTES), b''))
      if b'\r' in first and b'\n' not in first:
        blocks = (block.replace(b'\r', b'\n') for block in blocks)
      for block in blocks:
        cut = block.rfind(b'\n') + 1
        carry += block[:cut] if cut else block
        if cut:
          yield carry
          carry = bytearray(block[cut:])
      if carry:
        yield carry + b'\n'
  except (gzip.BadGzipFile, EOFError, zlib.error) as e:
    raise LogFormatError(f'{path}: corrupt or truncated gzip data ({e})') from None


def _parse_user_ids(data: np.ndarray, begin: np.ndarray,
                    end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """AnonIDs of the fields data[begin:end] (int [n] each): (int64 values, bool ok) [n]."""
  length = end - begin
  ok = (length >= 1) & (length <= _MAX_USER_DIGITS)
  value = np.zeros(len(begin), np.int64)
  for k in range(int(length[ok].max(initial=0))):  # digit k from the right
    present = ok & (k < length)
    digit = data[np.where(present, end - 1 - k, 0)].astype(np.int64) - ord('0')
    ok &= ~present | ((digit >= 0) & (digit <= 9))
    value += np.where(present, digit, 0) * 10**k
  return value, ok


def _parse_times(buf: bytearray, begin: np.ndarray,
                 end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """QueryTimes of the fields buf[begin:end]: (int64 seconds since 1970, bool ok) [n]."""
  ok = end - begin == _TIME_LEN
  seconds = np.zeros(len(begin), np.int64)
  if not ok.any():
    return seconds, ok
  # Every TIME_LEN-byte window of the chunk as one fixed-size string: gathering a field is
  # then one memcpy, not TIME_LEN fancy-indexed bytes.
  windows = np.ndarray((len(buf) - _TIME_LEN + 1,), f'S{_TIME_LEN}', buf, strides=(1,))
  chars = windows[begin[ok]].view(np.uint8).reshape(-1, _TIME_LEN)
  digits = chars - np.uint8(ord('0'))  # non-digits wrap around to values above 9
  valid = (digits[:, _TIME_DIGITS] <= 9).all(axis=1)
  for column, separator in _TIME_SEPARATORS.items():
    valid &= chars[:, column] == separator

  def number(first: int, last: int) -> np.ndarray:
    value = np.zeros(len(digits), np.int64)
    for column in range(first, last):
      value = value * 10 + digits[:, column]
    return value

  year, month, day = number(0, 4), number(5, 7), number(8, 10)
  hour, minute, second = number(11, 13), number(14, 16), number(17, 19)
  valid &= ((month >= 1) & (month <= 12) & (day >= 1) & (hour < 24) & (minute < 60)
            & (second < 60))
  months = (year - 1970) * 12 + month - 1
  month_start, next_month_start = (
      m.astype('datetime64[M]').astype('datetime64[D]').astype(np.int64)
      for m in (months, months + 1))
  valid &= day <= next_month_start - month_start
  seconds[ok] = (month_start + day - 1) * 86400 + hour * 3600 + minute * 60 + second
  ok[ok] = valid
  return seconds, ok


@functools.lru_cache(maxsize=8)
def _position_weights(size_log2: int) -> np.ndarray:
  """uint64 [2**size_log2]: splitmix64 of 1, 2, ...: pseudo-random, the same on every run."""
  x = np.arange(1, 2**size_log2 + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
  x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
  x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return x ^ (x >> np.uint64(31))


def _runs_mask(begin: np.ndarray, end: np.ndarray, size: int) -> np.ndarray:
  """bool [size]: True inside the runs [begin[i], end[i]), sorted and not overlapping."""
  bounds = np.empty(2 * len(begin) + 2, np.int64)
  bounds[0], bounds[-1] = 0, size
  bounds[1:-1:2], bounds[2:-1:2] = begin, end
  inside = np.zeros(len(bounds) - 1, bool)
  inside[1::2] = True
  return np.repeat(inside, np.diff(bounds))


def _count_in(sorted_positions: np.ndarray, begin: np.ndarray, end: np.ndarray) -> np.ndarray:
  """int [n]: how many of `sorted_positions` lie in each [begin, end)."""
  return np.searchsorted(sorted_positions, end) - np.searchsorted(sorted_positions, begin)


def _query_words(buf: bytearray, data: np.ndarray, num_newlines: int, begin: np.ndarray,
                 end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Normalises the query fields buf[begin:end] (int [n] each): `normalize_query`.

  Returns (new end, number of words), each [n]. A field that is already clean
  (ASCII words separated by single spaces) is left alone and its words are counted from its
  spaces, vectorised; the others, rare in real logs, are cleaned by str.split() and written
  back in place (never longer than the field) with `end` moved to their new end.
  """
  end = end.copy()
  # ASCII capitals lower-cased in place (the other bytes of a field go through
  # normalize_query below).
  in_field = _runs_mask(begin, end, len(data))
  capitals = np.flatnonzero(in_field & (data >= ord('A')) & (data <= ord('Z')))
  if capitals.size:
    data[capitals] += 32
  spaces = np.flatnonzero(data == _SPACE)
  # Such bytes are rare: three quick counts usually show that a chunk has none.
  if (np.count_nonzero(data >= 0x80) == 0
      and np.count_nonzero(data < _SPACE) == np.count_nonzero(data == _TAB) + num_newlines):
    irregular = np.zeros(0, np.int64)
  else:
    irregular = np.flatnonzero(_NEEDS_STR_SPLIT[data])
  double_spaces = spaces[:-1][np.diff(spaces) == 1]
  nonempty = end > begin
  last = np.maximum(end - 1, 0)
  to_clean = np.flatnonzero(
      nonempty & ((data[begin] == _SPACE) | (data[last] == _SPACE)
                  | (_count_in(irregular, begin, end) > 0)
                  | (_count_in(double_spaces, begin, last) > 0)))
  num_words = _count_in(spaces, begin, end) + nonempty
  for r in to_clean:
    text = normalize_query(buf[begin[r]:end[r]].decode('utf-8'))
    encoded = text.encode('utf-8')
    if len(encoded) > end[r] - begin[r]:
      # Only if a later Unicode version adds a capital whose lower case is longer (the tests
      # check _LOWER_CASE_EXCEPTIONS against this Python's): the field cannot grow, so that
      # query keeps its case.
      text = ' '.join(buf[begin[r]:end[r]].decode('utf-8').split())
      encoded = text.encode('utf-8')
    end[r] = begin[r] + len(encoded)
    buf[begin[r]:end[r]] = encoded
    num_words[r] = len(text.split(' ')) if text else 0
  return end, num_words


def _parse_chunk(buf: bytearray) -> tuple[np.ndarray, Records]:
  """Parses `buf` (whole lines, ending in a newline): int8 status [lines], and the records."""
  data = np.frombuffer(buf, np.uint8)
  line_end = np.flatnonzero(data == _NEWLINE)
  num_lines = len(line_end)
  line_start = np.zeros(num_lines, np.int64)
  line_start[1:] = line_end[:-1] + 1
  line_end -= (line_end > line_start) & (data[line_end - 1] == _CR)
  status = np.zeros(num_lines, np.int8)
  rows = np.arange(num_lines)

  def reject(ok: np.ndarray, reason: str, *columns: np.ndarray) -> list[np.ndarray]:
    """Gives the failing rows `reason`; returns `rows` and `columns` narrowed to the rest."""
    status[rows[~ok]] = _CODE[reason]
    return [rows[ok]] + [c[ok] for c in columns]

  rows, = reject(line_end[rows] > line_start[rows], 'empty_line')
  # Header lines: a file's first, or one inside it where files were joined (`cat a b`, its
  # byte-order mark too). An AnonID is digits, so only lines that start with the header's
  # letter or a mark are looked at.
  first_bytes = data[line_start[rows]]
  maybe = rows[(first_bytes == ord(_HEADER_FIELD[0])) | (first_bytes == UTF8_BOM[0])]
  headers = [r for r in maybe.tolist()
             if is_header(bytes(buf[line_start[r]:line_end[r]]).decode('utf-8', 'replace'))]
  rows, = reject(~np.isin(rows, headers), 'header')

  tabs = np.flatnonzero(data == _TAB)
  first_tab = np.searchsorted(tabs, line_start[rows])
  num_tabs = np.searchsorted(tabs, line_end[rows]) - first_tab
  rows, first_tab, num_tabs = reject((num_tabs == 2) | (num_tabs == 4), 'bad_field_count',
                                     first_tab, num_tabs)
  user_end, query_end = tabs[first_tab], tabs[first_tab + 1]
  time_end = np.where(num_tabs == 4, tabs[np.minimum(first_tab + 2, len(tabs) - 1)],
                      line_end[rows])

  user, ok = _parse_user_ids(data, line_start[rows], user_end)
  rows, user, user_end, query_end, time_end = reject(ok, 'bad_user_id', user, user_end,
                                                     query_end, time_end)
  time, ok = _parse_times(buf, query_end + 1, time_end)
  rows, user, time, query_begin, query_end = reject(ok, 'bad_time', user, time, user_end + 1,
                                                    query_end)
  # Such bytes are rare: two quick counts usually show that a chunk has none.
  if (np.count_nonzero(data < _SPACE) == len(tabs) + num_lines + np.count_nonzero(data == _CR)
      and not np.count_nonzero(data == _DEL)):
    controls = np.zeros(0, np.int64)
  else:
    controls = np.flatnonzero(CONTROL_BYTE[data])
  rows, user, time, query_begin, query_end = reject(
      _count_in(controls, query_begin, query_end) == 0, 'control_character', user, time,
      query_begin, query_end)
  query_end, num_words = _query_words(buf, data, num_lines, query_begin, query_end)
  text_len = query_end - query_begin
  dash = (text_len == 1) & (data[query_begin] == _DASH)
  rows, user, time, query_begin, query_end, num_words, text_len = reject(
      (text_len > 0) & ~dash, 'empty_query', user, time, query_begin, query_end, num_words,
      text_len)

  # Each text with the byte after it (the tab after the field, or a byte of the field left
  # over by cleaning), which then becomes the newline that ends it.
  text = data[_runs_mask(query_begin, query_end + 1, len(data))]
  offsets = np.cumsum(text_len + 1) - (text_len + 1)
  text[offsets + text_len] = _NEWLINE
  position = np.arange(len(text)) - np.repeat(offsets, text_len + 1)
  weights = _position_weights(int(text_len.max(initial=0)).bit_length())
  text_hash = (np.add.reduceat(text.astype(np.uint64) * weights[position], offsets)
               if len(rows) else np.zeros(0, np.uint64))
  return status, Records(user, time, num_words.astype(np.int32), text_len.astype(np.int32),
                         text_hash, text)


def read_log(path: str, strict: bool = False) -> LogLines:
  """Reads one log file (see the module docstring for the checks). A file none of whose first
  `_SNIFF_LINES` lines parses is refused (`_no_query`), naming what its lines are."""
  parts = []
  counts = np.zeros(len(LINE_REASONS) + 1, np.int64)
  # The statuses of the first _SNIFF_LINES lines, and while none of them parses, the first
  # line of each status (number, text): what the refusal of a file of no query names.
  early = np.zeros(len(LINE_REASONS) + 1, np.int64)
  first_lines: dict[int, tuple[int, str]] = {}
  lines_read = latin1_lines = 0
  parsed_early = False
  for chunk in _chunks(path):
    chunk, latin1 = _latin1_lines_to_utf8(chunk)
    latin1_lines += latin1
    status, records = _parse_chunk(chunk)
    head = status[:max(_SNIFF_LINES - lines_read, 0)]
    early += np.bincount(head, minlength=len(early))
    parsed_early = early[_PARSED_CODES].any()
    if not parsed_early:
      # The parser rewrites the bytes of queries it reads alone, none of these lines'.
      for code in set(np.unique(head).tolist()) - first_lines.keys():
        index = int(np.argmax(head == code))
        first_lines[code] = (lines_read + index + 1, _line_text(chunk, index))
    if not parsed_early and lines_read + len(status) >= _SNIFF_LINES:
      raise _no_query(path, early, first_lines, of_first=True)
    if strict and (bad := np.flatnonzero(np.isin(status, _MALFORMED_CODES))).size:
      reason = LINE_REASONS[status[bad[0]] - 1]
      raise LogFormatError(f'{path}:{lines_read + bad[0] + 1}: {reason}: {_WHY[reason]}')
    counts += np.bincount(status, minlength=len(counts))
    lines_read += len(status)
    parts.append(records)
  if not lines_read:
    raise LogFormatError(f'{path}: empty file, not an AOL query log')
  if counts[1 + LINE_REASONS.index('header')] == lines_read:
    raise LogFormatError(f'{path}: the log holds no records: its {lines_read:,} line'
                         f'{"s are" if lines_read > 1 else " is"} the AnonID header only')
  if not parsed_early:  # every line is among the first _SNIFF_LINES: `early` counts them all
    raise _no_query(path, early, first_lines, of_first=False)
  return LogLines(Records.concatenate(parts),
                  dict(zip(LINE_REASONS, counts[1:].tolist())), lines_read, latin1_lines)


def _line_text(chunk: bytearray, index: int) -> str:
  """Line `index` of `chunk` (whole lines), without its line end."""
  line = chunk.split(b'\n', index + 1)[index]
  return line.removesuffix(b'\r').decode('utf-8', 'replace')


def _no_query(path: str, statuses: np.ndarray, first_lines: dict[int, tuple[int, str]],
              of_first: bool) -> LogFormatError:
  """The refusal of a file none of whose first lines parses (`statuses`: their count by
  status; `first_lines`: the first line of each status). Lines that are no log's (most of
  them not 3 or 5 tab-separated fields, and no `AnonID` header) make no query log; a log's
  lines whose AnonID or QueryTime is in another form (an ISO time, say) make a log read
  wrong, which is named: the reason most of its lines have, with the first such line."""
  counts = dict(zip(LINE_REASONS, statuses[1:].tolist()))
  lines = f'{"first " if of_first else ""}{int(statuses.sum()):,} lines'
  # A tie names the later check's reason: those lines read further as a log's.
  reason = max(reversed(('bad_field_count', 'bad_user_id', 'bad_time')), key=counts.get)
  if not counts[reason] or (reason == 'bad_field_count' and not counts['header']):
    return LogFormatError(f'{path}: not an AOL query log: none of its {lines} reads as '
                          'AnonID<TAB>Query<TAB>QueryTime[<TAB>ItemRank<TAB>ClickURL]')
  # Every line counted once, by reason: the one named first, then the others.
  others = [r for r in LINE_REASONS if r != reason and counts[r]]
  tally = ', '.join(f'{r} {counts[r]:,}' for r in [reason] + others)
  number, text = first_lines[_CODE[reason]]
  shown = repr(text[:_SHOWN_CHARACTERS]) + (' ...' if len(text) > _SHOWN_CHARACTERS else '')
  return LogFormatError(f'{path}: none of its {lines} reads as a query ({tally}): '
                        f'{_WHY[reason]}, first at line {number:,}: {shown}')


def read_logs(paths: Sequence[str], strict: bool = False, workers: int = 0,
              scratch_dir: str | None = None) -> LogLines:
  """Reads `paths`, one file per process with `workers` > 1, in `paths` order.

  `workers` = 0 picks one process per file, up to the CPU count, when the files hold at
  least PARALLEL_MIN_BYTES, and reads in this process otherwise (starting a process costs
  more than a small file). Worker processes hand their columns over as .npy files in a
  temporary folder inside `scratch_dir` (default: the system's). With `strict`, the error
  raised is that of the first bad file in `paths` order.
  """
  if not workers:
    big = sum(os.path.getsize(p) for p in paths) >= PARALLEL_MIN_BYTES
    workers = min(len(paths), len(os.sched_getaffinity(0))) if big else 1
  if workers == 1:
    logs = [read_log(path, strict) for path in paths]
    return LogLines(Records.concatenate([log.records for log in logs]),
                    _sum_counts([log.skipped for log in logs]),
                    sum(log.lines_read for log in logs),
                    sum(log.latin1_lines for log in logs))
  with tempfile.TemporaryDirectory(prefix='log-columns-', dir=scratch_dir) as scratch:
    folders = [os.path.join(scratch, str(i)) for i in range(len(paths))]
    # Threads would share one GIL, which much of numpy's indexing holds; a fresh interpreter
    # per worker (not a fork) is also safe when the caller has started JAX's threads.
    pool = concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context('spawn'))
    try:
      counts = list(pool.map(_read_log_to, paths, itertools.repeat(strict), folders))
    finally:
      pool.shutdown(cancel_futures=True)
    records = Records(*(
        np.concatenate([np.load(os.path.join(folder, f'{field.name}.npy'), mmap_mode='r',
                                allow_pickle=False) for folder in folders])
        for field in dataclasses.fields(Records)))
  return LogLines(records, _sum_counts([skipped for skipped, _, _ in counts]),
                  sum(lines for _, lines, _ in counts), sum(latin1 for _, _, latin1 in counts))


def _read_log_to(path: str, strict: bool, folder: str) -> tuple[dict[str, int], int, int]:
  """read_log in a worker process: the columns go to `folder`, the counts are returned."""
  log = read_log(path, strict)
  os.makedirs(folder)
  for field in dataclasses.fields(Records):
    np.save(os.path.join(folder, f'{field.name}.npy'), getattr(log.records, field.name),
            allow_pickle=False)
  return log.skipped, log.lines_read, log.latin1_lines


def _sum_counts(counts: Sequence[dict[str, int]]) -> dict[str, int]:
  return {reason: sum(c[reason] for c in counts) for reason in LINE_REASONS}


def sessionize(records: Records, *, gap_minutes: float, max_query_words: int, long_query: str,
               min_queries: int, max_queries: int) -> Sessions:
  """Cuts records into sessions and filters them (steps 2-5 of the module docstring)."""
  if long_query not in LONG_QUERY_POLICIES:
    raise ValueError(f'long_query must be one of {LONG_QUERY_POLICIES}, got {long_query!r}')
  user, time = records.user, records.time
  text_len, text_hash = records.text_len, records.text_hash
  order = np.arange(len(records))
  # The AOL files come sorted: then the columns serve as they are, with no sorted copies.
  if not np.all((user[1:] > user[:-1]) | ((user[1:] == user[:-1]) & (time[1:] >= time[:-1]))):
    # Stable sorts, so that equal times keep their input order. One int64 key (AnonID, then
    # seconds into the log) sorts faster than lexsort's two passes, when it fits.
    span = int(time.max() - time.min()) + 1
    if int(user.max()) * span < 2**63:
      order = np.argsort(user * span + (time - time.min()), kind='stable')
    else:
      order = np.lexsort((time, user))
    user, time, text_len, text_hash = (a[order] for a in (user, time, text_len, text_hash))
  new_session = np.ones(len(order), bool)
  new_session[1:] = (user[1:] != user[:-1]) | (time[1:] - time[:-1] >= gap_minutes * 60)
  duplicate = np.zeros(len(order), bool)
  duplicate[1:] = (~new_session[1:] & (text_len[1:] == text_len[:-1])
                   & (text_hash[1:] == text_hash[:-1]))
  order, new_session = order[~duplicate], new_session[~duplicate]

  long = records.num_words[order] > max_query_words
  if long_query == 'drop_session':
    session = np.cumsum(new_session) - 1
    has_long = np.zeros(int(new_session.sum()), bool)
    has_long[session[long]] = True
    dropped = has_long[session]
  elif long_query == 'split_session':
    new_session[1:] |= long[:-1]
    dropped = long
  else:
    dropped = np.zeros(len(order), bool)
  order, new_session = order[~dropped], new_session[~dropped]

  starts = np.append(np.flatnonzero(new_session), len(order))
  lengths = np.diff(starts)
  too_short, too_long = lengths < min_queries, lengths > max_queries
  kept = ~(too_short | too_long)
  skipped = {'duplicate_query': int(duplicate.sum()), 'long_query': int(dropped.sum()),
             'session_too_short': int(lengths[too_short].sum()),
             'session_too_long': int(lengths[too_long].sum())}
  record_index = order[np.repeat(kept, lengths)]
  kept_starts = np.zeros(int(kept.sum()) + 1, np.int64)
  np.cumsum(lengths[kept], out=kept_starts[1:])
  return Sessions(record_index, kept_starts, skipped)
