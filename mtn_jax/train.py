"""Training and validation: pure jit-compiled steps, a resumable loop, orbax checkpoints.

`train_and_evaluate(config, workdir)` prepares (or reuses) the corpus, builds the model,
resumes from the latest checkpoint in `<workdir>/checkpoints` if there is one, and trains for
`config.train.num_epochs` epochs over whole sessions: one forward pass per session gives all
of its (prefix -> next query) predictions. After each epoch it measures the validation loss
and perplexity and keeps the best checkpoint (the paper's model selection).

Determinism: `config.seed` fixes the data order, the initial parameters and every dropout
mask (the key of step s is `fold_in(dropout_rng, s)`), so a resumed run reproduces an
uninterrupted one bit for bit on CPU.
"""

from __future__ import annotations

import functools
import json
import math
import os
import queue
import signal
import threading
import time
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.experimental import multihost_utils

from mtn_jax import checkpoints
from mtn_jax import errors
from mtn_jax import input_pipeline
from mtn_jax import losses
from mtn_jax import metric_writer
from mtn_jax import models
from mtn_jax import parallel
from mtn_jax.data import preprocess
from mtn_jax.data import sessions
from mtn_jax.models.base import ModelConfig


class NonFiniteLoss(errors.Error, RuntimeError):
  """Training produced a NaN or Inf loss; the last good checkpoint is left as it was."""


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


def learning_rate_schedule(train: ml_collections.ConfigDict, d_model: int) -> optax.Schedule:
  """'transformer': lr(s) = factor * d^-0.5 * min(s^-0.5, s * warmup^-1.5), s = step + 1."""
  if train.schedule == 'constant':
    return optax.constant_schedule(train.learning_rate)

  def schedule(step):
    s = jnp.asarray(step, jnp.float32) + 1.0
    return (train.learning_rate * d_model**-0.5
            * jnp.minimum(s**-0.5, s * train.warmup_steps**-1.5))
  return schedule


def make_optimizer(train: ml_collections.ConfigDict,
                   d_model: int) -> optax.GradientTransformation:
  adam = optax.adam(learning_rate_schedule(train, d_model), b1=train.adam_b1, b2=train.adam_b2,
                    eps=train.adam_eps)
  if train.grad_clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(train.grad_clip_norm), adam)
  return adam


# ---------------------------------------------------------------------------------------------
# Losses and steps


def train_step(state: TrainState, queries: jax.Array, *, model, optimizer,
               label_smoothing: float, entropy_weight: float, loss_chunk_tokens: int,
               data_groups: int) -> tuple[TrainState, dict]:
  """One optimizer step on a batch of sessions, queries int32 [B, S, n].

  `loss_chunk_tokens` and `data_groups` shape the loss head (`losses.session_losses`); the
  other keyword arguments are the static parts of the step (`make_steps` binds them all).
  """
  rng = jax.random.fold_in(state.dropout_rng, state.step)

  def loss_fn(params):
    sums = losses.session_losses(model, params, queries, train=True, rngs={'dropout': rng},
                                 label_smoothing=label_smoothing,
                                 entropy_weight=entropy_weight, chunk_tokens=loss_chunk_tokens,
                                 groups=data_groups)
    return sums['loss'] / jnp.maximum(sums['tokens'], 1.0), sums

  grads, sums = jax.grad(loss_fn, has_aux=True)(state.params)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  sums['grad_norm'] = optax.tree.norm(grads)
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), sums


def eval_step(params, queries: jax.Array, *, model, loss_chunk_tokens: int,
              data_groups: int) -> dict:
  return losses.session_losses(model, params, queries, train=False,
                               chunk_tokens=loss_chunk_tokens, groups=data_groups)


def make_steps(train_config: ml_collections.ConfigDict, model, optimizer, mesh):
  """(train step, eval step) with their static arguments bound from `config.train`, ready for
  `jax.jit`: one data-parallel loss group per device of the mesh."""
  shared = dict(model=model, loss_chunk_tokens=train_config.loss_chunk_tokens,
                data_groups=mesh.size)
  return (functools.partial(train_step, optimizer=optimizer,
                            label_smoothing=train_config.label_smoothing,
                            entropy_weight=train_config.entropy_weight, **shared),
          functools.partial(eval_step, **shared))


# ---------------------------------------------------------------------------------------------
# The run


class _Prefetcher:
  """Puts batches on the devices ahead of the step, from a background thread.

  Each item also carries the iterator state right after its batch, so a checkpoint records
  the position of the last batch the step consumed, not of the last one prefetched.
  """

  def __init__(self, iterator, mesh, size: int):
    self._iterator, self._mesh = iterator, mesh
    self._queue: queue.Queue = queue.Queue(maxsize=max(size, 1))
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._fill, daemon=True)
    self._thread.start()

  def _fill(self):
    try:
      while not self._stop.is_set():
        batch = next(self._iterator)
        item = (parallel.shard_batch({'queries': batch['queries']}, self._mesh)['queries'],
                self._iterator.get_state(), int((batch['session_ids'] >= 0).sum()),
                int(batch['epoch']))
        while not self._stop.is_set():
          try:
            self._queue.put(item, timeout=0.1)
            break
          except queue.Full:
            pass
    except Exception as e:  # pylint: disable=broad-except
      self._queue.put(e)

  def __next__(self):
    item = self._queue.get()
    if isinstance(item, Exception):
      raise item
    return item

  def close(self):
    self._stop.set()
    self._thread.join(timeout=5)


def load_data(config: ml_collections.ConfigDict, workdir: str):
  """Prepares (or reuses) the corpus: (vocab, {split: SessionSplit}).

  With several processes, process 0 builds the corpus and the others then find it cached.
  """
  if jax.process_index() == 0:
    preprocess.prepare(config, workdir)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices('corpus prepared')
    preprocess.prepare(config, workdir)
  data_dir = preprocess.data_dir(workdir)
  vocab = sessions.load_vocab(data_dir)
  splits = {s: sessions.load_split(data_dir, s) for s in sessions.SPLITS}
  return vocab, splits


def model_config(config: ml_collections.ConfigDict, vocab, split) -> ModelConfig:
  return ModelConfig.from_config(config.model, len(vocab), split.max_query_words)


def evaluate_loss(params, split: sessions.SessionSplit, *, mesh, queries_per_batch: int,
                  eval_fn) -> dict[str, float]:
  """Validation loss (nll per target token), perplexity and token accuracy over a split.

  `eval_fn`: the jit-compiled eval step, (params, queries) -> sums (`make_steps`).
  """
  totals = None
  for batch in input_pipeline.make_eval_iterator(
      split, queries_per_batch=queries_per_batch, multiple_of=jax.device_count(),
      process_index=jax.process_index(), process_count=jax.process_count()):
    queries = parallel.shard_batch({'queries': batch['queries']}, mesh)['queries']
    sums = eval_fn(params, queries)
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  totals = jax.device_get(totals)
  tokens = max(float(totals['tokens']), 1.0)
  loss = float(totals['nll']) / tokens
  return {'loss': loss, 'perplexity': math.exp(min(loss, 50.0)),
          'token_accuracy': float(totals['correct']) / tokens, 'pairs': float(totals['pairs'])}


def init_state(model, cfg: ModelConfig, optimizer, seed: int, mesh) -> TrainState:
  """Parameters and optimizer state, created replicated on the mesh by one jit."""
  def create(rng):
    init_rng, dropout_rng = jax.random.split(rng)
    dummy = jnp.ones((1, 2, cfg.max_query_words), jnp.int32)
    params = model.init({'params': init_rng}, dummy, train=False)['params']
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=optimizer.init(params), dropout_rng=dropout_rng)
  return jax.jit(create, out_shardings=parallel.replicated(mesh))(jax.random.PRNGKey(seed))


def _save_json(path: str, obj) -> None:
  tmp = path + '.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    json.dump(obj, f, indent=2, sort_keys=True)
  os.replace(tmp, path)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains (resuming if possible); returns the final summary (steps, best validation loss)."""
  workdir = os.path.abspath(workdir)
  vocab, splits = load_data(config, workdir)
  train_split, valid_split = splits['train'], splits['valid']
  if valid_split.num_sessions == 0:
    raise ValueError('the valid split is empty: model selection needs validation sessions '
                     '(more data, or a larger config.data.split_fractions[1])')
  cfg = model_config(config, vocab, train_split)
  model = models.create_model(cfg)
  mesh = parallel.make_mesh()
  tc = config.train
  optimizer = make_optimizer(tc, cfg.d_model)
  steps_per_epoch = input_pipeline.steps_per_epoch(
      train_split, config.input.train_queries_per_batch, jax.device_count())
  total_steps = steps_per_epoch * tc.num_epochs
  if tc.max_steps > 0:
    total_steps = min(total_steps, tc.max_steps)

  state = init_state(model, cfg, optimizer, config.seed, mesh)
  train_iter = input_pipeline.make_train_iterator(
      train_split, queries_per_batch=config.input.train_queries_per_batch, seed=config.seed,
      multiple_of=jax.device_count(), process_index=jax.process_index(),
      process_count=jax.process_count(), worker_count=config.input.worker_count)
  manager = checkpoints.open_manager(workdir, keep=tc.keep_checkpoints)
  meta = {'model': checkpoints.architecture(cfg), 'model_name': cfg.name,
          'vocab_fingerprint': vocab.fingerprint, 'vocab_size': len(vocab),
          'valid': [], 'best_step': None, 'best_valid_loss': None,
          'config': json.loads(config.to_json_best_effort())}
  writer = metric_writer.MetricWriter(workdir)
  log = print if jax.process_index() == 0 else (lambda *a, **k: None)

  latest = manager.latest_step()
  if latest is not None:
    where = f'checkpoint {checkpoints.checkpoint_dir(workdir)}/{latest}'
    saved_meta = checkpoints.read_meta(manager, latest)
    checkpoints.check_compatible(saved_meta, cfg, vocab, where)
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    restored = checkpoints.restore(manager, latest, abstract_params=abstract.params,
                                   abstract_train_state=abstract.optimizer_part())
    state = TrainState(params=restored['params'], **restored['train'])
    train_iter.set_state(restored['data_iter'])
    meta.update({k: saved_meta[k] for k in ('valid', 'best_step', 'best_valid_loss')})
    log(f'Resuming from {where} (epoch {latest // steps_per_epoch + 1}).')
  if jax.process_index() == 0:
    _save_json(os.path.join(workdir, 'config.json'),
               {'config': meta['config'], 'model': meta['model'], 'vocab_size': len(vocab)})

  log(f'Model {cfg.name}: {models.count_params(state.params):,} parameters, '
      f'{models.size_mb(state.params):.1f} MB (fp32); vocabulary {len(vocab):,} words; '
      f'{train_split.num_sessions:,} training sessions ({train_split.num_pairs:,} pairs); '
      f'{steps_per_epoch} steps per epoch on {jax.device_count()} device(s); '
      f'{total_steps} steps in all.')

  state_sharding = parallel.replicated(mesh)
  train_fn, eval_fn = make_steps(tc, model, optimizer, mesh)
  step_fn = jax.jit(train_fn, in_shardings=(state_sharding, parallel.batch_sharding(mesh)),
                    out_shardings=(state_sharding, state_sharding), donate_argnums=0)
  eval_fn = jax.jit(eval_fn)
  schedule = learning_rate_schedule(tc, cfg.d_model)

  stop_requested = threading.Event()
  previous_handler = signal.signal(signal.SIGTERM, lambda *_: stop_requested.set())
  prefetcher = _Prefetcher(train_iter, mesh, config.input.prefetch_batches)
  step = int(jax.device_get(state.step))
  pending: list[tuple[int, dict]] = []  # per-step device metrics not yet checked on host
  sessions_seen, iter_state = 0, train_iter.get_state()
  window_start, window_step = time.time(), step

  def check_and_log(force_log: bool):
    """Fetches pending metrics, stops on a non-finite loss, writes the train log line."""
    nonlocal pending, sessions_seen, window_start, window_step
    if not pending:
      return
    fetched = jax.device_get([m for _, m in pending])
    for (s, _), m in zip(pending, fetched):
      if not np.isfinite(m['loss']):
        good = manager.latest_step()
        raise NonFiniteLoss(
            f'non-finite training loss ({m["loss"]}) at step {s}; stopped without saving. '
            + (f'Last good checkpoint: step {good} in {checkpoints.checkpoint_dir(workdir)}.'
               if good is not None else 'No checkpoint was written yet.'))
    if not force_log:
      return
    totals = {k: sum(float(m[k]) for m in fetched) for k in fetched[0]}
    now = time.time()
    elapsed = max(now - window_start, 1e-9)
    steps_done = step - window_step
    # The latest window's pace: the first window also pays for compilation.
    per_step = elapsed / max(steps_done, 1)
    tokens = max(totals['tokens'], 1.0)
    scalars = {
        'epoch': step / steps_per_epoch, 'loss': totals['loss'] / tokens,
        'nll': totals['nll'] / tokens, 'learning_rate': float(schedule(step - 1)),
        'grad_norm': totals['grad_norm'] / len(fetched),
        'sessions_per_s': sessions_seen / elapsed, 'pairs_per_s': totals['pairs'] / elapsed,
        'tokens_per_s': totals['tokens'] / elapsed, 'steps_per_s': steps_done / elapsed,
        'eta_s': per_step * (total_steps - step)}
    writer.write(step, 'train', scalars)
    log(f'step {step}/{total_steps} epoch {scalars["epoch"]:.2f} loss {scalars["loss"]:.4f} '
        f'lr {scalars["learning_rate"]:.2e} {scalars["sessions_per_s"]:.0f} sessions/s '
        f'{scalars["tokens_per_s"]:.0f} tokens/s, {_duration(scalars["eta_s"])} left',
        flush=True)
    pending, sessions_seen = [], 0
    window_start, window_step = now, step

  def save(valid_loss=None):
    checkpoints.save(manager, step, params=state.params, train_state=state.optimizer_part(),
                     data_iter=iter_state, meta=meta, vocab=vocab, valid_loss=valid_loss)

  try:
    while step < total_steps:
      queries, iter_state, n_sessions, _ = next(prefetcher)
      state, sums = step_fn(state, queries)
      pending.append((step, sums))
      step += 1
      sessions_seen += n_sessions
      end_of_epoch = step % steps_per_epoch == 0
      check_and_log(force_log=step % tc.log_every_steps == 0 or step == total_steps)
      if end_of_epoch or step == total_steps:
        check_and_log(force_log=True)
        valid = evaluate_loss(state.params, valid_split, mesh=mesh,
                              queries_per_batch=config.input.eval_queries_per_batch,
                              eval_fn=eval_fn)
        writer.write(step, 'valid', valid)
        meta['valid'].append({'step': step, **valid})
        if meta['best_valid_loss'] is None or valid['loss'] < meta['best_valid_loss']:
          meta['best_step'], meta['best_valid_loss'] = step, valid['loss']
        log(f'epoch {math.ceil(step / steps_per_epoch)}: validation loss {valid["loss"]:.4f}, '
            f'perplexity {valid["perplexity"]:.2f} (best {meta["best_valid_loss"]:.4f} at '
            f'step {meta["best_step"]})', flush=True)
        save(valid_loss=valid['loss'])
      elif step % tc.checkpoint_every_steps == 0 or stop_requested.is_set():
        check_and_log(force_log=False)
        save()
      if stop_requested.is_set():
        log(f'SIGTERM: saved a checkpoint at step {step}; exiting.', flush=True)
        break
  finally:
    prefetcher.close()
    manager.wait_until_finished()
    manager.close()
    writer.close()
    signal.signal(signal.SIGTERM, previous_handler)
  return {'step': step, 'total_steps': total_steps, 'best_step': meta['best_step'],
          'best_valid_loss': meta['best_valid_loss'], 'valid': meta['valid'],
          'interrupted': stop_requested.is_set()}


def _duration(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  return f'{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}'
