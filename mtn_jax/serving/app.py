"""The HTTP application: the API, the page at `/`, and how every failure is answered.

  POST /v1/suggest  {"session": ["q1", ..., "qt"], "user": optional, "k": optional 1..20}
                    -> {"suggestions": [{"query", "score"}, ...], "session": as read
                        (normalised), "model": {"name", "step", "workdir"}, "ms": server
                        time, "history": the user's earlier queries read (with a user)}
  GET  /v1/info     the model and the limits a request must keep
  GET  /healthz     200 while the process serves; /readyz 200 once warm and while not draining
  GET  /metrics     Prometheus metrics
  POST /admin/reload  loads the workdir's best checkpoint, warms it up and swaps it in; only
                    from loopback, or with `Authorization: Bearer <config.serve.admin_token>`
  GET  /            the page: type queries, see suggestions; OpenAPI at /docs

Every error is JSON {"error": message, "field": the request's part at fault (4xx), "request_id"}:
invalid JSON 400; a field the model cannot take 422 (an empty session, more queries than the
model reads, an over-long or empty query, a non-string item, k out of range, a user where the
model reads none); a body over `max_body_bytes` 413, unread; a full queue or a draining
service 503 with Retry-After; a passed deadline 504; anything else 500 with the request id
(logged with its traceback), and the service goes on. Every response carries X-Request-ID.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import logging
import os
import time
import uuid
from typing import Annotated, Any

import fastapi
import pydantic
from fastapi import responses
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from mtn_jax.serving import batcher as batcher_lib
from mtn_jax.serving import engine as engine_lib

logger = logging.getLogger('mtn_jax.serving')

PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'static', 'index.html')
RETRY_AFTER_SECONDS = 1


class SuggestRequest(pydantic.BaseModel):
  """A session so far, oldest query first; suggestions are for the query after its last."""

  model_config = pydantic.ConfigDict(extra='forbid', json_schema_extra={
      'examples': [{'session': ['cheap flights', 'cheap flights to paris'], 'k': 5}]})

  session: list[pydantic.StrictStr] = pydantic.Field(
      description='The queries typed so far, oldest first (at most the model\'s '
      'max_session_queries, each at most max_query_words words: GET /v1/info).')
  user: Annotated[pydantic.StrictStr, pydantic.Field(min_length=1, max_length=200)] | None = (
      pydantic.Field(None, description='Who typed it, for a model that reads a user\'s earlier '
                     'queries; refused by one that reads none.'))
  k: pydantic.StrictInt | None = pydantic.Field(
      None, ge=1, le=engine_lib.MAX_K,
      description='Suggestions wanted (default: config.decode.top_k); a generative model has '
      'at most its beam\'s hypotheses (config.decode.beam_size), fewer where the session\'s '
      'queries are dropped.')


class Suggestion(pydantic.BaseModel):
  query: str
  score: float = pydantic.Field(description='The value the list is ordered by (GET /v1/info '
                                'says which).')
  model_score: float | None = pydantic.Field(
      None, description='The model\'s own score where MBR reordered the list.')


class ModelInfo(pydantic.BaseModel):
  name: str
  step: int
  workdir: str


class SuggestResponse(pydantic.BaseModel):
  suggestions: list[Suggestion]
  session: list[str] = pydantic.Field(description='The session as the model read it '
                                      '(normalised as the training queries were: lower-case, '
                                      'single spaces).')
  model: ModelInfo
  ms: float = pydantic.Field(description='Server time, from receiving the request to '
                             'answering it.')
  history: int | None = pydantic.Field(
      None, description='The user\'s earlier queries the model was given (with a user).')


class Error(pydantic.BaseModel):
  error: str
  field: str | None = None
  request_id: str | None = None


def _field(loc) -> str:
  """pydantic's error location ('body', 'session', 2) as 'session[2]'."""
  parts = [p for p in loc if p != 'body']
  text = ''
  for part in parts:
    text += f'[{part}]' if isinstance(part, int) else (f'.{part}' if text else str(part))
  return text or 'body'


def _error(status: int, message: str, request: fastapi.Request | None = None,
           field: str | None = None, headers: dict | None = None) -> responses.JSONResponse:
  body = {'error': message}
  if field is not None:
    body['field'] = field
  if request is not None:
    body['request_id'] = getattr(request.state, 'request_id', None)
  return responses.JSONResponse(body, status_code=status, headers=headers)


class _Guard:
  """Outermost ASGI middleware: a request id on every request and response, bodies over the
  limit refused unread (413), the requests in flight counted (draining waits for them),
  requests counted by route and status, and an unexpected exception answered as a 500 with
  the request id, the service going on."""

  def __init__(self, app, service):
    self.app, self.service = app, service

  async def __call__(self, scope, receive, send):
    if scope['type'] != 'http':
      return await self.app(scope, receive, send)
    request_id = uuid.uuid4().hex[:16]
    scope.setdefault('state', {})['request_id'] = request_id
    scope['state']['received'] = time.monotonic()
    service, limit = self.service, self.service.settings.max_body_bytes
    route = scope['path'] if scope['path'] in _ROUTES else 'other'
    status = {'code': 500, 'started': False}

    async def send_with_id(message):
      if message['type'] == 'http.response.start':
        status['code'], status['started'] = message['status'], True
        message['headers'] = [*message.get('headers', []),
                              (b'x-request-id', request_id.encode())]
      await send(message)

    async def reply(code: int, body: dict, headers=()):
      payload = json.dumps({**body, 'request_id': request_id}).encode()
      await send_with_id({'type': 'http.response.start', 'status': code, 'headers': [
          (b'content-type', b'application/json'), (b'content-length', str(len(payload)).encode()),
          *headers]})
      await send_with_id({'type': 'http.response.body', 'body': payload})

    headers = dict(scope.get('headers', []))
    length = headers.get(b'content-length')
    service.inflight += 1
    service.last_request = time.monotonic()
    try:
      if length is not None and (not length.isdigit() or int(length) > limit):
        # Refused before any of the body is read; the connection is closed after it.
        await reply(413, {'error': f'the request body is over {limit} bytes '
                                   '(config.serve.max_body_bytes)', 'field': 'body'},
                    [(b'connection', b'close')])
        return
      seen = 0

      async def limited_receive():
        nonlocal seen
        message = await receive()
        if message['type'] == 'http.request':
          seen += len(message.get('body', b''))
          if seen > limit:
            raise fastapi.HTTPException(413, f'the request body is over {limit} bytes '
                                             '(config.serve.max_body_bytes)')
        return message

      try:
        await self.app(scope, limited_receive, send_with_id)
      except Exception:  # pylint: disable=broad-except
        logger.exception('request %s (%s %s) failed', request_id, scope['method'], scope['path'])
        if not status['started']:
          await reply(500, {'error': 'internal error; the request id names it in the log'})
    finally:
      service.inflight -= 1
      service.metrics.requests.labels(route, str(status['code'])).inc()
      if route == '/v1/suggest':
        service.metrics.latency.observe(time.monotonic() - scope['state']['received'])


_ROUTES = ('/', '/v1/suggest', '/v1/info', '/healthz', '/readyz', '/metrics', '/admin/reload',
           '/docs', '/openapi.json')


def _is_loopback(host: str | None) -> bool:
  try:
    return host is not None and ipaddress.ip_address(host).is_loopback
  except ValueError:
    return False


def create_app(service) -> fastapi.FastAPI:
  """The application of `service` (`mtn_jax.serving.service.Service`: its engine, batcher,
  settings, metrics, and its draining and reload)."""

  @contextlib.asynccontextmanager
  async def lifespan(app):
    del app
    await service.start()
    try:
      yield
    finally:
      await service.stop()

  app = fastapi.FastAPI(
      title='mtn_jax suggestions', lifespan=lifespan,
      description='Next-query suggestions from a trained mtn_jax model: the lists '
      '`--mode=decode` writes for the same session and settings.',
      responses={400: {'model': Error}, 413: {'model': Error}, 415: {'model': Error},
                 422: {'model': Error},
                 500: {'model': Error}, 503: {'model': Error}, 504: {'model': Error}})
  with open(PAGE, encoding='utf-8') as f:
    page = f.read()

  @app.exception_handler(RequestValidationError)
  async def invalid(request: fastapi.Request, exc: RequestValidationError):
    errors = exc.errors()
    first = errors[0] if errors else {'loc': ('body',), 'msg': 'invalid request'}
    if first.get('type') == 'json_invalid':
      return _error(400, f'invalid JSON: {first.get("ctx", {}).get("error", first["msg"])}',
                    request, 'body')
    field = _field(first['loc'])
    if field == 'body' and isinstance(first.get('input'), (bytes, str)):
      # A body FastAPI did not parse: not sent as application/json.
      try:
        json.loads(first['input'])
      except ValueError as e:
        return _error(400, f'invalid JSON: {e}', request, 'body')
      return _error(415, 'send the body as Content-Type: application/json', request, 'body')
    if field == 'body':
      return _error(422, 'the body must be a JSON object like {"session": ["q1", "q2"]}',
                    request, 'body')
    return _error(422, f'{field}: {first["msg"]}', request, field)

  @app.exception_handler(engine_lib.BadInput)
  async def bad_input(request: fastapi.Request, exc: engine_lib.BadInput):
    return _error(422, str(exc), request, exc.field)

  @app.exception_handler(StarletteHTTPException)
  async def http_error(request: fastapi.Request, exc: StarletteHTTPException):
    field = 'body' if exc.status_code == 413 else None
    return _error(exc.status_code, str(exc.detail), request, field, exc.headers)

  @app.post('/v1/suggest', response_model=SuggestResponse, response_model_exclude_none=True)
  async def suggest(body: SuggestRequest, request: fastapi.Request) -> Any:
    """Suggestions for the query after the session's last (those `--mode=decode` writes)."""
    received = request.state.received
    retry = {'Retry-After': str(RETRY_AFTER_SECONDS)}
    if service.draining:
      return _error(503, 'the service is shutting down', request,
                    headers={**retry, 'Connection': 'close'})
    checked = service.engine.check(body.session, body.k, body.user)
    deadline = received + service.settings.deadline_ms / 1000
    try:
      ranked, info, history = await service.batcher.submit(checked, deadline)
    except batcher_lib.QueueFull:
      return _error(503, f'too many requests waiting ({service.settings.queue_bound}, '
                    'config.serve.queue_bound): retry', request, headers=retry)
    except batcher_lib.DeadlineExceeded:
      return _error(504, f'not answered within {service.settings.deadline_ms:g} ms '
                    '(config.serve.deadline_ms)', request)
    return {'suggestions': ranked, 'session': list(checked.session),
            'model': {k: info[k] for k in ('name', 'step', 'workdir')},
            'ms': round((time.monotonic() - received) * 1000, 3),
            'history': None if checked.user is None else history}

  @app.get('/v1/info')
  async def info() -> dict:
    """The model answering, and the limits a request must keep."""
    return {**service.engine.info(), 'max_k': engine_lib.MAX_K}

  @app.get('/healthz')
  async def healthz() -> dict:
    """200 while the process serves (warming up, serving or draining)."""
    return {'status': 'ok'}

  @app.get('/readyz')
  async def readyz(request: fastapi.Request):
    """200 once every batch shape is compiled and while not draining; else 503."""
    if service.draining:
      return _error(503, 'draining', request)
    return {'ready': True, 'step': service.engine.step}

  @app.get('/metrics')
  async def metrics():
    """Prometheus metrics."""
    service.metrics.queue_depth.set(service.batcher.depth)
    data, content_type = service.metrics.render()
    return responses.Response(data, media_type=content_type)

  @app.post('/admin/reload')
  async def reload(request: fastapi.Request,
                   authorization: Annotated[str | None, fastapi.Header()] = None):
    """Loads the workdir's best checkpoint, compiles it and swaps it in; requests keep being
    answered by the previous model meanwhile."""
    token = service.settings.admin_token
    if token:
      if not hmac.compare_digest((authorization or '').encode(), f'Bearer {token}'.encode()):
        return _error(401, 'admin needs Authorization: Bearer <config.serve.admin_token>',
                      request, headers={'WWW-Authenticate': 'Bearer'})
    elif not _is_loopback(request.client.host if request.client else None):
      return _error(403, 'admin is answered on loopback only (set config.serve.admin_token to '
                    'allow other clients)', request)
    return await service.reload()

  @app.get('/', response_class=responses.HTMLResponse, include_in_schema=False)
  async def index():
    return responses.HTMLResponse(page, headers={
        'Content-Security-Policy': "default-src 'self'; script-src 'self' 'unsafe-inline'; "
                                   "style-src 'self' 'unsafe-inline'; img-src 'self'"})

  app.add_middleware(_Guard, service=service)
  return app
