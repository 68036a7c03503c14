"""Training logs a person can follow: stdout, `<workdir>/metrics.jsonl` and TensorBoard.

Only process 0 writes; other processes get a writer that does nothing, so callers never branch.
"""

from __future__ import annotations

import json
import os
import time

import jax


class MetricWriter:
  """Writes scalars to a JSONL file (one object per call) and TensorBoard (tensorboardX)."""

  def __init__(self, workdir: str, enabled: bool | None = None):
    self.enabled = jax.process_index() == 0 if enabled is None else enabled
    self._jsonl = self._tb = None
    if self.enabled:
      os.makedirs(workdir, exist_ok=True)
      self._jsonl = open(os.path.join(workdir, 'metrics.jsonl'), 'a', encoding='utf-8')
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      self._tb = SummaryWriter(os.path.join(workdir, 'tensorboard'))

  def write(self, step: int, kind: str, scalars: dict[str, float]) -> None:
    """`kind` ('train', 'valid', ...) prefixes the TensorBoard tags and is kept in the JSONL."""
    if not self.enabled:
      return
    record = {'kind': kind, 'step': int(step), 'time': time.time(),
              **{k: float(v) for k, v in scalars.items()}}
    self._jsonl.write(json.dumps(record) + '\n')
    self._jsonl.flush()
    for k, v in scalars.items():
      self._tb.add_scalar(f'{kind}/{k}', float(v), int(step))
    self._tb.flush()

  def close(self) -> None:
    if self.enabled:
      self._jsonl.close()
      self._tb.close()


def read_metrics(workdir: str, kind: str | None = None) -> list[dict]:
  """The records of `<workdir>/metrics.jsonl`, optionally of one kind."""
  path = os.path.join(workdir, 'metrics.jsonl')
  if not os.path.exists(path):
    return []
  with open(path, encoding='utf-8') as f:
    records = [json.loads(line) for line in f if line.strip()]
  return [r for r in records if kind is None or r['kind'] == kind]
