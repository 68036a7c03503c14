"""The requests the serving benchmarks send (no absl flags, so that every benchmark script
can import it): sessions of a workdir's test split cut at random positions, as a user of a
service is met at any point of a session.
"""

from __future__ import annotations

import os

import numpy as np

from mtn_jax.data import preprocess
from mtn_jax.data import sessions
from mtn_jax.inference import habits


def _cuts(split: sessions.SessionSplit, count: int, seed: int):
  """(session index, its queries up to a random position) of `count` sessions of `split`."""
  rng = np.random.default_rng(seed)
  for i in rng.integers(0, split.num_sessions, count):
    texts = split.session_texts(int(i))
    yield int(i), texts[:int(rng.integers(1, len(texts) + 1))]


def request_sessions(workdir: str, count: int, max_queries: int, seed: int) -> list[list[str]]:
  """`count` sessions of the test split, each cut after a random position (at most
  `max_queries` queries, the latest)."""
  split = sessions.load_split(preprocess.data_dir(os.path.abspath(workdir)), 'test')
  return [texts[-max_queries:] for _, texts in _cuts(split, count, seed)]


def request_histories(workdir: str, count: int, seed: int) -> list[tuple[str, ...]]:
  """The earlier queries of the user of each of `request_sessions`' sessions (the same
  arguments draw the same sessions), oldest first, as evaluation reads them."""
  data_dir = preprocess.data_dir(os.path.abspath(workdir))
  split = sessions.load_split(data_dir, 'test')
  pasts = habits.past_queries(data_dir, split)
  return [pasts[i] for i, _ in _cuts(split, count, seed)]


def request_users(workdir: str, count: int, seed: int) -> list[str]:
  """The user of each of `request_sessions`' sessions (the same arguments draw the same
  sessions), as a request names them."""
  split = sessions.load_split(preprocess.data_dir(os.path.abspath(workdir)), 'test')
  return [str(int(split.users[i])) for i, _ in _cuts(split, count, seed)]
