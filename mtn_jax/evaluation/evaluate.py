"""Evaluation of the best checkpoint on one split: n-gram precision, BLEU and the ranking
figures (`--mode=eval`).

In:  `<workdir>/checkpoints` (the best checkpoint's params only) and `<workdir>/data` (the
     split `config.decode.eval_split`, test by default, and the train split for the trivial
     suggesters).
Out: `<workdir>/eval/<prefix>results.json`, `<prefix>samples.jsonl` and `<prefix>lists.jsonl`,
     and the figures printed. The prefix (`results_prefix`) names the split and strategy
     where they are not the test split and 'generate': `valid_` for the validation split (for
     tuning decoding settings without touching the test split), `learned_`,
     `valid_learned_`, ..., and `first<N>_` after them for an evaluation of the split's first
     N sessions alone (`config.decode.max_eval_sessions`); the report reads the files the
     config names.
`evaluate` runs four steps: the lists (`decode_lists`), their scores (`scores`), the files
(`write_results`), the printed figures (`print_results`).

Every (session prefix -> next query) pair of the split gets the suggestion pipeline's list
(`config.suggest.strategy`; 'generate' is the model's own beam search, `config.decode`). Each
batch of sessions `queries` int32 [batch, queries, tokens] goes through the model once without
its last query (the contexts of positions 0..S-2 do not depend on it), and all S-1 positions
of every session are searched in parallel. Suggestions are the hypotheses' words joined by
spaces (an emitted `<unk>` stays `<unk>`); references are the raw next-query texts of the log
(`SessionSplit.texts`), never mapped through the vocabulary (mtn_jax/evaluation/metrics.py).
For context the same metrics are given for four suggesters that learn nothing from sessions
(`mtn_jax.evaluation.trivial`): the previous query repeated; the most frequent next query in
the training split after the same previous query (by raw text; the previous query repeated
when it never occurs there); the training split's most popular next queries (MPC); the
previous query's most frequent followers, then MPC. Under a strategy that pools sources, each
source's own list is scored too.

results.json: model name and architecture, size (MB at fp32) and parameter count, checkpoint
step, number of sessions and pairs, decode settings, `scores` ({'model', the sources' names
under a pooling strategy, 'repeat_previous', 'most_frequent_next', 'most_popular',
'most_cooccurring'} -> BLEU of the top suggestion, precisions, brevity penalty, lengths, the
printed `line`, and under 'ranking' exact match at 1, Recall@5/@10, MRR@10 over the distinct
suggestions and the share of top suggestions that repeat a session query: `metrics`), the
same under `scores_excluding_session` for the user-facing protocol that drops every
suggestion repeating a query of the session (and any empty one), wall time and suggestions per second. The
trivial suggesters' lists: `mtn_jax.evaluation.trivial`. samples.jsonl: a seeded sample of
pairs, one JSON object a line with the context queries, the predicted and the actual next
query and the top suggestions with their scores, for the report's sample tables.
lists.jsonl: every pair's scored lists, exactly what `--mode=decode` writes for the same
context and settings under each protocol: {"session", "position", "context", "reference",
"suggestions": [...], "suggestions_excluding_session": [...]}.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import hashlib
import json
import os
import time
from collections.abc import Sequence

import jax
import ml_collections
import numpy as np

from mtn_jax import errors
from mtn_jax import files
from mtn_jax import inference
from mtn_jax import models
from mtn_jax import tasks
from mtn_jax.data import preprocess
from mtn_jax.data import sessions
from mtn_jax.data.vocab import UNK_ID
from mtn_jax.decoding import search
from mtn_jax.evaluation import answer_hits
from mtn_jax.evaluation import metrics
from mtn_jax.evaluation import pool_ranking
from mtn_jax.evaluation import trivial
from mtn_jax.inference import habits
from mtn_jax.inference import learned
from mtn_jax.inference import pipeline
from mtn_jax.inference import sources as inference_sources
NUM_SAMPLES = 50


# ---------------------------------------------------------------------------------------------
# Scores


def score_entry(score: metrics.BleuScore, ranking: metrics.RankingScore | None = None
                ) -> dict:
  """A suggester's entry in results.json: BLEU of its top suggestions, the printed `line`,
  and its ranking metrics under 'ranking'."""
  entry = {**score.to_dict(), 'line': str(score)}
  if ranking is not None:
    entry['ranking'] = ranking.to_dict()
  return entry


def ranking_line(ranking: dict) -> str:
  """'EM@1 3.1, R@5 9.0, R@10 12.4, MRR@10 5.2, repeats 41.0' (percent). A recall whose rank
  no list reaches (`metrics.RankingScore.reaches`: 5 suggestions, R@10) is not given: it
  would only repeat the one before."""
  recalls = ', '.join(
      f'R@{k} {ranking[f"recall_at_{k}"]:.1f}' if metrics.RankingScore.reaches(ranking, k)
      else f'R@{k} n/a (lists of {ranking["longest_list"]})' for k in (5, 10))
  return (f'EM@1 {ranking["exact_match"]:.1f}, {recalls}, MRR@10 {ranking["mrr_at_10"]:.1f}, '
          f'repeats session {ranking["repeats_session"]:.1f}')


def score_suggesters(suggestions: dict[str, list[list[str]]], references: Sequence[str],
                     contexts: Sequence[Sequence[str]], *, exclude_session: bool
                     ) -> dict[str, dict]:
  """{suggester: `score_entry`} of each suggester's ranked lists [pairs][k].

  With `exclude_session`, the user-facing protocol: every suggestion that repeats a query of
  the session so far, or is empty, is dropped before scoring (the top is then the first
  kept: `metrics.without_session_queries`).
  """
  entries = {}
  for name, ranked in suggestions.items():
    if exclude_session:
      ranked = [metrics.without_session_queries(r, c) for r, c in zip(ranked, contexts)]
    top = [r[0] if r else '' for r in ranked]
    entries[name] = score_entry(metrics.bleu(top, references),
                                metrics.suggestion_ranking(ranked, references, contexts))
  return entries


# ---------------------------------------------------------------------------------------------
# Decoding the test split


def prefix_split(split: sessions.SessionSplit, num_sessions: int) -> sessions.SessionSplit:
  """The first `num_sessions` sessions of `split`."""
  return sessions.select_sessions(split, np.arange(num_sessions))


def strategy_record(pipe: pipeline.Pipeline) -> dict:
  """results.json's 'strategy': the settings of 'retrieve', 'rerank' or 'blend' and its
  label."""
  s, dc = pipe.settings, pipe.settings.search
  label_of = lambda trained: models.spec(trained.cfg.name).label(trained.meta['model'])
  if pipe.learned_ranker is not None:
    plan = learned.plan_text(pipe.learned_ranker.sources)
    return {'strategy': 'learned', 'sources': plan,
            'session_first': s.session_first, 'unrelated_first': s.unrelated_first,
            'attested_only': s.attested_only,
            'ranker': {**{k: pipe.learned_ranker.meta[k] for k in ('checkpoint_step', 'folds',
                                                          'rounds', 'groups', 'importance')},
                       # the search its candidates were made with, not config.decode's
                       'search': pipe.learned_ranker.candidate_search(dc).to_dict()},
            'label': f'{label_of(pipe.trained)}, {len(pipe.learned_ranker.sources)} sources by the '
                     'learned ranker'}
  if s.strategy == 'blend':
    plan = ','.join(f'{name}:{n}' for name, n in s.blend)
    return {'strategy': s.strategy, 'blend': plan,
            'label': f'{label_of(pipe.trained)} beam {dc.beam_size} blended, {plan}'}
  if s.strategy == 'retrieve':
    label = f'{label_of(pipe.suggester)} pool entries'
  else:
    label = f'{label_of(pipe.trained)} beam {dc.beam_size}'
    if pipe.retriever is not None:
      label += f' + {label_of(pipe.retriever.trained)} top {s.retrieved}'
    if pipe.proposer is not None:
      label += f' + IMDNA top {s.imdna_proposed}'
    if s.popular:
      label += f' + the {s.popular} most popular'
    if s.cooccurring:
      label += f' + the {s.cooccurring} most co-occurring'
    label += f' + session queries, scored by {label_of(pipe.rankers.ranker)}'
    if s.mbr:
      label += ', ordered by expected BLEU'
    if s.habit_rate:
      label += (f', the user\'s habit query first at a rate >= {s.habit_rate:g} over >= '
                f'{s.habit_min_past} past queries')
  return {'strategy': s.strategy, 'label': label,
          'ranker_workdir': os.path.abspath(s.ranker_workdir),
          'retriever_workdir': pipe.retriever.workdir if pipe.retriever is not None else None,
          'retrieved': s.retrieved if pipe.retriever is not None else 0,
          'imdna_workdir': pipe.proposer.workdir if pipe.proposer is not None else None,
          'popular': s.popular, 'cooccurring': s.cooccurring,
          'mbr': bool(s.mbr), 'habit_rate': float(s.habit_rate),
          'habit_min_past': int(s.habit_min_past)}


# ---------------------------------------------------------------------------------------------
# The mode


def _load_split(data_dir: str, name: str) -> sessions.SessionSplit:
  try:
    return sessions.load_split(data_dir, name)
  except FileNotFoundError as e:
    raise errors.Error(str(e)) from None


def _device_description() -> str:
  kinds = collections.Counter(d.device_kind for d in jax.devices())
  return ', '.join(f'{count} x {kind}' for kind, count in kinds.items())


def evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Evaluates the best checkpoint of `workdir` on `config.decode.eval_split`: its lists,
  their scores, printed, then written.

  Returns the dict written to results.json (valid_results.json for the validation split).
  """
  started = time.time()
  workdir = os.path.abspath(workdir)
  is_writer = jax.process_index() == 0
  log = print if is_writer else (lambda *a, **k: None)
  if is_writer and (problem := files.cannot_write_in(os.path.join(workdir, 'eval'))):
    raise errors.Error(f'evaluation writes its results in {workdir}/eval: {problem}')
  trained = inference.load_trained(config, workdir)
  if isinstance(trained.task, tasks.BringsOwnData):  # its own data and measures
    return answer_hits.evaluate(trained, config, workdir, results_prefix(config))
  data_dir = preprocess.data_dir(workdir)
  test, total_sessions = split_to_evaluate(config, data_dir, log)
  train = _load_split(data_dir, 'train')
  pairs = Pairs.of(test)
  lists = decode_lists(config, workdir, trained, test, pairs, log)
  results = scores(config, workdir, trained, test, train, pairs, lists,
                   total_sessions=total_sessions, started=started)
  # Written before they are printed: the decoded lists are kept whatever printing meets.
  path = (write_results(workdir, results, lists, pairs, prefix=results_prefix(config),
                        seed=config.seed) if is_writer else None)
  print_results(results, lists, log)
  if path:
    print(f'Results: {path}', flush=True)
  return results


@dataclasses.dataclass(frozen=True)
class Pairs:
  """Every (prefix -> next query) pair of a split, in pair order.

  Attributes:
    session, position: int64 [pairs] (`SessionSplit.pair_positions`).
    contexts: [pairs] the queries up to the pair's position; previous: [pairs] the last of
      them; references: [pairs] the next query (raw texts).
  """

  session: np.ndarray
  position: np.ndarray
  contexts: list[list[str]]
  previous: list[str]
  references: list[str]

  @classmethod
  def of(cls, split: sessions.SessionSplit) -> Pairs:
    previous, references = split.pair_texts()
    session, position = split.pair_positions()
    contexts = [split.session_texts(i)[:t + 1]
                for i, t in zip(session.tolist(), position.tolist())]
    return cls(session, position, contexts, previous, references)


@dataclasses.dataclass
class Lists:
  """What decoding a split gave (`decode_lists`).

  Attributes:
    shown: {exclude_session_queries: [pairs] the suggestions shown under that protocol}.
    sources: {source: [pairs] its candidates' texts} scored beside the strategy.
    pool: the ranker's ranking of the whole pool, where there is one (its figures).
    extra: results.json's entries of the strategy ('pool', 'strategy').
    label: the model (or strategy) as the printed scores name it.
    seconds: the time decoding took.
  """

  shown: dict[bool, list[list[dict]]]
  sources: dict[str, list[list[str]]]
  pool: pool_ranking.SplitRanking | None
  extra: dict
  label: str
  seconds: float


def split_to_evaluate(config: ml_collections.ConfigDict, data_dir: str, log
                      ) -> tuple[sessions.SessionSplit, int]:
  """(the sessions of `config.decode.eval_split` to evaluate, the split's sessions in all)."""
  split_name = config.decode.eval_split
  test = _load_split(data_dir, split_name)
  total_sessions = test.num_sessions
  limit = config.decode.max_eval_sessions
  if 0 < limit < total_sessions:
    test = prefix_split(test, limit)
    log(f'Evaluating the first {limit:,} of {total_sessions:,} {split_name} sessions only '
        '(config.decode.max_eval_sessions).')
  if test.num_pairs == 0:
    fraction = {'valid': 1, 'test': 2}[split_name]
    raise errors.Error(f'the {split_name} split in {data_dir} has no (prefix -> next query) '
                       'pairs to evaluate: more data, or a larger '
                       f'config.data.split_fractions[{fraction}]')
  return test, total_sessions


def ranked_pool(pipe: pipeline.Pipeline, split: sessions.SessionSplit,
                config: ml_collections.ConfigDict, queries_per_batch: int, log
                ) -> pool_ranking.SplitRanking | None:
  """Where `pipe` retrieves: the exact ranking of the whole pool for every pair of `split`
  (its best `pipe.pool_depth()` entries for the pipeline, its ranks for the figures)."""
  if pipe.retriever is None:
    return None
  return pool_ranking.rank_split(pipe.retriever.trained, split, pipe.retriever.workdir,
                                 k=pipe.pool_depth(), seed=config.seed,
                                 queries_per_batch=queries_per_batch, log=log)


def decode_lists(config: ml_collections.ConfigDict, workdir: str, trained: inference.Trained,
                 test: sessions.SessionSplit, pairs: Pairs, log) -> Lists:
  """Every pair's suggestions under both protocols, as decode and suggest show them, and the
  sources' lists beside them."""
  dc, strategy = config.decode, config.suggest.strategy
  name = models.spec(trained.cfg.name).label(trained.meta['model'])

  def say_what(beam_size: int | None, sources: str = '', sampled: bool = False) -> None:
    """The header: how the model suggests (`beam_size`: its beam; None: it ranks the pool;
    `sampled`: it scores the next query against sampled pool entries and suggests nothing;
    `sources`: the learned ranker's plan, named once here rather than on each figures line)."""
    how = ('the next query scored against sampled pool entries (it makes no suggestions)'
           if sampled else 'ranking the candidate pool' if beam_size is None else
           f'beam {beam_size}, length penalty {dc.length_penalty}, at most {dc.max_len} '
           f'tokens{", <unk> allowed" if dc.emit_unk else ""}')
    if sources:
      how += f'; the learned ranker over {sources}'
    log(f'Evaluating {name} (checkpoint step {trained.step}) on {test.num_pairs:,} '
        f'{config.decode.eval_split} pairs of {test.num_sessions:,} sessions: {how}.',
        flush=True)

  started = time.time()
  extra = {}
  queries_per_batch = dc.batch_sessions * config.data.max_session_queries
  pool = None
  if (strategy == 'generate' and not isinstance(trained.task, tasks.Suggests)
      and not isinstance(trained.task, tasks.ScoresPool)):
    # A Cross-encoder cannot score the whole pool: the sampled protocols alone; it suggests
    # only by reranking (config.suggest.strategy='rerank'). It encodes each query's sampled
    # candidates with its session, so a batch holds as many queries as a generator's batch
    # holds sessions, not their queries.
    say_what(None, sampled=True)
    pool = pool_ranking.rank_sampled(trained, test, workdir, seed=config.seed,
                                     queries_per_batch=dc.batch_sessions, log=log)
    extra['pool'] = pool.figures()
    shown = {False: [[] for _ in pairs.contexts], True: [[] for _ in pairs.contexts]}
    sources = {}
  else:
    suggestions_of = pipeline.Pipeline.load(config, workdir, log=log, trained=trained)
    say_what(suggestions_of.beam_size if isinstance(trained.task, tasks.Suggests) else None,
             '' if suggestions_of.learned_ranker is None
             else learned.plan_text(suggestions_of.learned_ranker.sources))

    pool = ranked_pool(suggestions_of, test, config, queries_per_batch, log)
    retrieved = None if pool is None else (pool.suggestions, pool.top_scores)
    # Each session's user's latest earlier queries that the pipeline reads (the habit rule, the
    # sources of the past, a personalising model: the corpus's history, as training's).
    histories = (habits.past_queries(preprocess.data_dir(workdir), test,
                                     keep=suggestions_of.past_read)
                 if suggestions_of.past_read else None)
    lists = suggestions_of.split_lists(test, queries_per_batch=queries_per_batch,
                                       retrieved=retrieved, histories=histories, log=log)
    # Both protocols from the same ordered lists, shown as decode and suggest show them.
    shown = {exclude: [suggestions_of.show(ranked, context, exclude, dc.top_k)
                       for ranked, context in zip(lists.ordered, pairs.contexts)]
             for exclude in (False, True)}
    sources = lists.sources
    if suggestions_of.rankers is None and pool is not None:
      extra['pool'] = pool.figures()
    if strategy != 'generate':
      extra['strategy'] = strategy_record(suggestions_of)
      # The strategy that suggested: 'learned' in a workdir without a ranker is the blend.
      name = f'{extra["strategy"]["strategy"]}: {extra["strategy"]["label"]}'
  return Lists(shown, sources, pool, extra, name, time.time() - started)


def scores(config: ml_collections.ConfigDict, workdir: str, trained: inference.Trained,
           test: sessions.SessionSplit, train: sessions.SessionSplit, pairs: Pairs,
           lists: Lists, *, total_sessions: int, started: float) -> dict:
  """results.json: the model's, the sources' and the trivial suggesters' scores under both
  protocols, and what the run was (`total_sessions` in the split, `started` at this time)."""
  top_k = config.decode.top_k
  texts = lambda ranked_lists: [[c['query'] for c in ranked] for ranked in ranked_lists]
  model_suggestions = texts(lists.shown[False])
  suggestions = {'model': model_suggestions}
  user_facing = {'model': texts(lists.shown[True])}
  for source, source_lists in lists.sources.items():
    as_shown = lambda exclude: [
        [c['query'] for c in pipeline.show([{'query': q} for q in ranked], context, exclude,
                                           top_k)]
        for ranked, context in zip(source_lists, pairs.contexts)]
    suggestions[source], user_facing[source] = as_shown(False), as_shown(True)
  suggestions.update(trivial.lists(train, pairs.previous, pairs.contexts))
  if not any(model_suggestions):  # a Cross-encoder's own evaluation: no suggestions
    del suggestions['model']
  protocols = {'scores': score_suggesters(suggestions, pairs.references, pairs.contexts,
                                          exclude_session=False),
               'scores_excluding_session': score_suggesters(
                   {**suggestions, **user_facing}, pairs.references, pairs.contexts,
                   exclude_session=True)}
  extra = dict(lists.extra)
  if test.history is not None and test.history.shape[1]:
    ranked = lists.pool if not isinstance(trained.task, tasks.Suggests) else None
    extra['by_history'] = history_groups(test, suggestions, pairs.references, pairs.contexts,
                                         ranked)
  # Both protocols are scored from the full lists, whatever decode and suggest are told.
  settings = dataclasses.replace(search.SearchSettings.from_config(config.decode),
                                 exclude_session_queries=False)
  return {
      'model': trained.cfg.name,
      'label': models.spec(trained.cfg.name).label(trained.meta['model']),
      'model_config': trained.meta['model'],
      'num_params': models.count_params(trained.params),
      'size_mb': models.size_mb(trained.params),
      'step': trained.step,
      'workdir': workdir,
      'split': config.decode.eval_split,
      'sessions': test.num_sessions,
      'sessions_total': total_sessions,
      'pairs': test.num_pairs,
      'split_digest': split_digest(test),
      'decode': settings.to_dict(),
      # The paper's protocol; then the user-facing one, which never suggests a query the
      # session already holds.
      **protocols,
      **extra,
      'decode_seconds': lists.seconds,
      'suggestions_per_s': test.num_pairs / max(lists.seconds, 1e-9),
      'wall_seconds': time.time() - started,
      'devices': _device_description(),
      'date': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
  }


def print_results(results: dict, lists: Lists, log) -> None:
  """The run's figures, one line a suggester under each protocol."""
  # A model that suggests nothing (a Cross-encoder) scored the pairs instead.
  made = 'suggestions' if 'model' in results['scores'] else 'pairs scored'
  log(f'{results["pairs"]:,} {made} in {results["decode_seconds"]:.1f} s '
      f'({results["suggestions_per_s"]:.1f}/s on {results["devices"]}).')
  log(f'Model size: {results["size_mb"]:.2f} MB (fp32), {results["num_params"]:,} parameters.')
  # The strategy's sources in the order scored, then the trivial suggesters.
  labels = {'model': lists.label} if 'model' in results['scores'] else {}
  source_labels = (inference_sources.LABELS | pipeline.BLEND_LABELS
                   if results.get('strategy', {}).get('strategy') == 'blend'
                   else inference_sources.LABELS)
  labels |= {key: source_labels[key] for key in results['scores']
             if key != 'model' and key not in trivial.SUGGESTERS}
  labels |= {key: label for key, label in trivial.SUGGESTERS.items() if key in results['scores']}
  width = max(len(n) for n in labels.values())
  for protocol, heading in (('scores', 'All suggestions'),
                            ('scores_excluding_session',
                             'Never suggesting a query of the session')):
    log(f'{heading}:')
    for key, label in labels.items():
      entry = results[protocol][key]
      log(f'  {label:<{width}}  {entry["line"]}; {ranking_line(entry["ranking"])}')
  if 'pool' in results:
    over = 'Over the whole pool' if 'mrr' in results['pool'] else 'Against sampled pool entries'
    log(f'{over}: {pool_line(results["pool"])}')
  for group, figures in results.get('by_history', {}).items():
    if not figures['pairs']:
      log(f'  {group.replace("_", " ")}: no pairs')
      continue
    line = ranking_line(figures['scores']['model']['ranking'])
    if 'pool' in figures:
      line += '; ' + pool_line(figures['pool'])
    if 'zero_weight' in figures:
      line += '; ' + ', '.join(f'zero-vector weight {v:.3f} ({k.replace("_", " ")})'
                               for k, v in figures['zero_weight'].items())
    log(f'  {group.replace("_", " ")} ({figures["pairs"]:,} pairs): {line}')


def results_prefix(config: ml_collections.ConfigDict) -> str:
  """The prefix of the eval/ files of `config.decode.eval_split` under
  `config.suggest.strategy`: '' for the test split and 'generate' (the paper's), 'valid_',
  'learned_', 'valid_learned_', ... otherwise; then 'first<N>_' where
  `config.decode.max_eval_sessions` = N limits the evaluation, so that a quick look at a few
  sessions never replaces the whole split's files."""
  split, strategy = config.decode.eval_split, config.suggest.strategy
  limit = config.decode.max_eval_sessions
  return (('' if split == 'test' else f'{split}_')
          + ('' if strategy == 'generate' else f'{strategy}_')
          + (f'first{limit}_' if limit else ''))


def split_digest(split) -> str:
  """SHA-256 of a split's sessions as evaluated (their query texts and bounds): runs whose
  digests differ were scored on other pairs (`report` says so); runs with other training
  users but the same test split share it."""
  return hashlib.sha256(json.dumps([list(split.texts), split.starts.tolist()]).encode()
                        ).hexdigest()


def write_results(workdir: str, results: dict, lists: Lists, pairs: Pairs, *, prefix: str,
                  seed: int) -> str:
  """`<workdir>/eval/`: results.json, every pair's lists (lists.jsonl) and a seeded sample of
  pairs (samples.jsonl), their names after `prefix` (`results_prefix`); returns results.json's
  path."""
  eval_dir = os.path.join(workdir, 'eval')
  os.makedirs(eval_dir, exist_ok=True)
  rng = np.random.default_rng(seed)
  num_pairs = len(pairs.contexts)
  sample_pairs = np.sort(rng.choice(num_pairs, min(NUM_SAMPLES, num_pairs), replace=False))
  samples = []
  for pair in sample_pairs.tolist():
    ranked = [c['query'] for c in lists.shown[False][pair]]
    samples.append({'session': int(pairs.session[pair]), 'position': int(pairs.position[pair]),
                    'context': pairs.contexts[pair], 'predicted': ranked[0] if ranked else '',
                    'actual': pairs.references[pair], 'suggestions': lists.shown[False][pair]})
  with files.atomic_open(os.path.join(eval_dir, f'{prefix}lists.jsonl')) as f:
    for pair, context in enumerate(pairs.contexts):
      f.write(json.dumps({'session': int(pairs.session[pair]),
                          'position': int(pairs.position[pair]), 'context': context,
                          'reference': pairs.references[pair],
                          'suggestions': lists.shown[False][pair],
                          'suggestions_excluding_session': lists.shown[True][pair]},
                         ensure_ascii=False) + '\n')
  files.write_text(os.path.join(eval_dir, f'{prefix}samples.jsonl'),
                    ''.join(json.dumps(s, ensure_ascii=False) + '\n' for s in samples))
  results_path = os.path.join(eval_dir, f'{prefix}results.json')
  files.write_text(results_path, json.dumps(results, indent=2, ensure_ascii=False) + '\n')
  return results_path


def pool_line(figures: dict) -> str:
  """'MRR 5.1, R@10 12.0, R@1/20 40.2, R@1/100 21.0 (700 of 734 next queries in the pool)'."""
  parts = ([f'MRR {figures["mrr"]:.1f}', f'R@10 {figures["recall_at_10"]:.1f}']
           if 'mrr' in figures else [])
  parts += [f'R@1/{n} {figures[f"r1_of_{n}"]:.1f}' for n in pool_ranking.SAMPLED_PROTOCOLS
            if f'r1_of_{n}' in figures]
  return (', '.join(parts) + f' ({figures["pairs_in_pool"]:,} of {figures["pairs"]:,} next '
          'queries in the pool)')


# Users with at least this many earlier queries form the "with history" group.
MIN_HISTORY = 5


def history_groups(split: sessions.SessionSplit, suggestions: dict[str, list[list[str]]],
                   references: Sequence[str], contexts: Sequence[Sequence[str]],
                   ranked: pool_ranking.SplitRanking | None) -> dict[str, dict]:
  """The figures of pairs whose user has at least `MIN_HISTORY` earlier queries (or the
  history's whole width, where `config.data.history_queries` keeps fewer), of those with
  fewer, and of pairs whose user has none (`split.history`), for every suggester; for
  a ranker the pool figures too, and for a model with a zero-vector memory the mean weight
  on the zero vector, apart for next queries that share a word with the user's history and
  those that do not."""
  session, position = split.pair_positions()
  history = np.asarray(split.history)  # [S, M, n]
  lengths = (history != 0).any(-1).sum(-1)[session]
  full = min(MIN_HISTORY, history.shape[1])  # a history kept shorter is whole at its width
  rows = split.starts[session] + position + 1
  next_words = np.asarray(split.queries[rows])  # [pairs, n]
  history_words = history[session].reshape(len(session), -1)  # [pairs, M*n]
  shares_word = np.array([bool(np.intersect1d(w[w > UNK_ID], h[h > UNK_ID]).size)
                          for w, h in zip(next_words, history_words)], bool)
  groups = {}
  for name, selected in (('with_history', lengths >= full),
                         ('short_history', (lengths > 0) & (lengths < full)),
                         ('without_history', lengths == 0)):
    pairs = np.flatnonzero(selected)
    group = {'pairs': int(len(pairs))}
    if len(pairs):
      group['scores'] = score_suggesters(
          {k: [v[i] for i in pairs] for k, v in suggestions.items()},
          [references[i] for i in pairs], [contexts[i] for i in pairs],
          exclude_session=False)
      if ranked is not None:
        group['pool'] = ranked.figures(pairs)
        weights = ranked.zero_weight[pairs]
        if np.isfinite(weights).all() and name == 'with_history':
          shares = shares_word[pairs]
          group['zero_weight'] = {
              'all': float(weights.mean()),
              **({'next_query_shares_a_word': float(weights[shares].mean())}
                 if shares.any() else {}),
              **({'next_query_shares_no_word': float(weights[~shares].mean())}
                 if (~shares).any() else {})}
    groups[name] = group
  return groups
