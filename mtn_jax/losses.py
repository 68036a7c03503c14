"""Training losses over the output vocabulary: per token, and summed over a session batch.

- `token_losses`: logits float32 [..., V], integer targets [...] -> (loss, nll) [...].
- `chunked_token_losses`: decoder hidden states [..., H], the output layer and targets [...]
  -> (loss, nll, correct) [...], projecting a chunk of tokens to the vocabulary at a time.
- `session_losses`: a model, its params and a session batch queries int32 [B, S, n] -> the
  batch's weighted sums (loss, nll, correct, tokens, pairs), plain or chunked; callers divide
  by `tokens` (the real target tokens, `</s>` included).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from mtn_jax.models.base import decoder_io


def _token_losses_and_correct(logits: jax.Array, targets: jax.Array, label_smoothing: float,
                              entropy_weight: float) -> tuple[jax.Array, ...]:
  """`token_losses`, plus correct [...]: 1.0 where no word's logit beats the target's.

  Written with one logsumexp instead of a full log-softmax: -log p(y) = lse - z_y, and the
  smoothing term's mean of log p over the vocabulary is mean(z) - lse, so the forward pass
  reduces the logits [..., V] without writing a log-probability tensor of the same size, and
  accuracy compares the target's logit with the maximum instead of running an argmax
  (docs/PERFORMANCE.md, "Where the time goes"). A tie for the maximum counts as correct.
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


def chunked_token_losses(output_logits: Callable[[jax.Array], jax.Array], hidden: jax.Array,
                         targets: jax.Array, *, chunk_tokens: int,
                         label_smoothing: float = 0.0, entropy_weight: float = 0.0
                         ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`token_losses` and token accuracy without the whole logits tensor, forward or backward.

  Hand-written because no maintained JAX library offers a chunked vocabulary cross-entropy
  over an arbitrary output layer. Tokens are processed in chunks under `jax.lax.map`; each
  chunk's computation is rematerialised (`jax.checkpoint`), so the backward pass recomputes a
  chunk's logits from its hidden states instead of keeping them: at most one chunk of logits
  [chunk, V] (and its softmax) is alive at a time. The values are those of
  `token_losses(output_logits(hidden), targets, ...)`.

  Args:
    output_logits: hidden [C, H] -> float32 logits [C, V]; it may close over parameters,
      whose gradients flow through.
    hidden: [..., H] decoder states, any float dtype.
    targets: int [...].
    chunk_tokens: most tokens per chunk (> 0); chunks are evened out so that padding the
      token count to a whole number of chunks adds fewer than one token per chunk.
    label_smoothing, entropy_weight: as for `token_losses`.
  Returns:
    loss, nll, correct: float32 [...], as `_token_losses_and_correct` gives them.
  """
  if chunk_tokens < 1:
    raise ValueError(f'chunk_tokens must be at least 1, got {chunk_tokens}')
  shape = targets.shape
  count = max(targets.size, 1)
  num_chunks = -(-count // chunk_tokens)
  chunk = -(-count // num_chunks)
  padding = num_chunks * chunk - targets.size
  flat_hidden = jnp.pad(hidden.reshape(-1, hidden.shape[-1]), ((0, padding), (0, 0)))
  flat_targets = jnp.pad(targets.reshape(-1), (0, padding))

  # Inside a loop, common-subexpression elimination cannot merge the recomputation into the
  # forward pass, so remat's CSE barrier would only cost time.
  @functools.partial(jax.checkpoint, prevent_cse=False)
  def one_chunk(inputs: tuple[jax.Array, jax.Array]):
    hidden_chunk, target_chunk = inputs
    return _token_losses_and_correct(output_logits(hidden_chunk), target_chunk,
                                     label_smoothing, entropy_weight)

  per_chunk = jax.lax.map(one_chunk, (flat_hidden.reshape(num_chunks, chunk, -1),
                                      flat_targets.reshape(num_chunks, chunk)))
  return tuple(x.reshape(-1)[:targets.size].reshape(shape) for x in per_chunk)


def session_losses(model: nn.Module, params, queries: jax.Array, *, train: bool,
                   rngs=None, label_smoothing: float = 0.0, entropy_weight: float = 0.0,
                   chunk_tokens: int = 0) -> dict[str, jax.Array]:
  """Weighted loss sums over a batch of sessions, every pair of every session at once.

  Args:
    model: a model of `mtn_jax.models` (the `base.SessionModel` entry points).
    params: its parameters.
    queries: int32 [B, S, n] word ids, 0-padded.
    train: dropout on (needs `rngs={'dropout': key}`) or off.
    rngs: the PRNG keys `model.apply` takes.
    label_smoothing, entropy_weight: as for `token_losses`.
    chunk_tokens: 0: the logits of the whole batch at once; > 0: `chunked_token_losses` over
      the decoder's hidden states, this many tokens per chunk (same values, far less memory
      with a large vocabulary).
  Returns:
    float32 scalars: 'loss', 'nll' and 'correct' summed over real target tokens, 'tokens'
    (real target tokens, `</s>` included) and 'pairs' (pairs whose next query is real).
  """
  _, targets, weights = decoder_io(queries)  # [B, S-1, T]
  if chunk_tokens:
    hidden = model.apply({'params': params}, queries, train=train, rngs=rngs,
                         method='session_hidden')
    loss, nll, correct = chunked_token_losses(
        lambda h: model.apply({'params': params}, h, method='output_logits'), hidden, targets,
        chunk_tokens=chunk_tokens, label_smoothing=label_smoothing,
        entropy_weight=entropy_weight)
  else:
    logits = model.apply({'params': params}, queries, train=train, rngs=rngs)
    loss, nll, correct = _token_losses_and_correct(logits, targets, label_smoothing,
                                                   entropy_weight)
  return {'loss': (loss * weights).sum(), 'nll': (nll * weights).sum(),
          'correct': (correct * weights).sum(), 'tokens': weights.sum(),
          'pairs': (weights[..., 0] > 0).sum().astype(jnp.float32)}
