"""Micro-batching: concurrent requests coalesced into batches, run off the event loop.

A request waits in a bounded queue; the batch it joins starts once a worker is free and
`max_batch` requests wait or the oldest has waited `max_wait` seconds (at once while
draining; with `max_wait` 0 as soon as a worker is free, the requests that arrive while the
batches run making the next one). Up to `workers` batches run at once, each on a thread of
its own: the model's compiled programs release Python's lock while they run, so on a CPU a
second batch runs on another core while the first does, and the event loop keeps accepting,
refusing and timing out requests meanwhile. An optional `prepare` step (the users'
histories) runs first on one thread of its own, batch after batch in the order the batches
formed, so that a user's requests are seen in the order they came even when their batches
overlap; a batch it would not change (no request names a user) does not wait for it (only
for a free worker, which a batch being prepared holds). A request whose caller has stopped
waiting (its deadline passed, or the client went) leaves the queue at once: it holds no
place a waiting request could take. A batch that raises is run again one request at a time,
so that one bad request fails alone.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any


class QueueFull(Exception):
  """The queue holds `queue_bound` requests: refuse (503) rather than wait."""


class DeadlineExceeded(Exception):
  """The request was not answered before its deadline (504)."""


@dataclasses.dataclass(eq=False)  # one request: compared by identity
class _Item:
  request: Any
  future: asyncio.Future
  enqueued: float
  deadline: float


class Batcher:
  """Runs `run(prepare(requests)) -> results` (one result a request, in order) on batches.

  Args:
    run: called on a worker thread with up to `max_batch` (prepared) requests.
    prepare: None, or called before `run` with the batch's requests, on one thread, batches
      in the order they formed: one prepared request a request.
    prepares: which requests `prepare` changes; a batch with none of them skips it, so that
      a slow `prepare` of other batches holds it up no more.
    workers: batches run at once.
    on_batch: called (on the event loop) with each batch's size and run time, e.g. metrics.
    on_depth: called with the queue's depth whenever it changes.
    on_unheard: called with the exception of a request whose caller had stopped waiting,
      which no answer carries.
  """

  def __init__(self, run: Callable[[Sequence[Any]], list], *, max_batch: int, max_wait: float,
               queue_bound: int, workers: int = 1,
               prepare: Callable[[Sequence[Any]], list] | None = None,
               prepares: Callable[[Any], bool] = lambda request: True,
               on_batch: Callable[[int, float], None] = lambda n, s: None,
               on_depth: Callable[[int], None] = lambda n: None,
               on_unheard: Callable[[BaseException], None] = lambda e: None):
    self._run, self._prepare, self._prepares = run, prepare, prepares
    self._on_unheard = on_unheard
    self.max_batch, self.max_wait, self.workers = max_batch, max_wait, workers
    self.queue_bound = queue_bound
    self._on_batch, self._on_depth = on_batch, on_depth
    self._queue: collections.deque[_Item] = collections.deque()
    self._wake: asyncio.Event | None = None
    self._free: asyncio.Semaphore | None = None  # workers not running a batch
    self._task: asyncio.Task | None = None
    self._batches: dict[asyncio.Task, list[_Item]] = {}  # the batches running
    self._executor: concurrent.futures.ThreadPoolExecutor | None = None
    self._in_order: concurrent.futures.ThreadPoolExecutor | None = None
    self.draining = False  # True: each batch starts at once

  def drain(self) -> None:
    """From now on each batch starts at once, one already waiting for batch-mates too."""
    self.draining = True
    if self._wake is not None:
      self._wake.set()

  @property
  def depth(self) -> int:
    return len(self._queue)

  @property
  def running(self) -> int:
    """Requests in the batches being run."""
    return sum(len(items) for items in self._batches.values())

  def start(self) -> None:
    """On the event loop that will submit; a stopped batcher starts again (each of the tests'
    in-process clients runs the application's start-up and shut-down)."""
    self._executor = concurrent.futures.ThreadPoolExecutor(self.workers,
                                                           thread_name_prefix='suggest')
    if self._prepare is not None:
      self._in_order = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='prepare')
    self._wake = asyncio.Event()
    self._free = asyncio.Semaphore(self.workers)
    self._task = asyncio.get_running_loop().create_task(self._loop(), name='batcher')

  async def stop(self) -> None:
    if self._task is not None:
      self._task.cancel()
      try:
        await self._task
      except asyncio.CancelledError:
        pass
    for task in self._batches:
      task.cancel()
    waiting = [item for items in self._batches.values() for item in items]
    for item in [*self._queue, *waiting]:
      if not item.future.done():
        item.future.set_exception(DeadlineExceeded('the service stopped'))
    self._queue.clear()
    if self._executor is not None:
      self._executor.shutdown(wait=True)
    if self._in_order is not None:
      self._in_order.shutdown(wait=True)

  async def submit(self, request: Any, deadline: float) -> Any:
    """The request's result; QueueFull at once when the queue is full, DeadlineExceeded
    when `deadline` (time.monotonic()) passes first."""
    if len(self._queue) >= self.queue_bound:
      raise QueueFull(f'{len(self._queue)} requests are waiting')
    future = asyncio.get_running_loop().create_future()
    item = _Item(request, future, time.monotonic(), deadline)
    self._queue.append(item)
    self._on_depth(len(self._queue))
    self._wake.set()
    try:
      return await asyncio.wait_for(future, max(deadline - time.monotonic(), 0.0))
    except (asyncio.TimeoutError, TimeoutError):
      raise DeadlineExceeded('not answered before the deadline') from None
    finally:
      if future.cancelled() and item in self._queue:  # its caller stopped waiting
        self._queue.remove(item)  # its place is free for a request someone awaits
        self._on_depth(len(self._queue))

  async def _loop(self) -> None:
    loop = asyncio.get_running_loop()
    while True:
      while not self._queue:
        self._wake.clear()
        await self._wake.wait()
      await self._free.acquire()
      if not self._queue:  # those waiting gave up while every worker was busy
        self._free.release()
        continue
      # Wait for batch-mates: until the batch is full or its oldest request has waited enough
      # (or every request waiting gave up meanwhile).
      while self._queue and len(self._queue) < self.max_batch and not self.draining:
        left = self._queue[0].enqueued + self.max_wait - time.monotonic()
        if left <= 0:
          break
        self._wake.clear()
        try:
          await asyncio.wait_for(self._wake.wait(), left)
        except (asyncio.TimeoutError, TimeoutError):
          break
      items = []
      now = time.monotonic()
      while self._queue and len(items) < self.max_batch:
        item = self._queue.popleft()
        if item.future.done():  # its caller gave up (deadline)
          continue
        if item.deadline <= now:
          item.future.set_exception(DeadlineExceeded('not answered before the deadline'))
          continue
        items.append(item)
      self._on_depth(len(self._queue))
      if not items:
        self._free.release()
        continue
      # The batch's first step (handing it to `prepare`'s thread) runs before the next
      # batch's: tasks start in the order they are made.
      task = loop.create_task(self._run_batch(items))
      self._batches[task] = items
      task.add_done_callback(self._batches.pop)

  async def _run_batch(self, items: list[_Item]) -> None:
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    try:
      results = [i.request for i in items]
      if self._prepare is not None and any(map(self._prepares, results)):
        results = await loop.run_in_executor(self._in_order, _isolated, self._prepare, results)
      ready = [i for i, r in enumerate(results) if not isinstance(r, BaseException)]
      if ready:
        answers = await loop.run_in_executor(self._executor, _isolated, self._run,
                                             [results[i] for i in ready])
        for i, answer in zip(ready, answers):
          results[i] = answer
    finally:
      self._free.release()
    self._on_batch(len(items), time.monotonic() - started)
    for item, result in zip(items, results):
      if item.future.done():
        if isinstance(result, BaseException):
          self._on_unheard(result)
        continue
      if isinstance(result, BaseException):
        item.future.set_exception(result)
      else:
        item.future.set_result(result)


def _isolated(function: Callable[[Sequence[Any]], list], inputs: Sequence[Any]) -> list:
  """`function(inputs)`; where it raises, each input run alone, an input that still raises
  given its exception as its result."""
  try:
    return list(function(inputs))
  except Exception as e:  # pylint: disable=broad-except
    if len(inputs) == 1:
      return [e]
  results = []
  for one in inputs:
    try:
      results.extend(function([one]))
    except Exception as e:  # pylint: disable=broad-except
      results.append(e)
  return results
