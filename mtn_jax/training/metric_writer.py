"""Training logs a person can follow: stdout, `<workdir>/metrics.jsonl` and TensorBoard.

Only process 0 writes; other processes get a writer that does nothing, so callers never branch.
"""

from __future__ import annotations

import json
import os
import time

import jax

from mtn_jax import errors
from mtn_jax import files


class MetricWriter:
  """Writes scalars to a JSONL file (one object per call) and TensorBoard (tensorboardX)."""

  def __init__(self, workdir: str, enabled: bool | None = None, resumed_at: int | None = None,
               redo_validation: bool = False):
    """With `resumed_at` (a run resumed from the checkpoint of that step; 0 for one started
    afresh, which says so where it drops records), the records a crashed or stopped run wrote
    after its checkpoint are dropped first, and with `redo_validation` the validation at that
    step too: the resumed run writes them again, and a reader taking a step's last record
    would otherwise read the lost run's. A last line cut
    short (a run stopped while writing it) is dropped, and said so; another line that is no
    record is an error naming it."""
    self.enabled = jax.process_index() == 0 if enabled is None else enabled
    self._jsonl = self._tb = None
    if self.enabled:
      os.makedirs(workdir, exist_ok=True)
      path = os.path.join(workdir, 'metrics.jsonl')
      if os.path.exists(path):
        lines, records, cut, as_read = _read(path)
        if cut:
          print(f'Note: {path}: its last line was cut short (a run stopped while writing '
                'it): dropped.', flush=True)
        kept = [line for line, record in zip(lines, records)
                if resumed_at is None or _kept(record, resumed_at, redo_validation)]
        if resumed_at == 0 and len(kept) < len(lines):
          print(f'Note: {path}: {len(lines) - len(kept)} records of a run that left no '
                'checkpoint: dropped.', flush=True)
        if len(kept) < len(lines) or not as_read:
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


def _read(path: str) -> tuple[list[str], list[dict], bool, bool]:
  """(lines, their records, whether a last line cut short was left out, whether the lines are
  the file as it is) of a metrics file, each line ending in its newline; a line that is no
  record (not UTF-8 JSON of a step), but for a last line without its newline, raises naming
  it."""
  with open(path, 'rb') as f:
    data = f.read()
  raw_lines = data.splitlines(keepends=True)
  kept, records, cut = [], [], False
  for number, raw in enumerate(raw_lines, 1):
    if not raw.strip():
      continue
    try:
      line = raw.decode('utf-8')
      record = json.loads(line)
      if not isinstance(record, dict) or not isinstance(record.get('step'), int):
        raise ValueError('no step')
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
      if number == len(raw_lines) and not raw.endswith(b'\n'):
        cut = True
        continue
      raise errors.Error(f'{path}:{number}: not a metrics record ({e}): move the file aside '
                         'to start it again') from None
    kept.append(line if line.endswith('\n') else line + '\n')
    records.append(record)
  return kept, records, cut, ''.join(kept).encode('utf-8') == data


def read_metrics(workdir: str, kind: str | None = None) -> list[dict]:
  """The records of `<workdir>/metrics.jsonl`, optionally of one kind (a last line cut
  short left out)."""
  path = os.path.join(workdir, 'metrics.jsonl')
  if not os.path.exists(path):
    return []
  _, records, _, _ = _read(path)
  return [r for r in records if kind is None or r['kind'] == kind]
