"""The suggestion service (--mode=serve, mtn_jax/serving/).

One tiny personalising MTN (it reads a user's earlier queries) is trained once for the module;
most tests talk to the service in this process (FastAPI's TestClient, the model warmed up once),
and only what needs a process of its own (SIGTERM, kill -9, the page in a browser) starts one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import warnings

import httpx
import pytest

with warnings.catch_warnings():  # starlette's TestClient asks for a package the project lacks
  warnings.simplefilter('ignore')
  from fastapi.testclient import TestClient  # pylint: disable=g-import-not-at-top

from mtn_jax.inference import suggest
from mtn_jax.serving import app as app_lib
from mtn_jax.serving import batcher as batcher_lib
from mtn_jax.serving import engine as engine_lib
from mtn_jax.serving import history as history_lib
from mtn_jax.serving import service as service_lib
from tests import cli

pytestmark = pytest.mark.slow

# The model reads each user's last 4 earlier queries (a user is accepted); two steps of training.
MODEL = ('--config.data.history_queries=4', '--config.model.user_memory=attention')
TRAIN = ('--config.train.max_steps=2',)
SERVE = ('--config.serve.max_batch=4', '--config.serve.max_wait_ms=20')
MAX_QUERIES = 16  # the model's max_session_queries (configs/default.py)
LOOPBACK = ('127.0.0.1', 50000)


def _quiet(*args, **kwargs):
  del args, kwargs


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
  path = tmp_path_factory.mktemp('serve') / 'run'
  cli.run(path, *MODEL, *TRAIN)
  return str(path)


def _config(*overrides):
  return cli.config(*MODEL, *TRAIN, *SERVE, *overrides)


@pytest.fixture(scope='module')
def service(workdir):
  return service_lib.build(_config(), workdir, log=_quiet)


@pytest.fixture(scope='module')
def client(service):
  app = app_lib.create_app(service)
  with TestClient(app, client=LOOPBACK, raise_server_exceptions=False) as test_client:
    yield test_client


def sessions_of_every_length(service, count: int = MAX_QUERIES) -> list[list[str]]:
  """Sessions of 1..count queries of the vocabulary's words (and one unknown word)."""
  words = [w for w in service.engine.pipeline.trained.vocab.words[5:]]
  out = []
  for length in range(1, count + 1):
    out.append([' '.join(words[(7 * length + 3 * t + j) % len(words)] for j in range(1 + t % 3))
                for t in range(length)])
  out[2][-1] += ' zzzunknownzzz'
  return out


def suggest_all(client, bodies, threads: int = 8):
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    return list(pool.map(lambda body: client.post('/v1/suggest', json=body), bodies))


# ---------------------------------------------------------------------------------------------
# Suggestions, batching, compilation


def test_suggestions_equal_decodes(workdir, service, client, tmp_path):
  """The service shows what --mode=decode writes for the same sessions: the user-facing
  protocol by default, the paper's with config.serve.user_facing=False."""
  sessions = sessions_of_every_length(service)
  decode_input = tmp_path / 'sessions.txt'
  decode_input.write_text(''.join('\t'.join(s) + '\n' for s in sessions))
  served = suggest_all(client, [{'session': s} for s in sessions])
  assert all(r.status_code == 200 for r in served), [r.text for r in served]
  paper = engine_lib.Engine(service.engine.pipeline, 4, exclude_session_queries=False)
  for exclude in (True, False):
    output = tmp_path / f'decoded-{exclude}.jsonl'
    suggest.decode_file(_config(f'--config.decode.input={decode_input}',
                                f'--config.decode.output={output}',
                                f'--config.decode.exclude_session_queries={exclude}'), workdir)
    decoded = [json.loads(line)['suggestions'] for line in output.read_text().splitlines()]
    assert len(decoded) == len(sessions)
    if exclude:
      answers = [r.json()['suggestions'] for r in served]
    else:
      reader = service.engine._reader  # pylint: disable=protected-access
      answers = paper.run([engine_lib.Request(tuple(reader.query(q) for q in s), 5)
                           for s in sessions])
    for session, want, got in zip(sessions, decoded, answers):
      assert [s['query'] for s in got] == [s['query'] for s in want], session
      assert [s['score'] for s in got] == pytest.approx([s['score'] for s in want], abs=1e-4)
      assert len(got) == 5
      if exclude:
        assert not set(s['query'] for s in got) & set(session)


def test_every_length_and_batch_size_compiles_nothing_new(service, client):
  """Warm-up compiled every shape: sessions of every allowed length, alone and in batches of
  every size, with and without a user, compile no program."""
  sessions = sessions_of_every_length(service)
  before = engine_lib.compilations()
  assert before > 0
  for threads in (1, 3, 8):
    bodies = [{'session': s, 'k': 1 + i % engine_lib.MAX_K,
               **({'user': f'u{i % 3}'} if i % 2 else {})} for i, s in enumerate(sessions)]
    answers = suggest_all(client, bodies, threads)
    assert [r.status_code for r in answers] == [200] * len(bodies), [r.text for r in answers]
  assert engine_lib.compilations() == before
  metrics = client.get('/metrics').text
  assert f'mtn_serve_compilations {float(before)}' in metrics
  # Concurrent requests were coalesced: some batch held more than one request.
  batches = float(re.search(r'^mtn_serve_batch_size_count (\S+)$', metrics, re.M).group(1))
  served = float(re.search(r'^mtn_serve_batch_size_sum (\S+)$', metrics, re.M).group(1))
  assert served >= 3 * MAX_QUERIES and batches < served


def test_response_health_readiness_and_metrics(service, client):
  response = client.post('/v1/suggest', json={'session': ['Cheap  FLIGHTS'], 'k': 2})
  assert response.status_code == 200, response.text
  body = response.json()
  assert len(body['suggestions']) == 2 and body['ms'] > 0
  assert set(body['suggestions'][0]) == {'query', 'score'}
  assert body['model'] == {'name': 'mtn', 'step': service.engine.step,
                           'workdir': service.engine.workdir}
  assert 'history' not in body
  assert re.fullmatch(r'[0-9a-f]{16}', response.headers['x-request-id'])
  assert client.get('/healthz').json() == {'status': 'ok'}
  assert client.get('/readyz').json() == {'ready': True, 'step': service.engine.step}
  info = client.get('/v1/info').json()
  assert info['max_session_queries'] == MAX_QUERIES and info['personalises']
  metrics = client.get('/metrics').text
  for name in ('mtn_serve_requests_total{route="/v1/suggest",status="200"}',
               'mtn_serve_suggest_seconds_bucket', 'mtn_serve_batch_size_bucket',
               'mtn_serve_queue_depth', f'mtn_serve_model_step {float(service.engine.step)}'):
    assert name in metrics, name
  assert client.get('/docs').status_code == 200
  schema = client.get('/openapi.json').json()
  assert {'/v1/suggest', '/healthz', '/readyz'} <= set(schema['paths'])
  page = client.get('/')
  assert page.status_code == 200 and 'textContent' in page.text and 'innerHTML' not in page.text


# ---------------------------------------------------------------------------------------------
# Faults


@pytest.mark.parametrize('body, status, field', [
    (b'{"session": ["a"', 400, 'body'),  # invalid JSON
    (b'[1, 2]', 422, 'body'),
    ({'session': []}, 422, 'session'),
    ({}, 422, 'session'),
    ({'session': ['q'] * (MAX_QUERIES + 1)}, 422, 'session'),
    ({'session': ['a', ' '.join(['w'] * 11)]}, 422, 'session[1]'),
    ({'session': ['a', '   ']}, 422, 'session[1]'),
    ({'session': ['a', 7]}, 422, 'session[1]'),
    ({'session': 'a b'}, 422, 'session'),
    ({'session': ['a'], 'k': 0}, 422, 'k'),
    ({'session': ['a'], 'k': 21}, 422, 'k'),
    ({'session': ['a'], 'k': '3'}, 422, 'k'),
    ({'session': ['a'], 'user': 5}, 422, 'user'),
    ({'session': ['a'], 'extra': 1}, 422, 'extra'),
])
def test_bad_input_is_a_4xx_naming_the_field(client, body, status, field):
  if isinstance(body, bytes):
    response = client.post('/v1/suggest', content=body,
                           headers={'content-type': 'application/json'})
  else:
    response = client.post('/v1/suggest', json=body)
  assert response.status_code == status, response.text
  answer = response.json()
  assert answer['field'] == field and answer['error'] and answer['request_id']


def test_a_user_where_the_model_reads_none_is_refused(client, monkeypatch):
  monkeypatch.setattr(engine_lib.Engine, 'personalises', property(lambda self: False))
  response = client.post('/v1/suggest', json={'session': ['a'], 'user': 'ann'})
  assert response.status_code == 422 and response.json()['field'] == 'user', response.text


def test_a_body_over_the_limit_is_refused_unread(client, service):
  limit = service.settings.max_body_bytes
  big = json.dumps({'session': ['x' * (limit + 10)]}).encode()
  response = client.post('/v1/suggest', content=big, headers={'content-type': 'application/json'})
  assert response.status_code == 413 and response.json()['field'] == 'body'
  # Without a Content-Length (chunked), reading stops at the limit.
  response = client.post('/v1/suggest', content=(big[i:i + 1000] for i in range(0, len(big), 1000)),
                         headers={'content-type': 'application/json'})
  assert response.status_code == 413, response.text


def test_an_internal_error_is_a_500_with_a_request_id_and_the_service_goes_on(service, client,
                                                                              monkeypatch):
  engine = service.engine
  real_run = engine.run

  def run(requests):
    if any('explode' in r.session[-1] for r in requests):
      raise RuntimeError('the model exploded')
    return real_run(requests)

  monkeypatch.setattr(engine, 'run', run)
  answers = suggest_all(client, [{'session': ['a', 'explode']}] + [{'session': ['a', f'b{i}']}
                                                                   for i in range(5)])
  assert [r.status_code for r in answers] == [500] + [200] * 5, [r.text for r in answers]
  failed = answers[0]
  assert failed.json()['request_id'] == failed.headers['x-request-id']
  assert 'exploded' not in failed.text  # the log has it, not the client
  # An error outside the batch (in the check) too.
  monkeypatch.setattr(engine, 'check', lambda *a: 1 / 0)
  failed = client.post('/v1/suggest', json={'session': ['a']})
  assert failed.status_code == 500 and failed.json()['request_id']
  monkeypatch.undo()
  assert client.post('/v1/suggest', json={'session': ['a']}).status_code == 200


class SlowEngine:
  """An engine without a model: each batch takes `seconds`; suggestions echo the session."""

  step, workdir, personalises, sizes = 7, '/nowhere', False, (1, 2)

  def __init__(self, seconds: float = 0.0, suggestions=None):
    self.seconds, self.suggestions = seconds, suggestions

  def info(self):
    return {'name': 'stub', 'step': self.step, 'workdir': self.workdir, 'score': 'none',
            'how': 'stub', 'top_k': 5, 'max_session_queries': 4, 'max_query_words': 10,
            'personalises': False, 'user_facing': True}

  def check(self, session, k, user):
    return engine_lib.Request(tuple(session), k or 5, user)

  def run(self, requests):
    time.sleep(self.seconds)
    return [self.suggestions or [{'query': r.session[-1] + ' more', 'score': 0.0}]
            for r in requests]


def stub_client(engine, **settings):
  service = service_lib.Service(engine, service_lib.ServeSettings(**settings),
                                compilations=lambda: 0, log=_quiet)
  return TestClient(app_lib.create_app(service), client=LOOPBACK,
                    raise_server_exceptions=False), service


def test_a_full_queue_is_503_with_retry_after_and_a_late_answer_504():
  client, _ = stub_client(SlowEngine(0.4), max_batch=1, queue_bound=2, max_wait_ms=0,
                          deadline_ms=1000)
  with client:
    answers = suggest_all(client, [{'session': [f'q{i}']} for i in range(8)])
  codes = sorted(r.status_code for r in answers)
  # One runs at a time, two wait: the rest are refused at once; of the waiting, those not
  # started within the second time out.
  assert codes.count(503) >= 4 and 200 in codes and 504 in codes, codes
  refused = next(r for r in answers if r.status_code == 503)
  assert refused.headers['retry-after'] == '1' and 'queue_bound' in refused.json()['error']
  late = next(r for r in answers if r.status_code == 504)
  assert 'deadline_ms' in late.json()['error']


def test_admin_is_for_loopback_or_the_token(tmp_path):
  client, service = stub_client(SlowEngine())
  service.loader = SlowEngine
  with client:
    assert client.post('/admin/reload').json()['reloaded']
  far = TestClient(app_lib.create_app(service), client=('192.0.2.7', 4000))
  assert far.post('/admin/reload').status_code == 403
  client, service = stub_client(SlowEngine(), admin_token='s3cret')
  service.loader = SlowEngine
  with client:
    assert client.post('/admin/reload').status_code == 401
    assert client.post('/admin/reload',
                       headers={'Authorization': 'Bearer wrong'}).status_code == 401
    assert client.post('/admin/reload',
                       headers={'Authorization': 'Bearer s3cret'}).json()['reloaded']
