"""IMDNA's evaluation (`--mode=eval` of an IMDNA run).

`evaluate` writes `<workdir>/eval/results.json`: HITS@1/10/100 (a question is a hit when one
of its answers is among the top k), for the model and for BM25 alone (each entity of the
retrieved documents scored by the summed BM25 scores of the documents holding it, the
question's own words left out); on AOL also Recall@k of the next query's words and the
query-level ranking metrics beside the trivial suggesters (`mtn_jax.evaluation.trivial`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import time
from collections.abc import Sequence

import ml_collections
import numpy as np

from mtn_jax import errors
from mtn_jax import files
from mtn_jax import models
from mtn_jax.data import imdna_library
from mtn_jax.data import top_k
from mtn_jax.data.imdna_library import Library
from mtn_jax.data.imdna_library import QuestionSet
from mtn_jax.data.vocab import SPECIAL_TOKENS
from mtn_jax.evaluation import metrics
from mtn_jax.evaluation import trivial
from mtn_jax.inference import imdna_proposer
from mtn_jax.inference import popular

HITS_AT = (1, 10, 100)


def hits_at(ranked: np.ndarray, answers: np.ndarray, ks: Sequence[int] = HITS_AT
            ) -> dict[str, float]:
  """Percent of questions with one of their answers among the first k.

  ranked: int [N, >= max(ks)] candidate ids best first; answers: int [N, M], -1-padded."""
  out = {}
  for k in ks:
    top = ranked[:, :k]
    hit = ((top[:, :, None] == answers[:, None, :]) & (answers[:, None, :] >= 0)).any((1, 2))
    out[f'hits_at_{k}'] = 100.0 * float(hit.mean()) if len(hit) else 0.0
  return out


def recall_at(ranked: np.ndarray, answers: np.ndarray, ks: Sequence[int] = HITS_AT
              ) -> dict[str, float]:
  """Percent of a question's answers among the first k, averaged over questions (a question
  without an answer counts 0)."""
  out = {}
  counts = (answers >= 0).sum(1)
  for k in ks:
    top = ranked[:, :k]
    found = ((answers[:, :, None] == top[:, None, :]).any(2) & (answers >= 0)).sum(1)
    out[f'recall_at_{k}'] = 100.0 * float(np.mean(found / np.maximum(counts, 1)))
  return out


def bm25_answer_scores(library: Library, questions: QuestionSet,
                       exclude_question_words: bool) -> np.ndarray:
  """BM25 alone: float32 [N, A], each candidate scored by the summed BM25 scores of the
  retrieved documents holding it; special tokens, and with `exclude_question_words` the
  question's own words (a movie question's entity is never its answer), score -1."""
  word_to_answer = np.full(len(library.vocab), -1, np.int64)
  word_to_answer[library.answer_words] = np.arange(len(library.answers))
  scores = np.zeros((len(questions), len(library.answers)), np.float32)
  special = word_to_answer[:len(SPECIAL_TOKENS)]
  scores[:, special[special >= 0]] = -1.0
  word_to_answer[:len(SPECIAL_TOKENS)] = -1
  for i in range(len(questions)):
    for doc, score in zip(questions.documents[i], questions.document_scores[i]):
      if doc < 0:
        continue
      words = np.unique(library.document_tokens[doc])
      found = word_to_answer[words]
      scores[i, found[found >= 0]] += score
    if exclude_question_words:
      own = word_to_answer[questions.question[i]]
      scores[i, own[own >= 0]] = -1.0
  return scores


def evaluate(trained, config: ml_collections.ConfigDict, workdir: str, prefix: str) -> dict:
  """Scores the best checkpoint and BM25 alone on `config.decode.eval_split` (its first
  `config.decode.max_eval_sessions` questions where that is set); writes
  `<workdir>/eval/<prefix>results.json` (`evaluate.results_prefix`) and returns its dict."""
  started = time.time()
  workdir = os.path.abspath(workdir)
  library = imdna_library.load_library(config, workdir)
  if library.vocab.fingerprint != trained.vocab.fingerprint:
    raise errors.Error(f'the checkpoint in {workdir} was trained on other data (vocabulary '
                       f'{trained.vocab.fingerprint}, this data {library.vocab.fingerprint})')
  split = config.decode.eval_split
  questions = library.splits[split]
  task_name, cfg = config.imdna.task, trained.cfg
  total = len(questions)
  if 0 < config.decode.max_eval_sessions < total:
    questions = first_questions(questions, config.decode.max_eval_sessions)
  which = (f'the first {len(questions):,} of {total:,}' if len(questions) < total
           else f'{total:,}')
  print(f'Evaluating IMDNA ({cfg.reader}, checkpoint step {trained.step}) on {which} {split} '
        f'questions ({task_name}).', flush=True)
  depth = max(HITS_AT)
  scores = {'model': trained.task.answer_scores(trained.params, library, questions,
                                                   config.imdna.batch_size),
            'bm25': bm25_answer_scores(library, questions,
                                       exclude_question_words=task_name != 'aol')}
  ranked = {name: top_k.best_first_rows(s, depth) for name, s in scores.items()}
  figures = {name: hits_at(r, questions.answers) for name, r in ranked.items()}
  if task_name == 'aol':
    for name, r in ranked.items():
      figures[name].update(recall_at(r, questions.answers))
  results = {'model': cfg.name, 'reader': cfg.reader, 'task': task_name,
             'model_config': trained.meta['model'], 'step': trained.step,
             'num_params': models.count_params(trained.params), 'split': split,
             'questions': len(questions), 'split_questions': total,
             'documents': len(library.documents),
             'num_documents': config.imdna.num_documents,
             'candidate_answers': len(library.answers), 'answers': figures}
  for name, entry in figures.items():
    print(f'  {name:<6} ' + ', '.join(f'{k.replace("_", " ")} {v:.1f}'
                                     for k, v in entry.items()))
  if task_name == 'aol':
    results['queries'] = _aol_query_figures(library, questions, split, scores['model'])
    for name, entry in results['queries'].items():
      print(f'  next query, {name}: ' + ', '.join(f'{k.replace("_", " ")} {v:.2f}'
                                                  for k, v in entry.items() if k != 'pairs'))
  results.update(wall_seconds=time.time() - started,
                 date=datetime.datetime.now(datetime.timezone.utc).isoformat(
                     timespec='seconds'))
  samples = []
  for i in range(min(20, len(questions))):
    samples.append({'question': questions.texts[i], 'answers': questions.answer_texts[i],
                    'predicted': [library.answers[a] for a in ranked['model'][i, :5]],
                    'bm25': [library.answers[a] for a in ranked['bm25'][i, :5]]})
  eval_dir = os.path.join(workdir, 'eval')
  os.makedirs(eval_dir, exist_ok=True)
  for name, text in ((f'{prefix}results.json', json.dumps(results, indent=2) + '\n'),
                     (f'{prefix}samples.jsonl',
                      ''.join(json.dumps(s) + '\n' for s in samples))):
    files.write_text(os.path.join(eval_dir, name), text)
  print(f'Results: {os.path.join(eval_dir, prefix + "results.json")}', flush=True)
  return results


def first_questions(questions: QuestionSet, n: int) -> QuestionSet:
  """The first `n` questions of a split, every field cut alike (the AOL contexts of
  `Library.extra` are row for row with them: `_aol_query_figures` reads their first `n`)."""
  return dataclasses.replace(questions, **{f.name: getattr(questions, f.name)[:n]
                                           for f in dataclasses.fields(questions)})


def _aol_query_figures(library: Library, questions: QuestionSet, split: str,
                       model_scores: np.ndarray) -> dict:
  """Next-query ranking (`metrics.suggestion_ranking`) of the model's candidate queries, of
  the same candidates in BM25's order, and of the trivial suggesters."""
  contexts = library.extra[split]['contexts'][:len(questions)]  # the first N, where cut
  references = questions.answer_texts
  candidates = [imdna_library.following_queries(library, questions, i, contexts[i])
                for i in range(len(questions))]
  previous = [c[-1] for c in contexts]
  suggestions = {
      'model': [imdna_proposer.by_word_probability(c, model_scores[i], library.vocab)
                for i, c in enumerate(candidates)],
      'bm25': candidates,
      'repeat_previous': [[p] for p in previous],
      'most_frequent_next': trivial.most_frequent_next_lists(
          popular.LogCounts(library.extra['train_split']), previous)}
  return {name: metrics.suggestion_ranking(s, references, contexts).to_dict()
          for name, s in suggestions.items()}
