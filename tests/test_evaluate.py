"""Evaluation, decode input and report pieces that need no trained model.

Trivial suggesters on a hand-made split, decode-input reading (sessions files and raw AOL
logs), and the report built from hand-written results files.
"""

import bz2
import gzip
import io
import json
import os
import re
import types

import ml_collections
import numpy as np
import pytest

from configs import demo
from configs import families
from mtn_jax import models
from mtn_jax import tasks
from mtn_jax.data.sessions import SessionSplit
from mtn_jax.data.vocab import SPECIAL_TOKENS
from mtn_jax.data.vocab import UNK_ID
from mtn_jax.data.vocab import Vocab
from mtn_jax.decoding import search
from mtn_jax.evaluation import evaluate
from mtn_jax.evaluation import pool_ranking
from mtn_jax.evaluation import report
from mtn_jax.evaluation import trivial
from mtn_jax.inference import inputs
from mtn_jax.inference import pipeline
from mtn_jax.inference import popular
from mtn_jax.inference import sources
from mtn_jax.inference import suggest
from mtn_jax.inference.trained import Trained


def test_every_source_has_a_label_apart_from_the_suggesters():
  """eval's table names each source of a plan in words, apart from the trivial suggesters (a
  source added without its label fails at import: `sources.LABELS`)."""
  assert set(sources.LABELS) == set(sources.NAMES)
  labels = [*sources.LABELS.values(), *pipeline.BLEND_LABELS.values(),
            *trivial.SUGGESTERS.values()]
  assert len(set(labels)) == len(labels)


def make_split(tmp_path, name, sessions):
  """A SessionSplit whose raw texts are `sessions` (lists of query texts); ids unused."""
  texts = [q for s in sessions for q in s]
  path = tmp_path / f'{name}.queries.txt'
  path.write_text(''.join(t + '\n' for t in texts), encoding='utf-8')
  starts = np.cumsum([0] + [len(s) for s in sessions])
  return SessionSplit(name, np.zeros((len(texts), 4), np.int32), starts, str(path))


# ---------------------------------------------------------------------------------------------
# Pairs and trivial suggesters


TRAIN = [
    ['a', 'b', 'c'],  # a -> b, b -> c
    ['a', 'c'],  # a -> c
    ['b', 'a', 'b'],  # b -> a, a -> b
    ['a', 'c', 'z'],  # a -> c, c -> z; z ends a session...
    ['w', 'd'],  # ...so z -> w must not be counted
    ['d', 'e'],
    ['d', 'e'],
    ['d', 'f'],
]
TEST = [['a', 'x'], ['b', 'z', 'q'], ['d', 'n', 'o', 'p']]


def test_pair_texts_and_positions(tmp_path):
  test = make_split(tmp_path, 'test', TEST)
  session, position = test.pair_positions()
  assert session.tolist() == [0, 1, 1, 2, 2, 2]
  assert position.tolist() == [0, 0, 1, 0, 1, 2]
  previous, following = test.pair_texts()
  assert previous == ['a', 'b', 'z', 'd', 'n', 'o']
  assert following == ['x', 'z', 'q', 'n', 'o', 'p']


def test_trivial_suggesters_exact_candidates(tmp_path):
  train = make_split(tmp_path, 'train', TRAIN)
  test = make_split(tmp_path, 'test', TEST)
  previous, _ = test.pair_texts()
  assert trivial.repeat_previous(previous) == previous
  # a: b 2x, c 2x -> tie, b seen first. b: c 1x, a 1x -> c seen first. z: only followed by
  # w across a session boundary -> repeated. d: e 2x beats f. n, o: never seen -> repeated.
  assert [ranked[0] for ranked in trivial.most_frequent_next_lists(
      popular.LogCounts(train), previous, k=1)] == ['b', 'c', 'z', 'e', 'n', 'o']


def test_most_frequent_next_reads_only_the_split_rows(tmp_path):
  # A prefix split's text file holds more rows than the split: they must not count.
  full = make_split(tmp_path, 'train', [['a', 'b'], ['a', 'c'], ['a', 'c']])
  prefix = evaluate.prefix_split(full, 1)
  assert prefix.num_sessions == 1 and prefix.texts == ['a', 'b']
  assert trivial.most_frequent_next_lists(popular.LogCounts(prefix), ['a'], k=1) == [['b']]
  assert trivial.most_frequent_next_lists(popular.LogCounts(full), ['a'], k=1) == [['c']]


def test_score_entry_holds_the_printed_line():
  from mtn_jax.evaluation import metrics  # pylint: disable=g-import-not-at-top
  entry = evaluate.score_entry(metrics.bleu(['a b c d'], ['a b c d']))
  assert entry['line'] == 'BLEU = 100.00, 100.0/100.0/100.0/100.0'
  assert entry['precisions'] == [100.0] * 4 and entry['hyp_len'] == entry['ref_len'] == 4


def test_history_groups_split_pairs_at_five_earlier_queries_and_weigh_the_zero_vector():
  """Users with at least MIN_HISTORY (5) earlier queries are "with history", 1 to 4 "short",
  none "without": every pair in exactly one group. The zero-vector weight is given for the
  "with history" group alone, apart for next queries that share a word with the history
  (<unk> is no shared word) and those that do not."""
  assert evaluate.MIN_HISTORY == 5
  # Four sessions of two queries (one pair each), whose users have 0, 4, 5 and 6 earlier
  # queries; session 2's next query shares word 10 with its history, session 3's only <unk>.
  queries = np.array([[20, 0], [21, 0], [20, 0], [21, 0], [20, 0], [10, 0], [20, 0],
                      [12, UNK_ID]], np.int32)
  history = np.zeros((4, 6, 2), np.int32)
  history[1, 2:] = [13, 0]
  history[2, 1:] = [10, 0]
  history[3, :] = [11, UNK_ID]
  split = SessionSplit('test', queries, np.array([0, 2, 4, 6, 8]), history=history)
  ranked = pool_ranking.SplitRanking(
      suggestions=[[]] * 4, top_scores=np.zeros((4, 1), np.float32),
      pool_ranks=np.array([1, 2, 3, 4]), sampled_ranks=np.ones((4, 2), np.int64),
      zero_weight=np.array([0.9, 0.8, 0.2, 0.4], np.float32))
  groups = evaluate.history_groups(split, {'model': [['x'], ['y'], ['z'], ['w']]},
                                   ['x', 'q', 'z', 'q'], [['a']] * 4, ranked)
  assert {name: g['pairs'] for name, g in groups.items()} == {
      'with_history': 2, 'short_history': 1, 'without_history': 1}
  assert [groups[name]['scores']['model']['ranking']['exact_match']
          for name in ('with_history', 'short_history', 'without_history')] == [50, 0, 100]
  assert groups['with_history']['pool']['mrr'] == pytest.approx(100 * (1 / 3 + 1 / 4) / 2)
  assert groups['with_history']['zero_weight'] == pytest.approx(
      {'all': 0.3, 'next_query_shares_a_word': 0.2, 'next_query_shares_no_word': 0.4})
  assert 'zero_weight' not in groups['short_history']
  assert 'zero_weight' not in groups['without_history']
  # A history kept 3 queries wide (config.data.history_queries=3) is whole at 3: those
  # users are "with history", not all "short".
  narrow = SessionSplit('test', queries, np.array([0, 2, 4, 6, 8]), history=history[:, 3:])
  groups = evaluate.history_groups(narrow, {'model': [['x'], ['y'], ['z'], ['w']]},
                                   ['x', 'q', 'z', 'q'], [['a']] * 4, None)
  assert {name: g['pairs'] for name, g in groups.items()} == {
      'with_history': 3, 'short_history': 0, 'without_history': 1}


def test_eval_files_hold_every_pairs_lists_and_the_samples_in_pair_order(tmp_path):
  """lists.jsonl: every pair under both protocols; samples.jsonl: the sampled pairs in pair
  order, '' as the prediction of a pair without suggestions (the report's sample tables
  print it); all of them prefixed by the split where it is not the test split."""
  pairs = evaluate.Pairs(session=np.array([0, 0, 1]), position=np.array([0, 1, 0]),
                         contexts=[['a'], ['a', 'b'], ['c']], previous=['a', 'b', 'c'],
                         references=['b', 'd', 'e'])
  shown = {False: [[{'query': 'b', 'score': -0.5}], [], [{'query': 'c', 'score': -1.0}]],
           True: [[{'query': 'b', 'score': -0.5}], [], []]}
  lists = evaluate.Lists(shown, {}, None, {}, 'MTN', 1.0)
  written = evaluate.write_results(str(tmp_path), {'split': 'valid', 'pairs': 3}, lists, pairs,
                                   prefix='valid_', seed=0)
  eval_dir = tmp_path / 'eval'
  assert written == str(eval_dir / 'valid_results.json')
  assert sorted(os.listdir(eval_dir)) == ['valid_lists.jsonl', 'valid_results.json',
                                          'valid_samples.jsonl']
  records = [json.loads(line) for line in
             (eval_dir / 'valid_lists.jsonl').read_text(encoding='utf-8').splitlines()]
  assert records == [
      {'session': 0, 'position': 0, 'context': ['a'], 'reference': 'b',
       'suggestions': shown[False][0], 'suggestions_excluding_session': shown[True][0]},
      {'session': 0, 'position': 1, 'context': ['a', 'b'], 'reference': 'd',
       'suggestions': [], 'suggestions_excluding_session': []},
      {'session': 1, 'position': 0, 'context': ['c'], 'reference': 'e',
       'suggestions': shown[False][2], 'suggestions_excluding_session': []}]
  samples = [json.loads(line) for line in
             (eval_dir / 'valid_samples.jsonl').read_text(encoding='utf-8').splitlines()]
  assert [(s['session'], s['position'], s['predicted'], s['actual']) for s in samples] == [
      (0, 0, 'b', 'b'), (0, 1, '', 'd'), (1, 0, 'c', 'e')]


# ---------------------------------------------------------------------------------------------
# Decode input


VOCAB = Vocab(SPECIAL_TOKENS + ('cheap', 'flights', 'boston', 'hotels', 'red', 'sox'))


def make_reader(max_query_words=3, max_session_queries=3):
  return inputs.QueryReader(VOCAB, max_query_words, max_session_queries)


def test_session_lines_tabs_empty_oov_and_long(tmp_path):
  path = tmp_path / 'sessions.tsv'
  path.write_bytes(
      b'cheap flights\tboston\n'  # line 1
      b'\n'  # 2: empty
      b'  \t \r\n'  # 3: only blanks
      b'red  sox\t\tcheap flights to boston now\r\n'  # 4: an empty query, a long one, 3 OOV
      b'a\tb\tc\td\te\n'  # 5: longer than the 3-query table, 5 OOV of which 3 kept
      b'hotels')  # 6: no final newline
  reader = make_reader()
  contexts = list(inputs.read_sessions_file(str(path), reader, strict=False))
  assert [(c.info['line'], c.queries, c.first_output) for c in contexts] == [
      (1, ('cheap flights', 'boston'), 1),
      (4, ('red sox', 'cheap flights to'), 1),
      (5, ('c', 'd', 'e'), 2),
      (6, ('hotels',), 0),
  ]
  assert dict(reader.counts) == {'empty_lines': 2, 'empty_queries': 1, 'long_queries': 1,
                                 'long_sessions': 1, 'oov_words': 1 + 3, 'lines_read': 6}


def test_sessions_file_gzip_and_latin1(tmp_path):
  """A line that is not UTF-8 is a query read as Latin-1 (counted), in strict mode too."""
  path = tmp_path / 'sessions.tsv.gz'
  with gzip.open(path, 'wb') as f:
    f.write(b'boston\thotels\ncaf\xe9 paris\tbrie\nred sox\n')
  for strict in (False, True):
    reader = make_reader()
    contexts = list(inputs.read_sessions_file(str(path), reader, strict=strict))
    assert [c.queries for c in contexts] == [('boston', 'hotels'), ('caf\xe9 paris', 'brie'),
                                             ('red sox',)]
    assert reader.counts['latin1_lines'] == 1


RAW_HEADER = 'AnonID\tQuery\tQueryTime\tItemRank\tClickURL\n'


@pytest.mark.parametrize('first_line, expected', [
    (RAW_HEADER, 'raw'),
    ('142\tcheap flights\t2006-03-01 07:17:12\t1\thttp://x.com\n', 'raw'),
    ('142\tcheap flights\t2006-03-01 07:17:12\n', 'raw'),
    ('cheap flights\tboston\thotels\n', 'sessions'),
    ('142\tcheap flights\tyesterday\n', 'sessions'),
    ('-142\tcheap flights\t2006-03-01 07:17:12\n', 'raw'),  # a malformed log line
    ('u142\tcheap flights\t2006-03-01 07:17:12\n', 'raw'),
    ('cheap flights\tparis\t2006-03-01 07:17:12\n', 'sessions'),  # a query first
    ('\tcheap flights\t2006-03-01 07:17:12\n', 'raw'),  # no user
    ('cheap flights\n', 'sessions'),
    # A log's line whose time is in another form: its AnonID and time are no queries.
    ('4945\trosa parks\t2006-03-01T15:58:56\n', 'raw'),
    ('4945\trosa parks\t2006/03/01 15:58\t1\thttp://x.com\n', 'raw'),
    # Sessions whose queries are numbers, a date or a date-time after words, stay sessions.
    ('4945\t1984\t1141228736\n', 'sessions'),
    ('4945\trosa parks\t2006-03-01\n', 'sessions'),
    ('4945\trosa parks\tmlk\t2006-03-01T15:58:56\n', 'sessions'),
    ('rosa parks\t4945\t2006-03-01T15:58:56\n', 'sessions'),
])
def test_detect_format(tmp_path, first_line, expected):
  path = tmp_path / 'input.txt'
  path.write_text('\n\n' + first_line + 'more\n', encoding='utf-8')
  assert inputs.detect_format(str(path)) == expected


def test_a_log_whose_first_line_is_malformed_is_a_log(tmp_path):
  """The form at least half of the first lines have: one bad line does not make a log a
  sessions file (its queries would be suggested after the user ids and times)."""
  log = ['7\tfoo\tyesterday\t\t\n'] + [f'7\tq{i}\t2006-03-01 10:0{i}:00\n' for i in range(3)]
  path = tmp_path / 'log.txt'
  path.write_text(''.join(log), encoding='utf-8')
  assert inputs.detect_format(str(path)) == 'raw'
  path.write_text(''.join(log[:1] + ['cheap flights\tboston\n'] * 2), encoding='utf-8')
  assert inputs.detect_format(str(path)) == 'sessions'
  # Only the first FORMAT_LINES non-empty lines count.
  path.write_text('cheap flights\n' * inputs.FORMAT_LINES + ''.join(log[1:] * 100),
                  encoding='utf-8')
  assert inputs.detect_format(str(path)) == 'sessions'


ISO_LOG = ('4945\trosa parks\t2006-03-01T15:58:56\t\t\n'
           '4945\tmartin luther king\t2006-03-01T16:01:02\t1\thttp://www.mlk.org\n')


def test_a_log_of_another_time_form_is_refused_naming_it_not_read_as_sessions(tmp_path):
  """The log's header makes a log whatever its lines hold, and so do lines of an AnonID and a
  time in another form (ISO's): read as sessions, their user ids and times would be
  suggested after. The log reader refuses a log of no valid line naming the reason, its
  count and first line, and the time's form; a valid line among them is read, the others
  counted by reason."""
  path = tmp_path / 'iso.tsv'
  for text, tally, first in ((RAW_HEADER + ISO_LOG, 'bad_time 2, header 1', 2),
                             (ISO_LOG, 'bad_time 2', 1)):
    path.write_text(text, encoding='utf-8')
    assert inputs.detect_format(str(path)) == 'raw'
    with pytest.raises(inputs.DecodeInputError) as error:
      list(inputs.read_raw_log(str(path), make_reader(), data_config(), chunk_sessions=2))
    assert str(error.value) == (
        f'{path}: none of its {first + 1} lines reads as a query ({tally}): QueryTime is not a '
        f"valid YYYY-MM-DD HH:MM:SS, first at line {first}: "
        "'4945\\trosa parks\\t2006-03-01T15:58:56\\t\\t'")
  # Whatever its lines hold: a header then lines of sessions is a log, its lines named.
  path.write_text(RAW_HEADER + 'cheap flights\tboston\nparis\n', encoding='utf-8')
  assert inputs.detect_format(str(path)) == 'raw'
  with pytest.raises(inputs.DecodeInputError, match=re.escape(
      'none of its 3 lines reads as a query (bad_field_count 2, header 1): expected 3 or 5 '
      'tab-separated fields (AnonID, Query, QueryTime[, ItemRank, ClickURL]), first at line '
      "2: 'cheap flights\\tboston'")):
    list(inputs.read_raw_log(str(path), make_reader(), data_config(), chunk_sessions=2))
  # One valid line: read, the others counted by reason, every line once.
  path.write_text(RAW_HEADER + ISO_LOG + '4945\tselma\t2006-03-01 16:05:00\n',
                  encoding='utf-8')
  reader = make_reader()
  contexts = list(inputs.read_raw_log(str(path), reader, data_config(), chunk_sessions=2))
  assert [c.queries for c in contexts] == [('selma',)]
  assert (reader.counts['skipped_bad_time'], reader.counts['skipped_header'],
          reader.counts['lines_read']) == (2, 1, 4)
  # In a sessions file such a line is a log's, skipped and counted.
  path.write_text('cheap flights\tboston\n' * 3 + ISO_LOG, encoding='utf-8')
  assert inputs.detect_format(str(path)) == 'sessions'
  reader = make_reader()
  assert len(list(inputs.read_sessions_file(str(path), reader, strict=False))) == 3
  assert (reader.counts['log_lines'], reader.counts['lines_read']) == (2, 5)


def test_detect_format_refuses_an_empty_file(tmp_path):
  path = tmp_path / 'empty.txt'
  path.write_text('\n \n', encoding='utf-8')
  with pytest.raises(inputs.DecodeInputError, match='empty.txt: no session to decode'):
    inputs.detect_format(str(path))


def test_detect_format_names_a_binary_file_and_a_file_of_no_text(tmp_path):
  binary = tmp_path / 'random.bin'
  binary.write_bytes(np.random.default_rng(0).integers(0, 256, 20_000, np.uint8).tobytes())
  with pytest.raises(inputs.DecodeInputError, match='random.bin: not a text file'):
    inputs.detect_format(str(binary))
  blank = tmp_path / 'blank.txt'
  blank.write_text('\n\n', encoding='utf-8')
  with pytest.raises(inputs.DecodeInputError, match='empty but for 2 blank lines'):
    inputs.detect_format(str(blank))


def test_decode_input_errors_name_the_file_a_folder_and_corrupt_gzip(tmp_path):
  with pytest.raises(inputs.DecodeInputError, match=f'{tmp_path}: a folder, not a decode input'):
    inputs.detect_format(str(tmp_path))
  # A gzip header, then garbage: the file is named, with what is wrong.
  corrupt = tmp_path / 'sessions.txt.gz'
  corrupt.write_bytes(gzip.compress(b'cheap flights\tparis\n' * 50)[:12] + b'\xff' * 40)
  with pytest.raises(inputs.DecodeInputError, match='sessions.txt.gz: corrupt or truncated gzip'):
    inputs.detect_format(str(corrupt))
  # Another compression: named (its bytes are no sessions).
  bzipped = tmp_path / 'sessions.txt.bz2'
  bzipped.write_bytes(bz2.compress(b'cheap flights\tparis\n' * 50))
  with pytest.raises(inputs.DecodeInputError, match=re.escape(
      'sessions.txt.bz2: bzip2-compressed: only plain text or gzip is read')):
    inputs.detect_format(str(bzipped))
  # Corrupt after a good first block: found while reading, with the line reached.
  good = gzip.compress(''.join(f'q{i}\tr{i}\n' for i in range(30000)).encode())
  late = tmp_path / 'late.txt.gz'
  late.write_bytes(good[:len(good) // 2])
  reader = inputs.QueryReader(VOCAB, 10, 5)
  assert inputs.detect_format(str(late)) == 'sessions'
  with pytest.raises(inputs.DecodeInputError, match=r'late.txt.gz: corrupt or truncated gzip '
                     r'data after line [\d,]+'):
    list(inputs.read_sessions_file(str(late), reader, strict=False))


def test_old_mac_line_ends_are_line_ends(tmp_path):
  # A lone CR ends a line as LF and CR LF do: merged, the sessions would be one, unnoticed.
  path = tmp_path / 'mac.txt'
  path.write_bytes(b'weather boston\tnews\rcheap flights\r\rparis\r\nrome\n')
  reader = make_reader()
  contexts = list(inputs.read_sessions_file(str(path), reader, strict=False))
  assert [(c.info['line'], len(c.queries)) for c in contexts] == [(1, 2), (2, 1), (4, 1),
                                                                  (5, 1)]
  assert reader.counts['empty_lines'] == 1 and reader.counts['lines_read'] == 5


def test_a_stray_nul_skips_its_line_and_a_binary_file_is_refused(tmp_path):
  """A text file with a control character in one line loses that line alone (counted; named
  with strict), where a file of many control bytes (binary, UTF-16) is no text at all."""
  path = tmp_path / 'sessions.txt'
  path.write_bytes(b'boston\thotels\nparis\x00hotels\tbrie\nred sox\n')
  assert inputs.detect_format(str(path)) == 'sessions'
  reader = make_reader()
  contexts = list(inputs.read_sessions_file(str(path), reader, strict=False))
  assert [c.info['line'] for c in contexts] == [1, 3]
  assert reader.counts['control_character_lines'] == 1
  assert reader.counts['lines_read'] == 3  # what was read and what was skipped add up
  with pytest.raises(inputs.DecodeInputError,
                     match=r'sessions.txt:2: the line holds the control character U\+0000'):
    list(inputs.read_sessions_file(str(path), make_reader(), strict=True))
  # A Latin-1 line's C1 bytes are its code page's punctuation, as in the log: kept.
  path.write_bytes(b'rock \x92n roll\n')
  reader = make_reader()
  assert len(list(inputs.read_sessions_file(str(path), reader, strict=True))) == 1
  # A few such lines (a typed escape sequence in each of 3): text, those lines skipped.
  path.write_bytes(b'rock\x1b[A\nroll\n' * 3 + b'jazz\n' * 3)
  assert inputs.detect_format(str(path)) == 'sessions'
  utf16 = tmp_path / 'utf16.txt'
  utf16.write_bytes('boston\thotels\n'.encode('utf-16'))
  with pytest.raises(inputs.DecodeInputError, match=r'utf16.txt: not a text file \(14 of its '
                     r'first 30 bytes are control bytes such as NUL\)'):
    inputs.detect_format(str(utf16))


def test_a_headerless_log_with_malformed_lines_is_a_log_and_no_file_mixes_forms(tmp_path):
  """Log lines of a wrong field count still read as a log's (the log reader counts them),
  not as sessions whose queries would be user ids and times; a log line inside a sessions
  file is skipped and counted (named with strict) rather than suggested after."""
  good = [f'7\tq{i}\t2006-03-01 10:0{i}:00\n' for i in range(2)]
  four_fields = [f'7\tr{i}\t2006-03-01 10:1{i}:00\t1\n' for i in range(3)]
  path = tmp_path / 'log.txt'
  path.write_text(''.join(good + four_fields), encoding='utf-8')
  assert inputs.detect_format(str(path)) == 'raw'
  reader = make_reader()
  contexts = list(inputs.read_raw_log(str(path), reader, data_config(), chunk_sessions=2))
  assert [c.queries for c in contexts] == [('q0', 'q1')]
  assert reader.counts['skipped_bad_field_count'] == 3
  # Users that are no AnonID: a log still, its lines counted, never suggested after.
  path.write_text(''.join(good + [f'-7\tn{i}\t2006-03-01 10:2{i}:00\n' for i in range(3)]),
                  encoding='utf-8')
  assert inputs.detect_format(str(path)) == 'raw'
  reader = make_reader()
  contexts = list(inputs.read_raw_log(str(path), reader, data_config(), chunk_sessions=2))
  assert [c.queries for c in contexts] == [('q0', 'q1')]
  assert reader.counts['skipped_bad_user_id'] == 3
  path.write_text('cheap flights\tboston\n' * 3 + good[0], encoding='utf-8')
  assert inputs.detect_format(str(path)) == 'sessions'
  reader = make_reader()
  assert len(list(inputs.read_sessions_file(str(path), reader, strict=False))) == 3
  assert reader.counts['log_lines'] == 1 and reader.counts['lines_read'] == 4
  with pytest.raises(inputs.DecodeInputError,
                     match=r'log.txt:4: a line of an AOL-format log in a file read as sessions'):
    list(inputs.read_sessions_file(str(path), make_reader(), strict=True))


def data_config(gap=30.0):
  return ml_collections.ConfigDict({'session_gap_minutes': gap, 'strict': False,
                                    'history_queries': 0})


def test_a_query_or_session_exactly_at_its_limit_is_not_counted_long(tmp_path):
  reader = make_reader(max_query_words=3, max_session_queries=3)
  assert reader.query('cheap flights boston') == 'cheap flights boston'
  path = tmp_path / 'sessions.tsv'
  path.write_text('cheap\tflights\tboston\n', encoding='utf-8')
  [context] = inputs.read_sessions_file(str(path), reader, strict=False)
  assert context.queries == ('cheap', 'flights', 'boston')
  assert len(reader.raw_session(['cheap', 'flights', 'boston'], {'session': 0})) == 1
  assert reader.counts['long_queries'] == reader.counts['long_sessions'] == 0


def test_a_long_raw_session_keeps_the_users_past_at_every_position(tmp_path):
  """Past the model's session table the window slides: every context still carries the
  user's history, and every query of the session (not the first window's alone) joins the
  history of the user's next session."""
  reader = make_reader(max_session_queries=2)
  contexts = reader.raw_session(['a', 'b', 'c', 'd'], {'session': 0}, history=('old',))
  assert [c.history for c in contexts] == [('old',)] * 3
  path = tmp_path / 'log.txt'
  path.write_text(''.join([f'7\tq{i}\t2006-03-01 10:0{i}:00\n' for i in range(4)]
                          + ['7\tnext\t2006-03-01 12:00:00\n']), encoding='utf-8')
  contexts = list(inputs.read_raw_log(str(path), make_reader(max_session_queries=2),
                                      data_config(), chunk_sessions=2, past_queries=10))
  assert contexts[-1].queries == ('next',)
  assert contexts[-1].history == ('q0', 'q1', 'q2', 'q3')


def test_a_raw_logs_gap_blanks_control_characters_and_users_as_configured(tmp_path):
  # The time field read with blanks around it; the config's session gap, not 30 minutes.
  assert inputs.is_raw_log_line('7\tcheap flights\t2006-03-01 10:00:00 ')
  assert inputs.is_raw_log_line('7\tcheap flights\t 2006-03-01 10:00:00\t1\thttp://a.com')
  path = tmp_path / 'log.txt'
  path.write_text('7\tboston\t2006-03-01 10:00:00\n7\thotels\t2006-03-01 10:10:00\n',
                  encoding='utf-8')
  contexts = list(inputs.read_raw_log(str(path), make_reader(), data_config(gap=5.0),
                                      chunk_sessions=2))
  assert [c.queries for c in contexts] == [('boston',), ('hotels',)]
  # A control character's line counted under the same name as a sessions file's; reasons
  # the log never met are not counted at all.
  path.write_text('7\tbos\x1bton\t2006-03-01 10:00:00\n7\thotels\t2006-03-01 10:01:00\n',
                  encoding='utf-8')
  reader = make_reader()
  list(inputs.read_raw_log(str(path), reader, data_config(), chunk_sessions=2))
  assert reader.counts['control_character_lines'] == 1
  assert [k for k in reader.counts if k.startswith('skipped_')] == [], dict(reader.counts)
  # A context without a user is user -1 to the models that read users.
  split = inputs.context_split([inputs.Context(('boston',), 0, {'line': 1}),
                                inputs.Context(('red sox',), 0, {'user': 7})], VOCAB, 3)
  assert split.users.tolist() == [-1, 7]


def test_raw_log_is_sessionized_with_references(tmp_path):
  path = tmp_path / 'log.txt'
  path.write_text(
      RAW_HEADER
      + '7\tcheap flights\t2006-03-01 10:00:00\t\t\n'
      + '7\tcheap flights\t2006-03-01 10:00:30\t1\thttp://a.com\n'  # click repeat
      + '7\tflights  to boston now\t2006-03-01 10:05:00\t\t\n'  # long: cut to 3 words
      + '9\tred sox\t2006-03-01 09:00:00\n'
      + '7\thotels boston\t2006-03-01 10:35:00\t\t\n'  # 30:00 after the last: new session
      + '7\t-\t2006-03-01 10:36:00\t\t\n',  # the log's empty-query placeholder
      encoding='utf-8')
  reader = make_reader()
  contexts = list(inputs.read_raw_log(str(path), reader, data_config(), chunk_sessions=2))
  assert [(c.info, c.queries, c.references, c.first_output) for c in contexts] == [
      ({'user': 7, 'session': 0}, ('cheap flights', 'flights to boston'),
       ('flights to boston', None), 0),
      ({'user': 7, 'session': 1}, ('hotels boston',), (None,), 0),
      ({'user': 9, 'session': 2}, ('red sox',), (None,), 0),
  ]
  assert reader.counts['duplicate_queries'] == 1
  assert reader.counts['long_queries'] == 1
  assert reader.counts['skipped_header'] == 1 and reader.counts['empty_queries'] == 1
  assert reader.counts['lines_read'] == 7
  assert [c.history for c in contexts] == [(), (), ()]  # the pipeline reads no past
  # Each context's history: its user's latest `past_queries` earlier queries, no other user's.
  for past_queries, expected in ((1, ('flights to boston',)),
                                 (5, ('cheap flights', 'flights to boston'))):
    contexts = list(inputs.read_raw_log(str(path), make_reader(), data_config(),
                                        chunk_sessions=2, past_queries=past_queries))
    assert [c.history for c in contexts] == [(), expected, ()]


def test_raw_log_counts_its_latin1_lines(tmp_path):
  """A raw log's line that is not UTF-8 is a query read as Latin-1, counted in the summary
  as a sessions file's is."""
  path = tmp_path / 'log.txt'
  path.write_bytes(b'7\tcaf\xe9 paris\t2006-03-01 10:00:00\n'
                   b'7\tboston\t2006-03-01 10:01:00\n')
  reader = make_reader()
  contexts = list(inputs.read_raw_log(str(path), reader, data_config(), chunk_sessions=2))
  assert [c.queries for c in contexts] == [('caf\xe9 paris', 'boston')]
  assert reader.counts['latin1_lines'] == 1 and reader.counts['lines_read'] == 2


def test_decode_refuses_an_output_it_cannot_write_before_loading_a_model(tmp_path):
  """The input as its own output (by name or through a link), a folder, a path under a
  file: one error naming config.decode.output, before any model loads (the workdir here
  holds none), and the input untouched."""
  sessions = tmp_path / 'sessions.tsv'
  sessions.write_text('boston\thotels\n', encoding='utf-8')
  link = tmp_path / 'link.tsv'
  link.symlink_to(sessions)
  a_file = tmp_path / 'a_file'
  a_file.write_text('')
  refused = {sessions: 'is the input file: writing it would erase the sessions',
             link: 'is the input file', tmp_path: 'is a folder, not a file',
             a_file / 'out.jsonl': f'{a_file} is a file, not a folder'}
  config = demo.get_config()
  for output, reason in refused.items():
    config.decode.input, config.decode.output = str(sessions), str(output)
    with pytest.raises(suggest.DecodeOutputError) as e:
      suggest.decode_file(config, str(tmp_path / 'no_workdir'))
    assert str(e.value).startswith(f'config.decode.output={output}') and reason in str(e.value)
  assert sessions.read_text(encoding='utf-8') == 'boston\thotels\n'


def test_decode_output_refused_by_the_system_is_named_and_the_input_s_errors_pass(tmp_path,
                                                                                   capsys):
  if os.path.exists('/dev/full'):  # every write fails: a full disk
    with pytest.raises(suggest.DecodeOutputError,
                       match='^config.decode.output=/dev/full: No space left on device$'):
      with suggest._written('/dev/full') as write:
        write('x' * 100)
  # An error raised while reading the input is not the output's; the output is as it was,
  # what was written before the error beside it (and named), nothing where nothing was.
  out = tmp_path / 'out.jsonl'
  out.write_text('an earlier run\n')
  for written, kept in (('a line\n', True), ('', False)):
    with pytest.raises(inputs.DecodeInputError, match='^the input$'):
      with suggest._written(str(out)) as write:
        write(written)
        raise inputs.DecodeInputError('the input')
    assert out.read_text() == 'an earlier run\n'
    partial = tmp_path / 'out.jsonl.partial'
    assert partial.exists() == kept and (not kept or partial.read_text() == written)
    assert (f'Stopped: the suggestions written before are in {partial}; {out} is as it was.'
            in capsys.readouterr().out) == kept
    partial.unlink(missing_ok=True)
  with suggest._written(str(out)) as write:
    write('a line\n')
  assert out.read_text() == 'a line\n' and not partial.exists()
  assert sorted(p.name for p in tmp_path.iterdir()) == ['out.jsonl']  # no temporary left
  fresh = tmp_path / 'fresh.jsonl'
  with pytest.raises(inputs.DecodeInputError):
    with suggest._written(str(fresh)) as write:
      write('a line\n')
      raise inputs.DecodeInputError('the input')
  assert not fresh.exists() and f'no {fresh} was written.' in capsys.readouterr().out
  (tmp_path / 'fresh.jsonl.partial').unlink()
  # A link (as /dev/stdout is) is written through, in place: the link stays a link.
  link = tmp_path / 'link.jsonl'
  link.symlink_to(out)
  with suggest._written(str(link)) as write:
    write('through the link\n')
  assert link.is_symlink() and out.read_text() == 'through the link\n'
  # A folder the system refuses to make (a file system of its own: /proc) is named too.
  if os.path.isdir('/proc/self'):
    config = demo.get_config()
    config.decode.input, config.decode.output = str(out), '/proc/no_such/out.jsonl'
    with pytest.raises(suggest.DecodeOutputError,
                       match='^config.decode.output=/proc/no_such/out.jsonl: '):
      suggest.decode_file(config, str(tmp_path / 'no_workdir'))


def test_raw_session_longer_than_the_table_keeps_its_last_queries():
  reader = make_reader(max_session_queries=2)
  contexts = reader.raw_session(['boston', 'hotels', 'red', 'sox'], {'session': 0})
  assert [(c.queries, c.first_output, c.first_position, c.references) for c in contexts] == [
      (('boston', 'hotels'), 0, 0, ('hotels', 'red')),
      (('hotels', 'red'), 1, 1, ('red', 'sox')),
      (('red', 'sox'), 1, 2, ('sox', None)),
  ]
  assert reader.counts['long_sessions'] == 1
  # Each suggestion point is written once, with the context the model saw.
  records = [r for c in contexts
             for r in suggest._records(c, [[]] * (len(c.queries) - c.first_output))]
  assert [(r['position'], r['context'], r['reference']) for r in records] == [
      (0, ['boston'], 'hotels'), (1, ['boston', 'hotels'], 'red'),
      (2, ['hotels', 'red'], 'sox'), (3, ['red', 'sox'], None)]


def test_context_batch_pads_queries_and_rows():
  model = demo.get_config().model
  model.copy = True
  task = tasks.GenerationTask(models.make_config(model, vocab_size=len(VOCAB),
                                                 max_query_words=3))
  contexts = [inputs.Context(('cheap flights', 'zzz'), 1, {}),
              inputs.Context(('boston',), 0, {})]
  batch, lengths = inputs.context_batch(task, VOCAB, contexts, rows=3, width=2)
  assert sorted(batch) == ['oov', 'queries']
  ids = {w: VOCAB.id(w) for w in ('cheap', 'flights', 'boston')}
  np.testing.assert_array_equal(batch['queries'], [
      [[ids['cheap'], ids['flights'], 0], [UNK_ID, 0, 0]],
      [[ids['boston'], 0, 0], [0, 0, 0]],
      [[0, 0, 0], [0, 0, 0]]])
  # 'zzz' is the first (and only) word outside the vocabulary of its context.
  np.testing.assert_array_equal(batch['oov'], [
      [[0, 0, 0], [1, 0, 0]], [[0, 0, 0], [0, 0, 0]], [[0, 0, 0], [0, 0, 0]]])
  assert lengths.tolist() == [2, 1, 1]


def test_suggestion_list_keeps_top_k_and_drops_empty_slots():
  sequences = np.array([[VOCAB.id('red'), VOCAB.id('sox'), 3, 0],
                        [VOCAB.id('boston'), 3, 0, 0],
                        [3, 0, 0, 0],
                        [0, 0, 0, 0]])
  scores = np.array([-0.5, -1.0, -2.0, -np.inf], np.float32)
  assert search.suggestion_list(VOCAB, sequences, scores, top_k=2) == [
      {'query': 'red sox', 'score': -0.5}, {'query': 'boston', 'score': -1.0}]
  assert [s['query'] for s in search.suggestion_list(VOCAB, sequences, scores, 4)] == [
      'red sox', 'boston', '']


def test_excluding_session_queries_still_fills_top_k_from_the_whole_beam():
  # The user-facing protocol drops the session's queries after decoding the beam: it must
  # read past the first top_k hypotheses, or a session query among them leaves the list short
  # (here the best hypothesis is typed already: 'boston' alone instead of two suggestions).
  sequences = np.array([[VOCAB.id('red'), VOCAB.id('sox'), 3, 0],
                        [VOCAB.id('boston'), 3, 0, 0],
                        [VOCAB.id('cheap'), VOCAB.id('flights'), 3, 0],
                        [VOCAB.id('hotels'), 3, 0, 0]])
  scores = np.array([-0.5, -1.0, -1.5, -2.0], np.float32)
  settings = search.SearchSettings(beam_size=4, max_len=4, length_penalty=0.0,
                                   emit_unk=False, top_k=2, exclude_session_queries=True)
  assert search.ranked_suggestions(VOCAB, sequences, scores, settings,
                                   session=['hotels', 'red sox']) == [
      {'query': 'boston', 'score': -1.0}, {'query': 'cheap flights', 'score': -1.5}]
  # What is left is still cut to top_k.
  one = search.SearchSettings(beam_size=4, max_len=4, length_penalty=0.0, emit_unk=False,
                              top_k=1, exclude_session_queries=True)
  assert search.ranked_suggestions(VOCAB, sequences, scores, one,
                                   session=['hotels', 'red sox']) == [
      {'query': 'boston', 'score': -1.0}]


def test_mbr_weighs_the_whole_beam_and_adds_the_session_only_for_beam_session():
  """MBR reads every hypothesis as evidence however few are shown: its pick here is the beam's
  consensus, not the likeliest hypothesis ('hotels') that the first top_k alone would give.
  'beam' reorders the hypotheses only; 'beam+session' adds the session's queries."""
  words = ['hotels', 'cheap boston hotels', 'cheap boston flights', 'boston flights']
  sequences = np.zeros((4, 4), np.int32)
  for k, query in enumerate(words):
    ids = [VOCAB.id(w) for w in query.split()] + [3]
    sequences[k, :len(ids)] = ids
  scores = np.array([-0.5, -0.6, -0.7, -0.8], np.float32)
  queries = lambda top_k, mbr: [r['query'] for r in search.ranked_suggestions(
      VOCAB, sequences, scores, search.SearchSettings(
          beam_size=4, max_len=4, length_penalty=0.0, emit_unk=False, top_k=top_k, mbr=mbr),
      session=['cheap boston'])]
  assert queries(1, 'beam') == ['cheap boston hotels']
  consensus = ['cheap boston hotels', 'cheap boston flights', 'boston flights']
  assert queries(5, 'beam') == consensus + ['hotels']
  assert queries(5, 'beam+session') == consensus + ['cheap boston', 'hotels']


def test_describe_counts():
  text = suggest.describe_counts({'empty_lines': 2, 'long_queries': 1,
                                  'skipped_bad_time': 3}, '10 words', 16)
  assert text == '2 empty lines skipped, 1 query cut to 10 words, 3 log lines skipped (bad_time)'
  # One of a kind is said in the singular, every kind and the log's skipped lines alike.
  ones = dict.fromkeys(suggest._COUNT_WORDS, 1) | {'skipped_bad_time': 1}
  assert suggest.describe_counts(ones, '10 words', 16) == (
      '1 line that is not UTF-8 read as Latin-1, 1 empty line skipped, 1 empty query skipped, '
      '1 line holding a control character skipped, 1 line of an AOL log in a sessions file '
      'skipped, 1 successive duplicate query removed, 1 word outside the vocabulary became '
      '<unk>, 1 query cut to 10 words, 1 context cut to its last 16 queries, 1 log line '
      'skipped (bad_time)')
  # Only the changes made: a count of 0 names nothing (a sessions file removes no duplicates).
  assert suggest.describe_counts({'duplicate_queries': 0, 'skipped_bad_time': 0,
                                  'long_sessions': 2}, '10 words', 16) == (
      '2 contexts cut to their last 16 queries')
  assert suggest.describe_counts({'empty_lines': 0}, '10 words', 16) == 'none'


class StandInPipeline:
  """What decode and suggest read of a loaded `pipeline.Pipeline`, with no model: after each
  output position it suggests the session's queries so far, the latest first, and it keeps
  the config it was loaded with and every context it was asked about."""

  def __init__(self, max_session_queries):
    cfg = types.SimpleNamespace(name='mtn', max_session_queries=max_session_queries,
                                max_query_words=3)
    self.trained = self.suggester = Trained(types.SimpleNamespace(cfg=cfg), None, VOCAB, 7, {})
    self.past_read, self.config, self.asked = 0, None, []

  def load(self, config, workdir, log=print):
    del workdir
    self.config = config
    log('Note: a stand-in.')
    return self

  def how(self):
    return 'a stand-in'

  def score_kind(self):
    return 'minus the place'

  def suggest(self, contexts, *, positions, batch_rows=None, widths=None):
    del batch_rows, widths
    self.asked += [(c.queries, c.history) for c in contexts]
    return [[[{'query': q, 'score': -float(place)}
              for place, q in enumerate(reversed(c.queries[:t + 1]), 1)]
             for t in range(len(c.queries) - 1 if positions == 'last' else c.first_output,
                            len(c.queries))]
            for c in contexts]


def test_decode_default_outputs_of_two_inputs_differ():
  """Inputs of one stem decoded in one workdir (a file and its gzipped copy, a sessions file
  and a log) each keep their own default output: none replaces another's."""
  outputs = [suggest._default_output('W', name) for name in ['s.txt', 's.txt.gz', 's.tsv', 's']]
  assert len(set(outputs)) == 4
  assert outputs[0] == os.path.abspath('W/decode/s.txt.suggestions.jsonl')


def test_decode_of_a_raw_log_writes_every_point_once_across_chunks(tmp_path, monkeypatch):
  """A raw log is decoded after every query, in chunks of CHUNK_BATCHES * batch_sessions
  contexts (the last one short), into
  `<workdir>/decode/<the input's file name>.suggestions.jsonl` by default, under the paper's
  protocol unless the config sets one; a session longer than the model's table is several
  contexts but one session, each position written once."""
  stand_in = StandInPipeline(max_session_queries=2)
  monkeypatch.setattr(pipeline.Pipeline, 'load', stand_in.load)
  words = ['cheap', 'flights', 'boston', 'hotels']
  lines = ['AnonID\tQuery\tQueryTime\tItemRank\tClickURL']
  for user, length in enumerate([4] + [1] * (suggest.CHUNK_BATCHES + 1), 100):  # 10 sessions
    lines += [f'{user}\t{words[i]}\t2006-03-01 10:0{i}:00\t\t' for i in range(length)]
  log = tmp_path / 'log.tsv.gz'
  with gzip.open(log, 'wt', encoding='utf-8') as f:
    f.write('\n'.join(lines) + '\n')
  config = demo.get_config()
  config.decode.input, config.decode.batch_sessions = str(log), 1
  counts = suggest.decode_file(config, str(tmp_path / 'run'))
  assert stand_in.config.decode.exclude_session_queries is False
  output = tmp_path / 'run' / 'decode' / 'log.tsv.gz.suggestions.jsonl'
  assert counts['output'] == str(output)
  assert (counts['format'], counts['sessions'], counts['suggestion_points']) == ('raw', 10, 13)
  records = [json.loads(line) for line in output.read_text(encoding='utf-8').splitlines()]
  assert [(r['user'], r['position'], r['context'], r['reference']) for r in records[:4]] == [
      (100, 0, ['cheap'], 'flights'), (100, 1, ['cheap', 'flights'], 'boston'),
      (100, 2, ['flights', 'boston'], 'hotels'), (100, 3, ['boston', 'hotels'], None)]
  assert [s['query'] for s in records[2]['suggestions']] == ['boston', 'flights']
  assert [(r['user'], r['position']) for r in records[4:]] == [(u, 0) for u in range(101, 110)]


def test_a_sessions_file_without_a_tab_is_noted_as_one_query_a_session(tmp_path, monkeypatch,
                                                                        capsys):
  monkeypatch.setattr(pipeline.Pipeline, 'load', StandInPipeline(max_session_queries=2).load)
  config = demo.get_config()
  sessions = tmp_path / 'sessions.txt'
  for text, noted in (('cheap flights    cheap flights paris\nweather  boston\n', True),
                      ('cheap flights\tparis\nweather\n', False),
                      ('cheap flights\n', False)):  # a lone session of one query says nothing
    sessions.write_text(text, encoding='utf-8')
    config.decode.input, config.decode.output = str(sessions), str(tmp_path / 'out.jsonl')
    suggest.decode_file(config, str(tmp_path / 'run'))
    assert ('Note: every session was read as one query' in capsys.readouterr().out) == noted, text


def test_a_stopped_decode_goes_on_and_writes_what_an_uninterrupted_one_does(tmp_path,
                                                                             monkeypatch,
                                                                             capsys):
  """Stopped after its first chunk (Ctrl-C), a decode leaves that chunk in OUT.partial and
  what made it beside; the same command goes on from there (a last line cut short dropped)
  and writes the uninterrupted run's bytes; another setting decodes afresh, saying so."""
  stand_in = StandInPipeline(max_session_queries=2)
  monkeypatch.setattr(pipeline.Pipeline, 'load', stand_in.load)
  words = ['cheap', 'flights', 'boston', 'hotels']
  lines = ['AnonID\tQuery\tQueryTime\tItemRank\tClickURL']
  for user, length in enumerate([4] + [2] * (2 * suggest.CHUNK_BATCHES), 100):
    lines += [f'{user}\t{words[i]}\t2006-03-01 10:0{i}:00\t\t' for i in range(length)]
  log = tmp_path / 'log.tsv'
  log.write_text('\n'.join(lines) + '\n', encoding='utf-8')
  config = demo.get_config()
  config.decode.input, config.decode.batch_sessions = str(log), 1
  whole, output = tmp_path / 'whole.jsonl', tmp_path / 'out.jsonl'
  config.decode.output = str(whole)
  uninterrupted = suggest.decode_file(config, str(tmp_path / 'run'))
  config.decode.output = str(output)
  answer, calls = stand_in.suggest, []

  def stopped_at_the_second_chunk(contexts, **kwargs):
    calls.append(1)
    if len(calls) % 2 == 0:
      raise KeyboardInterrupt
    return answer(contexts, **kwargs)

  def stopped():
    monkeypatch.setattr(stand_in, 'suggest', stopped_at_the_second_chunk)
    with pytest.raises(KeyboardInterrupt):
      suggest.decode_file(config, str(tmp_path / 'run'))
    monkeypatch.setattr(stand_in, 'suggest', answer)
    assert '(the same command goes on from them)' in capsys.readouterr().out

  stopped()
  partial = tmp_path / 'out.jsonl.partial'
  first_chunk = partial.read_text(encoding='utf-8')
  written = first_chunk.count('\n')  # the first chunk's points, whole
  assert whole.read_text(encoding='utf-8').startswith(first_chunk)
  assert 0 < written < uninterrupted['suggestion_points']
  with open(partial, 'a', encoding='utf-8') as f:
    f.write('{"user": 1')  # a record cut short by a kill
  resumed = suggest.decode_file(config, str(tmp_path / 'run'))
  assert f'Resuming after the {written} suggestion points' in capsys.readouterr().out
  assert output.read_bytes() == whole.read_bytes()
  assert {k: resumed[k] for k in ('sessions', 'suggestion_points')} == {
      k: uninterrupted[k] for k in ('sessions', 'suggestion_points')}
  assert not partial.exists() and not (tmp_path / 'out.jsonl.partial.json').exists()
  # Stopped again, then run with another setting: not gone on from.
  stopped()
  config.decode.top_k = 3
  afresh = suggest.decode_file(config, str(tmp_path / 'run'))
  assert (f'Note: {partial} is not gone on from (made with another decode): decoding afresh.'
          in capsys.readouterr().out)
  assert afresh['suggestion_points'] == uninterrupted['suggestion_points']


def test_decode_of_a_log_of_another_time_form_is_refused_leaving_no_output(tmp_path,
                                                                         monkeypatch):
  """A log with its header and ISO times: refused in one line naming the time's form (not
  decoded as sessions of a user id, a query and a time); no output is left."""
  monkeypatch.setattr(pipeline.Pipeline, 'load', StandInPipeline(max_session_queries=3).load)
  log = tmp_path / 'iso.tsv'
  log.write_text(RAW_HEADER + ISO_LOG, encoding='utf-8')
  config = demo.get_config()
  config.decode.input = str(log)
  with pytest.raises(inputs.DecodeInputError, match=re.escape(
      f'{log}: none of its 3 lines reads as a query (bad_time 2, header 1): QueryTime is not '
      'a valid YYYY-MM-DD HH:MM:SS, first at line 2: ')):
    suggest.decode_file(config, str(tmp_path / 'run'))
  assert not (tmp_path / 'run').exists()


def test_suggest_keeps_a_typed_sessions_last_queries_and_the_earlier_ones_as_its_history(
    monkeypatch):
  """--mode=suggest: a session longer than the model's table keeps its last queries, a new
  session is given the queries typed before it as its history, the list is numbered from 1,
  a query cut to the model's words says so, and the protocol is the user-facing one unless
  the config sets one. The pipeline's notes go apart from the lists."""
  stand_in = StandInPipeline(max_session_queries=3)
  stand_in.past_read = 1000  # a pipeline that reads a past says the typed sessions are it
  monkeypatch.setattr(pipeline.Pipeline, 'load', stand_in.load)
  typed = io.StringIO('cheap\nflights\nboston\nhotels red sox boston\n\nred sox\n')
  shown, notes = io.StringIO(), io.StringIO()
  suggest.interactive(demo.get_config(), '/nowhere', stdin=typed, stdout=shown, notes=notes)
  assert notes.getvalue() == 'Note: a stand-in.\n'
  assert stand_in.config.decode.exclude_session_queries is True
  assert stand_in.asked == [
      (('cheap',), ()), (('cheap', 'flights'), ()), (('cheap', 'flights', 'boston'), ()),
      (('flights', 'boston', 'hotels red sox'), ()),
      (('red sox',), ('flights', 'boston', 'hotels red sox'))]
  out = shown.getvalue().splitlines()
  assert 'the user-facing protocol' in out[0]
  assert out[0].endswith('an empty line starts a new session (the sessions typed before are '
                         'your past: the latest 1,000 queries are read); end with Ctrl-D.')
  assert out[1:3] == ['after cheap:', '  1. cheap  (-1.000)']
  assert out[10:14] == ['after flights | boston | hotels red sox (query cut to 3 words):',
                       '  1. hotels red sox  (-1.000)', '  2. boston  (-2.000)',
                       '  3. flights  (-3.000)']
  assert out[14:] == ['-- new session --', 'after red sox:', '  1. red sox  (-1.000)', '']
  # One that reads no past does not say so.
  monkeypatch.setattr(pipeline.Pipeline, 'load', StandInPipeline(max_session_queries=3).load)
  shown = io.StringIO()
  suggest.interactive(demo.get_config(), '/nowhere', stdin=io.StringIO('cheap\n'), stdout=shown)
  assert shown.getvalue().splitlines()[0].endswith(
      'an empty line starts a new session; end with Ctrl-D.')
  # The model named is the one whose candidates come first (a ranker's for 'retrieve'), with
  # its own checkpoint, as decode names it.
  retrieving = StandInPipeline(max_session_queries=3)
  ranker_cfg = types.SimpleNamespace(name='biencoder', max_session_queries=3, max_query_words=3)
  retrieving.suggester = Trained(types.SimpleNamespace(cfg=ranker_cfg), None, VOCAB, 90, {})
  monkeypatch.setattr(pipeline.Pipeline, 'load', retrieving.load)
  shown = io.StringIO()
  suggest.interactive(demo.get_config(), '/nowhere', stdin=io.StringIO('cheap\n'), stdout=shown)
  assert shown.getvalue().startswith('biencoder (checkpoint step 90, ')


# ---------------------------------------------------------------------------------------------
# Report


def score(bleu, precisions):
  line = f'BLEU = {bleu:.2f}, ' + '/'.join(f'{p:.1f}' for p in precisions)
  return {'bleu': bleu, 'precisions': list(precisions), 'bp': 1.0, 'hyp_len': 10,
          'ref_len': 10, 'line': line}


def model_config(query_layers, session_layers, decoder_layers):
  return {'query_layers': query_layers, 'session_layers': session_layers, 'num_levels': 2,
          'decoder_layers': decoder_layers}


def write_run(tmp_path, name, model, layers, bleu, precisions, size_mb=12.345, sessions=500):
  workdir = tmp_path / name
  (workdir / 'eval').mkdir(parents=True)
  results = {
      'model': model, 'model_config': model_config(*layers), 'size_mb': size_mb, 'step': 40,
      'pairs': 1234, 'sessions': sessions, 'sessions_total': 500,
      'decode': {'beam_size': 5},
      'scores': {'model': score(bleu, precisions),
                 'repeat_previous': score(11.89, (25.2, 14.8, 9.2, 6.2)),
                 'most_frequent_next': score(9.5, (20.0, 10.0, 5.0, 2.5))}}
  (workdir / 'eval' / 'results.json').write_text(json.dumps(results), encoding='utf-8')
  samples = [{'context': ['www myspace', 'myspace'], 'predicted': 'www myspace com',
              'actual': 'a|b <unk>', 'suggestions': []}]
  (workdir / 'eval' / 'samples.jsonl').write_text(
      ''.join(json.dumps(s) + '\n' for s in samples), encoding='utf-8')
  return str(workdir)


def test_layer_labels():
  assert report.layer_label('transformer', model_config(4, 0, 4)) == (
      'Transformer (4Q enc, 4 dec)')
  assert report.layer_label('mtn', model_config(3, 2, 3)) == 'MTN (3Q+2S, 3)'
  assert report.layer_label('mtn', {**model_config(3, 2, 3), 'num_levels': 3}) == (
      'MTN (3Q+2S+2S, 3)')
  assert report.layer_label('hred', model_config(3, 2, 3)) == 'H-LSTM'
  # A ranker: the Poly-encoder's codes, the context encoder (flat for a config without the
  # key) and its depth; the Cross-encoder's joint encoder is flat whatever the key says.
  ranker = {**model_config(2, 1, 1), 'poly_codes': 16}
  assert report.layer_label('polyencoder', ranker) == 'Poly-encoder 16 (flat 2)'
  assert report.layer_label('biencoder', {**ranker, 'context_encoder': 'mtn'}) == (
      'Bi-encoder (mtn 2Q+1S)')
  assert report.layer_label('crossencoder', {**ranker, 'context_encoder': 'mtn'}) == (
      'Cross-encoder (flat 2)')


def test_results_table_text(tmp_path):
  runs = [report.load_run(write_run(tmp_path, 'mtn', 'mtn', (3, 2, 3), 14.62,
                                    (35.7, 21.5, 14.9, 10.2), size_mb=407.0)),
          report.load_run(write_run(tmp_path, 't', 'transformer', (4, 0, 4), 13.9,
                                    (34.2, 19.6, 13.1, 8.9), size_mb=419.04, sessions=450))]
  mtn_dir, t_dir = runs[0].workdir, runs[1].workdir
  assert report.results_table(runs) == '\n'.join([
      '| Model | Size (MB) | 1/2/3/4-gram | BLEU | Test pairs | Workdir |',
      '|---|---:|---|---:|---:|---|',
      f'| MTN | 407.0 | 35.7/21.5/14.9/10.2 | 14.62 | 1,234 | `{mtn_dir}` |',
      f'| Transformer | 419.0 | 34.2/19.6/13.1/8.9 | 13.90 | '
      f'1,234 (first 450 of 500 sessions) | `{t_dir}` |',
      f'| Repeat previous query | - | 25.2/14.8/9.2/6.2 | 11.89 | 1,234 | `{mtn_dir}` |',
      f'| Most frequent next query (train) | - | 20.0/10.0/5.0/2.5 | 9.50 | 1,234 | `{mtn_dir}` |',
      f'| Repeat previous query | - | 25.2/14.8/9.2/6.2 | 11.89 | '
      f'1,234 (first 450 of 500 sessions) | `{t_dir}` |',
      f'| Most frequent next query (train) | - | 20.0/10.0/5.0/2.5 | 9.50 | '
      f'1,234 (first 450 of 500 sessions) | `{t_dir}` |',
  ])
  # Runs of the same pairs list a trivial suggester again only where its figures differ
  # (runs of other training users: other lists of the log's).
  same = write_run(tmp_path, 'same', 'mtn', (3, 2, 3), 14.0, (35.0, 21.0, 14.0, 10.0))
  other = write_run(tmp_path, 'other', 'mtn', (3, 2, 3), 14.0, (35.0, 21.0, 14.0, 10.0))
  path = os.path.join(other, 'eval', 'results.json')
  with open(path, encoding='utf-8') as f:
    results = json.load(f)
  results['scores']['most_frequent_next']['bleu'] = 9.6
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(results, f)
  table = report.results_table([runs[0]] + [report.load_run(w) for w in (same, other)])
  assert table.count('| Most frequent next query (train) |') == 2
  assert table.count('| Repeat previous query |') == 1
  # And where only their figures never repeating a session query differ.
  for workdir, bleu in ((same, 7.0), (other, 7.5)):
    path = os.path.join(workdir, 'eval', 'results.json')
    with open(path, encoding='utf-8') as f:
      results = json.load(f)
    results['scores']['most_frequent_next']['bleu'] = 9.5
    results['scores_excluding_session'] = {
        'repeat_previous': score(0.0, (0.0,) * 4), 'most_frequent_next': score(bleu, (1.0,) * 4)}
    with open(path, 'w', encoding='utf-8') as f:
      json.dump(results, f)
  table = report.results_table([report.load_run(w) for w in (same, other)])
  assert table.count('| Most frequent next query (train) |') == 2
  assert table.count('| Repeat previous query |') == 1
  # Runs evaluated on the validation split (config.decode.eval_split) say so.
  assert report.results_table(runs, 'valid').splitlines()[0] == (
      '| Model | Size (MB) | 1/2/3/4-gram | BLEU | Validation pairs | Workdir |')


def test_the_samples_table_shows_the_first_ten_samples():
  samples = [{'context': [f'q{i}', 'x'], 'predicted': f'p{i}', 'actual': f'a{i}'}
             for i in range(12)]
  lines = report.samples_table(samples).splitlines()
  assert len(lines) == 2 + report.SAMPLES_PER_MODEL == 12
  assert lines[2] == '| q0, x | p0 | a0 |' and lines[-1] == '| q9, x | p9 | a9 |'


def test_runs_of_one_model_and_layout_are_told_apart_by_their_workdirs(tmp_path):
  """Two runs of one model with the same layers (two seeds, say) would be two rows of one
  label: the workdir's name tells them apart; a run of other layers keeps its layout."""
  runs = [report.load_run(write_run(tmp_path, name, 'mtn', layers, 14.0,
                                    (35.0, 21.0, 14.0, 10.0)))
          for name, layers in (('seed1', (3, 2, 3)), ('seed2', (3, 2, 3)), ('deep', (4, 2, 4)))]
  assert report._labels(runs) == [  # pylint: disable=protected-access
      'MTN (3Q+2S, 3) [seed1]', 'MTN (3Q+2S, 3) [seed2]', 'MTN (4Q+2S, 4)']


def test_markdown_specials_in_queries_and_a_bar_in_a_path_stay_text():
  # `_` and `*` would turn a query into italics, `~` into strikethrough, `[` into a link.
  assert report.markdown_cell('my_space *hot* ~x~ [a]') == (
      'my\\_space \\*hot\\* \\~x\\~ \\[a\\]')
  # A table cell ends at a bare `|`, even inside inline code.
  assert report.code_cell('/runs/a|b') == '`/runs/a\\|b`'


def test_report_refuses_a_run_without_its_samples_or_with_a_broken_sample(tmp_path):
  """The samples are read before anything is written: a missing file or a record without
  its fields is a ReportError naming the file (and line), not a traceback."""
  workdir = write_run(tmp_path, 'run', 'mtn', (3, 2, 3), 1.0, (1.0, 1.0, 1.0, 1.0))
  samples = tmp_path / 'run' / 'eval' / 'samples.jsonl'
  good = samples.read_text(encoding='utf-8')
  samples.write_text(good + '\n' + json.dumps({'context': ['a'], 'predicted': 'b'}) + '\n',
                     encoding='utf-8')
  with pytest.raises(report.ReportError, match=r"samples.jsonl:3: not a sample record "
                     r"\(KeyError\('actual'\)\)"):
    report.load_run(workdir)
  samples.unlink()
  with pytest.raises(report.ReportError, match=r'run has no .*samples.jsonl: re-run '
                     r'--mode=eval'):
    report.load_run(workdir)


def test_report_refuses_results_of_another_shape_naming_the_file(tmp_path):
  workdir = write_run(tmp_path, 'run', 'mtn', (3, 2, 3), 1.0, (1.0, 1.0, 1.0, 1.0))
  path = tmp_path / 'run' / 'eval' / 'results.json'
  results = json.loads(path.read_text(encoding='utf-8'))
  for damaged, message in (([1, 2], 'is not what --mode=eval writes'),
                           ({**results, 'scores': {**results['scores'], 'model': 'x'}},
                            'lacks scores.model'),
                           ({**results, 'scores': {**results['scores'], 'model': {
                               **results['scores']['model'], 'bleu': '4.5'}}},
                            'lacks scores.model.bleu'),
                           ({k: v for k, v in results.items() if k != 'size_mb'},
                            'lacks size_mb')):
    path.write_text(json.dumps(damaged), encoding='utf-8')
    with pytest.raises(report.ReportError, match=re.escape('results.json') + '.*'
                       + re.escape(message)):
      report.load_run(workdir)
  # The pool's figures beside the suggestions' (a Bi- or Poly-encoder's results) are read.
  path.write_text(json.dumps({**results, 'pool': {'r1_of_20': 30.0}}), encoding='utf-8')
  assert report.load_run(workdir).results['pool'] == {'r1_of_20': 30.0}


def test_decode_reads_no_pipe_and_suggest_no_closed_input(tmp_path):
  # A pipe would give its lines once, and the input is read twice (format, then lines).
  pipe = tmp_path / 'pipe'
  os.mkfifo(pipe)
  with pytest.raises(inputs.DecodeInputError, match='pipe: not a regular file'):
    inputs.detect_format(str(pipe))
  config = demo.get_config()
  config.decode.input = '-'  # the shell's standard input: named as such, not as a missing file
  with pytest.raises(inputs.DecodeInputError, match='^-: standard input is not read'):
    suggest.decode_file(config, str(tmp_path))
  with pytest.raises(suggest.errors.Error, match='standard input, which is closed'):
    suggest.interactive(demo.get_config(), str(tmp_path), stdin=None)
  # An output the file system refuses (Linux's /proc, even to root) is named before any work.
  sessions = tmp_path / 'sessions.txt'
  sessions.write_text('a\n', encoding='utf-8')
  with pytest.raises(suggest.DecodeOutputError,
                     match=r'config.decode.output=/proc/x.jsonl: cannot write in /proc'):
    suggest._check_output('/proc/x.jsonl', str(sessions))  # pylint: disable=protected-access


def test_a_text_file_shorter_than_its_split_is_named(tmp_path):
  texts = tmp_path / 'valid.text.txt'
  texts.write_text('a\nb\n', encoding='utf-8')  # three query rows, two texts
  split = SessionSplit('valid', np.zeros((3, 2), np.int32), np.array([0, 3]), str(texts))
  with pytest.raises(ValueError, match=r'valid.text.txt: 2 lines, but the split holds 3 '
                     r'queries: run --mode=preprocess again'):
    split.texts  # pylint: disable=pointless-statement
  # A selection of another split's sessions (`text_rows`) needs the lines up to its last row.
  picked = SessionSplit('valid', np.zeros((2, 2), np.int32), np.array([0, 2]), str(texts),
                        text_rows=np.array([1, 2]))
  with pytest.raises(ValueError, match=r'valid.text.txt: 2 lines, but the split holds 3 '):
    picked.texts  # pylint: disable=pointless-statement
  # A file with more lines than the split has rows (the split a prefix of its corpus's): the
  # split's rows alone, one text a query row.
  texts.write_text('a\nb\nc\nd\n', encoding='utf-8')
  prefix = SessionSplit('valid', np.zeros((3, 2), np.int32), np.array([0, 3]), str(texts))
  assert prefix.texts == ['a', 'b', 'c']


def ranking(exact, r5, r10, mrr, repeats, longest=10):
  return {'exact_match': exact, 'recall_at_5': r5, 'recall_at_10': r10, 'mrr_at_10': mrr,
          'repeats_session': repeats, 'pairs': 1234, 'longest_list': longest}


def add_rankings(workdir, figures):
  """Adds to `workdir`'s results the ranking figures {suggester: (ranking, BLEU and ranking
  never repeating the session)}, as eval writes them."""
  path = os.path.join(workdir, 'eval', 'results.json')
  with open(path, encoding='utf-8') as f:
    results = json.load(f)
  results['scores_excluding_session'] = {}
  for key, (paper, (bleu, user)) in figures.items():
    results['scores'][key]['ranking'] = paper
    results['scores_excluding_session'][key] = {**score(bleu, (1.0,) * 4), 'ranking': user}
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(results, f)
  return workdir


def test_the_ranking_table_lists_models_then_each_trivial_suggester_once(tmp_path):
  """The report's ranked-suggestion table: EM@1, R@5, R@10, MRR@10 and repeats (%), then
  BLEU and R@10 never repeating the session; '-' for a recall at a rank no list reaches;
  the trivial suggesters once for the runs that share their figures; a run evaluated before
  these figures existed is left out (and with none, so is the section)."""
  trivial_figures = {'repeat_previous': (ranking(5.0, 5.0, 5.0, 5.0, 100.0, longest=1),
                                         (0.0, ranking(0.0, 0.0, 0.0, 0.0, 0.0, longest=0))),
                     'most_frequent_next': (ranking(8.0, 12.0, 14.0, 9.5, 20.0),
                                            (7.25, ranking(6.0, 9.0, 11.0, 7.0, 0.0)))}
  mtn = add_rankings(write_run(tmp_path, 'mtn', 'mtn', (3, 2, 3), 14.62,
                               (35.7, 21.5, 14.9, 10.2)),
                     {'model': (ranking(10.0, 20.0, 30.0, 15.0, 40.0),
                                (12.5, ranking(12.0, 22.0, 35.0, 16.0, 0.0))),
                      **trivial_figures})
  short = add_rankings(write_run(tmp_path, 't', 'transformer', (4, 0, 4), 13.9,
                                 (34.2, 19.6, 13.1, 8.9)),
                       {'model': (ranking(9.0, 18.5, 18.5, 12.4, 30.0, longest=5),
                                  (11.0, ranking(9.5, 19.0, 19.0, 13.0, 0.0, longest=5))),
                        **trivial_figures})
  old = write_run(tmp_path, 'old', 'hred', (1, 1, 1), 10.0, (30.0, 15.0, 10.0, 5.0))
  # Evaluated once the paper's protocol was ranked, before the user-facing one was scored.
  between = add_rankings(write_run(tmp_path, 'between', 'hred', (1, 1, 1), 10.0,
                                   (30.0, 15.0, 10.0, 5.0)),
                         {'model': (ranking(1.0, 2.0, 3.0, 1.5, 4.0), (1.0, ranking(*[1.0] * 5)))})
  path = os.path.join(between, 'eval', 'results.json')
  with open(path, encoding='utf-8') as f:
    results = json.load(f)
  del results['scores_excluding_session']
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(results, f)
  runs = [report.load_run(w) for w in (mtn, short, old, between)]
  assert report.ranking_table(runs) == '\n'.join([
      '| Suggester | EM@1 | R@5 | R@10 | MRR@10 | top-1 repeats session | BLEU, never repeating '
      '| R@10, never repeating | Test pairs | Workdir |',
      '|---|---:|---:|---:|---:|---:|---:|---:|---:|---|',
      f'| MTN | 10.0 | 20.0 | 30.0 | 15.0 | 40.0 | 12.50 | 35.0 | 1,234 | `{mtn}` |',
      f'| Transformer | 9.0 | 18.5 | - | 12.4 | 30.0 | 11.00 | - | 1,234 | `{short}` |',
      f'| Repeat previous query | 5.0 | - | - | 5.0 | 100.0 | 0.00 | - | 1,234 | `{mtn}` |',
      f'| Most frequent next query (train) | 8.0 | 12.0 | 14.0 | 9.5 | 20.0 | 7.25 | 11.0 | '
      f'1,234 | `{mtn}` |'])
  assert report.ranking_table(runs[2:]) == ''
  config = report_config(','.join((mtn, short)), str(tmp_path / 'out'))
  text = open(report.write_report(config, mtn), encoding='utf-8').read()
  assert '## Ranked suggestions' in text and report.ranking_table(runs[:2]) in text
  config = report_config(old, str(tmp_path / 'old_out'))
  assert '## Ranked suggestions' not in open(report.write_report(config, old),
                                             encoding='utf-8').read()


def test_the_bleu_chart_draws_the_trivial_baselines_only_where_the_runs_share_them(
    tmp_path, monkeypatch):
  """A trivial suggester's BLEU is a dashed line across the chart: only where every run has
  the same figures for it (one test set); another run's would be drawn as this one's."""
  drawn = []
  monkeypatch.setattr(report, '_bar_chart', lambda path, labels, scores, title,
                      baselines=(): drawn.append((os.path.basename(path), baselines)))
  same = [write_run(tmp_path, name, 'mtn', (3, 2, 3), 14.0, (35.0, 21.0, 14.0, 10.0))
          for name in ('a', 'b')]
  report.write_report(report_config(','.join(same), str(tmp_path / 'out')), same[0])
  assert drawn == [('bleu.png', [('Repeat previous query', 11.89),
                                 ('Most frequent next query (train)', 9.5)])]
  path = os.path.join(same[1], 'eval', 'results.json')
  with open(path, encoding='utf-8') as f:
    results = json.load(f)
  results['scores']['most_frequent_next']['bleu'] = 9.6  # other training users, other lists
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(results, f)
  drawn.clear()
  report.write_report(report_config(','.join(same), str(tmp_path / 'out')), same[0])
  assert drawn == [('bleu.png', [('Repeat previous query', 11.89)])]


def test_the_charts_draw_each_runs_figures_and_the_layer_ablation_in_the_papers_order(
    tmp_path, monkeypatch):
  """bleu.png: per run its 1- to 4-gram precisions, then its BLEU; layers.png (Fig. 3): the
  Transformers, then the MTNs, whatever the order of config.report.workdirs."""
  from matplotlib.axes import Axes  # pylint: disable=g-import-not-at-top
  bars, bar = [], Axes.bar
  monkeypatch.setattr(Axes, 'bar', lambda self, x, height, *args, **kwargs: (
      bars.append((kwargs['label'], list(height))) or bar(self, x, height, *args, **kwargs)))
  report._bar_chart(str(tmp_path / 'chart.png'), ['a', 'b'],  # pylint: disable=protected-access
                    [score(14.0, (35.0, 21.0, 14.0, 10.0)), score(9.0, (30.0, 15.0, 8.0, 4.0))],
                    'title')
  assert bars == [('1-gram', [35.0, 30.0]), ('2-gram', [21.0, 15.0]), ('3-gram', [14.0, 8.0]),
                  ('4-gram', [10.0, 4.0]), ('BLEU', [14.0, 9.0])]
  drawn = {}
  monkeypatch.setattr(report, '_bar_chart', lambda path, labels, scores, title, baselines=(): (
      drawn.update({os.path.basename(path): labels})))
  workdirs = [write_run(tmp_path, name, model, layers, 14.0, (35.0, 21.0, 14.0, 10.0))
              for name, model, layers in (('mtn', 'mtn', (3, 2, 3)),
                                          ('t5', 'transformer', (5, 0, 5)),
                                          ('t4', 'transformer', (4, 0, 4)))]
  report.write_report(report_config(','.join(workdirs), str(tmp_path / 'out')), workdirs[0])
  assert drawn['layers.png'] == ['Transformer (5Q enc, 5 dec)', 'Transformer (4Q enc, 4 dec)',
                                 'MTN (3Q+2S, 3)']


def report_config(workdirs: str, output: str) -> ml_collections.ConfigDict:
  """The keys the report reads: the runs, where it goes, and which eval files it reports."""
  return ml_collections.ConfigDict({'report': {'workdirs': workdirs, 'output': output},
                                    'decode': {'eval_split': 'test', 'max_eval_sessions': 0},
                                    'suggest': {'strategy': 'generate'}})


def test_report_with_depth_variants_has_the_ablation_and_samples(tmp_path):
  workdirs = [write_run(tmp_path, 'mtn', 'mtn', (3, 2, 3), 14.62, (35.7, 21.5, 14.9, 10.2)),
              write_run(tmp_path, 't4', 'transformer', (4, 0, 4), 13.90, (34.2, 19.6, 13.1, 8.9)),
              write_run(tmp_path, 't5', 'transformer', (5, 0, 5), 13.89, (34.0, 19.5, 13.0, 8.8))]
  config = report_config(','.join(workdirs), str(tmp_path / 'out'))
  path = report.write_report(config, str(tmp_path / 'mtn'))
  assert path == str(tmp_path / 'out' / 'report.md')
  text = (tmp_path / 'out' / 'report.md').read_text(encoding='utf-8')
  # Two Transformers: their rows are told apart by their layers.
  assert '| Transformer (4Q enc, 4 dec) | 12.3 | 34.2/19.6/13.1/8.9 | 13.90 |' in text
  assert '| Transformer (5Q enc, 5 dec) | 12.3 | 34.0/19.5/13.0/8.8 | 13.89 |' in text
  assert '| MTN | 12.3 |' in text
  assert '## Layer ablation' in text and '![BLEU per layer layout](layers.png)' in text
  # Table-5 samples, with <unk> and | escaped so that Markdown shows them.
  assert '| www myspace, myspace | www myspace com | a\\|b &lt;unk&gt; |' in text
  for png in ('bleu.png', 'layers.png'):
    assert (tmp_path / 'out' / png).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_report_refuses_a_run_named_twice(tmp_path):
  run = write_run(tmp_path, 'mtn', 'mtn', (3, 2, 3), 14.62, (35.7, 21.5, 14.9, 10.2))
  again = os.path.join(run, '..', 'mtn')  # another spelling of the same folder
  with pytest.raises(report.ReportError, match=re.escape(
      f'config.report.workdirs names one run twice ({run}, {again})')):
    report.write_report(report_config(f'{run},{again}', str(tmp_path / 'out')), run)
  assert not (tmp_path / 'out').exists()


def test_report_without_depth_variants_has_no_ablation(tmp_path):
  workdirs = [write_run(tmp_path, 'mtn', 'mtn', (3, 2, 3), 14.62, (35.7, 21.5, 14.9, 10.2)),
              write_run(tmp_path, 't', 'transformer', (4, 0, 4), 13.9, (34.2, 19.6, 13.1, 8.9))]
  config = report_config('', '')
  report.write_report(config, str(tmp_path / 'mtn'), workdirs=workdirs)
  out = tmp_path / 'mtn' / 'report'
  assert (out / 'bleu.png').exists() and not (out / 'layers.png').exists()
  assert 'Layer ablation' not in (out / 'report.md').read_text(encoding='utf-8')


def test_a_report_of_the_learned_strategy_names_the_blend_where_a_run_used_it(tmp_path):
  workdirs = [write_run(tmp_path, name, 'mtn', (3, 2, 3), 14.62, (35.7, 21.5, 14.9, 10.2))
              for name in ('ranked', 'no_ranker')]
  for workdir, used in zip(workdirs, ('learned', 'blend')):  # as eval writes them
    eval_dir = os.path.join(workdir, 'eval')
    with open(os.path.join(eval_dir, 'results.json'), encoding='utf-8') as f:
      results = json.load(f)
    results['strategy'] = {'strategy': used, 'label': used}
    with open(os.path.join(eval_dir, 'learned_results.json'), 'w', encoding='utf-8') as f:
      json.dump(results, f)
    os.rename(os.path.join(eval_dir, 'samples.jsonl'),
              os.path.join(eval_dir, 'learned_samples.jsonl'))
  config = report_config(','.join(workdirs), str(tmp_path / 'out'))
  config.suggest.strategy = 'learned'
  report.write_report(config, workdirs[0])
  text = (tmp_path / 'out' / 'report.md').read_text(encoding='utf-8')
  assert ('the suggestions of the learned strategy, named under each run\'s samples; blend '
          'where a run had no learned ranker;') in text


def test_a_report_of_runs_on_different_splits_says_so(tmp_path, capsys):
  workdirs = [write_run(tmp_path, name, 'mtn', (3, 2, 3), 14.62, (35.7, 21.5, 14.9, 10.2),
                        sessions=sessions) for name, sessions in (('a', 500), ('b', 200))]
  report.write_report(report_config(','.join(workdirs), str(tmp_path / 'out')), workdirs[0])
  note = ('Note: the runs were evaluated on different test splits (pairs: 1,234; 1,234 (first '
          '200 of 500 sessions)): their figures do not compare.')
  assert note in capsys.readouterr().out
  assert note in (tmp_path / 'out' / 'report.md').read_text(encoding='utf-8')
  same = [write_run(tmp_path, name, 'mtn', (3, 2, 3), 14.62, (35.7, 21.5, 14.9, 10.2))
          for name in ('c', 'd')]
  report.write_report(report_config(','.join(same), str(tmp_path / 'out2')), same[0])
  assert 'Note:' not in (tmp_path / 'out2' / 'report.md').read_text(encoding='utf-8')
  # Where eval recorded the split's digest, it decides: other pairs of the same count differ,
  # and runs with other training users on one split do not.
  for digests, noted in ((('x', 'y'), True), (('x', 'x'), False)):
    for workdir, digest in zip(same, digests):
      path = os.path.join(workdir, 'eval', 'results.json')
      with open(path, encoding='utf-8') as f:
        results = json.load(f)
      with open(path, 'w', encoding='utf-8') as f:
        json.dump({**results, 'split_digest': digest}, f)
    report.write_report(report_config(','.join(same), str(tmp_path / 'out3')), same[0])
    text = (tmp_path / 'out3' / 'report.md').read_text(encoding='utf-8')
    assert ('different test splits (pairs: 1,234 each)' in text) == noted


@pytest.mark.parametrize('split, strategy, limit, prefix', [
    ('test', 'generate', 0, ''), ('valid', 'generate', 0, 'valid_'),
    ('test', 'learned', 0, 'learned_'), ('valid', 'blend', 0, 'valid_blend_'),
    ('test', 'generate', 100, 'first100_'), ('valid', 'learned', 8, 'valid_learned_first8_')])
def test_the_files_of_an_evaluation_are_named_after_its_split_strategy_and_limit(
    split, strategy, limit, prefix):
  """An evaluation of a split's first sessions alone (a quick look) is filed apart from the
  whole split's, which it would otherwise replace."""
  config = demo.get_config()
  config.decode.eval_split, config.suggest.strategy = split, strategy
  config.decode.max_eval_sessions = limit
  assert evaluate.results_prefix(config) == prefix


def test_report_refuses_missing_and_unevaluated_workdirs(tmp_path):
  (tmp_path / 'trained').mkdir()
  with pytest.raises(report.ReportError, match=r'nowhere does not exist'):
    report.load_run(str(tmp_path / 'nowhere'))
  with pytest.raises(report.ReportError, match=r'trained has not been evaluated'):
    report.load_run(str(tmp_path / 'trained'))
  # Evaluated with another strategy (a ranker's run has no learned lists): its results named.
  (tmp_path / 'trained' / 'eval').mkdir()
  (tmp_path / 'trained' / 'eval' / 'results.json').write_text('{}')
  with pytest.raises(report.ReportError, match=re.escape(
      "it holds results.json only: a report takes one strategy's results on one split from "
      'every run')):
    report.load_run(str(tmp_path / 'trained'), 'learned_')
  broken = write_run(tmp_path, 'broken', 'mtn', (3, 2, 3), 1.0, (1.0, 1.0, 1.0, 1.0))
  results_path = tmp_path / 'broken' / 'eval' / 'results.json'
  results = json.loads(results_path.read_text())
  del results['scores']['repeat_previous']['line']
  results_path.write_text(json.dumps(results))
  with pytest.raises(report.ReportError, match=r'lacks scores.repeat_previous.line'):
    report.load_run(broken)
  # A Cross-encoder's evaluation (the sampled protocols alone): no evaluation makes it more.
  del results['scores']['model']
  results['pool'] = {'r1_of_20': 30.0, 'r1_of_100': 10.0}
  results_path.write_text(json.dumps(results))
  with pytest.raises(report.ReportError, match=r'makes no suggestions of its own .*leave it '
                     r'out of config.report.workdirs'):
    report.load_run(broken)


def test_report_refuses_results_of_a_checkpoint_that_is_no_longer_the_best(tmp_path):
  """Evaluated at step 40, trained on to a new best at step 60: the report would show the
  older checkpoint's figures as the run's."""
  workdir = write_run(tmp_path, 'trained_on', 'mtn', (3, 2, 3), 1.0, (1.0, 1.0, 1.0, 1.0))
  for step, best in ((40, 40), (60, 60)):  # the checkpoints' meta, as the trainer writes it
    meta = tmp_path / 'trained_on' / 'checkpoints' / str(step) / 'meta'
    meta.mkdir(parents=True)
    (meta / 'metadata').write_text(json.dumps({'best_step': best}))
    if step == 40:
      assert report.load_run(workdir).results['step'] == 40
  with pytest.raises(report.ReportError, match=r'written for step 40, and the best checkpoint '
                     r'of .*trained_on is now step 60: re-run --mode=eval'):
    report.load_run(workdir)
  # A report folder that cannot be made is named by its key.
  (tmp_path / 'a_file').write_text('x')
  with pytest.raises(report.ReportError, match=r'config.report.output=.*a_file: cannot be the '
                     r"report's folder \(File exists\)"):
    report.write_report(report_config(write_run(tmp_path, 'ok', 'mtn', (3, 2, 3), 1.0,
                                                (1.0, 1.0, 1.0, 1.0)), str(tmp_path / 'a_file')),
                        str(tmp_path / 'ok'))


# ---------------------------------------------------------------------------------------------
# What a model reads: the same for evaluation, decode and the service


@pytest.fixture(scope='module')
def demo_corpus(tmp_path_factory):
  """A small preprocessed demo corpus whose sessions keep their users' earlier queries."""
  from mtn_jax.data import preprocess  # pylint: disable=g-import-not-at-top
  config = demo.get_config()
  config.data.demo_users, config.data.history_queries = 120, 4
  config.data.split_by = 'time'  # test users met in training: HEM's user numbers are not 0
  workdir = str(tmp_path_factory.mktemp('corpus'))
  preprocess.prepare(config, workdir)
  return config, preprocess.data_dir(workdir)


@pytest.mark.parametrize('name,fields', [
    ('mtn', {'copy': True, 'user_memory': 'attention'}),
    ('zam', {'user_model': 'hem'}),
    ('zam', {'user_model': 'zam'}),
    ('biencoder', {}),
])
def test_the_service_gives_a_model_what_evaluation_gives_it(demo_corpus, name, fields):
  from mtn_jax.data import candidate_pool  # pylint: disable=g-import-not-at-top
  from mtn_jax.data import sessions  # pylint: disable=g-import-not-at-top
  from mtn_jax.inference import habits  # pylint: disable=g-import-not-at-top
  from mtn_jax.training import train  # pylint: disable=g-import-not-at-top
  config, data_dir = demo_corpus
  config = families.use(ml_collections.ConfigDict(config.to_dict()), name)
  config.model.update(fields)
  vocab = sessions.load_vocab(data_dir)
  test = sessions.load_split(data_dir, 'test')
  task = tasks.make_task(train.model_config(config, vocab, sessions.load_split(
      data_dir, 'train'), data_dir), config.train, data_dir)
  past = habits.past_queries(data_dir, test)
  batches = list(inputs.split_batches(task, vocab, test, queries_per_batch=64))
  assert len(batches) > 2
  compared = set()
  for evaluated in batches:
    chosen = evaluated.pop('session_ids')
    chosen = chosen[chosen >= 0]
    # Each session as decode and the service meet it: its texts, its user's earlier queries
    # and the user it is.
    contexts = [inputs.Context(tuple(test.session_texts(i)), 0, {'user': int(test.users[i])},
                               history=past[i]) for i in chosen.tolist()]
    served, lengths = inputs.context_batch(
        task, vocab, contexts, rows=len(evaluated['queries']),
        width=evaluated['queries'].shape[1], history_queries=config.data.history_queries,
        pool=candidate_pool.load_pool(data_dir))
    assert sorted(served) == sorted(evaluated)
    assert lengths[:len(chosen)].tolist() == test.lengths[chosen].tolist()
    for key, value in evaluated.items():
      np.testing.assert_array_equal(served[key][:len(chosen)], value[:len(chosen)],
                                    err_msg=key)
      compared.add(key)
  assert compared == {'queries', *task.context_inputs(test, vocab).per_query,
                      *task.context_inputs(test, vocab).per_session}


def test_evaluation_names_a_results_folder_it_cannot_write_before_any_work(tmp_path):
  """Not as an OS error after decoding the whole split: before the model loads (this
  workdir has none)."""
  from mtn_jax import errors  # pylint: disable=g-import-not-at-top
  (tmp_path / 'eval').write_text('a file where the results go')
  with pytest.raises(errors.Error, match=re.escape(
      f'evaluation writes its results in {tmp_path}/eval: {tmp_path}/eval is a file, not a '
      'folder')):
    evaluate.evaluate(demo.get_config(), str(tmp_path))


def test_decode_refused_before_any_suggestion_leaves_no_output_folder(tmp_path):
  """The default output's folder (`<workdir>/decode/`) is made before the model loads (a
  folder the system refuses is named before any work); a workdir refused then (no checkpoint)
  is left as it was."""
  from mtn_jax import errors  # pylint: disable=g-import-not-at-top
  sessions = tmp_path / 'sessions.txt'
  sessions.write_text('cheap flights\tboston\n', encoding='utf-8')
  config = demo.get_config()
  config.decode.input = str(sessions)
  workdir = tmp_path / 'never_trained'
  with pytest.raises(errors.Error, match='no checkpoints'):
    suggest.decode_file(config, str(workdir))
  assert not workdir.exists()


def test_evaluation_writes_its_files_before_printing_its_figures(tmp_path, monkeypatch):
  """A failure printing the figures leaves the decoded lists written."""
  calls = []
  monkeypatch.setattr(evaluate.inference, 'load_trained',
                      lambda config, workdir: types.SimpleNamespace(task=object()))
  monkeypatch.setattr(evaluate, 'split_to_evaluate', lambda config, data_dir, log: ('S', 1))
  monkeypatch.setattr(evaluate, '_load_split', lambda data_dir, name: 'T')
  monkeypatch.setattr(evaluate.Pairs, 'of', classmethod(lambda cls, split: 'P'))
  monkeypatch.setattr(evaluate, 'decode_lists', lambda *args: 'L')
  monkeypatch.setattr(evaluate, 'scores', lambda *args, **kwargs: {'scores': {}})

  def written(workdir, results, lists, pairs, *, prefix, seed):
    calls.append('write')
    return os.path.join(workdir, 'eval', f'{prefix}results.json')

  def printed(results, lists, log):
    calls.append('print')
    raise KeyError('a source without its label')

  monkeypatch.setattr(evaluate, 'write_results', written)
  monkeypatch.setattr(evaluate, 'print_results', printed)
  with pytest.raises(KeyError):
    evaluate.evaluate(demo.get_config(), str(tmp_path))
  assert calls == ['write', 'print']


@pytest.mark.parametrize('first_line', [
    '4945\trosa parks\t2006-03-01T15:58:56\tmlk\n',  # 4 fields: a session of 4 queries
    '4945\trosa parks\t2006/03/01 15:58\ta\tb\tc\n'])  # 6 fields
def test_an_anon_id_and_another_time_form_make_a_log_line_only_in_3_or_5_fields(tmp_path,
                                                                               first_line):
  """`is_raw_log_line`'s other-time rule holds for a log's 3 or 5 fields alone."""
  path = tmp_path / 'input.txt'
  path.write_text(first_line + 'more\n', encoding='utf-8')
  assert inputs.detect_format(str(path)) == 'sessions'
