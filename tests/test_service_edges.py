"""The service's edges, without a trained model (tests/stub_server.py's engine, which checks
requests as the real one does): one error shape on every path, the OpenAPI description
against what the service does (schemathesis, in this process), no filesystem path to a
client, control characters, k beyond what the model has, /docs off no other host, and the
drain after SIGTERM as a load balancer polling /readyz sees it."""

from __future__ import annotations

import asyncio
import gc
import json
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import hypothesis
import pytest
import schemathesis

from configs import demo
from mtn_jax import errors
from mtn_jax.serving import app as app_lib
from mtn_jax.serving import engine as engine_lib
from mtn_jax.serving import service as service_lib
from tests import cli
from tests.service_client import LOOPBACK
from tests.service_client import TestClient
from tests.stub_server import StubEngine



def _quiet(*args, **kwargs):
  del args, kwargs


def stub_app(engine=None, **settings):
  service = service_lib.Service(engine or StubEngine(), service_lib.ServeSettings(**settings),
                                compilations=lambda: 0, log=_quiet)
  return app_lib.create_app(service), service


@pytest.fixture
def stub():
  app, service = stub_app(max_body_bytes=1000)
  with TestClient(app, client=LOOPBACK, raise_server_exceptions=False) as client:
    yield client, service


def assert_one_shape(response, status: int, field: str | None):
  """`Error` exactly, rendered as every JSON answer is, the request id the header's."""
  assert response.status_code == status, response.text
  assert response.headers['content-type'] == 'application/json', response.headers
  body = response.json()
  assert set(body) == {'error', 'field', 'request_id'}, body
  assert body['field'] == field and body['error'].strip(), body
  assert body['request_id'] == response.headers['x-request-id']
  assert response.content == json.dumps(body, ensure_ascii=False,
                                        separators=(',', ':')).encode()
  return body


JSON = {'content-type': 'application/json'}


@pytest.mark.parametrize('method, path, kwargs, status, field', [
    ('GET', '/nowhere', {}, 404, None),
    ('GET', '/v1/suggest', {}, 405, None),
    ('DELETE', '/readyz', {}, 405, None),
    ('POST', '/v1/suggest', {'content': b'\xff\xfe{"session"', 'headers': JSON}, 400, 'body'),
    ('POST', '/v1/suggest', {'content': b'', 'headers': JSON}, 400, 'body'),
    ('POST', '/v1/suggest', {'content': b''}, 400, 'body'),
    ('POST', '/v1/suggest', {'content': b'{"session": ["a"', 'headers': JSON}, 400, 'body'),
    ('POST', '/v1/suggest', {'content': b'{"session": ["a"]}',
                             'headers': {'content-type': 'text/plain'}}, 415, 'body'),
    ('POST', '/v1/suggest', {'data': {'session': 'a'}}, 415, 'body'),  # a form, not JSON
    ('POST', '/v1/suggest', {'content': b'{"session"',
                             'headers': {'content-type': 'text/plain'}}, 415, 'body'),
    ('POST', '/v1/suggest', {'content': b'"hello"', 'headers': JSON}, 422, 'body'),
    ('POST', '/v1/suggest', {'content': b'5', 'headers': JSON}, 422, 'body'),
    ('POST', '/v1/suggest', {'json': {'session': []}}, 422, 'session'),
    ('POST', '/v1/suggest', {'json': {'session': ['a'], 'user': 'ann'}}, 422, 'user'),
    ('POST', '/v1/suggest', {'content': b'{"session": ["' + b'x' * 2000 + b'"]}',
                             'headers': JSON}, 413, 'body'),
    ('POST', '/admin/reload', {'content': b'x' * 2000}, 413, 'body'),
])
def test_every_error_has_the_one_shape(stub, method, path, kwargs, status, field):
  client, _ = stub
  body = assert_one_shape(client.request(method, path, **kwargs), status, field)
  if status == 400:
    assert body['error'].startswith('invalid JSON'), body
  if status == 405:
    assert client.request(method, path, **kwargs).headers['allow'], 'no Allow header'


def test_an_address_it_cannot_listen_on_is_named_before_any_model_loads(tmp_path):
  taken = service_lib._bind('127.0.0.1', 0)  # pylint: disable=protected-access
  taken.listen()
  port = taken.getsockname()[1]
  config = demo.get_config()
  config.serve.host, config.serve.port = '127.0.0.1', port
  # The workdir holds no model: the address is refused first.
  with pytest.raises(errors.Error, match=re.escape(
      f"config.serve.host, port = '127.0.0.1', {port}: cannot listen there "
      '(Address already in use)')):
    service_lib.serve(config, str(tmp_path / 'no_workdir'))
  taken.close()
  with pytest.raises(errors.Error, match=re.escape(
      "config.serve.host, port = '999.1.1.1', 0: cannot listen there (")):
    service_lib._bind('999.1.1.1', 0)  # pylint: disable=protected-access


def test_a_service_whose_address_another_took_while_it_loaded_stops_saying_so():
  """Two services started together both bind the port (neither listens while its model
  loads); the first to listen has it, and the second stops with that error, never saying
  it serves."""
  first = service_lib._bind('127.0.0.1', 0)  # pylint: disable=protected-access
  port = first.getsockname()[1]
  second = service_lib._bind('127.0.0.1', port)  # pylint: disable=protected-access
  first.listen()
  said = []
  service = service_lib.Service(StubEngine(), service_lib.ServeSettings(),
                                compilations=lambda: 0, log=said.append)
  try:
    with pytest.raises(errors.Error, match=re.escape(
        f"config.serve.host, port = '127.0.0.1', {port}: cannot listen there (another "
        'process took the address while this one loaded')):
      service_lib.run(service, second)
  finally:
    gc.unfreeze()  # `run` froze the objects of this process, as a service's own
    first.close()
  assert not any('Serving on' in line for line in said), said


def test_a_body_that_stops_short_of_its_length_is_408_at_the_deadline():
  """The client announced 50 bytes and sent 12: the request is answered at its deadline,
  not held (with its connection) forever."""
  app, _ = stub_app(deadline_ms=200)
  sent = []

  async def main():
    chunks = [{'type': 'http.request', 'body': b'{"session": ', 'more_body': True}]

    async def receive():
      if chunks:
        return chunks.pop()
      await asyncio.sleep(3600)  # the rest never comes

    async def send(message):
      sent.append(message)
    scope = {'type': 'http', 'asgi': {'version': '3.0'}, 'http_version': '1.1',
             'method': 'POST', 'scheme': 'http', 'path': '/v1/suggest', 'raw_path': b'',
             'query_string': b'', 'root_path': '', 'client': ('127.0.0.1', 5000),
             'server': ('127.0.0.1', 80), 'headers': [(b'content-type', b'application/json'),
                                                      (b'content-length', b'50')]}
    started = time.monotonic()
    await asyncio.wait_for(app(scope, receive, send), 10)
    return time.monotonic() - started

  seconds = asyncio.run(main())
  assert 0.15 < seconds < 5
  assert [m['status'] for m in sent if m['type'] == 'http.response.start'] == [408]
  body = json.loads(b''.join(m.get('body', b'') for m in sent
                             if m['type'] == 'http.response.body'))
  assert body['field'] == 'body' and 'did not arrive before the deadline' in body['error']


def asgi(app, method: str, path: str, headers=(), chunks=(), late: float = 0.0,
         service=None, meanwhile=lambda: None) -> list[dict]:
  """The messages `app` sends when called as a server calls it (what uvicorn would turn
  away or hide from a test client reaches it), its body read from `chunks` in order, each
  after the first `late` seconds after the one before and after `meanwhile()`; `service`
  (the app's) started for the call where given (what a suggestion needs)."""
  sent, pending = [], list(reversed(chunks)) or [{'type': 'http.request', 'body': b''}]

  async def main():
    async def receive():
      if pending:
        if len(pending) < len(chunks):
          await asyncio.sleep(late)
          meanwhile()
        return pending.pop()
      await asyncio.sleep(3600)

    async def send(message):
      sent.append(message)
    scope = {'type': 'http', 'asgi': {'version': '3.0'}, 'http_version': '1.1',
             'method': method, 'scheme': 'http', 'path': path, 'raw_path': path.encode(),
             'query_string': b'', 'root_path': '', 'client': LOOPBACK,
             'server': ('127.0.0.1', 80), 'headers': list(headers)}
    if service is not None:
      await service.start()
    try:
      await asyncio.wait_for(app(scope, receive, send), 10)
    finally:
      if service is not None:
        await service.stop()

  asyncio.run(main())
  return sent


def test_the_deadline_counts_from_the_requests_arrival_not_from_its_bodys_end():
  """A body that took most of deadline_ms (500 here) to arrive leaves the batch only the
  rest: a batch of 0.3 s then is answered 504, the deadline counted from the arrival."""
  app, service = stub_app(StubEngine(seconds=0.3), deadline_ms=500)
  body = b'{"session": ["a"]}'
  sent = asgi(app, 'POST', '/v1/suggest',
              headers=[(b'content-type', b'application/json'),
                       (b'content-length', str(len(body)).encode())],
              chunks=[{'type': 'http.request', 'body': body[:5], 'more_body': True},
                      {'type': 'http.request', 'body': body[5:]}], late=0.4, service=service)
  assert [m['status'] for m in sent if m['type'] == 'http.response.start'] == [504], sent


def test_a_request_that_came_before_sigterm_is_answered_though_its_body_ends_after():
  """SIGTERM's drain refuses the requests that come after it; one already arriving (its
  body still on its way) is in flight, and answered."""
  app, service = stub_app()
  body = b'{"session": ["a"]}'
  sent = asgi(app, 'POST', '/v1/suggest',
              headers=[(b'content-type', b'application/json'),
                       (b'content-length', str(len(body)).encode())],
              chunks=[{'type': 'http.request', 'body': body[:5], 'more_body': True},
                      {'type': 'http.request', 'body': body[5:]}], late=0.05,
              service=service, meanwhile=service.begin_drain)
  assert service.draining
  assert [m['status'] for m in sent if m['type'] == 'http.response.start'] == [200], sent


def test_a_client_gone_before_its_body_ended_is_counted_apart_not_as_a_400():
  """A client that closes its connection mid-body is no bad request of its own making: the
  request counter says 499 (what the framework answers, a 400, reaches nobody)."""
  app, service = stub_app()
  asgi(app, 'POST', '/v1/suggest',
       headers=[(b'content-type', b'application/json'), (b'content-length', b'50')],
       chunks=[{'type': 'http.request', 'body': b'{"session": ', 'more_body': True},
               {'type': 'http.disconnect'}])
  metrics = service.metrics.render()[0].decode()
  assert 'mtn_serve_requests_total{route="/v1/suggest",status="499"} 1.0' in metrics, metrics
  assert 'status="400"' not in metrics
  assert 'mtn_serve_suggest_seconds_count{status="499"} 1.0' in metrics


def test_a_content_length_that_is_no_number_is_413_not_a_500():
  """Refused unread, as one over the limit is (uvicorn turns such a header away itself;
  another server may not)."""
  app, service = stub_app(max_body_bytes=1000)
  sent = asgi(app, 'POST', '/v1/suggest',
              headers=[(b'content-type', b'application/json'), (b'content-length', b'12x')],
              chunks=[{'type': 'http.request', 'body': b'{"session": ["a"]}'}])
  assert [m['status'] for m in sent if m['type'] == 'http.response.start'] == [413], sent
  body = json.loads(b''.join(m.get('body', b'') for m in sent
                             if m['type'] == 'http.response.body'))
  assert set(body) == {'error', 'field', 'request_id'} and body['field'] == 'body', body
  metrics = service.metrics.render()[0].decode()
  assert 'mtn_serve_requests_total{route="/v1/suggest",status="413"} 1.0' in metrics, metrics
  # The body is left unread: the connection is closed after the answer, not read on from.
  [start] = [m for m in sent if m['type'] == 'http.response.start']
  assert (b'connection', b'close') in start['headers'], start


def test_a_head_answer_sends_no_body_to_the_server():
  """The application drops a HEAD's body itself, not only the server in front of it."""
  app, _ = stub_app()
  for path in ('/healthz', '/v1/info'):
    sent = asgi(app, 'HEAD', path)
    assert [m['status'] for m in sent if m['type'] == 'http.response.start'] == [200]
    assert b''.join(m.get('body', b'') for m in sent
                    if m['type'] == 'http.response.body') == b'', sent


@pytest.mark.parametrize('path', ['/readyz', '/healthz', '/v1/info', '/openapi.json', '/'])
def test_each_route_is_counted_under_its_own_name(stub, path):
  client, _ = stub
  assert client.get(path).status_code == 200
  metrics = client.get('/metrics').text
  assert f'mtn_serve_requests_total{{route="{path}",status="200"}} 1.0' in metrics, metrics
  assert 'route="other"' not in metrics, metrics


def test_the_suggest_latency_counts_suggest_requests_only(stub):
  client, _ = stub
  for path in ('/healthz', '/readyz', '/v1/info', '/metrics'):
    assert client.get(path).status_code == 200
  assert 'mtn_serve_suggest_seconds_count' not in client.get('/metrics').text
  assert client.post('/v1/suggest', json={'session': ['a']}).status_code == 200
  assert 'mtn_serve_suggest_seconds_count{status="200"} 1.0' in client.get('/metrics').text


def test_a_draining_service_closes_the_connection_of_a_refused_request(stub):
  """A keep-alive client's next request then goes to another instance, not this one about
  to stop."""
  client, service = stub
  assert 'mtn_serve_draining 0.0' in client.get('/metrics').text
  service.begin_drain()
  answer = client.post('/v1/suggest', json={'session': ['a']})
  assert_one_shape(answer, 503, None)
  assert answer.headers['retry-after'] == '1' and answer.headers['connection'] == 'close'
  assert 'mtn_serve_draining 1.0' in client.get('/metrics').text  # what a dashboard sees


@pytest.mark.parametrize('user, message', [('', None), ('ann\x07', 'U+0007')])
def test_an_empty_user_or_one_with_a_control_character_is_refused_naming_the_user(user,
                                                                                 message):
  app, _ = stub_app(StubEngine(personalises=True))
  with TestClient(app, client=LOOPBACK, raise_server_exceptions=False) as client:
    body = json.dumps({'session': ['a'], 'user': user}).encode()
    answer = assert_one_shape(client.post('/v1/suggest', content=body,
                                          headers={'content-type': 'application/json'}),
                              422, 'user')
  assert message is None or message in answer['error'], answer


@pytest.mark.parametrize('path', ['/', '/page.js', '/favicon.ico', '/v1/info', '/healthz',
                                  '/readyz', '/metrics', '/docs', '/openapi.json',
                                  app_lib.DOCS_ASSETS + '/swagger-ui.css'])
def test_head_is_answered_wherever_get_is_with_its_headers_and_no_body(stub, path):
  client, _ = stub
  got, head = client.get(path), client.head(path)
  assert got.status_code == head.status_code == 200, (got.text, head.text)
  assert head.content == b'' and got.content
  assert head.headers['content-type'] == got.headers['content-type']
  if path != '/metrics':  # its body counts this very request
    assert head.headers['content-length'] == got.headers['content-length']
  assert head.headers['x-request-id'] != got.headers['x-request-id']


def test_head_where_get_is_not_answered_is_405_or_404(stub):
  client, _ = stub
  answer = client.head('/v1/suggest')
  assert answer.status_code == 405 and answer.headers['allow'] == 'POST', answer.headers
  # Where GET is answered, a 405 names HEAD too.
  answer = client.post('/healthz')
  assert answer.status_code == 405 and answer.headers['allow'] == 'GET, HEAD', answer.headers
  assert answer.json()['error'] == 'POST is not answered at /healthz; it answers GET, HEAD'
  assert client.head('/nowhere').status_code == 404
  assert client.head(app_lib.DOCS_ASSETS + '/nothing.js').status_code == 404


def test_a_deeply_nested_body_is_400_not_a_500():
  app, _ = stub_app()  # the default max_body_bytes (16,384) holds 8,000 levels
  deep = b'[' * 8000 + b']' * 8000
  with TestClient(app, client=LOOPBACK, raise_server_exceptions=False) as client:
    body = assert_one_shape(client.post('/v1/suggest', content=deep, headers=JSON), 400,
                            'body')
  assert 'nested too deeply' in body['error']


def test_a_body_over_the_limit_unannounced_is_413_of_the_same_shape(stub):
  client, _ = stub
  chunks = (b'{"session": ["' + b'x' * 500 + b'"]}' for _ in range(4))  # no Content-Length
  assert_one_shape(client.post('/v1/suggest', content=chunks, headers=JSON), 413, 'body')


def test_a_body_of_exactly_the_limit_is_answered_and_one_byte_more_is_413(stub):
  """max_body_bytes (1,000 here) is the largest body served, announced by its Content-Length
  or not: a client that sizes its requests to the documented limit is not refused."""
  client, _ = stub
  body = b'{"session": ["a"]}'
  exact = body + b' ' * (1000 - len(body))  # JSON's trailing whitespace: still the request
  for content, over in ((exact, False), (exact + b' ', True)):
    chunks = (content[i:i + 300] for i in range(0, len(content), 300))  # no Content-Length
    for answer in (client.post('/v1/suggest', content=content, headers=JSON),
                   client.post('/v1/suggest', content=chunks, headers=JSON)):
      if over:
        assert_one_shape(answer, 413, 'body')
      else:
        assert answer.status_code == 200, answer.text
        assert answer.json()['suggestions'] == [{'query': 'a more', 'score': 0.0}]


def test_paths_the_service_does_not_answer_are_counted_as_one_route(stub):
  """Every unknown path is route="other" in the request counter: a scanner's thousand paths
  would otherwise be a thousand metric series, kept for the process's life."""
  client, _ = stub
  for path in ('/nowhere', '/wp-login.php', '/v1/suggest/more'):
    assert client.get(path).status_code == 404
  metrics = client.get('/metrics').text
  assert 'mtn_serve_requests_total{route="other",status="404"} 3.0' in metrics, metrics
  assert 'nowhere' not in metrics and 'wp-login' not in metrics and 'more"' not in metrics


def test_the_described_user_takes_what_the_service_takes():
  """A personalising service's description gives `user` the pattern of the text it takes: a
  client that validates against it sends no user the service refuses, and refuses none it
  takes."""
  app, _ = stub_app(StubEngine(personalises=True))
  with TestClient(app, client=LOOPBACK, raise_server_exceptions=False) as client:
    request = client.get('/openapi.json').json()['components']['schemas']['SuggestRequest']
    [text] = [option for option in request['properties']['user']['anyOf']
              if option.get('type') == 'string']
    for user, taken in (('ann', True), ('tab\tand space', True), ('ann\x07', False),
                        ('c1\x9b', False), ('del\x7f', False)):
      answer = client.post('/v1/suggest', json={'session': ['a'], 'user': user})
      assert (answer.status_code == 200) is taken, (user, answer.text)
      assert bool(re.search(text['pattern'], user)) is taken, user


def test_a_user_of_over_200_characters_is_refused_naming_the_user():
  """The request's `user` is at most 200 characters (the description's maxLength): a longer
  one is a 422 naming `user`, before any history is read or written for it."""
  app, _ = stub_app(StubEngine(personalises=True))
  with TestClient(app, client=LOOPBACK, raise_server_exceptions=False) as client:
    answer = client.post('/v1/suggest', json={'session': ['a'], 'user': 'u' * 200})
    assert answer.status_code == 200 and answer.json()['history'] == 0, answer.text
    assert_one_shape(client.post('/v1/suggest', json={'session': ['a'], 'user': 'u' * 201}),
                     422, 'user')


def test_draining_and_internal_errors_have_the_one_shape(stub, monkeypatch):
  client, service = stub
  monkeypatch.setattr(service.engine, 'run', lambda requests: 1 / 0)
  assert_one_shape(client.post('/v1/suggest', json={'session': ['a']}), 500, None)
  service.begin_drain()
  for path, method in (('/readyz', 'GET'), ('/v1/suggest', 'POST')):
    response = client.request(method, path, json={'session': ['a']})
    assert_one_shape(response, 503, None)
    assert response.headers['retry-after'] == '1'


@pytest.mark.parametrize('text, code', [
    ('a\x00b', 'the control character U+0000'), ('bell\x07', 'the control character U+0007'),
    ('del\x7f', 'the control character U+007F'), ('c1\x9b', 'the control character U+009B'),
    ('half\ud800', 'the lone surrogate U+D800')])
def test_a_control_character_is_refused_naming_the_field(stub, text, code):
  client, _ = stub
  body = json.dumps({'session': ['fine', text]}).encode()  # \ud800 as JSON's escape
  answer = assert_one_shape(client.post('/v1/suggest', content=body, headers=JSON), 422,
                            'session[1]')
  assert code in answer['error'], answer


def test_a_query_of_bidirectional_controls_alone_is_empty_and_refused_one_holding_them_cleaned(
    stub):
  client, _ = stub
  body = json.dumps({'session': ['fine', '\u202e\u2066']}).encode()
  answer = assert_one_shape(client.post('/v1/suggest', content=body, headers=JSON), 422,
                            'session[1]')
  assert 'an empty query once normalised' in answer['error'], answer
  answer = client.post('/v1/suggest', json={'session': ['moc.\u202eevil']})
  assert answer.json()['session'] == ['moc.evil'], answer.text


def test_tab_newline_and_other_whitespace_separate_words(stub):
  client, _ = stub
  answer = client.post('/v1/suggest', json={'session': ['Cheap\tflights\nto\x85Paris']})
  assert answer.status_code == 200, answer.text
  assert answer.json()['session'] == ['cheap flights to paris']


def test_k_beyond_what_the_model_has_is_reported(stub):
  client, _ = stub
  answer = client.post('/v1/suggest', json={'session': ['a'], 'k': 20}).json()
  assert (answer['k'], answer['k_returned'], len(answer['suggestions'])) == (20, 1, 1)
  answer = client.post('/v1/suggest', json={'session': ['a'], 'k': 3.0}).json()
  assert answer['k'] == 3  # JSON's 3.0 is JSON Schema's integer 3
  assert client.post('/v1/suggest', json={'session': ['a']}).json()['k'] == 5  # top_k


def test_a_fractional_k_is_refused_not_rounded(stub):
  """JSON's 3.0 is the integer 3, but 2.5 suggestions is no number of suggestions: 422
  naming `k`, not a list of 2."""
  client, _ = stub
  assert_one_shape(client.post('/v1/suggest', json={'session': ['a'], 'k': 2.5}), 422, 'k')


def test_no_filesystem_path_reaches_a_client(stub):
  client, service = stub
  workdir = service.engine.workdir
  answers = [client.get('/v1/info'), client.post('/v1/suggest', json={'session': ['a']}),
             client.get('/'), client.get('/openapi.json'), client.get('/docs'),
             client.get('/nowhere'), client.post('/v1/suggest', json={'session': ['a' * 3]})]
  for answer in answers:
    assert workdir not in answer.text and 'nowhere' not in answer.text.replace('/nowhere', '')
  assert client.get('/v1/info').json()['name'] == 'stub'
  assert client.post('/v1/suggest', json={'session': ['a']}).json()['model'] == {
      'name': 'stub', 'step': 7}


def test_the_docs_and_the_page_fetch_nothing_off_this_host(stub):
  client, _ = stub
  for page in ('/docs', '/'):
    html = client.get(page).text
    assert not re.search(r'(src|href)="(https?:)?//', html), html
    for url in re.findall(r'(?:src|href)="([^"]+)"', html):
      fetched = client.get(url)
      assert fetched.status_code == 200 and fetched.content, url
  assert 'swagger-ui-bundle.js' in client.get('/docs').text
  icon = client.get('/favicon.ico')
  assert icon.status_code == 200 and icon.headers['content-type'] == 'image/svg+xml'


def test_the_description_lists_every_answer_with_its_media_type(stub):
  client, _ = stub
  schema = client.get('/openapi.json').json()
  for path, operations in schema['paths'].items():
    for method, operation in operations.items():
      for status in ('413', '500'):
        assert status in operation['responses'], (method, path, status)
  suggest = schema['paths']['/v1/suggest']['post']['responses']
  assert {'200', '400', '408', '413', '415', '422', '500', '503', '504'} <= set(suggest)
  assert '$ref' in json.dumps(suggest['422']) and 'Error' in json.dumps(suggest['422'])
  # Every error answer described is `Error`: none in the framework's shape of its own.
  assert 'HTTPValidationError' not in json.dumps(schema)
  assert '422' not in schema['paths']['/admin/reload']['post']['responses']
  metrics = schema['paths']['/metrics']['get']['responses']['200']['content']
  assert list(metrics) == ['text/plain']
  assert client.get('/metrics').headers['content-type'].startswith('text/plain')
  request = schema['components']['schemas']['SuggestRequest']['properties']
  assert 'user' not in request  # the stub reads no user
  assert request['session']['maxItems'] == 4 and request['k']['anyOf'][0]['maximum'] == 20
  score = schema['components']['schemas']['Suggestion']['properties']['score']['description']
  assert 'higher is better' in score
  for strategy in ('generate', 'retrieve', 'rerank', 'blend'):
    assert strategy in schema['info']['description'], strategy


# ---------------------------------------------------------------------------------------------
# The OpenAPI description against the service, every schemathesis check


def _fuzzed(personalises: bool):
  app, _ = stub_app(StubEngine(personalises=personalises))
  return schemathesis.openapi.from_asgi('/openapi.json', app)


READS_NO_USER, READS_A_USER = _fuzzed(False), _fuzzed(True)
# Bounded: the whole run takes seconds; derandomized, so that a failure reproduces.
FUZZ = hypothesis.settings(max_examples=40, deadline=None, derandomize=True, database=None,
                           suppress_health_check=list(hypothesis.HealthCheck))


def _every_check_is_enabled(case) -> None:
  checks = case.operation.schema.config.checks_config_for(operation=case.operation)
  disabled = [name for name in ('not_a_server_error', 'status_code_conformance',
                                'content_type_conformance', 'response_schema_conformance',
                                'response_headers_conformance', 'positive_data_acceptance',
                                'negative_data_rejection', 'unsupported_method',
                                'missing_required_header', 'ignored_auth')
              if not checks.get_by_name(name=name).enabled]
  assert not disabled, disabled


@READS_NO_USER.parametrize()
@FUZZ
def test_the_service_does_what_its_description_says(case):
  _every_check_is_enabled(case)
  case.call_and_validate()


@READS_A_USER.parametrize()
@FUZZ
def test_a_personalising_service_does_what_its_description_says(case):
  _every_check_is_enabled(case)
  case.call_and_validate()


# ---------------------------------------------------------------------------------------------
# Draining, in a process of its own


def test_a_drain_answers_503_for_the_quiet_time_before_it_stops_listening():
  """A load balancer polls /readyz every 50 ms: after SIGTERM it sees 503s (with Retry-After)
  for at least drain_quiet_seconds, then the connection is refused; the process exits 0."""
  quiet = 1.0
  process = subprocess.Popen(
      [sys.executable, '-m', 'tests.stub_server', f'--config.serve.drain_quiet_seconds={quiet}'],
      cwd=cli.REPO, env=cli.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  lines = []
  try:
    for line in process.stdout:
      lines.append(line)
      if line.startswith('Serving on '):
        break
    url = re.match(r'Serving on (http://\S+) ', lines[-1]).group(1)
    threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True).start()
    polls = []
    with httpx.Client(timeout=5) as client:
      assert client.get(f'{url}/readyz').status_code == 200
      signalled = time.monotonic()
      process.send_signal(signal.SIGTERM)
      while time.monotonic() - signalled < 10:
        try:
          answer = client.get(f'{url}/readyz')
        except httpx.TransportError:
          polls.append((time.monotonic() - signalled, None))
          break
        polls.append((time.monotonic() - signalled, answer))
        time.sleep(0.05)
      # Polls do not prolong the drain: the last came well before drain_seconds (10).
      refused_at = polls[-1][0]
      assert polls[-1][1] is None and refused_at < 5, polls
    codes = [a.status_code for _, a in polls[:-1]]
    # 200 until the signal is handled (a poll or two), then 503 to the end.
    assert codes and set(codes) <= {200, 503}, codes
    assert codes == sorted(codes, key=lambda c: c == 503), codes
    unready = [(at, a) for at, a in polls[:-1] if a.status_code == 503]
    assert all(a.headers['retry-after'] == '1' for _, a in unready)
    assert unready[0][0] < 0.5, polls
    # 503s for at least the quiet time, the last one within a poll of the refusal. The drain
    # begins when the signal is handled, up to a poll before the first 503 is seen, and never
    # before the signal: the refusal comes at least the quiet time after the signal.
    assert unready[-1][0] - unready[0][0] >= quiet - 0.2, polls
    assert refused_at >= quiet, polls
    assert process.wait(30) == 0, ''.join(lines)
  finally:
    if process.poll() is None:
      process.kill()


def test_a_drain_waits_for_requests_in_flight_and_the_quiet_time_after_the_last_request():
  """`drained` (what SIGTERM's drain waits on): a request in flight holds it (its body may
  still be arriving, not yet queued); the quiet time counts from the latest suggestion
  request, not only from the signal; and it is capped at a quarter of the drain's time, so
  that a long drain_quiet_seconds cannot use up the whole drain and end it unfinished."""
  service = service_lib.Service(StubEngine(),
                                service_lib.ServeSettings(drain_quiet_seconds=0.3),
                                compilations=lambda: 0, log=_quiet)

  async def main():
    service.begin_drain()
    service.inflight = 1
    held = await service.drained(0.5)
    service.inflight = 0
    service.last_request = time.monotonic()  # a suggestion request came during the drain
    started = time.monotonic()
    done = await service.drained(5)
    return held, done, time.monotonic() - started

  held, done, waited = asyncio.run(main())
  assert held is False and done is True
  assert 0.25 <= waited < 2, waited  # drain_quiet_seconds after that request
  patient = service_lib.Service(StubEngine(),
                                service_lib.ServeSettings(drain_quiet_seconds=60),
                                compilations=lambda: 0, log=_quiet)
  patient.begin_drain()
  assert asyncio.run(patient.drained(0.4)) is True  # quiet for 0.1 s: a quarter of 0.4
  patient.begin_drain()  # again: the quiet time counts from here
  started = time.monotonic()
  assert asyncio.run(patient.drained(4)) is True
  assert 0.95 <= time.monotonic() - started < 1.8  # a quarter of 4 s, not more


def _answer_during_a_drain(engine, settings, drain_after: float):
  """(what `drained(0.2)` says once the drain began, the request's answer, the seconds from
  the drain's beginning to the answer, what `drained(1)` says after it): one suggestion
  request sent to a started service whose drain begins `drain_after` seconds later."""
  service = service_lib.Service(engine, settings, compilations=lambda: 0, log=_quiet)

  async def main():
    await service.start()
    try:
      request = engine_lib.Request(('a',), 1)
      answer = asyncio.create_task(service.batcher.submit(request, time.monotonic() + 10))
      await asyncio.sleep(drain_after)
      service.begin_drain()
      began = time.monotonic()
      held = await service.drained(0.2)
      ranked, _, _ = await answer
      return held, ranked, time.monotonic() - began, await service.drained(1)
    finally:
      await service.stop()

  return asyncio.run(main())


def test_a_drain_waits_for_the_batches_running():
  """A batch still running holds the drain, though no request is queued or in flight."""
  held, ranked, _, done = _answer_during_a_drain(
      StubEngine(seconds=1.5), service_lib.ServeSettings(drain_quiet_seconds=0), 0.2)
  assert held is False and ranked == [{'query': 'a more', 'score': 0.0}] and done is True


def test_a_drain_starts_the_batch_waiting_for_batch_mates_at_once():
  """SIGTERM's drain starts the queued batches at once: one already waiting for batch-mates
  (max_wait_ms, 3 s here) when the drain begins does not wait on for them."""
  _, ranked, seconds, _ = _answer_during_a_drain(
      StubEngine(), service_lib.ServeSettings(max_wait_ms=3000, drain_quiet_seconds=0), 0.1)
  assert ranked == [{'query': 'a more', 'score': 0.0}] and seconds < 1.5, seconds


# ---------------------------------------------------------------------------------------------
# The page, in a browser (skipped without Debian's chromium and chromium-driver)

from tests.test_serving import ThreadServer, _texts, _type, _wait, browser  # pylint: disable=g-import-not-at-top,wrong-import-position,unused-import


def test_the_page_shows_ranks_and_says_what_it_dropped_and_why_fewer(browser):  # pylint: disable=redefined-outer-name
  from selenium.webdriver.common.by import By  # pylint: disable=g-import-not-at-top
  app, service = stub_app()
  server = ThreadServer(app)
  try:
    browser.get(server.url + '/')
    _wait(lambda: 'checkpoint step' in browser.find_element(By.ID, 'model').text)
    header = browser.find_element(By.ID, 'model').text
    assert service.engine.workdir not in header, header
    assert browser.execute_script(
        'return document.querySelector("link[rel=icon]").getAttribute("href")') == '/favicon.ico'
    for i in range(5):  # the stub reads 4 queries
      _type(browser, f'query {i}')
      _wait(lambda i=i: _texts(browser, '#session li')[-1:] == [f'query {i}']
            and 'suggestions from stub' in _texts(browser, '#status')[0], chrome=browser)
    status = _texts(browser, '#status')[0]
    assert _texts(browser, '#session li') == [f'query {i}' for i in range(1, 5)]
    assert 'the oldest query ("query 0") was dropped: the model reads the last 4' in status
    assert '5 asked: the model has no more' in status  # the stub has one suggestion
    assert _texts(browser, '#suggestions .rank') == ['1.']  # an order, not a score
  finally:
    server.stop()


def test_admin_behind_a_proxy_on_this_host_is_asked_of_the_forwarded_client():
  """Through uvicorn as the service runs it: a proxy on this host connects from loopback,
  and uvicorn takes the client from its X-Forwarded-For (trusted from loopback), so a
  forwarded outside client is refused admin without a token; loopback itself is answered."""
  app, _ = stub_app()
  server = ThreadServer(app)
  try:
    forwarded = httpx.post(server.url + '/admin/reload',
                           headers={'X-Forwarded-For': '203.0.113.5'}, timeout=10)
    assert forwarded.status_code == 403, forwarded.text
    assert httpx.post(server.url + '/admin/reload', timeout=10).status_code == 200
  finally:
    server.stop()
