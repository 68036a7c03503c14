"""Batches of whole sessions, bucketed by number of queries, fed through grain.

In:  a `SessionSplit` (`queries` int32 [num_queries, max_query_words], `starts` [N + 1]).
Out: one dict of numpy arrays per step, holding this process's rows of a global batch:
  `queries`      int32 [batch, queries, tokens]  sessions of one length (one bucket); `tokens` is
                                                 the split's max_query_words
  `session_ids`  int32 [batch]                   each row's session index in the split; -1 marks a
                                                 padding row, whose queries are all zero, so it
                                                 holds no valid (prefix -> next query) pair
  `epoch`        int32 []                        training only: the epoch the batch belongs to
  and one key per array of `per_query` ({key: [num_queries, ...]}, row for row with the
split's queries), gathered the same way: [batch, queries, ...] (e.g. `oov`, the numbers of the
words outside the vocabulary, `mtn_jax.data.extended`), and one per array of `per_session`
({key: [num_sessions, ...]}): [batch, ...] (e.g. `history`, the user's earlier queries);
padding rows are zeros.

A global batch of sessions with `length` queries has `queries_per_batch // length` rows,
rounded down to a multiple of `multiple_of` (the global device count), as the paper groups
sessions by their number of queries. With `process_count` hosts, process `p` gets rows
`[p * rows / process_count, (p + 1) * rows / process_count)` of every global batch.

How, and why this way: grain has no length bucketing of its own. Each epoch is planned up front:
per bucket, a permutation of its sessions seeded by (seed, epoch), cut into batches of the
bucket's size (the last one short, then padded); then a seeded permutation of all the epoch's
batches. Global batch `k` of the endless training stream is batch `k % steps_per_epoch` of epoch
`k // steps_per_epoch`, so the stream is the random-access `grain.MapDataset.range` mapped
through the plan. Per-bucket datasets joined with `MapDataset.mix` were the alternative, but
mixing by weights lets buckets run out at different steps, so epochs are not exact and a
bucket's final short batch has no place. With a plan, every session appears exactly once per
epoch, the iterator's state is only the next step index (resuming is exact and costs nothing),
and grain's threads and worker processes may build batches in any order. Planning an epoch is
O(num_sessions) numpy work, done once per epoch and process (and worker).
"""

from __future__ import annotations

import collections

import dataclasses
import mmap
import sys
import threading

import grain
import numpy as np

from mtn_jax.data.sessions import SessionSplit

# Building a batch is one numpy gather, so a few threads keep ahead of a training step; grain's
# defaults (16 threads, 500 buffered batches) only cost memory here.
_READ_OPTIONS = grain.ReadOptions(num_threads=4, prefetch_buffer_size=16)


def bucket_batch_sizes(lengths: np.ndarray, queries_per_batch: int,
                       multiple_of: int) -> dict[int, int]:
  """Sessions per global batch for each session length in `lengths` (int [num_sessions]).

  `queries_per_batch // length`, rounded down to a multiple of `multiple_of`, and at least
  `multiple_of` so that every device gets a row. Keys are in ascending order.
  """
  if queries_per_batch < 1:
    raise ValueError(f'queries_per_batch must be positive, got {queries_per_batch}')
  if multiple_of < 1:
    raise ValueError(f'multiple_of must be positive, got {multiple_of}')
  return {int(length): max(multiple_of, queries_per_batch // int(length) // multiple_of
                           * multiple_of)
          for length in np.unique(lengths)}


def steps_per_epoch(split: SessionSplit, queries_per_batch: int, multiple_of: int) -> int:
  """Global batches in one pass over `split`: the sum over buckets of ceil(sessions / size)."""
  lengths, counts = np.unique(_checked_lengths(split), return_counts=True)
  sizes = bucket_batch_sizes(lengths, queries_per_batch, multiple_of)
  return sum(-(-int(count) // sizes[int(length)]) for length, count in zip(lengths, counts))


def make_train_iterator(split: SessionSplit, **kwargs) -> grain.DatasetIterator:
  """An iterator over `make_train_dataset(split, **kwargs)`."""
  return iter(make_train_dataset(split, **kwargs))


def make_train_dataset(split: SessionSplit, *, queries_per_batch: int, seed: int,
                       multiple_of: int = 1, process_index: int = 0, process_count: int = 1,
                       worker_count: int = 0, per_query: dict[str, np.ndarray] | None = None,
                       per_session: dict[str, np.ndarray] | None = None) -> grain.IterDataset:
  """Endless training batches: epoch after epoch, each a fresh shuffle fixed by (seed, epoch).

  Each element is this process's share of a global batch (see the module docstring), with
  `epoch`. `worker_count > 0` builds batches in that many grain worker processes; the stream
  is the same. Its iterators' `get_state()` / `set_state()` resume it exactly.
  """
  _check_sharding(multiple_of, process_index, process_count)
  if seed < 0:
    raise ValueError(f'seed must be non-negative, got {seed}')
  if worker_count < 0:
    raise ValueError(f'worker_count must be non-negative, got {worker_count}')
  batches = _Batches(split, queries_per_batch, multiple_of, process_index, process_count,
                     shuffle_seed=seed, per_query=per_query, per_session=per_session)
  if not batches.steps_per_epoch:
    raise ValueError(f'split {split.name!r} has no sessions to train on')
  dataset = grain.MapDataset.range(sys.maxsize).map(batches).to_iter_dataset(_READ_OPTIONS)
  if worker_count:
    dataset = dataset.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count))
  return dataset


def make_eval_iterator(split: SessionSplit, *, queries_per_batch: int, multiple_of: int = 1,
                       process_index: int = 0, process_count: int = 1,
                       per_query: dict[str, np.ndarray] | None = None,
                       per_session: dict[str, np.ndarray] | None = None) -> grain.IterDataset:
  """One pass over `split` in a fixed order: bucket by bucket (shortest sessions first),
  sessions in index order, each bucket's last batch padded. Iterating it again starts over;
  it has `steps_per_epoch(split, queries_per_batch, multiple_of)` elements."""
  _check_sharding(multiple_of, process_index, process_count)
  batches = _Batches(split, queries_per_batch, multiple_of, process_index, process_count,
                     shuffle_seed=None, per_query=per_query, per_session=per_session)
  return grain.MapDataset.range(batches.steps_per_epoch).map(batches).to_iter_dataset(
      _READ_OPTIONS)


def padded_batch(split: SessionSplit, *, rows: int, width: int,
                 per_query: dict[str, np.ndarray] | None = None,
                 per_session: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
  """Every session of `split`, in order, in one batch of `rows` rows: 'queries' and each
  `per_query` array [rows, width, ...], zeros past a session's end; each `per_session` array
  [rows, ...]; the rows past the sessions zeros (padding).

  Raises:
    ValueError: more sessions than `rows`, or one longer than `width`.
  """
  lengths = _checked_lengths(split)
  if split.num_sessions > rows or (len(lengths) and int(lengths.max()) > width):
    raise ValueError(f'{split.num_sessions} sessions of up to '
                     f'{int(lengths.max()) if len(lengths) else 0} queries do not fit a batch '
                     f'of {rows} rows of {width}')
  batch = {}
  for key, values in (('queries', split.queries), *(per_query or {}).items()):
    values = np.asarray(values)
    batch[key] = np.zeros((rows, width) + values.shape[1:], values.dtype)
    for i, length in enumerate(lengths.tolist()):
      batch[key][i, :length] = values[split.starts[i]:split.starts[i + 1]]
  for key, values in (per_session or {}).items():
    values = np.asarray(values)
    batch[key] = np.zeros((rows,) + values.shape[1:], values.dtype)
    batch[key][:split.num_sessions] = values
  return batch


def _check_sharding(multiple_of: int, process_index: int, process_count: int) -> None:
  if process_count < 1 or not 0 <= process_index < process_count:
    raise ValueError(f'process_index {process_index} is not in [0, process_count '
                     f'{process_count})')
  if multiple_of < 1 or multiple_of % process_count:
    raise ValueError(f'multiple_of ({multiple_of}) must be a positive multiple of '
                     f'process_count ({process_count}) so that every process gets as many rows')


def _checked_lengths(split: SessionSplit) -> np.ndarray:
  lengths = split.lengths
  if len(lengths) and lengths.min() < 1:
    empty = int(np.flatnonzero(lengths < 1)[0])
    raise ValueError(f'split {split.name!r}: session {empty} has {int(lengths[empty])} '
                     'queries (starts must increase)')
  if len(split.starts) and split.starts[-1] > len(split.queries):
    raise ValueError(f'split {split.name!r}: sessions end at row {int(split.starts[-1])} but '
                     f'there are {len(split.queries)} query rows')
  return lengths


@dataclasses.dataclass(frozen=True)
class _EpochPlan:
  """The batches of one epoch in step order: batch `j` holds the `count[j]` sessions
  `session_order[first[j]:first[j] + count[j]]`, all of `length[j]` queries, in `size[j]`
  rows (the rest padding). Every array but `session_order` is int64 [steps_per_epoch]."""

  session_order: np.ndarray  # int64 [num_sessions]
  first: np.ndarray
  count: np.ndarray
  length: np.ndarray
  size: np.ndarray


def _plan_epoch(buckets: dict[int, np.ndarray], sizes: dict[int, int],
                rng: np.random.Generator | None) -> _EpochPlan:
  """Cuts each bucket's sessions (shuffled by `rng` if given) into batches, then shuffles the
  batches; without `rng`, buckets and sessions keep their order."""
  orders, firsts, counts, lengths, batch_sizes = [], [], [], [], []
  offset = 0
  for length, sessions in buckets.items():
    if rng is not None:
      sessions = rng.permutation(sessions)
    size = sizes[length]
    starts = np.arange(0, len(sessions), size)
    orders.append(sessions)
    firsts.append(offset + starts)
    counts.append(np.minimum(size, len(sessions) - starts))
    lengths.append(np.full(len(starts), length))
    batch_sizes.append(np.full(len(starts), size))
    offset += len(sessions)
  batch_order = (rng.permutation(len(np.concatenate(firsts))) if rng is not None
                 else slice(None))
  return _EpochPlan(np.concatenate(orders).astype(np.int64),
                    *(np.concatenate(column).astype(np.int64)[batch_order]
                      for column in (firsts, counts, lengths, batch_sizes)))


@dataclasses.dataclass(frozen=True)
class _MappedArray:
  """Where a read-only memory-mapped array lives in its file, to map it again elsewhere."""

  filename: str
  dtype: str
  shape: tuple[int, ...]
  offset: int

  def open(self) -> np.ndarray:
    return np.memmap(self.filename, dtype=self.dtype, mode='r', offset=self.offset,
                     shape=self.shape)


class _Batches:
  """Maps a global step to this process's rows of that step's batch (see module docstring).

  A module-level class so grain can pickle it into worker processes.
  """

  def __init__(self, split: SessionSplit, queries_per_batch: int, multiple_of: int,
               process_index: int, process_count: int, shuffle_seed: int | None,
               per_query: dict[str, np.ndarray] | None = None,
               per_session: dict[str, np.ndarray] | None = None):
    lengths = _checked_lengths(split)
    self._queries = split.queries
    self._per_query = dict(per_query or {})
    self._per_session = dict(per_session or {})
    for name, arrays, expected in (('per_query', self._per_query, len(split.queries)),
                                   ('per_session', self._per_session, split.num_sessions)):
      for key, values in arrays.items():
        if len(values) != expected:
          raise ValueError(f'{name}[{key!r}] has {len(values)} rows, the split {expected}')
    self._starts = np.asarray(split.starts, np.int64)
    self._sizes = bucket_batch_sizes(lengths, queries_per_batch, multiple_of)
    self._buckets = {length: np.flatnonzero(lengths == length) for length in self._sizes}
    self.steps_per_epoch = steps_per_epoch(split, queries_per_batch, multiple_of)
    self._process_index = process_index
    self._process_count = process_count
    self._shuffle_seed = shuffle_seed
    self._plans: collections.OrderedDict[int, _EpochPlan] = collections.OrderedDict()
    self._plans_lock = threading.Lock()

  def _plan(self, epoch: int) -> _EpochPlan:
    # grain's reader threads ask for neighbouring steps at once; near an epoch boundary they
    # straddle epochs, so the most recently used plans are kept (least recently used evicted)
    # and each is built once while it is in use.
    with self._plans_lock:
      plan = self._plans.get(epoch)
      if plan is None:
        rng = (None if self._shuffle_seed is None
               else np.random.default_rng([self._shuffle_seed, epoch]))
        plan = self._plans[epoch] = _plan_epoch(self._buckets, self._sizes, rng)
      self._plans.move_to_end(epoch)
      while len(self._plans) > 3:
        self._plans.popitem(last=False)
      return plan

  def __call__(self, step: int) -> dict[str, np.ndarray]:
    epoch, position = divmod(int(step), self.steps_per_epoch)
    plan = self._plan(epoch)
    rows = int(plan.size[position]) // self._process_count
    length = int(plan.length[position])
    own_first = self._process_index * rows
    own_count = max(0, min(rows, int(plan.count[position]) - own_first))
    first = int(plan.first[position]) + own_first
    session_ids = np.full(rows, -1, np.int32)
    session_ids[:own_count] = plan.session_order[first:first + own_count]
    query_rows = self._starts[session_ids[:own_count], None] + np.arange(length)
    batch = {'session_ids': session_ids}
    for key, values in (('queries', self._queries), *self._per_query.items()):
      batch[key] = np.zeros((rows, length) + values.shape[1:], values.dtype)
      batch[key][:own_count] = values[query_rows]
    for key, values in self._per_session.items():
      batch[key] = np.zeros((rows,) + values.shape[1:], values.dtype)
      batch[key][:own_count] = values[session_ids[:own_count]]
    if self._shuffle_seed is not None:
      batch['epoch'] = np.array(epoch, np.int32)
    return batch

  def __getstate__(self) -> dict:
    state = self.__dict__.copy()
    del state['_plans_lock']
    state['_plans'] = collections.OrderedDict()
    queries = self._queries
    # A split loaded with mmap is sent to worker processes as its place in the file, which
    # they map again, rather than as a pickled copy of the whole array (hundreds of MB for AOL).
    if (isinstance(queries, np.memmap) and isinstance(queries.base, mmap.mmap)
        and queries.flags.c_contiguous):
      state['_queries'] = _MappedArray(queries.filename, queries.dtype.str, queries.shape,
                                       queries.offset)
    return state

  def __setstate__(self, state: dict) -> None:
    if isinstance(state['_queries'], _MappedArray):
      state['_queries'] = state['_queries'].open()
    self.__dict__.update(state)
    self._plans_lock = threading.Lock()
