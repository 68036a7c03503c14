"""Crash-safe checkpoints with orbax: a checkpoint is the whole run.

`<workdir>/checkpoints/<step>/` holds the items
  params     model parameters (all a decoder needs)
  train      optimizer state, step and dropout key
  data_iter  the input iterator's position (grain state, JSON)
  meta       the model's architecture ('model') and whole config ('model_config'), vocabulary
             fingerprint, validation losses, best step, the run's config
  vocab      the vocabulary's words
Orbax writes each checkpoint to a temporary folder and renames it when complete, so a crash
never leaves a half checkpoint that looks valid. The last `keep` checkpoints are kept, plus
the one with the lowest validation loss, which each checkpoint's meta names (`best_step`).
The meta item also holds a digest of the params' and train's values (`values_digest`),
compared when they are read back: orbax reads data files changed after the save (a bit
flipped on disk) without complaint, as other values.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from mtn_jax import errors
from mtn_jax.data.vocab import Vocab
from mtn_jax.models.base import ModelConfig

class CheckpointMismatch(errors.Error, ValueError):
  """A checkpoint that belongs to another model or vocabulary."""


class DamagedCheckpoint(errors.Error):
  """A checkpoint whose files cannot be read (truncated, deleted, or garbage)."""


class SaveFailed(errors.Error):
  """A checkpoint the file system refused (a full disk); the message names the folder."""


@contextlib.contextmanager
def _one_error(describe: Callable[[str], errors.Error]):
  """What orbax, tensorstore or the JSON reader raise inside (many kinds, with long chains)
  becomes `describe(its first cause)`, one line; the project's own errors pass as they are."""
  try:
    yield
  except errors.Error:
    raise
  except Exception as e:  # pylint: disable=broad-except
    raise describe(_first_cause(e)) from e


def _damaged(manager: ocp.CheckpointManager, step: int, cause: str) -> DamagedCheckpoint:
  """Checkpoint `step` cannot be used because of `cause`: named, with what the folder gives
  without it (the best checkpoint its newest remaining one names, and that newest one, which
  a resumed run continues from)."""
  folder = os.path.join(str(manager.directory), str(step))
  others = sorted(s for s in manager.all_steps() if s != step)
  advice = ''
  if others:
    best = _LatestAndBest(str(manager.directory), keep=0)._named_best(others)  # pylint: disable=protected-access
    if best == step:  # the others' record names it: moving it out leaves no best
      advice = ('; it is the checkpoint the newest one names as the best, which eval, decode '
                'and serve read: restore it from a copy (a resumed run continues from step '
                f'{others[-1]})')
    elif not os.path.exists(folder):
      advice = f'; it is gone: step {others[-1]} is the newest left'
    elif best in others and best != others[-1]:
      advice = (f'; move it out of the folder to use the others (then the best: step {best}; '
                f'the latest: step {others[-1]})')
    else:
      advice = f'; move it out of the folder to use step {others[-1]}'
  return DamagedCheckpoint(f'{folder}: a damaged or incomplete checkpoint ({cause}){advice}')


def _reading(manager: ocp.CheckpointManager, step: int):
  """Reading checkpoint `step`: a damaged file is named, with what to use instead."""
  return _one_error(lambda cause: _damaged(manager, step, cause))


def _writing(manager: ocp.CheckpointManager, what: str):
  """Saving, or waiting for an asynchronous save to end: a failure (a full disk) is named,
  with the last complete checkpoint."""
  def describe(cause: str) -> SaveFailed:
    latest = manager.latest_step()
    return SaveFailed(f'{manager.directory}: {what} failed ({cause}); '
                      + (f'the last complete checkpoint is step {latest}' if latest is not None
                         else 'no checkpoint is complete'))
  return _one_error(describe)


def _first_cause(e: BaseException) -> str:
  """The first exception of `e`'s chain, which says what is wrong ("OUT_OF_RANGE: Error
  reading ... params/", "No space left on device"): the later ones say only that a read or
  a write failed."""
  while True:
    earlier = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    if earlier is None:
      break
    e = earlier
  return f'{type(e).__name__}: ' + (str(e).strip().splitlines() or [''])[0][:240]


def finish(manager: ocp.CheckpointManager) -> None:
  """Waits for the checkpoint being saved in the background, if any."""
  with _writing(manager, 'saving a checkpoint'):
    manager.wait_until_finished()


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), 'checkpoints')


@dataclasses.dataclass
class _LatestAndBest:
  """Orbax's preservation policy here: the latest `keep` checkpoints, and the one the newest
  complete checkpoint names as best (its meta's `best_step`, the trainer's record, which
  `best_step` reads).

  Not orbax's BestN over the `valid_loss` metrics saved with a checkpoint: this version keeps
  those in the memory of the process that saved them only, so a resumed run deleted the best
  checkpoint of the run before it at its first save. A save decides what goes before its own
  checkpoint is complete, so the newest complete one is the one before it: a step that is
  best at that save is the save's own, kept as the latest.
  """

  directory: str
  keep: int

  def should_preserve(self, checkpoints: list, *, context) -> list[bool]:
    del context
    best = self._named_best([info.step for info in checkpoints])
    latest = len(checkpoints) - self.keep
    if best is _UNREADABLE:  # keep everything: the next save decides again
      return [True] * len(checkpoints)
    return [i >= latest or info.step == best for i, info in enumerate(checkpoints)]

  def _named_best(self, steps: list[int]):
    for step in sorted(steps, reverse=True):
      path = os.path.join(self.directory, str(step), 'meta', 'metadata')
      if not os.path.exists(path):
        continue  # being written (orbax renames a checkpoint's folder when it is complete)
      try:
        with open(path, encoding='utf-8') as f:
          return json.load(f).get('best_step')
      except (OSError, ValueError):
        return _UNREADABLE
    return None


_UNREADABLE = object()


def open_manager(workdir: str, keep: int = 2, read_only: bool = False) -> ocp.CheckpointManager:
  preservation = _LatestAndBest(checkpoint_dir(workdir), keep)
  options = ocp.CheckpointManagerOptions(preservation_policy=preservation, create=not read_only,
                                         read_only=read_only,
                                         save_interval_steps=0 if read_only else 1)
  if not read_only:
    return ocp.CheckpointManager(checkpoint_dir(workdir), options=options)
  # Orbax warns that a read-only manager's directory is read only, on every eval, decode and
  # suggest: what was asked for is no warning to a user.
  absl_logger = logging.getLogger('absl')
  level = absl_logger.level
  absl_logger.setLevel(logging.ERROR)
  try:
    return ocp.CheckpointManager(checkpoint_dir(workdir), options=options)
  finally:
    absl_logger.setLevel(level)


def architecture(cfg: ModelConfig) -> dict[str, Any]:
  """The fields of the model's config that fix its parameters and their meaning: all but
  `cfg.RUNTIME_FIELDS` (dropout, compute dtype, remat, layer layout), under which any
  checkpoint may be restored, and those its model does not read (`cfg.unread_fields()`)."""
  left_out = set(cfg.RUNTIME_FIELDS) | set(cfg.unread_fields())
  return {k: v for k, v in dataclasses.asdict(cfg).items() if k not in left_out}


# The meta key of the values' digests: {item: values_digest of it} for 'params' and 'train'.
DIGESTS = 'values_sha256'


def values_digest(tree) -> str:
  """A digest of `tree`'s values: per leaf, its dtype, shape and two checksums of its words
  (`_word_sums`), hashed by SHA-256. Paths are left out: a restored tree has the target's
  leaf order, which is the saved tree's, whatever container types orbax gives.

  The sums are computed where the values are: on an accelerator by one jitted program (a
  checkpoint's state can be gigabytes there, and copying it to the host would cost more
  than the save), on the host by NumPy (no program to trace and compile in each run)."""
  leaves = _value_leaves(tree)
  on_host = all(not isinstance(x, jax.Array) or (
      all(d.platform == 'cpu' for d in x.devices())
      and (x.is_fully_addressable or x.is_fully_replicated)) for x in leaves)
  if on_host:  # a replicated array of several processes read from this one's copy
    sums = [_word_sums(_host_words(x if not isinstance(x, jax.Array) or x.is_fully_addressable
                                   else x.addressable_data(0)), np) for x in leaves]
  else:
    sums = np.asarray(_device_word_sums(leaves)).reshape(-1, 2)
  digest = hashlib.sha256()
  for leaf, (total, placed) in zip(leaves, sums):
    digest.update(f'{np.dtype(leaf.dtype).name}{tuple(leaf.shape)}{total},{placed};'.encode())
  return digest.hexdigest()


def _value_leaves(tree) -> list:
  """`tree`'s leaves as arrays: Python scalars made NumPy's, PRNG keys their uint32 data."""
  return [np.asarray(x) if not hasattr(x, 'dtype') else
          jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
          else x for x in jax.tree.leaves(tree)]


def _word_sums(words, xp) -> tuple:
  """The sum of `words` (uint32) and the sum of each word times its place (from 1), both
  modulo 2**32, in the array module `xp` (NumPy or jax.numpy: the same integers). A flipped
  bit changes a word by a power of two, so always the first sum; the second changes where
  words are swapped."""
  words = words.reshape(-1)
  place = xp.arange(1, words.size + 1, dtype=xp.uint32)
  return words.sum(dtype=xp.uint32), (words * place).sum(dtype=xp.uint32)


def _host_words(x) -> np.ndarray:
  """A host array's bits as uint32 words: 4- and 8-byte values split into them (JAX, without
  x64, would narrow 8-byte ones), 2- and 1-byte values' bits widened, booleans as 0 or 1."""
  x = np.ascontiguousarray(x)
  if x.dtype == np.bool_:
    return x.astype(np.uint32)
  if x.dtype.itemsize % 4 == 0:
    return x.view(np.uint32)
  return x.view(np.uint16 if x.dtype.itemsize == 2 else np.uint8).astype(np.uint32)


@jax.jit
def _device_word_sums(leaves: list) -> jax.Array:
  """[2 * len(leaves)] uint32: `_word_sums` of each leaf's words (as `_host_words` makes
  them), where the leaves are."""
  sums = []
  for x in leaves:
    if x.dtype == jnp.bool_:
      words = x.astype(jnp.uint32)
    elif x.dtype.itemsize == 4:
      words = jax.lax.bitcast_convert_type(x, jnp.uint32)
    else:  # 2 or 1 bytes: their bits, widened
      narrow = jnp.uint16 if x.dtype.itemsize == 2 else jnp.uint8
      words = jax.lax.bitcast_convert_type(x, narrow).astype(jnp.uint32)
    sums += _word_sums(words, jnp)
  return jnp.stack(sums) if sums else jnp.zeros((0,), jnp.uint32)


def _first_values_digest(tree) -> str:
  """`values_digest` as the checkpoints of its first version (2026-11-28, 62484e9 to
  b52f81e) wrote it, on the host: the same word sums of 1- to 4-byte values, but 8-byte
  values narrowed to 4 bytes (as JAX without x64 took them), 1-byte values converted rather
  than their bits widened, and the dtype, shape and sums written otherwise. Read only to
  check such a checkpoint."""
  digest = hashlib.sha256()
  for leaf in _value_leaves(tree):
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
      x = np.asarray(leaf.addressable_data(0))
    else:
      x = np.asarray(leaf)
    if x.dtype.itemsize == 8 and x.dtype.kind in 'iuf':
      x = x.astype({'i': np.int32, 'u': np.uint32, 'f': np.float32}[x.dtype.kind])
    if x.dtype.itemsize >= 4:
      words = np.ascontiguousarray(x).view(np.uint32)
    elif x.dtype.itemsize == 2:
      words = np.ascontiguousarray(x).view(np.uint16).astype(np.uint32)
    else:
      words = x.astype(np.uint32)
    sums = np.asarray(_word_sums(words, np), np.uint32)
    digest.update(f'{np.dtype(leaf.dtype).str}{tuple(leaf.shape)}{tuple(sums)};'.encode())
  return digest.hexdigest()


def _check_values(manager: ocp.CheckpointManager, step: int, restored: dict) -> None:
  """Refuses restored items whose values are not those saved (a checkpoint saved before the
  digests existed is read as before, one of their first version checked as it was written)."""
  saved = restored['meta'].get(DIGESTS, {})
  for item in ('params', 'train'):
    if item in restored and item in saved and values_digest(restored[item]) != saved[item]:
      if _first_values_digest(restored[item]) == saved[item]:
        continue
      raise _damaged(manager, step, f'the values read from {item}/ are not those saved: '
                     'its files changed after it was written')


def save(manager: ocp.CheckpointManager, step: int, *, params, train_state, data_iter: dict,
         meta: dict, vocab: Vocab) -> None:
  """Saves asynchronously; `meta['best_step']` names the checkpoint to keep as the best
  (`_LatestAndBest`). The trainer decides when to save (`force`: Orbax's own interval policy
  is not consulted), and a save Orbax declines anyway is an error, never a checkpoint
  silently missing."""
  meta = {**meta, DIGESTS: {'params': values_digest(params),
                            'train': values_digest(train_state)}}
  # The checkpoint before it may still be written in the background: a failure there is its.
  with _writing(manager, f'saving the checkpoint before step {step}'):
    manager.wait_until_finished()
  with _writing(manager, f'saving the checkpoint of step {step}'):
    saved = manager.save(step, force=True, args=ocp.args.Composite(
        params=ocp.args.StandardSave(params),
        train=ocp.args.StandardSave(train_state),
        data_iter=ocp.args.JsonSave(data_iter),
        meta=ocp.args.JsonSave(meta),
        vocab=ocp.args.JsonSave(vocab.to_json())))
  if not saved:
    raise RuntimeError(f'Orbax did not save step {step} in {manager.directory}')


def architecture_differences(saved: dict, cfg: ModelConfig) -> dict[str, tuple[Any, Any]]:
  """{field: (saved value, cfg's value)} where a checkpoint's saved architecture and `cfg`
  differ. Only the fields cfg's model has are compared (a checkpoint from before configs
  were per model also recorded other models' fields, which mean nothing here), and a field
  the checkpoint predates counts at its default."""
  defaults = {f.name: f.default for f in dataclasses.fields(cfg)
              if f.default is not dataclasses.MISSING}
  return {k: (saved.get(k, defaults.get(k)), v) for k, v in sorted(architecture(cfg).items())
          if saved.get(k, defaults.get(k)) != v}


def check_compatible(meta: dict, cfg: ModelConfig, vocab: Vocab, where: str) -> None:
  """Refuses a checkpoint whose model or vocabulary differs from the run's."""
  if meta['vocab_fingerprint'] != vocab.fingerprint:
    raise CheckpointMismatch(
        f'{where} was trained with another vocabulary (fingerprint {meta["vocab_fingerprint"]}, '
        f'{meta["vocab_size"]} words; this data has {vocab.fingerprint}, {len(vocab)} words): '
        'use the workdir it was trained in, or a new workdir')
  check_model(meta['model'], cfg, where)


def check_model(saved: dict, cfg: ModelConfig, where: str, ignore: tuple[str, ...] = ()) -> None:
  """Refuses a checkpoint whose saved architecture (`meta['model']`) differs from `cfg` in a
  field outside `ignore`: training would not resume it, and evaluation, decoding and
  suggestions would not be the config's (`inference.trained.check_config`)."""
  if saved.get('name', cfg.name) != cfg.name:  # its fields are another model's: not compared
    raise CheckpointMismatch(f'{where} holds another model (a {saved["name"]!r}, not the '
                             f'config\'s {cfg.name!r}): use the config it was trained with, or '
                             'a new workdir')
  diff = {k: v for k, v in architecture_differences(saved, cfg).items() if k not in ignore}
  if diff:
    detail = ', '.join(f'model.{k}: checkpoint {a!r} vs config {b!r}' for k, (a, b) in diff.items())
    raise CheckpointMismatch(f'{where} holds another model ({detail}): use the config it was '
                             'trained with, or a new workdir')


def saved_scan_layers(meta: dict) -> bool | None:
  """The layer layout a checkpoint's parameters are in (None: its model has no layer
  stacks). Older checkpoints recorded it with the architecture, newer with the whole config."""
  return meta.get('model_config', meta['model']).get('scan_layers')


def restore(manager: ocp.CheckpointManager, step: int, *, abstract_params,
            abstract_train_state=None) -> dict[str, Any]:
  """Restores one checkpoint; without `abstract_train_state` only params, meta and vocab
  are read (offline decoding never loads optimizer state)."""
  items = dict(params=ocp.args.StandardRestore(abstract_params),
               meta=ocp.args.JsonRestore(), vocab=ocp.args.JsonRestore())
  if abstract_train_state is not None:
    items.update(train=ocp.args.StandardRestore(abstract_train_state),
                 data_iter=ocp.args.JsonRestore())
  with _reading(manager, step):
    restored = dict(manager.restore(step, args=ocp.args.Composite(**items)))
  _check_values(manager, step, restored)
  return restored


def read_json(manager: ocp.CheckpointManager, step: int, *names: str) -> dict:
  """{name: value} of the JSON items `names` ('meta', 'vocab') of checkpoint `step`, nothing
  else read; a damaged file is named."""
  with _reading(manager, step):
    return dict(manager.restore(step, args=ocp.args.Composite(
        **{name: ocp.args.JsonRestore() for name in names})))


def read_meta(manager: ocp.CheckpointManager, step: int) -> dict:
  return read_json(manager, step, 'meta')['meta']


def named_best_step(workdir: str) -> int | None:
  """The checkpoint `load_trained` restores, read from the checkpoints' meta
  files alone (no orbax manager): the step the newest complete checkpoint names as best, else
  that newest one; None without checkpoints."""
  folder = checkpoint_dir(workdir)
  steps = sorted(int(n) for n in os.listdir(folder) if n.isdigit()) if os.path.isdir(folder) else []
  if not steps:
    return None
  best = _LatestAndBest(folder, keep=0)._named_best(steps)  # pylint: disable=protected-access
  return steps[-1] if best is None or best is _UNREADABLE else int(best)


def best_step(manager: ocp.CheckpointManager) -> int | None:
  """The step of the lowest validation loss so far, as recorded by the latest checkpoint."""
  latest = manager.latest_step()
  if latest is None:
    return None
  return read_meta(manager, latest).get('best_step')
