"""The generator's suggestions: every (session prefix -> next query) pair of a split
beam-searched on all devices (and hosts).

Each batch of sessions `queries` int32 [batch, queries, tokens] goes through the model once
without its last query (the contexts of positions 0..S-2 do not depend on it), and all S-1
positions of every session are searched in parallel. Candidates are the best hypotheses'
words joined by spaces (an emitted `<unk>` stays `<unk>`).
"""

from __future__ import annotations

import time

import jax
from jax.experimental import multihost_utils

from mtn_jax import inference
from mtn_jax import parallel
from mtn_jax.data import sessions
from mtn_jax.decoding import search
from mtn_jax.inference import inputs
from mtn_jax.models.base import context_batch

PROGRESS_SECONDS = 10.0  # at most one progress line per this many seconds


def decode_split(trained: inference.Trained, split: sessions.SessionSplit,
                 settings: search.SearchSettings, *, queries_per_batch: int, log=print
                 ) -> list[list[dict]]:
  """Beam-searches every pair of `split`.

  Args:
    trained: the model to decode with.
    split: sessions to decode; each batch is [rows, S, n] of one session length.
    settings: the search, and how its hypotheses are ordered and cut
      (`search.ranked_suggestions`).
    queries_per_batch: query slots per batch, as for the input pipeline.
    log: where progress lines go.
  Returns:
    [pairs] each pair's suggestions [{'query', 'score', ...}], best first (words joined by
    spaces, an empty beam slot left out).
  """
  vocab = trained.vocab
  mesh = parallel.make_mesh()
  # Batches are split over every device, so the parameters go to every device too.
  params = jax.device_put(trained.params, parallel.replicated(mesh))
  suggestions: list[list[dict] | None] = [None] * split.num_pairs
  done = 0
  start = last_log = time.time()
  for batch in inputs.split_batches(
      trained.task, vocab, split, queries_per_batch=queries_per_batch,
      multiple_of=jax.device_count(), process_index=jax.process_index(),
      process_count=jax.process_count()):
    # The last query of a session is only ever a reference here.
    contexts = parallel.shard_batch(
        context_batch({k: batch[k] for k in trained.task.input_keys}), mesh)
    sequences, scores = trained.task.suggest(params, contexts, settings, positions='all')
    # Every process decoded its rows of the global batch: gather them all, in row order.
    sequences = multihost_utils.process_allgather(sequences, tiled=True)
    scores = multihost_utils.process_allgather(scores, tiled=True)
    session_ids = multihost_utils.process_allgather(batch['session_ids'], tiled=True)
    for row, session in enumerate(session_ids.tolist()):
      if session < 0:
        continue
      texts = split.session_texts(session)
      copied = trained.copied_words(texts)
      for t in range(sequences.shape[1]):
        pair = int(split.first_pairs[session]) + t
        suggestions[pair] = search.ranked_suggestions(
            vocab, sequences[row, t], scores[row, t], settings, session=texts[:t + 1],
            oov_words=copied)
      done += 1
    if time.time() - last_log >= PROGRESS_SECONDS or done == split.num_sessions:
      last_log = time.time()
      log(f'  decoded {done:,}/{split.num_sessions:,} sessions '
          f'({done / max(last_log - start, 1e-9):.1f} sessions/s)', flush=True)
  missing = [i for i, c in enumerate(suggestions) if c is None]
  if missing:
    raise RuntimeError(f'{len(missing)} test pairs were not decoded (first: pair {missing[0]})')
  return suggestions
