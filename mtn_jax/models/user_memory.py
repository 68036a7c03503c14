"""A user's memory: attention over their earlier queries, with or without a zero vector.

The zero attention model's user embedding (Ai et al., CIKM 2019, eq. 9-12):

  f(q, i) = i . tanh(W_f q + b_f) . W_h                       (eq. 10; W_f in R^{a x b x a})
  AEM:  u = sum_i exp(f(q, i)) / sum_i' exp(f(q, i')) * i              (eq. 9)
  ZAM:  u = sum_i exp(f(q, i)) / (exp(f(q, 0)) + sum_i' exp(f(q, i'))) * i   (eq. 11)

f(q, 0) = 0 for the zero vector, so ZAM's weights are a softmax with one more logit fixed at 0:
the history's total weight is a sigmoid-like gate (eq. 12) that can close when nothing in the
history is related to q. AEM always spreads weight 1 over the history, and a user without
history gets u = 0 under either form. `UserMemory` is shared by the zero attention model family
(`mtn_jax.models.zam`) and the personalised MTN (`config.model.user_memory`).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

USER_MEMORIES = ('none', 'attention', 'zero_attention')


class UserMemory(nn.Module):
  """(q [N, a], items [N, M, a], mask bool [N, M]) -> (u [N, a], weights [N, M],
  zero_weight [N]).

  Attributes:
    hidden: b, the attention network's hidden units (eq. 10).
    zero_attention: True for ZAM's eq. 11, False for AEM's eq. 9.
    dtype: compute dtype (the weights and the softmax are float32).
  """

  hidden: int
  zero_attention: bool
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, q: jax.Array, items: jax.Array, mask: jax.Array):
    dim = q.shape[-1]
    w_f = self.param('w_f', nn.initializers.lecun_normal(in_axis=-1, out_axis=(0, 1)),
                     (dim, self.hidden, dim), jnp.float32)
    b_f = self.param('b_f', nn.initializers.zeros, (dim, self.hidden), jnp.float32)
    w_h = self.param('w_h', nn.initializers.normal(stddev=self.hidden**-0.5), (self.hidden,),
                     jnp.float32)
    projected = jnp.tanh(jnp.einsum('abc,nc->nab', w_f.astype(self.dtype), q.astype(self.dtype))
                         + b_f.astype(self.dtype))  # [N, a, b]
    logits = jnp.einsum('nma,nab,b->nm', items.astype(self.dtype), projected,
                        w_h.astype(self.dtype)).astype(jnp.float32)
    logits = jnp.where(mask, logits, -jnp.inf)
    # The zero vector's logit is f(q, 0) = 0 (eq. 11); AEM has no such slot.
    zero_logit = jnp.zeros_like(logits[:, :1]) if self.zero_attention else jnp.full_like(
        logits[:, :1], -jnp.inf)
    full = jnp.concatenate([zero_logit, logits], axis=1)
    top = jnp.max(full, axis=1, keepdims=True)
    top = jnp.where(jnp.isfinite(top), top, 0.0)  # AEM with no history: every logit -inf
    exp = jnp.exp(full - top)
    weights_all = exp / jnp.maximum(exp.sum(axis=1, keepdims=True), 1e-30)
    weights = weights_all[:, 1:]
    u = jnp.einsum('nm,nma->na', weights.astype(items.dtype), items)
    return u, weights, weights_all[:, 0]
