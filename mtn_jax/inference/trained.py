"""Loads a trained model for decoding: parameters only, never optimizer state.

The model is rebuilt from the checkpoint's own saved config, so a run's current
`config.model` cannot make its checkpoint unloadable; only the fields that leave the
parameters' meaning unchanged (`ModelConfig.RUNTIME_FIELDS`: dropout, compute dtype, remat,
the layer layout) are taken from the current config. Whatever layout a checkpoint was
trained with, its layer stacks are run as Python loops here (`scan_layers=False`): the
layouts compute the same, but under `nn.scan` every step of a search's loop slices each
layer's weights out of the stack, which makes a lone request's beam slower on a CPU
(docs/PERFORMANCE.md, "The learned ranker in the pipeline"). Training keeps its own layout,
which decides how the parameters are drawn.

A run's own workdir is evaluated, decoded, suggested from and benchmarked with the config it
was trained with: `check_config` (and `load_trained` of the run) refuses another
`config.model` as training refuses to resume under one (the decoding settings, `config.decode`
and `config.suggest`, are free to change). Another workdir's model loaded by the run (a
ranker, a generator: `of_the_config=False`) is that checkpoint's, whatever `config.model` says.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
from jax.experimental.compilation_cache import compilation_cache
import ml_collections

from mtn_jax import errors
from mtn_jax import models
from mtn_jax import parallel
from mtn_jax import tasks
from mtn_jax.data import extended
from mtn_jax.data import preprocess
from mtn_jax.data import sessions
from mtn_jax.data.vocab import Vocab
from mtn_jax.models import layers
from mtn_jax.models.base import ModelConfig
from mtn_jax.training import checkpoints


@dataclasses.dataclass(frozen=True)
class Trained:
  task: tasks.Task
  params: Any
  vocab: Vocab
  step: int
  meta: dict

  @property
  def cfg(self) -> ModelConfig:
    return self.task.cfg

  @property
  def model(self) -> nn.Module:
    return self.task.model

  @property
  def query_words(self) -> int:
    """The most words of a query the model reads, as its corpus kept them: its token slots
    with a word vocabulary; with subword pieces, the corpus's `config.data.max_query_words`
    (the pieces then fill the slots, cut beyond as the corpus's were)."""
    if self.vocab.kind == 'word':
      return self.cfg.max_query_words
    data = self.meta.get('config', {}).get('data', {})
    return int(data.get('max_query_words', self.cfg.max_query_words))

  def copied_words(self, queries: Sequence[str]) -> list[str]:
    """The words outside the vocabulary that a copying model may write by extended id in a
    context of `queries` (`extended.oov_words`); none for a model that does not copy."""
    if not self.task.copies:
      return []
    return extended.oov_words([q.split() for q in queries], self.vocab)


def saved_model_config(meta: dict, model: ml_collections.ConfigDict) -> ModelConfig:
  """The checkpoint's model config (`meta`), with the runtime fields of `model` (the current
  `config.model`). Checkpoints written before the whole config was saved hold only the
  architecture; their runtime fields come from `model` alone."""
  saved = meta.get('model_config', meta['model'])
  config_class = models.spec(saved['name']).config_class
  # A config of another family (a ranker loaded by a recurrent generator's run) lacks some:
  # those stay the checkpoint's.
  runtime = {k: model[k] for k in config_class.RUNTIME_FIELDS if k in model}
  return config_class.from_fields({**runtime, **saved}, **runtime)


# Fields of a model's config that its data decides, not `config.model`.
DATA_SIZES = ModelConfig.DATA_FIELDS


def _step(manager, workdir: str) -> tuple[int, str]:
  """The best step (the latest where none was validated yet), and the checkpoint's name."""
  latest = manager.latest_step()
  if latest is None:
    raise errors.Error(f'no checkpoints in {checkpoints.checkpoint_dir(workdir)}: train first')
  step = checkpoints.best_step(manager)
  step = latest if step is None else step
  if step not in manager.all_steps():
    raise errors.Error(f'checkpoint {checkpoints.checkpoint_dir(workdir)}/{step}, which step '
                       f'{latest} names as the best, is gone (moved out or deleted): put it '
                       'back from a copy')
  return step, f'checkpoint {checkpoints.checkpoint_dir(workdir)}/{step}'


def _check_model(meta: dict, model: ml_collections.ConfigDict, where: str) -> None:
  """Refuses `model` (`config.model`) where it is not the model of the checkpoint `where`
  whose `meta` this is (`checkpoints.check_model`), the sizes its data decides aside."""
  saved = saved_model_config(meta, model)
  config_class = models.spec(model.name).config_class
  sizes = {k: getattr(saved, k, 0) for k in DATA_SIZES if k in config_class.field_names()}
  checkpoints.check_model(meta['model'], config_class.from_fields(model, **sizes), where,
                          ignore=DATA_SIZES)


def check_config(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Refuses `config.model` where it is not the model the checkpoint of `workdir` that
  `load_trained` restores was trained with, in the words training refuses it with
  (`checkpoints.check_model`): `eval`, `decode`, `suggest` and `serve` of a run use its own
  config, so that its results are never another config's. The settings that leave the parameters'
  meaning unchanged may differ: `config.decode`, `config.suggest`, and the model's runtime
  fields (`ModelConfig.RUNTIME_FIELDS`). A workdir without a checkpoint passes: loading it
  says what is missing."""
  workdir = os.path.abspath(workdir)
  if not os.path.isdir(checkpoints.checkpoint_dir(workdir)):
    return
  manager = checkpoints.open_manager(workdir, read_only=True)
  try:
    if manager.latest_step() is None:
      return
    step, where = _step(manager, workdir)
    meta = checkpoints.read_meta(manager, step)
  finally:
    manager.close()
  _check_model(meta, config.model, where)
  # A corpus of sentencepiece pieces is searched as training's config must search it, whatever
  # tokenizer and piece limit this config names (its corpus is the workdir's).
  built = preprocess.built_data_config(workdir)
  if (built.get('tokenizer') == 'sentencepiece'
      and issubclass(tasks.task_class(config.model), tasks.Suggests)):
    if problem := preprocess.subword_search_problem(config.decode, built['max_query_tokens']):
      raise errors.Error(f'the corpus of {workdir} is cut into sentencepiece pieces: {problem}')
  differences = preprocess.settings_differences(config.data, workdir)
  if differences:
    print(f'Note: the corpus of {workdir} was built with other config.data settings '
          f'({"; ".join(differences)}): its corpus and model stay as they were built and '
          'trained; these settings apply only to what this run reads itself (a log given to '
          'decode, a user\'s past).', flush=True)
  if meta.get('best_step') is None:
    print(f'Note: no checkpoint of {workdir} was validated yet (training stopped before its '
          f'first validation): the latest, step {step}, is used.', flush=True)


def load_trained(config: ml_collections.ConfigDict, workdir: str,
                 of_the_config: bool = True) -> Trained:
  """Restores the best (lowest validation loss) checkpoint of `workdir`, the latest where
  none was validated yet.

  The vocabulary and the model come from the checkpoint itself (see the module docstring);
  where the run is `of_the_config` (its --workdir, not another run the config names),
  `config.model` must be its model (`check_config`'s refusal), so that nothing measured or
  suggested with a config is another model's.
  """
  workdir = os.path.abspath(workdir)
  if not os.path.isdir(checkpoints.checkpoint_dir(workdir)):
    raise errors.Error(f'no checkpoints in {workdir}: train first (--mode=train)')
  manager = checkpoints.open_manager(workdir, read_only=True)
  try:
    step, where = _step(manager, workdir)
    head = checkpoints.read_json(manager, step, 'meta', 'vocab')
    meta, vocab = head['meta'], Vocab.from_json(head['vocab'])
    data_dir = preprocess.data_dir(workdir)
    if os.path.exists(os.path.join(data_dir, 'vocab.json')):
      data_vocab = sessions.load_vocab(data_dir)
      if data_vocab.fingerprint != vocab.fingerprint:
        raise checkpoints.CheckpointMismatch(
            f'{where} was trained with another vocabulary than {data_dir}/vocab.json')
    if meta['vocab_fingerprint'] != vocab.fingerprint:
      raise checkpoints.CheckpointMismatch(f'{where}: its vocabulary does not match its meta')
    if of_the_config:
      _check_model(meta, config.model, where)
    cfg = saved_model_config(meta, config.model)
    task = tasks.make_task(cfg, config.train, data_dir)
    saved_task = task.with_layout(checkpoints.saved_scan_layers(meta))
    task = task.with_layout(False)
    # On one device, whatever devices the run was trained on (the saved sharding names the
    # training machine's: another device count would not load). A batch given whole then
    # runs on that device alone: replicated parameters would have every device compute all
    # of it again (on a CPU, each on a core the others need). Who splits batches over the
    # devices replicates the parameters there (`sources.Generate.on_local_devices`,
    # `pool_ranking`). A run of several processes keeps them replicated on all: a transfer
    # from one device to every host's cannot be made.
    on_devices = (jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
                  if jax.process_count() == 1 else parallel.replicated(parallel.make_mesh()))
    abstract_params = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=on_devices),
        saved_task.abstract_params())
    params = checkpoints.restore(manager, step, abstract_params=abstract_params)['params']
    if getattr(getattr(saved_task, 'cfg', None), 'scan_layers', False):
      params = layers.convert_layer_layout(params, scan_layers=False)
  finally:
    manager.close()
  return Trained(task, params, vocab, step, meta)


def keep_compiled_programs(workdir: str, folder: str, log) -> None:
  """JAX's persistent compilation cache in `<workdir>/<folder>` (`config.serve.compile_cache`),
  unless the process has one already or `folder` is empty: the service's warm-up compiles a
  program per batch size and session length, and eval, decode and suggest theirs, which a
  later run (or a first start after `config.serve.prepare_after_train`) reads back instead.
  Every program is kept, however fast it compiled (JAX keeps only those over a second by
  default)."""
  if not folder or jax.config.jax_compilation_cache_dir:
    return
  path = os.path.join(os.path.abspath(workdir), folder)
  compilation_cache.set_cache_dir(path)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  # By default JAX points XLA's own GPU autotuning cache at a folder inside the cache, and
  # that path becomes part of every program's key: a workdir copied, moved or packed to be
  # served elsewhere would compile everything again. The programs themselves are cached
  # either way.
  jax.config.update('jax_persistent_cache_enable_xla_caches', 'none')
  # JAX decides whether to use a cache at its first compilation, which may have come before.
  compilation_cache.reset_cache()
  log(f'Compiled programs kept in {path}')
