"""The requests the serving benchmarks send (no absl flags, so that every benchmark script
can import it): sessions of a workdir's test split cut at random positions, as a user of a
service is met at any point of a session.
"""

from __future__ import annotations

import os

import numpy as np

from mtn_jax.data import preprocess
from mtn_jax.data import sessions


def request_sessions(workdir: str, count: int, max_queries: int, seed: int) -> list[list[str]]:
  """`count` sessions of the test split, each cut after a random position (at most
  `max_queries` queries, the latest)."""
  split = sessions.load_split(preprocess.data_dir(os.path.abspath(workdir)), 'test')
  rng = np.random.default_rng(seed)
  out = []
  for i in rng.integers(0, split.num_sessions, count):
    texts = split.session_texts(int(i))
    end = int(rng.integers(1, len(texts) + 1))
    out.append(texts[:end][-max_queries:])
  return out
