"""Suggestion-quality metrics: corpus BLEU with n-gram precisions, and ranking metrics.

BLEU follows `multi-bleu.perl` as ported by M-NSRF, the metric the MTN paper reports:
  in:  `candidates` [pairs] suggested queries as strings (words joined by whitespace, the
       end-of-query token excluded, an emitted `<unk>` kept as `<unk>`);
       `references` [pairs] the raw next queries of the log, cut to the maximum query length
       and NOT mapped through the vocabulary.
  out: `BleuScore` with BLEU and the 1..4-gram precisions in percent, the brevity penalty
       and the corpus lengths; `str()` prints the paper's `BLEU = 14.62, 35.7/21.5/14.9/10.2`.
Tokens are `s.split()` (any Unicode whitespace), case-sensitive, nothing else normalised.
n-gram counts are clipped per pair and summed over the corpus before dividing (micro
precision); a candidate shorter than n adds no n-grams; there is no smoothing, so one
n-gram order without a match gives BLEU 0.

Ranking metrics, for models that score a fixed set of candidate queries:
  `ranks_from_scores`: scores [examples, candidates], true_index [examples] -> ranks [examples]
  (rank 1 = best); `recall_at_k` and `mean_reciprocal_rank` reduce ranks to one number.

Ranked suggestions, for every suggester (a list of queries per pair, best first):
  `suggestion_ranking`: suggestions [pairs][k], references [pairs], the session's earlier
  queries [pairs][t+1] -> `RankingScore`: exact match of the logged next query at rank 1,
  Recall@5 and @10 and MRR@10 over the DISTINCT suggestions in order, and the share of top-1
  suggestions that repeat a query already in the session; strings compare exactly, as logged.
  `without_session_queries` gives the user-facing list that never repeats the session.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from sacrebleu.metrics import BLEU

from mtn_jax.decoding import search

MAX_NGRAM_ORDER = 4


@dataclasses.dataclass(frozen=True)
class BleuScore:
  """Corpus BLEU in the paper's terms.

  Attributes:
    bleu: BLEU in percent (a perfect corpus may land a few ulps above 100).
    precisions: the 1-, 2-, 3- and 4-gram precisions in percent.
    bp: the brevity penalty, 0..1.
    hyp_len: the number of candidate words in the corpus.
    ref_len: the number of reference words in the corpus.
  """

  bleu: float
  precisions: tuple[float, float, float, float]
  bp: float
  hyp_len: int
  ref_len: int

  def __str__(self) -> str:
    """`BLEU = 14.62, 35.7/21.5/14.9/10.2`, the format of `multi-bleu.perl`."""
    return f'BLEU = {self.bleu:.2f}, ' + '/'.join(f'{p:.1f}' for p in self.precisions)

  def to_dict(self) -> dict[str, float | int | list[float]]:
    """A JSON-ready dict of every field."""
    return {'bleu': self.bleu, 'precisions': list(self.precisions), 'bp': self.bp,
            'hyp_len': self.hyp_len, 'ref_len': self.ref_len}


def bleu(candidates: Sequence[str], references: Sequence[str]) -> BleuScore:
  """Corpus BLEU of `candidates[i]` against the single reference `references[i]`.

  An empty corpus scores BLEU 0 with zero lengths and a brevity penalty of 1 (c >= r when
  both are 0), which is what the definition gives when no pair adds anything.

  Raises:
    ValueError: the two lists differ in length.
    TypeError: an entry is not a string.
  """
  if len(candidates) != len(references):
    raise ValueError(f'bleu needs one reference per candidate, got {len(candidates)} '
                     f'candidates and {len(references)} references')
  _check_texts('candidates', candidates)
  _check_texts('references', references)
  # sacrebleu's settings that make it exactly the definition: tokenize='none' splits with
  # `str.split()` (Unicode whitespace, like `s.strip().split()`), no smoothing and all four
  # orders always, mixed case; `force` silences its warning about pre-tokenized text, which
  # search queries legitimately look like.
  metric = BLEU(tokenize='none', smooth_method='none', lowercase=False, force=True,
                effective_order=False, max_ngram_order=MAX_NGRAM_ORDER)
  if candidates:
    score = metric.corpus_score(list(candidates), [list(references)])
  else:
    # corpus_score indexes the first candidate, so an empty corpus goes straight to the
    # score formula with all-zero statistics.
    score = BLEU.compute_bleu(correct=[0] * MAX_NGRAM_ORDER, total=[0] * MAX_NGRAM_ORDER,
                              sys_len=0, ref_len=0, smooth_method='none',
                              max_ngram_order=MAX_NGRAM_ORDER)
  return BleuScore(bleu=float(score.score), precisions=tuple(float(p) for p in score.precisions),
                   bp=float(score.bp), hyp_len=int(score.sys_len), ref_len=int(score.ref_len))


def ranks_from_scores(scores: np.ndarray, true_index: np.ndarray) -> np.ndarray:
  """The rank of each example's true candidate among its scored candidates.

  Ties count against the true candidate (pessimistic): its rank is 1 + the number of other
  candidates scoring >= it, so a model that scores every candidate alike gets the worst
  rank, never a lucky one.

  Args:
    scores: float [examples, candidates], higher is better; NaN is refused.
    true_index: int [examples], the column of each example's true candidate.

  Returns:
    int64 [examples], 1 = best.
  """
  scores, true_index = np.asarray(scores), np.asarray(true_index)
  if scores.ndim != 2:
    raise ValueError(f'scores must be [examples, candidates], got shape {scores.shape}')
  if true_index.shape != scores.shape[:1]:
    raise ValueError(f'true_index must be [examples] = [{scores.shape[0]}], '
                     f'got shape {true_index.shape}')
  if not np.issubdtype(true_index.dtype, np.integer):
    raise ValueError(f'true_index must hold integers, got dtype {true_index.dtype}')
  out_of_range = np.flatnonzero((true_index < 0) | (true_index >= scores.shape[1]))
  if out_of_range.size:
    i = out_of_range[0]
    raise ValueError(f'true_index[{i}] = {true_index[i]} is not a column of the '
                     f'{scores.shape[1]} candidates')
  nan_rows = np.flatnonzero(np.isnan(scores).any(axis=1))
  if nan_rows.size:
    raise ValueError(f'scores of example {nan_rows[0]} contain NaN; a rank would be arbitrary')
  true_scores = np.take_along_axis(scores, true_index[:, None], axis=1)
  # The true candidate is >= itself, so the count is already 1 + the others that tie or win.
  return (scores >= true_scores).sum(axis=1).astype(np.int64)


def _checked_ranks(ranks: Sequence[int] | np.ndarray) -> np.ndarray:
  ranks = np.asarray(ranks)
  if ranks.ndim != 1 or ranks.size == 0:
    raise ValueError(f'ranks must be a non-empty [examples] list, got shape {ranks.shape}')
  if not np.issubdtype(ranks.dtype, np.integer):
    raise ValueError(f'ranks must be integers, got dtype {ranks.dtype}')
  below_one = np.flatnonzero(ranks < 1)
  if below_one.size:
    i = below_one[0]
    raise ValueError(f'ranks[{i}] = {ranks[i]}, but rank 1 is the best there is')
  return ranks


def recall_at_k(ranks: Sequence[int] | np.ndarray, k: int) -> float:
  """R@k: the share of examples whose true candidate ranks in the top `k` (rank 1 = best)."""
  if k < 1:
    raise ValueError(f'k must be at least 1, got {k}')
  return float(np.mean(_checked_ranks(ranks) <= k))


def mean_reciprocal_rank(ranks: Sequence[int] | np.ndarray) -> float:
  """MRR: the mean over examples of 1 / rank of the true candidate (rank 1 = best)."""
  return float(np.mean(1.0 / _checked_ranks(ranks)))


def distinct(suggestions: Sequence[str]) -> list[str]:
  """The suggestions in order with repeats removed (a beam can end two hypotheses alike)."""
  return list(dict.fromkeys(suggestions))


def without_session_queries(suggestions: Sequence[str], session: Sequence[str]) -> list[str]:
  """The suggestions the user-facing protocol shows (`search.shown_to_user`: none that
  repeats a query of the session, none empty), in their order. Strings compare exactly:
  `Paris` does not repeat `paris`."""
  seen = set(session)
  return [s for s in suggestions if search.shown_to_user(s, seen)]


RANKING_CUTOFF = 10  # the deepest rank any ranking metric reads


@dataclasses.dataclass(frozen=True)
class RankingScore:
  """Ranked-suggestion metrics in percent, each a mean over all `pairs` (a pair without any
  suggestion adds 0 to every one of them; see `suggestion_ranking`)."""

  exact_match: float  # the top suggestion is the logged next query
  recall_at_5: float  # the logged next query is among the first 5 distinct suggestions
  recall_at_10: float  # ... among the first 10
  mrr_at_10: float  # mean of 1 / rank within the first 10 distinct suggestions, else 0
  repeats_session: float  # the top suggestion is a query the session already holds
  pairs: int
  # The most distinct suggestions any pair has (at most RANKING_CUTOFF): Recall@k for a
  # larger k reads nothing more than Recall@longest_list and is not reported (`reaches`).
  longest_list: int = RANKING_CUTOFF

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)

  @staticmethod
  def reaches(ranking: dict, k: int) -> bool:
    """Whether the lists behind a `to_dict()` reach rank k (results written before
    `longest_list` existed are taken to)."""
    return ranking.get('longest_list', RANKING_CUTOFF) >= k


def _check_texts(name: str, texts: Sequence[str]) -> None:
  for i, text in enumerate(texts):
    if not isinstance(text, str):
      raise TypeError(f'{name}[{i}] must be a string, got {type(text).__name__}')


def suggestion_ranking(suggestions: Sequence[Sequence[str]], references: Sequence[str],
                       sessions: Sequence[Sequence[str]]) -> RankingScore:
  """Where the logged next query ranks among each pair's distinct suggestions.

  Strings compare exactly, as logged (case-sensitive, nothing normalised), like BLEU's
  references.

  Args:
    suggestions: [pairs] lists of suggested queries, best first (duplicates allowed: only
      the first of equal suggestions counts); a pair may have none.
    references: [pairs] the logged next queries.
    sessions: [pairs] the queries the session held so far (0..t).
  Returns:
    RankingScore; a pair whose reference is not among the first 10 distinct suggestions
    adds 0 to every recall and to MRR@10, and a pair without suggestions adds 0 to
    `repeats_session` too (its denominator is all pairs, like the others').
  Raises:
    ValueError: the three lists differ in length, or are empty.
    TypeError: a suggestion list or a session is a string (not a list of them), or a
      reference, suggestion or session query is not a string; the message names the entry.
  """
  if not len(suggestions) == len(references) == len(sessions):
    raise ValueError(f'{len(suggestions)} suggestion lists, {len(references)} references and '
                     f'{len(sessions)} sessions: one each per pair')
  if not references:
    raise ValueError('no pairs to score')
  _check_texts('references', references)
  for name, lists in (('suggestions', suggestions), ('sessions', sessions)):
    for i, texts in enumerate(lists):
      if isinstance(texts, str):
        raise TypeError(f'{name}[{i}] must be a list of strings, got the string {texts!r}')
      _check_texts(f'{name}[{i}]', texts)
  ranks, repeats, longest = [], [], 0
  for ranked, reference, session in zip(suggestions, references, sessions):
    ranked = distinct(ranked)[:RANKING_CUTOFF]
    longest = max(longest, len(ranked))
    ranks.append(ranked.index(reference) + 1 if reference in ranked else 0)
    repeats.append(bool(ranked) and ranked[0] in set(session))
  ranks = np.asarray(ranks)
  found = ranks > 0
  percent = lambda x: 100.0 * float(np.mean(x))
  return RankingScore(
      exact_match=percent(ranks == 1), recall_at_5=percent(found & (ranks <= 5)),
      recall_at_10=percent(found), mrr_at_10=percent(np.where(found, 1.0 / np.maximum(
          ranks, 1), 0.0)), repeats_session=percent(repeats), pairs=len(references),
      longest_list=longest)
