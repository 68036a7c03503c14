"""The preparation step of `config.train.hypotheses_from`: each cross-fitted generator decodes
the sessions it suggests for, into the files the ranker's training and evaluation read
(`mtn_jax.data.hypothesis_files`, which says why and how).

Each generator decodes with its own run's `config.decode` (the settings `--mode=eval` with
its config uses, and so the candidates reranking sees), whole beam kept. A file is made again
only when what it depends on (checkpoint step, search settings, the sessions) changed.
"""

from __future__ import annotations

import os

import ml_collections

from mtn_jax import inference
from mtn_jax.data import hypothesis_files
from mtn_jax.data import preprocess
from mtn_jax.data import sessions
from mtn_jax.decoding import search
from mtn_jax.inference import habits
from mtn_jax.inference import sources
from mtn_jax.training import train


def settings(generator: hypothesis_files.Generator) -> search.SearchSettings:
  # The whole beam, as evaluation decodes it before any strategy drops or cuts a candidate:
  # a top_k below the beam cuts only what is shown.
  return search.SearchSettings.from_config(generator.config.decode).whole_beam()


def prepare(config: ml_collections.ConfigDict, workdir: str, split_names: tuple[str, ...],
            log=print) -> None:
  """Makes the suggestion files of `config.train.hypotheses_from` for the splits
  `split_names` of `workdir`'s corpus (nothing without `hypotheses_from`)."""
  if not config.train.get('hypotheses_from'):
    return
  # The run's corpus first (built, or reused when current): the generators are checked
  # against it and decode its sessions.
  train.prepare_corpus(config, workdir)
  data_dir = preprocess.data_dir(os.path.abspath(workdir))
  found = hypothesis_files.generators(config.train.hypotheses_from, data_dir)
  for name in split_names:
    split = sessions.load_split(data_dir, name)
    for generator, chosen in hypothesis_files.sessions_of(found, split):
      part = split if len(chosen) == split.num_sessions else sessions.select_sessions(
          split, chosen)
      _decode(generator, part, data_dir, log)


def _decode(generator: hypothesis_files.Generator, split: sessions.SessionSplit, data_dir: str,
            log) -> None:
  path = generator.path(split.name)
  trained = inference.load_trained(generator.config, generator.workdir)
  search_settings = settings(generator)
  header = {'checkpoint_step': int(trained.step), 'settings': search_settings.to_dict(),
            'sessions': hypothesis_files.fingerprint(split)}
  cached_header, cached = hypothesis_files.read(path)
  if cached_header == header and len(cached) == len(split.queries):
    return
  log(f'Decoding {split.num_sessions:,} {split.name} sessions with {generator.workdir} (users '
      f'of fold {generator.held_out} of {generator.folds} held out of its training) for the '
      'ranker\'s candidates.', flush=True)
  decode = generator.config.decode
  history_queries = generator.config.data.history_queries
  histories = (habits.past_queries(data_dir, split, keep=history_queries) if history_queries
               else None)
  by_session = sources.Generate(trained, search_settings, history_queries).propose_sessions(
      sources.session_contexts(split, range(split.num_sessions), histories),
      queries_per_batch=decode.batch_sessions * generator.config.data.max_session_queries,
      log=log)
  # A row per query: each position's suggestions, none after the session's last query.
  rows = [[[c['query'] for c in ranked] for ranked in session] + [[]] for session in by_session]
  hypothesis_files.write(path, header, [row for session in rows for row in session])
