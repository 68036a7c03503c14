"""AOL preprocessing: every rule of paper Sec. 5.1 on hand-written logs, and the real sample."""

from __future__ import annotations

import bz2
import collections
import gzip
import json
import lzma
import os
import re
import sys
import types
import zipfile

import ml_collections
import numpy as np
import pytest

from configs import default
from mtn_jax import errors
from mtn_jax.data import aol_log
from mtn_jax.data import candidate_pool
from mtn_jax.data import preprocess
from mtn_jax.data import sessions as sessions_lib
from mtn_jax.data.vocab import SPECIAL_TOKENS
from mtn_jax.data.vocab import UNK_ID
from mtn_jax.data.vocab import Vocab
from mtn_jax.evaluation import metrics

HEADER = 'AnonID\tQuery\tQueryTime\tItemRank\tClickURL'


def line(user, query, time, rank='', url=''):
  """One 5-field log line; `time` is HH:MM:SS on 2006-03-01 or a full timestamp."""
  stamp = time if len(time) > 8 else f'2006-03-01 {time}'
  return f'{user}\t{query}\t{stamp}\t{rank}\t{url}'


def write(path, lines, header=True, newline='\n') -> str:
  """Writes `lines` (str, or bytes taken as they are) to `path`, gzip when it ends in .gz."""
  body = b''.join((x if isinstance(x, bytes) else x.encode()) + newline.encode()
                  for x in ([HEADER] if header else []) + list(lines))
  with (gzip.open if str(path).endswith('.gz') else open)(path, 'wb') as f:
    f.write(body)
  return str(path)


def config(raw_files, **data):
  c = default.get_config()
  c.data.raw_files = str(raw_files)
  for key, value in data.items():
    c.data[key] = value
  return c


def session_texts(paths, min_queries=1, max_queries=100, max_query_words=10,
                  long_query='drop_session', gap_minutes=30.0):
  """Kept sessions as lists of texts, and the session-level skip counts."""
  log = aol_log.read_logs(paths if isinstance(paths, list) else [paths])
  s = aol_log.sessionize(log.records, gap_minutes=gap_minutes,
                         max_query_words=max_query_words, long_query=long_query,
                         min_queries=min_queries, max_queries=max_queries)
  texts = log.records.texts(s.record_index)
  return [texts[a:b] for a, b in zip(s.starts[:-1], s.starts[1:])], s.skipped


def corpus(data_dir):
  """Everything prepare wrote, as plain Python values, for comparisons."""
  out = {}
  for split in sessions_lib.SPLITS:
    s = sessions_lib.load_split(data_dir, split, mmap=False)
    out[split] = (s.queries.tolist(), s.starts.tolist(), s.texts)
  out['vocab'] = sessions_lib.load_vocab(data_dir).words
  with open(os.path.join(data_dir, 'stats.json')) as f:
    out['stats'] = json.load(f)
  return out


def test_tiny_log_files_exact(tmp_path):
  log = write(tmp_path / 'log.tsv', [
      line(7, 'cheap flights', '10:00:00', '1', 'http://a.com'),
      line(7, 'cheap flights', '10:00:00', '2', 'http://b.com'),  # a second click
      line(7, 'cheap  flights paris', '10:01:00'),
      line(7, 'paris hotels', '10:02:00'),
      line(9, 'weather', '10:00:00'),
      line(9, 'weather paris', '10:05:00'),
      line(9, 'paris', '10:06:00'),
  ])
  stats = preprocess.prepare(config(log, split_fractions=(1.0, 0.0, 0.0), min_word_count=2),
                             str(tmp_path / 'w'))
  data_dir = preprocess.data_dir(str(tmp_path / 'w'))
  assert data_dir == str(tmp_path / 'w' / 'data')
  # paris 4 times; cheap, flights and weather twice (ties by word); hotels once.
  assert sessions_lib.load_vocab(data_dir).words == SPECIAL_TOKENS + ('paris', 'cheap',
                                                                      'flights', 'weather')
  train = sessions_lib.load_split(data_dir, 'train', mmap=False)
  assert train.queries.dtype == np.int32 and train.queries.shape == (6, 10)
  assert train.starts.tolist() == [0, 3, 6]
  paris, cheap, flights, weather = 5, 6, 7, 8
  assert train.queries[:, :3].tolist() == [
      [cheap, flights, 0], [cheap, flights, paris], [paris, UNK_ID, 0],
      [weather, 0, 0], [weather, paris, 0], [paris, 0, 0]]
  assert not train.queries[:, 3:].any()
  assert train.texts == ['cheap flights', 'cheap flights paris', 'paris hotels', 'weather',
                         'weather paris', 'paris']
  for split in ('valid', 'test'):
    empty = sessions_lib.load_split(data_dir, split, mmap=False)
    assert (empty.queries.shape, empty.starts.tolist(), empty.texts) == ((0, 10), [0], [])
  assert stats == {
      'lines_read': 8, 'latin1_lines': 0,
      'skipped': {'header': 1, 'empty_line': 0, 'bad_field_count': 0, 'bad_user_id': 0,
                  'bad_time': 0, 'control_character': 0,
                  'empty_query': 0, 'duplicate_query': 1, 'long_query': 0,
                  'session_too_short': 0, 'session_too_long': 0},
      'train': {'sessions': 2, 'pairs': 4}, 'valid': {'sessions': 0, 'pairs': 0},
      'test': {'sessions': 0, 'pairs': 0}, 'tokenizer': 'word', 'vocab_size': 9,
      'candidates': 6}
  with open(os.path.join(data_dir, 'stats.json')) as f:
    assert json.load(f) == stats
  # The pool: every distinct training query once (each issued once here: ties by text), with
  # the token ids its rows hold.
  pool = candidate_pool.load_pool(data_dir)
  assert pool.texts == sorted(train.texts)
  assert pool.counts.tolist() == [1] * 6
  assert pool.queries.tolist() == [train.queries[train.texts.index(t)].tolist()
                                   for t in pool.texts]
  assert pool.ids_of(['paris', 'not logged']).tolist() == [pool.texts.index('paris'), -1]


def test_candidate_pool_counts_and_order():
  texts = ['b', 'a', 'c', 'a', 'b', 'a']
  queries = np.array([[2], [1], [3], [1], [2], [1]], np.int32)
  pool, row_ids = candidate_pool.build_pool(texts, queries)
  # Most frequent first, ties by text; every row maps to its text's entry.
  assert pool.texts == ['a', 'b', 'c'] and pool.counts.tolist() == [3, 2, 1]
  assert pool.queries.tolist() == [[1], [2], [3]]
  assert [pool.texts[i] for i in row_ids] == texts


def test_a_pool_is_read_once_while_its_files_stay_as_they_are(tmp_path):
  """The readers of one evaluation share one read (read-only arrays); a pool written again
  is read again, and a damaged one is refused, not served from before."""
  texts = ['b', 'a', 'c', 'a']
  pool, _ = candidate_pool.build_pool(texts, np.array([[2], [1], [3], [1]], np.int32))
  candidate_pool.save_pool(str(tmp_path), pool)
  first = candidate_pool.load_pool(str(tmp_path))
  assert candidate_pool.load_pool(str(tmp_path) + '/') is first
  assert first.texts == ['a', 'b', 'c'] and first.counts.tolist() == [2, 1, 1]
  with pytest.raises(ValueError):
    first.counts[0] = 5
  bigger, _ = candidate_pool.build_pool(texts + ['d', 'd', 'd'],
                                    np.array([[2], [1], [3], [1], [4], [4], [4]], np.int32))
  candidate_pool.save_pool(str(tmp_path), bigger)
  again = candidate_pool.load_pool(str(tmp_path))
  assert again.texts == ['d', 'a', 'b', 'c'] and again.counts.tolist() == [3, 2, 1, 1]
  (tmp_path / 'candidates.txt').write_text('d\na\n')
  with pytest.raises(errors.Error, match='the candidate files disagree'):
    candidate_pool.load_pool(str(tmp_path))


def test_history_items_that_do_not_fit_their_splits_sessions_are_refused(tmp_path):
  """A split's history items are read row for row with its sessions (AEM and ZAM attend to
  them as that session's user's past): a file of another length is an error naming it, not
  other users' histories; a corpus without one has none."""
  path = candidate_pool.history_items_path(str(tmp_path), 'valid')
  np.save(path, np.array([[3, -1], [0, 2]], np.int32))
  np.testing.assert_array_equal(candidate_pool.load_history_items(str(tmp_path), 'valid', 2),
                                [[3, -1], [0, 2]])
  with pytest.raises(errors.Error, match=re.escape(f'{path}: shape (2, 2) for 3 sessions')):
    candidate_pool.load_history_items(str(tmp_path), 'valid', 3)
  assert candidate_pool.load_history_items(str(tmp_path), 'test', 2) is None


def test_thirty_minutes_exactly_starts_a_session(tmp_path):
  log = write(tmp_path / 'log.tsv', [
      line(1, 'a', '10:00:00'), line(1, 'b', '10:29:59'),  # 29:59 after a
      line(1, 'c', '10:59:59'),  # 30:00 after b
      line(1, 'd', '11:29:58'),  # 29:59 after c
      line(1, 'e', '23:59:59'), line(1, 'f', '2006-03-02 00:29:58')])  # 29:59 over midnight
  assert session_texts(log)[0] == [['a', 'b'], ['c', 'd'], ['e', 'f']]
  assert session_texts(log, gap_minutes=29.98)[0] == [['a'], ['b'], ['c'], ['d'], ['e'],
                                                       ['f']]


def test_successive_duplicates_removed_and_repeats_kept(tmp_path):
  log = write(tmp_path / 'log.tsv', [
      line(1, 'a', '10:00:00'), line(1, 'a', '10:00:00', '1', 'u'),
      line(1, ' a ', '10:01:00'),  # the same words: a duplicate too
      line(1, 'b', '10:02:00'), line(1, 'b ', '10:02:30'),
      line(1, 'a', '10:03:00'),  # a again after b: kept
      line(1, 'a', '10:28:00'),  # a duplicate, but it is activity: c stays in the session
      line(1, 'c', '10:57:00'),
      line(1, 'c', '11:40:00'),  # the same query in a new session: kept
      line(2, 'c', '11:40:01'),  # another user's
      line(2, 'on no', '11:41:00'), line(2, 'no on', '11:42:00')])  # the same bytes, reordered
  sessions, skipped = session_texts(log)
  assert sessions == [['a', 'b', 'a', 'c'], ['c'], ['c', 'on no', 'no on']]
  assert skipped['duplicate_query'] == 4


@pytest.mark.parametrize('policy, expected, long_count', [
    ('drop_session', [['p', 'q', 'r']], 4),
    ('split_session', [['x'], ['y', 'z'], ['p', 'q', 'r']], 1),
    ('truncate', [['x', ' '.join('w%d' % i for i in range(11)), 'y', 'z'], ['p', 'q', 'r']],
     0),
])
def test_long_query_policies(tmp_path, policy, expected, long_count):
  ten_words = ' '.join('v%d' % i for i in range(10))
  log = write(tmp_path / 'log.tsv', [
      line(1, 'x', '10:00:00'), line(1, ' '.join('w%d' % i for i in range(11)), '10:01:00'),
      line(1, 'y', '10:02:00'), line(1, 'z', '10:03:00'),
      line(2, 'p', '10:00:00'), line(2, 'q', '10:01:00'), line(2, 'r', '10:02:00'),
      line(3, ten_words, '10:00:00')])  # exactly max_query_words: never long
  sessions, skipped = session_texts(log, long_query=policy)
  assert sessions == expected + [[ten_words]]
  assert skipped['long_query'] == long_count


def test_an_unknown_long_query_policy_is_refused(tmp_path):
  log = aol_log.read_log(write(tmp_path / 'log.tsv', [line(1, 'a b', '10:00:00')]))
  with pytest.raises(ValueError, match="long_query must be one of .*, got 'drop'"):
    aol_log.sessionize(log.records, gap_minutes=30.0, max_query_words=1, long_query='drop',
                       min_queries=1, max_queries=5)


def test_truncate_cuts_stored_queries(tmp_path):
  words = ['w%d' % i for i in range(12)]
  log = write(tmp_path / 'log.tsv', [line(1, 'a', '10:00:00'), line(1, ' '.join(words),
                                                                    '10:01:00')])
  workdir = str(tmp_path / 'w')
  preprocess.prepare(config(log, long_query='truncate', min_session_queries=2,
                            split_fractions=(1.0, 0.0, 0.0), min_word_count=1), workdir)
  train = sessions_lib.load_split(preprocess.data_dir(workdir), 'train', mmap=False)
  vocab = sessions_lib.load_vocab(preprocess.data_dir(workdir))
  assert train.texts == ['a', ' '.join(words[:10])]
  assert vocab.decode(train.queries[1]) == words[:10]
  assert 'w10' not in vocab.words


def test_unsorted_interleaved_input_gives_the_same_corpus(tmp_path):
  lines = [line(u, f'q{u} {i}', f'{10 + i // 3:02d}:{(7 * i) % 60:02d}:00')
           for u in (3, 12, 40) for i in range(15)]
  ties = [line(12, f'same time {n}', '2006-03-02 08:00:00') for n in ('one', 'two', 'three')]
  lines += ties
  shuffled = [lines[i] for i in np.random.default_rng(0).permutation(len(lines) - 3)]
  for position, tie in zip((5, 20, 40), reversed(ties)):  # in the file: three, two, one
    shuffled.insert(position, tie)
  kwargs = dict(min_session_queries=2, split_fractions=(0.5, 0.25, 0.25), min_word_count=1)
  preprocess.prepare(config(write(tmp_path / 'a.tsv', lines), **kwargs), str(tmp_path / 'a'))
  preprocess.prepare(config(write(tmp_path / 'b.tsv', shuffled), **kwargs),
                     str(tmp_path / 'b'))
  sorted_corpus = corpus(preprocess.data_dir(str(tmp_path / 'a')))
  shuffled_corpus = corpus(preprocess.data_dir(str(tmp_path / 'b')))
  for data, expected in ((sorted_corpus, ['one', 'two', 'three']),
                         (shuffled_corpus, ['three', 'two', 'one'])):
    all_texts = sum((data[s][2] for s in sessions_lib.SPLITS), [])
    position = all_texts.index('same time ' + expected[0])
    assert all_texts[position:position + 3] == ['same time ' + n for n in expected]
  # Apart from the order of the ties, the two corpora are identical.
  swap = {'same time one': 'same time three', 'same time three': 'same time one'}
  for split in sessions_lib.SPLITS:
    assert [swap.get(t, t) for t in shuffled_corpus[split][2]] == sorted_corpus[split][2]
    assert shuffled_corpus[split][1] == sorted_corpus[split][1]
  assert shuffled_corpus['vocab'] == sorted_corpus['vocab']
  assert shuffled_corpus['stats'] == sorted_corpus['stats']


def test_equal_times_keep_file_order_across_files(tmp_path):
  first = write(tmp_path / 'part-1.tsv', [line(5, 'y', '10:00:00'), line(6, 'm', '10:00:00')])
  second = write(tmp_path / 'part-2.tsv', [line(5, 'x', '10:00:00'), line(5, 'z', '09:59:00')])
  assert session_texts([first, second])[0] == [['z', 'y', 'x'], ['m']]
  assert session_texts([second, first])[0] == [['z', 'x', 'y'], ['m']]


def test_unsorted_huge_user_ids(tmp_path):
  """AnonIDs too large to share an int64 sort key with the time take the other sort."""
  big = 999999999999999999
  log = write(tmp_path / 'log.tsv', [
      line(big, 'b', '10:01:00'), line(3, 'y', '2006-05-01 10:00:00'), line(big, 'a', '10:00:00'),
      line(3, 'x', '10:00:00'), line(big, 'c', '10:01:00'), line(big - 1, 'z', '10:00:00')])
  assert session_texts(log)[0] == [['x'], ['y'], ['z'], ['a', 'b', 'c']]


def test_unsorted_neighbouring_users_keep_their_sessions(tmp_path):
  """Out of order, AnonID 1's latest record (the log's last time) and AnonID 2's earliest
  (its first) still sort apart: each user's records make its own sessions."""
  log = write(tmp_path / 'log.tsv', [line(2, 'x', '10:00:00'), line(1, 'a', '10:00:00'),
                                     line(1, 'b', '10:05:00'), line(2, 'y', '10:01:00')])
  assert session_texts(log)[0] == [['a', 'b'], ['x', 'y']]


def test_text_cleaning_case_and_latin1(tmp_path):
  log = write(tmp_path / 'log.tsv', [
      line(1, 'www.myspace.com', '10:00:00'),  # punctuation kept as it is
      line(1, ' caf\u00e9\u00a0au \x0b lait ', '10:01:00'),
      line(1, 'Caf\u00e9 Au LAIT', '10:02:00').encode('latin-1'),
      line(1, '\u00dcber\u3000ALLES', '10:03:00'),
      line(1, 'CHEAP Flights', '10:04:00'),
  ], header=False)
  sessions, _ = session_texts(log)
  # NBSP and the ideographic space separate words; every query is lower-cased, so the
  # Latin-1 line (not UTF-8, read as Latin-1) repeats the one before it.
  assert sessions == [['www.myspace.com', 'caf\u00e9 au lait', '\u00fcber alles',
                       'cheap flights']]
  log_lines = aol_log.read_log(log)
  assert log_lines.latin1_lines == 1 and not any(log_lines.skipped.values())
  assert log_lines.records.num_words.tolist() == [1, 3, 3, 2, 2]
  # The decode and suggest input is normalised by the same function.
  assert aol_log.normalize_query(' CHEAP\u00a0 Flights ') == 'cheap flights'
  assert aol_log.decode_text('caf\u00e9'.encode('latin-1')) == ('caf\u00e9', True)


def test_field_counts_header_and_line_ends(tmp_path):
  rows = [line(1, 'a', '10:00:00'), '1\tb\t2006-03-01 10:01:00',  # 3 fields
          '1\tc\t2006-03-01 10:02:00\t1',  # 4 fields
          '1\td', '',  # 2 fields, an empty line
          line(1, 'e', '10:03:00', '3', 'http://e.com') + '\textra']  # 6 fields
  with_header = aol_log.read_log(write(tmp_path / 'h.tsv', rows))
  without = aol_log.read_log(write(tmp_path / 'n.tsv', rows, header=False))
  crlf = aol_log.read_log(write(tmp_path / 'crlf.tsv', rows, newline='\r\n'))
  # An old Mac file's lone carriage returns end its lines too (not one line of the whole file).
  lone_cr = aol_log.read_log(write(tmp_path / 'cr.tsv', rows, newline='\r'))
  no_final_newline = tmp_path / 'last.tsv'
  no_final_newline.write_text('\n'.join([HEADER] + rows) + '\n' + line(1, 'f', '10:09:00'))
  last = aol_log.read_log(str(no_final_newline))
  for log, header in ((with_header, 1), (without, 0), (crlf, 1), (lone_cr, 1), (last, 1)):
    assert log.skipped['header'] == header
    assert log.skipped['bad_field_count'] == 3 and log.skipped['empty_line'] == 1
    assert log.records.texts(np.arange(len(log.records)))[:2] == ['a', 'b']
  assert last.lines_read == 8 and last.records.texts(np.array([2])) == ['f']
  assert lone_cr.lines_read == crlf.lines_read == 7
  # A byte-order mark before the header (as some editors write UTF-8) is no part of it.
  bom = aol_log.read_log(write(tmp_path / 'bom.tsv', [aol_log.UTF8_BOM + HEADER.encode()] + rows,
                               header=False))
  assert bom.skipped == with_header.skipped and bom.lines_read == with_header.lines_read
  # ... nor of a first line that is a record; a first field that only starts with `AnonID`
  # is no header but a bad AnonID.
  bom_record = aol_log.read_log(write(tmp_path / 'bom-record.tsv', [
      aol_log.UTF8_BOM + rows[0].encode(), 'AnonIDs\tq\t2006-03-01 10:05:00'], header=False))
  assert bom_record.records.user.tolist() == [1]
  assert bom_record.records.texts(np.arange(1)) == ['a']
  assert (bom_record.skipped['header'], bom_record.skipped['bad_user_id']) == (0, 1)
  assert np.array_equal(crlf.records.time, with_header.records.time)
  # A header inside a file (logs joined by `cat`) is a header too, with strict mode as well.
  late = aol_log.read_log(write(tmp_path / 'late.tsv', [rows[0], HEADER, rows[0],
                                                      aol_log.UTF8_BOM + HEADER.encode()],
                                header=False), strict=True)
  assert (late.skipped['header'], late.skipped['bad_user_id']) == (2, 0)


def test_user_ids_and_times_parse_exactly(tmp_path):
  rows = [line('0000042', 'a', '1970-01-01 00:00:00'), line(7, 'b', '2006-03-01 15:58:56'),
          line(999999999999999999, 'c', '2004-02-29 23:59:59'),  # 18 digits; a leap day
          line(1234567890123456789, 'd', '10:00:00'),  # 19 digits
          line('-5', 'e', '10:00:00'), line('1a', 'f', '10:00:00'), line('', 'g', '10:00:00'),
          line(8, 'h', '2006-02-29 10:00:00'), line(8, 'i', '2006-13-01 10:00:00'),
          line(8, 'j', '2006-03-01 24:00:00'), line(8, 'k', '2006-03-01 10:60:00'),
          line(8, 'l', '2006-3-01 10:00:00'), line(8, 'm', '2006-03-01T10:00:00'),
          line(8, 'n', '2006-03-01 10:00:00.5'), line(8, 'o', ''),
          line(8, 'p', '2006-03-01 10:00:60'), line(8, 'q', '2006-03-00 10:00:00')]
  log = aol_log.read_log(write(tmp_path / 'log.tsv', rows, header=False))
  assert log.records.user.tolist() == [42, 7, 999999999999999999]
  assert log.records.time.tolist() == [0, 1141228736, 1078099199]
  assert (log.skipped['bad_user_id'], log.skipped['bad_time']) == (4, 10)


def test_gzip_and_many_files_read_like_one(tmp_path):
  rows = [line(u, f'query {u} {i}', f'10:{i:02d}:00') for u in range(1, 9) for i in range(4)]
  one = write(tmp_path / 'one.tsv', rows)
  write(tmp_path / 'part-0.tsv.gz', rows[:12])
  write(tmp_path / 'part-1.tsv', rows[12:22], header=False)
  write(tmp_path / 'part-2.gz', rows[22:])
  kwargs = dict(split_fractions=(0.5, 0.25, 0.25), min_word_count=1)
  preprocess.prepare(config(one, **kwargs), str(tmp_path / 'a'))
  preprocess.prepare(config(tmp_path / 'part-*', **kwargs), str(tmp_path / 'b'))
  listed = ','.join(str(tmp_path / f) for f in ('part-0.tsv.gz', 'part-1.tsv', 'part-2.gz'))
  preprocess.prepare(config(listed, **kwargs), str(tmp_path / 'c'))
  expected = corpus(preprocess.data_dir(str(tmp_path / 'a')))
  assert expected['stats']['lines_read'] == 33
  assert [expected['stats'][s]['sessions'] for s in sessions_lib.SPLITS] == [4, 2, 2]
  expected['stats']['skipped']['header'] = 2  # two of the three parts have one
  expected['stats']['lines_read'] = 34
  assert corpus(preprocess.data_dir(str(tmp_path / 'b'))) == expected
  assert corpus(preprocess.data_dir(str(tmp_path / 'c'))) == expected
  # Gzip is told by the file's first bytes, not its name.
  gzipped = tmp_path / 'gzipped.tsv'
  os.rename(write(tmp_path / 'gzipped.tsv.gz', rows), gzipped)
  plain = tmp_path / 'plain.gz'
  os.rename(one, plain)
  for path in (gzipped, plain):
    read = aol_log.read_log(str(path))
    assert read.lines_read == 33 and read.records.texts(np.arange(32)) == [
        r.split('\t')[1] for r in rows]


def test_chunk_boundaries_and_worker_processes_change_nothing(tmp_path, monkeypatch):
  rows = [line(u, f'q{i} {"x" * (i % 7)}', f'1{i % 10}:{i:02d}:00', str(i), 'http://x.com')
          for u in range(5) for i in range(40)]
  rows[17] = line(2, 'caf\u00e9  cr\u00e8me', '10:00:00')  # a non-ASCII query to clean
  rows[33] = '3\tbroken'
  rows[50] = 'user7\tq\t2006-03-01 10:00:00'  # a bad AnonID
  rows[60] = HEADER  # a header inside a file, as joined logs have
  paths = [write(tmp_path / 'a.tsv', rows[:90]), write(tmp_path / 'b.tsv.gz', rows[90:])]
  whole = aol_log.read_logs(paths, workers=1)
  # Worker processes start afresh (spawn), each reading its file whole; in this process a
  # chunk of 37 bytes makes most lines cross a chunk boundary.
  in_workers = aol_log.read_logs(paths, workers=2)
  monkeypatch.setattr(aol_log, 'CHUNK_BYTES', 37)
  chunked = aol_log.read_logs(paths, workers=1)
  for read in (in_workers, chunked):
    assert (read.lines_read, read.skipped) == (whole.lines_read, whole.skipped) == (
        202, {'header': 3, 'empty_line': 0, 'bad_field_count': 1, 'bad_user_id': 1,
              'bad_time': 0, 'control_character': 0, 'empty_query': 0})
    for field in ('user', 'time', 'num_words', 'text_len', 'text_hash', 'text'):
      assert np.array_equal(getattr(read.records, field), getattr(whole.records, field))
  # The line a strict read names counts the lines of the chunks before it.
  for workers in (1, 2):
    with pytest.raises(aol_log.LogFormatError, match=r'a\.tsv:35: bad_field_count'):
      aol_log.read_logs(paths, strict=True, workers=workers)


def test_a_log_of_no_valid_line_names_its_lines_read_in_any_chunks(tmp_path, monkeypatch):
  """A log whose lines all fail one check is refused naming that reason, how many lines it
  took, and the first of them, however the file is cut into chunks; one valid line is read
  and the others counted by reason, every line once; strict names the first bad line."""
  path = write(tmp_path / 'log.tsv', [line(7, 'a', '2006-03-01T10:00:00'),
                                      line(7, 'b', '2006-03-01 10:01:00', rank='1'), 'x',
                                      line(7, 'c', '01/03/2006 10:02:00')])
  bad = write(tmp_path / 'bad.tsv', [line(7, 'a', '2006-03-01T10:00:00'), 'x',
                                     line(7, 'c', '01/03/2006 10:02:00')])
  message = (f'{bad}: none of its 4 lines reads as a query (bad_time 2, header 1, '
             'bad_field_count 1): QueryTime is not a valid YYYY-MM-DD HH:MM:SS, first at line '
             "2: '7\\ta\\t2006-03-01T10:00:00\\t\\t'")
  for chunk_bytes in (aol_log.CHUNK_BYTES, 37):
    monkeypatch.setattr(aol_log, 'CHUNK_BYTES', chunk_bytes)
    with pytest.raises(aol_log.LogFormatError) as error:
      aol_log.read_log(bad)
    assert str(error.value) == message
    read = aol_log.read_log(path)
    assert len(read.records) == 1 and read.lines_read == 5
    assert {r: n for r, n in read.skipped.items() if n} == {'header': 1, 'bad_time': 2,
                                                            'bad_field_count': 1}
  with pytest.raises(aol_log.LogFormatError, match=r'log\.tsv:2: bad_time: QueryTime is not'):
    aol_log.read_log(path, strict=True)


def test_strict_mode_names_file_line_and_reason(tmp_path):
  log = write(tmp_path / 'log.tsv', [line(1, 'a', '10:00:00'), line(1, '-', '10:01:00'),
                                     line(1, 'b', '2006-03-01 25:00:00'),
                                     line(1, 'c', '10:02:00')])
  with pytest.raises(aol_log.LogFormatError) as error:
    preprocess.prepare(config(log, strict=True), str(tmp_path / 'w'))
  assert str(error.value) == (f'{log}:4: bad_time: QueryTime is not a valid '
                              'YYYY-MM-DD HH:MM:SS')
  assert not os.path.exists(preprocess.data_dir(str(tmp_path / 'w')))
  # A query holding a NUL byte is malformed too (no typed query holds one).
  nul = write(tmp_path / 'nul.tsv', [line(1, 'a', '10:00:00'),
                                     b'1\tparis\x00hotels\t2006-03-01 10:01:00'])
  with pytest.raises(aol_log.LogFormatError, match=r'nul\.tsv:3: control_character: the query'):
    aol_log.read_log(nul, strict=True)
  assert aol_log.read_log(nul).skipped['control_character'] == 1
  # So do ESC and DEL, DEL also in a chunk with no byte below the space but tabs and newlines.
  for name, byte in (('esc', b'\x1b'), ('del', b'\x7f')):
    path = write(tmp_path / f'{name}.tsv', [line(1, 'a', '10:00:00'),
                                           b'1\tparis' + byte + b'hotels\t2006-03-01 10:01:00'])
    assert aol_log.read_log(path).skipped['control_character'] == 1
    with pytest.raises(aol_log.LogFormatError, match=rf'{name}\.tsv:3: control_character'):
      aol_log.read_log(path, strict=True)
  # A line that is not UTF-8 is no malformed line: it is read as Latin-1.
  latin1 = write(tmp_path / 'u.tsv', [line(1, 'a', '10:00:00'),
                                      b'1\tcaf\xe9\t2006-03-01 10:00:00'])
  assert aol_log.read_log(latin1, strict=True).latin1_lines == 1


def test_every_line_is_counted_once(tmp_path):
  rows = [line(1, 'a', '10:00:00'), line(1, 'a', '10:00:00'),  # duplicate
          line(1, 'b', '10:01:00'), line(1, 'c', '10:02:00'),  # a kept session of 3
          '1\tb',  # bad_field_count
          '',  # empty_line
          line('x', 'b', '10:03:00'),  # bad_user_id
          line(1, 'b', '2006-03-32 10:00:00'),  # bad_time
          b'1\t\xff\xfe\t2006-03-01 10:04:00\t\t',  # Latin-1: a query of the session
          b'1\tb\x00c\t2006-03-01 10:04:30',  # control_character
          line(1, '-', '10:05:00'), line(1, '   ', '10:05:00'),  # empty_query
          line(2, 'l ' * 11, '10:00:00'), line(2, 'm', '10:01:00'),  # long_query
          line(3, 's', '10:00:00'), line(3, 't', '10:01:00'),  # session_too_short
          *[line(4, f'u{i}', f'10:0{i}:00') for i in range(6)]]  # session_too_long
  stats = preprocess.prepare(config(write(tmp_path / 'log.tsv', rows),
                                    split_fractions=(1.0, 0.0, 0.0)), str(tmp_path / 'w'))
  assert stats['skipped'] == {
      'header': 1, 'empty_line': 1, 'bad_field_count': 1, 'bad_user_id': 1, 'bad_time': 1,
      'control_character': 1, 'empty_query': 2, 'duplicate_query': 1, 'long_query': 2,
      'session_too_short': 2, 'session_too_long': 6}
  assert stats['latin1_lines'] == 1
  kept = sum(stats[s]['sessions'] + stats[s]['pairs'] for s in sessions_lib.SPLITS)
  assert kept == 4
  assert stats['lines_read'] == len(rows) + 1 == kept + sum(stats['skipped'].values())


def test_a_missing_log_given_by_a_relative_path_names_the_folder_it_was_looked_in(
    tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(FileNotFoundError, match=re.escape(
      f'data/log.tsv: no such log file (from {tmp_path})')):
    preprocess.prepare(config('data/log.tsv'), str(tmp_path / 'w'))
  with pytest.raises(FileNotFoundError, match=re.escape(
      f'{tmp_path}/log.tsv: no such log file') + '$'):
    preprocess.prepare(config(str(tmp_path / 'log.tsv')), str(tmp_path / 'w'))


def test_errors_are_one_line_and_name_the_input(tmp_path):
  workdir = str(tmp_path / 'w')
  good = write(tmp_path / 'good.tsv', [line(1, 'a', '10:00:00')])
  cases = [(str(tmp_path / 'missing.tsv'), FileNotFoundError, 'missing.tsv: no such log file'),
           (str(tmp_path / 'nothing-*.gz'), FileNotFoundError, 'matches no file'),
           (str(tmp_path), FileNotFoundError, re.escape(
               f"{tmp_path}: a folder, not a log file (give its files, e.g. "
               f"'{tmp_path}/*.txt.gz')")),
           ('', FileNotFoundError, 'config.data.raw_files is empty'),
           (f'{good},{good}', ValueError, 'good.tsv: log file given twice')]
  binary = tmp_path / 'model.bin'
  binary.write_bytes(bytes(range(256)) * 64)
  cases.append((str(binary), aol_log.LogFormatError, 'model.bin: not an AOL query log'))
  (tmp_path / 'empty.tsv').write_bytes(b'')
  cases.append((str(tmp_path / 'empty.tsv'), aol_log.LogFormatError, 'empty.tsv: empty file'))
  (tmp_path / 'header-only.tsv').write_text(HEADER + '\n')
  cases.append((str(tmp_path / 'header-only.tsv'), aol_log.LogFormatError,
                'header-only.tsv: the log holds no records: its 1 line is the AnonID header'))
  csv = tmp_path / 'table.csv'  # parsable lines after the first 1,000 do not make it a log
  csv.write_text('a,b,c\n' * 1000 + '\n'.join([HEADER] + [line(1, 'q', '10:00:00')] * 9))
  cases.append((str(csv), aol_log.LogFormatError,
                'table.csv: not an AOL query log: none of its first 1,000 lines'))
  # A log whose times are in another form: the reason, its count, the first line and the
  # form expected, not "not an AOL query log" (with the header or without).
  iso = write(tmp_path / 'iso.tsv', [line(4945, 'rosa parks', '2006-03-01T15:58:56'),
                                     line(4945, 'selma', '2006-03-01T16:01:02')])
  cases.append((iso, aol_log.LogFormatError, re.escape(
      f'{iso}: none of its 3 lines reads as a query (bad_time 2, header 1): QueryTime is not '
      "a valid YYYY-MM-DD HH:MM:SS, first at line 2: '4945\\trosa parks\\t"
      "2006-03-01T15:58:56\\t\\t'") + '$'))
  long_iso = write(tmp_path / 'long-iso.tsv', [f'{u}\tq\t2006-03-01T15:58:56' for u in
                                               range(1200)], header=False)
  cases.append((long_iso, aol_log.LogFormatError, re.escape(
      'long-iso.tsv: none of its first 1,000 lines reads as a query (bad_time 1,000): '
      "QueryTime is not a valid YYYY-MM-DD HH:MM:SS, first at line 1: '0\\tq\\t"
      "2006-03-01T15:58:56'")))
  (tmp_path / 'cut.tsv.gz').write_bytes(gzip.compress(b'x' * 10000)[:40])
  cases.append((str(tmp_path / 'cut.tsv.gz'), aol_log.LogFormatError,
                'cut.tsv.gz: corrupt or truncated gzip data'))
  # Another compression than gzip: named, not read as lines that are no log's.
  log_text = open(good, 'rb').read()
  (tmp_path / 'log.tsv.bz2').write_bytes(bz2.compress(log_text))
  (tmp_path / 'log.tsv.xz').write_bytes(lzma.compress(log_text))
  with zipfile.ZipFile(tmp_path / 'log.zip', 'w') as archive:
    archive.writestr('log.tsv', log_text)
  # No compressor of these in the standard library: their formats' first bytes (RFC 8878's
  # magic number; 7-Zip's signature), then anything.
  (tmp_path / 'log.tsv.zst').write_bytes(b'\x28\xb5\x2f\xfd' + bytes(range(160)))
  (tmp_path / 'log.7z').write_bytes(b'7z\xbc\xaf\x27\x1c' + bytes(range(160)))
  for name, kind in (('log.tsv.bz2', 'bzip2'), ('log.tsv.xz', 'xz'), ('log.zip', 'zip'),
                     ('log.tsv.zst', 'zstd'), ('log.7z', '7z')):
    cases.append((str(tmp_path / name), aol_log.LogFormatError, re.escape(
        f'{name}: {kind}-compressed: only plain text or gzip is read; decompress it first')))
  cases.append((good, preprocess.EmptyCorpusError,
                r'no session kept from 2 lines .*session_too_short 1'))
  for raw_files, error_type, message in cases:
    with pytest.raises(error_type, match=message) as error:
      preprocess.prepare(config(raw_files), workdir)
    assert '\n' not in str(error.value)
    assert isinstance(error.value, errors.Error)  # the command line prints it, no traceback
    # A workdir made for the failed build is not left behind, empty.
    assert not os.path.exists(workdir)
  # One that was there before the build stays, though empty.
  os.makedirs(workdir)
  with pytest.raises(preprocess.EmptyCorpusError):
    preprocess.prepare(config(good), workdir)
  assert os.path.isdir(workdir) and not os.path.exists(preprocess.data_dir(workdir))


def test_a_tie_between_bad_user_ids_and_bad_times_names_the_time(tmp_path):
  """`_no_query` names the later check's reason on a tie (its docstring)."""
  path = write(tmp_path / 'tie.tsv', [line('u7', 'a', '10:00:00'),
                                      line(7, 'b', '2006-03-01T10:01:00')], header=False)
  with pytest.raises(aol_log.LogFormatError) as error:
    aol_log.read_log(path)
  assert str(error.value).startswith(
      f'{path}: none of its 2 lines reads as a query (bad_time 1, bad_user_id 1): QueryTime '
      'is not a valid YYYY-MM-DD HH:MM:SS, first at line 2: ')


def _many_sessions_log(path, num_sessions=100, extra_word=None):
  """One session of 3 queries per user; each session's first query has a word of its own.
  `extra_word` (users, word): the word added to every query of those users."""
  def text(u, i):
    words = f'topic{u % 7} q{i} w{(u * i) % 11}' + (f' user{u}' if i == 0 else '')
    return f'{words} {extra_word[1]}' if extra_word and u in extra_word[0] else words
  return write(path, [line(u, text(u, i), f'10:0{i}:00')
                      for u in range(num_sessions) for i in range(3)])


def test_split_sessions_is_a_seeded_partition():
  parts = preprocess.split_sessions(1000, (0.95, 0.025, 0.025), seed=3)
  assert [len(p) for p in parts] == [950, 25, 25]
  assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(1000))
  assert all(np.all(np.diff(p) > 0) for p in parts)
  again = preprocess.split_sessions(1000, (0.95, 0.025, 0.025), seed=3)
  other = preprocess.split_sessions(1000, (0.95, 0.025, 0.025), seed=4)
  assert all(np.array_equal(a, b) for a, b in zip(parts, again))
  assert not np.array_equal(parts[1], other[1])
  assert [len(p) for p in preprocess.split_sessions(7, (0.5, 0.5, 0.0), 0)] == [4, 3, 0]


def test_split_by_seed_and_fractions(tmp_path):
  log = _many_sessions_log(tmp_path / 'log.tsv')

  def texts(name, **data):
    workdir = str(tmp_path / name)
    stats = preprocess.prepare(config(log, min_word_count=1, **data), workdir)
    return stats, corpus(preprocess.data_dir(workdir))

  stats, first = texts('a', split_fractions=(0.6, 0.3, 0.1), split_seed=5)
  assert [stats[s]['sessions'] for s in sessions_lib.SPLITS] == [60, 30, 10]
  _, same = texts('b', split_fractions=(0.6, 0.3, 0.1), split_seed=5)
  _, reseeded = texts('c', split_fractions=(0.6, 0.3, 0.1), split_seed=6)
  assert same == first
  assert reseeded['test'][2] != first['test'][2]
  all_queries = sorted(sum((first[s][2] for s in sessions_lib.SPLITS), []))
  assert sorted(sum((reseeded[s][2] for s in sessions_lib.SPLITS), [])) == all_queries
  assert len(all_queries) == 300


def test_vocabulary_from_training_words_only(tmp_path):
  log = _many_sessions_log(tmp_path / 'log.tsv')
  workdir = str(tmp_path / 'w')
  stats = preprocess.prepare(config(log, min_word_count=3, split_fractions=(0.5, 0.3, 0.2)),
                             workdir)
  data = corpus(preprocess.data_dir(workdir))
  counts = collections.Counter(w for t in data['train'][2] for w in t.split())
  expected = Vocab.from_counts(counts, 3)
  assert data['vocab'] == expected.words and stats['vocab_size'] == len(expected)
  assert 0 < len(expected) - len(SPECIAL_TOKENS) < len(counts)
  eval_only = {w for s in ('valid', 'test') for t in data[s][2] for w in t.split()} - set(counts)
  assert eval_only  # words the vocabulary must not know
  # A word as frequent as a kept one, in validation and test sessions only: unknown. (The
  # same number of sessions and seed split the log the same way.)
  held = {int(w[4:]) for s in ('valid', 'test') for t in data[s][2] for w in t.split()
          if w.startswith('user')}
  frequent = _many_sessions_log(tmp_path / 'frequent.tsv', extra_word=(held, 'evalword'))
  workdir = str(tmp_path / 'frequent')
  preprocess.prepare(config(frequent, min_word_count=3, split_fractions=(0.5, 0.3, 0.2)),
                     workdir)
  again = corpus(preprocess.data_dir(workdir))
  uses = sum(t.split().count('evalword') for s in ('valid', 'test') for t in again[s][2])
  assert uses >= 3 and not any('evalword' in t.split() for t in again['train'][2])
  assert 'evalword' not in again['vocab']
  for split in sessions_lib.SPLITS:
    queries, _, split_texts = data[split]
    for ids, text in zip(queries, split_texts):
      words = text.split()
      assert ids[:len(words)] == expected.encode(words) and not any(ids[len(words):])
      assert all(i == UNK_ID for i, w in zip(ids, words) if w in eval_only)


def test_a_demo_workdir_moved_whole_reuses_its_corpus(tmp_path, capsys):
  """The demo log lives in the workdir: moved or copied whole (`cp -a`), the workdir's corpus
  is still current, not built again from the same log at its new path."""
  c = config('', min_word_count=1, demo_users=60)
  c.data.source = 'demo'
  preprocess.prepare(c, str(tmp_path / 'w'))
  moved = str((tmp_path / 'w').rename(tmp_path / 'moved'))
  capsys.readouterr()
  preprocess.prepare(c, moved, verbose=True)
  assert f'Reusing the corpus in {preprocess.data_dir(moved)}' in capsys.readouterr().out


def test_cache_reuse_rebuild_and_atomic_replace(tmp_path, capsys, monkeypatch):
  log = _many_sessions_log(tmp_path / 'log.tsv', 20)
  workdir = str(tmp_path / 'w')
  data_dir = preprocess.data_dir(workdir)
  c = config(log, min_word_count=1, split_fractions=(0.8, 0.1, 0.1))
  first = preprocess.prepare(c, workdir, verbose=True)
  assert 'Reusing' not in capsys.readouterr().out
  stamp = os.stat(os.path.join(data_dir, 'train.queries.npy')).st_mtime_ns

  c.data.strict = True  # not part of the fingerprint
  assert preprocess.prepare(c, workdir, verbose=True) == first
  out = capsys.readouterr().out
  assert f'Reusing the corpus in {data_dir}' in out
  assert 'train' in out and f'{first["train"]["sessions"]:>12,}' in out
  assert os.stat(os.path.join(data_dir, 'train.queries.npy')).st_mtime_ns == stamp

  c.data.min_word_count = 2
  second = preprocess.prepare(c, workdir, verbose=True)
  assert 'Reusing' not in capsys.readouterr().out
  assert second['vocab_size'] < first['vocab_size']
  os.utime(log, ns=(stamp, stamp + 10**9))  # the input changed
  preprocess.prepare(c, workdir, verbose=True)
  assert 'Reusing' not in capsys.readouterr().out

  # A build that dies half way leaves the last complete corpus as it was, and no debris;
  # the next build clears what a killed one left.
  before = corpus(data_dir)
  os.mkdir(os.path.join(workdir, '.data-build-killed'))
  c.data.split_seed = 9

  def fail_on_valid(data_dir, split, *args):
    if split == 'valid':
      raise KeyboardInterrupt
    save_split(data_dir, split, *args)

  save_split = sessions_lib.save_split
  monkeypatch.setattr(sessions_lib, 'save_split', fail_on_valid)
  with pytest.raises(KeyboardInterrupt):
    preprocess.prepare(c, workdir)
  assert corpus(data_dir) == before
  assert sorted(os.listdir(workdir)) == ['.workdir.lock', 'data']
  monkeypatch.undo()
  preprocess.prepare(c, workdir, verbose=True)
  assert 'Reusing' not in capsys.readouterr().out


def test_demo_source_writes_the_log_once(tmp_path, monkeypatch):
  calls = []

  def write_demo_log(path, num_users, seed):
    calls.append((num_users, seed))
    write(path, [line(u, f'demo {u} {i}', f'10:0{i}:00') for u in range(num_users)
                 for i in range(3)])

  fake = types.ModuleType('mtn_jax.data.synthetic.demo_log')
  fake.write_demo_log = write_demo_log
  import mtn_jax.data.synthetic  # pylint: disable=g-import-not-at-top,unused-import
  monkeypatch.setitem(sys.modules, 'mtn_jax.data.synthetic.demo_log', fake)
  monkeypatch.setattr(sys.modules['mtn_jax.data.synthetic'], 'demo_log', fake, raising=False)
  workdir = str(tmp_path / 'w')
  c = config('', source='demo', demo_users=8, demo_seed=1, min_word_count=1,
             split_fractions=(0.5, 0.25, 0.25))
  stats = preprocess.prepare(c, workdir)
  assert calls == [(8, 1)]
  assert os.path.exists(os.path.join(workdir, 'data', 'demo-log.tsv.gz'))
  assert stats['lines_read'] == 25 and sum(stats[s]['sessions']
                                           for s in sessions_lib.SPLITS) == 8
  c.data.min_word_count = 2  # a rebuild that keeps the demo log
  preprocess.prepare(c, workdir)
  assert calls == [(8, 1)]
  c.data.demo_users = 9
  assert preprocess.prepare(c, workdir)['lines_read'] == 28
  assert calls == [(8, 1), (9, 1)]


def test_real_sample(aol_sample, tmp_path):
  workdir = str(tmp_path / 'w')
  stats = preprocess.prepare(config(aol_sample), workdir)
  assert stats == {
      'lines_read': 157075, 'latin1_lines': 0,
      'skipped': {'header': 1, 'empty_line': 0, 'bad_field_count': 0, 'bad_user_id': 0,
                  'bad_time': 0, 'control_character': 0,
                  'empty_query': 0, 'duplicate_query': 19984,
                  'long_query': 1626, 'session_too_short': 77219, 'session_too_long': 18100},
      'train': {'sessions': 10669, 'pairs': 27455}, 'valid': {'sessions': 281, 'pairs': 725},
      'test': {'sessions': 281, 'pairs': 734}, 'tokenizer': 'word', 'vocab_size': 2731,
      'candidates': 27573}
  # The sample's documented figures: 11,231 sessions, 28,914 pairs, 2,851 words seen at
  # least 8 times in them, and the previous query as suggestion, over all pairs.
  previous_queries, references, counts = [], [], collections.Counter()
  for split in sessions_lib.SPLITS:
    s = sessions_lib.load_split(preprocess.data_dir(workdir), split)
    counts.update(w for t in s.texts for w in t.split())
    for i in range(s.num_sessions):
      texts = s.session_texts(i)
      previous_queries += texts[:-1]
      references += texts[1:]
  assert len(previous_queries) == 28914
  assert sum(c >= 8 for c in counts.values()) == 2851
  assert str(metrics.bleu(previous_queries, references)) == 'BLEU = 11.89, 25.2/14.8/9.2/6.2'


def test_split_users_keeps_each_user_in_one_split_with_session_shares():
  rng = np.random.default_rng(0)
  session_users = rng.integers(0, 300, 4000)  # users with 1 to ~25 sessions
  parts = preprocess.split_users(session_users, (0.9, 0.05, 0.05), seed=1)
  assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(4000))
  users = [set(session_users[p].tolist()) for p in parts]
  assert not (users[0] & users[1] or users[0] & users[2] or users[1] & users[2])
  # Shares by sessions, each off by at most one user's sessions at a boundary.
  most = np.bincount(session_users).max()
  for part, share in zip(parts, (0.9, 0.05, 0.05)):
    assert abs(len(part) - share * 4000) <= 2 * most
  again = preprocess.split_users(session_users, (0.9, 0.05, 0.05), seed=1)
  assert all(np.array_equal(a, b) for a, b in zip(parts, again))
  assert not np.array_equal(parts[1], preprocess.split_users(session_users,
                                                             (0.9, 0.05, 0.05), seed=2)[1])


def test_user_split_end_to_end_saves_users_and_times(tmp_path):
  # 40 users with 3 sessions each (two hours apart): a session split mixes users, a user
  # split never does.
  rows = [line(u, f'topic{u % 5} q{i} s{k}', f'{10 + 2 * k:02d}:0{i}:00')
          for u in range(40) for k in range(3) for i in range(3)]
  log = write(tmp_path / 'log.tsv', rows)
  fractions = (0.6, 0.2, 0.2)
  by_session = preprocess.prepare(config(log, split_fractions=fractions, min_word_count=1),
                                  str(tmp_path / 's'))
  by_user = preprocess.prepare(config(log, split_fractions=fractions, min_word_count=1,
                                      split_by='user'), str(tmp_path / 'u'))

  def users(workdir):
    return [set(sessions_lib.load_split(preprocess.data_dir(str(workdir)), s).users.tolist())
            for s in sessions_lib.SPLITS]

  user_sets = users(tmp_path / 'u')
  assert sum(len(u) for u in user_sets) == 40  # no user in two splits
  assert sum(len(u) for u in users(tmp_path / 's')) > 40
  assert ([by_user[s]['sessions'] for s in sessions_lib.SPLITS] == [72, 24, 24]
          == [by_session[s]['sessions'] for s in sessions_lib.SPLITS])
  train = sessions_lib.load_split(preprocess.data_dir(str(tmp_path / 'u')), 'train')
  first = train.session_texts(0)[0]
  # The start time of a session is its first query's: 2006-03-01 10:00, 12:00 or 14:00.
  assert (train.start_times[0] - 1141207200) % 7200 == 0 and first.endswith('s' + str(
      (train.start_times[0] - 1141207200) // 7200))


def test_train_users_keeps_that_many_training_users_and_the_other_splits(tmp_path):
  rows = [line(u, f'topic{u % 5} q{i} s{k}', f'{10 + 2 * k:02d}:0{i}:00')
          for u in range(40) for k in range(3) for i in range(3)]
  log = write(tmp_path / 'log.tsv', rows)
  kw = dict(split_fractions=(0.6, 0.2, 0.2), min_word_count=1, split_by='user')
  full = preprocess.prepare(config(log, **kw), str(tmp_path / 'all'))
  some = preprocess.prepare(config(log, train_users=5, **kw), str(tmp_path / 'five'))
  load = lambda w, s: sessions_lib.load_split(preprocess.data_dir(str(tmp_path / w)), s)
  assert len(set(load('five', 'train').users.tolist())) == 5
  assert set(load('five', 'train').users.tolist()) < set(load('all', 'train').users.tolist())
  assert some['train']['sessions'] == 15 and full['train']['sessions'] == 72
  # 24 users of 3 sessions in training: 5 kept, 19 left out with their 57 sessions.
  assert some['train_users'] == {'kept': 5, 'left_out': 19, 'left_out_sessions': 57}
  for split in ('valid', 'test'):
    assert np.array_equal(load('five', split).users, load('all', split).users)
  # 0 (every user) keeps the corpus fingerprint of a config without the key.
  without = config(log, **kw).data.to_dict()
  del without['train_users']
  manifest = lambda data: preprocess._manifest(  # pylint: disable=protected-access
      data, [str(log)], str(tmp_path / 'all' / 'data'))['fingerprint']
  assert manifest(ml_collections.ConfigDict(without)) == manifest(config(log, **kw).data)


def test_a_log_mostly_of_malformed_lines_is_said_to_be_read_wrong(tmp_path):
  """A company's export read as AOL's in part (hashed user ids here): the split too small for
  it names the malformed lines first, the likelier cause; a corpus built from a log with one
  malformed line in ten warns in its summary; a clean log's summary does not."""
  good = [line(u, f'topic{u % 7} q{i} user{u}', f'10:0{i}:00') for u in range(20)
          for i in range(3)]
  hashed = [line(f'u{u:x}', f'topic{u % 7} q{i}', f'10:0{i}:00') for u in range(400)
            for i in range(3)]
  log = write(tmp_path / 'hashed.tsv', good + hashed)
  with pytest.raises(preprocess.SplitTooSmallError, match=re.escape(
      'the test split is empty: 20 sessions were kept and config.data.split_fractions='
      '(0.95, 0.025, 0.025) gives it none of the sessions; 1,200 of the 1,261 lines read '
      '(95.2 %) are malformed (bad_user_id 1,200): is the log in the AOL format? Else, use '
      'more data or a larger config.data.split_fractions[2]')):
    preprocess.prepare(config(log, min_word_count=1), str(tmp_path / 'w'))
  kept = _many_sessions_log(tmp_path / 'clean.tsv', 300)
  stats = preprocess.prepare(config(kept, min_word_count=1), str(tmp_path / 'clean'))
  assert 'Warning' not in preprocess.summary(stats, 'clean')
  some = write(tmp_path / 'some.tsv', open(kept, encoding='utf-8').read().splitlines()[1:]
               + hashed[:120])
  stats = preprocess.prepare(config(some, min_word_count=1), str(tmp_path / 'some'))
  assert preprocess.summary(stats, 'some').endswith(
      'Warning: 120 of the 1,021 lines read (11.8 %) are malformed (bad_user_id 120): is the log '
      'in the AOL format (AnonID<TAB>Query<TAB>QueryTime[<TAB>ItemRank<TAB>ClickURL], AnonID '
      'digits, QueryTime YYYY-MM-DD HH:MM:SS)? config.data.strict names the first such line.')


def test_a_log_too_small_to_split_fails_at_preprocessing(tmp_path):
  log = _many_sessions_log(tmp_path / 'log.tsv', 20)
  with pytest.raises(preprocess.SplitTooSmallError) as error:
    preprocess.prepare(config(log, min_word_count=1), str(tmp_path / 'w'))
  assert str(error.value) == (
      'the test split is empty: 20 sessions were kept and config.data.split_fractions='
      '(0.95, 0.025, 0.025) gives it none of the sessions; use more data or a larger '
      'config.data.split_fractions[2]')
  assert not os.path.exists(preprocess.data_dir(str(tmp_path / 'w')))


def test_split_by_time_gives_valid_and_test_each_users_latest_sessions():
  rng = np.random.default_rng(0)
  session_users = rng.integers(0, 200, 3000)
  session_times = rng.integers(0, 10**6, 3000)
  parts = preprocess.split_by_time(session_users, session_times, (0.9, 0.05, 0.05), seed=2)
  assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(3000))
  assert [len(p) for p in parts] == [2700, 150, 150]
  train, valid, test = parts
  for later, earlier in ((valid, train), (test, train), (test, valid)):
    # Every held-out session comes after all of its user's sessions in the earlier split.
    for session in later:
      user = session_users[session]
      mine = earlier[session_users[earlier] == user]
      assert (session_times[mine] <= session_times[session]).all()
  again = preprocess.split_by_time(session_users, session_times, (0.9, 0.05, 0.05), seed=2)
  assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def test_split_by_time_takes_a_users_last_sessions_down_to_none_left_for_training():
  # The documented rule: each user gives its latest session to test, then its latest remaining
  # one to valid, while they are short; a user of one session gives it to one split at most
  # (test), a user of two may give both (training keeps none of its). Here the shares ask 2
  # sessions each of 3: user 7's one session and user 3's later one go to test, user 3's
  # earlier one to valid, whatever the order of the users.
  session_users = np.array([3, 7, 3])
  session_times = np.array([200, 50, 100])
  for seed in (0, 1):
    train, valid, test = preprocess.split_by_time(session_users, session_times,
                                                  (0.0, 0.5, 0.5), seed=seed)
    assert (train.tolist(), valid.tolist(), test.tolist()) == ([], [2], [0, 1])


def test_a_time_split_of_fewer_users_than_its_shares_ask_says_so(tmp_path):
  # 40 users of 3 sessions: a fifth of the 120 sessions is 24 a split, and each user gives
  # valid and test one session at most: 24 each, met; with 0.4 each, 48 asked, 40 given.
  rows = [line(u, f'topic{u % 5} q{i} s{k}', f'{10 + 2 * k:02d}:0{i}:00')
          for u in range(40) for k in range(3) for i in range(3)]
  log = write(tmp_path / 'log.tsv', rows)
  stats = preprocess.prepare(config(log, split_fractions=(0.6, 0.2, 0.2), min_word_count=1,
                                    split_by='time'), str(tmp_path / 'w'))
  assert 'time_split_short' not in stats and stats['test']['sessions'] == 24
  stats = preprocess.prepare(config(log, split_fractions=(0.2, 0.4, 0.4), min_word_count=1,
                                    split_by='time'), str(tmp_path / 'w2'))
  assert stats['time_split_short'] == {'valid': [40, 48], 'test': [40, 48]}
  assert stats['valid']['sessions'] == stats['test']['sessions'] == 40
  text = preprocess.summary(stats, 'w2')
  assert ("test: 40 sessions of the 48 config.data.split_fractions asks (split_by='time' "
          'takes one session a user at most)') in text


def test_history_holds_the_users_earlier_queries_and_never_a_later_one(tmp_path):
  # User 1: sessions A (10:00), B (12:00) and C (14:00); user 2: one session at 11:00. With
  # M = 4, B's history is A's queries, C's is the last four of A and B; a later query (of C,
  # or of another user) is never in a history, whatever split either session lands in.
  rows = [line(1, f'a{i}', f'10:0{i}:00') for i in range(3)]
  rows += [line(1, f'b{i}', f'12:0{i}:00') for i in range(3)]
  rows += [line(1, f'c{i}', f'14:0{i}:00') for i in range(3)]
  rows += [line(2, f'z{i}', f'11:0{i}:00') for i in range(3)]
  log = write(tmp_path / 'log.tsv', rows)
  workdir = str(tmp_path / 'w')
  # All in training, so that every word has its own id and a query of the wrong session
  # would show; the histories come from the global (user, time) order, whatever the split.
  preprocess.prepare(config(log, min_word_count=1, history_queries=4,
                            split_fractions=(1.0, 0.0, 0.0)), workdir)
  data_dir = preprocess.data_dir(workdir)
  splits = [sessions_lib.load_split(data_dir, split) for split in sessions_lib.SPLITS]
  ids = {text: s.queries[row].tolist() for s in splits for row, text in enumerate(s.texts)}
  histories = {}
  for s in splits:
    assert s.history.shape == (s.num_sessions, 4, 10)
    for i in range(s.num_sessions):
      histories[s.session_texts(i)[0]] = [q.tolist() for q in s.history[i] if q.any()]
  expected = {'a0': [], 'b0': ['a0', 'a1', 'a2'], 'c0': ['a2', 'b0', 'b1', 'b2'], 'z0': []}
  assert histories == {first: [ids[t] for t in texts] for first, texts in expected.items()}
  # The same histories as candidate-pool items, -1 in front where there are fewer than M.
  pool = candidate_pool.load_pool(data_dir)
  items = {}
  for s in splits:
    history_items = candidate_pool.load_history_items(data_dir, s.name, s.num_sessions)
    for i in range(s.num_sessions):
      row = history_items[i].tolist()
      assert row == [-1] * row.count(-1) + [j for j in row if j >= 0]
      items[s.session_texts(i)[0]] = [pool.texts[j] for j in row if j >= 0]
  assert items == expected
  # Without history_queries the split holds an empty history.
  preprocess.prepare(config(log, min_word_count=1, split_fractions=(0.5, 0.25, 0.25)),
                     str(tmp_path / 'v'))
  assert sessions_lib.load_split(preprocess.data_dir(str(tmp_path / 'v')),
                                 'train').history.shape[1] == 0


def test_a_corpus_checkpoints_were_trained_on_is_not_rebuilt_with_other_settings(tmp_path):
  """Other config.data settings would leave the checkpoints with another vocabulary and
  splits: refused before data/ is touched. The same log moved is no other setting; a log
  that changed is built aside and taken only where it makes the same files."""
  log = _many_sessions_log(tmp_path / 'log.tsv', 20)
  workdir = str(tmp_path / 'w')
  c = config(log, min_word_count=1, split_fractions=(0.8, 0.1, 0.1))
  preprocess.prepare(c, workdir)
  os.makedirs(os.path.join(workdir, 'checkpoints', '30'))
  before = corpus(preprocess.data_dir(workdir))
  c.data.min_word_count = 3
  with pytest.raises(preprocess.CorpusInUseError, match=re.escape(
      f'{preprocess.data_dir(workdir)} was built with other settings, and the checkpoints in '
      f'{workdir}/checkpoints were trained on it (config.data.min_word_count: 1 there, 3 '
      'here): use the settings it was built with, or a new workdir')):
    preprocess.prepare(c, workdir)
  assert corpus(preprocess.data_dir(workdir)) == before
  c.data.min_word_count = 1
  moved = tmp_path / 'moved.tsv'
  os.rename(log, moved)
  c.data.raw_files = str(moved)
  preprocess.prepare(c, workdir)  # rebuilt from the moved log: the same settings and files
  assert corpus(preprocess.data_dir(workdir)) == before
  # The log changed: built aside, compared, and refused where a file would differ.
  with open(moved, 'a', encoding='utf-8') as f:  # one more session
    f.write(''.join(line(999, f'new words {i}', f'11:0{i}:00') + '\n' for i in range(3)))
  with pytest.raises(preprocess.CorpusInUseError, match=re.escape(
      f'{preprocess.data_dir(workdir)}: the corpus built now would differ from the one the '
      f'checkpoints in {workdir}/checkpoints were trained on (its ')):
    preprocess.prepare(c, workdir)
  assert corpus(preprocess.data_dir(workdir)) == before
  assert sorted(os.listdir(workdir)) == ['.workdir.lock', 'checkpoints', 'data']
  with open(os.path.join(preprocess.data_dir(workdir), 'manifest.json'), 'w') as f:
    f.write('{')  # with no record of how it was built, it is still compared
  with pytest.raises(preprocess.CorpusInUseError, match='the corpus built now would differ'):
    preprocess.prepare(c, workdir)
  assert corpus(preprocess.data_dir(workdir)) == before


def test_a_damaged_corpus_checkpoints_were_trained_on_is_made_again_only_as_it_was(
    tmp_path, monkeypatch):
  """The same log and settings: a damaged file is made again; where the code that builds
  the corpus changed what it writes, the checkpoints' corpus is kept and the build refused."""
  log = _many_sessions_log(tmp_path / 'log.tsv', 20)
  workdir = str(tmp_path / 'w')
  data_dir = preprocess.data_dir(workdir)
  c = config(log, min_word_count=1, split_fractions=(0.8, 0.1, 0.1))
  preprocess.prepare(c, workdir)
  os.makedirs(os.path.join(workdir, 'checkpoints', '30'))
  before = corpus(data_dir)
  with open(os.path.join(data_dir, 'train.queries.npy'), 'r+b') as f:
    f.truncate(100)
  preprocess.prepare(c, workdir)
  assert corpus(data_dir) == before
  os.remove(os.path.join(data_dir, 'valid.queries.npy'))  # not whole: rebuilt, compared
  from_counts = Vocab.from_counts
  monkeypatch.setattr(Vocab, 'from_counts', classmethod(
      lambda cls, counts, min_count: Vocab(from_counts(counts, min_count).words[:-1])))
  with pytest.raises(preprocess.CorpusInUseError, match=r'\(its vocab\.json\): its log, or '
                     'the code that builds it, changed'):
    preprocess.prepare(c, workdir)
  assert not os.path.exists(os.path.join(data_dir, 'valid.queries.npy'))
  monkeypatch.undo()
  preprocess.prepare(c, workdir)
  assert corpus(data_dir) == before


def test_a_full_disk_while_building_names_the_corpus_and_leaves_nothing(tmp_path, monkeypatch):
  log = _many_sessions_log(tmp_path / 'log.tsv', 20)
  workdir = tmp_path / 'w'

  def full(*args):
    del args
    raise OSError(28, 'No space left on device')  # as a write names no file
  monkeypatch.setattr(preprocess, '_write_corpus', full)
  with pytest.raises(preprocess.CorpusWriteError, match=re.escape(
      f'{workdir}/data: writing the corpus failed (No space left on device); nothing was '
      'changed')):
    preprocess.prepare(config(log, min_word_count=1), str(workdir))
  assert not workdir.exists()  # the workdir it made, and its half-built corpus, removed


def test_a_damaged_corpus_is_built_again_and_strict_mode_is_not_reused_past(tmp_path, capsys):
  log = write(tmp_path / 'log.tsv', [line(1, 'a b', '10:00:00'), line(1, 'a c', '10:01:00'),
                                     line(1, 'a d', '10:02:00'), '1\tbroken',
                                     line(2, 'b c', '10:00:00'), line(2, 'b d', '10:02:00'),
                                     line(2, 'b e', '10:03:00')])
  workdir = str(tmp_path / 'w')
  c = config(log, min_word_count=1, split_fractions=(1.0, 0.0, 0.0))
  preprocess.prepare(c, workdir)
  data_dir = preprocess.data_dir(workdir)
  before = corpus(data_dir)
  with open(os.path.join(data_dir, 'train.queries.npy'), 'r+b') as f:
    f.truncate(100)
  preprocess.prepare(c, workdir, verbose=True)
  assert 'Reusing' not in capsys.readouterr().out and corpus(data_dir) == before
  for damage in ('{"lines_read": 1', '{}'):
    with open(os.path.join(data_dir, 'stats.json'), 'w', encoding='utf-8') as f:
      f.write(damage)
    preprocess.prepare(c, workdir, verbose=True)
    assert 'Reusing' not in capsys.readouterr().out and corpus(data_dir) == before
  preprocess.prepare(c, workdir, verbose=True)
  assert 'Reusing' in capsys.readouterr().out
  # Built without `strict` from a log with a malformed line: `strict` names it, as a fresh
  # build would, and leaves the corpus as it was.
  c.data.strict = True
  with pytest.raises(aol_log.LogFormatError, match=re.escape(f'{log}:5: bad_field_count')):
    preprocess.prepare(c, workdir)
  assert corpus(data_dir) == before


def test_strict_mode_builds_again_a_corpus_whose_stats_lack_a_malformed_reason(tmp_path,
                                                                               capsys):
  """A corpus built before a reason was counted kept such lines: reused without `strict`,
  built again with it (which names the first malformed line, if any)."""
  log = _many_sessions_log(tmp_path / 'log.tsv', 20)
  workdir = str(tmp_path / 'w')
  data_dir = preprocess.data_dir(workdir)
  c = config(log, min_word_count=1, split_fractions=(0.8, 0.1, 0.1))
  preprocess.prepare(c, workdir)
  stats_path, manifest_path = (os.path.join(data_dir, n) for n in ('stats.json',
                                                                    'manifest.json'))
  with open(stats_path) as f:
    stats = json.load(f)
  del stats['skipped']['control_character']
  with open(stats_path, 'w') as f:
    json.dump(stats, f)
  with open(manifest_path) as f:
    manifest = json.load(f)
  manifest['sizes']['stats.json'] = os.path.getsize(stats_path)  # whole, as far as sizes go
  with open(manifest_path, 'w') as f:
    json.dump(manifest, f)
  capsys.readouterr()
  preprocess.prepare(c, workdir, verbose=True)
  assert 'Reusing' in capsys.readouterr().out
  c.data.strict = True
  assert preprocess.prepare(c, workdir, verbose=True)['skipped']['control_character'] == 0
  assert 'Reusing' not in capsys.readouterr().out


def test_a_second_run_preprocessing_in_a_workdir_is_refused(tmp_path):
  from mtn_jax import files  # pylint: disable=g-import-not-at-top
  import fcntl  # pylint: disable=g-import-not-at-top
  log = _many_sessions_log(tmp_path / 'log.tsv', 20)
  workdir = str(tmp_path / 'w')
  c = config(log, min_word_count=1, split_fractions=(0.8, 0.1, 0.1))
  os.makedirs(workdir)
  with open(os.path.join(workdir, files.WORKDIR_LOCK), 'a+', encoding='utf-8') as other:
    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another process's, as far as flock goes
    other.write('4242 preprocessing')
    other.flush()
    with pytest.raises(files.WorkdirBusy, match=re.escape(
        f'{workdir}: another run is preprocessing in it (process 4242); wait for it to end, '
        'or use another workdir')):
      preprocess.prepare(c, workdir)
    assert not os.path.exists(preprocess.data_dir(workdir))
  # Training holds the lock and builds its corpus under it.
  with files.workdir_alone(workdir, 'training'):
    preprocess.prepare(c, workdir)


def test_counts_add_up_with_training_users_left_out_and_the_summary_shows_them(tmp_path):
  rows = [line(u, f'topic{u % 5} q{i} s{k}', f'{10 + 2 * k:02d}:0{i}:00')
          for u in range(40) for k in range(3) for i in range(3)]
  log = write(tmp_path / 'log.tsv', rows)
  stats = preprocess.prepare(config(log, split_fractions=(0.6, 0.2, 0.2), min_word_count=1,
                                    split_by='user', train_users=5), str(tmp_path / 'w'))
  # 19 users left out, each 3 sessions of 3 queries.
  assert stats['skipped'][preprocess.USER_LEFT_OUT] == 19 * 9
  kept = preprocess.kept_queries(stats)
  assert stats['lines_read'] == len(rows) + 1 == kept + sum(stats['skipped'].values())
  text = preprocess.summary(stats, 'w')
  assert (f'lines read: {len(rows) + 1:,} (0 of them read as Latin-1): {kept:,} queries '
          f'kept, {len(rows) + 1 - kept:,} skipped by reason:') in text
  assert f'  {preprocess.USER_LEFT_OUT:<20}{19 * 9:>12,}' in text
  assert 'vocabulary: ' in text and (' words (those of the training split seen '
                                     'config.data.min_word_count times or more), special '
                                     'tokens included') in text


def test_expand_paths_takes_files_named_like_globs_and_names_what_is_not_a_file(tmp_path):
  odd = write(tmp_path / 'log[1].tsv', [line(1, 'a', '10:00:00')])
  assert aol_log.expand_paths(odd) == [odd]
  # A glob's matches in sorted order (the order of equal times across files), after the
  # paths before it.
  parts = [write(tmp_path / f'part-{k}.tsv', [line(1, k, '10:00:00')]) for k in 'cadb']
  assert aol_log.expand_paths(f'{odd}, {tmp_path}/part-*.tsv') == [odd] + sorted(parts)
  fifo = tmp_path / 'pipe'
  os.mkfifo(fifo)
  with pytest.raises(aol_log.MissingLogError, match=re.escape(f'{fifo}: not a regular file')):
    aol_log.expand_paths(str(fifo))


def test_the_settings_a_corpus_was_built_with_are_told_apart_from_the_configs(tmp_path):
  """What eval, decode and serve (which read a workdir's corpus as it was built) note of a
  config whose `config.data` asks for another corpus."""
  rows = [line(u, f'query {u} {i}', f'10:{i:02d}:00') for u in range(1, 9) for i in range(4)]
  log = write(tmp_path / 'log.tsv', rows)
  kwargs = dict(split_fractions=(0.5, 0.25, 0.25), min_word_count=1)
  workdir = str(tmp_path / 'w')
  assert preprocess.settings_differences(config(log, **kwargs).data, workdir) == []  # none
  preprocess.prepare(config(log, **kwargs), workdir)
  assert preprocess.settings_differences(config(log, **kwargs).data, workdir) == []
  other = config(tmp_path / 'moved.tsv', **{**kwargs, 'min_word_count': 3, 'strict': True})
  assert preprocess.settings_differences(other.data, workdir) == [
      'config.data.min_word_count: 1 there, 3 here']


def test_a_log_exactly_one_tenth_malformed_is_warned_of(tmp_path):
  """The warning holds from one line in ten malformed: 100 of 1,000 warn."""
  kept = _many_sessions_log(tmp_path / 'clean.tsv', 300)  # a header, then 900 lines
  hashed = [line(f'u{u:x}', f'topic{u % 7} q{i}', f'10:0{i}:00') for u in range(50)
            for i in range(2)]
  log = write(tmp_path / 'tenth.tsv', open(kept, encoding='utf-8').read().splitlines()[1:]
              + hashed, header=False)
  stats = preprocess.prepare(config(log, min_word_count=1), str(tmp_path / 'w'))
  assert stats['lines_read'] == 1000
  assert preprocess.summary(stats, 'w').endswith(
      'Warning: 100 of the 1,000 lines read (10.0 %) are malformed (bad_user_id 100): is the '
      'log in the AOL format (AnonID<TAB>Query<TAB>QueryTime[<TAB>ItemRank<TAB>ClickURL], '
      'AnonID digits, QueryTime YYYY-MM-DD HH:MM:SS)? config.data.strict names the first such '
      'line.')


def test_a_split_of_a_workdir_that_does_not_exist_names_the_folder(tmp_path):
  # A mistyped workdir is told apart from one that is not preprocessed yet.
  with pytest.raises(FileNotFoundError, match=re.escape(f'{tmp_path}/nope: no such folder')):
    sessions_lib.load_split(preprocess.data_dir(str(tmp_path / 'nope')), 'train')
  (tmp_path / 'w').mkdir()
  with pytest.raises(FileNotFoundError, match='train.queries.npy is missing: run '
                     '--mode=preprocess first'):
    sessions_lib.load_split(preprocess.data_dir(str(tmp_path / 'w')), 'train')
