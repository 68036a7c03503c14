"""The first suggestion chosen for corpus BLEU (`config.suggest.gain_from`, 'rerank').

Top-1 BLEU is a corpus figure (METRICS.md): clipped n-gram matches and n-gram counts are
summed over all pairs before the precisions, their geometric mean and the brevity penalty
are taken. A ranker trained to find the logged next query does not optimise it: on real
sessions repeating the previous query scores high (a reformulation keeps most of its words)
while never being the next query, and a first suggestion beats it only where it is expected
to match more n-grams than it costs. So the first suggestion of a reranked list is chosen by
its expected gain in corpus BLEU, to first order (the linear corpus BLEU of Tromble et al.,
2008, "Lattice minimum Bayes-risk decoding"):

  gain(c) = sum_n E[m_n(c)] / (4 M_n) - sum_n t_n(c) / (4 T_n) + w * t_1(c) / (4 T_1),

with m_n(c) the clipped n-gram matches of candidate c with the next query, t_n(c) its
n-grams (n = 1..4), M_n and T_n their totals over the training contexts when the previous
query is suggested (the point of the expansion: log BLEU's derivatives there), and w the
brevity penalty's weight on length (its derivative is discontinuous where the suggestions'
length reaches the references', so w is chosen on the training contexts among
`LENGTH_WEIGHTS`, together with a margin added to the previous query's gain,
`PREVIOUS_MARGINS`: how sure the model must be before it suggests anything else). The
expected matches E[m_n(c)] come from `GainNet`, a small network over what is known of a
candidate before the next query (`features`: where it comes from, the n-grams it shares
with the generator's suggestions, which is the evidence of minimum-Bayes-risk decoding, and
with the session's queries, and how often other users issued it), fitted with a Poisson
loss to the matches of the training contexts' candidates.

On the AOL sample the choice on cross-fitted training contexts is the largest margin: no
candidate is a better first suggestion than the previous query often enough to pay for the
times it is worse (docs/RESULTS.md, "The first suggestion chosen for corpus BLEU").

Those candidates are the suggestions of cross-fitted generators (`mtn_jax.hypotheses`: each
training session decoded by a generator that never saw its user) and the session's queries,
so the gain model learns how often a suggestion made for an unseen user is right. The
popularity features of a training context leave its own user's queries out, as a new user's
are absent from the training split. The rest of the list keeps the ranker's order.

The fitted model is cached in `<workdir>/gain/model.json` (JSON, no pickle) with a header of
what it depends on (the training suggestions, the features, the fitting settings); a changed
generator or setting refits it (about two minutes on the AOL sample's training split, on
2 CPU cores).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
import math
import os
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util
from sacrebleu.metrics import BLEU

from mtn_jax import hypotheses
from mtn_jax.data import preprocess
from mtn_jax.data import sessions

MAX_ORDER = 4
MAX_DISTANCE = 5  # a session's queries by distance from its end (1: the previous query)
LONGEST = 6  # candidate lengths 1..LONGEST-1 a feature each, LONGEST and longer one
# The brevity penalty's weight on length, in units of a unigram's cost 1 / (4 T_1): 0 where
# the suggestions are longer than the references (no penalty), 4 just below (log BP's
# derivative r / c^2 ~ 1 / T_1). Chosen on the training contexts.
LENGTH_WEIGHTS = (0.0, 1.0, 2.0, 3.0, 4.0)
# Added to the previous query's gain (log BLEU per context; a context's share of the corpus's
# log BLEU is about 1e-4 on the AOL sample): how sure the model must be before it suggests
# anything else. Chosen with the length weight on the training contexts.
PREVIOUS_MARGINS = (0.0, 1e-5, 2e-5, 4e-5, 8e-5, 1.6e-4)
PAD_ROWS = 16
FIT = {'hidden': 64, 'layers': 2, 'epochs': 30, 'batch': 1024, 'learning_rate': 3e-3}

FEATURES = tuple(
    ['bias', 'generated', 'generated_first', 'inverse_rank', 'novel_words', 'positions']
    + [f'session_distance_{d}' for d in range(1, MAX_DISTANCE + 1)]
    + [f'length_{n}' for n in range(1, LONGEST + 1)]
    + [f'{name}_{n}' for name in ('beam_mean', 'beam_first', 'previous', 'earlier_max',
                                  'earlier_mean') for n in range(1, MAX_ORDER + 1)]
    + [f'{name}_{n}' for name in ('covers_previous', 'within_previous', 'beam_precision')
       for n in range(1, MAX_ORDER + 1)]
    + ['previous_length', 'log_issued', 'log_followed', 'followed_share'])


def match_matrix(texts: Sequence[str]) -> np.ndarray:
  """float32 [MAX_ORDER, T, T] the clipped n-gram matches (METRICS.md) of every pair of
  `texts`, n = 1..MAX_ORDER (symmetric: a match is the smaller count of a shared n-gram)."""
  words = [t.split() for t in texts]
  out = np.zeros((MAX_ORDER, len(texts), len(texts)), np.float32)
  for n in range(1, MAX_ORDER + 1):
    index: dict[tuple[str, ...], int] = {}
    rows, cols = [], []
    for i, w in enumerate(words):
      for j in range(len(w) - n + 1):
        rows.append(i)
        cols.append(index.setdefault(tuple(w[j:j + n]), len(index)))
    if index:
      counts = np.zeros((len(texts), len(index)), np.float32)
      np.add.at(counts, (rows, cols), 1.0)
      out[n - 1] = np.minimum(counts[:, None], counts[None]).sum(-1)
  return out


def ngram_totals(texts: Sequence[str]) -> np.ndarray:
  """float64 [len(texts), MAX_ORDER] the n-grams each text holds (METRICS.md's total_n)."""
  lengths = np.array([len(t.split()) for t in texts], np.float64)
  return np.maximum(lengths[:, None] - np.arange(MAX_ORDER), 0)


class Popularity:
  """How often the training split's users issued a query, and issued it right after another.

  `of` leaves one user's own queries out: a training context is judged as a new user's,
  whose queries the training split does not hold.
  """

  def __init__(self, train: sessions.SessionSplit):
    self.issued = collections.Counter()  # text -> times issued
    self.followed = collections.Counter()  # (previous, text) -> times text came right after
    self.after = collections.Counter()  # previous -> times some query came right after it
    self.own: dict[int, tuple[collections.Counter, ...]] = {}
    users = train.users.tolist() if train.users is not None else [None] * train.num_sessions
    for i, user in enumerate(users):
      own = self.own.setdefault(user, (collections.Counter(), collections.Counter(),
                                       collections.Counter()))
      texts = train.session_texts(i)
      for t, text in enumerate(texts):
        for counts, key in ((self.issued, text), (own[0], text)):
          counts[key] += 1
        if t:
          for counts, key in ((self.followed, (texts[t - 1], text)),
                              (own[1], (texts[t - 1], text)),
                              (self.after, texts[t - 1]), (own[2], texts[t - 1])):
            counts[key] += 1

  def of(self, previous: str, text: str, user: int | None = None) -> list[float]:
    """[log(1 + issued), log(1 + issued after `previous`), that share of what followed
    `previous`], `user`'s own queries left out."""
    own = self.own.get(user) if user is not None else None
    issued = self.issued[text] - (own[0][text] if own else 0)
    followed = self.followed[previous, text] - (own[1][previous, text] if own else 0)
    after = self.after[previous] - (own[2][previous] if own else 0)
    return [math.log1p(issued), math.log1p(followed), followed / after if after else 0.0]


def context_texts(session: Sequence[str], generated: Sequence[str],
                  candidates: Sequence[str]) -> list[str]:
  """The distinct texts `features` compares: the candidates first."""
  return list(dict.fromkeys([*candidates, *generated, *session]))


def features(session: Sequence[str], generated: Sequence[str], candidates: Sequence[str],
             popularity: Popularity, user: int | None = None,
             matches: np.ndarray | None = None) -> np.ndarray:
  """float32 [len(candidates), len(FEATURES)] what is known of each candidate before the
  next query.

  Args:
    session: the session's queries so far, oldest first (the last: the previous query).
    generated: the generator's suggestions, best first.
    candidates: the texts to describe, each once.
    popularity: the training split's counts; `user`: the session's user where it is a
      training user (their own queries are left out of the counts).
    matches: `match_matrix(context_texts(session, generated, candidates))`, where made.
  """
  texts = context_texts(session, generated, candidates)
  at = {t: i for i, t in enumerate(texts)}
  if matches is None:
    matches = match_matrix(texts)
  grid = matches[:, [at[c] for c in candidates]]  # [MAX_ORDER, C, T]
  beam = grid[:, :, [at[g] for g in generated]] if generated else None
  earlier = grid[:, :, [at[q] for q in session[:-1]]] if len(session) > 1 else None
  none = np.zeros((MAX_ORDER, len(candidates)), np.float32)
  shared = np.concatenate([
      none if beam is None else beam.mean(-1), none if beam is None else beam[:, :, 0],
      grid[:, :, at[session[-1]]],
      none if earlier is None else earlier.max(-1),
      none if earlier is None else earlier.mean(-1)]).T  # [C, 5 * MAX_ORDER]
  # As shares: of the previous query's n-grams the candidate holds (1: it holds the whole
  # query), of the candidate's n-grams in the previous query, and in the mean suggestion.
  previous_ngrams = ngram_totals([session[-1]])[0]
  candidate_ngrams = ngram_totals(candidates).T  # [MAX_ORDER, C]
  shares = np.concatenate([
      grid[:, :, at[session[-1]]] / np.maximum(previous_ngrams, 1)[:, None],
      grid[:, :, at[session[-1]]] / np.maximum(candidate_ngrams, 1),
      (none if beam is None else beam.mean(-1)) / np.maximum(candidate_ngrams, 1)]).T
  rank, distance = {}, {}
  for r, text in enumerate(generated):
    rank.setdefault(text, r + 1)
  for d, text in enumerate(reversed(session)):
    distance.setdefault(text, d + 1)
  session_words = {w for q in session for w in q.split()}
  out = np.empty((len(candidates), len(FEATURES)), np.float32)
  for i, text in enumerate(candidates):
    words = text.split()
    r, d = rank.get(text, 0), distance.get(text, 0)
    out[i] = [1.0, float(r > 0), float(r == 1), 1.0 / r if r else 0.0,
              float(sum(w not in session_words for w in words)), float(len(session)),
              *(float(d == k) for k in range(1, MAX_DISTANCE + 1)),
              *(float(min(len(words), LONGEST) == n) for n in range(1, LONGEST + 1)),
              *shared[i], *shares[i], previous_ngrams[0],
              *popularity.of(session[-1], text, user)]
  return out


def candidates_of(session: Sequence[str], generated: Sequence[str]) -> list[str]:
  """A training context's candidates: the generator's suggestions, then the session's
  queries, latest first, each text once (what 'rerank' pools without pool entries)."""
  return [q for q in dict.fromkeys([*generated, *reversed(session)]) if q.strip()]


@dataclasses.dataclass(frozen=True)
class Examples:
  """Every candidate of every context: features [N, F], clipped matches with the next query
  and n-gram counts [N, MAX_ORDER], its context [N] and each context's reference length."""

  features: np.ndarray
  matches: np.ndarray
  ngrams: np.ndarray
  context: np.ndarray
  reference_lengths: np.ndarray


def examples(contexts: Sequence[Sequence[str]], generated: Sequence[Sequence[str]],
             references: Sequence[str], users: Sequence[int | None],
             popularity: Popularity) -> Examples:
  xs, ms, ns, cs = [], [], [], []
  for i, (session, gen, ref, user) in enumerate(zip(contexts, generated, references, users)):
    cands = candidates_of(session, gen)
    texts = context_texts(session, gen, cands)
    with_reference = match_matrix([*texts, ref])  # the reference last
    xs.append(features(session, gen, cands, popularity, user, with_reference[:, :-1, :-1]))
    ms.append(with_reference[:, :len(cands), -1].T)
    ns.append(ngram_totals(cands))
    cs.append(np.full(len(cands), i))
  return Examples(np.concatenate(xs), np.concatenate(ms).astype(np.float64),
                  np.concatenate(ns), np.concatenate(cs),
                  np.array([len(r.split()) for r in references], np.float64))


def first_choices(utility: np.ndarray, context: np.ndarray) -> np.ndarray:
  """int [contexts] the row of each context's highest utility (the first row on a tie)."""
  order = np.lexsort((np.arange(len(context)), -utility, context))
  first = np.ones(len(order), bool)
  first[1:] = context[order][1:] != context[order][:-1]
  return order[first]


def previous_query(ex: Examples) -> tuple[np.ndarray, np.ndarray]:
  """(bool [candidates]: the candidate is its context's previous query, int [contexts]: the row
  each context suggests when it repeats the previous query)."""
  previous = ex.features[:, FEATURES.index('session_distance_1')] == 1
  return previous, first_choices(previous.astype(np.float64), ex.context)


def corpus_bleu(ex: Examples, rows: np.ndarray) -> float:
  """METRICS.md's BLEU when each context suggests its candidate of `rows`."""
  return bleu_of_counts(ex.matches[rows].sum(0), ex.ngrams[rows].sum(0),
                        ex.reference_lengths.sum())


def bleu_of_counts(matches: np.ndarray, ngrams: np.ndarray, reference_length: float) -> float:
  """METRICS.md's BLEU of a corpus from its summed clipped matches and n-grams [MAX_ORDER] and
  its references' length, by the engine of `metrics.bleu` (sacrebleu, its settings)."""
  return float(BLEU.compute_bleu(
      correct=[int(m) for m in matches], total=[int(t) for t in ngrams], sys_len=int(ngrams[0]),
      ref_len=int(reference_length), smooth_method='none', max_ngram_order=MAX_ORDER).score)


class GainNet(nn.Module):
  """[..., F] standardised features -> [..., MAX_ORDER] log expected clipped matches."""

  hidden: int
  layers: int

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    for _ in range(self.layers):
      x = nn.relu(nn.Dense(self.hidden)(x))
    return nn.Dense(MAX_ORDER)(x)  # log of the expected matches (Poisson's log link)


def poisson_loss(log_expected: jax.Array, matches: jax.Array) -> jax.Array:
  """Mean Poisson negative log-likelihood (up to a constant): minimised by the mean, and
  with the log link the fitted totals equal the observed ones."""
  return jnp.mean(jnp.exp(log_expected) - matches * log_expected)


def fit_net(x: np.ndarray, y: np.ndarray, seed: int) -> dict:
  """GainNet fitted to predict `y` [N, MAX_ORDER] from `x` [N, F]: {'params', 'mean',
  'scale'}. Adam on shuffled batches, its step decayed to 0 on a cosine; `seed` fixes the
  initialisation and the order."""
  net = GainNet(FIT['hidden'], FIT['layers'])
  mean, scale = x.mean(0), x.std(0) + 1e-6
  xs = jnp.asarray((x - mean) / scale, jnp.float32)
  ys = jnp.asarray(y, jnp.float32)
  params = net.init(jax.random.PRNGKey(seed), xs[:1])
  size = min(FIT['batch'], len(xs))
  steps = FIT['epochs'] * (len(xs) // size)
  # Decayed to 0, so the fit settles on the mean instead of wandering around it.
  optimizer = optax.adam(optax.cosine_decay_schedule(FIT['learning_rate'], max(steps, 1)))

  @jax.jit
  def step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(
        lambda p: poisson_loss(net.apply(p, xs[batch]), ys[batch]))(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  opt_state = optimizer.init(params)
  rng = np.random.default_rng(seed)
  for _ in range(FIT['epochs']):
    order = rng.permutation(len(xs))
    for start in range(0, len(xs) - size + 1, size):
      params, opt_state, _ = step(params, opt_state, jnp.asarray(order[start:start + size]))
  return {'params': jax.tree.map(np.asarray, params), 'mean': mean, 'scale': scale}


@functools.partial(jax.jit, static_argnames=('hidden', 'layers'))
def _predict(params, x, mean, scale, *, hidden, layers):
  return jnp.exp(GainNet(hidden, layers).apply(params, (x - mean) / scale))


def predict(net: dict, x: np.ndarray) -> np.ndarray:
  """float64 [N, MAX_ORDER] the expected clipped matches of `fit_net`'s network."""
  if not len(x):
    return np.zeros((0, MAX_ORDER))
  # Rows padded to a multiple of PAD_ROWS: one compilation serves many candidate counts.
  padded = np.zeros((-(-len(x) // PAD_ROWS) * PAD_ROWS, x.shape[1]), np.float32)
  padded[:len(x)] = x
  return np.asarray(_predict(net['params'], jnp.asarray(padded),
                             jnp.asarray(net['mean'], jnp.float32),
                             jnp.asarray(net['scale'], jnp.float32),
                             hidden=FIT['hidden'], layers=FIT['layers']), np.float64)[:len(x)]


@dataclasses.dataclass
class GainModel:
  """A fitted gain model: `gains` of candidates, `gains_after` those of one context.

  Attributes:
    net: `fit_net`'s network.
    matches, ngrams: float64 [MAX_ORDER] M_n and T_n, the expansion point.
    length_weight: w, in units of 1 / (4 T_1).
    previous_margin: added to the previous query's gain.
    popularity: the training split's counts.
    figures: the training contexts' BLEU repeating the previous query, and by the gain
      with each length weight and margin tried (cross-fitted predictions).
  """

  net: dict
  matches: np.ndarray
  ngrams: np.ndarray
  length_weight: float
  previous_margin: float
  popularity: Popularity
  figures: dict

  def gains(self, features_: np.ndarray, ngrams: np.ndarray) -> np.ndarray:
    """float64 [N] the gains of candidates given their `features` [N, F] and n-grams
    [N, MAX_ORDER], the previous query's margin included."""
    previous = features_[:, FEATURES.index('session_distance_1')] == 1
    return (gain(predict(self.net, features_), ngrams, self.matches, self.ngrams,
                 self.length_weight) + self.previous_margin * previous)

  def gains_after(self, session: Sequence[str], generated: Sequence[str],
                  candidates: Sequence[str]) -> np.ndarray:
    """float64 [len(candidates)] each candidate's gain after `session` (a new user's)."""
    if not candidates:
      return np.zeros(0)
    x = features(session, generated, candidates, self.popularity)
    return self.gains(x, ngram_totals(candidates))


def gain(expected: np.ndarray, ngrams: np.ndarray, matches_total: np.ndarray,
         ngrams_total: np.ndarray, length_weight: float) -> np.ndarray:
  """float64 [N] the first-order change of corpus log BLEU when a context suggests each
  candidate (expected matches and n-grams [N, MAX_ORDER]), up to a per-context constant."""
  return ((expected / matches_total).sum(-1) - (ngrams / ngrams_total).sum(-1)
          + length_weight * ngrams[:, 0] / ngrams_total[0]) / MAX_ORDER


def fit(ex: Examples, users: np.ndarray, popularity: Popularity, seed: int,
        log=print) -> GainModel:
  """The gain model of the training contexts `ex` (`users` [contexts]).

  The expansion point is the previous query's totals. The length weight and the previous
  query's margin are the pair of highest BLEU on the training contexts, with predictions
  cross-fitted over two halves of the users (each half predicted by a network fitted on the
  other, so they are as good as a new user's, and a choice that only fits noise shows as a
  loss). The returned network is fitted on all contexts.
  """
  previous, rows = previous_query(ex)
  matches, ngrams = ex.matches[rows].sum(0), ex.ngrams[rows].sum(0)
  half = sessions.user_folds(users, 2, seed)[ex.context]
  expected = np.zeros_like(ex.matches)
  for h in (0, 1):
    net = fit_net(ex.features[half != h], ex.matches[half != h], seed)
    expected[half == h] = predict(net, ex.features[half == h])
  grid = {}
  for w in LENGTH_WEIGHTS:
    gains = gain(expected, ex.ngrams, matches, ngrams, w)
    for margin in PREVIOUS_MARGINS:
      chosen = first_choices(gains + margin * previous, ex.context)
      grid[w, margin] = (corpus_bleu(ex, chosen), float(previous[chosen].mean()))
  w, margin = max(grid, key=lambda k: grid[k][0])
  figures = {'contexts': int(ex.context[-1]) + 1 if len(ex.context) else 0,
             'previous_query': corpus_bleu(ex, rows),
             'cross_fitted': [{'length_weight': k[0], 'previous_margin': k[1], 'bleu': v[0],
                               'previous_first': v[1]} for k, v in grid.items()]}
  log(f'  gain model, the training contexts cross-fitted: BLEU {figures["previous_query"]:.2f} '
      f'repeating the previous query, {grid[w, margin][0]:.2f} by the gain (length weight '
      f'{w:g}, previous query\'s margin {margin:g}: the previous query first for '
      f'{100 * grid[w, margin][1]:.1f} % of contexts)', flush=True)
  return GainModel(fit_net(ex.features, ex.matches, seed), matches, ngrams, w, margin,
                   popularity, figures)


KEY = 'config.suggest.gain_from'


def training_contexts(train: sessions.SessionSplit, suggestions: Sequence[Sequence[str]]):
  """The training split's contexts: (sessions so far, the suggestions after them, next
  queries, users), every (prefix -> next query) position of every session."""
  contexts, generated, references, users = [], [], [], []
  for i in range(train.num_sessions):
    texts = train.session_texts(i)
    for t in range(len(texts) - 1):
      contexts.append(texts[:t + 1])
      generated.append(suggestions[train.starts[i] + t])
      references.append(texts[t + 1])
      users.append(int(train.users[i]))
  return contexts, generated, references, np.array(users, np.int64)


def load_or_fit(gain_from: str, workdir: str, seed: int, log=print) -> GainModel:
  """The gain model of the generators `gain_from` names (cross-fitted over the users of
  `workdir`'s corpus, as `config.train.hypotheses_from`), read from its cache in `workdir`
  or fitted there."""
  data_dir = preprocess.data_dir(os.path.abspath(workdir))
  train = sessions.load_split(data_dir, 'train')
  found = hypotheses.generators(gain_from, data_dir)
  suggestions = hypotheses.split_suggestions(found, train, log=log)
  digest = hashlib.sha256(json.dumps(suggestions, ensure_ascii=False).encode('utf-8'))
  header = {'suggestions': digest.hexdigest()[:16], 'sessions': hypotheses.fingerprint(train),
            'features': list(FEATURES), 'fit': FIT, 'length_weights': list(LENGTH_WEIGHTS),
            'previous_margins': list(PREVIOUS_MARGINS), 'seed': seed}
  popularity = Popularity(train)
  path = os.path.join(workdir, 'gain', 'model.json')
  cached = _read(path, header, popularity)
  if cached is not None:
    return cached
  contexts, generated, references, users = training_contexts(train, suggestions)
  log(f'Fitting the first suggestion\'s gain model on {len(contexts):,} training contexts '
      f'(the suggestions of {", ".join(g.workdir for g in found)}).', flush=True)
  ex = examples(contexts, generated, references, users, popularity)
  model = fit(ex, users, popularity, seed, log=log)
  _write(path, header, model)
  return model


def _read(path: str, header: dict, popularity: Popularity) -> GainModel | None:
  try:
    with open(path, encoding='utf-8') as f:
      saved = json.load(f)
  except (OSError, ValueError):
    return None
  if saved.get('header') != header:
    return None
  params = traverse_util.unflatten_dict(
      {tuple(k.split('/')): np.asarray(v, np.float32) for k, v in saved['params'].items()})
  net = {'params': params, 'mean': np.asarray(saved['mean'], np.float32),
         'scale': np.asarray(saved['scale'], np.float32)}
  return GainModel(net, np.asarray(saved['matches']), np.asarray(saved['ngrams']),
                   saved['length_weight'], saved['previous_margin'], popularity,
                   saved['figures'])


def _write(path: str, header: dict, model: GainModel) -> None:
  flat = traverse_util.flatten_dict(model.net['params'])
  saved = {'header': header,
           'params': {'/'.join(k): np.asarray(v).tolist() for k, v in flat.items()},
           'mean': np.asarray(model.net['mean']).tolist(),
           'scale': np.asarray(model.net['scale']).tolist(),
           'matches': model.matches.tolist(), 'ngrams': model.ngrams.tolist(),
           'length_weight': model.length_weight, 'previous_margin': model.previous_margin,
           'figures': model.figures}
  os.makedirs(os.path.dirname(path), exist_ok=True)
  temporary = f'{path}.tmp{os.getpid()}'
  with open(temporary, 'w', encoding='utf-8') as f:
    json.dump(saved, f)
  os.replace(temporary, path)
