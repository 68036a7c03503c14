"""Iterative multi-document neural attention on AOL sessions: the next query's words.

python -m mtn_jax.main --config=configs/imdna_aol.py \
    --config.data.raw_files=../shared/data/aol-sample/aol-500users.tsv.gz --workdir=/tmp/aol/imdna

The question is the session so far; its documents are the K training sessions of other
users BM25 finds most like it; the answers are the words of the logged next query, and the
candidate next queries are those that follow in the retrieved sessions
(`mtn_jax.tasks.multi_answer`). The corpus settings are `configs/aol.py:small`'s, so the splits are
the ones MTN and the trivial suggesters are measured on. Variant 'embeddings'
(`configs/imdna_aol.py:embeddings`): the supervised-embedding baseline on the same questions.
"""

from configs import aol
from configs import families
from configs import imdna_movies


def get_config(variant: str = ''):
  if variant not in ('', 'embeddings'):
    raise ValueError(f'configs/imdna_aol.py: unknown variant {variant!r} (known: embeddings)')
  c = families.use(aol.get_config('small'), 'imdna')
  imdna_movies.add_task(c)
  c.imdna.task = 'aol'
  c.imdna.num_documents = 30  # K
  c.imdna.max_document_words = 40  # a session of up to 5 queries and their <sep>s, cut
  c.imdna.max_question_words = 40  # the session so far (its latest words kept)

  c.model.reader = variant or 'attention'
  c.model.emb_dim = 64
  c.model.hidden_units = 1024  # the vocabulary is both input and output here
  c.model.dropout = 0.1

  imdna_movies.apply_training(c)
  c.train.num_epochs = 3
  # Not the AOL generator's suggesting and serving: IMDNA answers its own questions, and a
  # generator's `rerank` reads its proposals (config.suggest.imdna_workdir).
  c.suggest.strategy = 'generate'
  c.serve.prepare_after_train = False
  return c
