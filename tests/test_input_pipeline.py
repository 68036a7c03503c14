"""Bucketed session batches: exact epochs, padding, determinism, resuming and sharding."""

import copy
import itertools
import os

import cloudpickle
import numpy as np
import pytest

from mtn_jax.data import input_pipeline
from mtn_jax.data.sessions import SessionSplit

QUERIES_PER_BATCH = 20  # buckets of 3, 4 and 5 queries get 6, 5 and 4 sessions (multiple_of 1)
MAX_QUERY_WORDS = 4


def make_split(num_sessions=41, seed=0, name='train'):
  """Sessions of 3 to 5 queries; query row r starts with word r + 1, so every row is unique."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(3, 6, size=num_sessions)
  starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
  num_queries = int(starts[-1])
  queries = rng.integers(5, 100, size=(num_queries, MAX_QUERY_WORDS)).astype(np.int32)
  queries[:, 0] = np.arange(1, num_queries + 1)
  words = rng.integers(1, MAX_QUERY_WORDS + 1, size=num_queries)
  queries[np.arange(MAX_QUERY_WORDS) >= words[:, None]] = 0
  return SessionSplit(name, queries, starts)


def take(iterator, count):
  return list(itertools.islice(iterator, count))


def assert_batch_matches_split(batch, split, multiple_of=1):
  """Rows are the named sessions, padding rows are -1 and all zero, and the batch has its
  bucket's fixed size."""
  ids, queries = batch['session_ids'], batch['queries']
  assert ids.dtype == np.int32 and queries.dtype == np.int32
  length = queries.shape[1]
  sizes = input_pipeline.bucket_batch_sizes(split.lengths, QUERIES_PER_BATCH, multiple_of)
  assert queries.shape == (sizes[length], length, MAX_QUERY_WORDS)
  real = ids >= 0
  # Real rows first, then padding.
  assert np.array_equal(real, np.arange(len(ids)) < real.sum())
  assert np.all(ids[~real] == -1) and not queries[~real].any()
  for row, session in enumerate(ids[real]):
    np.testing.assert_array_equal(queries[row], split.session(session))


def test_bucket_batch_sizes_round_down_to_multiple():
  lengths = np.array([3, 5, 4, 3, 5])
  assert input_pipeline.bucket_batch_sizes(lengths, 64, 1) == {3: 21, 4: 16, 5: 12}
  assert input_pipeline.bucket_batch_sizes(lengths, 64, 4) == {3: 20, 4: 16, 5: 12}
  assert input_pipeline.bucket_batch_sizes(lengths, 64, 8) == {3: 16, 4: 16, 5: 8}
  # Too few query slots for one row per device still gives every device a row.
  assert input_pipeline.bucket_batch_sizes(lengths, 10, 8) == {3: 8, 4: 8, 5: 8}
  assert input_pipeline.bucket_batch_sizes(np.array([4, 4]), 8, 1) == {4: 2}
  with pytest.raises(ValueError, match='multiple_of'):
    input_pipeline.bucket_batch_sizes(lengths, 64, 0)


def test_steps_per_epoch_counts_short_last_batches():
  split = make_split()
  counts = np.bincount(split.lengths, minlength=6)
  expected = sum(-(-counts[length] // size) for length, size in ((3, 6), (4, 5), (5, 4)))
  assert input_pipeline.steps_per_epoch(split, QUERIES_PER_BATCH, 1) == expected
  # A bucket that fills its batches exactly has no short one after them: 6 sessions of 3
  # queries are one batch of 6, and one pass yields it alone.
  exact = SessionSplit('train', np.ones((18, MAX_QUERY_WORDS), np.int32), np.arange(0, 19, 3))
  assert input_pipeline.steps_per_epoch(exact, QUERIES_PER_BATCH, 1) == 1
  [batch] = input_pipeline.make_eval_iterator(exact, queries_per_batch=QUERIES_PER_BATCH)
  np.testing.assert_array_equal(batch['session_ids'], np.arange(6))


def test_train_epochs_hold_every_session_once_in_fresh_orders():
  split = make_split()
  steps = input_pipeline.steps_per_epoch(split, QUERIES_PER_BATCH, 1)
  batches = take(input_pipeline.make_train_iterator(
      split, queries_per_batch=QUERIES_PER_BATCH, seed=3), 3 * steps)
  epoch_orders = []
  for epoch in range(3):
    epoch_batches = batches[epoch * steps:(epoch + 1) * steps]
    assert [int(b['epoch']) for b in epoch_batches] == [epoch] * steps
    ids = np.concatenate([b['session_ids'] for b in epoch_batches])
    ids = ids[ids >= 0]
    np.testing.assert_array_equal(np.sort(ids), np.arange(split.num_sessions))
    epoch_orders.append(ids)
    for batch in epoch_batches:
      assert_batch_matches_split(batch, split)
    # Only each bucket's last batch may be short.
    assert sum((b['session_ids'] < 0).any() for b in epoch_batches) <= 3
    # Batches of different buckets are interleaved, not grouped.
    batch_lengths = [b['queries'].shape[1] for b in epoch_batches]
    assert batch_lengths != sorted(batch_lengths)
  # Each epoch its own order (seeded by the seed and the epoch), none another's again.
  assert len({order.tobytes() for order in epoch_orders}) == 3


def test_train_stream_is_fixed_by_the_seed():
  split = make_split()

  def stream(seed):
    return np.concatenate([b['session_ids'] for b in take(input_pipeline.make_train_iterator(
        split, queries_per_batch=QUERIES_PER_BATCH, seed=seed), 12)])

  np.testing.assert_array_equal(stream(5), stream(5))
  assert not np.array_equal(stream(5), stream(6))


def test_restored_iterator_continues_the_same_stream_across_epochs():
  split = make_split()
  steps = input_pipeline.steps_per_epoch(split, QUERIES_PER_BATCH, 1)
  original = input_pipeline.make_train_iterator(split, queries_per_batch=QUERIES_PER_BATCH,
                                                seed=1)
  take(original, steps // 2)
  state = original.get_state()
  expected = take(original, steps + 2)  # runs into the next epoch

  restored = input_pipeline.make_train_iterator(split, queries_per_batch=QUERIES_PER_BATCH,
                                                seed=1)
  restored.set_state(state)
  for want, got in zip(expected, take(restored, steps + 2), strict=True):
    assert want.keys() == got.keys()
    for key in want:
      np.testing.assert_array_equal(want[key], got[key])


@pytest.mark.parametrize('mode', ['train', 'eval'])
def test_process_shards_are_disjoint_and_make_up_the_global_batch(mode):
  split = make_split()

  def batches(process_index, process_count):
    kwargs = dict(queries_per_batch=QUERIES_PER_BATCH, multiple_of=2,
                  process_index=process_index, process_count=process_count)
    if mode == 'train':
      return take(input_pipeline.make_train_iterator(split, seed=0, **kwargs), 15)
    return list(input_pipeline.make_eval_iterator(split, **kwargs))

  global_batches, first, second = batches(0, 1), batches(0, 2), batches(1, 2)
  assert len(global_batches) == len(first) == len(second)
  for whole, shard0, shard1 in zip(global_batches, first, second):
    assert_batch_matches_split(whole, split, multiple_of=2)
    for key in ('queries', 'session_ids'):
      np.testing.assert_array_equal(np.concatenate([shard0[key], shard1[key]]), whole[key])
    ids0, ids1 = shard0['session_ids'], shard1['session_ids']
    assert not set(ids0[ids0 >= 0]) & set(ids1[ids1 >= 0])


def test_eval_covers_every_session_once_bucket_by_bucket_in_index_order():
  split = make_split(name='valid')
  dataset = input_pipeline.make_eval_iterator(split, queries_per_batch=QUERIES_PER_BATCH)
  batches = list(dataset)
  assert len(batches) == input_pipeline.steps_per_epoch(split, QUERIES_PER_BATCH, 1)
  for batch in batches:
    assert_batch_matches_split(batch, split)
    assert 'epoch' not in batch
  ids = np.concatenate([b['session_ids'] for b in batches])
  np.testing.assert_array_equal(ids[ids >= 0], np.argsort(split.lengths, kind='stable'))
  # A second pass is the same pass.
  again = np.concatenate([b['session_ids'] for b in dataset])
  np.testing.assert_array_equal(again, ids)


def test_a_padded_batch_holds_each_session_in_its_row_from_the_first_slot():
  """`padded_batch` (a request's or a decoded file's batch): session i in row i from slot 0,
  zeros after its end and in the rows past the sessions, the per-query and per-session arrays
  alike; a batch of exactly the sessions and the longest session's length is taken, one row
  or one slot fewer refused."""
  split = make_split(num_sessions=3, seed=2)  # sessions of 5, 3 and 3 queries
  per_query = {'oov': np.arange(len(split.queries)) + 1}
  per_session = {'history': np.arange(split.num_sessions) + 1}
  batch = input_pipeline.padded_batch(split, rows=4, width=5, per_query=per_query,
                                      per_session=per_session)
  assert batch['queries'].shape == (4, 5, MAX_QUERY_WORDS) and batch['oov'].shape == (4, 5)
  for i, length in enumerate(split.lengths.tolist()):
    np.testing.assert_array_equal(batch['queries'][i, :length], split.session(i))
    np.testing.assert_array_equal(batch['oov'][i, :length],
                                  np.arange(split.starts[i], split.starts[i + 1]) + 1)
    assert not batch['queries'][i, length:].any() and not batch['oov'][i, length:].any()
  assert not batch['queries'][3].any() and not batch['oov'][3].any()
  np.testing.assert_array_equal(batch['history'], [1, 2, 3, 0])
  input_pipeline.padded_batch(split, rows=3, width=5)
  for rows, width in ((2, 5), (3, 4)):
    with pytest.raises(ValueError, match=f'do not fit a batch of {rows} rows of {width}'):
      input_pipeline.padded_batch(split, rows=rows, width=width)


def child_processes() -> list[int]:
  """The process ids whose parent is this process (Linux's /proc)."""
  found = []
  for entry in os.listdir('/proc'):
    if entry.isdigit():
      try:
        with open(f'/proc/{entry}/stat', encoding='ascii', errors='replace') as f:
          fields = f.read().rsplit(')', 1)[1].split()  # after the command's name
      except OSError:  # ended since
        continue
      if int(fields[1]) == os.getpid():
        found.append(int(entry))
  return found


def test_worker_process_yields_the_same_stream_from_a_memory_mapped_split(tmp_path):
  in_memory = make_split()
  np.save(tmp_path / 'queries.npy', in_memory.queries)
  split = SessionSplit('train', np.load(tmp_path / 'queries.npy', mmap_mode='r'),
                       in_memory.starts)
  kwargs = dict(queries_per_batch=QUERIES_PER_BATCH, seed=2)
  expected = take(input_pipeline.make_train_iterator(in_memory, **kwargs), 4)
  workers = input_pipeline.make_train_iterator(split, worker_count=1, **kwargs)
  got = take(workers, 4)
  built_by = child_processes()  # the worker, started with the first batch
  workers.close()
  assert built_by, 'no worker process was started'
  for want, have in zip(expected, got, strict=True):
    for key in want:
      np.testing.assert_array_equal(want[key], have[key])


def test_memory_mapped_queries_are_not_copied_into_worker_pickles(tmp_path):
  # 40k query rows (1.6 MB) of which the sessions use the first few: a pickled copy would show.
  queries = np.zeros((40_000, MAX_QUERY_WORDS), np.int32)
  small = make_split()
  queries[:len(small.queries)] = small.queries
  np.save(tmp_path / 'queries.npy', queries)
  split = SessionSplit('train', np.load(tmp_path / 'queries.npy', mmap_mode='r'), small.starts)
  batches = input_pipeline._Batches(split, QUERIES_PER_BATCH, 1, 0, 1, shuffle_seed=0)
  assert len(cloudpickle.dumps(batches)) < 100_000
  # A worker rebuilds the object through the same __getstate__ / __setstate__ pair that
  # deepcopy calls: the round trip without reading pickle bytes back.
  restored = copy.deepcopy(batches)
  for step in (0, 7):
    for key, value in batches(step).items():
      np.testing.assert_array_equal(restored(step)[key], value)


def test_bad_arguments_and_splits_are_named():
  split = make_split()
  with pytest.raises(ValueError, match=r'multiple_of \(3\).*process_count \(2\)'):
    input_pipeline.make_train_iterator(split, queries_per_batch=20, seed=0, multiple_of=3,
                                       process_count=2)
  with pytest.raises(ValueError, match='process_index 2'):
    input_pipeline.make_eval_iterator(split, queries_per_batch=20, multiple_of=2,
                                      process_index=2, process_count=2)
  empty = SessionSplit('train', np.zeros((0, 4), np.int32), np.zeros(1, np.int64))
  with pytest.raises(ValueError, match="'train' has no sessions"):
    input_pipeline.make_train_iterator(empty, queries_per_batch=20, seed=0)
  broken = SessionSplit('valid', split.queries, np.array([0, 3, 3, 7]))
  with pytest.raises(ValueError, match="'valid': session 1 has 0 queries"):
    input_pipeline.steps_per_epoch(broken, 20, 1)
  overrun = SessionSplit('test', split.queries[:5], np.array([0, 3, 7]))
  with pytest.raises(ValueError, match="'test': sessions end at row 7"):
    input_pipeline.make_eval_iterator(overrun, queries_per_batch=20)


def test_per_query_and_per_session_arrays_travel_with_their_rows():
  split = make_split()
  per_query = {'oov': np.arange(len(split.queries))[:, None].repeat(MAX_QUERY_WORDS, 1) + 1}
  per_session = {'history': (np.arange(split.num_sessions) + 1)[:, None, None]
                 * np.ones((1, 2, MAX_QUERY_WORDS), np.int64)}
  for batch in input_pipeline.make_eval_iterator(split, queries_per_batch=QUERIES_PER_BATCH,
                                                 per_query=per_query, per_session=per_session):
    for row, session in enumerate(batch['session_ids'].tolist()):
      if session < 0:  # a padding row: zeros
        assert not batch['oov'][row].any() and not batch['history'][row].any()
        continue
      first = split.starts[session]
      length = split.lengths[session]
      np.testing.assert_array_equal(batch['oov'][row, :length, 0],
                                    np.arange(first, first + length) + 1)
      assert (batch['history'][row] == session + 1).all()
  with pytest.raises(ValueError, match=r"per_session\['history'\] has 3 rows, the split 41"):
    input_pipeline.make_eval_iterator(split, queries_per_batch=QUERIES_PER_BATCH,
                                      per_session={'history': np.zeros((3, 2))})
