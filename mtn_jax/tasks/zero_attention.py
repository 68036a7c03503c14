"""The zero attention family's task: training by negative sampling, scoring the pool.

`ZeroAttentionTask` trains `mtn_jax.models.zam.ZeroAttentionModel` (QEM, HEM, AEM, ZAM) with
the paper's objective (notes eq. 13-14), for every context of a session (position t predicts
query t+1, whose pool entry is the item to rank first):

  item term  -log s(i+ . c) - sum_{k} log s(-i-_k . c),  c = q + u, i-_k uniform over the pool;
  word term  -sum_{w in T_i+} [log s(w . i+) + sum_{k} log s(-w'_k . i+)],
             w'_k ~ P_w = the training words' unigram distribution to the power 3/4;
  HEM adds   -sum_{w in T_u} [log s(w . u) + sum_{k} log s(-w'_k . u)] once per session,
             T_u = the words of the user's history (eq. 8);

with s the sigmoid, k = `item_negatives` / `word_negatives`. Validation measures what
retrieval needs, exactly: the target's softmax cross-entropy among every pool candidate, and
how often it ranks first. A context whose next query is not in the pool (a query first issued
outside training) cannot be retrieved: it counts in retrieval metrics
(`mtn_jax.evaluation.pool_ranking`) as a miss, but no loss can be defined for it.

Batch keys: `queries` [B, S, n]; `targets` [B, S] each query's pool index (-1: not in the
pool); `history_items` [B, M] (AEM, ZAM); `user` [B] and `history` [B, M, n] (HEM).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from mtn_jax import errors
from mtn_jax.data import candidate_pool
from mtn_jax.data import sessions
from mtn_jax.data.vocab import PAD_ID
from mtn_jax.models.base import ModelConfig
from mtn_jax.tasks import base


def word_noise_logits(pool: candidate_pool.CandidatePool, vocab_size: int) -> np.ndarray:
  """float32 [V]: log P_w, the unigram distribution of the training split's tokens (the
  pool's entries weighted by how often each was issued) to the power 3/4; padding and
  unseen words never drawn."""
  tokens = pool.queries.reshape(-1)
  weights = np.repeat(pool.counts, pool.queries.shape[1])
  counts = np.bincount(tokens, weights=weights, minlength=vocab_size)[:vocab_size]
  counts[PAD_ID] = 0
  with np.errstate(divide='ignore'):
    return (0.75 * np.log(counts)).astype(np.float32)


def draw_words(rng: jax.Array, logits: np.ndarray, shape: tuple[int, ...]) -> jax.Array:
  """int32 `shape` words drawn from softmax(`logits` [V]) by inverting its CDF.

  Not `jax.random.categorical`: that draws one Gumbel number per word of the vocabulary for
  every sample ([..., V]), which made the family's training step several times slower; a
  binary search over the CDF costs log V per sample.
  """
  cdf = jnp.cumsum(jax.nn.softmax(jnp.asarray(logits)))
  drawn = jnp.searchsorted(cdf, jax.random.uniform(rng, shape) * cdf[-1], side='right')
  return jnp.minimum(drawn, len(logits) - 1).astype(jnp.int32)


def user_index(train_users: np.ndarray, users: np.ndarray) -> np.ndarray:
  """int32: each of `users` as 1 + its rank among the distinct training users, 0 for a user
  never seen in training (HEM has no vector for them)."""
  known = np.unique(train_users)
  position = np.searchsorted(known, users)
  found = (position < len(known)) & (known[np.minimum(position, len(known) - 1)] == users)
  return np.where(found, position + 1, 0).astype(np.int32)


@dataclasses.dataclass(frozen=True, eq=False)
class ZeroAttentionTask(base.RankingTask):
  """See the module docstring.

  Attributes:
    data_dir: the corpus's folder (the pool, the splits' history items, the training users).
    word_noise: float32 [V] log P_w (`word_noise_logits`).
    train_users: int64 the distinct users of the training split (HEM's table).
  """

  data_dir: str = ''
  word_noise: np.ndarray | None = None
  train_users: np.ndarray | None = None

  @staticmethod
  def check_config(config: ml_collections.ConfigDict) -> None:
    """Refuses what the family cannot learn (`config_lib.validate` asks before any work)."""
    if config.model.user_model == 'hem' and config.train.user_folds:
      # HEM learns a vector per training user (`train_users`, the whole training split's):
      # the held-out fold's users would read rows no step trains, where a user never seen
      # reads the row for none.
      raise errors.Error("config.train.user_folds holds users out of training, and "
                         "config.model.user_model='hem' learns a vector per training user: "
                         "use another user model ('qem', 'aem' or 'zam'), or no folds")

  @classmethod
  def from_config(cls, cfg: ModelConfig, train: ml_collections.ConfigDict,
                  data_dir: str | None = None) -> ZeroAttentionTask:
    del train  # the family has no label smoothing or other loss options
    if data_dir is None:
      raise ValueError('the zero attention family needs the corpus folder (its pool)')
    pool = candidate_pool.load_pool(data_dir)
    users = sessions.load_split(data_dir, 'train').users
    return cls(cfg, data_dir=data_dir, word_noise=word_noise_logits(pool, cfg.vocab_size),
               train_users=np.unique(users) if users is not None else np.zeros(0, np.int64))

  LOSS_KEYS = ('targets',)

  @property
  def input_keys(self) -> tuple[str, ...]:
    keys = ('queries', 'targets')
    if self.cfg.user_model in ('aem', 'zam'):
      keys += ('history_items',)
    if self.cfg.user_model == 'hem':
      keys += ('user', 'history')
    return keys

  @functools.cached_property
  def pool(self) -> candidate_pool.CandidatePool:
    return candidate_pool.load_pool(self.data_dir)

  def context_inputs(self, split, vocab) -> base.SplitInputs:
    """Per session: 'history_items' [num_sessions, M] (AEM, ZAM); 'user' (each session's
    user as `user_index` numbers them, from `split.users`: 0 for one never seen in
    training) and 'history' (HEM)."""
    del vocab
    if self.cfg.user_model == 'qem':
      return base.SplitInputs()
    items = split.history_items
    if items is None or items.shape[1] == 0:
      raise errors.Error(f'config.model.user_model={self.cfg.user_model!r} needs the users\' '
                         'earlier queries: set config.data.history_queries > 0 (the '
                         f'{split.name} split has none)')
    if self.cfg.user_model == 'hem':
      return base.SplitInputs(per_session={'user': user_index(self.train_users, split.users),
                                           'history': split.history})
    return base.SplitInputs(per_session={'history_items': items})

  def training_inputs(self, split, vocab) -> base.SplitInputs:
    """`context_inputs`, and 'targets' int32 [num_queries]: each query row's pool index, -1
    outside the pool."""
    return base.SplitInputs(per_query={'targets': self.pool.ids_of(split.texts)}) | (
        self.context_inputs(split, vocab))

  @classmethod
  def vector_index(cls, cfg: ModelConfig) -> bool:
    """No: the index reads a Bi-encoder's context vectors (`retrieval.bi_contexts`)."""
    del cfg
    return False

  def example_batch(self) -> dict[str, jax.Array]:
    n = self.cfg.max_query_words
    return {'queries': jnp.ones((1, 2, n), jnp.int32), 'targets': jnp.zeros((1, 2), jnp.int32),
            'history_items': jnp.zeros((1, 1), jnp.int32), 'user': jnp.zeros((1,), jnp.int32),
            'history': jnp.ones((1, 1, n), jnp.int32)}

  def contexts(self, params, batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """The model's contexts for predicting each next query: 'context' [B, S-1, a] and the
    attention's 'weights' [B, S-1, M] and 'zero_weight' [B, S-1]."""
    out = self.model.apply({'params': params}, batch)
    return {k: out[k][:, :-1] for k in ('context', 'weights', 'zero_weight')}

  def loss_sums(self, params, batch: Mapping[str, jax.Array], *, train: bool, rngs=None,
                groups: int = 1) -> dict[str, jax.Array]:
    """Training: the negative-sampling objective (module docstring). Evaluation: the exact
    cross-entropy of the target among the whole pool. Sums over contexts whose next query
    is a pool entry."""
    del groups  # every context's loss is its own: no cross-example terms to keep apart
    cfg = self.cfg
    model = self.model
    variables = {'params': params}
    out = model.apply(variables, batch)
    context = out['context'][:, :-1]  # [B, S-1, a]
    next_queries = batch['queries'][:, 1:]  # [B, S-1, n]
    targets = batch['targets'][:, 1:]
    valid = (next_queries != PAD_ID).any(-1) & (targets >= 0)
    weight = valid.astype(jnp.float32)
    target_ids = jnp.maximum(targets, 0)
    if not train:
      logits = jnp.einsum('bta,ca->btc', context, model.apply(variables, method='all_items'))
      target_logit = jnp.take_along_axis(logits, target_ids[..., None], axis=-1)[..., 0]
      nll = jax.nn.logsumexp(logits, axis=-1) - target_logit
      correct = jnp.argmax(logits, axis=-1) == target_ids
      sums = (nll * weight).sum()
      return {'loss': sums, 'nll': sums, 'correct': (correct * weight).sum(),
              'tokens': weight.sum(), 'pairs': weight.sum()}
    item_rng, word_rng, user_rng = jax.random.split(rngs['dropout'], 3)
    positive = model.apply(variables, target_ids, method='items')  # [B, S-1, a]
    negative_ids = jax.random.randint(item_rng, targets.shape + (cfg.item_negatives,), 0,
                                      cfg.num_items)
    negative = model.apply(variables, negative_ids, method='items')  # [B, S-1, k, a]
    item_loss = -(jax.nn.log_sigmoid((positive * context).sum(-1))
                  + jax.nn.log_sigmoid(-jnp.einsum('btka,bta->btk', negative,
                                                   context)).sum(-1))
    word_loss = self._word_loss(variables, next_queries, positive, word_rng)
    loss = ((item_loss + word_loss) * weight).sum()
    if cfg.user_model == 'hem':
      user = batch['user']
      history = batch['history']  # [B, M, n]: the user's earlier queries' words
      user_vectors = model.apply(variables, user, method='users')  # [B, a]
      per_user = self._word_loss(
          variables, history,
          jnp.broadcast_to(user_vectors[:, None], history.shape[:2] + user_vectors.shape[-1:]),
          user_rng).sum(-1)  # [B]
      # Once per session of a known user with a history, not once per context.
      loss += (per_user * ((user > 0) & valid.any(-1))).sum()
    return {'loss': loss, 'nll': (item_loss * weight).sum(), 'correct': jnp.zeros(()),
            'tokens': weight.sum(), 'pairs': weight.sum()}

  def _word_loss(self, variables, words: jax.Array, vectors: jax.Array,
                 rng: jax.Array) -> jax.Array:
    """-sum_w [log s(w . v) + sum_k log s(-w'_k . v)] over the real words of `words`
    int32 [..., n], for vectors [..., a]: [...] per row (eq. 14's text terms)."""
    mask = (words != PAD_ID).astype(jnp.float32)
    word_vectors = self.model.apply(variables, words, method='words')  # [..., n, a]
    positive = jax.nn.log_sigmoid(jnp.einsum('...na,...a->...n', word_vectors, vectors))
    noise = draw_words(rng, self.word_noise, words.shape + (self.cfg.word_negatives,))
    noise_vectors = self.model.apply(variables, noise, method='words')  # [..., n, k, a]
    negative = jax.nn.log_sigmoid(-jnp.einsum('...nka,...a->...nk', noise_vectors, vectors))
    return -((positive + negative.sum(-1)) * mask).sum(-1)

  def encode_candidates(self, params, candidate_queries: jax.Array) -> jax.Array:
    """[C, a]: the pool's item vectors (learned per entry, so the words are not read; the
    pool must be the one the model was trained on)."""
    if candidate_queries.shape[0] != self.cfg.num_items:
      raise ValueError(f'the model ranks a pool of {self.cfg.num_items} candidates, got '
                       f'{candidate_queries.shape[0]}')
    return self.model.apply({'params': params}, method='all_items')

  def score_pool(self, params, batch: Mapping[str, jax.Array], cache: jax.Array) -> jax.Array:
    """float32 [B, S-1, C]: i . (q + u) for every pool entry i (eq. 3)."""
    return jnp.einsum('bta,ca->btc', self.contexts(params, batch)['context'], cache)

  def attention(self, params, batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """The history attention of each context: 'weights' [B, S-1, M] (zeros for QEM and
    HEM, which attend to nothing) and 'zero_weight' [B, S-1], the mass on the zero vector
    (NaN but for ZAM: only its memory has one, so no figure is reported for the others)."""
    out = self.contexts(params, batch)
    zero_weight = (out['zero_weight'] if self.cfg.user_model == 'zam'
                   else jnp.full_like(out['zero_weight'], jnp.nan))
    return {'weights': out['weights'], 'zero_weight': zero_weight}
