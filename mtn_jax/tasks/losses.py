"""Training losses over the output vocabulary: per token, and summed over a session batch.

- `token_losses`: logits float32 [..., V], integer targets [...] -> (loss, nll) [...]; the
  definition every other function here computes.
- `output_layer_losses`: the output layer, its parameters, decoder states [G, M, H], targets
  and weights [G, M] -> the weighted sums (loss, nll, correct), projecting only the chunks of
  tokens that hold real targets, with the output layer's gradients made in the same pass.
- `session_losses`: a model, its params and a session batch (`queries` int32 [B, S, n]) -> the
  batch's weighted sums (loss, nll, correct, tokens, pairs); callers divide by `tokens` (the
  real target tokens, `</s>` included). The model hands over its output layer as a pure
  function with its parameters (`SessionModel.output_head`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from mtn_jax.data.vocab import UNK_ID
from mtn_jax.models import copying
from mtn_jax.models.base import decoder_io


def _token_losses_and_correct(logits: jax.Array, targets: jax.Array, label_smoothing: float,
                              entropy_weight: float) -> tuple[jax.Array, ...]:
  """`token_losses`, plus correct [...]: 1.0 where no word's logit beats the target's.

  Written with one logsumexp instead of a full log-softmax: -log p(y) = lse - z_y, and the
  smoothing term's mean of log p over the vocabulary is mean(z) - lse, so the forward pass
  reduces the logits [..., V] without writing a log-probability tensor of the same size, and
  accuracy compares the target's logit with the maximum instead of running an argmax
  (docs/notes/2026-11-24-training-throughput.md, "Where the time goes"). A tie for the maximum
  counts as correct.
  """
  logits = logits.astype(jnp.float32)
  lse = jax.nn.logsumexp(logits, axis=-1)
  target_logits = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  nll = lse - target_logits
  loss = nll
  if label_smoothing:
    loss = (1 - label_smoothing) * nll + label_smoothing * (lse - logits.mean(-1))
  if entropy_weight:
    log_probs = logits - lse[..., None]
    entropy = -(jnp.exp(log_probs) * log_probs).sum(-1)
    loss = loss - entropy_weight * entropy
  correct = (target_logits >= logits.max(-1)).astype(jnp.float32)
  return loss, nll, correct


def token_losses(logits: jax.Array, targets: jax.Array, label_smoothing: float = 0.0,
                 entropy_weight: float = 0.0) -> tuple[jax.Array, jax.Array]:
  """Per-token training loss and negative log-likelihood.

  Args:
    logits: float [..., V].
    targets: int [...].
    label_smoothing: a; the target distribution is (1 - a) one-hot + a / V uniform.
    entropy_weight: M-NSRF's regulariser: the loss subtracts this times the entropy of the
      predicted distribution, against over-confident outputs (0.1 in the paper).
  Returns:
    loss [...]: the smoothed cross-entropy minus the entropy term.
    nll [...]: -log p(target), what validation loss and perplexity are made of.
  """
  loss, nll, _ = _token_losses_and_correct(logits, targets, label_smoothing, entropy_weight)
  return loss, nll


# ---------------------------------------------------------------------------------------------
# The output layer and loss, fused and restricted to real targets
#
# Hand-written because no maintained JAX library offers a cross-entropy fused with an arbitrary
# output layer. Two facts make it pay:
#  - most target slots are padding (AOL queries are a few words in 10 slots, so most of the
#    n + 1 decoder positions are padding), yet a plain loss projects every slot to the
#    vocabulary, the widest matmul of the model and, with its softmax, most of its memory
#    traffic;
#  - the loss is the end of the computation, so the gradient of a chunk's logits is known as
#    soon as they are: projecting, reducing and back-projecting a chunk in one go leaves no
#    [tokens, V] tensor alive for a backward pass to read.
# Real tokens are moved to the front of each group, and a loop with a data-dependent trip
# count visits only the chunks that hold any. A group is one data-parallel shard of the batch
# (`groups` in `session_losses`), so the partition and the chunks never move data between
# devices;
# the groups run side by side (vmap) and their parameter gradients are summed once, after
# the loop.


def copy_token_losses(logits: jax.Array, targets: jax.Array, gate_logits: jax.Array,
                      copy_scores: jax.Array, source_ids: jax.Array,
                      label_smoothing: float = 0.0) -> tuple[jax.Array, ...]:
  """Per-token (loss, nll, correct) under a copy mixture (pointer-generator, See et al. 2017).

  P(w) = g P_vocab(w) + (1 - g) sum_{i: source_i = w} a_i, with g = sigmoid(gate_logits),
  P_vocab = softmax(logits) over the V words of the vocabulary and a = softmax(copy_scores)
  over the source positions, whose words carry extended ids (>= V for words outside the
  vocabulary, `mtn_jax.data.extended`). Label smoothing spreads its mass over the V vocabulary
  words only: an extended id absent from the source has probability 0, so it cannot take any.

  Args:
    logits: float [..., V].
    targets: int [...], extended ids (a target outside the vocabulary and the source is
      `<unk>`: see `extended_targets`).
    gate_logits: float [...], the logit of g.
    copy_scores: float [..., L] attention scores over the source positions; a position to
      ignore scores `copying.MASKED_SCORE` (every token must have one real position, or be
      padding).
    source_ids: int [..., L] the extended ids of the source positions (-1 where masked).
    label_smoothing: as for `token_losses`.
  Returns:
    loss, nll, correct [...], as `_token_losses_and_correct` gives them without copying.
  """
  logits = logits.astype(jnp.float32)
  vocab_size = logits.shape[-1]
  lse = jax.nn.logsumexp(logits, axis=-1)
  log_gen = jax.nn.log_sigmoid(gate_logits.astype(jnp.float32))  # log g
  log_copy = jax.nn.log_sigmoid(-gate_logits.astype(jnp.float32))  # log (1 - g)
  log_attention = jax.nn.log_softmax(copy_scores.astype(jnp.float32), axis=-1)  # [..., L]
  real_source = source_ids >= 0

  def log_prob(ids):
    """log P(ids) [..., K] for extended ids [..., K]."""
    in_vocab = ids < vocab_size
    vocab_logits = jnp.take_along_axis(logits, jnp.where(in_vocab, ids, 0), axis=-1)
    log_vocab = jnp.where(in_vocab, log_gen[..., None] + vocab_logits - lse[..., None],
                          -jnp.inf)
    same = (ids[..., :, None] == source_ids[..., None, :]) & real_source[..., None, :]
    copied = jax.nn.logsumexp(jnp.where(same, log_attention[..., None, :], -jnp.inf), axis=-1)
    return jnp.logaddexp(log_vocab, log_copy[..., None] + copied), log_vocab

  target_log_prob, _ = log_prob(targets[..., None])
  nll = -target_log_prob[..., 0]
  loss = nll
  source_log_prob, source_log_vocab = log_prob(source_ids)  # [..., L]
  if label_smoothing:
    # mean over the vocabulary of log P(w): every word gets log g P_vocab(w), and each word of
    # the source (counted once however often it stands there) its share of the copy mass too.
    vocab_source = real_source & (source_ids < vocab_size)
    repeats = ((source_ids[..., :, None] == source_ids[..., None, :])
               & real_source[..., None, :]).sum(-1)
    extra = jnp.where(vocab_source, (source_log_prob - source_log_vocab)
                      / jnp.maximum(repeats, 1), 0.0).sum(-1)
    mean_log_prob = log_gen + logits.mean(-1) - lse + extra / vocab_size
    loss = (1 - label_smoothing) * nll - label_smoothing * mean_log_prob
  best = jnp.maximum(log_gen + logits.max(-1) - lse,
                     jnp.where(real_source, source_log_prob, -jnp.inf).max(-1))
  correct = (-nll >= best).astype(jnp.float32)
  return loss, nll, correct


def extended_targets(targets: jax.Array, available: jax.Array, vocab_size: int) -> jax.Array:
  """Extended-id targets, with ids outside the vocabulary that cannot be copied -> `<unk>`.

  Args:
    targets: int [..., T] extended ids (`mtn_jax.data.extended`).
    available: int [...], how many of the session's out-of-vocabulary words the context has
      seen: they are numbered by first appearance, so id V + k can be copied iff k < available.
    vocab_size: V.
  """
  copyable = targets - vocab_size < available[..., None]
  return jnp.where((targets < vocab_size) | copyable, targets, UNK_ID)


def _chunk_sums(output_logits: Callable, params: Any, inputs: dict, data: dict,
                label_smoothing: float, entropy_weight: float):
  """(weighted loss sum, (nll sum, correct sum)) of one chunk of C tokens.

  inputs: differentiable per-token arrays: 'hidden' [C, H], and with copying 'gate' [C] and
  'copy_scores' [C, L]; data: 'targets' [C], 'weights' [C], with copying 'source_ids' [C, L].
  """
  logits = output_logits(params, inputs['hidden'])
  if 'gate' in inputs:
    loss, nll, correct = copy_token_losses(logits, data['targets'], inputs['gate'],
                                           inputs['copy_scores'], data['source_ids'],
                                           label_smoothing)
  else:
    loss, nll, correct = _token_losses_and_correct(logits, data['targets'], label_smoothing,
                                                   entropy_weight)
  weights = data['weights']
  return (loss * weights).sum(), ((nll * weights).sum(), (correct * weights).sum())


def _sorted_chunks(inputs: dict, data: dict, chunk: int):
  """Real tokens first within each group, in their order, padded to whole chunks of zeros.

  Every leaf of `inputs` and `data` is [G, M, ...]; `data['weights'] > 0` marks real tokens.
  Returns (inputs and data with every leaf [G, K*C, ...], destination [G, M] (each token's
  sorted position), active chunks (int32 scalar: those holding a real token in some group)).
  """
  weights = data['weights']
  groups, tokens = weights.shape
  real = weights > 0
  num_real = real.sum(axis=1, keepdims=True)
  # A stable partition by counting, cheaper than a sort: real tokens keep their order at the
  # front, padding follows.
  destination = jnp.where(real, jnp.cumsum(real, axis=1) - 1,
                          num_real + jnp.cumsum(~real, axis=1) - 1)
  sorted_len = -(-tokens // chunk) * chunk
  # Positions past the tokens read index `tokens`, out of range: the gathers fill them with 0.
  order = jnp.full((groups, sorted_len), tokens, jnp.int32).at[
      jnp.arange(groups)[:, None], destination].set(jnp.arange(tokens, dtype=jnp.int32))
  def gather(x):
    index = order.reshape(order.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, index, axis=1, mode='fill', fill_value=0)
  active = ((num_real.max() + chunk - 1) // chunk).astype(jnp.int32)
  return (jax.tree.map(gather, inputs), jax.tree.map(gather, data), destination, active)


def _loop_over_chunks(output_logits, params, inputs, data, options, *, grads):
  """The sums over the active chunks, and with `grads` the gradients of the loss sum with
  respect to `params` and every leaf of `inputs`."""
  chunk, label_smoothing, entropy_weight = options
  groups = data['weights'].shape[0]
  inputs_s, data_s, destination, active = _sorted_chunks(inputs, data, chunk)
  per_chunk = functools.partial(_chunk_sums, output_logits, label_smoothing=label_smoothing,
                                entropy_weight=entropy_weight)
  if grads:
    per_chunk = jax.value_and_grad(per_chunk, argnums=(0, 1), has_aux=True)
  per_group = jax.vmap(per_chunk, in_axes=(None, 0, 0))

  def body(k, carry):
    start = k * chunk
    take = lambda x: jax.lax.dynamic_slice_in_dim(x, start, chunk, axis=1)
    out = per_group(params, jax.tree.map(take, inputs_s), jax.tree.map(take, data_s))
    if not grads:
      loss, (nll, correct) = out
      return jax.tree.map(jnp.add, carry, (loss, nll, correct))
    ((loss, (nll, correct)), (d_params, d_inputs)) = out
    sums, d_params_sum, d_inputs_s = carry
    sums = jax.tree.map(jnp.add, sums, (loss, nll, correct))
    d_params_sum = jax.tree.map(jnp.add, d_params_sum, d_params)
    d_inputs_s = jax.tree.map(
        lambda whole, part: jax.lax.dynamic_update_slice_in_dim(whole, part, start, axis=1),
        d_inputs_s, d_inputs)
    return sums, d_params_sum, d_inputs_s

  zeros = jnp.zeros((groups,), jnp.float32)
  sums = (zeros, zeros, zeros)
  if not grads:
    return jax.tree.map(jnp.sum, jax.lax.fori_loop(0, active, body, sums))
  # Per-group parameter gradients [G, ...]: each group's sum stays on its device until the
  # single reduction after the loop.
  init = (sums, jax.tree.map(lambda p: jnp.zeros((groups,) + p.shape, jnp.float32), params),
          jax.tree.map(jnp.zeros_like, inputs_s))
  sums, d_params, d_inputs_s = jax.lax.fori_loop(0, active, body, init)
  def unsort(x):
    index = destination.reshape(destination.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, index, axis=1)
  d_params = jax.tree.map(lambda d, p: d.sum(0).astype(p.dtype), d_params, params)
  return jax.tree.map(jnp.sum, sums), d_params, jax.tree.map(unsort, d_inputs_s)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 4))
def _output_layer_sums(output_logits, params, inputs, data, options):
  return _loop_over_chunks(output_logits, params, inputs, data, options, grads=False)


def _output_layer_sums_fwd(output_logits, params, inputs, data, options):
  sums, d_params, d_inputs = _loop_over_chunks(output_logits, params, inputs, data, options,
                                               grads=True)
  return sums, (d_params, d_inputs, data)


def _output_layer_sums_bwd(output_logits, options, residuals, cotangents):
  del output_logits, options
  d_params, d_inputs, data = residuals
  # Only the loss sum carries a gradient: `output_layer_losses` stops the metric sums'.
  g = cotangents[0]
  scale = lambda d: (g * d).astype(d.dtype)
  no_gradient = jax.tree.map(
      lambda x: np.zeros(x.shape, jax.dtypes.float0) if not jnp.issubdtype(x.dtype, jnp.floating)
      else jnp.zeros_like(x), data)
  return jax.tree.map(scale, d_params), jax.tree.map(scale, d_inputs), no_gradient


_output_layer_sums.defvjp(_output_layer_sums_fwd, _output_layer_sums_bwd)


def output_layer_losses(output_logits: Callable[[Any, jax.Array], jax.Array], params: Any,
                        hidden: jax.Array, targets: jax.Array, weights: jax.Array, *,
                        chunk_tokens: int, label_smoothing: float = 0.0,
                        entropy_weight: float = 0.0,
                        copy: Mapping[str, jax.Array] | None = None) -> dict[str, jax.Array]:
  """Weighted sums of `token_losses` and accuracy over real targets, chunk by chunk.

  The values are those of `token_losses(output_logits(params, hidden), targets, ...)` (or,
  with `copy`, of `copy_token_losses`) weighted by `weights` and summed; the cost is that of
  the chunks holding real targets only (weight > 0), and at most one chunk's logits [G, C, V]
  exist at a time, in the forward pass and in the backward. Under `jax.grad`, the loop
  computes each chunk's gradients with its loss (a `jax.custom_vjp`), so the backward pass
  only scales them.

  Args:
    output_logits: (params, hidden [C, H]) -> float32 logits [C, V].
    params: the parameters `output_logits` reads (a pytree); they receive gradients.
    hidden: [G, M, H] decoder states in G groups of M token slots, any float dtype.
    targets: int [G, M] (extended ids with `copy`).
    weights: float32 [G, M]; 0 marks padding, which costs nothing once a chunk is all padding.
    chunk_tokens: token slots per chunk and group (>= 1).
    label_smoothing, entropy_weight: as for `token_losses` (no entropy term with `copy`).
    copy: the copy mixture's per-token inputs, as `copy_token_losses` takes them: 'gate'
      [G, M] and 'copy_scores' [G, M, L] (both receive gradients), 'source_ids' int [G, M, L].
  Returns:
    float32 scalars 'loss', 'nll', 'correct': the weighted sums. Only 'loss' is
    differentiable; the other two are metrics and stop gradients.
  """
  if chunk_tokens < 1:
    raise ValueError(f'chunk_tokens must be at least 1, got {chunk_tokens}')
  if hidden.ndim != 3 or targets.shape != hidden.shape[:2] or weights.shape != targets.shape:
    raise ValueError(f'expected hidden [G, M, H] with targets and weights [G, M], got '
                     f'{hidden.shape}, {targets.shape} and {weights.shape}')
  if copy is not None and entropy_weight:
    raise ValueError('the entropy regulariser is not defined for a copy mixture')
  options = (int(min(chunk_tokens, targets.shape[1])), float(label_smoothing),
             float(entropy_weight))
  inputs = {'hidden': hidden}
  data = {'targets': targets, 'weights': weights.astype(jnp.float32)}
  if copy is not None:
    inputs.update(gate=copy['gate'], copy_scores=copy['copy_scores'])
    data['source_ids'] = copy['source_ids']
  # The scope names the loss head's operations in profiles (launch/profile_step.py).
  with jax.named_scope('output_layer_loss'):
    loss, nll, correct = _output_layer_sums(output_logits, params, inputs, data, options)
  return {'loss': loss, 'nll': jax.lax.stop_gradient(nll),
          'correct': jax.lax.stop_gradient(correct)}


def session_losses(model: nn.Module, params, batch: Mapping[str, jax.Array], *, train: bool,
                   rngs=None, label_smoothing: float = 0.0, entropy_weight: float = 0.0,
                   chunk_tokens: int, groups: int = 1) -> dict[str, jax.Array]:
  """Weighted loss sums over a batch of sessions, every pair of every session at once.

  Args:
    model: a model of `mtn_jax.models` (the `base.SessionModel` entry points).
    params: its parameters.
    batch: the model's inputs; `queries` int32 [B, S, n] word ids, 0-padded.
    train: dropout on (needs `rngs={'dropout': key}`) or off.
    rngs: the PRNG keys `model.apply` takes.
    label_smoothing, entropy_weight: as for `token_losses`.
    chunk_tokens: target slots projected to the vocabulary at a time, per group
      (`output_layer_losses`).
    groups: the data-parallel shards of the batch axis (B must divide into them): real
      targets are gathered and chunked within each, so that no data crosses devices.
  Returns:
    float32 scalars: 'loss', 'nll' and 'correct' summed over real target tokens, 'tokens'
    (real target tokens, `</s>` included) and 'pairs' (pairs whose next query is real).
  """
  queries = batch['queries']
  if queries.shape[0] % groups:
    raise ValueError(f'a batch of {queries.shape[0]} sessions does not split into {groups} '
                     f'data-parallel groups')
  _, targets, weights = decoder_io(queries)  # [B, S-1, T]

  def outputs_and_head(module):
    return module.session_outputs(batch, train=train), module.output_head()

  outputs, (logits_fn, head_params) = model.apply(  # hidden [B, S-1, T, H]
      {'params': params}, rngs=rngs, method=outputs_and_head)
  hidden = outputs['hidden']
  per_group = lambda x, *rest: x.reshape(groups, -1, *rest)
  copy = None
  if 'gate' in outputs:
    # Targets in extended ids: a word outside the vocabulary is a target of its own where the
    # context holds it to copy, else `<unk>`.
    vocab_size = model.config.vocab_size
    _, targets, _ = decoder_io(copying.extended_queries(batch, vocab_size))
    targets = extended_targets(targets, copying.copyable_words(batch)[:, :-1],
                               vocab_size)
    copy_ids = outputs['copy_ids']  # [B, S-1, L]: the same source for every step of a pair
    source_ids = jnp.broadcast_to(copy_ids[:, :, None, :],
                                  targets.shape + copy_ids.shape[-1:])
    copy = {'gate': per_group(outputs['gate']),
            'copy_scores': per_group(outputs['copy_scores'], copy_ids.shape[-1]),
            'source_ids': per_group(source_ids, copy_ids.shape[-1])}
  sums = output_layer_losses(
      logits_fn, head_params, per_group(hidden, hidden.shape[-1]), per_group(targets),
      per_group(weights), chunk_tokens=chunk_tokens, label_smoothing=label_smoothing,
      entropy_weight=entropy_weight, copy=copy)
  return {**sums, 'tokens': weights.sum(),
          'pairs': (weights[..., 0] > 0).sum().astype(jnp.float32)}
