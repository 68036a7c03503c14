"""Cross-fitted generators' suggestions as a ranker's candidates (`mtn_jax.data.hypothesis_files`).

The user folds and session selections they rest on, exactly; then the real command line: two
generators trained without one fold of the users each, and a ranker that learns from their
suggestions, each training session's from the generator that never saw its user.
"""

import dataclasses
import json
import re

import ml_collections
import numpy as np
import pytest

from configs import default
from mtn_jax import config_lib
from mtn_jax import errors
from mtn_jax.data import hypothesis_files
from mtn_jax.data import sessions
from mtn_jax.inference import hypothesis_decoding
from tests import cli


def test_user_folds_keep_each_user_whole_balanced_and_seeded():
  rng = np.random.default_rng(0)
  users = rng.integers(0, 40, size=300)
  folds = sessions.user_folds(users, 3, seed=0)
  assert folds.shape == (300,) and set(folds.tolist()) == {0, 1, 2}
  for user in np.unique(users):  # all of a user's sessions in one fold
    assert len(set(folds[users == user].tolist())) == 1
  users_per_fold = [len(np.unique(users[folds == k])) for k in range(3)]
  assert max(users_per_fold) - min(users_per_fold) <= 1
  np.testing.assert_array_equal(sessions.user_folds(users, 3, seed=0), folds)
  assert not np.array_equal(sessions.user_folds(users, 3, seed=1), folds)


def test_select_sessions_keeps_rows_texts_and_per_session_fields(tmp_path):
  texts = ['a b', 'c', 'd e f', 'g', 'h', 'i j', 'k']
  (tmp_path / 'split.txt').write_text(''.join(t + '\n' for t in texts))
  queries = np.arange(7 * 3, dtype=np.int32).reshape(7, 3)
  # Per session, M = 2 past queries of its user (words [3, 2, 3]) and their pool entries.
  history = np.arange(3 * 2 * 3, dtype=np.int32).reshape(3, 2, 3)
  history_items = np.array([[-1, 4], [7, 8], [5, -1]], np.int32)
  split = sessions.SessionSplit('train', queries, np.array([0, 2, 5, 7]),
                                str(tmp_path / 'split.txt'), users=np.array([10, 11, 12]),
                                start_times=np.array([100, 200, 300]), history=history,
                                history_items=history_items)
  picked = sessions.select_sessions(split, np.array([2, 0]))
  np.testing.assert_array_equal(picked.starts, [0, 2, 4])
  np.testing.assert_array_equal(picked.queries, queries[[5, 6, 0, 1]])
  assert picked.texts == ['i j', 'k', 'a b', 'c']
  assert picked.session_texts(1) == ['a b', 'c']
  np.testing.assert_array_equal(picked.users, [12, 10])
  np.testing.assert_array_equal(picked.start_times, [300, 100])
  # The history is per session too: a selection that lost it (or kept another session's)
  # would give the history models the wrong user's past queries.
  np.testing.assert_array_equal(picked.history, history[[2, 0]])
  np.testing.assert_array_equal(picked.history_items, [[5, -1], [-1, 4]])
  # A selection of a selection reads the right lines of the file too.
  again = sessions.select_sessions(picked, np.array([1]))
  assert again.texts == ['a b', 'c'] and again.num_pairs == 1


def test_config_refuses_folds_that_hold_no_user_out():
  from configs import aol, polyencoder_aol  # pylint: disable=g-import-not-at-top
  config = aol.get_config('small')
  config.data.raw_files, config.data.split_by = 'log.tsv', 'user'
  config.train.user_folds, config.train.held_out_fold = 2, 1
  config_lib.validate(config, 'train')
  for folds, held_out in ((1, 0), (2, 2), (3, -1)):
    config.train.user_folds, config.train.held_out_fold = folds, held_out
    with pytest.raises(config_lib.ConfigError, match='held_out_fold'):
      config_lib.validate(config, 'train')
  # On a session split the validation users are training users too.
  config.train.user_folds, config.train.held_out_fold = 2, 0
  config.data.split_by = 'session'
  with pytest.raises(config_lib.ConfigError, match="split_by='user'"):
    config_lib.validate(config, 'train')
  # Only rankers read generated candidates.
  config.data.split_by, config.train.user_folds = 'user', 0
  config.train.hypotheses_from = 'a,b'
  with pytest.raises(config_lib.ConfigError, match="'mtn' reads none"):
    config_lib.validate(config, 'train')
  ranker = polyencoder_aol.get_config('cross')
  ranker.data.raw_files, ranker.train.hypotheses_from = 'log.tsv', 'a,b'
  config_lib.validate(ranker, 'train')


def _training_sessions(tmp_path):
  """Six training sessions of five users (two with two sessions), their texts on disk."""
  lengths = [2, 3, 2, 1, 2, 3]
  texts = [f'q{i}' for i in range(sum(lengths))]
  (tmp_path / 'train.txt').write_text(''.join(t + '\n' for t in texts))
  return sessions.SessionSplit(
      'train', np.zeros((len(texts), 3), np.int32), np.concatenate([[0], np.cumsum(lengths)]),
      str(tmp_path / 'train.txt'), users=np.array([10, 11, 12, 10, 13, 11]))


def _fold_generators(tmp_path, folds=2, split_seed=0):
  config = lambda k: ml_collections.ConfigDict(
      {'data': {'split_seed': split_seed}, 'train': {'user_folds': folds, 'held_out_fold': k}})
  return [hypothesis_files.Generator(str(tmp_path / f'g{k}'), config(k), folds, k)
          for k in range(folds)]


def test_each_training_session_reads_the_generator_that_never_saw_its_user(tmp_path):
  """Cross-fitting: a training session's suggestions come from the generator that held its
  user's fold out, read back row for row from that generator's file; every other split's from
  the first generator (no generator saw those users). A file made for other sessions is
  refused rather than read."""
  split = _training_sessions(tmp_path)
  found = _fold_generators(tmp_path)
  fold_of_session = sessions.session_folds(split, 2, 0)
  assert set(fold_of_session.tolist()) == {0, 1}
  assigned = hypothesis_files.sessions_of(found, split)
  assert [g.held_out for g, _ in assigned] == [0, 1]
  for generator, chosen in assigned:
    np.testing.assert_array_equal(chosen, np.flatnonzero(fold_of_session == generator.held_out))
    part = sessions.select_sessions(split, chosen)
    hypothesis_files.write(generator.path('train'),
                           {'sessions': hypothesis_files.fingerprint(part)},
                           [[f'{text} by g{generator.held_out}'] for text in part.texts])
  rows = hypothesis_files.split_suggestions(found, split)
  fold_of_row = np.repeat(fold_of_session, split.lengths)
  assert rows == [[f'{text} by g{k}'] for text, k in zip(split.texts, fold_of_row)]
  # Another split: all its sessions from the first generator, whose file alone exists.
  valid = dataclasses.replace(split, name='valid')
  assert [(g.held_out, c.tolist()) for g, c in hypothesis_files.sessions_of(found, valid)] == [
      (0, list(range(6)))]
  hypothesis_files.write(found[0].path('valid'), {'sessions': hypothesis_files.fingerprint(valid)},
                         [['x']] * len(valid.texts))
  assert hypothesis_files.split_suggestions(found, valid) == [['x']] * len(valid.texts)
  # Named fold 1 first: each training session still goes to the generator that held its user
  # out (by its fold, not its place in the list), another split's to the first named.
  backwards = found[::-1]
  assert [(g.held_out, c.tolist()) for g, c in hypothesis_files.sessions_of(backwards, split)
          ] == [(g.held_out, c.tolist()) for g, c in assigned[::-1]]
  assert hypothesis_files.sessions_of(backwards, valid)[0][0] is backwards[0]
  # The same texts cut into other sessions are other sessions.
  regrouped = dataclasses.replace(split, starts=np.array([0, 5, 7, 8, 10, 13]))
  assert hypothesis_files.fingerprint(regrouped) != hypothesis_files.fingerprint(split)
  # A file cut short (its header whole, its last row lost): refused, not read misaligned.
  part = sessions.select_sessions(split, assigned[0][1])
  hypothesis_files.write(found[0].path('train'), {'sessions': hypothesis_files.fingerprint(part)},
                         [['x']] * (len(part.texts) - 1))
  with pytest.raises(errors.Error, match='g0/hypotheses/train.jsonl does not hold the '
                                         'suggestions for the train sessions'):
    hypothesis_files.split_suggestions(found, split)
  # One damaged (no JSON): refused in the same words, not a JSON traceback.
  (tmp_path / 'g0' / 'hypotheses' / 'train.jsonl').write_text('{"sessions": "cut')
  assert hypothesis_files.read(found[0].path('train')) == (None, [])
  with pytest.raises(errors.Error, match='g0/hypotheses/train.jsonl does not hold the '
                                         'suggestions for the train sessions'):
    hypothesis_files.split_suggestions(found, split)
  # Generator 1's file read for generator 0's sessions: refused by name.
  (tmp_path / 'g0' / 'hypotheses' / 'train.jsonl').write_text(
      (tmp_path / 'g1' / 'hypotheses' / 'train.jsonl').read_text())
  with pytest.raises(errors.Error, match='g0/hypotheses/train.jsonl does not hold the '
                                         'suggestions for the train sessions'):
    hypothesis_files.split_suggestions(found, split)


def test_a_fold_of_no_user_has_no_generator_to_read(tmp_path):
  """More folds than users: the generators whose fold holds no session are left out, and the
  training split is read from the others' files alone."""
  split = _training_sessions(tmp_path)
  found = _fold_generators(tmp_path, folds=5)
  fold_of_session = sessions.session_folds(split, 5, 0)
  assigned = hypothesis_files.sessions_of(found, split)
  assert [g.held_out for g, _ in assigned] == sorted(set(fold_of_session.tolist()))
  assert len(assigned) < 5
  for generator, chosen in assigned:
    part = sessions.select_sessions(split, chosen)
    hypothesis_files.write(generator.path('train'),
                           {'sessions': hypothesis_files.fingerprint(part)},
                           [[text] for text in part.texts])
  assert hypothesis_files.split_suggestions(found, split) == [[text] for text in split.texts]


def test_generators_must_hold_out_each_fold_of_one_split_once(tmp_path, monkeypatch):
  """`config.train.hypotheses_from` names K generators that hold out folds 0..K-1 of one
  user_folds=K and one split_seed: two holding out the same fold would leave the other
  fold's users with suggestions from a generator that saw them."""
  monkeypatch.setattr(hypothesis_files.preprocess, 'session_difference', lambda a, b: None)

  def workdir(name, fold, folds=2, seed=0):
    path = tmp_path / name
    path.mkdir()
    (path / 'config.json').write_text(json.dumps({'config': {
        'data': {'split_seed': seed}, 'train': {'user_folds': folds, 'held_out_fold': fold}}}))
    return str(path)

  a, b, c, d = workdir('a', 0), workdir('b', 1), workdir('c', 0), workdir('d', 1, seed=5)
  found = hypothesis_files.generators(f'{b}, {a},', str(tmp_path))
  assert [(g.workdir, g.held_out, g.folds) for g in found] == [(b, 1, 2), (a, 0, 2)]
  for names in (f'{a},{c}', f'{a},{d}', a, f'{a},{b},{c}'):
    with pytest.raises(errors.Error, match='hold out each fold of one user_folds=K once'):
      hypothesis_files.generators(names, str(tmp_path))
  # A damaged record (cut short, or not the config) is named, not a JSON traceback.
  for damaged in ('{"config": {"data": {"split_se', '[1, 2]', '{"model": {}}', '\xff\xfe'):
    (tmp_path / 'b' / 'config.json').write_bytes(damaged.encode('latin-1'))
    with pytest.raises(errors.Error, match=re.escape(
        f'{b}/config.json is not the config record --mode=train writes (')):
      hypothesis_files.generators(f'{a},{b}', str(tmp_path))
  # A generator trained on other sessions than this run's is refused by name.
  monkeypatch.setattr(hypothesis_files.preprocess, 'session_difference',
                      lambda a, b: 'another train split')
  with pytest.raises(errors.Error, match=re.escape(
      f'{a} was trained on other sessions than this run (another train split)')):
    hypothesis_files.generators(a, str(tmp_path))


def test_generators_decode_their_whole_beam_whatever_top_k_shows():
  # The ranker learns from what evaluation reranks: every hypothesis of the beam, the
  # session's queries kept; config.decode.top_k cuts only what is shown.
  config = default.get_config()
  config.decode.beam_size, config.decode.top_k = 6, 2
  config.decode.exclude_session_queries = True
  got = hypothesis_decoding.settings(hypothesis_files.Generator('W', config, 2, 0))
  assert (got.beam_size, got.top_k, got.exclude_session_queries) == (6, 6, False)


def test_suggestions_are_encoded_first_words_first_and_padded():
  """int32 [queries, H, n]: H the longest list (1 when all are empty), each text's first n
  token ids (the words a query starts with, as the splits keep them), padding 0."""
  from mtn_jax.data import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  words = vocab_lib.Vocab(vocab_lib.SPECIAL_TOKENS + ('a', 'b', 'c'))
  a, b, c = words.encode(['a', 'b', 'c'])
  encoded = hypothesis_files.encode([['a b c', 'b'], [], ['c zzz']], words, 2)
  assert encoded.dtype == np.int32
  np.testing.assert_array_equal(encoded, [[[a, b], [b, 0]], [[0, 0], [0, 0]],
                                          [[c, vocab_lib.UNK_ID], [0, 0]]])
  assert hypothesis_files.encode([[], []], words, 3).shape == (2, 1, 3)


USER_SPLIT = ('--config.data.split_by=user', '--config.train.log_every_steps=1')


@pytest.mark.slow
def test_ranker_learns_from_generators_that_never_saw_its_users(tmp_path):
  generators = [tmp_path / f'generator{k}' for k in (0, 1)]
  held_out = []
  for k, workdir in enumerate(generators):
    out = cli.run(workdir, *USER_SPLIT, '--config.train.max_steps=2',
                  '--config.train.user_folds=2', f'--config.train.held_out_fold={k}').stdout
    line = next(l for l in out.splitlines() if f'users of fold {k} of 2 held out' in l)
    held_out.append(int(line.split('held out (')[1].split()[0].replace(',', '')))
  train = sessions.load_split(str(generators[0] / 'data'), 'train')
  folds = sessions.user_folds(train.users, 2, seed=0)
  # Each generator was trained without exactly the sessions of its fold's users.
  assert held_out == [int((folds == 0).sum()), int((folds == 1).sum())]

  ranker = lambda workdir, source, name='demo_bi': cli.run(
      workdir, *USER_SPLIT, '--config.train.max_steps=2', '--config.decode.max_eval_sessions=8',
      '--config.model.session_candidates=True', f'--config.train.hypotheses_from={source}',
      config=f'configs/polyencoder_aol.py:{name}')
  both = ','.join(str(g) for g in generators)
  out = ranker(tmp_path / 'ranker', both).stdout
  assert out.count('Decoding') == 3  # each generator its fold's training sessions; valid
  from mtn_jax.training import metric_writer  # pylint: disable=g-import-not-at-top
  valid = metric_writer.read_metrics(str(tmp_path / 'ranker'), 'valid')
  assert valid and all(np.isfinite(r['loss']) for r in valid)
  # The cache: one header, then one list per query row of the sessions each one decoded.
  cached = {}
  for k, workdir in enumerate(generators):
    lines = (workdir / 'hypotheses' / 'train.jsonl').read_text().splitlines()
    cached[k] = [json.loads(line) for line in lines[1:]]
    mine = np.flatnonzero(folds == k)
    assert len(cached[k]) == int(train.lengths[mine].sum())
    ends = np.cumsum(train.lengths[mine]) - 1  # after a session's last query: nothing
    assert all(cached[k][i] == [] for i in ends)
    assert sum(len(c) > 0 for c in cached[k]) == int((train.lengths[mine] - 1).sum())
    assert all(0 < len(c) <= 5 for i, c in enumerate(cached[k]) if i not in set(ends))
  assert (generators[0] / 'hypotheses' / 'valid.jsonl').exists()
  assert not (generators[1] / 'hypotheses' / 'valid.jsonl').exists()
  # Evaluation ranks the pool and the session's queries: it decodes nothing.
  out = cli.run(tmp_path / 'ranker', *USER_SPLIT, '--config.decode.max_eval_sessions=8',
                '--config.model.session_candidates=True', f'--config.train.hypotheses_from={both}',
                mode='eval', config='configs/polyencoder_aol.py:demo_bi').stdout
  assert 'Decoding' not in out and 'MRR' in out
  assert not any((g / 'hypotheses' / 'test.jsonl').exists() for g in generators)

  # Another ranker on the same corpus, a Cross-encoder, reuses the cached suggestions.
  out = ranker(tmp_path / 'ranker2', both, name='demo_cross').stdout
  assert 'Decoding' not in out
  valid = metric_writer.read_metrics(str(tmp_path / 'ranker2'), 'valid')
  assert valid and all(np.isfinite(r['loss']) for r in valid)
  # One fold's generator alone, or one trained on every user, is refused by name.
  data_dir = str(tmp_path / 'ranker' / 'data')
  with pytest.raises(errors.Error, match='hold out each fold of one user_folds=K once'):
    hypothesis_files.generators(str(generators[0]), data_dir)
  everyone = tmp_path / 'everyone'
  everyone.mkdir()
  (everyone / 'data').symlink_to(generators[0] / 'data')
  saved = json.loads((generators[0] / 'config.json').read_text())
  saved['config']['train']['user_folds'] = 0
  (everyone / 'config.json').write_text(json.dumps(saved))
  with pytest.raises(errors.Error, match='was trained on every training session'):
    hypothesis_files.generators(f'{everyone},{generators[1]}', data_dir)
