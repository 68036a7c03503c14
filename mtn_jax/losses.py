"""Per-token training losses over the output vocabulary.

logits float32 [..., V] and integer targets [...] -> per-token values [...]; callers weight
them with `decoder_io`'s weights and normalise by the number of real target tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


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
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32))
  nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  loss = nll
  if label_smoothing:
    loss = (1 - label_smoothing) * nll - label_smoothing * log_probs.mean(-1)
  if entropy_weight:
    entropy = -(jnp.exp(log_probs) * log_probs).sum(-1)
    loss = loss - entropy_weight * entropy
  return loss, nll
