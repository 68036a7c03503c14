"""The model side of the service: a workdir's suggestion pipeline, warmed up for every batch
shape it will run, and the checks a request's session must pass.

Every batch is padded to one of a fixed set of sizes (the powers of two below `max_batch`,
and `max_batch`) and its sessions to one of a fixed set of lengths (the powers of two below
the model's `max_session_queries`, and that), the first that holds its longest session, so
the programs a request can need are known in advance: `warm_up` runs each pair once, and
after that no request compiles. The service is ready once the pairs that hold any request are
compiled (config.serve.warm_up_background; the others follow on a thread, and until then a
batch runs padded to a compiled pair) or, without it, once every pair is. Padding a session of 3
queries to 4 rather than to the model's 16 makes the encoders and the copy attention of each
beam step read a quarter of the slots (docs/notes/2026-11-27-figures-from-code-comments.md).
The models are causal over queries and rows are independent, so the padding changes no
suggestion: the lists are those `--mode=decode` writes for the same session and protocol.

This holds for config.suggest.strategy 'generate' (a generative model's beam, or a ranker's
pool entries), 'retrieve', 'blend' and 'learned' (the generator teacher-forces the pooled
candidates in packed rows of fixed shapes, `teacher_forcing`). With 'rerank', the ranker
scores candidate lists whose lengths vary with the request (`pipeline.Rankers.score_lists`
pads them to multiples of 8), so a list longer than any seen so far still compiles once.
"""

from __future__ import annotations

import dataclasses
import os
from concurrent import futures
import threading
import time
from collections.abc import Sequence

import jax
import ml_collections

from mtn_jax.data import aol_log
from mtn_jax.inference import inputs
from mtn_jax.inference import pipeline as pipeline_lib
from mtn_jax.inference import suggest
from mtn_jax.inference.inputs import Context

MAX_K = 20  # the most suggestions a request may ask for
# A query or a user holds none of `inputs.refused_character`'s characters. The OpenAPI
# description names the controls alone (a surrogate range is no pattern a Rust or Go validator
# compiles).
_CONTROL = aol_log.CONTROL_CHARACTERS
TEXT_PATTERN = f'^[^{_CONTROL}]*$'  # a user, in the OpenAPI description
# The characters str.split() separates words at, spelt out: `\s` differs between Python and
# ECMA-262 (U+001C..U+001F, U+0085, U+FEFF).
_SPACE = (r'\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f'
          r'\u3000')


def query_pattern(max_words: int) -> str:
  """A query the model takes, for the OpenAPI description: 1 to `max_words` words of
  characters `check` accepts."""
  word, space = f'[^{_SPACE}{_CONTROL}]+', f'[{_SPACE}]'
  return f'^{space}*{word}({space}+{word}){{0,{max_words - 1}}}{space}*$'


# Every program JAX lowers for the first time (a new function, or a new shape of one) records
# this event: their count is the number of compilations, the persistent cache's hits included.
_LOWERING_EVENT = '/jax/core/compile/jaxpr_to_mlir_module_duration'
# And each program read back from the persistent compilation cache instead of compiled.
_CACHE_HIT_EVENT = '/jax/compilation_cache/cache_hits'
_compilations = 0
_cache_hits = 0
_listening = False
_lock = threading.Lock()


def _count(event: str, duration: float, **kwargs) -> None:
  del duration, kwargs
  global _compilations
  if event == _LOWERING_EVENT:
    with _lock:
      _compilations += 1


def _count_hit(event: str, **kwargs) -> None:
  del kwargs
  global _cache_hits
  if event == _CACHE_HIT_EVENT:
    with _lock:
      _cache_hits += 1


def compilations() -> int:
  """Programs JAX has compiled in this process since the first engine was made."""
  return _compilations


def cache_hits() -> int:
  """Of `compilations()`, those read back from the persistent compilation cache."""
  return _cache_hits


def _listen() -> None:
  global _listening
  with _lock:
    if not _listening:
      jax.monitoring.register_event_duration_secs_listener(_count)
      jax.monitoring.register_event_listener(_count_hit)
      _listening = True


class BadInput(ValueError):
  """A request the model cannot take; `field` names the part at fault ('session[2]', 'k')."""

  def __init__(self, field: str, message: str):
    super().__init__(f'{field}: {message}')
    self.field, self.message = field, message


def warm_up_threads(config: ml_collections.ConfigDict) -> int:
  """config.serve.warm_up_threads, 0 read as one per core this process may use."""
  return int(config.serve.warm_up_threads) or len(os.sched_getaffinity(0))


def padded_sizes(most: int) -> tuple[int, ...]:
  """The sizes a batch or a session is padded to: the powers of two below `most`, then
  `most`."""
  sizes, size = [], 1
  while size < most:
    sizes.append(size)
    size *= 2
  return (*sizes, most)


@dataclasses.dataclass(frozen=True)
class Request:
  """One checked request: its session as the model reads it (normalised), the suggestions
  asked for, its user and the user's earlier queries (oldest first)."""

  session: tuple[str, ...]
  k: int
  user: str | None = None
  history: tuple[str, ...] = ()


class Engine:
  """A workdir's pipeline and the batch sizes it runs (see the module docstring).

  Attributes:
    pipeline: the suggestion pipeline (`mtn_jax.inference.pipeline`).
    sizes: the batch sizes, ascending; every batch is padded to the first that holds it.
    widths: the session lengths, ascending; a batch's sessions are padded to the first that
      holds the longest.
    exclude_session_queries: the user-facing protocol (True) or the paper's.
    warm_seconds: how long `warm_up` took, on `warm_threads` threads (with `background`, until
      the last pair was compiled).
    warmed: set once every pair is compiled.
  """

  # What __init__ sets, for the subclasses that do not call it (the tests' stubs).
  _compiled: frozenset[tuple[int, int]] | None = None
  _stop_warming: threading.Event | None = None
  _warm_thread: threading.Thread | None = None

  def __init__(self, pipeline: pipeline_lib.Pipeline, max_batch: int,
               exclude_session_queries: bool):
    self.pipeline = pipeline
    self.sizes = padded_sizes(max_batch)
    self.exclude_session_queries = exclude_session_queries
    self.warm_seconds, self.warm_threads = 0.0, 1
    self.warmed = threading.Event()
    # The pairs compiled so far while a background warm-up runs; None once all are (or
    # before any warm-up: `run` then pads as if all were).
    self._compiled = None
    self._stop_warming = threading.Event()
    cfg = pipeline.trained.cfg
    self.max_session_queries = cfg.max_session_queries
    self.widths = padded_sizes(cfg.max_session_queries)
    self.max_query_words = pipeline.trained.query_words
    # Normalises and cuts queries as decode's reader does; its counts are not read.
    self.reader = inputs.QueryReader.for_model(pipeline.trained)

  @classmethod
  def load(cls, config: ml_collections.ConfigDict, workdir: str, log=print,
           background: bool = False) -> Engine:
    """The pipeline of `workdir`'s best checkpoint, warmed up for every batch size (with
    `background`, for the pairs that hold any request, the others after it returns:
    `warm_up`)."""
    _listen()
    # The service's default protocol is the user-facing one, as --mode=suggest's.
    config = suggest.with_protocol(config, user_facing=True)
    pipeline = pipeline_lib.Pipeline.load(config, workdir, log=log)
    engine = cls(pipeline, config.serve.max_batch,
                 bool(config.decode.exclude_session_queries))
    engine.warm_up(warm_up_threads(config), background=background, log=log)
    return engine

  # -------------------------------------------------------------------------------------------
  # What it is

  @property
  def step(self) -> int:
    return int(self.pipeline.suggester.step)

  @property
  def workdir(self) -> str:
    return self.pipeline.workdir

  @property
  def top_k(self) -> int:
    return self.pipeline.settings.top_k

  @property
  def past_read(self) -> int:
    """How many of a user's latest earlier queries the pipeline reads (`Pipeline.past_read`)."""
    return self.pipeline.past_read

  @property
  def personalises(self) -> bool:
    """Whether the model reads a user: their earlier queries (`Pipeline.past_read`: a
    model's `config.data.history_queries`, the habit rule, the learned ranker's sources of the
    past) or, for a ranker that reads users, the training user they are."""
    return self.past_read > 0 or self.knows_users

  @property
  def knows_users(self) -> bool:
    """Whether the model knows its training users by id (a ranker that reads a user's id,
    the zero attention family's HEM; the others read the user's earlier queries): a
    request's `user` then names one of them (`_info`)."""
    p = self.pipeline
    return p.retriever is not None and 'user' in p.retriever.trained.task.context_keys

  def info(self) -> dict:
    """What the page and the responses say of the model."""
    return {'name': self.pipeline.suggester.cfg.name, 'step': self.step,
            'workdir': self.workdir, 'score': self.pipeline.score_kind(),
            'how': self.pipeline.how(), 'top_k': self.top_k,
            'max_session_queries': self.max_session_queries,
            'max_query_words': self.max_query_words, 'personalises': self.personalises,
            'user_facing': self.exclude_session_queries}

  # -------------------------------------------------------------------------------------------
  # Requests

  def check(self, session: Sequence[str], k: int | None, user: str | None) -> Request:
    """The request as the model reads it, or BadInput naming the field at fault. Unlike
    decode, which adapts a file's sessions (and counts what it changed), a request the model
    would have to change is refused; with subword pieces, a query within the words the model
    reads (`Trained.query_words`) is read to its first pieces, as the corpus's were."""
    if not session:
      raise BadInput('session', 'empty: give the session\'s queries so far, oldest first')
    if len(session) > self.max_session_queries:
      raise BadInput('session', f'{len(session)} queries; the model reads at most '
                     f'{self.max_session_queries}: send the latest {self.max_session_queries}')
    queries = []
    for i, text in enumerate(session):
      refused = inputs.refused_character(text)
      if refused:
        raise BadInput(f'session[{i}]', f'holds {refused}: a query is text (tab and newline '
                       'count as spaces)')
      if not text.split():
        raise BadInput(f'session[{i}]', 'an empty query')
      words = text.split()
      if len(words) > self.max_query_words:
        raise BadInput(f'session[{i}]', f'{len(words)} words; the model reads at most '
                       f'{self.max_query_words} a query')
      query = self.reader.query(text)
      if not query:  # nothing left once normalised (bidirectional controls alone)
        raise BadInput(f'session[{i}]', 'an empty query once normalised (it holds only '
                       'characters a query drops)')
      queries.append(query)
    if k is not None and not 1 <= k <= MAX_K:
      raise BadInput('k', f'{k} is out of range 1..{MAX_K}')
    if user is not None and not self.personalises:
      raise BadInput('user', 'this model reads no user (it was trained without users\' '
                     'histories): leave the user out')
    refused = None if user is None else inputs.refused_character(user)
    if refused:
      raise BadInput('user', f'holds {refused}')
    return Request(tuple(queries), self.top_k if k is None else k, user)

  def batch_size(self, n: int) -> int:
    """The padded size of a batch of `n` requests (n <= max_batch)."""
    return next(size for size in self.sizes if size >= n)

  def padded_shape(self, n: int, longest: int) -> tuple[int, int]:
    """The (batch size, session length) a batch of `n` requests whose longest session holds
    `longest` queries runs as: the first size and the first length that hold them, or, while
    a background warm-up runs, the smallest pair compiled so far that holds them."""
    compiled = self._compiled
    if compiled is None:
      return self.batch_size(n), next(width for width in self.widths if width >= longest)
    return min(((size, width) for size, width in compiled if size >= n and width >= longest),
               key=lambda shape: (shape[0] * shape[1], shape))

  def run(self, requests: Sequence[Request]) -> list[list[dict]]:
    """The suggestions shown for each request ({'query', 'score', ...}, best first), in
    batches of at most `max_batch`."""
    most = self.sizes[-1]
    if len(requests) > most:
      return [shown for start in range(0, len(requests), most)
              for shown in self.run(requests[start:start + most])]
    if not requests:
      return []
    return self._run(requests, *self.padded_shape(len(requests),
                                                  max(len(r.session) for r in requests)))

  def _run(self, requests: Sequence[Request], size: int, width: int) -> list[list[dict]]:
    """`requests` as a batch of `size` rows, sessions padded to `width` queries. Padding
    changes no suggestion (the module docstring), only the program that runs."""
    contexts = [Context(r.session, first_output=len(r.session) - 1, info=self._info(r),
                        history=r.history) for r in requests]
    ordered = self.pipeline.ordered(contexts, positions='last', batch_rows=size,
                                    widths=(width,))
    return [self.pipeline.show(lists[-1], r.session, self.exclude_session_queries, r.k)
            for r, lists in zip(requests, ordered)]

  @staticmethod
  def _info(request: Request) -> dict:
    # A ranker that reads users knows its training users by their log's numeric ids.
    # (ASCII digits alone: '²' is a digit to str.isdigit, and no number to int.)
    if request.user is not None and request.user.isascii() and request.user.isdigit():
      return {'user': int(request.user)}
    return {}

  def shapes(self) -> list[tuple[int, int]]:
    """Every (batch size, session length) pair a batch can be padded to."""
    return [(size, width) for size in self.sizes for width in self.widths]

  def warm_up(self, threads: int = 1, background: bool = False, log=print) -> None:
    """Runs every batch size with every session length once (the longest session of the
    batch that length, the others shorter), so that every program a request can need is
    compiled before the service is ready.

    Each pair goes through the pipeline's `ordered` as a request's batch does, whatever the
    strategy, so the programs are those requests run. With `threads` > 1 the pairs run on
    that many threads: XLA compiles without Python's lock, so the compilations of different
    pairs overlap on the cores (the tracing, in Python, does not). The smallest pair runs
    alone first, so that the programs every pair shares (those of no batch shape) compile
    once.

    With `background`, it returns once the pairs that hold any request are compiled (a lone
    request and the largest batch, at the longest session), and compiles the others on a
    thread of its own, one at a time (the cores are the requests'), smallest batch first;
    meanwhile a batch runs padded to the smallest pair compiled so far that holds it (the
    same suggestions, more padding), and `log` says when the last pair is compiled. Most of
    a pair's time is tracing, in Python, which the compilation cache does not save: this is
    what makes a start, even one that reads every program back, ready in seconds.
    """
    started = time.time()
    shapes = self.shapes()
    if background:
      first = sorted({(self.sizes[0], self.widths[-1]), (self.sizes[-1], self.widths[-1])})
      for shape in first:
        self._warm(*shape)
      self._compiled = frozenset(first)
      rest = [shape for shape in shapes if shape not in first]
      self._warm_thread = threading.Thread(target=self._warm_rest, args=(rest, started, log),
                                           daemon=True, name='warm-up')
      self._warm_thread.start()
      return
    self._warm(*shapes[0])
    if threads > 1 and len(shapes) > 2:
      # The largest pairs first: the longest compilations do not start last and leave the
      # other threads idle at the end.
      rest = sorted(shapes[1:], key=lambda shape: shape[0] * shape[1], reverse=True)
      with futures.ThreadPoolExecutor(threads, thread_name_prefix='warm-up') as pool:
        for done in [pool.submit(self._warm, *shape) for shape in rest]:
          done.result()
    else:
      for shape in shapes[1:]:
        self._warm(*shape)
    self.warm_seconds = time.time() - started
    self.warm_threads = max(threads, 1)
    self._compiled = None
    self.warmed.set()

  def _warm_rest(self, shapes: Sequence[tuple[int, int]], started: float, log) -> None:
    try:
      for shape in shapes:
        if self._stop_warming.is_set():
          return
        self._warm(*shape)
        self._compiled = self._compiled | {shape}
    except Exception as e:  # pylint: disable=broad-except
      log(f'Warm-up stopped at a pair: {e!r}; batches keep running padded to the '
          f'{len(self._compiled)} pairs compiled.')
      return
    self._compiled = None
    self.warm_seconds = time.time() - started
    self.warmed.set()
    log(f'All {len(self.shapes())} batch shapes compiled, {self.warm_seconds:.1f} s after '
        f'the warm-up began ({compilations()} programs, {cache_hits()} read from the '
        'compilation cache): every batch runs at its own size.')

  def stop_warming(self, timeout: float = 0.0) -> None:
    """A background warm-up compiles no further pair (the service is stopping); waits up
    to `timeout` seconds for the pair it is compiling, so that the process does not exit
    in the middle of a compilation."""
    if self._stop_warming is not None:
      self._stop_warming.set()
    if self._warm_thread is not None:
      self._warm_thread.join(timeout)

  def _warm(self, size: int, width: int) -> None:
    user = 'warm-up' if self.personalises else None
    self._run([Request(('warm up',) * (width - i % width), 1, user, ('warm up',) * i)
               for i in range(size)], size, width)
