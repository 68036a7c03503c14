"""Iterative multi-document neural attention on the generated movie knowledge base.

python -m mtn_jax.main --config=configs/imdna_movies.py --workdir=/tmp/imdna_qa
python -m mtn_jax.main --config=configs/imdna_movies.py:recs --workdir=/tmp/imdna_recs

Variants: '' or 'qa' (factoid questions, HITS@1), 'recs' (recommendations, HITS@100);
'+embeddings' after either trains the supervised-embedding baseline on the same data
('qa+embeddings'); 'test' a tiny QA run for the tests. The slides name the sizes (the state,
T inference steps, K documents, the hidden layer's u units) without giving them: state 128,
T = 3, K = 30 and u = 4,096 are this project's choices.
"""

import ml_collections

from configs import default

_VARIANTS = ('', 'qa', 'recs', 'test')


def get_config(variant: str = ''):
  task, _, reader = variant.partition('+')
  if task not in _VARIANTS or reader not in ('', 'embeddings'):
    raise ValueError(f'configs/imdna_movies.py: unknown variant {variant!r} (known: qa, recs, '
                     'test, each optionally +embeddings)')
  c = default.get_config('imdna')
  c.data.source = 'movies'
  add_movies(c)
  add_task(c)
  c.imdna.task = 'recs' if task == 'recs' else 'qa'
  c.imdna.num_documents = 30  # K
  c.imdna.max_document_words = 24  # a movie's document has at most 21 words
  c.imdna.max_question_words = 16

  c.model.reader = reader or 'attention'
  c.model.emb_dim = 64
  c.model.dropout = 0.1

  apply_training(c)
  c.train.num_epochs = 8
  # The supervised-embedding baseline: 1e-2, chosen on the validation splits against 1e-3,
  # which leaves it undertrained (docs/notes/2026-11-25-imdna.md).
  if reader == 'embeddings':
    c.train.learning_rate = 1e-2

  if task == 'test':
    c.movies.num_movies = 60
    c.movies.num_users = 100
    c.imdna.num_documents = 4
    c.imdna.batch_size = 16
    c.model.emb_dim = 8
    c.model.state_dim = 8
    c.model.inference_steps = 2
    c.model.hidden_units = 16
    c.train.num_epochs = 2
    c.train.log_every_steps = 5
    c.train.checkpoint_every_steps = 10
  return c


def add_movies(c):
  """config.movies: the generated movie knowledge base (config.data.source='movies',
  mtn_jax/data/synthetic/movies.py)."""
  c.movies = ml_collections.ConfigDict()
  c.movies.num_movies = 1000
  c.movies.num_users = 3000  # one recommendation question each
  c.movies.seed = 0


def add_task(c):
  """config.imdna: the IMDNA task (mtn_jax/tasks/multi_answer.py): 'qa' or 'recs' on the movie
  knowledge base, or 'aol' (a session corpus); K documents retrieved by BM25 (k1, b) per
  question; documents and questions cut to these many words; questions per batch."""
  c.imdna = ml_collections.ConfigDict()
  c.imdna.task = 'qa'
  c.imdna.num_documents = 30
  c.imdna.max_document_words = 24
  c.imdna.max_question_words = 16
  c.imdna.batch_size = 32
  c.imdna.bm25_k1 = 1.2
  c.imdna.bm25_b = 0.75


def apply_training(c):
  """IMDNA's optimiser, on movies and on AOL alike: Adam at a constant 1e-3, gradients
  clipped at norm 5, no label smoothing."""
  default.constant_rate(c, 1e-3)
  c.train.adam_b2 = 0.999
  c.train.adam_eps = 1e-8
  c.train.label_smoothing = 0.0
  c.train.grad_clip_norm = 5.0
  c.train.log_every_steps = 50
  c.train.checkpoint_every_steps = 200
