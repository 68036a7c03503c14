"""Minimum-Bayes-risk reranking of a context's suggestions (Kumar & Byrne, 2004).

The beam's top hypothesis is the single likeliest query; the suggestion a user (and BLEU)
rewards most is the one that shares the most with the likely next queries. MBR picks, among
candidate suggestions, the one of highest expected utility against the model's hypotheses
taken as pseudo-references weighted by their probabilities:

  choose argmax_c  sum_j p_j u(c, h_j),   p = softmax(beam scores) over the hypotheses h_j,

with u the smoothed sentence-level BLEU (`sentence_bleu`). The candidates are the hypotheses
and, optionally, the session's own queries: a reformulation shares most words with the query
before it, and when the beam spreads its mass over variants of that query, the query itself is
their consensus. The session's queries are candidates only, never evidence.

Hand-written: sacrebleu's sentence BLEU gives the same numbers but costs a tokenizer and an
object per call, and this runs 100 utilities per suggestion point.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence

MAX_ORDER = 4

# `config.decode.mbr`: the lists reordered by MBR, comma-separated ('none': no list). The
# generator's beam, its hypotheses the candidates ('beam') or the session's queries too
# ('beam+session'); 'rerank''s pooled candidates, p the ranker's softmax ('ranker').
BEAM_LISTS = ('beam', 'beam+session')
LISTS = BEAM_LISTS + ('ranker',)
# A config saved before config.decode.mbr said the beam's with config.decode.rerank.
_RERANK_VALUES = {'none': 'none', 'mbr': 'beam', 'mbr+session': 'beam+session'}


def parse(value: str) -> tuple[str, bool]:
  """`config.decode.mbr` -> (the beam's: 'none' or one of `BEAM_LISTS`; whether the ranker's
  pooled candidates are reordered). Raises ValueError naming what is wrong."""
  parts = [p.strip() for p in value.split(',') if p.strip() not in ('', 'none')]
  unknown = [p for p in parts if p not in LISTS]
  if unknown:
    raise ValueError(f'unknown list {unknown[0]!r} (known: {", ".join(LISTS)}, '
                     'comma-separated, or none)')
  beam = [p for p in parts if p in BEAM_LISTS]
  if len(beam) > 1:
    raise ValueError("at most one of 'beam' and 'beam+session'")
  return (beam[0] if beam else 'none'), 'ranker' in parts


def from_decode(decode) -> tuple[str, bool]:
  """`parse` of a config's `decode` section, a run's saved before `config.decode.mbr` too."""
  if 'mbr' not in decode and 'rerank' in decode:
    return _RERANK_VALUES[decode['rerank']], False
  return parse(decode['mbr'])


def _ngrams(words: Sequence[str], n: int) -> collections.Counter:
  return collections.Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))


def _profile(words: Sequence[str]) -> tuple[int, list[collections.Counter]]:
  """A query's length and its n-gram counts of orders 1..MAX_ORDER: what `sentence_bleu`
  reads of it, counted once per query rather than once per pair (a lone suggestion's MBR
  compares every candidate with every hypothesis)."""
  return len(words), [_ngrams(words, n) for n in range(1, MAX_ORDER + 1)]


def sentence_bleu(hypothesis: Sequence[str], reference: Sequence[str]) -> float:
  """BLEU+1 of one hypothesis against one reference, words as given, in [0, 1].

  Lin & Och (2004)'s add-one smoothing of the precisions of orders 2 to 4 (not of unigrams),
  so that a short query with no 4-gram is not scored 0 while one with no word in common is;
  the brevity penalty of mtn_jax/evaluation/metrics.py's BLEU (none when the hypothesis is at
  least as long).
  """
  return _profiled_bleu(_profile(hypothesis), _profile(reference))


def _profiled_bleu(hypothesis: tuple[int, list[collections.Counter]],
                   reference: tuple[int, list[collections.Counter]]) -> float:
  """`sentence_bleu` of two `_profile`s."""
  hyp_len, hyp_grams = hypothesis
  ref_len, ref_grams = reference
  if not hyp_len:
    return 0.0
  log_precision = 0.0
  for n in range(1, min(hyp_len, MAX_ORDER) + 1):
    # Orders longer than the hypothesis add log((0 + 1) / (0 + 1)) = 0: not computed.
    ref = ref_grams[n - 1]
    matches = 0
    for gram, count in hyp_grams[n - 1].items():
      found = ref.get(gram)
      if found:
        matches += count if count < found else found
    if n == 1 and not matches:
      return 0.0
    smoothing = 0 if n == 1 else 1
    log_precision += math.log((matches + smoothing) / (hyp_len - n + 1 + smoothing))
  brevity = min(0.0, 1.0 - ref_len / hyp_len)
  return math.exp(brevity + log_precision / MAX_ORDER)


def rerank(ranked: Sequence[dict], session: Sequence[str] = ()) -> list[dict]:
  """The suggestions by expected utility, best first.

  Args:
    ranked: the search's (or a ranker's) suggestions [{'query', 'score'}], scores = the
      evidence's log-weights (length-normalised log-probabilities, or a ranker's scores, as
      in its training loss).
    session: the session's queries so far, added as candidates when not among `ranked`.
  Returns:
    [{'query', 'score', 'model_score'}] over the distinct candidates, by expected utility
    (ties keep the search's order, then the session's, latest query first). 'score' is the
    expected utility, the value the list is ordered by, so every candidate has one; a
    candidate of `ranked` keeps its own score as 'model_score' (a session query has none:
    the model did not propose it).
  """
  if not ranked:
    return []
  best = max(r['score'] for r in ranked)
  weights = [math.exp(r['score'] - best) for r in ranked]
  total = sum(weights)
  profiles = {q: _profile(q.split()) for q in [*(r['query'] for r in ranked), *session]}
  evidence = [(profiles[r['query']], w / total) for r, w in zip(ranked, weights)]
  candidates = {}
  for r in ranked:  # a query written twice (two token sequences) keeps its better score
    if r['query'] not in candidates or r['score'] > candidates[r['query']]:
      candidates[r['query']] = r['score']
  for query in reversed(session):
    candidates.setdefault(query, None)
  scored = [{'query': q,
             'score': sum(w * _profiled_bleu(profiles[q], reference) for reference, w in evidence),
             **({} if s is None else {'model_score': s})}
            for q, s in candidates.items()]
  order = sorted(range(len(scored)), key=lambda i: -scored[i]['score'])
  return [scored[i] for i in order]
