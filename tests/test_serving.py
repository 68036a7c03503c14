"""The suggestion service (--mode=serve, mtn_jax/serving/).

One tiny personalising MTN (it reads a user's earlier queries) is trained once for the module;
most tests talk to the service in this process (FastAPI's TestClient, the model warmed up once),
and only what needs a process of its own (SIGTERM, kill -9, the page in a browser) starts one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import threading
import time
import types


import httpx
import pytest
import uvicorn

from mtn_jax import errors
from mtn_jax.inference import pipeline as pipeline_lib
from mtn_jax.inference import suggest
from mtn_jax.serving import app as app_lib
from mtn_jax.serving import batcher as batcher_lib
from mtn_jax.serving import engine as engine_lib
from mtn_jax.serving import history as history_lib
from mtn_jax.serving import service as service_lib
from tests import cli
from tests.service_client import LOOPBACK
from tests.service_client import TestClient


# The model reads each user's last 4 earlier queries (a user is accepted); two steps of training.
# Sessions of up to 4 queries (padded to 1, 2 or 4: engine.padded_sizes), so that every
# service a test starts compiles 3 session lengths rather than the default model's 5.
MODEL = ('--config.data.history_queries=4', '--config.model.user_memory=attention',
         '--config.model.max_session_queries=4')
TRAIN = ('--config.train.max_steps=2',)
SERVE = ('--config.serve.max_batch=4', '--config.serve.max_wait_ms=20')
MAX_QUERIES = 4  # the model's max_session_queries (MODEL)


def _quiet(*args, **kwargs):
  del args, kwargs


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
  path = tmp_path_factory.mktemp('serve') / 'run'
  cli.run(path, *MODEL, *TRAIN)
  return str(path)


def _config(*overrides):
  # Every shape compiled before build returns (the background warm-up has a test of its own).
  return cli.config(*MODEL, *TRAIN, *SERVE, '--config.serve.warm_up_background=False',
                    *overrides)


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


@pytest.mark.slow
def test_suggestions_equal_decodes(workdir, service, client, tmp_path, monkeypatch):
  """The service shows what --mode=decode writes for the same sessions: the user-facing
  protocol by default, the paper's with config.decode.exclude_session_queries=False."""
  # A service built from config.decode.exclude_session_queries=False as --mode=serve builds
  # it (the module's pipeline handed to it rather than loaded again: the same checkpoint).
  monkeypatch.setattr(pipeline_lib.Pipeline, 'load', lambda *a, **k: service.engine.pipeline)
  paper = service_lib.build(_config('--config.decode.exclude_session_queries=False',
                                    '--config.serve.history_db='), workdir, log=_quiet)
  assert paper.engine.info()['user_facing'] is False
  sessions = sessions_of_every_length(service)
  with TestClient(app_lib.create_app(paper), client=LOOPBACK) as paper_client:
    assert paper_client.get('/v1/info').json()['user_facing'] is False
    served_paper = suggest_all(paper_client, [{'session': s} for s in sessions])
    # This tiny model's beams hold none of these sessions' queries (its hypotheses are 11
    # words long): where an ordered list does, the paper's protocol shows it.
    real_ordered = paper.engine.pipeline.ordered
    monkeypatch.setattr(paper.engine.pipeline, 'ordered', lambda contexts, **kwargs: [
        [[{'query': c.queries[-1], 'score': 0.0}, *ranked] for ranked in lists]
        for c, lists in zip(contexts, real_ordered(contexts, **kwargs))])
    repeated = paper_client.post('/v1/suggest', json={'session': sessions[1]}).json()
    assert repeated['suggestions'][0]['query'] == sessions[1][-1]
  monkeypatch.undo()  # the pipeline is the module's: decode below loads its own
  assert all(r.status_code == 200 for r in served_paper), [r.text for r in served_paper]
  decode_input = tmp_path / 'sessions.txt'
  decode_input.write_text(''.join('\t'.join(s) + '\n' for s in sessions))
  served = suggest_all(client, [{'session': s} for s in sessions])
  assert all(r.status_code == 200 for r in served), [r.text for r in served]
  for exclude in (True, False):
    output = tmp_path / f'decoded-{exclude}.jsonl'
    settings = (f'--config.decode.input={decode_input}', f'--config.decode.output={output}',
                f'--config.decode.exclude_session_queries={exclude}')
    if exclude:  # the command line itself
      cli.run(workdir, *MODEL, *TRAIN, *settings, mode='decode')
    else:  # what it runs, in this process
      suggest.decode_file(_config(*settings), workdir)
    decoded = [json.loads(line)['suggestions'] for line in output.read_text().splitlines()]
    assert len(decoded) == len(sessions)
    answers = [r.json()['suggestions'] for r in (served if exclude else served_paper)]
    for session, want, got in zip(sessions, decoded, answers):
      assert [s['query'] for s in got] == [s['query'] for s in want], session
      assert [s['score'] for s in got] == pytest.approx([s['score'] for s in want], abs=1e-4)
      assert len(got) == 5
      if exclude:
        assert not set(s['query'] for s in got) & set(session)


@pytest.mark.slow
def test_a_users_suggestions_equal_decode_of_their_log(workdir, service, client, tmp_path):
  """A user who types three sessions, a query at a time: after each query the service shows
  what --mode=decode writes for an AOL-format log of those sessions, where the user's earlier
  sessions are the history the model reads (the service keeps it in SQLite)."""
  words = list(service.engine.pipeline.trained.vocab.words[5:40])
  typed = [[words[0], f'{words[1]} {words[2]}', words[3]], [words[4], words[5]],
           [f'{words[6]} {words[0]}', words[7], f'{words[8]} {words[1]}']]
  user = 'types-a-log'  # no other test's user
  served, histories = [], []
  for queries in typed:
    for t in range(len(queries)):
      answer = client.post('/v1/suggest', json={'session': queries[:t + 1], 'user': user})
      assert answer.status_code == 200, answer.text
      served.append(answer.json()['suggestions'])
      histories.append(answer.json()['history'])
  # Earlier queries read: none in the first session, then the queries of those before, at
  # most the 4 the model reads (config.data.history_queries).
  assert histories == [0, 0, 0, 3, 3, 4, 4, 4]
  log = tmp_path / 'log.tsv'
  cli.write_log(log, [(7, typed)])
  output = tmp_path / 'decoded.jsonl'
  suggest.decode_file(_config(f'--config.decode.input={log}', f'--config.decode.output={output}',
                              '--config.decode.exclude_session_queries=True'), workdir)
  decoded = [json.loads(line) for line in output.read_text().splitlines()]
  assert [r['context'] for r in decoded] == [q[:t + 1] for q in typed for t in range(len(q))]
  for record, got in zip(decoded, served):
    want = record['suggestions']
    assert [s['query'] for s in got] == [s['query'] for s in want], record['context']
    assert [s['score'] for s in got] == pytest.approx([s['score'] for s in want], abs=1e-4)
  # The history changed what the model suggests: the same session without the user differs.
  alone = client.post('/v1/suggest', json={'session': typed[2]}).json()['suggestions']
  assert alone != served[-1]


def test_batches_and_sessions_are_padded_to_powers_of_two_then_the_most():
  assert engine_lib.padded_sizes(1) == (1,)
  assert engine_lib.padded_sizes(6) == (1, 2, 4, 6)
  assert engine_lib.padded_sizes(16) == (1, 2, 4, 8, 16)


def batch_metrics(client) -> tuple[float, float]:
  """(batches run, requests they held) as /metrics counts them so far."""
  metrics = client.get('/metrics').text
  return tuple(float(re.search(rf'^mtn_serve_batch_size_{name} (\S+)$', metrics, re.M).group(1))
               for name in ('count', 'sum'))


@pytest.mark.slow
def test_every_length_and_batch_size_compiles_nothing_new(service, client, monkeypatch):
  """Warm-up compiled every shape: sessions of every allowed length, alone and in batches of
  every size, with and without a user, compile no program."""
  engine = service.engine
  sessions = sessions_of_every_length(service)
  before = engine_lib.compilations()
  assert before > 0
  # Every (batch size, session length) pair run once, by the engine itself: the batch's
  # longest session that length, the others shorter; users with histories of every length
  # and without, k from 1 to MAX_K.
  shapes = []
  real_ordered = engine.pipeline.ordered

  def ordered(contexts, **kwargs):
    longest = max(len(c.queries) for c in contexts)
    shapes.append((kwargs['batch_rows'], next(w for w in engine.widths if w >= longest)))
    return real_ordered(contexts, **kwargs)

  monkeypatch.setattr(engine.pipeline, 'ordered', ordered)
  for size in engine.sizes:
    for width in engine.widths:
      batch = [dataclasses.replace(
          engine.check(sessions[width - 1 if i == 0 else i % width], 1 + (7 * i) % engine_lib.MAX_K,
                       f'u{i}' if i % 2 else None),
          history=tuple(sessions[-1][:i % (MAX_QUERIES + 1)]) if i % 2 else ())
               for i in range(size)]
      assert len(engine.run(batch)) == size
  assert shapes == [(size, width) for size in engine.sizes for width in engine.widths]
  monkeypatch.undo()
  assert engine_lib.compilations() == before
  # Then through the service, 1, 3 and 8 requests at a time.
  batches_before, served_before = batch_metrics(client)
  for threads in (1, 3, 8):
    bodies = [{'session': s, 'k': 1 + i % engine_lib.MAX_K,
               **({'user': f'u{i % 3}'} if i % 2 else {})} for i, s in enumerate(sessions)]
    answers = suggest_all(client, bodies, threads)
    assert [r.status_code for r in answers] == [200] * len(bodies), [r.text for r in answers]
  assert engine_lib.compilations() == before
  assert f'mtn_serve_compilations {float(before)}' in client.get('/metrics').text
  # This test's requests, every one in a batch; concurrent ones were coalesced (some batch
  # held more than one).
  batches, served = (after - earlier for after, earlier in
                     zip(batch_metrics(client), (batches_before, served_before)))
  assert served == 3 * MAX_QUERIES and batches < served, (batches, served)


def test_warm_up_on_threads_runs_every_shape_once_the_smallest_alone_first(monkeypatch):
  """The shapes' runs overlap on the threads, after the smallest pair alone (the programs
  every pair shares compile once); each pair runs once."""
  engine = engine_lib.Engine.__new__(engine_lib.Engine)
  engine.sizes, engine.widths = (1, 2, 4), (1, 2, 4, 8)
  engine.warmed = threading.Event()
  runs, lock = [], threading.Lock()
  running, most = [0], [0]

  def warm(size, width):
    with lock:
      running[0] += 1
      most[0] = max(most[0], running[0])
      runs.append((size, width, running[0]))
    time.sleep(0.05)
    with lock:
      running[0] -= 1

  monkeypatch.setattr(engine, '_warm', warm)
  engine.warm_up(threads=3)
  assert runs[0] == (1, 1, 1)
  # Then the largest pairs first, one a thread: the longest compilations do not start last.
  assert {(size, width) for size, width, _ in runs[1:4]} == {(4, 8), (2, 8), (4, 4)}
  assert sorted((size, width) for size, width, _ in runs) == sorted(engine.shapes())
  assert len(runs) == len(engine.sizes) * len(engine.widths)
  assert most[0] == 3 and engine.warm_threads == 3 and engine.warmed.is_set()
  runs.clear()
  most[0] = 0
  engine.warm_up(threads=1)
  assert [(size, width) for size, width, _ in runs] == engine.shapes() and most[0] == 1


def test_more_requests_than_the_largest_batch_run_in_batches_of_it_each_in_its_place(
    monkeypatch):
  """`run` given more requests than max_batch runs them max_batch at a time, each batch
  padded to its own shape, and answers every request in its place: none dropped."""
  engine = engine_lib.Engine.__new__(engine_lib.Engine)
  engine.sizes, engine.widths = (1, 2), (1, 2, 4)
  batches = []

  def run(requests, size, width):
    batches.append((len(requests), size, width))
    return [[{'query': r.session[-1], 'score': 0.0}] for r in requests]

  monkeypatch.setattr(engine, '_run', run)
  requests = [engine_lib.Request(tuple(f'r{i} q{t}' for t in range(1 + i % 3)), 1)
              for i in range(5)]
  assert [shown[0]['query'] for shown in engine.run(requests)] == [
      r.session[-1] for r in requests]
  assert batches == [(2, 2, 2), (2, 2, 4), (1, 1, 2)]


def test_a_background_warm_up_pads_to_the_pairs_compiled_so_far_and_stops_when_asked(
    monkeypatch):
  """While the other pairs compile, a batch runs padded to the smallest pair compiled so far
  that holds it (a lone session of the longest length included); each pair joins those once
  compiled; stop_warming lets the pair being compiled finish and compiles no other."""
  engine = engine_lib.Engine.__new__(engine_lib.Engine)
  engine.sizes, engine.widths = (1, 2), (1, 2, 4)
  engine.warmed = threading.Event()
  engine._stop_warming = threading.Event()  # pylint: disable=protected-access
  started, compiled, proceed = [], [], threading.Semaphore(0)

  def warm(size, width):
    started.append((size, width))
    if threading.current_thread().name == 'warm-up':
      assert proceed.acquire(timeout=30)
    compiled.append((size, width))

  monkeypatch.setattr(engine, '_warm', warm)
  engine.warm_up(background=True, log=_quiet)
  assert compiled == [(1, 4), (2, 4)] and not engine.warmed.is_set()
  assert engine.padded_shape(1, 4) == (1, 4) and engine.padded_shape(2, 4) == (2, 4)
  assert engine.padded_shape(1, 1) == (1, 4) and engine.padded_shape(2, 1) == (2, 4)
  proceed.release()  # (1, 1) compiles: a lone short session runs at its own shape
  _wait(lambda: engine.padded_shape(1, 1) == (1, 1), timeout=10)
  assert engine.padded_shape(1, 2) == (1, 4) and engine.padded_shape(2, 1) == (2, 4)
  _wait(lambda: started[-1] == (1, 2), timeout=10)
  engine.stop_warming()  # while (1, 2) compiles: it finishes, and no other pair follows
  proceed.release()
  engine.stop_warming(timeout=10)
  assert not engine._warm_thread.is_alive()  # pylint: disable=protected-access
  assert compiled == [(1, 4), (2, 4), (1, 1), (1, 2)] and not engine.warmed.is_set()


def test_the_engine_warms_up_on_the_threads_and_in_the_way_it_is_asked(monkeypatch):
  """Engine.load warms up in the background when asked (config.serve.warm_up_background, read
  by `build`), on config.serve.warm_up_threads threads, 0 read as one a core this process may
  use."""
  warmed = []
  monkeypatch.setattr(pipeline_lib.Pipeline, 'load', lambda *args, **kwargs: None)
  monkeypatch.setattr(engine_lib.Engine, '__init__', lambda self, *args: None)
  monkeypatch.setattr(engine_lib.Engine, 'warm_up',
                      lambda self, threads, background, log: warmed.append((threads, background)))
  for threads, background in ((0, True), (3, False)):
    engine_lib.Engine.load(_config(f'--config.serve.warm_up_threads={threads}'), 'run',
                           log=_quiet, background=background)
  assert warmed == [(len(os.sched_getaffinity(0)), True), (3, False)]


@pytest.mark.slow
def test_readiness_says_while_the_other_batch_shapes_compile(service, client, monkeypatch):
  """Ready once a request of any size runs; `warming` until every shape is compiled."""
  monkeypatch.setattr(service.engine, 'warmed', threading.Event())
  assert client.get('/readyz').json() == {'ready': True, 'step': service.engine.step,
                                          'warming': True}


def test_a_background_warm_up_pads_to_compiled_shapes_and_changes_no_suggestion(service,
                                                                                  monkeypatch):
  """With warm_up_background the engine is ready once a lone request and the largest batch
  are compiled at the longest session; until the others are, batches run padded to those,
  with the same suggestions; then each runs at its own shape."""
  pipeline = service.engine.pipeline
  engine = engine_lib.Engine(pipeline, 4, True)
  gate, ran = threading.Event(), []
  real_warm, real_ordered = engine._warm, pipeline.ordered  # pylint: disable=protected-access

  def gated_warm(size, width):
    if threading.current_thread().name == 'warm-up':
      assert gate.wait(120)
    real_warm(size, width)

  def ordered(contexts, **kwargs):
    ran.append((kwargs['batch_rows'], kwargs['widths']))
    return real_ordered(contexts, **kwargs)

  monkeypatch.setattr(engine, '_warm', gated_warm)
  monkeypatch.setattr(pipeline, 'ordered', ordered)
  lines = []
  engine.warm_up(background=True, log=lines.append)
  assert ran == [(1, (MAX_QUERIES,)), (4, (MAX_QUERIES,))] and not engine.warmed.is_set()
  sessions = sessions_of_every_length(service)
  lone = engine.check(sessions[0], 5, None)
  pair = [engine.check(s, 5, None) for s in sessions[:2]]
  ran.clear()
  early = engine.run([lone]), engine.run(pair)
  assert ran == [(1, (MAX_QUERIES,)), (4, (MAX_QUERIES,))]
  gate.set()
  assert engine.warmed.wait(300), lines
  assert any(line.startswith(f'All {len(engine.shapes())} batch shapes compiled')
             for line in lines), lines
  ran.clear()
  late = engine.run([lone]), engine.run(pair)
  assert ran == [(1, (1,)), (2, (2,))]
  for early_lists, late_lists in zip(early, late):
    for before, after in zip(early_lists, late_lists):
      assert [s['query'] for s in after] == [s['query'] for s in before]
      assert [s['score'] for s in after] == pytest.approx([s['score'] for s in before],
                                                          abs=1e-4)


@pytest.mark.slow
def test_programs_prepared_when_training_ends_are_all_read_back_at_the_first_start(
    workdir, tmp_path):
  """config.serve.prepare_after_train: --mode=train of a trained workdir (trained to its
  max_steps: nothing more to train) compiles the service's programs into the workdir's
  compilation cache, and the service's first start compiles none of them again, in a
  workdir moved since (as a packed one is served elsewhere)."""
  copy = tmp_path / 'run'
  shutil.copytree(workdir, copy, ignore=shutil.ignore_patterns('serve'))
  own_cache = {k: v for k, v in cli.env().items() if k != 'JAX_COMPILATION_CACHE_DIR'}
  # Batches of one: the 3 session lengths' programs are compiled in the workdir's own, empty
  # cache rather than those of 3 batch sizes (7 programs, not 17: about 6 s less); the
  # preparing process and the service still warm up the same pairs.
  serve = (*SERVE, '--config.serve.max_batch=1')
  trained = subprocess.run(
      cli.command(copy, *MODEL, *TRAIN, *serve,
                  '--config.serve.prepare_after_train=True', mode='train'),
      cwd=cli.REPO, env=own_cache, capture_output=True, text=True, timeout=600, check=False)
  assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
  assert 'The service\'s programs prepared in' in trained.stdout, trained.stdout[-3000:]
  assert os.listdir(copy / 'serve' / 'compile_cache')
  moved = copy.rename(tmp_path / 'moved')
  server = Server(str(moved), *serve, env=own_cache)
  try:
    warmed = next(line for line in server.lines if 'compiled in' in line)
    compiled, read_back = map(int, re.search(
        r'\((\d+) programs, (\d+) read from the compilation cache\)', warmed).groups())
    assert 0 < compiled == read_back, warmed
    assert server.post({'session': ['a', 'b']}).status_code == 200
  finally:
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(60) == 0


@pytest.mark.slow
def test_response_health_readiness_and_metrics(service, client):
  response = client.post('/v1/suggest', json={'session': ['Cheap  FLIGHTS'], 'k': 2})
  assert response.status_code == 200, response.text
  body = response.json()
  assert len(body['suggestions']) == 2 and body['ms'] > 0
  assert set(body['suggestions'][0]) == {'query', 'score'}
  assert body['model'] == {'name': 'mtn', 'step': service.engine.step}  # no path
  assert 'history' not in body
  assert re.fullmatch(r'[0-9a-f]{16}', response.headers['x-request-id'])
  assert client.get('/healthz').json() == {'status': 'ok'}
  assert client.get('/readyz').json() == {'ready': True, 'step': service.engine.step,
                                          'warming': False}
  info = client.get('/v1/info').json()
  assert info['max_session_queries'] == MAX_QUERIES and info['personalises']
  assert client.post('/v1/suggest', json={'session': []}).status_code == 422
  metrics = client.get('/metrics').text
  # The answers' latency apart from the refusals' (an overloaded service's quick 503s).
  for name in ('mtn_serve_requests_total{route="/v1/suggest",status="200"}',
               'mtn_serve_suggest_seconds_count{status="200"}',
               'mtn_serve_suggest_seconds_count{status="422"}', 'mtn_serve_batch_size_bucket',
               'mtn_serve_queue_depth', f'mtn_serve_model_step {float(service.engine.step)}'):
    assert name in metrics, name
  assert client.get('/docs').status_code == 200
  schema = client.get('/openapi.json').json()
  assert {'/v1/suggest', '/healthz', '/readyz'} <= set(schema['paths'])
  page = client.get('/')
  script = client.get('/page.js').text
  assert page.status_code == 200 and 'textContent' in script and 'innerHTML' not in script


# ---------------------------------------------------------------------------------------------
# Faults


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_user_where_the_model_reads_none_is_refused(client, monkeypatch):
  monkeypatch.setattr(engine_lib.Engine, 'personalises', property(lambda self: False))
  response = client.post('/v1/suggest', json={'session': ['a'], 'user': 'ann'})
  assert response.status_code == 422 and response.json()['field'] == 'user', response.text


@pytest.mark.slow
def test_a_body_over_the_limit_is_refused_unread(client, service):
  limit = service.settings.max_body_bytes
  big = json.dumps({'session': ['x' * (limit + 10)]}).encode()
  response = client.post('/v1/suggest', content=big, headers={'content-type': 'application/json'})
  assert response.status_code == 413 and response.json()['field'] == 'body'
  # Without a Content-Length (chunked), reading stops at the limit.
  response = client.post('/v1/suggest', content=(big[i:i + 1000] for i in range(0, len(big), 1000)),
                         headers={'content-type': 'application/json'})
  assert response.status_code == 413, response.text


@pytest.mark.slow
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

  step, workdir, personalises, past_read, sizes = 7, '/nowhere', False, 0, (1, 2)

  def __init__(self, seconds: float = 0.0, suggestions=None):
    self.seconds, self.suggestions = seconds, suggestions
    self.warmed = threading.Event()
    self.warmed.set()  # nothing to compile

  def info(self):
    return {'name': 'stub', 'step': self.step, 'workdir': self.workdir, 'score': 'none',
            'how': 'stub', 'top_k': 5, 'max_session_queries': 4, 'max_query_words': 10,
            'personalises': False, 'user_facing': True}

  refuse = None  # a message: every request is refused with it (422)

  def check(self, session, k, user):
    if self.refuse:
      raise engine_lib.BadInput('session', self.refuse)
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
  client, _ = stub_client(SlowEngine(1.0), max_batch=1, workers=1, queue_bound=2,
                          max_wait_ms=0, deadline_ms=1500)
  with client:
    answers = suggest_all(client, [{'session': [f'q{i}']} for i in range(8)])
  codes = sorted(r.status_code for r in answers)
  # One runs at a time (a second each), two wait: the rest are refused at once; the waiting
  # are not answered within a second and a half.
  assert codes.count(503) >= 4 and 200 in codes and 504 in codes, codes
  refused = next(r for r in answers if r.status_code == 503)
  assert refused.headers['retry-after'] == '1' and 'queue_bound' in refused.json()['error']
  late = next(r for r in answers if r.status_code == 504)
  assert 'deadline_ms' in late.json()['error']


def run_batcher(batcher: batcher_lib.Batcher, requests, spacing: float = 0.02) -> list:
  """Each request's result (or exception) from `batcher`, the requests submitted `spacing`
  seconds apart."""

  async def main():
    batcher.start()
    try:
      async def one(i, request):
        await asyncio.sleep(i * spacing)
        return await batcher.submit(request, time.monotonic() + 10)
      return await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)),
                                  return_exceptions=True)
    finally:
      await batcher.stop()

  return asyncio.run(main())


def test_batches_run_at_once_on_the_workers():
  # Each batch waits for another to run beside it: with one worker the barrier breaks.
  for workers, expected in ((2, ['a!', 'b!']), (1, [threading.BrokenBarrierError] * 2)):
    barrier = threading.Barrier(2, timeout=1.0)

    def run(requests, barrier=barrier):
      barrier.wait()
      return [r + '!' for r in requests]

    results = run_batcher(batcher_lib.Batcher(run, max_batch=1, max_wait=0, queue_bound=8,
                                              workers=workers), ['a', 'b'])
    assert [r if isinstance(r, str) else type(r) for r in results] == expected, workers


def run_with_deadlines(run, scenario, **settings):
  """`scenario(ask)` on a started Batcher of `run` (one worker), where `await ask(request,
  seconds)` is the request's answer, or DeadlineExceeded (the class) once `seconds` pass."""
  async def main():
    batcher = batcher_lib.Batcher(run, max_wait=0, workers=1, **settings)
    batcher.start()

    async def ask(request, seconds):
      try:
        return await batcher.submit(request, time.monotonic() + seconds)
      except batcher_lib.DeadlineExceeded as e:
        return type(e)
    try:
      return await scenario(batcher, ask)
    finally:
      await batcher.stop()
  return asyncio.run(main())


def slow_echo(seconds: float):
  def run(requests):
    time.sleep(seconds)
    return [r + '!' for r in requests]
  return run


def test_a_request_given_up_on_frees_its_place_in_the_queue():
  """Requests that got their 504 while a batch ran hold no place: a request after them is
  queued, not refused as if the queue were full."""
  async def scenario(batcher, ask):
    running = asyncio.create_task(ask('a', 5))
    await asyncio.sleep(0.1)  # 'a' runs; 'b' and 'c' fill the queue and time out
    given_up = await asyncio.gather(ask('b', 0.1), ask('c', 0.1))
    assert batcher.depth == 0
    return given_up, await ask('d', 5), await running

  given_up, late, first = run_with_deadlines(slow_echo(0.6), scenario, max_batch=1,
                                             queue_bound=2)
  assert given_up == [batcher_lib.DeadlineExceeded] * 2 and (late, first) == ('d!', 'a!')


def test_the_batcher_goes_on_after_every_waiting_request_gave_up():
  """The queue empties while the only worker is busy (its requests' deadlines pass): the
  batcher still answers the next request, sent once the worker is free."""
  async def scenario(batcher, ask):
    del batcher
    first = asyncio.create_task(ask('a', 5))
    await asyncio.sleep(0.1)
    gave_up = await ask('b', 0.1)  # waits for the busy worker, and gives up
    assert await first == 'a!'
    return gave_up, await ask('c', 5)

  assert run_with_deadlines(slow_echo(0.4), scenario, max_batch=4, queue_bound=8) == (
      batcher_lib.DeadlineExceeded, 'c!')


def test_prepare_sees_the_batches_in_the_order_they_came():
  # The first batch's preparation is slow and its run slower: the second batch is prepared
  # after it all the same, and finishes first; each request gets its own answer.
  prepared, finished = [], []

  def prepare(requests):
    if requests == ['a']:
      time.sleep(0.3)
    if requests == ['c']:
      raise ValueError('c cannot be prepared')
    prepared.append(list(requests))
    return [r.upper() for r in requests]

  def run(requests):
    time.sleep(0.5 if requests == ['A'] else 0.0)
    finished.append(list(requests))
    return [r + '!' for r in requests]

  batcher = batcher_lib.Batcher(run, prepare=prepare, max_batch=1, max_wait=0, queue_bound=8,
                                workers=2)
  results = run_batcher(batcher, ['a', 'b', 'c', 'd'])
  assert results[:2] + results[3:] == ['A!', 'B!', 'D!']
  assert isinstance(results[2], ValueError)
  assert prepared == [['a'], ['b'], ['d']]
  assert finished[0] == ['B'] and finished[-1] == ['A'], finished


def test_a_batch_that_prepare_would_not_change_does_not_wait_for_it():
  """A user's batch whose preparation is slow (its history database locked) holds up no
  batch without a user: that one runs at once on the other worker and is answered first."""
  answered = []

  def prepare(requests):
    time.sleep(0.6)
    return [r.upper() for r in requests]

  def run(requests):
    answered.extend(requests)
    return [r + '!' for r in requests]

  batcher = batcher_lib.Batcher(run, prepare=prepare, prepares=lambda r: r.startswith('user'),
                                max_batch=1, max_wait=0, queue_bound=8, workers=2)
  assert run_batcher(batcher, ['user a', 'b']) == ['USER A!', 'b!']
  assert answered == ['b', 'USER A']


def test_an_error_that_no_caller_hears_is_handed_on():
  """A request that failed after its caller gave up (its deadline) is answered to nobody:
  its exception goes to `on_unheard` (the service logs it) rather than nowhere."""
  unheard = []

  def run(requests):
    time.sleep(0.3)
    raise ValueError(f'{requests[0]} failed')

  async def main():
    batcher = batcher_lib.Batcher(run, max_batch=1, max_wait=0, queue_bound=8,
                                  on_unheard=unheard.append)
    batcher.start()
    try:
      with pytest.raises(batcher_lib.DeadlineExceeded):
        await batcher.submit('a', time.monotonic() + 0.1)
      with pytest.raises(ValueError, match='b failed'):  # heard: handed to its caller alone
        await batcher.submit('b', time.monotonic() + 5)
    finally:
      await batcher.stop()

  asyncio.run(main())
  assert [str(e) for e in unheard] == ['a failed']


def test_the_queue_holds_queue_bound_requests_and_refuses_the_next_at_once():
  """queue_bound=2 and the one worker busy: two requests wait and are answered in turn, the
  third is refused at once (the 503 a client retries), not queued."""
  async def scenario(batcher, ask):
    running = asyncio.create_task(ask('a', 5))
    await asyncio.sleep(0.1)  # 'a' runs
    waiting = [asyncio.create_task(ask(r, 5)) for r in ('b', 'c')]
    await asyncio.sleep(0.05)
    assert batcher.depth == 2
    with pytest.raises(batcher_lib.QueueFull):
      await batcher.submit('d', time.monotonic() + 5)
    return [await running] + [await w for w in waiting]

  assert run_with_deadlines(slow_echo(0.3), scenario, max_batch=1, queue_bound=2) == [
      'a!', 'b!', 'c!']


def _recording_echo(batches):
  def run(requests):
    batches.append(list(requests))
    return [r + '!' for r in requests]
  return run


def test_a_full_batch_or_a_draining_service_waits_no_max_wait():
  """A batch waits up to max_wait for batch-mates only while it could hold more and the
  service is not draining: a full batch, or any batch after SIGTERM (the queued batches
  start at once), runs without waiting max_wait (5 s here)."""
  for requests, draining in ((['a', 'b'], False), (['a'], True)):
    batches = []
    batcher = batcher_lib.Batcher(_recording_echo(batches), max_batch=2, max_wait=5.0,
                                  queue_bound=8)
    if draining:
      batcher.drain()
    started = time.monotonic()
    assert run_batcher(batcher, requests, spacing=0) == [r + '!' for r in requests]
    assert batches == [requests] and time.monotonic() - started < 2.5, (draining, batches)


def test_max_wait_counts_from_the_oldest_request_of_a_batch():
  """Requests 0.4 s apart with max_wait 0.6 s: the first batch starts 0.6 s after its oldest
  request, and does not wait on while each newcomer restarts the clock (a steady trickle
  would hold the first request until its deadline)."""
  batches = []
  batcher = batcher_lib.Batcher(_recording_echo(batches), max_batch=8, max_wait=0.6,
                                queue_bound=8)
  assert run_batcher(batcher, ['a', 'b', 'c', 'd'], spacing=0.4) == ['a!', 'b!', 'c!', 'd!']
  assert batches[0][0] == 'a' and 'd' not in batches[0], batches


def test_a_lone_request_that_fails_is_run_once():
  """A failing batch is run again one request at a time, so that one bad request fails
  alone; a batch of one is not run a second time for nothing."""
  calls = []

  def run(requests):
    calls.append(list(requests))
    raise ValueError('bad request')

  [result] = run_batcher(batcher_lib.Batcher(run, max_batch=1, max_wait=0, queue_bound=8),
                         ['a'])
  assert isinstance(result, ValueError) and calls == [['a']]
  # A batch of three with one bad request: run again one at a time, the bad one fails alone.
  calls.clear()

  def fails_on_bad(requests):
    calls.append(list(requests))
    if 'bad' in requests:
      raise ValueError('bad request')
    return [r + '!' for r in requests]

  got = batcher_lib._isolated(fails_on_bad, ['a', 'bad', 'c'])  # pylint: disable=protected-access
  assert [r if isinstance(r, str) else type(r) for r in got] == ['a!', ValueError, 'c!']
  assert calls == [['a', 'bad', 'c'], ['a'], ['bad'], ['c']]


def test_a_request_that_cannot_be_prepared_fails_alone_and_its_batch_mates_get_their_own():
  """In a batch of three whose middle request's preparation fails, that request gets its
  error and the other two the answers to their own requests."""
  def prepare(requests):
    if 'b' in requests:
      raise ValueError('b cannot be prepared')
    return [r.upper() for r in requests]

  def run(requests):
    time.sleep(0.3 if requests == ['X'] else 0.0)  # the others queue meanwhile
    return [r + '!' for r in requests]

  batcher = batcher_lib.Batcher(run, prepare=prepare, max_batch=3, max_wait=0, queue_bound=8)
  results = run_batcher(batcher, ['x', 'a', 'b', 'c'])
  assert results[:2] + results[3:] == ['X!', 'A!', 'C!'] and isinstance(results[2], ValueError)


def test_a_request_given_up_in_a_running_batch_leaves_its_batch_mates_their_answers():
  """'a' reaches its deadline while its batch runs: 'b', after it in the batch, is still
  answered when the batch ends."""
  async def scenario(batcher, ask):
    del batcher
    first = asyncio.create_task(ask('x', 5))  # holds the one worker while 'a' and 'b' queue
    await asyncio.sleep(0.1)
    gives_up, waits = asyncio.create_task(ask('a', 0.6)), asyncio.create_task(ask('b', 5))
    return await first, await gives_up, await waits

  assert run_with_deadlines(slow_echo(0.4), scenario, max_batch=2, queue_bound=8) == (
      'x!', batcher_lib.DeadlineExceeded, 'b!')


def test_a_batch_whose_requests_all_gave_up_while_it_waited_frees_its_worker():
  """A lone request's deadline (0.1 s) passes while its batch waits max_wait (0.5 s) for
  batch-mates: the batch starts empty, and the one worker is free for the next request."""
  async def main():
    batcher = batcher_lib.Batcher(slow_echo(0.0), max_batch=4, max_wait=0.5, queue_bound=8)
    batcher.start()
    try:
      with pytest.raises(batcher_lib.DeadlineExceeded):
        await batcher.submit('a', time.monotonic() + 0.1)
      await asyncio.sleep(0.6)  # the empty batch's wait ends
      return await batcher.submit('b', time.monotonic() + 3)
    finally:
      await batcher.stop()

  assert asyncio.run(main()) == 'b!'


def test_stopping_answers_the_running_and_the_queued_requests_at_once():
  """At shutdown a request of the running batch and one still queued get their 504 at
  once, not at their deadlines."""
  async def main():
    batcher = batcher_lib.Batcher(slow_echo(0.3), max_batch=1, max_wait=0, queue_bound=8)
    batcher.start()
    asked = [asyncio.create_task(batcher.submit(r, time.monotonic() + 5)) for r in 'ab']
    await asyncio.sleep(0.1)  # 'a' runs, 'b' waits
    started = time.monotonic()
    await batcher.stop()
    results = await asyncio.gather(*asked, return_exceptions=True)
    return [type(r) for r in results], time.monotonic() - started

  kinds, seconds = asyncio.run(main())
  assert kinds == [batcher_lib.DeadlineExceeded] * 2 and seconds < 3, (kinds, seconds)


def test_reloads_are_counted_by_outcome_and_the_step_is_the_new_models():
  """A failed reload leaves the old model and says so (counted 'failed'); a reload that
  works says which step it replaced, and /metrics' model step follows it."""
  client, service = stub_client(SlowEngine())

  def fails():
    raise OSError('no checkpoint in /srv/private/W/checkpoints')
  newer = SlowEngine()
  newer.step = 9
  service.loader = fails
  logged = []
  service.log = logged.append
  with client:
    # The answer holds no path; the log has the whole reason.
    assert client.post('/admin/reload').json() == {
        'reloaded': False, 'step': 7,
        'error': "the load failed (OSError); the service's log has why"}
    assert any('/srv/private/W/checkpoints' in line for line in logged)
    service.loader = lambda: newer
    answer = client.post('/admin/reload').json()
    assert answer['reloaded'] and (answer['previous_step'], answer['step']) == (7, 9)
    assert client.post('/v1/suggest', json={'session': ['a']}).json()['model']['step'] == 9
    metrics = client.get('/metrics').text
  assert 'mtn_serve_reloads_total{outcome="failed"} 1.0' in metrics
  assert 'mtn_serve_reloads_total{outcome="ok"} 1.0' in metrics
  assert 'mtn_serve_model_step 9.0' in metrics


def test_no_reload_while_draining_and_a_reload_holds_no_exit():
  """A reload after SIGTERM is refused (nothing would serve the new model); one under way
  runs on a daemon thread, which the interpreter does not wait for at exit."""
  client, service = stub_client(SlowEngine())
  loaded, daemon = threading.Event(), []

  def loader():
    loaded.set()
    daemon.append(threading.current_thread().daemon)
    return SlowEngine()
  service.loader = loader
  with client:
    assert client.post('/admin/reload').json()['reloaded'] and daemon == [True]
    service.begin_drain()
    loaded.clear()
    answer = asyncio.run(service.reload())
  assert answer['reloaded'] is False and answer['error'] == 'draining' and not loaded.is_set()


def test_a_load_that_exits_fails_the_reload_and_frees_the_next():
  client, service = stub_client(SlowEngine())

  def exits():
    raise SystemExit(3)
  service.loader = exits
  with client:
    logged = []
    service.log = logged.append
    failed = client.post('/admin/reload').json()
    assert failed['reloaded'] is False and 'RuntimeError' in failed['error']
    assert any('SystemExit(3)' in line for line in logged)
    service.loader = SlowEngine
    assert client.post('/admin/reload').json()['reloaded']


def test_a_reload_stops_the_old_models_background_warm_up():
  """The replaced model compiles no more pairs: its background warm-up is stopped."""
  client, service = stub_client(SlowEngine())
  old, stopped = service.engine, []
  old.stop_warming = lambda timeout=0.0: stopped.append(timeout)
  service.loader = SlowEngine
  with client:
    assert client.post('/admin/reload').json()['reloaded'] and service.engine is not old
  assert stopped == [0.0]


def test_the_pages_run_no_inline_script_and_admin_refuses_other_sites():
  """The page's script is a file of this host (no inline script may run on it), no page may
  be framed by another site, and a page of another origin cannot make the service reload
  (a form's POST from it needs no preflight)."""
  client, service = stub_client(SlowEngine())
  service.loader = SlowEngine
  with client:
    page = client.get('/')
    policy = page.headers['content-security-policy']
    assert "script-src 'self';" in policy and "frame-ancestors 'none'" in policy
    assert '<script src="/page.js">' in page.text and '<script>' not in page.text
    assert client.get('/page.js').headers['content-type'].startswith('text/javascript')
    assert "frame-ancestors 'none'" in client.get('/docs').headers['content-security-policy']
    assert client.get('/docs/assets/swagger-initializer.js').status_code == 404  # not served
    other = client.post('/admin/reload', headers={'Origin': 'http://evil.example',
                                                  'Content-Type': 'text/plain'}, content='x')
    assert other.status_code == 403 and 'another origin' in other.json()['error']
    for malformed in ('http://[::1', 'http://[zz]'):  # no URL: no origin of this service
      refused = client.post('/admin/reload', headers={'Origin': malformed})
      assert refused.status_code == 403 and 'another origin' in refused.json()['error']
    same = client.post('/admin/reload', headers={'Origin': 'http://testserver'})
    assert same.status_code == 200 and same.json()['reloaded']
    # The service's own page on a port: its origin names the port, as the Host header does.
    same = client.post('/admin/reload', headers={'Origin': 'http://testserver:8080',
                                                 'Host': 'testserver:8080'})
    assert same.status_code == 200 and same.json()['reloaded']


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


# ---------------------------------------------------------------------------------------------
# Histories


@pytest.mark.slow
def test_a_users_earlier_sessions_are_their_history(service, client):
  answers = [client.post('/v1/suggest', json={'session': s, 'user': 'ann'}).json()
             for s in (['a'], ['a', 'b'], ['c'], ['c', 'd'])]
  # The second request continues the first session; the third starts another.
  assert [a['history'] for a in answers] == [0, 0, 2, 2]
  assert service.store.earlier('ann') == ('a', 'b') and service.store.current('ann') == ('c', 'd')
  # The model reads them: the same session without the user's history scores otherwise.
  alone = client.post('/v1/suggest', json={'session': ['c', 'd']}).json()
  assert [s['score'] for s in alone['suggestions']] != [
      s['score'] for s in answers[-1]['suggestions']]


def test_history_store_is_bounded_per_user_and_in_wal_mode(tmp_path):
  path = str(tmp_path / 'h' / 'histories.sqlite')
  store = history_lib.HistoryStore(path, per_user=3, window=16)
  for session in (['a', 'b'], ['c'], ['d', 'e'], ['f']):
    store.observe('ann', session)
  store.observe('bob', ['x'])
  assert store.earlier('ann') == ('c', 'd', 'e') and store.earlier('bob') == ()
  assert store.observe('ann', ['f', 'g']) == ('c', 'd', 'e')  # the same session goes on
  store.close()
  again = history_lib.HistoryStore(path, per_user=3, window=16)
  assert again.current('ann') == ('f', 'g') and again.earlier('ann') == ('c', 'd', 'e')
  db = sqlite3.connect(path)
  assert db.execute('PRAGMA journal_mode').fetchone()[0] == 'wal'
  assert db.execute('SELECT COUNT(*) FROM queries WHERE user = ?', ('ann',)).fetchone()[0] == 3


def test_a_session_past_the_window_slides_on_without_joining_the_history(tmp_path):
  """Past the model's window (max_session_queries) a client sends the latest `window`
  queries: the session goes on, and none of its queries becomes an earlier one."""
  store = history_lib.HistoryStore(str(tmp_path / 'histories.sqlite'), per_user=100, window=3)
  store.observe('ann', ['old'])
  session = ['a', 'b', 'c', 'd', 'e', 'f']
  for end in range(1, len(session) + 1):
    assert store.observe('ann', session[max(0, end - 3):end]) == ('old',)
  assert store.observe('ann', ['d', 'e', 'f']) == ('old',)  # the same request again
  assert store.current('ann') == tuple(session)
  assert store.observe('ann', ['e', 'f', 'g']) == ('old',)
  assert store.current('ann') == (*session, 'g')
  # Another session (it does not begin with the stored one's last queries): the whole
  # stored session joins the history.
  assert store.observe('ann', ['x', 'y', 'z']) == ('old', *session, 'g')
  # The window fills as a request goes unseen (refused before it was recorded): the session
  # goes on all the same.
  store.observe('bob', ['p', 'q'])
  assert store.observe('bob', ['q', 'r', 's']) == () and store.current('bob') == ('p', 'q', 'r',
                                                                                  's')
  # Half a window is the least overlap that continues one: with a window of 16, a session
  # that begins with the last query of the one before is a new one.
  wide = history_lib.HistoryStore(str(tmp_path / 'wide.sqlite'), per_user=100, window=16)
  first = [f'q{i}' for i in range(16)]
  wide.observe('cy', first)
  assert wide.observe('cy', ['q15'] + [f'n{i}' for i in range(15)]) == tuple(first)


def test_a_sliding_session_keeps_no_more_queries_than_the_history_can_use(tmp_path):
  """Past the window a session goes on for as long as its user types: the stored session
  keeps its last max(per_user, window) queries (3 here), not every query ever sent, and
  those are what join the history when the next session begins."""
  store = history_lib.HistoryStore(str(tmp_path / 'histories.sqlite'), per_user=2, window=3)
  session = [f'q{i}' for i in range(10)]
  for end in range(1, len(session) + 1):
    assert store.observe('ann', session[max(0, end - 3):end]) == ()
  assert store.current('ann') == ('q7', 'q8', 'q9')
  assert store.observe('ann', ['new']) == ('q8', 'q9')


# ---------------------------------------------------------------------------------------------
# Reloading


@pytest.mark.slow
def test_reload_swaps_in_a_new_best_checkpoint_without_failing_a_request(workdir, service,
                                                                         client):
  before = service.engine.step
  cli.run(workdir, *MODEL, '--config.train.max_steps=4')  # two more steps: a better one
  sessions = sessions_of_every_length(service)
  answers, done = [], threading.Event()

  def keep_asking():
    while not done.is_set():
      answers.extend(suggest_all(client, [{'session': s} for s in sessions], 3))

  asker = threading.Thread(target=keep_asking)
  asker.start()
  try:
    reloaded = client.post('/admin/reload')
  finally:
    done.set()
    asker.join()
  assert reloaded.status_code == 200 and reloaded.json()['reloaded'], reloaded.text
  assert reloaded.json()['previous_step'] == before and reloaded.json()['step'] == 4
  assert answers and all(a.status_code == 200 for a in answers)
  assert {a.json()['model']['step'] for a in answers} <= {before, 4}
  after = client.post('/v1/suggest', json={'session': ['a']}).json()
  assert after['model']['step'] == 4 == service.engine.step
  assert 'mtn_serve_model_step 4.0' in client.get('/metrics').text


# ---------------------------------------------------------------------------------------------
# A process of its own: kill -9, restart, SIGHUP, SIGTERM


class Server:
  """`--mode=serve` in a subprocess on a free port; its output collected by a thread."""

  def __init__(self, workdir, *overrides, env=None):
    self.process = subprocess.Popen(
        cli.command(workdir, *MODEL, *TRAIN, '--config.serve.port=0', *overrides,
                    mode='serve'),
        cwd=cli.REPO, env=env or cli.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    self.lines: list[str] = []
    self._url = threading.Event()
    self.url = None
    threading.Thread(target=self._read, daemon=True).start()
    if not self._url.wait(300):
      self.process.kill()
      raise AssertionError('the server did not start:\n' + ''.join(self.lines))

  def _read(self):
    for line in self.process.stdout:
      self.lines.append(line)
      found = re.match(r'Serving on (http://\S+) ', line)
      if found:
        self.url = found.group(1)
        self._url.set()
    self._url.set()

  def wait_for(self, text: str, timeout: float = 60) -> None:
    end = time.time() + timeout
    while not any(text in line for line in self.lines):
      assert time.time() < end, f'no {text!r} in:\n' + ''.join(self.lines)
      time.sleep(0.05)

  def post(self, body, **kwargs):
    return httpx.post(f'{self.url}/v1/suggest', json=body, timeout=30, **kwargs)


@pytest.mark.slow
def test_a_session_that_does_not_continue_the_stored_one_starts_anew(tmp_path):
  """The stored session goes to the history when a request does not continue it: one that
  shares only its first query, a shorter one, or one whose overlap with the stored session's
  last queries is under half a window; the same window of repeated queries sent again adds
  nothing."""
  store = history_lib.HistoryStore(str(tmp_path / 'h.sqlite'), per_user=100, window=16)
  store.observe('ann', ['a', 'b'])
  assert store.observe('ann', ['a', 'c']) == ('a', 'b') and store.current('ann') == ('a', 'c')
  store.observe('bob', ['a', 'b'])
  assert store.observe('bob', ['a']) == ('a', 'b') and store.current('bob') == ('a',)
  first = [f'q{i}' for i in range(16)]
  store.observe('cy', first)
  assert store.observe('cy', first[-7:] + [f'n{i}' for i in range(9)]) == tuple(first)
  # A request shorter than the window is its session's whole beginning, never a slid window:
  # one that begins with the stored session's last query is a new session.
  short = history_lib.HistoryStore(str(tmp_path / 's.sqlite'), per_user=100, window=3)
  short.observe('ann', ['a', 'b'])
  assert short.observe('ann', ['b']) == ('a', 'b') and short.current('ann') == ('b',)
  repeats = history_lib.HistoryStore(str(tmp_path / 'r.sqlite'), per_user=100, window=4)
  repeats.observe('ann', ['a', 'b', 'a', 'b'])
  repeats.observe('ann', ['a', 'b', 'a', 'b'])
  assert repeats.current('ann') == ('a', 'b', 'a', 'b')


def test_bounding_one_users_history_leaves_the_others_and_a_failure_leaves_the_store(tmp_path):
  store = history_lib.HistoryStore(str(tmp_path / 'h.sqlite'), per_user=2, window=16)
  for user, sessions in (('bob', (['x', 'y'], ['z'])), ('ann', (['a'], ['b'], ['c'], ['d']))):
    for session in sessions:
      store.observe(user, session)
  store.observe('bob', ['w'])  # bob's [z] joins: x y z -> y z
  assert store.earlier('bob') == ('y', 'z') and store.earlier('ann') == ('b', 'c')
  store.observe('ann', ['e'])
  assert store.earlier('bob') == ('y', 'z') and store.earlier('ann') == ('c', 'd')
  # A request that fails inside its transaction is rolled back: the next ones are stored.
  with pytest.raises(sqlite3.Error):
    store.observe(['no', 'user', 'id'], ['a'])
  assert store.observe('dan', ['a']) == () and store.current('dan') == ('a',)


def test_histories_survive_kill_9_and_sighup_reloads_and_sigterm_drains(workdir):
  # Batches of 2 and a beam of 20: slow enough that a burst of requests waits in the queue
  # when SIGTERM comes (the drain below needs waiting requests to answer).
  serve = ('--config.serve.max_batch=2', '--config.decode.beam_size=20',
           '--config.serve.queue_bound=500',
           '--config.serve.deadline_ms=60000', '--config.serve.drain_seconds=30',
           # Long enough that the service is still there for the request after /readyz's 503
           # on a busy machine (with the default 0.5 s, a stall of the test ends the drain).
           '--config.serve.drain_quiet_seconds=5')
  # Without the tests' shared compilation cache: the service keeps its own in the workdir,
  # which the restarted one reads back.
  own_cache = {k: v for k, v in cli.env().items() if k != 'JAX_COMPILATION_CACHE_DIR'}
  first = Server(workdir, *serve, env=own_cache)
  try:
    answers = [first.post({'session': s, 'user': 'kim'}).json()['history']
               for s in (['a'], ['a', 'b'], ['c'], ['c', 'd'])]
    assert answers == [0, 0, 2, 2]
  finally:
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(30)
  path = os.path.join(workdir, 'serve', 'histories.sqlite')
  db = sqlite3.connect(path)
  assert db.execute('PRAGMA integrity_check').fetchone()[0] == 'ok'
  assert db.execute('PRAGMA journal_mode').fetchone()[0] == 'wal'
  assert [q for (q,) in db.execute('SELECT query FROM queries WHERE user = ? ORDER BY id',
                                   ('kim',))] == ['a', 'b']
  db.close()

  assert os.listdir(os.path.join(workdir, 'serve', 'compile_cache'))
  second = Server(workdir, *serve, env=own_cache)
  try:
    warmed = next(line for line in second.lines if 'compiled in' in line)
    compiled, read_back = map(int, re.search(
        r'\((\d+) programs, (\d+) read from the compilation cache\)', warmed).groups())
    assert 0 < read_back <= compiled, warmed
    # The restarted service reads what the killed one answered.
    assert second.post({'session': ['e'], 'user': 'kim'}).json()['history'] == 4
    second.process.send_signal(signal.SIGHUP)
    second.wait_for('Reloaded: step')
    assert second.post({'session': ['e', 'f']}).status_code == 200

    async def drain():
      async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=300)) as c:
        body = {'session': ['a', 'b', 'c']}
        # Bursts of 150 until 10 requests wait for a batch at once (a burst the service keeps
        # up with, as it may on an idle machine, is answered before; the next one is sent).
        for _ in range(5):
          flight = [asyncio.create_task(c.post(f'{second.url}/v1/suggest', json=body))
                    for _ in range(150)]
          while not (waiting := await queue_depth(c) >= 10):
            if all(f.done() for f in flight):
              break
            await asyncio.sleep(0.01)
          if waiting:
            break
        assert waiting, 'in 5 bursts of 150 requests, never 10 waiting at once'
        signalled = time.monotonic()
        second.process.send_signal(signal.SIGTERM)
        ready = await c.get(f'{second.url}/readyz')
        while ready.status_code == 200:
          ready = await c.get(f'{second.url}/readyz')
        refused = await c.post(f'{second.url}/v1/suggest', json=body)
        answered = await asyncio.gather(*flight)
        code = await asyncio.to_thread(second.process.wait, 30)
        return ready, refused, answered, code, time.monotonic() - signalled

    async def queue_depth(c):
      metrics = (await c.get(f'{second.url}/metrics')).text
      return float(re.search(r'^mtn_serve_queue_depth (\S+)$', metrics, re.M).group(1))

    ready, refused, answered, code, seconds = asyncio.run(drain())
    assert ready.status_code == 503
    assert refused.status_code == 503 and refused.headers['retry-after'] == '1'
    # Those waiting when the signal came are answered; any the service had not yet read are
    # refused with a 503, none reset.
    codes = [a.status_code for a in answered]
    assert set(codes) <= {200, 503} and codes.count(200) >= 10, codes
    assert code == 0 and seconds < 30, (code, seconds, ''.join(second.lines))
    assert any('SIGTERM: draining' in line for line in second.lines)
  finally:
    if second.process.poll() is None:
      second.process.kill()


# ---------------------------------------------------------------------------------------------
# The page, in a browser


class ThreadServer:
  """uvicorn serving `app` on a free loopback port from a thread of this process."""

  def __init__(self, app):
    sock = service_lib._bind('127.0.0.1', 0)  # pylint: disable=protected-access
    self.url = 'http://127.0.0.1:%d' % sock.getsockname()[1]
    self.server = uvicorn.Server(uvicorn.Config(app, log_level='warning', lifespan='on'))
    self.thread = threading.Thread(target=self.server.run, kwargs={'sockets': [sock]})
    self.thread.start()
    end = time.time() + 30
    while not self.server.started:
      assert time.time() < end and self.thread.is_alive(), 'uvicorn did not start'
      time.sleep(0.02)

  def stop(self):
    self.server.should_exit = True
    self.thread.join(30)


@pytest.fixture
def browser():
  chromium, driver = shutil.which('chromium'), shutil.which('chromedriver')
  if not (chromium and driver):
    message = 'needs Debian\'s chromium and chromium-driver (.ci/run installs them)'
    if os.environ.get('CI'):  # the CI machine: a browser test skipped would pass unseen
      pytest.fail(f'{message}; CI is set, so it may not be skipped')
    pytest.skip(message)
  from selenium import webdriver  # pylint: disable=g-import-not-at-top
  from selenium.webdriver.chrome.service import Service  # pylint: disable=g-import-not-at-top
  options = webdriver.ChromeOptions()
  options.binary_location = chromium
  for argument in ('--headless=new', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage',
                   '--window-size=900,720'):
    options.add_argument(argument)
  chrome = webdriver.Chrome(service=Service(executable_path=driver), options=options)
  chrome.implicitly_wait(0)
  try:
    yield chrome
  finally:
    chrome.quit()


def _wait(condition, timeout: float = 30, chrome=None):
  end = time.time() + timeout
  while True:
    value = condition()
    if value:
      return value
    assert time.time() < end, 'not there in time' + (
        f': session {_texts(chrome, "#session li")}, status {_texts(chrome, "#status")}, '
        f'suggestions {_texts(chrome, "#suggestions .text")}' if chrome else '')
    time.sleep(0.05)


def _texts(chrome, selector):
  """The text of every element `selector` finds, read at one moment."""
  return chrome.execute_script(
      'return Array.from(document.querySelectorAll(arguments[0]), e => e.textContent)', selector)


def _type(chrome, text):
  from selenium.webdriver.common.by import By  # pylint: disable=g-import-not-at-top
  from selenium.webdriver.common.keys import Keys  # pylint: disable=g-import-not-at-top
  chrome.find_element(By.ID, 'query').send_keys(text, Keys.ENTER)


@pytest.mark.slow
def test_the_page_types_two_queries_and_a_click_makes_the_third(service, browser, tmp_path):
  from selenium.webdriver.common.by import By  # pylint: disable=g-import-not-at-top
  settings = service_lib.ServeSettings(max_batch=4, deadline_ms=60_000)  # a busy machine
  page_service = service_lib.Service(service.engine, settings, log=_quiet)
  server = ThreadServer(app_lib.create_app(page_service))
  try:
    browser.get(server.url + '/')
    _wait(lambda: 'checkpoint step' in browser.find_element(By.ID, 'model').text)
    _type(browser, 'cheap flights')
    answered = lambda: re.match(r'\d suggestions from mtn', _texts(browser, '#status')[0])
    _wait(answered, chrome=browser)
    first = _texts(browser, '#suggestions .text')
    _type(browser, 'Cheap Flights Paris')
    _wait(lambda: _texts(browser, '#session li') == ['cheap flights', 'cheap flights paris']
          and answered(), chrome=browser)
    second = _texts(browser, '#suggestions .text')
    # Up to 5 (a hypothesis of no words is not shown), none of the session's queries.
    assert first and second and len(second) <= 5 and all(q.strip() for q in second)
    assert 'step' in browser.find_element(By.ID, 'status').text
    assert not {'cheap flights', 'cheap flights paris'} & set(second)  # user-facing
    browser.find_elements(By.CSS_SELECTOR, '#suggestions button')[0].click()
    # The clicked suggestion is the third query (its first 10 words: all the model reads).
    clicked = ' '.join(second[0].split()[:10])
    # The click set the status to '…' before asking; the answer's line replaces it.
    _wait(answered, chrome=browser)
    assert _texts(browser, '#session li') == ['cheap flights', 'cheap flights paris', clicked]
    third = _texts(browser, '#suggestions .text')
    assert third and clicked not in third
    shot = os.environ.get('MTN_SERVE_SCREENSHOT') or str(tmp_path / 'page.png')
    assert browser.save_screenshot(shot)
    with open(shot, 'rb') as f:
      assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  finally:
    server.stop()


@pytest.mark.slow
def test_the_page_shows_a_suggestion_as_text_never_html(browser):
  from selenium.common.exceptions import NoAlertPresentException  # pylint: disable=g-import-not-at-top
  payload = '<img src=x onerror=alert(1)>'
  engine = SlowEngine(suggestions=[{'query': payload, 'score': 0.0},
                                   {'query': '<b>bold</b> & "quoted"', 'score': -1.0}])
  stub = service_lib.Service(engine, service_lib.ServeSettings(), compilations=lambda: 0,
                             log=_quiet)
  server = ThreadServer(app_lib.create_app(stub))
  try:
    browser.get(server.url + '/')
    _type(browser, payload)  # the session comes back as the model read it, shown too
    assert _wait(lambda: _texts(browser, '#suggestions .text')) == [
        payload, '<b>bold</b> & "quoted"']
    assert _texts(browser, '#session li') == [payload]
    time.sleep(0.5)  # an image that failed to load would have fired its onerror by now
    with pytest.raises(NoAlertPresentException):
      browser.switch_to.alert.text  # pylint: disable=expression-not-assigned
    assert browser.execute_script('return document.querySelectorAll("img, b").length') == 0
    # An error's message is shown as text as well, in the status line.
    engine.refuse = payload
    _type(browser, 'more')
    _wait(lambda: 'error' in browser.find_element('id', 'status').get_attribute('class'))
    assert _texts(browser, '#status') == [f'422: session: {payload}']
    assert browser.execute_script('return document.querySelectorAll("img, b").length') == 0
    # The refused query is not in the session; it is back in the box, to be sent again.
    assert _texts(browser, '#session li') == [payload]
    assert browser.find_element('id', 'query').get_attribute('value') == 'more'
  finally:
    server.stop()


class LateFirstEngine(SlowEngine):
  """Answers a session of one query late (`late_answered` set once it has), the others at
  once."""

  def __init__(self):
    super().__init__()
    self.late_answered = threading.Event()

  def run(self, requests):
    if len(requests[0].session) != 1:
      return super().run(requests)
    time.sleep(1.0)
    try:
      return super().run(requests)
    finally:
      self.late_answered.set()


@pytest.mark.slow
def test_the_page_shows_only_the_latest_answer(browser):
  """An answer that comes after a later request's (or after "New session") is dropped: it
  would put back a session the user moved on from."""
  from selenium.webdriver.common.by import By  # pylint: disable=g-import-not-at-top
  engine = LateFirstEngine()
  stub = service_lib.Service(engine, service_lib.ServeSettings(workers=2),
                             compilations=lambda: 0, log=_quiet)
  server = ThreadServer(app_lib.create_app(stub))
  # The page has had the late answer once the server sent it and the browser ran its tasks.
  settled = lambda: engine.late_answered.wait(10) and time.sleep(0.3) is None
  try:
    browser.get(server.url + '/')
    _type(browser, 'hotels')
    _type(browser, 'hotels rome')
    _wait(lambda: _texts(browser, '#suggestions .text') == ['hotels rome more'], chrome=browser)
    assert settled()  # the first request's answer has come, and is not shown
    assert _texts(browser, '#session li') == ['hotels', 'hotels rome']
    assert _texts(browser, '#suggestions .text') == ['hotels rome more']
    browser.find_element(By.ID, 'new-session').click()
    engine.late_answered.clear()
    _type(browser, 'weather')  # late again; "New session" comes before its answer
    browser.find_element(By.ID, 'new-session').click()
    assert settled()
    assert _texts(browser, '#session li') == [] and _texts(browser, '#suggestions .text') == []
  finally:
    server.stop()


def test_a_body_over_the_limit_is_refused_before_it_is_sent():
  """413 is the answer to the headers alone: the service never waits for the body."""
  stub = service_lib.Service(SlowEngine(), service_lib.ServeSettings(max_body_bytes=1000),
                             compilations=lambda: 0, log=_quiet)
  server = ThreadServer(app_lib.create_app(stub))
  try:
    port = int(server.url.rsplit(':', 1)[1])
    with socket.create_connection(('127.0.0.1', port), timeout=10) as sock:
      sock.sendall(b'POST /v1/suggest HTTP/1.1\r\nHost: localhost\r\nContent-Type: '
                   b'application/json\r\nContent-Length: 1000000000\r\n\r\n{"session": [')
      answer = sock.recv(65536)
    assert answer.startswith(b'HTTP/1.1 413'), answer
    assert b'max_body_bytes' in answer
    # Without a Content-Length (chunked): 413 once the limit is passed, the body's end never
    # sent (a service that read on to the end would not answer).
    with socket.create_connection(('127.0.0.1', port), timeout=10) as sock:
      sock.sendall(b'POST /v1/suggest HTTP/1.1\r\nHost: localhost\r\nContent-Type: '
                   b'application/json\r\nTransfer-Encoding: chunked\r\n\r\n')
      chunk = b'{"session": ["' + b'x' * 1100
      sock.sendall(b'%x\r\n%s\r\n' % (len(chunk), chunk))
      answer = sock.recv(65536)
    assert answer.startswith(b'HTTP/1.1 413'), answer
    assert b'max_body_bytes' in answer
  finally:
    server.stop()


def test_head_on_the_wire_sends_headers_only_and_the_connection_goes_on():
  """uvicorn sends a HEAD's answer without a body: the next request on the same connection
  is read from where the headers end."""
  stub = service_lib.Service(SlowEngine(), service_lib.ServeSettings(), compilations=lambda: 0,
                             log=_quiet)
  server = ThreadServer(app_lib.create_app(stub))
  try:
    port = int(server.url.rsplit(':', 1)[1])
    with socket.create_connection(('127.0.0.1', port), timeout=10) as sock:
      sock.sendall(b'HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n'
                   b'HEAD /v1/info HTTP/1.1\r\nHost: x\r\n\r\n'
                   b'GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n')
      answer = b''
      while chunk := sock.recv(65536):
        answer += chunk
  finally:
    server.stop()
  heads = answer.split(b'\r\n\r\n')
  assert [h.split(b'\r\n')[0] for h in heads[:3]] == [b'HTTP/1.1 200 OK'] * 3, answer
  assert b'content-length: 15' in heads[0].lower() and heads[-1] == b'{"status":"ok"}', answer


def test_serve_settings_are_checked_before_anything_starts():
  from mtn_jax import config_lib  # pylint: disable=g-import-not-at-top
  for override, key in (('--config.serve.max_batch=0', 'serve.max_batch'),
                        ('--config.serve.workers=-1', 'serve.workers'),
                        ('--config.serve.port=70000', 'serve.port'),
                        ('--config.serve.max_wait_ms=-1', 'serve.max_wait_ms'),
                        ('--config.serve.drain_quiet_seconds=-1', 'serve.drain_quiet_seconds'),
                        ('--config.serve.warm_up_threads=-1', 'serve.warm_up_threads'),
                        ('--config.serve.queue_bound=0', 'serve.queue_bound')):
    with pytest.raises(config_lib.ConfigError, match=re.escape(f'config.{key}')):
      config_lib.validate(cli.config(override), 'serve')


def test_workers_follow_the_backend_unless_set(monkeypatch):
  """config.serve.workers=0 (the default): two batches at once on a CPU, one on an
  accelerator, where they would only take turns at the host's Python; a number given is
  kept. One rule however the settings are made, from the config or directly (the tests' stub
  services)."""
  config = cli.config()
  assert config.serve.workers == 0
  assert service_lib.ServeSettings.from_config(config).workers == 2  # the tests' CPU
  for backend, expected in (('cpu', 2), ('gpu', 1), ('tpu', 1)):
    monkeypatch.setattr(service_lib.jax, 'default_backend', lambda b=backend: b)
    assert service_lib.ServeSettings().workers == expected, backend
    config.serve.workers = 0
    assert service_lib.ServeSettings.from_config(config).workers == expected, backend
    config.serve.workers = 3
    assert service_lib.ServeSettings.from_config(config).workers == 3, backend
    assert service_lib.ServeSettings(workers=1).workers == 1, backend


def test_sigterm_while_preparing_the_service_stops_the_compiling_process_too(tmp_path,
                                                                              monkeypatch):
  """config.serve.prepare_after_train compiles in a process of its own: SIGTERM to the run
  (a scheduler) ends both, with the signal's exit code, rather than leaving that one running."""
  import sys  # pylint: disable=g-import-not-at-top
  from mtn_jax.serving import prepare  # pylint: disable=g-import-not-at-top
  started = []
  real_popen = subprocess.Popen

  def compiling(args, **kwargs):  # a stand-in that would run for a minute
    del args
    started.append(real_popen([sys.executable, '-c', 'import time; time.sleep(60)'],
                              **kwargs))
    return started[-1]

  monkeypatch.setattr(subprocess, 'Popen', compiling)
  before = signal.getsignal(signal.SIGTERM)
  config = cli.config('--config.serve.prepare_after_train=True')
  timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
  timer.start()
  try:
    with pytest.raises(SystemExit) as stopped:
      prepare.after_training(config, str(tmp_path), log=lambda *a, **k: None)
  finally:
    timer.cancel()
  assert stopped.value.code == 128 + signal.SIGTERM
  assert started and started[0].poll() is not None  # not left running
  assert signal.getsignal(signal.SIGTERM) is before


def test_the_service_is_prepared_only_when_asked_and_with_a_compilation_cache(tmp_path,
                                                                              monkeypatch):
  """config.serve.prepare_after_train off: nothing runs. On, it needs a compilation cache to
  keep the programs in, the config's (config.serve.compile_cache) or the process's own
  (JAX_COMPILATION_CACHE_DIR); without either nothing runs and the run says why. A failed
  preparation is reported, and leaves training's outcome alone."""
  from mtn_jax.serving import prepare  # pylint: disable=g-import-not-at-top
  started, exits = [], [0]

  def run(args, **kwargs):  # the preparing process, as it would end
    del kwargs
    started.append(args)
    return subprocess.CompletedProcess(args, exits[0])

  monkeypatch.setattr(subprocess, 'run', run)
  said = []
  log = lambda line, **_: said.append(line)
  monkeypatch.delenv('JAX_COMPILATION_CACHE_DIR', raising=False)
  assert not prepare.after_training(cli.config(), str(tmp_path), log=log)
  assert not started and not said
  no_cache = cli.config('--config.serve.prepare_after_train=True', '--config.serve.compile_cache=')
  assert not prepare.after_training(no_cache, str(tmp_path), log=log)
  assert not started and 'needs a compilation cache' in said[-1]
  monkeypatch.setenv('JAX_COMPILATION_CACHE_DIR', str(tmp_path / 'cache'))
  assert prepare.after_training(no_cache, str(tmp_path), log=log)
  assert started[-1][1:3] == ['-m', 'mtn_jax.serving.prepare']
  assert started[-1][-1] == str(tmp_path) and said[-1].startswith("The service's programs")
  exits[0] = 1
  assert not prepare.after_training(no_cache, str(tmp_path), log=log)
  assert len(started) == 2 and 'were not prepared (exit 1' in said[-1]


def test_the_preparing_process_compiles_for_the_services_devices_into_its_cache(tmp_path,
                                                                                monkeypatch):
  """The process `after_training` starts has the service's CPU device count (one, where
  training has one per core), so the programs it compiles are those the service looks up,
  and keeps them in the service's compilation cache."""
  from mtn_jax import parallel  # pylint: disable=g-import-not-at-top
  from mtn_jax.inference import trained  # pylint: disable=g-import-not-at-top
  from mtn_jax.serving import prepare  # pylint: disable=g-import-not-at-top
  devices, kept = [], []
  monkeypatch.setattr(parallel, 'set_cpu_devices', devices.append)
  monkeypatch.setattr(trained, 'keep_compiled_programs',
                      lambda workdir, folder, log: kept.append((workdir, folder)))
  monkeypatch.setattr(engine_lib.Engine, 'load', lambda config, workdir, log: None)
  monkeypatch.setattr(service_lib, 'describe', lambda engine, seconds: 'warmed up')
  config = cli.config()
  (tmp_path / 'config.json').write_text(json.dumps(config.to_dict()), encoding='utf-8')
  prepare._main([str(tmp_path / 'config.json'), str(tmp_path)])  # pylint: disable=protected-access
  assert devices == [parallel.cpu_devices_for('serve', None)] == [1]
  assert kept == [(str(tmp_path), config.serve.compile_cache)]


def test_a_process_keeps_its_own_compilation_cache(tmp_path, monkeypatch):
  """eval, decode, suggest and serve keep their programs in the workdir's cache
  (`keep_compiled_programs`) only where the process has none of its own (these tests' is
  JAX_COMPILATION_CACHE_DIR's) and a folder is named."""
  import jax  # pylint: disable=g-import-not-at-top
  from mtn_jax.inference import trained  # pylint: disable=g-import-not-at-top
  own = jax.config.jax_compilation_cache_dir
  assert own
  chosen, said = [], []
  monkeypatch.setattr(trained, 'compilation_cache', types.SimpleNamespace(
      set_cache_dir=chosen.append, reset_cache=lambda: None))
  for folder in ('serve/compile_cache', ''):
    trained.keep_compiled_programs(str(tmp_path), folder, said.append)
  assert not chosen and not said and jax.config.jax_compilation_cache_dir == own


def test_the_settings_defaults_are_the_configs():
  # The tests' stub services build settings directly: their defaults are the config's.
  config = cli.config()
  made = service_lib.ServeSettings()
  for field in dataclasses.fields(service_lib.ServeSettings):
    assert getattr(made, field.name) == (
        service_lib.ServeSettings.from_config(config).workers if field.name == 'workers'
        else config.serve[field.name]), field.name


def test_a_user_is_handed_to_a_ranker_as_its_numeric_id_only_when_it_is_one():
  # str.isdigit holds for '²' and '٣', which int() reads as no number or another one.
  info = lambda user: engine_lib.Engine._info(engine_lib.Request(('a',), 1, user))  # pylint: disable=protected-access
  assert info('42') == {'user': 42}
  assert info('²') == info('٣') == info('ann') == info(None) == {}


def _locked_history_service(tmp_path, deadline_ms: float):
  """(a service of users' histories whose file another connection holds, that connection,
  the lines it logs): the store waits the service's `history_wait_seconds`, as `build`'s."""
  from tests.stub_server import StubEngine  # pylint: disable=g-import-not-at-top
  settings = service_lib.ServeSettings(deadline_ms=deadline_ms)
  path = str(tmp_path / 'histories.sqlite')
  store = history_lib.HistoryStore(path, per_user=10, window=4,
                                   busy_seconds=settings.history_wait_seconds)
  said = []
  service = service_lib.Service(StubEngine(personalises=True), settings, store,
                                compilations=lambda: 0, log=said.append)
  return service, sqlite3.connect(path, isolation_level=None), said


def test_a_locked_history_database_leaves_the_request_answered_without_the_past(tmp_path):
  """Another process holds the histories' file locked: a request naming a user waits half
  its deadline, then is answered without the user's past (`history` 0), counted and logged;
  once the lock is gone, its session is recorded again."""
  service, other, said = _locked_history_service(tmp_path, deadline_ms=1000)
  with TestClient(app_lib.create_app(service)) as client:
    ask = lambda session: client.post('/v1/suggest', json={'session': session, 'user': 'ann'})
    assert ask(['a']).json()['history'] == 0
    other.execute('BEGIN IMMEDIATE')
    started = time.monotonic()
    answer = ask(['b'])
    assert answer.status_code == 200 and answer.json()['history'] == 0
    assert 0.45 < time.monotonic() - started < 1.0  # within its deadline
    assert 'mtn_serve_history_errors_total 1.0' in client.get('/metrics').text
    assert [line for line in said if 'database is locked' in line] == [
        f"Users' histories ({service.store.path}) failed: database is locked; requests "
        "answered without their user's past for 0.5 s."]
    other.execute('ROLLBACK')
    time.sleep(0.55)  # the store is asked again
    assert ask(['c']).json()['history'] == 1  # 'a', the session before
  other.close()


def test_a_locked_history_database_holds_a_batch_of_users_up_once(tmp_path):
  """Four users' requests in one batch, the file locked: the first waits half the deadline,
  the others are not asked of the store again, and all four are answered in time."""
  service, other, said = _locked_history_service(tmp_path, deadline_ms=600)
  other.execute('BEGIN IMMEDIATE')

  async def main():
    await service.start()
    try:
      deadline = time.monotonic() + 0.6
      return await asyncio.gather(*(service.batcher.submit(
          engine_lib.Request(('x',), 1, f'user {i}'), deadline) for i in range(4)))
    finally:
      await service.stop()

  answers = asyncio.run(main())
  assert [history for _, _, history in answers] == [0] * 4
  assert 'mtn_serve_history_errors_total 4.0' in service.metrics.render()[0].decode()
  assert sum('database is locked' in line for line in said) == 1
  other.close()


def test_a_history_database_it_cannot_write_is_named_in_one_line(tmp_path, monkeypatch):
  from tests.stub_server import StubEngine  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(engine_lib.Engine, 'load',
                      lambda *args, **kwargs: StubEngine(personalises=True))
  monkeypatch.setattr(service_lib, 'describe', lambda engine, seconds: 'loaded')
  (tmp_path / 'serve').mkdir()
  (tmp_path / 'serve' / 'histories.sqlite').mkdir()  # a folder where the file should be
  with pytest.raises(errors.Error, match=re.escape(
      "config.serve.history_db: cannot keep users' histories in "
      f"{tmp_path}/serve/histories.sqlite (")):
    service_lib.build(cli.config(), str(tmp_path), log=_quiet)


def test_the_history_store_keeps_at_least_what_the_model_reads(tmp_path, monkeypatch):
  """config.serve.history_per_user below what the pipeline reads of a user's past: the store
  keeps what it reads (as evaluation and decode read it), not fewer; a model that reads no
  user has no store."""
  from tests.stub_server import StubEngine  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(engine_lib.Engine, 'load',
                      lambda *args, **kwargs: StubEngine(personalises=True))
  monkeypatch.setattr(service_lib, 'describe', lambda engine, seconds: 'loaded')
  built = service_lib.build(cli.config('--config.serve.history_per_user=3'), str(tmp_path),
                            log=_quiet)
  try:
    assert built.store.per_user == built.engine.past_read == 1000
  finally:
    built.store.close()
  # A model that reads no user keeps no histories.
  monkeypatch.setattr(engine_lib.Engine, 'load', lambda *args, **kwargs: StubEngine())
  assert service_lib.build(cli.config(), str(tmp_path / 'other'), log=_quiet).store is None
  assert not (tmp_path / 'other').exists()


def test_the_compiled_programs_folder_is_said_once_the_model_has_loaded(tmp_path, monkeypatch):
  """A workdir whose model cannot load (none trained) names no folder of compiled programs:
  none is ever made there. One that loads names it after the model's own lines."""
  from tests.stub_server import StubEngine  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(service_lib.trained, 'keep_compiled_programs',
                      lambda workdir, folder, log: log(f'Compiled programs kept in {folder}'))
  monkeypatch.setattr(service_lib, 'describe', lambda engine, seconds: 'loaded')
  said = []

  def untrained(*args, log, **kwargs):
    log('Loading the model')
    raise errors.Error('no checkpoint in the workdir')

  monkeypatch.setattr(engine_lib.Engine, 'load', untrained)
  with pytest.raises(errors.Error, match='no checkpoint'):
    service_lib.build(cli.config('--config.serve.history_db='), str(tmp_path), log=said.append)
  assert said == ['Loading the model']

  def trained_one(*args, log, **kwargs):
    log('Loading the model')
    return StubEngine()

  said.clear()
  monkeypatch.setattr(engine_lib.Engine, 'load', trained_one)
  service_lib.build(cli.config('--config.serve.history_db='), str(tmp_path), log=said.append)
  assert said == ['Loading the model', 'Compiled programs kept in serve/compile_cache',
                  'loaded']
