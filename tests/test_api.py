"""`mtn_jax.api`, the Python entry point: what it refuses, and the user's past it hands over
(on an engine without a model, tests/stub_server.py). Its lists are the service's:
tests/test_learned_cli.py."""

import numpy as np
import pytest

from mtn_jax import api
from mtn_jax import errors
from mtn_jax.serving import engine as engine_lib
from tests.stub_server import StubEngine


class Recording(StubEngine):
  """Answers with the past each request holds."""

  def run(self, requests):
    self.requests = list(requests)
    return [[{'query': q, 'score': 0.0} for q in r.history] for r in requests]


def test_sessions_are_read_as_the_service_reads_a_request():
  suggester = api.Suggester(Recording())
  assert suggester.suggest(['Cheap  Flights']) == []
  assert suggester.engine.requests == [engine_lib.Request(('cheap flights',), 5)]
  suggester.suggest_many([['a'], ['b', 'c']], k=3)
  assert [(r.session, r.k) for r in suggester.engine.requests] == [(('a',), 3),
                                                                   (('b', 'c'), 3)]
  # What the service answers 422 is a ValueError naming the session and its item.
  for session, message in ((['ok', ' '], r"sessions\[0\]: session\[1\]: an empty query"),
                           (['q'] * 5, r'sessions\[0\]: session: 5 queries; the model reads '
                            r'at most 4'),
                           (['w ' * 11], r'sessions\[0\]: session\[0\]: 11 words'),
                           (['a\x1bb'], r'sessions\[0\]: session\[0\]: holds'),
                           ([], r'sessions\[0\]: session: empty')):
    with pytest.raises(ValueError, match=message):
      suggester.suggest(session)
  with pytest.raises(ValueError, match=r'^k: 0 is out of range'):
    suggester.suggest_many([['a'], ['b']], k=0)
  # A string is no session (it would be read a letter a query), nor a number a query.
  for bad in ('google', ['a', 1], [None]):
    with pytest.raises(TypeError, match=r'sessions\[0\]: a list of queries \(str\)'):
      suggester.suggest(bad)
  with pytest.raises(TypeError, match='sessions: a list of sessions'):
    suggester.suggest_many('google')
  with pytest.raises(ValueError, match='pasts: 1 for 2 sessions'):
    suggester.suggest_many([['a'], ['b']], pasts=[['c']])


def test_a_users_past_is_normalised_and_cut_to_what_the_lists_read():
  engine = Recording(personalises=True)
  engine.past_read = 2
  suggester = api.Suggester(engine)
  assert [c['query'] for c in suggester.suggest(
      ['now'], past=['Oldest', 'Weather  PARIS', '\u202e', 'Hotels'])] == [
          'weather paris', 'hotels']
  # Several users: each their own.
  got = suggester.suggest_many([['a'], ['b']], pasts=[['x'], []])
  assert [[c['query'] for c in shown] for shown in got] == [['x'], []]
  with pytest.raises(TypeError, match=r'sessions\[0\]\.past: a list of queries'):
    suggester.suggest(['a'], past='x y')
  # A model that reads no user's past refuses one, as the service refuses a user.
  with pytest.raises(ValueError, match=r"sessions\[0\]\.past: this model reads no user's past"):
    api.Suggester(Recording()).suggest(['a'], past=['b'])


def test_what_the_service_would_refuse_of_a_past_or_k_is_refused():
  engine = Recording(personalises=True)
  suggester = api.Suggester(engine)
  with pytest.raises(ValueError, match=r'sessions\[0\]\.past\[1\]: holds'):
    suggester.suggest(['a'], past=['ok', 'x\x1b[A'])
  for k in (2.5, True, '3', np.float32(3)):
    with pytest.raises(TypeError, match='^k: a whole number'):
      suggester.suggest(['a'], k=k)
  # Any integer type is a whole number: a numpy one is read as the int it holds.
  suggester.suggest(['a'], k=np.int64(3))
  assert [(r.k, type(r.k)) for r in engine.requests] == [(3, int)]


def test_a_user_id_reaches_a_ranker_that_knows_users_and_is_refused_elsewhere():
  engine = Recording(personalises=True)
  engine.knows_users = True
  suggester = api.Suggester(engine)
  suggester.suggest_many([['a'], ['b'], ['c']], users=['142', None, '7'])
  assert [r.user for r in engine.requests] == ['142', None, '7']
  # The engine hands a numeric id to the ranker as the service's request does.
  assert [engine_lib.Engine._info(r) for r in engine.requests] == [{'user': 142}, {},
                                                                   {'user': 7}]
  with pytest.raises(TypeError, match=r"sessions\[0\]\.user: the training log's id as a str"):
    suggester.suggest(['a'], user=142)
  with pytest.raises(ValueError, match=r'sessions\[0\]\.user: holds'):
    suggester.suggest(['a'], user='x\x1b')
  with pytest.raises(ValueError, match='users: 1 for 2 sessions'):
    suggester.suggest_many([['a'], ['b']], users=['1'])
  with pytest.raises(TypeError, match='users: a list of user ids'):  # not '1', '4', '2'
    suggester.suggest_many([['a'], ['b'], ['c']], users='142')
  # A model that reads a user's past but knows no user by id: the past is what to give.
  with pytest.raises(ValueError, match=r'sessions\[0\]\.user: this model knows no user by '
                     'id: give their earlier queries as past'):
    api.Suggester(Recording(personalises=True)).suggest(['a'], user='142')
  with pytest.raises(ValueError, match=r'knows no user by id \(it reads no user\)'):
    api.Suggester(Recording()).suggest(['a'], user='142')


def test_a_suggestion_holds_what_the_service_answers_of_it():
  class Extra(StubEngine):
    def run(self, requests):
      return [[{'query': 'q', 'score': 1.0, 'source': 'popular', 'model_score': None,
                'sources': ['popular']}] for _ in requests]

  assert api.Suggester(Extra()).suggest(['a']) == [
      {'query': 'q', 'score': 1.0, 'sources': ['popular']}]


def test_more_pasts_than_sessions_are_refused():
  with pytest.raises(ValueError, match='pasts: 2 for 1 sessions'):
    api.Suggester(Recording(personalises=True)).suggest_many([['a']], pasts=[['b'], ['c']])


def test_load_refuses_a_key_no_run_reads(tmp_path):
  from tests import cli  # pylint: disable=g-import-not-at-top
  config = cli.config()
  with config.unlocked():
    config.decode.beamsize = 10
  with pytest.raises(errors.ConfigError, match=r'^config\.decode\.beamsize: config\.decode has '
                     r'no key \'beamsize\' \(did you mean "beam_size"\?\)'):
    api.load(config, str(tmp_path))


def test_load_hands_the_engine_the_user_facing_protocol_unless_the_config_sets_one(
    monkeypatch, tmp_path):
  from tests import cli  # pylint: disable=g-import-not-at-top
  given = []
  monkeypatch.setattr(api.trained_lib, 'check_config', lambda config, workdir: None)
  monkeypatch.setattr(api.pipeline_lib.Pipeline, 'load',
                      lambda config, workdir, log: config.decode.exclude_session_queries)
  monkeypatch.setattr(api.engine_lib, 'Engine',
                      lambda pipeline, max_batch, exclude: given.append((pipeline, exclude)))
  for overrides, protocol in (((), True),
                              (('--config.decode.exclude_session_queries=false',), False),
                              (('--config.decode.exclude_session_queries=true',), True)):
    api.load(cli.config(*overrides), str(tmp_path))
    assert given.pop() == (protocol, protocol), overrides
