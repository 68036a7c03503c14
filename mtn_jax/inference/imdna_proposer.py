"""IMDNA on AOL as a source of candidate next queries for the suggestion pipeline."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import ml_collections
import numpy as np

from mtn_jax import errors
from mtn_jax.data import imdna_library
from mtn_jax.data.imdna_library import QuestionSet
from mtn_jax.data.vocab import PAD_ID
from mtn_jax.data.vocab import UNK_ID
from mtn_jax.data.vocab import Vocab


class NextQueryProposer:
  """IMDNA on AOL as a source of candidate next queries for the 'rerank' strategy
  (`config.suggest.imdna_workdir`, `mtn_jax.inference.pipeline`): for a session prefix, the queries
  that follow in the K training sessions BM25 finds most like it (`following_queries`),
  ranked by the model's word probabilities -- what its own evaluation ranks. It hands over
  texts, so its vocabulary need not be the generator's; its sessions must be
  (the pipeline checks)."""

  def __init__(self, trained, workdir: str):
    """`trained`: the IMDNA run of `workdir` (`inference.load_trained`)."""
    self.config = ml_collections.ConfigDict(trained.meta['config'])
    if self.config.get('imdna', {}).get('task') != 'aol':
      raise errors.Error(f'{workdir} holds an IMDNA run on '
                         f'{self.config.get("imdna", {}).get("task")!r}: the candidate next '
                         'queries come from a run of configs/imdna_aol.py')
    self.trained, self.workdir = trained, os.path.abspath(workdir)
    self.library = imdna_library.load_library(self.config, workdir)

  def propose(self, contexts: Sequence[Sequence[str]], k: int,
              users: Sequence[Any] | None = None) -> list[list[str]]:
    """[N] the k best candidate next queries after each context (its queries so far); with
    `users` (each context's user), a user's own training sessions are never read, as in
    training."""
    settings, library = self.config.imdna, self.library
    if not contexts:
      return []
    exclude = None
    if users is not None:
      document_users, users = library.extra['document_users'], np.asarray(users)
      exclude = lambda i, found: document_users[found] == users[i]
    ids, scores = library.extra['index'].top_k([' '.join(c) for c in contexts],
                                               settings.num_documents, exclude)
    texts = [imdna_library.session_text(c) for c in contexts]
    questions = QuestionSet(
        question=imdna_library.pad_rows([imdna_library.session_ids(library.vocab, c)
                                         for c in contexts],
                           settings.max_question_words, PAD_ID, keep='last'),
        documents=ids, document_scores=scores,
        answers=np.full((len(contexts), 1), -1, np.int32), texts=texts,
        answer_texts=[''] * len(contexts))
    probabilities = self.trained.task.answer_scores(self.trained.params, library, questions,
                                                    settings.batch_size)
    return [by_word_probability(imdna_library.following_queries(library, questions, i, c),
                                probabilities[i], library.vocab)[:k]
            for i, c in enumerate(contexts)]


def by_word_probability(candidates: Sequence[str], word_probabilities: np.ndarray,
                  vocab: Vocab) -> list[str]:
  """Candidates ranked by the mean probability of their known words."""
  def score(query):
    ids = [w for w in vocab.encode_text(query) if w != UNK_ID]
    return float(np.mean(word_probabilities[ids])) if ids else 0.0
  return sorted(candidates, key=lambda q: -score(q))
