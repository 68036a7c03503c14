"""Synthetic, AOL-shaped model inputs for the benchmarks (no absl flags, so that every
benchmark script can import it).
"""

from __future__ import annotations

import numpy as np

from mtn_jax.data.vocab import SPECIAL_TOKENS

# P(a query has k = 1..10 words), from the queries of at most 10 words of the real 500-user
# AOL sample (157k queries; mean 2.95 words).
QUERY_WORDS_MIX = (0.2037, 0.2564, 0.2251, 0.1445, 0.0815, 0.0418, 0.0213, 0.0103, 0.0064,
                   0.0033)


def synthetic_queries(rng: np.random.Generator, shape: tuple[int, ...], max_words: int,
                      vocab_size: int) -> np.ndarray:
  """int32 [*shape, max_words]: queries of 1..max_words words in `QUERY_WORDS_MIX`, 0-padded.

  Words are uniform over the ordinary ids (after the special tokens): which words appear
  changes no cost of a step.
  """
  if vocab_size <= len(SPECIAL_TOKENS):
    raise ValueError(f'--vocab_size must exceed the {len(SPECIAL_TOKENS)} special tokens, got '
                     f'{vocab_size}')
  mix = np.asarray(QUERY_WORDS_MIX[:max_words])
  lengths = rng.choice(np.arange(1, len(mix) + 1), size=shape, p=mix / mix.sum())
  words = rng.integers(len(SPECIAL_TOKENS), vocab_size, (*shape, max_words), np.int32)
  return np.where(np.arange(max_words) < lengths[..., None], words, 0).astype(np.int32)


# Earlier queries per session in the synthetic batches of a model with a user memory: the
# personalised configs' `data.history_queries` when the config sets none.
HISTORY_QUERIES = 20


def model_inputs(task, queries: np.ndarray, history_queries: int,
                 seed: int = 0) -> dict[str, np.ndarray]:
  """Every batch key the task's model reads, for the sessions `queries` int32 [B, S, n]:
  'oov' zeros (no word outside the vocabulary), 'history' [B, M, n] synthetic earlier queries
  of each session's user (M = `history_queries`, or HISTORY_QUERIES when 0)."""
  inputs = {'queries': queries}
  if 'oov' in task.input_keys:
    inputs['oov'] = np.zeros_like(queries)
  if 'history' in task.input_keys:
    rng = np.random.default_rng(seed)
    inputs['history'] = synthetic_queries(
        rng, (queries.shape[0], history_queries or HISTORY_QUERIES), queries.shape[2],
        int(queries.max()) + 1)
  return inputs
