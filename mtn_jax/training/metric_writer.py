"""Training logs a person can follow: stdout, `<workdir>/metrics.jsonl` and TensorBoard.

Only process 0 writes; other processes get a writer that does nothing, so callers never branch.
"""

from __future__ import annotations

import json
import os
import time

import jax

from mtn_jax import files


class MetricWriter:
  """Writes scalars to a JSONL file (one object per call) and TensorBoard (tensorboardX)."""

  def __init__(self, workdir: str, enabled: bool | None = None, resumed_at: int | None = None,
               redo_validation: bool = False):
    """With `resumed_at` (a run resumed from the checkpoint of that step), the records a
    crashed or stopped run wrote after its checkpoint are dropped first, and with
    `redo_validation` the validation at that step too: the resumed run writes them again, and
    a reader taking a step's last record would otherwise read the lost run's."""
    self.enabled = jax.process_index() == 0 if enabled is None else enabled
    self._jsonl = self._tb = None
    if self.enabled:
      os.makedirs(workdir, exist_ok=True)
      path = os.path.join(workdir, 'metrics.jsonl')
      if resumed_at is not None and os.path.exists(path):
        with open(path, encoding='utf-8') as f:
          lines = [line for line in f if line.strip()]
        kept = [line for line in lines if _kept(json.loads(line), resumed_at, redo_validation)]
        if len(kept) < len(lines):
          files.write_text(path, ''.join(kept))
      self._jsonl = open(path, 'a', encoding='utf-8')
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      # TensorBoard hides what a stopped run logged after its checkpoint (the resumed run
      # logs those steps again), as the JSONL drops it; a validation at the checkpoint's own
      # step that is redone (`redo_validation`) shows twice there, with the same loss.
      self._tb = SummaryWriter(os.path.join(workdir, 'tensorboard'),
                               purge_step=None if resumed_at is None else resumed_at + 1)

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


def _kept(record: dict, resumed_at: int, redo_validation: bool) -> bool:
  return record['step'] < resumed_at or (record['step'] == resumed_at and not (
      redo_validation and record['kind'] == 'valid'))


def read_metrics(workdir: str, kind: str | None = None) -> list[dict]:
  """The records of `<workdir>/metrics.jsonl`, optionally of one kind."""
  path = os.path.join(workdir, 'metrics.jsonl')
  if not os.path.exists(path):
    return []
  with open(path, encoding='utf-8') as f:
    records = [json.loads(line) for line in f if line.strip()]
  return [r for r in records if kind is None or r['kind'] == kind]
