"""The HTTP application: the API, the page at `/`, and how every failure is answered.

  POST /v1/suggest  {"session": ["q1", ..., "qt"], "user": optional, "k": optional 1..20}
                    -> {"suggestions": [{"query", "score", "model_score" and "sources"
                        where a ranker reordered it}, ...], "k": asked, "k_returned":
                        given (fewer where the model has no more), "session": as read
                        (normalised), "model": {"name", "step"}, "ms": server time,
                        "history": the user's earlier queries read (with a user)}
  GET  /v1/info     the model and the limits a request must keep
  GET  /healthz     200 while the process serves; /readyz 200 once a request of any size
                    runs ('warming' while other batch shapes compile) and while not draining
  GET  /metrics     Prometheus metrics
  POST /admin/reload  loads the workdir's best checkpoint, warms it up and swaps it in; only
                    from loopback, or with `Authorization: Bearer <config.serve.admin_token>`
  GET  /            the page: type queries, see suggestions; the API at /docs (Swagger UI
                    served from the swagger-ui-py package: nothing is fetched off this host)
  HEAD on any GET path: GET's status and headers, no body

Every 4xx and 5xx, the service's own and the framework's (404, 405), is JSON {"error":
message, "field": the request's part at fault or null, "request_id"}: a body that is not
JSON (malformed, not UTF-8, nested too deeply, empty) 400; a field the model cannot take 422
(an empty session, more queries than the model reads, an over-long or empty query, a control
character other than whitespace, a non-string item, k out of range, a user where the model
reads none); a body over `max_body_bytes` 413, unread; one short of its Content-Length at the
deadline 408; a full queue or a draining service 503 with Retry-After; a passed deadline 504;
anything else 500 with the request id (logged with its traceback), and the service goes on.
Every response carries X-Request-ID. No answer holds a filesystem path: the model is named by
its name and checkpoint step (the log has the workdir). The OpenAPI description carries the
model's limits (session length, words a query, whether a user is read), so a request it
allows is one the model takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
import os
import time
import urllib.parse
import uuid
from typing import Annotated, Any

import fastapi
import fastapi.openapi.utils
import pydantic
from fastapi import responses
from fastapi.openapi import docs as docs_lib
from fastapi.exceptions import RequestValidationError
from starlette import routing
from starlette.exceptions import HTTPException as StarletteHTTPException

from mtn_jax.serving import batcher as batcher_lib
from mtn_jax.serving import engine as engine_lib

logger = logging.getLogger('mtn_jax.serving')

_STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'static')
PAGE = os.path.join(_STATIC, 'index.html')
PAGE_SCRIPT = os.path.join(_STATIC, 'page.js')
FAVICON = os.path.join(_STATIC, 'favicon.svg')
# The headers of every page a browser shows: scripts from this host only (none inline on the
# page; Swagger UI's one inline start-up script on /docs), never inside another site's frame.
_PAGE_HEADERS = {'X-Content-Type-Options': 'nosniff', 'Referrer-Policy': 'no-referrer'}
_PAGE_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                "img-src 'self'; frame-ancestors 'none'")
_DOCS_POLICY = ("default-src 'self'; script-src 'self' 'unsafe-inline'; "
                "style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'")
# Swagger UI's files that /docs reads (swagger-ui-py ships its whole distribution).
_DOCS_FILES = {'swagger-ui-bundle.js': 'text/javascript', 'swagger-ui.css': 'text/css'}
DOCS_ASSETS = '/docs/assets'
# What a suggestion's score is, for each config.suggest.strategy (the API's description).
SCORES = (
    'Each suggestion\'s `score` is the value its list is ordered by, higher is better, and is '
    'comparable within one answer only (GET /v1/info `score` names the kind): a generative '
    'model\'s beam (strategy \'generate\'): the length-normalised log-probability, at most 0; '
    'minimum Bayes risk (config.decode.mbr): the expected BLEU against '
    'the other hypotheses, 0 to 1, the model\'s own score kept as `model_score`; a ranker '
    '(\'retrieve\', \'rerank\'): the ranker\'s score, unbounded; \'blend\': 1 / rank in the '
    'blend (1, 1/2, 1/3, ...); \'learned\': 1 / place in the list its presentation orders '
    '(well-formed suggestions about the session first), the learned ranker\'s score kept as '
    '`model_score`.')
RETRY_AFTER_SECONDS = 1


def _whole_number(value):
  """2.0 as 2: JSON has one number type, and JSON Schema's integer holds 2.0."""
  return int(value) if isinstance(value, float) and value.is_integer() else value


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
  k: Annotated[pydantic.StrictInt, pydantic.Field(ge=1, le=engine_lib.MAX_K),
               pydantic.BeforeValidator(_whole_number)] | None = pydantic.Field(
      None, description='Suggestions wanted (default: config.decode.top_k); a list holds at '
      'most what its strategy finds (a generative model\'s own beam: config.decode.beam_size '
      'hypotheses; the blend and the learned ranker pool more), fewer where the session\'s '
      'queries are dropped: the answer\'s k_returned says how many it has.')


class Suggestion(pydantic.BaseModel):
  query: str
  score: float = pydantic.Field(description='The value the list is ordered by, higher is '
                                'better (GET /v1/info `score` says which kind; the API\'s '
                                'description says what each is).')
  model_score: float | None = pydantic.Field(
      None, description='The score of the model that ranked the list where another order was '
      'made of it: the beam\'s where MBR reordered it, the learned ranker\'s where its '
      'presentation did (strategy \'learned\').')
  sources: list[str] | None = pydantic.Field(
      None, description='The candidate sources that proposed it, under the learned ranker '
      '(strategy \'learned\'): \'generate\' (the model\'s beam), \'history\' (the '
      'user\'s own earlier queries), ... (config.suggest.sources).')


class ModelInfo(pydantic.BaseModel):
  name: str
  step: int = pydantic.Field(description='The checkpoint\'s training step.')


class SuggestResponse(pydantic.BaseModel):
  suggestions: list[Suggestion] = pydantic.Field(description='Best first.')
  k: int = pydantic.Field(description='The suggestions asked for (the request\'s `k`, else '
                          'config.decode.top_k).')
  k_returned: int = pydantic.Field(description='The suggestions given: fewer than `k` where '
                                   'the strategy has no more (a generative model\'s own beam '
                                   'holds config.decode.beam_size hypotheses, fewer once the '
                                   'session\'s own queries are dropped).')
  session: list[str] = pydantic.Field(description='The session as the model read it '
                                      '(normalised as the training queries were: lower-case, '
                                      'single spaces).')
  model: ModelInfo
  ms: float = pydantic.Field(description='Server time, from receiving the request to '
                             'answering it.')
  history: int | None = pydantic.Field(
      None, description='The user\'s earlier queries the model was given (with a user).')


class Info(pydantic.BaseModel):
  """The model answering and the limits a request must keep."""

  name: str
  step: int
  score: str = pydantic.Field(description='What a suggestion\'s score is.')
  how: str = pydantic.Field(description='How the suggestions are made.')
  top_k: int = pydantic.Field(description='Suggestions given when a request has no `k`.')
  max_k: int
  max_session_queries: int
  max_query_words: int = pydantic.Field(description='The most words a query may hold.')
  personalises: bool = pydantic.Field(description='Whether a request may name a `user`.')
  user_facing: bool = pydantic.Field(description='True: no query of the session is '
                                     'suggested again.')


class Ready(pydantic.BaseModel):
  ready: bool
  step: int
  warming: bool = pydantic.Field(description=(
      'Batch shapes are still compiling behind the ready ones (config.serve.'
      'warm_up_background): every request is answered, padded to a compiled shape, and '
      'slower while the compiler shares the CPU.'))


class Error(pydantic.BaseModel):
  """The body of every 4xx and 5xx answer."""

  error: str = pydantic.Field(description='What went wrong, in one line.')
  field: str | None = pydantic.Field(description='The request\'s part at fault '
                                     '(\'session[2]\', \'k\', \'body\'); null where none is.')
  request_id: str | None = pydantic.Field(description='The X-Request-ID header\'s value, '
                                          'which the service\'s log names where it failed '
                                          '(500).')


def _field(loc) -> str:
  """pydantic's error location ('body', 'session', 2) as 'session[2]'."""
  parts = [p for p in loc if p != 'body']
  text = ''
  for part in parts:
    text += f'[{part}]' if isinstance(part, int) else (f'.{part}' if text else str(part))
  return text or 'body'


def _error(status: int, message: str, request: fastapi.Request | None = None,
           field: str | None = None, headers: dict | None = None,
           request_id: str | None = None) -> responses.JSONResponse:
  """Every 4xx and 5xx the service sends, its own and the framework's: `Error`."""
  if request is not None:
    request_id = getattr(request.state, 'request_id', None)
  return responses.JSONResponse({'error': message, 'field': field, 'request_id': request_id},
                                status_code=status, headers=headers)


class _Guard:
  """Outermost ASGI middleware: a request id on every request and response, bodies over the
  limit refused unread (413), the requests in flight counted (draining waits for them),
  requests counted by route and status (499 where the client went away before its body
  ended), HEAD answered wherever GET is (its headers, no body), and an unexpected exception
  answered as a 500 with the request id, the service going on."""

  def __init__(self, app, service, router):
    self.app, self.service, self.router = app, service, router

  def _answers_get(self, scope) -> bool:
    get = {**scope, 'method': 'GET'}
    return any(route.matches(get)[0] == routing.Match.FULL for route in self.router.routes)

  async def __call__(self, scope, receive, send):
    if scope['type'] != 'http':
      return await self.app(scope, receive, send)
    # FastAPI's routes answer HEAD with 405 (Starlette's own add it to GET): a HEAD is run as
    # the GET it asks about, and its body dropped, so a probe or `curl -I` sees what GET sends.
    method = scope['method']
    head = method == 'HEAD' and self._answers_get(scope)
    if head:
      scope = {**scope, 'method': 'GET'}
    request_id = uuid.uuid4().hex[:16]
    scope.setdefault('state', {})['request_id'] = request_id
    scope['state']['received'] = time.monotonic()
    service, limit = self.service, self.service.settings.max_body_bytes
    route = scope['path'] if scope['path'] in _ROUTES else 'other'
    status = {'code': 500, 'started': False, 'gone': False}

    async def send_with_id(message):
      if message['type'] == 'http.response.start':
        status['code'], status['started'] = message['status'], True
        message['headers'] = [*message.get('headers', []),
                              (b'x-request-id', request_id.encode())]
      elif head and message['type'] == 'http.response.body':
        message = {**message, 'body': b''}
      await send(message)

    async def reply(code: int, message: str, field: str | None = None, headers=None):
      response = _error(code, message, field=field, headers=headers, request_id=request_id)
      await response(scope, receive, send_with_id)

    headers = dict(scope.get('headers', []))
    length = headers.get(b'content-length')
    service.inflight += 1
    if route == '/v1/suggest':
      service.last_request = time.monotonic()
    try:
      if length is not None and (not length.isdigit() or int(length) > limit):
        # Refused before any of the body is read; the connection is closed after it.
        await reply(413, _too_large(limit), 'body', {'Connection': 'close'})
        return
      seen, complete = 0, False
      deadline = scope['state']['received'] + service.settings.deadline_ms / 1000

      async def limited_receive():
        # A body that stops short of its Content-Length would hold the request (and its
        # connection) forever: it has until the request's deadline to arrive.
        nonlocal seen, complete
        if complete:  # only the client's disconnect is left to hear of
          return await receive()
        try:
          message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.0))
        except asyncio.TimeoutError:
          raise fastapi.HTTPException(408, 'the request body did not arrive before the '
                                      'deadline (config.serve.deadline_ms)') from None
        if message['type'] == 'http.disconnect':
          # What the framework answers then (400: a body it could not read) reaches nobody.
          status['gone'] = True
        elif message['type'] == 'http.request':
          seen += len(message.get('body', b''))
          complete = not message.get('more_body', False)
          if seen > limit:
            raise fastapi.HTTPException(413, _too_large(limit))
        return message

      try:
        await self.app(scope, limited_receive, send_with_id)
      except Exception:  # pylint: disable=broad-except
        logger.exception('request %s (%s %s) failed', request_id, method, scope['path'])
        if not status['started']:
          await reply(500, 'internal error; the request id names it in the log')
    finally:
      service.inflight -= 1
      code = str(CLIENT_GONE if status['gone'] else status['code'])
      service.metrics.requests.labels(route, code).inc()
      if route == '/v1/suggest':
        service.metrics.latency.labels(code).observe(
            time.monotonic() - scope['state']['received'])


# The status counted for a request whose client went away before its body ended (nginx's code
# for a client gone, here only one gone mid-body: one gone while its answer is made is not
# heard of before the answer).
CLIENT_GONE = 499


def _too_large(limit: int) -> str:
  return f'the request body is over {limit} bytes (config.serve.max_body_bytes)'


_ROUTES = ('/', '/page.js', '/v1/suggest', '/v1/info', '/healthz', '/readyz', '/metrics',
           '/admin/reload', '/docs', '/openapi.json')


def _netloc(url: str) -> str | None:
  """The host and port of `url`, or None where it is no URL ('http://[::1')."""
  try:
    return urllib.parse.urlsplit(url).netloc
  except ValueError:
    return None


def _is_loopback(host: str | None) -> bool:
  try:
    return host is not None and ipaddress.ip_address(host).is_loopback
  except ValueError:
    return False


def _parse_error(exc: Exception) -> str:
  """Why FastAPI could not read a body as JSON, from the exception it gave up on."""
  cause = exc.__cause__
  if isinstance(cause, UnicodeDecodeError):
    return 'invalid JSON: the body is not UTF-8 text'
  if isinstance(cause, RecursionError):
    return 'invalid JSON: nested too deeply'
  return 'invalid JSON: the body could not be read'


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
      title='mtn_jax suggestions', lifespan=lifespan, docs_url=None, redoc_url=None,
      description='Next-query suggestions from a trained mtn_jax model: the lists '
      '`--mode=decode` writes for the same session and settings.\n\n' + SCORES + '\n\n'
      'Every 4xx and 5xx answer, on any path, is an `Error`: {"error", "field", '
      '"request_id"}.',
      responses={413: {'model': Error, 'description': 'The body is over '
                       'config.serve.max_body_bytes (refused unread).'},
                 500: {'model': Error, 'description': 'An internal error (the log has it).'}})
  with open(PAGE, encoding='utf-8') as f:
    page = f.read()
  with open(PAGE_SCRIPT, encoding='utf-8') as f:
    page_script = f.read()
  docs_files = {}
  for name, media_type in _DOCS_FILES.items():
    with open(os.path.join(_swagger_ui_folder(), name), 'rb') as f:
      docs_files[name] = (f.read(), media_type)
  with open(FAVICON, 'rb') as f:
    favicon = f.read()

  @app.exception_handler(RequestValidationError)
  async def invalid(request: fastapi.Request, exc: RequestValidationError):
    errors = exc.errors()
    first = errors[0] if errors else {'loc': ('body',), 'msg': 'invalid request'}
    if first.get('type') == 'json_invalid':
      return _error(400, f'invalid JSON: {first.get("ctx", {}).get("error", first["msg"])}',
                    request, 'body')
    field = _field(first['loc'])
    if field == 'body' and first.get('type') == 'missing':  # no body at all
      return _error(400, 'invalid JSON: the body is empty', request, 'body')
    if field == 'body' and isinstance(first.get('input'), bytes):
      # A body FastAPI did not parse: sent as another media type (a form, text), whatever it
      # holds; one it parsed, a JSON string or number, is no object: below.
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
    code, field, message, headers = exc.status_code, None, str(exc.detail), exc.headers
    if code == 404:
      message = f'no such path: {request.url.path[:200]} (the API is described at /docs)'
    elif code == 405:
      allowed = (headers or {}).get('Allow', '')
      if 'GET' in allowed.split(', '):  # HEAD is answered wherever GET is (`_Guard`)
        allowed += ', HEAD'
        headers = {**headers, 'Allow': allowed}
      message = (f'{request.method} is not answered at {request.url.path}; it answers '
                 f'{allowed or "another method"}')
    elif code in (408, 413):
      field = 'body'
    elif code == 400:  # FastAPI's own: a body it could not read
      field, message = 'body', _parse_error(exc)
    return _error(code, message, request, field, headers)

  retry_doc = {'Retry-After': {'description': 'Seconds to wait before retrying.',
                               'schema': {'type': 'string'}}}

  @app.post('/v1/suggest', response_model=SuggestResponse, response_model_exclude_none=True,
            responses={
                400: {'model': Error, 'description': 'The body is not JSON (not UTF-8, '
                      'malformed, nested too deeply, or empty).'},
                408: {'model': Error, 'description': 'The body did not arrive (all the '
                      'bytes its Content-Length announced) within config.serve.deadline_ms.'},
                415: {'model': Error, 'description': 'The body is not sent as '
                      'application/json.'},
                422: {'model': Error, 'description': 'A field the model cannot take; '
                      '`field` names it.'},
                503: {'model': Error, 'description': 'The queue is full, or the service is '
                      'shutting down: retry.', 'headers': retry_doc},
                504: {'model': Error, 'description': 'Not answered within '
                      'config.serve.deadline_ms.'}})
  async def suggest(body: SuggestRequest, request: fastapi.Request) -> Any:
    """Suggestions for the query after the session's last (those `--mode=decode` writes for it
    under the same protocol)."""
    received = request.state.received
    retry = {'Retry-After': str(RETRY_AFTER_SECONDS)}
    if service.draining and received >= service.drain_started:  # came after the SIGTERM
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
    return {'suggestions': ranked, 'k': checked.k, 'k_returned': len(ranked),
            'session': list(checked.session),
            'model': {k: info[k] for k in ('name', 'step')},
            'ms': round((time.monotonic() - received) * 1000, 3),
            'history': None if checked.user is None else history}

  @app.get('/v1/info', response_model=Info)
  async def info() -> Any:
    """The model answering, and the limits a request must keep."""
    return _public_info(service.engine.info())

  @app.get('/healthz')
  async def healthz() -> dict[str, str]:
    """200 while the process serves (warming up, serving or draining)."""
    return {'status': 'ok'}

  @app.get('/readyz', response_model=Ready, responses={
      503: {'model': Error, 'description': 'Draining after SIGTERM: send requests elsewhere.',
            'headers': retry_doc}})
  async def readyz(request: fastapi.Request) -> Any:
    """200 once a request of any size can run (every batch shape compiled, or with
    config.serve.warm_up_background those that hold a lone request and the largest batch,
    `warming` until the rest are) and while not draining; else 503."""
    if service.draining:
      return _error(503, 'draining', request,
                    headers={'Retry-After': str(RETRY_AFTER_SECONDS)})
    return {'ready': True, 'step': service.engine.step,
            'warming': not service.engine.warmed.is_set()}

  @app.get('/metrics', response_class=responses.PlainTextResponse, responses={
      200: {'description': 'Prometheus\' text format.',
            'content': {'text/plain': {'schema': {'type': 'string'}}}}})
  async def metrics():
    """Prometheus metrics."""
    service.metrics.queue_depth.set(service.batcher.depth)
    data, content_type = service.metrics.render()
    return responses.Response(data, media_type=content_type)

  @app.post('/admin/reload', responses={
      401: {'model': Error, 'description': 'config.serve.admin_token is set and the '
            'Authorization header does not carry it.'},
      403: {'model': Error, 'description': 'From a page of another origin, or not from '
            'loopback where no admin token is set.'}})
  async def reload(request: fastapi.Request) -> dict[str, Any]:
    """Loads the workdir's best checkpoint, compiles it and swaps it in; requests keep being
    answered by the previous model meanwhile. (The Authorization header is read from the
    request, not declared: a declared header would add a validation answer, 422, in a shape
    other than `Error`, to the API's description, one this route never gives.)"""
    authorization = request.headers.get('authorization')
    origin = request.headers.get('origin')
    if origin is not None and _netloc(origin) != request.headers.get('host'):
      # A page of another site in a browser on this host: a form's POST needs no preflight.
      return _error(403, 'admin is not answered to pages of another origin', request)
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
    return responses.HTMLResponse(page, headers={'Content-Security-Policy': _PAGE_POLICY,
                                                 **_PAGE_HEADERS})

  @app.get('/page.js', include_in_schema=False)
  async def script():
    return responses.Response(page_script, media_type='text/javascript',
                              headers=_PAGE_HEADERS)

  @app.get('/favicon.ico', include_in_schema=False)
  async def icon():
    return responses.Response(favicon, media_type='image/svg+xml',
                              headers={'Cache-Control': 'max-age=86400'})

  # Swagger UI from the swagger-ui-py package's files: nothing is fetched off this host.
  @app.get(DOCS_ASSETS + '/{name}', include_in_schema=False)
  async def docs_file(name: str, request: fastapi.Request):
    if name not in docs_files:
      return _error(404, f'no {DOCS_ASSETS}/{name}', request)
    content, media_type = docs_files[name]
    return responses.Response(content, media_type=media_type, headers={
        'Cache-Control': 'max-age=86400', **_PAGE_HEADERS})

  @app.get('/docs', include_in_schema=False)
  async def docs():
    html = docs_lib.get_swagger_ui_html(
        openapi_url='/openapi.json', title='mtn_jax suggestions: API',
        swagger_js_url=f'{DOCS_ASSETS}/swagger-ui-bundle.js',
        swagger_css_url=f'{DOCS_ASSETS}/swagger-ui.css', swagger_favicon_url='/favicon.ico')
    html.headers.update({'Content-Security-Policy': _DOCS_POLICY, **_PAGE_HEADERS})
    return html

  def openapi() -> dict:
    if app.openapi_schema is None:
      schema = fastapi.openapi.utils.get_openapi(
          title=app.title, version=app.version, description=app.description,
          routes=app.routes)
      app.openapi_schema = _with_model_limits(schema, service.engine)
    return app.openapi_schema

  app.openapi = openapi
  app.add_middleware(_Guard, service=service, router=app.router)
  return app


def _swagger_ui_folder() -> str:
  import swagger_ui  # pylint: disable=g-import-not-at-top
  return os.path.join(os.path.dirname(os.path.abspath(swagger_ui.__file__)), 'static')


def _public_info(info: dict) -> dict:
  """The engine's info as clients see it: no filesystem path (the log has the workdir)."""
  return {**{k: v for k, v in info.items() if k != 'workdir'}, 'max_k': engine_lib.MAX_K}


def _with_model_limits(schema: dict, engine) -> dict:
  """The OpenAPI description with the limits of the model answering: a request the
  description allows is one the model takes (the engine's `check` enforces the same)."""
  request = schema['components']['schemas']['SuggestRequest']['properties']
  session = request['session']
  session['minItems'], session['maxItems'] = 1, engine.max_session_queries
  session['items'].update(minLength=1, pattern=engine_lib.query_pattern(engine.max_query_words))
  if engine.personalises:
    for option in request['user']['anyOf']:
      if option.get('type') == 'string':
        option['pattern'] = engine_lib.TEXT_PATTERN
  else:
    del request['user']  # refused by a model that reads no user
  return schema
