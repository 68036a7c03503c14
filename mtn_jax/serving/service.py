"""`--mode=serve`: the service's life, from loading the model to the last answer.

1. `Engine.load`: the workdir's best checkpoint through the suggestion pipeline, every batch
   shape run once (compiled) before anything listens, or with config.serve.warm_up_background
   those that hold any request, the others compiled while it serves.
2. uvicorn serves `app.create_app(Service)` on config.serve.host:port (0: a free port; the
   line `Serving on http://HOST:PORT` says which, once connections are accepted).
3. SIGHUP, or POST /admin/reload: the workdir's best checkpoint is loaded and warmed up on a
   thread of its own while the old model answers; then the new one is swapped in between
   two batches. A reload that fails leaves the old model serving (and says why).
4. SIGTERM (or Ctrl-C): the service keeps listening, /readyz says 503, new suggestion
   requests get 503 with Retry-After (those that came before the signal are answered), the
   queued batches start at once; once the requests in flight are answered and no
   suggestion request came for config.serve.drain_quiet_seconds (counted from the signal
   at the earliest; /readyz polls do not count), or once
   config.serve.drain_seconds have passed, it stops listening and exits 0. A second Ctrl-C
   stops at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import gc
import os
import signal
import socket
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections
import uvicorn

from mtn_jax import errors
from mtn_jax.inference import trained
from mtn_jax.serving import app as app_lib
from mtn_jax.serving import batcher as batcher_lib
from mtn_jax.serving import engine as engine_lib
from mtn_jax.serving import history as history_lib
from mtn_jax.serving import monitoring


@dataclasses.dataclass(frozen=True)
class ServeSettings:
  """The keys of config.serve that the service reads when it starts (configs/default.py says
  what each is; these defaults are its, for services built without a config). The engine
  reads its own (`max_batch`, `warm_up_threads`) where it is built, `serve()` whether to warm
  up in the background."""

  host: str = '127.0.0.1'
  port: int = 8080
  max_batch: int = 8
  workers: int = 0  # 0: by the backend (`default_workers`)
  max_wait_ms: float = 0.0
  queue_bound: int = 64
  deadline_ms: float = 2000.0
  drain_seconds: float = 10.0
  drain_quiet_seconds: float = 0.5
  max_body_bytes: int = 16384
  history_db: str = 'serve/histories.sqlite'
  history_per_user: int = 1000
  compile_cache: str = 'serve/compile_cache'
  admin_token: str = ''

  def __post_init__(self):
    if not self.workers:
      object.__setattr__(self, 'workers', default_workers(jax.default_backend()))

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> ServeSettings:
    return cls(**{f.name: config.serve[f.name] for f in dataclasses.fields(cls)})

  @property
  def history_wait_seconds(self) -> float:
    """How long the users' histories may hold a request up: half its deadline, the other
    half left to the model."""
    return self.deadline_ms / 2000


def default_workers(backend: str) -> int:
  """Batches run at once where config.serve.workers is 0. On a CPU two: the compiled programs
  release Python's lock, so a second batch computes on another core while the first does. On
  an accelerator one: a batch's cost there is the host's Python around short device calls,
  which two batches only take turns at, each waiting for the other's (docs/PERFORMANCE.md,
  the service on the GPU)."""
  return 2 if backend == 'cpu' else 1


def _say(text: str) -> None:
  print(text, flush=True)


class Service:
  """The engine answering, its batcher, the users' histories, the metrics, and the state a
  reload or SIGTERM changes.

  Args:
    engine: answers batches (`engine.Engine`, or anything with the attributes of it that the
      service and its app read: tests/stub_server.py's engine has them).
    loader: () -> a new warmed-up engine, for reloads (None: reloads are refused).
    store: the users' histories (None: none kept).
  """

  def __init__(self, engine, settings: ServeSettings,
               store: history_lib.HistoryStore | None = None,
               loader: Callable[[], object] | None = None,
               compilations: Callable[[], int] = engine_lib.compilations, log=_say):
    self.engine, self.settings, self.store = engine, settings, store
    self.loader, self.log = loader, log
    self.metrics = monitoring.Metrics(settings.max_batch, compilations)
    self.metrics.model_step.set(engine.step)
    self.batcher = batcher_lib.Batcher(
        self._run, prepare=None if store is None else self._with_histories,
        prepares=lambda request: request.user is not None,
        max_batch=settings.max_batch, workers=settings.workers,
        max_wait=settings.max_wait_ms / 1000, queue_bound=settings.queue_bound,
        on_batch=self._on_batch, on_depth=self.metrics.queue_depth.set,
        on_unheard=lambda e: self.log(f'A request whose caller had stopped waiting (its '
                                      f'deadline passed, or it went) failed: '
                                      f'{type(e).__name__}: {e}'))
    self.draining = False
    self.inflight = 0  # HTTP requests being answered (`app._Guard` counts them)
    self.last_request = 0.0  # time.monotonic() when the latest POST /v1/suggest came
    self.drain_started = 0.0  # time.monotonic() at SIGTERM
    self._reload_lock: asyncio.Lock | None = None
    self._histories_failed_until = 0.0  # time.monotonic(): the store is not asked before

  async def start(self) -> None:
    self._reload_lock = asyncio.Lock()
    self.batcher.start()

  async def stop(self) -> None:
    stop_warming = getattr(self.engine, 'stop_warming', None)
    if stop_warming is not None:  # off the event loop: it may wait for a compilation
      await asyncio.to_thread(stop_warming, self.settings.drain_seconds)
    await self.batcher.stop()
    if self.store is not None:
      self.store.close()

  def _on_batch(self, size: int, seconds: float) -> None:
    self.metrics.batch_size.observe(size)
    self.metrics.batch_seconds.observe(seconds)

  def _with_histories(self, requests: Sequence[engine_lib.Request]
                      ) -> list[engine_lib.Request]:
    """On the batcher's `prepare` thread, batches in the order they came: each request's
    user's earlier queries read, and its session recorded. Where the database fails (another
    process holding it locked past the store's wait, a full disk), the request is answered
    without the user's past (its `history` 0), and so is every request for the next
    `history_wait_seconds` without asking the store again: at most one wait a while, however
    many users a batch holds or batches queue. Each such request is counted, each failure
    logged."""
    prepared = []
    for request in requests:
      if request.user is not None:
        if time.monotonic() < self._histories_failed_until:
          self.metrics.history_errors.inc()
        else:
          try:
            request = dataclasses.replace(
                request, history=self.store.observe(request.user, request.session))
          except sqlite3.Error as e:
            self._histories_failed_until = (time.monotonic()
                                            + self.settings.history_wait_seconds)
            self.metrics.history_errors.inc()
            self.log(f"Users' histories ({self.store.path}) failed: {e}; requests answered "
                     f'without their user\'s past for {self.settings.history_wait_seconds:g} '
                     's.')
      prepared.append(request)
    return prepared

  def _run(self, requests: Sequence[engine_lib.Request]) -> list[tuple[list, dict, int]]:
    """On a worker thread: the batch run by the engine answering now, with the model's
    info and the number of each request's user's earlier queries it read (the store may keep
    more than the pipeline reads)."""
    engine = self.engine  # a reload swaps it between batches
    info = engine.info()
    return [(ranked, info, min(len(request.history), engine.past_read))
            for ranked, request in zip(engine.run(requests), requests)]

  async def reload(self) -> dict:
    """Loads and warms a new engine off the event loop, then swaps it in."""
    if self.loader is None:
      return {'reloaded': False, 'error': 'this service has no loader'}
    async with self._reload_lock:
      if self.draining:  # the process is about to exit: a new model would answer nothing
        return {'reloaded': False, 'step': self.engine.step, 'error': 'draining'}
      old, started = self.engine, time.monotonic()
      self.log(f'Reloading the best checkpoint of {old.workdir} ...')
      try:
        # A thread of its own: the batches keep running on the worker threads meanwhile.
        new = await _in_daemon_thread(self.loader)
      except Exception as e:  # pylint: disable=broad-except
        self.metrics.reloads.labels('failed').inc()
        self.log(f'Reload failed, step {old.step} still serving: {e}')
        # The answer names the error's kind alone: a load's messages name files (no
        # checkpoint in a folder, a damaged ranker file), and no answer holds a path.
        return {'reloaded': False, 'step': old.step,
                'error': f"the load failed ({type(e).__name__}); the service's log has why"}
      self.engine = new
      stop_warming = getattr(old, 'stop_warming', None)
      if stop_warming is not None:  # a background warm-up of the old model compiles no more
        stop_warming()
      self.metrics.model_step.set(new.step)
      self.metrics.reloads.labels('ok').inc()
      seconds = time.monotonic() - started
      self.log(f'Reloaded: step {old.step} -> {new.step} in {seconds:.1f} s.')
      return {'reloaded': True, 'previous_step': old.step, 'step': new.step,
              'seconds': round(seconds, 3)}

  def begin_drain(self) -> None:
    self.draining, self.drain_started = True, time.monotonic()
    self.batcher.drain()
    self.metrics.draining.set(1)

  async def drained(self, timeout: float) -> bool:
    """Waits until no request is in flight and, for a moment since the drain began, no
    suggestion request came (True), or `timeout` seconds pass (False). Meanwhile the
    service listens and answers: /readyz and new suggestion requests 503 with Retry-After,
    so that a load balancer polling readiness sees the 503 (its polls do not prolong the
    drain), and connections already made are answered rather than reset."""
    end = time.monotonic() + timeout
    quiet = min(self.settings.drain_quiet_seconds, timeout / 4)
    while True:
      now = time.monotonic()
      busy = self.inflight > 0 or self.batcher.depth or self.batcher.running
      if not busy and now - max(self.last_request, self.drain_started) >= quiet:
        return True
      if now >= end:
        return False
      await asyncio.sleep(0.02)


def _in_daemon_thread(function: Callable[[], Any]) -> asyncio.Future:
  """`function()` on a daemon thread, awaitable: unlike the loop's executor, which the
  interpreter waits for at exit, a reload still loading when SIGTERM comes does not hold the
  process past `config.serve.drain_seconds`."""
  loop = asyncio.get_running_loop()
  future = loop.create_future()

  def settle(result, error) -> None:
    if not future.done():
      if error is None:
        future.set_result(result)
      else:
        future.set_exception(error)

  def target() -> None:
    try:
      result, error = function(), None
    except BaseException as e:  # pylint: disable=broad-except
      # Even SystemExit: an unsettled future would hold the reload lock for good. As an
      # ordinary error, so that it fails the reload and not the event loop.
      result, error = None, (e if isinstance(e, Exception)
                             else RuntimeError(f'the load stopped: {e!r}'))
    try:
      loop.call_soon_threadsafe(settle, result, error)
    except RuntimeError:  # the loop has closed: the service stopped meanwhile
      pass

  threading.Thread(target=target, daemon=True, name='reload').start()
  return future


class _Server(uvicorn.Server):
  """uvicorn, with SIGTERM and SIGINT draining the service and SIGHUP reloading it."""

  def __init__(self, config: uvicorn.Config, service: Service, url: str):
    super().__init__(config)
    self.service, self.url = service, url
    self._tasks: set[asyncio.Task] = set()
    self.address_lost = False  # another socket listened on the address first

  @contextlib.contextmanager
  def capture_signals(self):
    if threading.current_thread() is not threading.main_thread():
      yield
      return
    loop = asyncio.get_running_loop()
    handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    for sig in handled:
      loop.add_signal_handler(sig, self._signal, sig)
    try:
      yield
    finally:
      for sig in handled:
        loop.remove_signal_handler(sig)

  def _spawn(self, coroutine) -> None:
    task = asyncio.get_running_loop().create_task(coroutine)
    self._tasks.add(task)
    task.add_done_callback(self._tasks.discard)

  def _signal(self, sig: int) -> None:
    if sig == signal.SIGHUP:
      self._spawn(self.service.reload())
      return
    if self.service.draining:
      if sig == signal.SIGINT:  # a second Ctrl-C: stop now
        self.should_exit = self.force_exit = True
      return
    self._spawn(self._drain(signal.Signals(sig).name))

  async def _drain(self, name: str) -> None:
    service, limit = self.service, self.service.settings.drain_seconds
    started = time.monotonic()
    service.log(f'{name}: draining (up to {limit:g} s): no new requests, answering '
                f'{service.inflight} in flight.')
    service.begin_drain()
    # Keep a little of the time for closing the connections and the history database.
    done = await service.drained(max(limit * 0.9 - 0.1, 0.0))
    left = max(limit - (time.monotonic() - started), 0.1)
    self.config.timeout_graceful_shutdown = left
    if not done:
      service.log(f'Suggestion requests still coming after {limit:g} s ({service.inflight} in '
                  'flight): stopping anyway.')
    self.should_exit = True

  async def startup(self, sockets=None) -> None:
    # Two sockets with SO_REUSEADDR may both be bound to one address until one listens (two
    # services started together, each loading its model): the second's listen fails, and
    # uvloop then closes its socket without a word, leaving a service that would say it
    # serves and holds no socket; asyncio's loop raises instead.
    try:
      await super().startup(sockets=sockets)
    except OSError as e:
      if e.errno != errno.EADDRINUSE:
        raise
      await self.lifespan.shutdown()  # as uvicorn does where it binds the address itself
      self.address_lost, self.should_exit = True, True
      return
    self.address_lost = self.started and not all(map(_listening, sockets or ()))
    if self.address_lost:
      self.should_exit = True
    elif self.started:
      self.service.log(f'Serving on {self.url} (POST /v1/suggest, the page at /, /docs; '
                       f'{self.service.settings.workers} worker(s)).')


def _bind(host: str, port: int) -> socket.socket:
  """A socket bound to `host`:`port` (not yet listening: a connection is refused until the
  server runs), or an error naming the two keys and why the system refused them."""
  try:
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                        flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
  except OSError as e:
    raise errors.Error(_cannot_listen(host, port, e.strerror or str(e))) from None
  sock.set_inheritable(True)
  return sock


def _cannot_listen(host: str, port: int, why: str) -> str:
  return f'config.serve.host, port = {host!r}, {port}: cannot listen there ({why})'


def _listening(sock: socket.socket) -> bool:
  try:
    return bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
  except OSError:  # closed
    return False


def describe(engine: engine_lib.Engine, seconds: float) -> str:
  """The line that says what was loaded and how long loading and warming it up took."""
  info = engine.info()
  protocol = 'the user-facing' if engine.exclude_session_queries else "the paper's"
  shapes = (f'batch sizes {", ".join(map(str, engine.sizes))} x session lengths '
            f'{", ".join(map(str, engine.widths))}')
  if engine.warmed.is_set():
    warmed = f'{shapes} compiled in {seconds:.1f} s on {engine.warm_threads} thread(s)'
  else:
    warmed = (f'{shapes}: the pairs that hold any request compiled in {seconds:.1f} s, the '
              'others compiling in the background')
  return (f'{info["name"]} (checkpoint step {info["step"]}; {info["how"]}; score = '
          f'{info["score"]}), {warmed} ({engine_lib.compilations()} programs, '
          f'{engine_lib.cache_hits()} read from the compilation cache); {protocol} protocol.')


def build(config: ml_collections.ConfigDict, workdir: str, log=_say) -> Service:
  """The service of `workdir`'s best checkpoint, warmed up (not yet serving)."""
  settings = ServeSettings.from_config(config)
  # Said once the model has loaded: a workdir with no checkpoint keeps no program.
  cache_note = []
  trained.keep_compiled_programs(workdir, settings.compile_cache, cache_note.append)
  started = time.time()
  engine = engine_lib.Engine.load(config, workdir, log=log,
                                  background=bool(config.serve.warm_up_background))
  for line in cache_note:
    log(line)
  log(describe(engine, time.time() - started))
  store = None
  if settings.history_db and engine.personalises:
    path = os.path.join(os.path.abspath(workdir), settings.history_db)
    try:
      # At least what the pipeline reads of a user's past, as evaluation and decode read it.
      store = history_lib.HistoryStore(path, max(settings.history_per_user, engine.past_read),
                                       engine.max_session_queries,
                                       busy_seconds=settings.history_wait_seconds)
    except (sqlite3.Error, OSError) as e:
      engine.stop_warming(settings.drain_seconds)  # no compiler left as the process ends
      raise errors.Error(f"config.serve.history_db: cannot keep users' histories in {path} "
                         f"({e}): a path this process can write, or '' to keep none") from None
    log(f'Users\' histories: {path}')
  return Service(engine, settings, store,
                 loader=lambda: engine_lib.Engine.load(config, workdir, log=log), log=log)


def serve(config: ml_collections.ConfigDict, workdir: str) -> None:
  """`--mode=serve` (see the module docstring); returns once drained. The address is taken
  before the model loads: a port in use fails at once, not after the warm-up."""
  settings = ServeSettings.from_config(config)
  sock = _bind(settings.host, settings.port)
  # Until the service listens (and handles it), SIGHUP would end the process: the model
  # loading is the latest checkpoint already.
  signal.signal(signal.SIGHUP, signal.SIG_IGN)
  run(build(config, workdir), sock)


def run(service: Service, sock: socket.socket | None = None) -> None:
  """Serves `service` on `sock` (else its settings' host and port) until a signal drains
  it."""
  settings = service.settings
  if sock is None:
    sock = _bind(settings.host, settings.port)
  host, port = sock.getsockname()[:2]
  url = f'http://{host if ":" not in host else f"[{host}]"}:{port}'
  uv_config = uvicorn.Config(app_lib.create_app(service), log_level='warning',
                             access_log=False, lifespan='on',
                             timeout_graceful_shutdown=settings.drain_seconds,
                             timeout_keep_alive=5)
  server = _Server(uv_config, service, url)
  # Everything loaded so far (JAX, the model, the compiled programs: a great many objects)
  # lives as long as the process: out of the collector's sight, a full collection no longer
  # walks them in the middle of a request, which held up the tail latency
  # (docs/notes/2026-11-27-figures-from-code-comments.md).
  gc.collect()
  gc.freeze()
  server.run(sockets=[sock])
  if server.address_lost:
    raise errors.Error(_cannot_listen(host, port, 'another process took the address while '
                                      'this one loaded'))
  service.log('Stopped.')
  sys.stdout.flush()
