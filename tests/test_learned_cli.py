"""The learned ranker end to end on the tiny demo config: one `--mode=train` makes the
generator, the fold generators and the ranker; eval scores exactly what decode writes and the
service shows; a workdir without a ranker suggests by the blend, one whose ranker was trained
for another checkpoint is refused in one line; packed to be served elsewhere
(launch/pack_serve_workdir.py), it suggests what it did."""

import collections
import hashlib
import itertools
import json
import os
import re
import shutil
import types

import numpy as np
import pytest

from launch import pack_serve_workdir
from mtn_jax import api
from mtn_jax import inference
from mtn_jax.data import sessions
from mtn_jax.data.vocab import Vocab
from mtn_jax.inference import habits
from mtn_jax.inference import learned
from mtn_jax.inference import learned_training
from mtn_jax.inference import pipeline
from mtn_jax.inference import popular
from mtn_jax.inference import presentation
from mtn_jax.inference.inputs import Context
from mtn_jax.serving import app as app_lib
from mtn_jax.serving import engine as engine_lib
from mtn_jax.serving import service as service_lib
from tests import cli
from tests.service_client import LOOPBACK
from tests.service_client import TestClient
from tests.test_polyencoder_cli import assert_decode_writes_what_eval_scored
from tests.lists import assert_raw_log_decode_writes_what_eval_scored
from tests.lists import assert_same_list
from tests.lists import read_jsonl

LEARNED = ('--config.suggest.strategy=learned', '--config.suggest.ranker_rounds=20',
           '--config.suggest.sources=generate:4,popular:4,cooccurring:4,templates:4')
# One epoch: the generator still trains its 6 steps (an epoch of the tiny demo log), the fold
# generators (half the users each) stop at theirs (3 steps) instead of training a second
# epoch and validating twice; the same programs, so nothing more to compile.
FEW = ('--config.train.max_steps=6', '--config.train.num_epochs=1',
       '--config.decode.max_eval_sessions=12')


@pytest.fixture(scope='module')
def learned_run(tmp_path_factory):
  """The main job (`--mode=all`, the default mode) under the learned strategy: the generator,
  the fold generators and the ranker, then eval, samples and the report of its lists."""
  workdir = tmp_path_factory.mktemp('learned')
  ran = cli.run(workdir, *FEW, *LEARNED, mode='all')
  return workdir, ran


@pytest.mark.slow
def test_one_train_command_makes_the_generators_and_the_ranker(learned_run):
  workdir, trained = learned_run
  out = trained.stdout
  for part in ('[1/4] The generator', '[2/4] The generator without the training users of fold 0',
               '[3/4] The generator without the training users of fold 1',
               '[4/4] The learned ranker'):
    assert part in out, out
  assert 'ETA' in out and 'most important:' in out
  # The workdir's summary comes once everything is made, and lists it all.
  closing = out[out.index('[4/4] The learned ranker'):]
  assert 'Best checkpoint: step' in closing and out.count('The workdir, ') == 1, out
  assert all(f'  {name}/' in closing for name in ('checkpoints', 'folds', 'ranker')), closing
  listed = list(itertools.takewhile(lambda line: line.startswith('  '),
                                    closing[closing.index('The workdir, '):].splitlines()[1:]))
  assert listed and all(len(line.split()) > 1 for line in listed), listed  # each described
  meta = json.loads((workdir / 'ranker' / 'ranker.json').read_text())
  assert meta['sources'] == [['generate', 4], ['popular', 4], ['cooccurring', 4],
                             ['templates', 4]]
  assert set(meta['importance']) == set(meta['features'])
  # Shares of the total gain, the most important first (the run's line names the first few).
  shares = list(meta['importance'].values())
  assert shares == sorted(shares, reverse=True) and sum(shares) == pytest.approx(1, abs=0.01)
  assert (workdir / 'folds' / 'fold0' / 'checkpoints').is_dir()
  # The job evaluates and reports the strategy's lists (eval/learned_*), not the beam's; of
  # the first sessions alone (config.decode.max_eval_sessions), in files of their own.
  assert f'Results:     {workdir / "eval" / "learned_first12_results.json"}' in out
  assert sorted(p.name for p in (workdir / 'eval').iterdir()) == [
      f'learned_first12_{name}' for name in ('lists.jsonl', 'results.json', 'samples.jsonl')]
  report_text = (workdir / 'report' / 'report.md').read_text()
  assert 'the suggestions of the learned strategy' in report_text
  # Run again: everything is current, nothing is trained again.
  again = cli.run(workdir, *FEW, *LEARNED)
  assert 'is current' in again.stdout and 'ranker data' not in again.stdout


@pytest.mark.slow
def test_eval_decode_and_serve_give_the_same_learned_lists(learned_run, tmp_path):
  workdir, ran = learned_run
  evaluated = ran.stdout  # the main job's evaluation
  # The generate source searches to its depth in the plan (4), not config.decode's beam.
  assert re.search(r'Evaluating .* sessions: beam 4, length penalty .* tokens; the learned '
                   r'ranker over generate:4,popular:4,cooccurring:4,templates:4\.\n',
                   evaluated), evaluated
  assert re.search(r'\n  learned: .*, 4 sources by the learned ranker  BLEU = ', evaluated)
  results = json.loads((workdir / 'eval' / 'learned_first12_results.json').read_text())
  assert results['strategy']['strategy'] == 'learned'
  # Each source alone is scored beside the ranker's lists, and printed with its figures.
  assert {'model', 'generate', 'popular', 'cooccurring', 'templates'} <= set(
      results['scores_excluding_session'])
  for key in results['scores']:
    assert results['scores'][key]['line'] in evaluated, key
  assert 'Reformulation templates (a source)' in evaluated
  assert 'Co-occurring next queries, then MPC (a source)' in evaluated
  # The files are named after the figures (they are written before them).
  written = f'Results: {workdir / "eval" / "learned_first12_results.json"}\n'
  assert evaluated.index('Never suggesting a query of the session:') < evaluated.index(written)
  lists_path = workdir / 'eval' / 'learned_first12_lists.jsonl'
  assert_decode_writes_what_eval_scored(workdir, lists_path, tmp_path, *FEW, *LEARNED)
  # The service, as --mode=serve builds it, shows the user-facing lists eval scored.
  pairs = read_jsonl(lists_path)
  # A list is in the order of its scores (its places shown: the presentation reorders the
  # ranker's list, the user-facing protocol drops the session's queries), the ranker's own
  # scores kept beside them.
  for pair in pairs:
    for key in ('suggestions', 'suggestions_excluding_session'):
      assert [s['score'] for s in pair[key]] == [
          1 / place for place in range(1, len(pair[key]) + 1)], pair
    assert all(isinstance(s['model_score'], float) for key in (
        'suggestions', 'suggestions_excluding_session') for s in pair[key])
  # Batches of one request: the client asks one at a time, so no larger batch is ever run,
  # and the service warms up (traces, compiles) the shapes of no larger one, all before it
  # listens; then no request compiles anything, whatever its candidates' number and lengths
  # (the generator teacher-forces them in packed rows of fixed shapes).
  service = service_lib.build(cli.config(*FEW, *LEARNED, '--config.serve.history_db=',
                                         '--config.serve.compile_cache=',
                                         '--config.serve.max_batch=1',
                                         '--config.serve.warm_up_background=False'),
                              str(workdir), log=lambda *a, **k: None)
  with TestClient(app_lib.create_app(service), client=LOOPBACK) as client:
    compiled = engine_lib.compilations()
    for pair in pairs:
      answer = client.post('/v1/suggest', json={'session': pair['context']}).json()
      expected = pair['suggestions_excluding_session']
      assert_same_list(answer['suggestions'], expected, pair['context'], abs=1e-4)
    assert engine_lib.compilations() == compiled > 0
  # From Python (`mtn_jax.api`), batched: the same lists.
  suggester = api.load(cli.config(*FEW, *LEARNED), str(workdir), log=lambda *a, **k: None)
  for shown, pair in zip(suggester.suggest_many([pair['context'] for pair in pairs]), pairs):
    assert_same_list(shown, pair['suggestions_excluding_session'], pair['context'], abs=1e-4)


PAST = 3  # fewer than the test users' earlier queries


@pytest.mark.slow
def test_a_users_past_as_a_source_eval_decode_and_serve_agree(learned_run, tmp_path):
  """With the sources of a user's past (`history`: their earlier queries, the latest
  `past_queries` of them; `history_about`: those about the session, as the default's plan),
  `--mode=train` refits the ranker alone; eval's lists for users are what decode
  writes for an AOL-format log of their sessions, and what the service shows a user who types
  those sessions a query at a time (their earlier ones kept in its history store, which
  keeps more); the user's past reaches the lists."""
  workdir = tmp_path / 'history'
  shutil.copytree(learned_run[0], workdir, ignore=shutil.ignore_patterns('eval'))
  plan = (*LEARNED[:2],
          '--config.suggest.sources=generate:4,popular:4,cooccurring:4,templates:4,history:4,'
          'history_about:4', f'--config.suggest.past_queries={PAST}')
  stale = workdir / 'ranker' / f'.{learned.RANKER_MODEL}.k3j2.tmp'  # a killed fit's
  stale.write_text('half')
  os.utime(stale, (0, 0))
  out = cli.run(workdir, *FEW, *plan, mode='train').stdout
  assert not stale.exists()
  assert '[4/4] The learned ranker' in out and 'ranker data: fold 0' in out, out
  assert 'validation at step' not in out, out  # the generators were current
  meta = json.loads((workdir / 'ranker' / 'ranker.json').read_text())
  assert meta['sources'][-2:] == [['history', 4], ['history_about', 4]]
  assert {'history_rank', 'history_about_rank'} <= set(meta['importance'])
  # Its training contexts read the latest PAST earlier queries too (the source would propose
  # 4 of a longer past).
  groups = json.loads((workdir / 'ranker' / 'groups.json').read_text())['lists']
  proposed = [len(group.get('history', ())) for group in groups]
  assert max(proposed) == PAST, collections.Counter(proposed)
  assert any(group.get('history_about') for group in groups)
  cli.run(workdir, *FEW, *plan, mode='eval')
  lists_path = workdir / 'eval' / 'learned_first12_lists.jsonl'
  results = json.loads((workdir / 'eval' / 'learned_first12_results.json').read_text())
  assert {'history', 'history_about'} <= set(results['scores_excluding_session'])
  pairs = read_jsonl(lists_path)
  test = sessions.load_split(str(workdir / 'data'), 'test')
  assert max(map(len, habits.past_queries(str(workdir / 'data'), test))) > PAST
  pasts = habits.past_queries(str(workdir / 'data'), test, keep=PAST)
  from_past = [s['query'] for p in pairs for s in p['suggestions_excluding_session']
               if s['query'] in pasts[p['session']]]
  assert from_past, 'no list holds a query of its user\'s past'
  assert_raw_log_decode_writes_what_eval_scored(workdir, lists_path, tmp_path, *FEW, *plan,
                                                protocols=(True,))
  decoded = read_jsonl(tmp_path / f'{lists_path.stem}.raw.suggestions_excluding_session.jsonl')
  service = service_lib.build(cli.config(*FEW, *plan,
                                         f'--config.serve.history_db={tmp_path / "h.sqlite"}',
                                         '--config.serve.compile_cache=',
                                         '--config.serve.max_batch=1'),
                              str(workdir), log=lambda *a, **k: None)
  read = []
  with TestClient(app_lib.create_app(service), client=LOOPBACK) as client:
    for record in decoded:  # each user's sessions in order, a query at a time
      answer = client.post('/v1/suggest', json={'session': record['context'],
                                                'user': str(record['user'])}).json()
      assert_same_list(answer['suggestions'], record['suggestions'], record['context'],
                       abs=1e-4)
      read.append(answer['history'])
  # The store keeps more of a user's past than the pipeline reads: a response counts what it
  # read.
  assert max(read) == PAST, read
  # From Python, each context with its user's earlier queries as evaluation reads them (the
  # whole past given: the latest PAST are read): eval's lists.
  suggester = api.load(cli.config(*FEW, *plan), str(workdir), log=lambda *a, **k: None)
  whole = habits.past_queries(str(workdir / 'data'), test)
  shown = suggester.suggest_many([pair['context'] for pair in pairs],
                                 pasts=[whole[pair['session']] for pair in pairs])
  for got, pair in zip(shown, pairs):
    assert_same_list(got, pair['suggestions_excluding_session'], pair['context'], abs=1e-4)


@pytest.mark.slow
def test_the_learned_lists_are_the_rankers_order_before_the_presentation_moves_it(learned_run):
  """With nothing moved (no first places, nothing kept out) a list is the pool in the order
  of the ranker's scores; the default presentation shows the same candidates, reordered, but
  what only the generator wrote and does not read as a query."""
  workdir, _ = learned_run
  contexts = [Context(tuple(p['context']), len(p['context']) - 1, {})
              for p in read_jsonl(workdir / 'eval' / 'learned_first12_lists.jsonl')[:8]]
  load = lambda *overrides: pipeline.Pipeline.load(cli.config(*FEW, *LEARNED, *overrides),
                                                   str(workdir), log=lambda *a, **k: None)
  unmoved = load('--config.suggest.session_first=0', '--config.suggest.attested_only=False')
  ranked = unmoved.ordered(contexts, positions='last')
  presented = load().ordered(contexts, positions='last')
  counts = popular.LogCounts.of_workdir(str(workdir))
  for context, [by_ranker], [shown] in zip(contexts, ranked, presented):
    scores = [c['model_score'] for c in by_ranker]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) > 1, by_ranker
    formed = presentation.well_formed(counts, context.queries)
    kept = {c['query'] for c in by_ranker
            if set(c['sources']) != {'generate'} or formed(c['query'])}
    assert {c['query'] for c in shown} == kept and len(kept) > 1, (shown, by_ranker)


@pytest.mark.slow
def test_without_a_ranker_the_blend_and_with_a_foreign_one_a_refusal(learned_run, tmp_path):
  workdir, _ = learned_run
  old = tmp_path / 'old'
  shutil.copytree(workdir, old, ignore=shutil.ignore_patterns('ranker', 'folds', 'eval'))
  sessions_file = tmp_path / 'sessions.txt'
  sessions_file.write_text('weather\tweather chicago\n')
  blend = ('--config.suggest.strategy=blend',)
  outputs = {}
  for name, strategy in (('learned', LEARNED), ('blend', blend)):
    outputs[name] = tmp_path / f'{name}.jsonl'
    run = cli.run(old, *FEW, *strategy, f'--config.decode.input={sessions_file}',
                  f'--config.decode.output={outputs[name]}', mode='decode')
    if name == 'learned':
      assert 'has no learned ranker' in run.stdout
  assert outputs['learned'].read_text() == outputs['blend'].read_text()
  # Its evaluation names the strategy that suggested (the blend), in the learned_ files.
  evaluated = cli.run(old, *FEW, *LEARNED, mode='eval')
  assert 'blend: ' in evaluated.stdout and 'learned: ' not in evaluated.stdout
  record = json.loads((old / 'eval' / 'learned_first12_results.json').read_text())
  assert record['strategy']['strategy'] == 'blend'
  # A ranker trained for another checkpoint: one line naming the file, exit 1.
  meta_path = workdir / 'ranker' / 'ranker.json'
  foreign = tmp_path / 'foreign'
  shutil.copytree(workdir, foreign, ignore=shutil.ignore_patterns('folds', 'eval'))
  meta = json.loads(meta_path.read_text())
  meta['checkpoint_step'] += 1
  (foreign / learned.RANKER_DIR / 'ranker.json').write_text(json.dumps(meta))
  refused = cli.run(foreign, *FEW, *LEARNED, f'--config.decode.input={sessions_file}',
                    mode='decode', check=False)
  assert refused.returncode == 1
  assert refused.stderr.strip().count('\n') == 0
  assert 'ranker.json: the ranker was trained for checkpoint step' in refused.stderr
  # Damaged files: one line naming the file, exit 1 (a cut model file made LightGBM abort
  # the process, or load with no trees and score every candidate 0).
  (foreign / learned.RANKER_DIR / 'ranker.json').write_text(meta_path.read_text())
  model = foreign / learned.RANKER_DIR / learned.RANKER_MODEL
  model.write_bytes(model.read_bytes()[:3000])
  for damage, message in ((None, 'model.txt: not the model ranker.json was written with'),
                          ('{"sources": [', 'ranker.json: not a readable ranker record')):
    if damage:
      (foreign / learned.RANKER_DIR / 'ranker.json').write_text(damage)
    refused = cli.run(foreign, *FEW, *LEARNED, f'--config.decode.input={sessions_file}',
                      mode='decode', check=False)
    assert refused.returncode == 1 and refused.stderr.strip().count('\n') == 0, refused.stderr
    assert message in refused.stderr


@pytest.mark.slow
def test_train_refits_a_damaged_ranker_and_refuses_other_folds(learned_run, tmp_path):
  """`--mode=train` on a workdir whose model file was cut refits the ranker (from the cached
  candidates); another `suggest.ranker_folds` is refused before a fold generator that has
  seen the users it is to score is resumed or called complete."""
  workdir, _ = learned_run
  copy = tmp_path / 'copy'
  shutil.copytree(workdir, copy, ignore=shutil.ignore_patterns('eval'))
  model = copy / learned.RANKER_DIR / learned.RANKER_MODEL
  intact = model.read_bytes()
  model.write_bytes(intact[:1000])
  out = cli.run(copy, *FEW, *LEARNED).stdout
  assert 'is current' not in out and 'the candidates of the last fit' in out, out
  assert model.read_bytes() == intact  # the same candidates and settings: the same trees
  # Other sources or rounds than the ranker's: its own are used, and the run says so.
  sessions_file = tmp_path / 'sessions.txt'
  sessions_file.write_text('weather\tweather chicago\n')
  other = ('--config.suggest.strategy=learned', '--config.suggest.ranker_rounds=20',
           '--config.suggest.sources=generate:10,popular:10', '--config.decode.length_penalty=2.0')
  output = tmp_path / 'other.jsonl'
  noted = cli.run(copy, *FEW, *other, f'--config.decode.input={sessions_file}',
                  f'--config.decode.output={output}', mode='decode')
  # Only what differs is named (the rounds are the ranker's); the candidates' search too (the
  # generator's features depend on it).
  assert ("was trained with sources 'generate:4,popular:4,cooccurring:4,templates:4', not "
          "the config's 'generate:10,popular:10' and config.decode.length_penalty=0.6, not the "
          "config's 2.0: its own are used" in noted.stdout), noted.stdout
  # config.decode.beam_size is not the learned strategy's (the plan's generate:N is): a run
  # whose beam size differs says so, and searches as one whose beam size is the plan's.
  assert ("the learned strategy's generator searches a beam of 4 (the ranker's source "
          "generate:4), not config.decode.beam_size=5" in noted.stdout), noted.stdout
  own = tmp_path / 'own.jsonl'
  quiet = cli.run(copy, *FEW, *LEARNED, f'--config.decode.input={sessions_file}',
                  f'--config.decode.output={own}', '--config.decode.beam_size=4', mode='decode')
  assert 'searches a beam of' not in quiet.stdout, quiet.stdout
  assert output.read_text() == own.read_text()
  # The ranker is stale once its fold generators' best checkpoints or the features computed
  # are not those it was trained on (older records, holding no steps, are taken as current).
  config = cli.config(*FEW, *LEARNED)
  trained = inference.load_trained(config, str(copy))
  meta_path = copy / learned.RANKER_DIR / learned.RANKER_META
  record = json.loads(meta_path.read_text())
  assert record['fold_steps'] == learned.fold_steps(config, str(copy))
  assert None not in record['fold_steps']
  assert learned.LearnedRanker.is_current(str(copy), trained, config)
  for changed in ({'fold_steps': [3, 2]}, {'features': record['features'][1:]},
                  {'rounds': record['rounds'] + 1}, {'folds': record['folds'] + 1},
                  {'checkpoint_step': record['checkpoint_step'] + 1},
                  {'vocab_fingerprint': 'another'}, {'sources': record['sources'][:1]},
                  {'past_queries': 3}, {'model_sha256': '0' * 64}):
    meta_path.write_text(json.dumps({**record, **changed}))
    assert not learned.LearnedRanker.is_current(str(copy), trained, config), changed
  meta_path.write_text(json.dumps({k: v for k, v in record.items() if k != 'fold_steps'}))
  assert learned.LearnedRanker.is_current(str(copy), trained, config)
  refused = cli.run(copy, *FEW, *LEARNED, '--config.suggest.ranker_folds=3', check=False)
  assert refused.returncode == 1, refused.stderr
  assert refused.stderr.strip().count('\n') == 0, refused.stderr
  assert re.search(r'folds/fold0/checkpoints/\d+ was trained with config.train.user_folds=2, '
                   r'not 3: .*config.suggest.ranker_folds .* move \S+/copy/folds away',
                   refused.stderr), refused.stderr


@pytest.mark.slow
def test_a_stopped_ranker_data_stage_makes_again_only_the_folds_it_had_not_finished(
    learned_run, tmp_path, monkeypatch):
  workdir, _ = learned_run
  copy = tmp_path / 'copy'
  shutil.copytree(workdir, copy, ignore=shutil.ignore_patterns('eval'))
  config = cli.config(*FEW, *LEARNED)
  whole = learned_training.load_groups(learned.ranker_dir(str(copy)),
                              learned_training.groups_key(config, str(copy)))
  assert whole is not None
  for name in ('groups.npz', 'groups.json'):
    (copy / learned.RANKER_DIR / name).unlink()

  def stop_at_fold_1(line, **_):
    if 'fold 1' in line:
      raise KeyboardInterrupt
  with pytest.raises(KeyboardInterrupt):
    learned_training.cached_groups(config, str(copy), log=stop_at_fold_1)
  parts = copy / learned.RANKER_DIR / 'parts'
  assert sorted(p.name for p in parts.iterdir()) == ['fold0']
  lines, counted = [], []
  of_sessions = popular.LogCounts.of_sessions
  monkeypatch.setattr(popular.LogCounts, 'of_sessions', staticmethod(lambda texts: (
      counted.append(list(texts)) or of_sessions(counted[-1]))))
  again = learned_training.cached_groups(config, str(copy),
                                         log=lambda line, **_: lines.append(line))
  # Cross-fitted: fold 1's candidates were counted from the other fold's users alone.
  train = sessions.load_split(str(copy / 'data'), 'train')
  fold_of = sessions.session_folds(train, 2, config.data.split_seed)
  others = [tuple(train.session_texts(i)) for i in np.flatnonzero(fold_of == 0).tolist()]
  assert [collections.Counter(map(tuple, c)) for c in counted] == [collections.Counter(others)]
  assert any('fold 0, the candidates made before' in line for line in lines), lines
  assert not any(line.startswith('  ranker data: fold 0,') and 'sessions;' in line
                 for line in lines), lines
  # The same groups as a run never stopped, and the parts gone once the whole is kept.
  for field in ('features', 'labels', 'sizes', 'folds'):
    np.testing.assert_array_equal(getattr(again, field), getattr(whole, field))
  assert again.texts == whole.texts and again.lists == whole.lists
  assert not parts.exists()


def test_the_candidates_search_is_what_the_generate_source_runs():
  """The ranker is stale, and its candidates are made again, when a setting the generator's
  source searches with changes, and only then: `config.decode`'s beam size and top k are the
  source's depth in `config.suggest.sources`."""
  key = lambda *overrides: learned.search_key(cli.config(*FEW, *LEARNED, *overrides))
  assert key() == key('--config.decode.beam_size=3', '--config.decode.top_k=3')
  assert key()['beam_size'] == key()['top_k'] == 4 and not key()['exclude_session_queries']
  assert key('--config.decode.length_penalty=1.0') != key()
  assert key('--config.suggest.sources=generate:6,popular:4') != key()
  # Records of 2026-11-28 hold the protocol unset, which searched alike: still current.
  as_now = learned.search_as_written_now  # pylint: disable=protected-access
  assert as_now({**key(), 'exclude_session_queries': None}) == key()
  assert as_now({**key(), 'exclude_session_queries': True}) != key()


def test_cached_candidates_of_an_older_record_are_read(tmp_path):
  """The candidates a fit cached are read back by a key naming the same search, written
  before the generator source's protocol was set explicitly."""
  groups = learned_training.Groups(np.ones((2, 3), np.float32), np.array([1, 0], np.int32),
                          np.array([2]), np.array([0]), [['a', 'b']], ['a'], [('q',)],
                          [{'generate': ['a', 'b']}])
  search_now = learned.search_key(cli.config(*FEW, *LEARNED))
  key = {'sources': [['generate', 4]], 'folds': 2, 'fold_steps': [3, 3], 'split_seed': 0,
         'search': search_now, 'features': learned.feature_names(['generate'])}
  learned_training.save_groups(groups, str(tmp_path), {**key, 'search': {
      **search_now, 'exclude_session_queries': None}})
  read = learned_training.load_groups(str(tmp_path), key)
  assert read is not None and read.texts == groups.texts
  assert learned_training.load_groups(str(tmp_path), {**key, 'fold_steps': [3, 4]}) is None
  # A run killed between its two files: the arrays of one key beside the texts of another.
  texts = (tmp_path / 'groups.json').read_bytes()
  other = {**key, 'fold_steps': [3, 4]}
  learned_training.save_groups(groups, str(tmp_path), other)
  assert learned_training.load_groups(str(tmp_path), other) is not None
  (tmp_path / 'groups.json').write_bytes(texts)
  assert learned_training.load_groups(str(tmp_path), key) is None
  assert learned_training.load_groups(str(tmp_path), other) is None
  # Made before the features were recorded: made again, and said why.
  older = {k: v for k, v in key.items() if k != 'features'}
  learned_training.save_groups(groups, str(tmp_path), older)
  said = []
  assert learned_training.load_groups(str(tmp_path), key,
                                     log=lambda line, **_: said.append(line)) is None
  assert said and 'made by an older version, which did not record their features' in said[0]


def test_unreadable_cached_candidates_are_made_again(tmp_path):
  key = {'plan': [['generate', 4]], 'features': ['generate_rank'], 'search': None}
  (tmp_path / 'groups.json').write_text(json.dumps({'key': key, 'texts': []}))
  (tmp_path / 'groups.npz').write_bytes(b'PK\x03\x04 cut short')
  said = []
  assert learned_training.load_groups(str(tmp_path), key,
                                     log=lambda line, **_: said.append(line)) is None
  assert said and 'cannot be read (BadZipFile)' in said[0], said
  (tmp_path / 'groups.json').write_text('{"key": ')
  assert learned_training.load_groups(str(tmp_path), key) is None


def test_a_ranker_is_current_only_for_its_rounds_and_the_model_file_it_recorded(tmp_path):
  """`is_current` from the record alone (no fold generator trained: their steps None): the
  record written for this config, or by an older version, is current; other rounds, or a model
  file other than the one whose SHA-256 it holds, are not (the ranker is refitted); a record
  that is no JSON object is not current, and refused in one line when loaded."""
  config = cli.config(*FEW, *LEARNED)
  vocab = Vocab.from_counts({'a': 9}, 1)
  trained = types.SimpleNamespace(step=6, vocab=vocab)
  folder = tmp_path / learned.RANKER_DIR
  folder.mkdir()
  model = folder / learned.RANKER_MODEL
  model.write_bytes(b'a model\n')
  plan = learned.parse_sources(config.suggest.sources)
  record = {'checkpoint_step': 6, 'vocab_fingerprint': vocab.fingerprint,
            'sources': [list(x) for x in plan], 'folds': config.suggest.ranker_folds,
            'rounds': config.suggest.ranker_rounds,
            'features': learned.feature_names([name for name, _ in plan]),
            'search': learned.search_key(config),
            'fold_steps': learned.fold_steps(config, str(tmp_path)),
            'features_version': learned.FEATURES_VERSION,
            'model_sha256': hashlib.sha256(b'a model\n').hexdigest()}
  meta = folder / learned.RANKER_META
  current = lambda: learned.LearnedRanker.is_current(str(tmp_path), trained, config)
  meta.write_text(json.dumps(record))
  assert current()
  # Features computed otherwise before (a later query's words read): refitted.
  meta.write_text(json.dumps({**record, 'features_version': 1}))
  assert not current()
  meta.write_text(json.dumps({k: v for k, v in record.items() if k != 'features_version'}))
  assert not current()
  meta.write_text(json.dumps(record))
  # Older records: no fold steps kept, the candidates' protocol unset (which searched alike).
  meta.write_text(json.dumps({**{k: v for k, v in record.items() if k != 'fold_steps'},
                              'search': {**record['search'], 'exclude_session_queries': None}}))
  assert current()
  meta.write_text(json.dumps({**record, 'rounds': record['rounds'] + 1}))
  assert not current()
  meta.write_text(json.dumps(record))
  model.write_bytes(b'another model\n')
  assert not current()
  meta.write_text('[1, 2]')
  assert not current()
  with pytest.raises(learned.DamagedRanker, match='ranker.json: not a ranker record'):
    learned.LearnedRanker.load(str(tmp_path), trained)


def test_overrides_name_the_scalar_settings_that_differ():
  base = {'data': {'split_by': 'session', 'split_fractions': (0.9, 0.05, 0.05), 'raw_files': ''},
          'serve': {'prepare_after_train': True, 'max_batch': 8}}
  trained = {'data': {'split_by': 'user', 'split_fractions': [0.9, 0.05, 0.05],
                      'raw_files': '/logs/a.tsv', 'new_key': 1},
             'serve': {'prepare_after_train': False, 'max_batch': 8}}
  # A tuple and the list JSON makes of it are equal; a key the base lacks, and a setting that
  # acts only when training ends, are left out.
  assert pack_serve_workdir.overrides(trained, base) == [
      '--set=data.split_by=user', '--set=data.raw_files=/logs/a.tsv']
  with pytest.raises(ValueError, match="the workdir's model is 'transformer', the base "
                     "config's 'mtn': pass --config of a 'transformer' config"):
    pack_serve_workdir.overrides({**trained, 'model': {'name': 'transformer'}},
                                 {**base, 'model': {'name': 'mtn'}})
  trained['data']['split_fractions'] = [0.8, 0.1, 0.1]
  with pytest.raises(ValueError, match='data.split_fractions=.*cannot be passed as an override'):
    pack_serve_workdir.overrides(trained, base)


@pytest.mark.slow
def test_a_packed_workdir_suggests_what_the_trained_one_does(learned_run, tmp_path):
  workdir, _ = learned_run
  config = cli.config(*FEW, *LEARNED)
  base = cli.config(*FEW, *LEARNED, '--config.suggest.ranker_rounds=150').to_dict()
  packed = tmp_path / 'packed'
  assert pack_serve_workdir.pack(str(workdir), str(packed), base) == [
      '--set=suggest.ranker_rounds=20']
  assert (packed / 'serve_args.txt').read_text() == '--set=suggest.ranker_rounds=20\n'
  assert not (packed / 'folds').exists() and not list(packed.glob('checkpoints/*/train'))
  contexts = [Context(('weather', 'weather chicago'), 1, {}), Context(('ebay',), 0, {})]
  lists = [pipeline.Pipeline.load(config, str(w), log=lambda *a, **k: None).suggest(
      contexts, positions='last') for w in (workdir, packed)]
  assert lists[0] == lists[1] and lists[0][0][0]
  # A ranker refitted with another plan after config.json was written: the overrides give the
  # ranker's plan, which the service uses.
  refitted = tmp_path / 'refitted'
  shutil.copytree(workdir, refitted, ignore=shutil.ignore_patterns('eval', 'folds'))
  record = json.loads((refitted / 'config.json').read_text())
  record['config']['suggest']['sources'] = 'generate:4,popular:4'
  (refitted / 'config.json').write_text(json.dumps(record))
  assert pack_serve_workdir.pack(str(refitted), str(tmp_path / 'packed2'), base) == [
      '--set=suggest.ranker_rounds=20']
