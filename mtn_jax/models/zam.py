"""The zero attention model family (Ai et al., CIKM 2019): QEM, HEM, AEM and ZAM as rankers
of candidate next queries, personalised by each user's earlier queries.

The paper's product search, mapped onto query suggestion:
  item i          a candidate next query: an entry of the candidate pool (the training split's
                  distinct queries, `mtn_jax.data.candidate_pool`), with a learned vector i [a];
  its text T_i    the candidate's words (learned with i: log P(T_i | i), eq. 6);
  query q         phi of the session's latest query (eq. 5: tanh(W_phi mean(words) + b_phi)),
                  or of all the session's words so far (`query_from='session'`);
  history I_u     the pool items of the user's M most recent queries before the session
                  (`config.data.history_queries`; a query never seen in training has no item
                  and is left out), the same at every position of it: the paper's I_u is what
                  was bought before the query, and the session's earlier queries reach the
                  model only through q (`query_from='session'`);
  score(i)        i . (q + u) (eq. 3 and 7), u by `user_model`:
    'qem'  no user: u = 0 (eq. 4);
    'hem'  a learned vector per training user (eq. 7-8; a user unseen in training gets 0);
    'aem'  attention over I_u (eq. 9-10);
    'zam'  attention over I_u and a zero vector (eq. 11-12).
Word vectors are shared by query words and candidate words, as in the paper's Fig. 2; item
vectors by candidates and history items.

Inputs: `queries` int32 [B, S, n]; `history_items` int32 [B, M] pool ids, -1 for none;
`user` int32 [B] the training-user index (0: unseen). Position t of a session is the context
after query t, which predicts query t+1, as everywhere in this project.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from mtn_jax.data.vocab import PAD_ID
from mtn_jax.models.base import ModelConfig
from mtn_jax.models.base import check_choice
from mtn_jax.models.base import check_positive
from mtn_jax.models.user_memory import UserMemory

USER_MODELS = ('qem', 'hem', 'aem', 'zam')


@dataclasses.dataclass(frozen=True, kw_only=True)
class ZAMConfig(ModelConfig):
  """The family's fields; the data decides `num_items` (the pool's size) and `num_users`
  (training users + 1 for an unseen one)."""

  user_model: str  # 'qem' | 'hem' | 'aem' | 'zam'
  attention_hidden: int  # b: hidden units of the attention function (eq. 10)
  query_from: str  # 'last': phi of the latest query; 'session': of every word so far
  item_negatives: int  # k items drawn uniformly from the pool per context (eq. 14)
  word_negatives: int  # k words drawn from the unigram^0.75 distribution per word (eq. 14)
  num_items: int = 0
  num_users: int = 0

  # No dropout, one word table for queries and candidates, float32 vectors (the paper's).
  INERT_FIELDS = {'dropout': 0.0, 'share_embeddings': False, 'tie_embeddings': False,
                  'compute_dtype': 'float32'}

  @classmethod
  def check(cls, model) -> None:
    super().check(model)
    check_choice(model, 'user_model', USER_MODELS)
    check_choice(model, 'query_from', ('last', 'session'))
    check_positive(model, 'attention_hidden', 'item_negatives', 'word_negatives')

  @classmethod
  def reads_user_history(cls, model) -> bool:
    return model.user_model != 'qem'  # QEM has no user


def layer_label(display_name: str, fields: dict) -> str:
  """The family member's own name ("ZAM"), which says more than the family's."""
  del display_name
  return fields['user_model'].upper()


class ZeroAttentionModel(nn.Module):
  """See the module docstring. Shapes: a = `emb_dim`."""

  config: ZAMConfig

  def setup(self):
    cfg = self.config
    init = nn.initializers.normal(stddev=cfg.emb_dim**-0.5)
    self.word_vectors = self.param('word_vectors', init, (cfg.vocab_size, cfg.emb_dim),
                                   jnp.float32)
    self.item_vectors = self.param('item_vectors', init, (max(cfg.num_items, 1), cfg.emb_dim),
                                   jnp.float32)
    self.query_projection = nn.Dense(cfg.emb_dim, name='query_projection')  # W_phi, b_phi
    if cfg.user_model == 'hem':
      self.user_vectors = self.param('user_vectors', init, (max(cfg.num_users, 1), cfg.emb_dim),
                                     jnp.float32)
    if cfg.user_model in ('aem', 'zam'):
      self.memory = UserMemory(cfg.attention_hidden, zero_attention=cfg.user_model == 'zam')

  def query_vectors(self, queries: jax.Array) -> jax.Array:
    """queries int32 [B, S, n] -> q [B, S, a]: phi (eq. 5) of query t, or with
    `query_from='session'` of every word of queries 0..t."""
    mask = (queries != PAD_ID).astype(jnp.float32)
    sums = jnp.einsum('bsn,bsna->bsa', mask, self.word_vectors[queries])
    counts = mask.sum(-1)
    if self.config.query_from == 'session':
      sums, counts = jnp.cumsum(sums, axis=1), jnp.cumsum(counts, axis=1)
    return jnp.tanh(self.query_projection(sums / jnp.maximum(counts, 1.0)[..., None]))

  def user_vectors_for(self, batch, q: jax.Array) -> dict[str, jax.Array]:
    """The user embedding u [B, S, a] for every context, with the attention's 'weights'
    [B, S, M] over the history and 'zero_weight' [B, S] (AEM and ZAM; zeros otherwise)."""
    cfg = self.config
    batch_size, num_queries, _ = q.shape
    items = batch['history_items'] if 'history_items' in batch else jnp.full(
        (batch_size, 0), -1, jnp.int32)
    none = {'weights': jnp.zeros((batch_size, num_queries, items.shape[1]), jnp.float32),
            'zero_weight': jnp.zeros((batch_size, num_queries), jnp.float32)}
    if cfg.user_model == 'qem':
      return {'u': jnp.zeros_like(q), **none}
    if cfg.user_model == 'hem':
      user = batch['user']
      u = jnp.where((user > 0)[:, None], self.user_vectors[user], 0.0)
      return {'u': jnp.broadcast_to(u[:, None], q.shape), **none}
    mask = jnp.broadcast_to((items >= 0)[:, None], (batch_size, num_queries, items.shape[1]))
    vectors = jnp.broadcast_to(self.item_vectors[jnp.maximum(items, 0)][:, None],
                               (batch_size, num_queries) + items.shape[1:] + (cfg.emb_dim,))
    flat = lambda x: x.reshape((batch_size * num_queries,) + x.shape[2:])
    u, weights, zero_weight = self.memory(flat(q), flat(vectors), flat(mask))
    return {'u': u.reshape(q.shape),
            'weights': weights.reshape(batch_size, num_queries, -1),
            'zero_weight': zero_weight.reshape(batch_size, num_queries)}

  def __call__(self, batch, *, train: bool = False) -> dict[str, jax.Array]:
    """The contexts of a batch: 'context' = q + u [B, S, a], 'q', 'u', and the attention
    'weights' [B, S, M] and 'zero_weight' [B, S]."""
    del train  # no dropout in this family
    q = self.query_vectors(batch['queries'])
    user = self.user_vectors_for(batch, q)
    return {'context': q + user['u'], 'q': q, **user}

  def items(self, ids: jax.Array) -> jax.Array:
    """ids int32 [...] -> item vectors [..., a]."""
    return self.item_vectors[ids]

  def all_items(self) -> jax.Array:
    """[C, a]: every candidate's vector."""
    return self.item_vectors

  def words(self, ids: jax.Array) -> jax.Array:
    """ids int32 [...] -> word vectors [..., a]."""
    return self.word_vectors[ids]

  def users(self, user: jax.Array) -> jax.Array:
    """user int32 [B] -> HEM's user vectors [B, a]."""
    return self.user_vectors[user]
