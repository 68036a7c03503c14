"""The data layer's shared pieces: Latin-1 queries kept and counted, one query normalisation,
splits by session or by user with each session's user and start time kept, and a log too small
to split refused at preprocessing."""

from __future__ import annotations

import gzip
import json
import os
import re
import sys

import numpy as np
import pytest

from configs import default
from mtn_jax import config_lib
from mtn_jax import errors
from mtn_jax.data import aol_log
from mtn_jax.data import preprocess
from mtn_jax.data import sessions as sessions_lib
from mtn_jax.data import vocab as vocab_lib

DAY = 1141171200  # 2006-03-01 00:00:00, seconds since 1970


def row(user, query, hhmm, url='') -> bytes:
  """One 5-field log line on 2006-03-01 at `hhmm` (HH:MM); `query` and `url` str or bytes."""
  as_bytes = lambda x: x if isinstance(x, bytes) else x.encode()
  return b'\t'.join([str(user).encode(), as_bytes(query), f'2006-03-01 {hhmm}:00'.encode(),
                     b'1' if url else b'', as_bytes(url)])


def write(path, rows) -> str:
  with open(path, 'wb') as f:
    f.write(b''.join(r + b'\n' for r in rows))
  return str(path)


def config(raw_files, **data):
  c = default.get_config()
  c.data.raw_files = str(raw_files)
  c.data.min_word_count = 1
  for key, value in data.items():
    c.data[key] = value
  return c


def sessions_log(path, sessions_per_user: dict[int, int]) -> str:
  """Each user's sessions of 3 queries, two hours apart, starting at 08:00."""
  return write(path, [row(user, f'u{user} s{k} q{i}', f'{8 + 2 * k:02d}:0{i}')
                      for user, count in sessions_per_user.items() for k in range(count)
                      for i in range(3)])


def all_sessions(data_dir):
  """{split: [(user, start_time, [texts])]} of a prepared corpus."""
  out = {}
  for split in sessions_lib.SPLITS:
    s = sessions_lib.load_split(data_dir, split, mmap=False)
    out[split] = [(int(s.users[i]), int(s.start_times[i]), s.session_texts(i))
                  for i in range(s.num_sessions)]
  return out


# Latin-1 queries


def test_decode_text():
  assert aol_log.decode_text('caf\u00e9'.encode()) == ('caf\u00e9', False)
  assert aol_log.decode_text(b'caf\xe9') == ('caf\u00e9', True)
  assert aol_log.decode_text(b'\xff\xfe') == ('\u00ff\u00fe', True)
  assert aol_log.decode_text(b'') == ('', False)
  assert aol_log.decode_text(b'plain') == ('plain', False)


def test_a_latin1_query_is_read_kept_and_counted(tmp_path):
  log = write(tmp_path / 'log.tsv', [
      row(1, 'coffee', '10:00'), row(1, b'caf\xe9 au lait', '10:01'), row(1, 'tea', '10:02'),
      row(2, b'cr\xe8me', '10:00'),  # Latin-1, but a session of one query: skipped as such
      row(3, b'\xe9t\xe9', '25:00')])  # Latin-1 with a bad time: skipped as bad_time
  workdir = str(tmp_path / 'w')
  stats = preprocess.prepare(config(log, split_fractions=(1.0, 0.0, 0.0)), workdir)
  train = sessions_lib.load_split(preprocess.data_dir(workdir), 'train')
  assert train.texts == ['coffee', 'caf\u00e9 au lait', 'tea']
  assert 'caf\u00e9' in sessions_lib.load_vocab(preprocess.data_dir(workdir)).words
  assert stats['latin1_lines'] == 3
  assert tuple(stats['skipped']) == aol_log.REASONS  # no skip reason for Latin-1
  assert (stats['skipped']['session_too_short'], stats['skipped']['bad_time']) == (1, 1)
  assert stats['lines_read'] == 5 == 3 + sum(stats['skipped'].values())


def test_a_latin1_field_leaves_the_utf8_query_of_its_line_alone(tmp_path):
  log = aol_log.read_log(write(tmp_path / 'log.tsv', [
      row(1, 'cr\u00e8me br\u00fbl\u00e9e', '10:00', url=b'http://caf\xe9.fr'),  # URL Latin-1
      row(1, b'CR\xc8ME', '10:01', url='http://cr\u00e8me.fr'),  # query Latin-1, URL UTF-8
      row(1, 'na\u00efve', '10:02')]))
  assert log.records.texts(np.arange(3)) == ['cr\u00e8me br\u00fbl\u00e9e', 'cr\u00e8me',
                                             'na\u00efve']
  assert log.latin1_lines == 2 and log.lines_read == 3 and not any(log.skipped.values())


def test_latin1_lines_across_gzip_chunks_and_workers(tmp_path, monkeypatch):
  """Chunks without a non-UTF-8 byte and chunks with one read alike, in any process."""
  rows = [row(u, f'query {u} {i}', f'10:0{i}') for u in range(1, 40) for i in range(3)]
  rows[50] = row(17, b'se\xf1or', '10:02')
  monkeypatch.setattr(aol_log, 'CHUNK_BYTES', 256)
  paths = [write(tmp_path / 'a.tsv', rows[:60]), str(tmp_path / 'b.tsv.gz')]
  with gzip.open(paths[1], 'wb') as f:
    f.write(b''.join(r + b'\n' for r in rows[60:]))
  in_process = aol_log.read_logs(paths, workers=1)
  assert in_process.latin1_lines == 1
  assert in_process.records.texts(np.array([50])) == ['se\u00f1or']
  assert in_process.lines_read == len(rows)
  in_workers = aol_log.read_logs(paths, workers=2)  # whole files as one chunk each
  assert in_workers.latin1_lines == 1 and in_workers.lines_read == len(rows)
  assert np.array_equal(in_workers.records.text, in_process.records.text)


# One query normalisation


def test_normalize_query():
  assert aol_log.normalize_query(' CHEAP\u00a0 Flights\u3000') == 'cheap flights'
  assert aol_log.normalize_query('www.MySpace.com  &  Co.') == 'www.myspace.com & co.'
  assert aol_log.normalize_query('') == aol_log.normalize_query(' \t ') == ''
  assert aol_log.normalize_query('\u00c9COLE \u039f\u0394\u039f\u03a3') == (
      '\u00e9cole \u03bf\u03b4\u03bf\u03c2')  # str.lower: a final capital sigma is final
  # Capitals whose lower case is longer in UTF-8 (the reader cleans a field in place).
  assert aol_log.normalize_query('\u0130STANBUL') == 'istanbul'
  assert aol_log.normalize_query('\u023aB \u023e') == '\u023ab \u023e'
  # One spelling of what looks the same (NFKC): a decomposed umlaut (macOS, iOS) is the
  # composed one, full-width letters are ASCII; a query NFKC would lengthen keeps its form.
  assert aol_log.normalize_query('Wetter Mu\u0308nchen') == 'wetter m\u00fcnchen'
  assert aol_log.normalize_query('\uff49\uff50\uff48\uff4f\uff4e\uff45 \uff11\uff15') == 'iphone 15'
  assert aol_log.normalize_query('\u00bd PRICE') == '\u00bd price'
  # Bidirectional controls, which show a text in another order than it reads, are dropped;
  # a joiner inside an emoji is no such control and stays.
  assert aol_log.normalize_query('abc\u202edef\u2066 GHI\u2069') == 'abcdef ghi'
  assert aol_log.normalize_query('\u202e') == ''
  assert aol_log.normalize_query('\U0001f469\u200d\U0001f4bb') == '\U0001f469\u200d\U0001f4bb'


def test_lower_case_exceptions_cover_this_pythons_unicode():
  """Every character whose lower case is longer in UTF-8 is an exception, and only those."""
  longer = {c for c in map(chr, range(sys.maxunicode + 1))
            if not 0xd800 <= ord(c) < 0xe000
            and len(c.lower().encode()) > len(c.encode())}
  assert longer == set(aol_log._LOWER_CASE_EXCEPTIONS)
  for c, lower in aol_log._LOWER_CASE_EXCEPTIONS.items():
    assert len(lower.encode()) <= len(c.encode())


def test_the_reader_cleans_queries_as_normalize_query_does(tmp_path):
  queries = ['CHEAP Flights', 'cheap  flights ', '\u00c9cole NORMALE', '\u0130stanbul OTEL',
             '\u023a\u023e x', 'A\u00a0B\u2003C', 'ok', ' MiXeD\x0bcase ', '\u039f\u0394\u039f\u03a3',
             'ARIZONA ZOO',  # plain ASCII: A to Z lower-cased in place
             'rock\x0broll', 'a\x1cb\x1dc\x1ed\x1fe',  # str.split's whitespace, not refused
             # NFKC, where it is no longer
             'Mu\u0308nchen \uff49\uff50\uff48\uff4f\uff4e\uff45', '\u00bd Off']
  rows = [row(1, q, f'10:{i:02d}') for i, q in enumerate(queries)]
  rows.append(row(1, b'CAF\xc9  AU lait', '10:30'))  # Latin-1
  log = aol_log.read_log(write(tmp_path / 'log.tsv', rows))
  expected = [aol_log.normalize_query(q) for q in queries + ['CAF\u00c9  AU lait']]
  assert log.records.texts(np.arange(len(rows))) == expected
  assert expected[-6:-1] == ['arizona zoo', 'rock roll', 'a b c d e', 'm\u00fcnchen iphone',
                             '\u00bd off']
  # Texts gathered a few records at a time read the same, in any order of records.
  assert log.records.texts(np.arange(len(rows)), batch=3) == expected
  assert log.records.texts(np.arange(len(rows))[::-1], batch=4) == expected[::-1]
  assert log.records.num_words.tolist() == [len(t.split(' ')) for t in expected]
  assert expected[3] == 'istanbul otel' and expected[-1] == 'caf\u00e9 au lait'


def test_lower_casing_changes_one_query_of_the_real_sample(aol_sample):
  changed = []
  with gzip.open(aol_sample, 'rb') as f:
    next(f)  # the header
    for number, raw in enumerate(f, 2):
      query = aol_log.decode_text(raw)[0].split('\t')[1]
      if aol_log.normalize_query(query) != ' '.join(query.split()):
        changed.append((number, query))
  assert changed == [(83527, 'hermTs gardens & homes houston')]


# Splits by session or by user, with users and start times


def test_session_split_is_the_same_as_before_split_by():
  # Computed by split_sessions before user splits existed: the same seed, the same split.
  assert [p.tolist() for p in preprocess.split_sessions(12, (0.5, 0.25, 0.25), 0)] == [
      [2, 4, 5, 7, 9, 11], [0, 3, 6], [1, 8, 10]]
  assert [p.tolist() for p in preprocess.split_sessions(10, (0.6, 0.2, 0.2), 7)] == [
      [0, 1, 3, 6, 7, 8], [2, 4], [5, 9]]


def test_session_split_keeps_users_and_start_times(tmp_path):
  log = sessions_log(tmp_path / 'log.tsv', {5: 2, 9: 3, 12: 1, 30: 2})
  workdir = str(tmp_path / 'w')
  c = config(log, split_fractions=(0.5, 0.25, 0.25), split_seed=3)
  assert c.data.split_by == 'session'
  preprocess.prepare(c, workdir)
  corpus = all_sessions(preprocess.data_dir(workdir))
  # Sessions in user then time order, split by the ids split_sessions gives for the seed.
  in_order = [(user, DAY + (8 + 2 * k) * 3600, [f'u{user} s{k} q{i}' for i in range(3)])
              for user, count in ((5, 2), (9, 3), (12, 1), (30, 2)) for k in range(count)]
  parts = preprocess.split_sessions(8, (0.5, 0.25, 0.25), 3)
  assert corpus == {split: [in_order[i] for i in part]
                    for split, part in zip(sessions_lib.SPLITS, parts)}
  train = sessions_lib.load_split(preprocess.data_dir(workdir), 'train')
  assert train.users.dtype == np.int64 and train.start_times.dtype == np.int64
  assert train.users.shape == train.start_times.shape == (train.num_sessions,)


def test_user_split_puts_each_user_in_one_split(tmp_path):
  per_user = {u: 1 + u % 4 for u in range(1, 31)}  # 30 users, 1 to 4 sessions each
  log = sessions_log(tmp_path / 'log.tsv', per_user)
  workdir = str(tmp_path / 'w')
  stats = preprocess.prepare(config(log, split_fractions=(0.6, 0.2, 0.2), split_by='user',
                                    split_seed=1), workdir)
  corpus = all_sessions(preprocess.data_dir(workdir))
  users = {split: {user for user, _, _ in corpus[split]} for split in corpus}
  assert not (users['train'] & users['valid'] or users['train'] & users['test']
              or users['valid'] & users['test'])
  for split in corpus:  # every session of a user in its split, with its own start time
    assert sorted(start for _, start, _ in corpus[split]) == sorted(
        DAY + (8 + 2 * k) * 3600 for user in users[split] for k in range(per_user[user]))
    for user, start, texts in corpus[split]:
      assert texts[0] == f'u{user} s{(start - DAY - 8 * 3600) // 7200} q0'
  total = sum(per_user.values())  # 75 sessions; by sessions, each within half a user's 4
  for split, share in zip(sessions_lib.SPLITS, (0.6, 0.2, 0.2)):
    assert abs(stats[split]['sessions'] - share * total) <= 4


def test_split_by_is_part_of_the_fingerprint(tmp_path, capsys):
  log = sessions_log(tmp_path / 'log.tsv', {u: 2 for u in range(20)})
  workdir = str(tmp_path / 'w')
  data_dir = preprocess.data_dir(workdir)
  c = config(log, split_fractions=(0.5, 0.25, 0.25))
  preprocess.prepare(c, workdir)
  by_session = all_sessions(data_dir)
  c.data.split_by = 'user'
  preprocess.prepare(c, workdir, verbose=True)
  assert 'Reusing' not in capsys.readouterr().out
  with open(os.path.join(data_dir, 'manifest.json')) as f:
    assert json.load(f)['data_config']['split_by'] == 'user'
  assert all_sessions(data_dir) != by_session
  preprocess.prepare(c, workdir, verbose=True)
  assert 'Reusing' in capsys.readouterr().out


def test_a_corpus_without_users_and_start_times_loads_and_is_rebuilt(tmp_path):
  log = sessions_log(tmp_path / 'log.tsv', {u: 2 for u in range(8)})
  workdir = str(tmp_path / 'w')
  data_dir = preprocess.data_dir(workdir)
  c = config(log, split_fractions=(0.5, 0.25, 0.25))
  preprocess.prepare(c, workdir)
  expected = all_sessions(data_dir)
  for split in sessions_lib.SPLITS:  # as a corpus written before they were kept
    for kind in sessions_lib.OPTIONAL_KINDS:
      os.remove(sessions_lib.split_paths(data_dir, split)[kind])
  old = sessions_lib.load_split(data_dir, 'valid')
  assert old.users is None and old.start_times is None and old.num_sessions == 4
  preprocess.prepare(c, workdir)
  assert all_sessions(data_dir) == expected


def test_users_that_do_not_fit_the_sessions_are_named(tmp_path):
  log = sessions_log(tmp_path / 'log.tsv', {u: 2 for u in range(8)})
  workdir = str(tmp_path / 'w')
  preprocess.prepare(config(log, split_fractions=(0.5, 0.25, 0.25)), workdir)
  path = sessions_lib.split_paths(preprocess.data_dir(workdir), 'test')['users']
  np.save(path, np.zeros(3, np.int64))
  with pytest.raises(sessions_lib.CorpusFileError,
                     match=rf'{path}: shape \(3,\), but .*test.sessions.npy holds 4 sessions'):
    sessions_lib.load_split(preprocess.data_dir(workdir), 'test')
  # The users' earlier queries too: a history of another number of sessions is named.
  np.save(path, np.zeros(4, np.int64))
  history = sessions_lib.split_paths(preprocess.data_dir(workdir), 'test')['history']
  np.save(history, np.zeros((3, 0, 10), np.int32))
  with pytest.raises(sessions_lib.CorpusFileError,
                     match=rf'{history}: 3 sessions, but .*test.sessions.npy holds 4'):
    sessions_lib.load_split(preprocess.data_dir(workdir), 'test')


# A log too small to split


@pytest.mark.parametrize('per_user, data, message', [
    # 1 session; (0.4, 0.3, 0.3) rounds train's share of it to none.
    ({1: 1}, dict(split_fractions=(0.4, 0.3, 0.3)),
     'the train split is empty: 1 session was kept and config.data.split_fractions='
     r'\(0.4, 0.3, 0.3\) gives it none of the sessions; use more data or a larger '
     r'config.data.split_fractions\[0\]'),
    # Two users of 5 sessions: the first's sessions fill train, the second's go to test.
    ({1: 5, 2: 5}, dict(split_fractions=(0.5, 0.25, 0.25), split_by='user'),
     'the valid split is empty: 10 sessions of 2 users were kept and config.data.'
     r'split_fractions=\(0.5, 0.25, 0.25\) gives it none of the users; use more data or a '
     r'larger config.data.split_fractions\[1\]'),
    ({u: 1 for u in range(30)}, dict(split_fractions=(0.9, 0.09, 0.01)),
     r'the test split is empty: 30 sessions were kept .*split_fractions\[2\]$'),
])
def test_a_log_too_small_to_split_fails_in_one_line(tmp_path, per_user, data, message):
  workdir = str(tmp_path / 'w')
  with pytest.raises(preprocess.SplitTooSmallError, match=message) as error:
    preprocess.prepare(config(sessions_log(tmp_path / 'log.tsv', per_user), **data), workdir)
  assert isinstance(error.value, errors.Error) and '\n' not in str(error.value)
  assert not os.path.exists(preprocess.data_dir(workdir))


def test_a_split_given_no_share_may_be_empty(tmp_path):
  log = sessions_log(tmp_path / 'log.tsv', {1: 2})
  stats = preprocess.prepare(config(log, split_fractions=(0.5, 0.5, 0.0)), str(tmp_path / 'w'))
  assert [stats[s]['sessions'] for s in sessions_lib.SPLITS] == [1, 1, 0]


# Config checks of the data section


@pytest.mark.parametrize('key, value, message', [
    ('split_by', 'users', "config.data.split_by must be 'session', 'user' or 'time', got 'users'"),
    ('split_fractions', (0.0, 0.5, 0.5),
     r'config.data.split_fractions\[0\] \(train\) must be positive'),
    ('split_fractions', (0.9, 0.2, -0.1), 'three non-negative numbers'),
])
def test_data_config_checks(key, value, message):
  c = config('log.tsv')
  c.data[key] = value
  with pytest.raises(config_lib.ConfigError, match=message):
    config_lib.validate(c, mode='preprocess')
  for split_by in ('session', 'user', 'time'):
    c = config('log.tsv', split_by=split_by)
    config_lib.validate(c, mode='preprocess')


def test_a_damaged_vocabulary_or_array_is_one_error_naming_the_file(tmp_path):
  """A truncated or garbage vocab.json, a truncated split array: one error naming the file
  and what fixes it, not a JSON, numpy or mmap traceback."""
  vocab = tmp_path / 'vocab.json'
  for text in ('{"words": ["<pad>", "<u', '{"words": 5}', '[]'):
    vocab.write_text(text, encoding='utf-8')
    with pytest.raises(vocab_lib.VocabFileError, match=re.escape(
        f'{vocab}: not a vocabulary (')) as error:
      vocab_lib.Vocab.load(str(vocab))
    assert str(error.value).endswith('run --mode=preprocess again')
  array = tmp_path / 'test.queries.npy'
  np.save(array, np.zeros((100, 10), np.int32))
  with open(array, 'r+b') as f:
    f.truncate(1000)
  for mmap_mode in (None, 'r'):
    with pytest.raises(sessions_lib.CorpusFileError, match=re.escape(
        f'{array}: not a readable array (')):
      sessions_lib._array(str(array), mmap_mode)  # pylint: disable=protected-access


def test_a_word_spelled_like_a_special_token_is_unknown():
  """Log text never becomes a special id: `<pad>` as a token would blank the query, `</s>`
  end it early."""
  from mtn_jax.data import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  v = vocab_lib.Vocab.from_counts({'a': 3, 'b': 2, '<pad>': 9, '</s>': 9}, 1)
  assert v.words == vocab_lib.SPECIAL_TOKENS + ('a', 'b')
  assert v.encode_text('a <pad> b </s> <s> <sep> <unk>') == [5, 1, 6, 1, 1, 1, 1]
  assert [v.id(t) for t in vocab_lib.SPECIAL_TOKENS] == [vocab_lib.UNK_ID] * 5
