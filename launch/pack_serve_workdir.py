"""A trained workdir packed as the service reads it, for a machine that only serves it.

  python launch/pack_serve_workdir.py --workdir=W --out=DIR [--config=configs/aol.py:small]

DIR/ gets W's config.json, its prepared data, the checkpoints the service restores (the
latest, whose meta names the best, and the best) without the optimizer state and the input
pipeline's position, and the learned ranker if W has one; DIR/serve_args.txt holds the
`--set section.key=value` overrides that make `--config` the config W was trained with, the
ranker's sources and rounds as it was fitted (`launch/bench_serve.py` takes them as they
are). A key whose value differs and is a list is refused: an override cannot express it; so
is a base config of another model. launch/gpu_serve_workdir.sh packs d_serve's workdir so.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import Any, Iterator

from absl import app
from absl import flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=g-import-not-at-top,wrong-import-position
from mtn_jax import cli
from mtn_jax.inference import learned
from mtn_jax.training import checkpoints
# pylint: enable=g-import-not-at-top,wrong-import-position

# What serving reads of a checkpoint; the optimizer state ('train') and the input pipeline's
# position ('data_iter') are for resuming training.
SERVED_ITEMS = ('_CHECKPOINT_METADATA', 'commit_success.txt', 'meta', 'params', 'vocab')
# Acted on when training ends, never by the service.
TRAINING_ONLY = ('serve.prepare_after_train',)


def _leaves(tree: dict, prefix: str = '') -> Iterator[tuple[str, Any]]:
  for key, value in tree.items():
    if isinstance(value, dict):
      yield from _leaves(value, f'{prefix}{key}.')
    else:
      yield f'{prefix}{key}', list(value) if isinstance(value, tuple) else value


def overrides(trained: dict, base: dict) -> list[str]:
  """['--set=section.key=value', ...]: the scalar settings of `trained` (a workdir's config,
  as config.json holds it) that differ from `base`'s, in `trained`'s order. Keys `base` lacks
  are left out; a list that differs raises ValueError, naming the key."""
  base_values = dict(_leaves(base))
  # A config holds its model's keys only: another model's is another config file.
  name = trained.get('model', {}).get('name')
  if name != base_values.get('model.name'):
    raise ValueError(f"the workdir's model is {name!r}, the base config's "
                     f"{base_values.get('model.name')!r}: pass --config of a {name!r} config")
  out = []
  for key, value in _leaves(trained):
    if key not in base_values or value == base_values[key] or key in TRAINING_ONLY:
      continue
    if isinstance(value, list):
      raise ValueError(f'{key}={value!r} differs from the base config ({base_values[key]!r}), '
                       'and a list cannot be passed as an override')
    out.append(f'--set={key}={value}')
  return out


def served_steps(workdir: str) -> list[int]:
  """The checkpoint steps the service reads: the latest and the best it names."""
  manager = checkpoints.open_manager(workdir, read_only=True)
  try:
    latest = manager.latest_step()
    if latest is None:
      raise ValueError(f'{checkpoints.checkpoint_dir(workdir)}: no checkpoint')
    best = checkpoints.best_step(manager)
  finally:
    manager.close()
  return sorted({latest, latest if best is None else best})


def pack(workdir: str, out: str, base: dict) -> list[str]:
  """Copies what the service reads of `workdir` into `out` (a new folder); returns the
  overrides written to out/serve_args.txt."""
  config_path = os.path.join(workdir, 'config.json')
  if not os.path.exists(config_path):
    raise ValueError(f'{workdir}: no config.json (not a trained workdir)')
  with open(config_path, encoding='utf-8') as f:
    trained = json.load(f)['config']
  meta = learned.LearnedRanker.read_meta(workdir)
  if meta is not None:
    # config.json is written when the generator's training starts; a ranker refitted since
    # (--mode=train again with another plan) records its own sources and rounds, which the
    # service uses: the overrides say so, not the older config.
    trained['suggest'] = {**trained.get('suggest', {}),
                          'sources': learned.plan_text(meta['sources']),
                          'ranker_rounds': meta['rounds']}
  sets = overrides(trained, base)
  os.makedirs(out)
  shutil.copy(config_path, out)
  shutil.copytree(os.path.join(workdir, 'data'), os.path.join(out, 'data'))
  for step in served_steps(workdir):
    source = os.path.join(checkpoints.checkpoint_dir(workdir), str(step))
    target = os.path.join(checkpoints.checkpoint_dir(out), str(step))
    os.makedirs(target)
    for item in SERVED_ITEMS:
      copy = shutil.copytree if os.path.isdir(os.path.join(source, item)) else shutil.copy
      copy(os.path.join(source, item), os.path.join(target, item))
  if meta is not None:
    os.makedirs(learned.ranker_dir(out))
    for name in (learned.RANKER_MODEL, learned.RANKER_META):
      shutil.copy(os.path.join(learned.ranker_dir(workdir), name), learned.ranker_dir(out))
  with open(os.path.join(out, 'serve_args.txt'), 'w', encoding='utf-8') as f:
    f.write(''.join(line + '\n' for line in sets))
  return sets


def main(argv) -> None:
  del argv
  cli.quiet_library_logs()
  args = flags.FLAGS
  sets = pack(os.path.abspath(args.workdir), args.out, args.config.to_dict())
  print(f'{args.out}: {args.workdir} packed to serve; overrides of the config: '
        + (' '.join(sets) or 'none'))


if __name__ == '__main__':
  # Defined here, not on import: tests import `pack` beside other scripts' flags.
  config_flags.DEFINE_config_file('config', 'configs/aol.py:small')
  flags.DEFINE_string('workdir', None, 'A trained workdir.', required=True)
  flags.DEFINE_string('out', None, 'The packed workdir (a new folder).', required=True)
  app.run(main)
