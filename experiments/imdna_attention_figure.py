"""The slides' Figure 1 for a trained IMDNA run: the last inference step's attention on each
token of a question's documents, as shades, and what removing a document does to the answers.

  python experiments/imdna_attention_figure.py --config=configs/imdna_movies.py --workdir=W \
      [--question='what does NAME act in'] [--output=docs/imdna_attention.png]

Without --question the first test question of the form 'what does ... act in' with more than
two answers is shown. Prints the question, the model's top answers, then for the document
holding the top answer: the answers again with that document left out.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt
import numpy as np
from absl import app
from absl import flags
from ml_collections import config_flags

from mtn_jax import errors
from mtn_jax import inference
from mtn_jax.data import imdna_library
from mtn_jax.inference import trained as trained_lib

config_flags.DEFINE_config_file('config', None, 'The run\'s config (path[:variant]).')
flags.DEFINE_string('workdir', None, 'The trained run.')
flags.DEFINE_string('question', '', 'A test question (default: the first "what does X act '
                    'in" with more than two answers).')
flags.DEFINE_string('output', 'docs/imdna_attention.png', 'Where the figure goes.')
flags.DEFINE_integer('documents', 6, 'Documents shown, best attended first.')
FLAGS = flags.FLAGS


def _read(trained, batch):
  return jax.tree.map(np.asarray, trained.task.model.apply(
      {'params': trained.params}, batch, method='read'))


def _top(scores, library, k=6):
  order = np.argsort(-scores, kind='stable')[:k]
  return [(library.answers[a], float(scores[a])) for a in order]


def main(argv):
  del argv
  config = FLAGS.config
  try:  # a run of another model is named as eval names it
    trained_lib.check_config(config, FLAGS.workdir)
  except errors.Error as e:
    sys.exit(str(e))
  trained = inference.load_trained(config, FLAGS.workdir)
  library = imdna_library.load_library(config, FLAGS.workdir)
  questions = library.splits['test']
  if FLAGS.question:
    index = questions.texts.index(FLAGS.question)
  else:
    index = next(i for i, t in enumerate(questions.texts)
                 if t.startswith('what does') and t.endswith('act in')
                 and (questions.answers[i] >= 0).sum() > 2)
  batch = {'question': questions.question[index:index + 1],
           'documents': library.document_tokens[questions.documents[index:index + 1]]}
  reading = _read(trained, batch)
  probabilities = 1 / (1 + np.exp(-reading['logits'][0]))
  truth = [library.answers[a] for a in questions.answers[index] if a >= 0]
  print(f'Question: {questions.texts[index]}')
  print(f'Ground truth answers: {", ".join(truth)}')
  print('Top answers: ' + ', '.join(f'{a} ({p:.2f})' for a, p in _top(probabilities, library)))

  attention = reading['document_attention'][0, -1]  # [K, Ld], the last step
  tokens = batch['documents'][0]
  retrieved = int((tokens != 0).any(-1).sum())  # BM25 returns fewer than K when few match
  shown = np.argsort(-attention.sum(-1), kind='stable')[:min(FLAGS.documents, retrieved)]
  fig, ax = plt.subplots(figsize=(11, 0.55 * len(shown) + 1.2))
  ax.axis('off')
  peak = attention.max()
  for row, doc in enumerate(shown):
    x = 0.0
    for position, word_id in enumerate(tokens[doc]):
      if word_id == 0:
        break
      word = library.vocab.words[word_id]
      shade = attention[doc, position] / peak
      text = ax.text(x, -row, word.replace('_', ' '), fontsize=9, family='monospace',
                     bbox={'facecolor': plt.cm.Reds(shade), 'edgecolor': 'none',
                           'pad': 1.5})
      x += 0.0105 * (len(word) + 2)
      del text
  ax.set_xlim(0, 1.35)
  ax.set_ylim(-len(shown) + 0.5, 1.2)
  ax.set_title(f'Q: {questions.texts[index].replace("_", " ")}\n'
               f'A: {", ".join(t.replace("_", " ") for t in truth)}', fontsize=10, loc='left')
  fig.text(0.01, 0.01, 'Attention at the last inference step, per token (darker = higher); '
           f'the {len(shown)} most attended of the {retrieved} documents BM25 retrieved '
           f'(of K = {len(tokens)}).', fontsize=8)
  fig.savefig(FLAGS.output, dpi=110, bbox_inches='tight')
  print(f'Figure: {FLAGS.output}')

  best = int(np.argmax(probabilities))
  holding = [k for k in range(len(tokens)) if library.answer_words[best] in tokens[k]]
  if holding:
    removed = dict(batch, documents=batch['documents'].copy())
    removed['documents'][0, holding] = 0
    after = 1 / (1 + np.exp(-_read(trained, removed)['logits'][0]))
    rank = int((after > after[best]).sum()) + 1
    print(f'Without the {len(holding)} document(s) holding {library.answers[best]}: its '
          f'probability {probabilities[best]:.3f} -> {after[best]:.3f}, rank 1 -> {rank}; '
          'top answers: ' + ', '.join(f'{a} ({p:.2f})' for a, p in _top(after, library)))


if __name__ == '__main__':
  flags.mark_flags_as_required(['config', 'workdir'])
  app.run(main)
