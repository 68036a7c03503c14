"""Training and validation: pure jit-compiled steps, a resumable loop, orbax checkpoints.

`train_and_evaluate(config, workdir)` prepares (or reuses) the corpus, builds the model,
resumes from the latest checkpoint in `<workdir>/checkpoints` if there is one, and trains for
`config.train.num_epochs` epochs over whole sessions: one forward pass per session gives all
of its (prefix -> next query) predictions. After each epoch it measures the validation loss
and perplexity and keeps the best checkpoint (the paper's model selection).

The loop is a sequence of named pieces: `_StopRequests` (SIGINT and SIGTERM stop after a
checkpoint), `_TrainMonitor` (per-step metrics, the non-finite-loss guard, log lines and their
pace), `_record_validation` (the best model by validation loss) and `_checkpoint_due`. The
task (`mtn_jax.tasks`) owns the loss and the validation figures; `abstract_state` (from
`jax.eval_shape`) is the one description of the state that initialisation, restoring and the
benchmarks share.

Determinism: `config.seed` fixes the data order, the initial parameters and every dropout
mask (the key of step s is `fold_in(dropout_rng, s)`), so a resumed run reproduces an
uninterrupted one bit for bit on CPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import signal
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import flax
import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.experimental import multihost_utils

from mtn_jax import errors
from mtn_jax import files
from mtn_jax import models
from mtn_jax import parallel
from mtn_jax import tasks
from mtn_jax.data import candidate_pool
from mtn_jax.data import input_pipeline
from mtn_jax.data import preprocess
from mtn_jax.data import sessions
from mtn_jax.models import layers
from mtn_jax.models.base import ModelConfig
from mtn_jax.training import checkpoints
from mtn_jax.training import metric_writer


class NonFiniteLoss(errors.Error, RuntimeError):
  """Training produced a NaN or Inf loss or gradient; the last good checkpoint is left as it was."""


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 []
  params: Any
  opt_state: Any
  dropout_rng: jax.Array  # uint32 [2]; step s uses fold_in(dropout_rng, s)

  def optimizer_part(self) -> dict:
    """Everything but the params: the checkpoint's 'train' item."""
    return {'step': self.step, 'opt_state': self.opt_state, 'dropout_rng': self.dropout_rng}


# ---------------------------------------------------------------------------------------------
# Optimisation


def learning_rate_schedule(train: ml_collections.ConfigDict,
                           d_model: int | None) -> optax.Schedule:
  """'transformer': lr(s) = factor * d^-0.5 * min(s^-0.5, s * warmup^-1.5), s = step + 1
  (`d_model` None, a model without one: 'constant' only)."""
  if train.schedule == 'constant':
    return optax.constant_schedule(train.learning_rate)

  def schedule(step):
    s = jnp.asarray(step, jnp.float32) + 1.0
    return (train.learning_rate * d_model**-0.5
            * jnp.minimum(s**-0.5, s * train.warmup_steps**-1.5))
  return schedule


def make_optimizer(train: ml_collections.ConfigDict,
                   d_model: int | None) -> optax.GradientTransformation:
  adam = optax.adam(learning_rate_schedule(train, d_model), b1=train.adam_b1, b2=train.adam_b2,
                    eps=train.adam_eps)
  if train.grad_clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(train.grad_clip_norm), adam)
  return adam


# ---------------------------------------------------------------------------------------------
# State and steps


def _state_maker(task: tasks.Task, optimizer: optax.GradientTransformation):
  """rng -> the initial TrainState: parameters from the model's example batch, fresh
  optimizer state, a dropout key."""
  def create(rng):
    init_rng, dropout_rng = jax.random.split(rng)
    params = task.init_params(init_rng)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=optimizer.init(params), dropout_rng=dropout_rng)
  return create


def abstract_state(task: tasks.Task, optimizer: optax.GradientTransformation,
                   mesh) -> TrainState:
  """The state's shapes, dtypes and (replicated) shardings, computed without any work: the
  restore target, and what the benchmarks count."""
  shapes = jax.eval_shape(_state_maker(task, optimizer), jax.random.PRNGKey(0))
  sharding = parallel.replicated(mesh)
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                      shapes)


def create_state(task: tasks.Task, optimizer: optax.GradientTransformation,
                 seed: int, mesh) -> TrainState:
  """The initial state for `seed`, created replicated on the mesh by one jit."""
  return jax.jit(_state_maker(task, optimizer), out_shardings=parallel.replicated(mesh))(
      jax.random.PRNGKey(seed))


def train_step(state: TrainState, batch: dict, *, task: tasks.Task, optimizer,
               data_groups: int) -> tuple[TrainState, dict]:
  """One optimizer step on a batch of sessions (the task's `input_keys` of a batch dict).

  `data_groups` is the number of data-parallel shards the loss head keeps apart
  (`losses.session_losses`); `make_steps` binds the keyword arguments.
  """
  rng = jax.random.fold_in(state.dropout_rng, state.step)

  def loss_fn(params):
    sums = task.loss_sums(params, batch, train=True, rngs={'dropout': rng},
                          groups=data_groups)
    return task.training_loss(sums), sums

  grads, sums = jax.grad(loss_fn, has_aux=True)(state.params)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  sums['grad_norm'] = optax.tree.norm(grads)
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), sums


def eval_step(params, batch: dict, *, task: tasks.Task, data_groups: int) -> dict:
  return task.loss_sums(params, batch, train=False, groups=data_groups)


def make_steps(task: tasks.Task, optimizer, mesh):
  """(train step, eval step) with their static arguments bound, ready for `jax.jit`: one
  data-parallel loss group per device of the mesh."""
  return (functools.partial(train_step, task=task, optimizer=optimizer, data_groups=mesh.size),
          functools.partial(eval_step, task=task, data_groups=mesh.size))


# ---------------------------------------------------------------------------------------------
# Data


def _device_batches(dataset, keys: tuple[str, ...], mesh, prefetch: int,
                    examples_key: str = 'session_ids'):
  """An iterator of (the batch's `keys` as global arrays sharded on the mesh, its number of
  real examples: rows of `examples_key` >= 0), put on the devices `prefetch` batches ahead
  by a grain thread. Its state is that of the batch last returned, so a checkpoint resumes
  after the batch the step took.

  grain's thread prefetch, not a hand-written one: as fast within the noise, with the same
  exact resume (docs/PERFORMANCE.md, "Hand-written code against the library way").
  """
  def on_devices(batch):
    return (parallel.shard_batch({k: batch[k] for k in keys}, mesh),
            int((batch[examples_key] >= 0).sum()))
  return iter(grain.experimental.ThreadPrefetchIterDataset(
      dataset.map(on_devices), prefetch_buffer_size=prefetch))


def training_data(config: ml_collections.ConfigDict, workdir: str) -> tasks.TrainingData:
  """The run's data: the session corpus (`load_data`), or, for a task that brings its own
  data (`tasks.BringsOwnData`, e.g. IMDNA), what that task makes."""
  task_class = tasks.task_class(config.model)
  if issubclass(task_class, tasks.BringsOwnData):
    return task_class.training_data(config, workdir)
  vocab, splits = load_data(config, workdir)
  train_split, valid_split = splits['train'], splits['valid']
  held_out = ''
  if config.train.user_folds:
    folds = sessions.session_folds(train_split, config.train.user_folds,
                                   config.data.split_seed)
    total = train_split.num_sessions
    train_split = sessions.select_sessions(
        train_split, np.flatnonzero(folds != config.train.held_out_fold))
    held_out = (f', users of fold {config.train.held_out_fold} of {config.train.user_folds} '
                f'held out ({total - train_split.num_sessions:,} sessions)')
  if valid_split.num_sessions == 0:
    raise errors.Error('the valid split is empty: model selection needs validation sessions '
                       '(more data, or a larger config.data.split_fractions[1])')
  data_dir = preprocess.data_dir(workdir)
  task = tasks.make_task(model_config(config, vocab, train_split, data_dir), config.train,
                         data_dir)
  train_inputs = task.training_inputs(train_split, vocab)
  valid_inputs = task.training_inputs(valid_split, vocab)
  train = input_pipeline.make_train_dataset(
      train_split, queries_per_batch=config.input.train_queries_per_batch,
      seed=config.seed, multiple_of=jax.device_count(), process_index=jax.process_index(),
      process_count=jax.process_count(), worker_count=config.input.worker_count,
      per_query=train_inputs.per_query, per_session=train_inputs.per_session)
  valid_batches = functools.partial(
      input_pipeline.make_eval_iterator, valid_split,
      queries_per_batch=config.input.eval_queries_per_batch, multiple_of=jax.device_count(),
      process_index=jax.process_index(), process_count=jax.process_count(),
      per_query=valid_inputs.per_query, per_session=valid_inputs.per_session)
  steps = input_pipeline.steps_per_epoch(
      train_split, config.input.train_queries_per_batch, jax.device_count())
  return tasks.TrainingData(vocab, task, train, steps, valid_batches,
                      f'{train_split.num_sessions:,} training sessions '
                      f'({train_split.num_pairs:,} pairs){held_out}')


def prepare_corpus(config: ml_collections.ConfigDict, workdir: str, verbose: bool = False
                   ) -> None:
  """`preprocess.prepare` in every process: process 0 builds the corpus (or reuses it), the
  others then find it current (one build, under process 0's lock of the workdir).
  `verbose`: process 0 prints the summary."""
  if jax.process_index() == 0:
    preprocess.prepare(config, workdir, verbose=verbose)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices('corpus prepared')
    if jax.process_index() != 0:
      preprocess.prepare(config, workdir)


def load_data(config: ml_collections.ConfigDict, workdir: str):
  """Prepares (or reuses) the corpus (`prepare_corpus`): (vocab, {split: SessionSplit})."""
  prepare_corpus(config, workdir)
  data_dir = preprocess.data_dir(workdir)
  vocab = sessions.load_vocab(data_dir)
  splits = {s: sessions.load_split(data_dir, s) for s in sessions.SPLITS}
  return vocab, splits


def model_config(config: ml_collections.ConfigDict, vocab, split,
                 data_dir: str | None = None) -> ModelConfig:
  """The model's config: `config.model`'s fields of the named model, with the data's sizes
  (the vocabulary's and the queries'; for a model that has them, the candidate pool's and
  the number of training users + 1, read from `data_dir`)."""
  sizes = {'vocab_size': len(vocab), 'max_query_words': split.max_query_words}
  fields = models.spec(config.model.name).config_class.field_names()
  if 'num_items' in fields:
    sizes['num_items'] = len(candidate_pool.load_pool(data_dir))
  if 'num_users' in fields:
    sizes['num_users'] = (len(np.unique(split.users)) if split.users is not None else 0) + 1
  return models.make_config(config.model, **sizes)


def evaluate_loss(params, batches: Iterable[dict], *, task: tasks.Task, mesh,
                  eval_fn, should_stop=None) -> dict[str, float] | None:
  """The task's validation figures over one pass of `batches` (`task.summarize`).

  `eval_fn`: the jit-compiled eval step, (params, batch) -> sums (`make_steps`).
  `should_stop`: () -> bool, asked before each batch; True abandons the pass (None is
  returned), so that Ctrl-C stops a run within a batch wherever it is.
  """
  totals = None
  for batch in batches:
    if should_stop is not None and should_stop():
      return None
    sums = eval_fn(params, parallel.shard_batch({k: batch[k] for k in task.input_keys}, mesh))
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  return task.summarize(jax.device_get(totals))


# ---------------------------------------------------------------------------------------------
# Checkpoints of the run


def _run_meta(config: ml_collections.ConfigDict, cfg: ModelConfig, vocab) -> dict:
  """The checkpoint's 'meta' item at the start of a run."""
  return {'model': checkpoints.architecture(cfg), 'model_config': dataclasses.asdict(cfg),
          'model_name': cfg.name, 'vocab_fingerprint': vocab.fingerprint,
          'vocab_size': len(vocab), 'valid': [], 'best_step': None, 'best_valid_loss': None,
          'config': json.loads(config.to_json_best_effort()),
          'device_count': jax.device_count()}


# Which users a run trains without (a fold generator of the learned ranker's): another value
# would resume, or call complete, a generator that has seen the users it is to score.
HELD_OUT_KEYS = ('train.user_folds', 'train.held_out_fold')


def _check_data_order(saved_config: dict, config: ml_collections.ConfigDict, where: str,
                      order_keys: tuple[str, ...]) -> None:
  """Refuses to resume a checkpoint whose run had another value of one of `order_keys` (what
  fixes the batches and their order besides the data, `tasks.TrainingData.order_keys`: a
  resumed run continues the checkpoint's data iterator, so another value would give neither
  the one run nor the other) or of `HELD_OUT_KEYS`."""
  for key in order_keys + HELD_OUT_KEYS:
    saved, current = saved_config, config
    for part in key.split('.'):
      saved, current = (saved or {}).get(part), current[part]
    if saved is not None and saved != current:
      why = ('it was trained without other users' if key in HELD_OUT_KEYS else
             'a resumed run continues its batches in their order')
      raise checkpoints.CheckpointMismatch(
          f'{where} was trained with config.{key}={saved!r}, not {current!r}: {why}; use '
          f'{saved!r}, or a new workdir')


def _check_device_count(saved: int | None, where: str) -> None:
  """Refuses to resume a checkpoint of a run on another number of devices: each batch
  holds a multiple of it, so the batches and their order differ (a checkpoint older than
  this record is not checked)."""
  if saved is not None and saved != jax.device_count():
    raise checkpoints.CheckpointMismatch(
        f'{where} was trained on {saved} device(s), not {jax.device_count()}: a resumed run '
        'continues its batches in their order, and each batch holds a multiple of the device '
        f'count; resume on {saved} (--cpu_devices={saved} on a CPU), or use a new workdir')


# The sections of training's settings: a resumed run may change them (more epochs, another
# rate, another logging cadence), and says which it changed.
LEARNING_SECTIONS = ('train', 'model', 'input')


def changed_settings(saved_config: dict, config: dict) -> list[str]:
  """'config.train.learning_rate=0.9 (was 0.3)' for each key of `LEARNING_SECTIONS` whose
  value differs between a checkpoint's run (`saved_config`, its meta's JSON) and this run's
  (`config`, as JSON); a key one of them lacks is no change."""
  changed = []
  for section in LEARNING_SECTIONS:
    saved, current = saved_config.get(section) or {}, config.get(section) or {}
    for key in sorted(saved.keys() & current.keys()):
      if saved[key] != current[key]:
        changed.append(f'config.{section}.{key}={current[key]!r} (was {saved[key]!r})')
  return changed


def _restore(manager, step: int, *, task: tasks.Task, optimizer, mesh,
             saved_meta: dict) -> tuple[TrainState, dict]:
  """The TrainState and data-iterator state of checkpoint `step`, in this run's layer
  layout whichever layout the checkpoint holds (`layers.convert_layer_layout`)."""
  cfg = task.cfg
  saved_task = task.with_layout(checkpoints.saved_scan_layers(saved_meta))
  abstract = abstract_state(saved_task, optimizer, mesh)
  restored = checkpoints.restore(manager, step, abstract_params=abstract.params,
                                 abstract_train_state=abstract.optimizer_part())
  state = TrainState(params=restored['params'], **restored['train'])
  if saved_task is not task:
    state = jax.device_put(state.replace(
        params=layers.convert_layer_layout(state.params, scan_layers=cfg.scan_layers),
        opt_state=layers.convert_layer_layout(state.opt_state, scan_layers=cfg.scan_layers)),
        parallel.replicated(mesh))
  return state, restored['data_iter']


def _checkpoint_due(step: int, every: int) -> bool:
  return step % every == 0


def _record_validation(meta: dict, step: int, valid: dict) -> bool:
  """Adds a validation result to the run's meta; True when it is the best so far (the
  paper's model selection: the lowest validation loss)."""
  meta['valid'].append({'step': step, **valid})
  # A non-finite loss is never the best, nor kept as the best against a later finite one.
  best = math.isfinite(valid['loss']) and (
      meta['best_valid_loss'] is None or valid['loss'] < meta['best_valid_loss'])
  if best:
    meta['best_step'], meta['best_valid_loss'] = step, valid['loss']
  return best


def _best_so_far(meta: dict) -> str:
  """The best validation so far, in words for a log line (none while every loss was
  non-finite: `_record_validation` keeps no best then)."""
  if meta['best_valid_loss'] is None:
    return 'no finite validation loss yet'
  return f'best validation loss {meta["best_valid_loss"]:.4f} at step {meta["best_step"]}'


# ---------------------------------------------------------------------------------------------
# The loop's pieces


class _StopRequests:
  """SIGINT (Ctrl-C) and SIGTERM ask the loop to stop after the current step and a checkpoint.

  A second SIGINT while the first is being honoured aborts at once (KeyboardInterrupt), as a
  user who presses Ctrl-C twice expects. `signal_name` says which signal asked ('SIGINT',
  'SIGTERM') or is None. Handlers can only be installed from the main thread; elsewhere (a
  test calling the trainer from a thread) signals keep their default behaviour.
  """

  _SIGNALS = (signal.SIGINT, signal.SIGTERM)

  def __init__(self):
    self.signal_name: str | None = None
    self._previous: dict = {}

  def __enter__(self) -> _StopRequests:
    if threading.current_thread() is threading.main_thread():
      self._previous = {s: signal.signal(s, self._handle) for s in self._SIGNALS}
    return self

  def __exit__(self, *exc) -> None:
    for s, handler in self._previous.items():
      signal.signal(s, handler)

  def _handle(self, signum, frame) -> None:
    del frame
    if self.signal_name is not None and signum == signal.SIGINT:
      raise KeyboardInterrupt
    self.signal_name = self.signal_name or signal.Signals(signum).name

  @property
  def requested(self) -> bool:
    return self.signal_name is not None


class _TrainMonitor:
  """The per-step metrics of training: kept on the devices until a log line or a checkpoint
  needs them, then checked for a non-finite loss and written (stdout, metrics.jsonl,
  TensorBoard).

  Pace figures (sessions/s, tokens/s, the time left) leave out the time spent compiling the
  step for each new batch shape: counting it made a two-minute run announce half an hour left.
  The log line names them as the task counts them (`pace_words`: a batch's rows, the loss's
  'tokens'); metrics.jsonl keeps the keys 'sessions_per_s' and 'tokens_per_s'.
  """

  def __init__(self, *, writer, log, schedule, steps_per_epoch: int, total_steps: int,
               last_good_checkpoint, window: Sequence[dict] = (),
               pace_words: tuple[str, str] = ('sessions', 'tokens')):
    """`window`: the metrics of the steps after the last log line that a stopped run saved
    with its checkpoint (`window()`), so the resumed run's next line covers them too."""
    self._writer, self._log, self._schedule = writer, log, schedule
    self._pace_words = pace_words
    self._steps_per_epoch, self._total_steps = steps_per_epoch, total_steps
    self._last_good_checkpoint = last_good_checkpoint
    self._pending: list[tuple[int, dict]] = [
        (int(m['step']), {k: v for k, v in m.items() if k != 'step'}) for m in window]
    self._restored = len(window)  # the first pending steps are the stopped run's: no pace
    self._sessions = 0
    self._window_start, self._compile_seconds = time.time(), 0.0
    self._paused_seconds = 0.0

  def add(self, step: int, sums: dict, sessions: int, compile_seconds: float) -> None:
    """The metrics (device arrays, not waited for) of the step that started from state step
    `step` (the checkpoint a non-finite loss falls back to), and the seconds its call spent
    compiling."""
    self._pending.append((step, sums))
    self._sessions += sessions
    self._compile_seconds += compile_seconds

  def check(self) -> list[dict]:
    """Fetches the pending metrics; raises NonFiniteLoss at the first step whose loss or
    gradient is not finite (a finite loss with a NaN gradient makes NaN parameters: the
    step's update is not saved either)."""
    fetched = jax.device_get([m for _, m in self._pending])
    for (step, _), m in zip(self._pending, fetched):
      if not (np.isfinite(m['loss']) and np.isfinite(m['grad_norm'])):
        good = self._last_good_checkpoint()
        raise NonFiniteLoss(
            f'non-finite training loss or gradient (loss {m["loss"]}, gradient norm '
            f'{m["grad_norm"]}) at step {step}; stopped without saving. '
            + (good if good else 'No checkpoint was written yet.'))
    return fetched

  def window(self) -> list[dict]:
    """The metrics of the steps since the last log line, checked, as JSON for a checkpoint's
    meta (floats: the figures a log line sums)."""
    return [{'step': step, **{k: float(v) for k, v in m.items()}}
            for (step, _), m in zip(self._pending, self.check())]

  def pause(self, seconds: float) -> None:
    """Leaves `seconds` spent on no step (a checkpoint's save) out of the pace, as a
    compilation's are."""
    self._paused_seconds += seconds

  def restart_pace(self) -> None:
    """Starts the pace window afresh: the time just spent on validation and its checkpoint is
    no training time (counting it made the time left jump after every epoch)."""
    self._window_start, self._compile_seconds, self._paused_seconds = time.time(), 0.0, 0.0

  def write(self, step: int) -> None:
    """Checks the pending metrics and writes one log line over them."""
    if not self._pending:
      return
    fetched = self.check()
    totals = {k: sum(float(m[k]) for m in fetched) for k in fetched[0]}
    # The pace is of the steps this process ran in the window's time.
    ran = fetched[self._restored:] or fetched
    paced = {k: sum(float(m[k]) for m in ran) for k in ('pairs', 'tokens')}
    now = time.time()
    elapsed = max(now - self._window_start - self._compile_seconds - self._paused_seconds, 1e-9)
    tokens = max(totals['tokens'], 1.0)
    scalars = {
        'epoch': step / self._steps_per_epoch, 'loss': totals['loss'] / tokens,
        'nll': totals['nll'] / tokens, 'learning_rate': float(self._schedule(step - 1)),
        'grad_norm': totals['grad_norm'] / len(fetched),
        'sessions_per_s': self._sessions / elapsed, 'pairs_per_s': paced['pairs'] / elapsed,
        'tokens_per_s': paced['tokens'] / elapsed, 'steps_per_s': len(ran) / elapsed,
        'eta_s': elapsed / len(ran) * (self._total_steps - step),
        'compile_s': self._compile_seconds}
    self._writer.write(step, 'train', scalars)
    # The objective holds label smoothing (or an entropy term) where the config asks for it;
    # the validation loss is the plain cross-entropy, so that is shown beside it to compare.
    nll = ('' if math.isclose(scalars['loss'], scalars['nll'], rel_tol=1e-6, abs_tol=1e-6)
           else f' (cross-entropy {scalars["nll"]:.4f})')
    self._log(f'step {step}/{self._total_steps} epoch {scalars["epoch"]:.2f} loss '
              f'{scalars["loss"]:.4f}{nll} lr {scalars["learning_rate"]:.2e} '
              f'{scalars["sessions_per_s"]:.0f} {self._pace_words[0]}/s '
              f'{scalars["tokens_per_s"]:.0f} {self._pace_words[1]}/s, '
              f'{_duration(scalars["eta_s"])} left', flush=True)
    self._pending, self._sessions, self._restored = [], 0, 0
    self._window_start, self._compile_seconds, self._paused_seconds = now, 0.0, 0.0


# ---------------------------------------------------------------------------------------------
# The run


def _save_json(path: str, obj) -> None:
  files.write_text(path, json.dumps(obj, indent=2, sort_keys=True))


WorkdirBusy = files.WorkdirBusy


@contextlib.contextmanager
def training_alone(workdir: str):
  """Holds the workdir's lock (`files.workdir_alone`) for the block, or refuses: two runs
  training in one workdir would both write its corpus, checkpoints, ranker and every record
  of metrics.jsonl. The process that holds it takes it again at once (the main job holds it
  around training, which takes it again); process 0 of a multi-process run takes it and
  tells the others, so that they all refuse together."""
  workdir = os.path.abspath(workdir)
  with contextlib.ExitStack() as held:
    refusal = None
    if jax.process_index() == 0:
      try:
        held.enter_context(files.workdir_alone(workdir, 'training'))
      except WorkdirBusy as e:
        refusal = str(e)
    if jax.process_count() > 1:
      refused = bool(multihost_utils.broadcast_one_to_all(np.int32(refusal is not None)))
      if refused and refusal is None:
        refusal = f'{workdir}: another run is training in it (process 0 of this run found it)'
    if refusal is not None:
      raise WorkdirBusy(refusal)
    yield


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains (resuming if possible), alone in the workdir (`training_alone`); returns the
  final summary.

  The summary: 'step', 'total_steps', 'best_step', 'best_valid_loss', 'valid' (every
  validation result), 'stopped_by' ('SIGINT' or 'SIGTERM' when a signal stopped the run after
  a checkpoint, else None) and 'interrupted' (whether it did).
  """
  workdir = os.path.abspath(workdir)
  with training_alone(workdir):
    return _train_and_evaluate(config, workdir)


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  data = training_data(config, workdir)
  vocab, task, steps_per_epoch = data.vocab, data.task, data.steps_per_epoch
  cfg = task.cfg
  mesh = parallel.make_mesh()
  tc = config.train
  optimizer = make_optimizer(tc, config.model.get('d_model'))
  total_steps = steps_per_epoch * tc.num_epochs
  if tc.max_steps > 0:
    total_steps = min(total_steps, tc.max_steps)

  train_iter = _device_batches(data.train, task.input_keys, mesh,
                               config.input.prefetch_batches, data.examples_key)
  manager = checkpoints.open_manager(workdir, keep=tc.keep_checkpoints)
  meta = _run_meta(config, cfg, vocab)
  log = print if jax.process_index() == 0 else (lambda *a, **k: None)

  latest = manager.latest_step()
  window = []  # the metrics of the steps after the last log line (`_TrainMonitor`)
  if latest is None:
    state = create_state(task, optimizer, config.seed, mesh)
  else:
    where = f'checkpoint {checkpoints.checkpoint_dir(workdir)}/{latest}'
    try:  # a resume refused closes what it opened (a caller in the same process goes on)
      saved_meta = checkpoints.read_meta(manager, latest)
      checkpoints.check_compatible(saved_meta, cfg, vocab, where)
      _check_data_order(saved_meta.get('config', {}), config, where, data.order_keys)
      if latest < total_steps or saved_meta.get('pending_validation') is not None:
        _check_device_count(saved_meta.get('device_count'), where)  # a run that continues
      state, iter_state = _restore(manager, latest, task=task, optimizer=optimizer, mesh=mesh,
                                   saved_meta=saved_meta)
      train_iter.set_state(iter_state)
    except BaseException:
      train_iter.close()
      manager.close()
      raise
    meta.update({k: saved_meta[k] for k in ('valid', 'best_step', 'best_valid_loss')})
    window = saved_meta.get('train_window', [])
    pending = saved_meta.get('pending_validation')
    if pending is not None:
      meta['pending_validation'] = pending
    if latest >= total_steps and pending is None:
      manager.close()
      train_iter.close()
      trained_on = saved_meta.get('device_count')
      # Each bucket's batch is a multiple of the device count: on another count an epoch has
      # another number of steps.
      other_count = (f', or on {trained_on} device(s), where an epoch has other steps'
                     if trained_on not in (None, jax.device_count()) else '')
      of = (f'of {total_steps}' if latest == total_steps else
            f'past the {total_steps} this config trains (an earlier run trained further'
            f'{other_count})')
      log(f'Training is already complete: {where} is step {latest} {of} '
          f'({_best_so_far(meta)}).', flush=True)
      return _summary(latest, total_steps, meta, None)
    log(f'Resuming from {where} (step {latest} of {total_steps}, epoch '
        f'{latest // steps_per_epoch + 1} of {math.ceil(total_steps / steps_per_epoch)}).')
    changed = changed_settings(saved_meta.get('config', {}), meta['config'])
    if changed:
      log('Note: resuming with settings changed since its checkpoint: '
          + ', '.join(changed) + '; config.json records this run\'s.', flush=True)
  if jax.process_index() == 0:
    _save_json(os.path.join(workdir, 'config.json'),
               {'config': meta['config'], 'model': meta['model'], 'vocab_size': len(vocab)})

  log(f'Model {cfg.name}: {models.count_params(state.params):,} parameters, '
      f'{models.size_mb(state.params):.1f} MB (fp32); vocabulary {len(vocab):,} '
      f'{"words" if vocab.kind == "word" else "subword pieces"}; '
      f'{data.description}; '
      f'{steps_per_epoch} steps per epoch on {jax.device_count()} device(s); '
      f'{total_steps} steps in all.')

  state_sharding = parallel.replicated(mesh)
  train_fn, eval_fn = make_steps(task, optimizer, mesh)
  step_fn = jax.jit(train_fn, in_shardings=(state_sharding, parallel.batch_sharding(mesh)),
                    out_shardings=(state_sharding, state_sharding), donate_argnums=0)
  eval_fn = jax.jit(eval_fn)
  # A run started afresh drops what one killed before its first checkpoint logged.
  writer = metric_writer.MetricWriter(
      workdir, resumed_at=0 if latest is None else latest,
      redo_validation=latest is not None and meta.get('pending_validation') == latest)

  def last_good_checkpoint() -> str:
    good = manager.latest_step()
    return (f'Last good checkpoint: step {good} in {checkpoints.checkpoint_dir(workdir)}.'
            if good is not None else '')

  monitor = _TrainMonitor(writer=writer, log=log,
                          schedule=learning_rate_schedule(tc, config.model.get('d_model')),
                          steps_per_epoch=steps_per_epoch, total_steps=total_steps,
                          last_good_checkpoint=last_good_checkpoint,
                          window=window, pace_words=task.PACE_WORDS)
  step = int(jax.device_get(state.step))
  iter_state = train_iter.get_state()

  def save():
    # The steps since the last log line go with the checkpoint (a resumed run logs them).
    checkpoints.save(manager, step, params=state.params, train_state=state.optimizer_part(),
                     data_iter=iter_state, meta={**meta, 'train_window': monitor.window()},
                     vocab=vocab)

  def validate() -> bool:
    """The epoch's validation at `step`, recorded and saved with the checkpoint; False when a
    stop request cut it short: the checkpoint is saved without it, and the run that resumes
    from it validates first (`pending_validation`), as an uninterrupted run would have."""
    valid = evaluate_loss(state.params, data.valid_batches(), task=task, mesh=mesh,
                          eval_fn=eval_fn, should_stop=lambda: stop.requested)
    if valid is None:
      if meta.get('pending_validation') != step:  # else this step's checkpoint says so already
        meta['pending_validation'] = step
        save()
      return False
    writer.write(step, 'valid', valid)
    _record_validation(meta, step, valid)
    log(f'validation at step {step} (epoch {step / steps_per_epoch:.2f}): loss '
        f'{valid["loss"]:.4f}, {_figures(valid)} ({_best_so_far(meta)})', flush=True)
    if meta.pop('pending_validation', None) is not None:
      # The checkpoint saved when validation was cut short, saved again with its result.
      checkpoints.finish(manager)
      manager.delete(step)
    save()
    monitor.restart_pace()
    return True

  stop = _StopRequests()
  compiled_shapes = set()
  # The stop handlers stay installed until the last checkpoint is written (`finally`): a
  # second SIGTERM there would otherwise kill the process before its checkpoint is complete.
  with stop:
    try:
      if meta.get('pending_validation') == step:
        validate()
      while step < total_steps and not stop.requested:
        batch, num_sessions = next(train_iter)
        iter_state = train_iter.get_state()
        shape = tuple((k, v.shape) for k, v in batch.items())
        called = time.time()
        state, sums = step_fn(state, batch)
        # A new batch shape compiles inside the call (running it is asynchronous).
        compile_seconds = 0.0 if shape in compiled_shapes else time.time() - called
        compiled_shapes.add(shape)
        monitor.add(step, sums, num_sessions, compile_seconds)
        step += 1
        if step % tc.log_every_steps == 0:
          monitor.write(step)
        if step % steps_per_epoch == 0 or step == total_steps:
          monitor.write(step)
          validate()
        elif _checkpoint_due(step, tc.checkpoint_every_steps) or stop.requested:
          saving = time.time()
          save()
          monitor.pause(time.time() - saving)
        if stop.requested:
          break
      if stop.requested:
        checkpoints.finish(manager)  # "saved" is said once the checkpoint is complete
        pending = (' (its validation runs first when it resumes)'
                   if meta.get('pending_validation') == step else '')
        log(f'{stop.signal_name}: saved a checkpoint at step {step}{pending}; run the same '
            'command again to resume.', flush=True)
    finally:
      train_iter.close()
      checkpoints.finish(manager)
      manager.close()
      writer.close()
  return _summary(step, total_steps, meta, stop.signal_name)


def _summary(step: int, total_steps: int, meta: dict, stopped_by: str | None) -> dict:
  return {'step': step, 'total_steps': total_steps, 'best_step': meta['best_step'],
          'best_valid_loss': meta['best_valid_loss'], 'valid': meta['valid'],
          'stopped_by': stopped_by, 'interrupted': stopped_by is not None}


def _figures(valid: dict[str, float]) -> str:
  """The validation figures beside the loss: the perplexity where the task has one, else
  each of the task's own."""
  if 'perplexity' in valid:
    return f'perplexity {valid["perplexity"]:.2f}'
  # Counts (questions, pairs) are whole numbers; rates and losses get four decimals.
  return ', '.join(f'{k.replace("_", " ")} '
                   + (f'{v:,.0f}' if k in ('questions', 'pairs') else f'{v:.4f}')
                   for k, v in valid.items() if k != 'loss')


def _duration(seconds: float) -> str:
  """H:MM:SS, rounded up: a run with a second to go does not say '0:00:00 left'."""
  seconds = math.ceil(max(seconds, 0))
  return f'{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}'
