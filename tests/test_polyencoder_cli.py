"""Bi-, Poly- and Cross-encoders through the real command line: a Poly-encoder resumed bit for
bit, a generative model's beam reranked with it (eval and decode, IMDNA's next queries as a
third source), a graded Poly-encoder trained with lexical negatives and evaluated, and every
strategy evaluated as the code before the role packages did (tests/golden.py).

Apart from the unit tests in test_polyencoder.py so that the two files, each on one test
worker, take about as long."""

from __future__ import annotations

import json
import re
import shutil
import sys

import numpy as np
import pytest


from mtn_jax.data import candidate_pool
from mtn_jax.data.vocab import SPECIAL_TOKENS
from mtn_jax.evaluation import trivial
from tests import cli
from tests import golden
from tests.lists import assert_raw_log_decode_writes_what_eval_scored
from tests.lists import assert_same_list
from tests.lists import read_jsonl

# ---------------------------------------------------------------------------------------------
# Through the command line: a Poly-encoder resumed bit for bit, and reranking a generative
# model's beam with it (eval and decode).

RANKER_CONFIG = 'configs/polyencoder_aol.py:demo'
# Both the ranker and the generator read the same demo log through `cli.TINY`'s config.data
# (150 users, words seen twice), so they share one vocabulary.
FEW = ('--config.train.log_every_steps=1', '--config.decode.max_eval_sessions=16')
FIRST_STEPS, TOTAL_STEPS = 3, 6


@pytest.fixture(scope='module')
def poly_run(tmp_path_factory):
  """A demo Poly-encoder: 3 steps, resumed to 6; and the same 6 steps in one go."""
  workdir = tmp_path_factory.mktemp('poly')
  run = lambda *args: cli.run(workdir, *FEW, *args, config=RANKER_CONFIG)
  run(f'--config.train.max_steps={FIRST_STEPS}')
  resumed = run(f'--config.train.max_steps={TOTAL_STEPS}')
  straight = tmp_path_factory.mktemp('poly-straight')
  cli.run(straight, *FEW, f'--config.train.max_steps={TOTAL_STEPS}', config=RANKER_CONFIG)
  return workdir, straight, resumed


@pytest.mark.slow
def test_poly_encoder_resumes_bit_for_bit(poly_run):
  workdir, straight, resumed = poly_run
  assert 'Resuming from' in resumed.stdout
  assert re.search(r' \d+ sessions/s \d+ contexts/s, ', resumed.stdout)  # a ranker's pace
  from mtn_jax.training import metric_writer  # pylint: disable=g-import-not-at-top
  a = metric_writer.read_metrics(str(workdir), 'train')
  b = metric_writer.read_metrics(str(straight), 'train')
  assert [r['step'] for r in a] == [r['step'] for r in b] == list(range(1, TOTAL_STEPS + 1))
  assert [r['loss'] for r in a] == [r['loss'] for r in b]
  assert ([r['loss'] for r in metric_writer.read_metrics(str(workdir), 'valid')][-1]
          == [r['loss'] for r in metric_writer.read_metrics(str(straight), 'valid')][-1])


@pytest.fixture(scope='module')
def rerank_run(poly_run, tmp_path_factory):
  """A tiny MTN on the same demo log, evaluated alone and reranked by the Poly-encoder."""
  poly = poly_run[0]
  generator = tmp_path_factory.mktemp('generator')
  run = lambda *args, **kwargs: cli.run(generator, *FEW, *args, **kwargs)
  run('--config.train.max_steps=4')
  # top_k = beam_size (5, the default): the samples of the plain evaluation hold the whole
  # beam, the generator's share of each reranked list.
  run(mode='eval')
  # As evaluated now, for the comparison with the code before the move (later tests evaluate
  # the same workdir with other settings).
  shutil.copytree(generator / 'eval', generator / 'first_eval' / 'eval')
  reranked = run('--config.suggest.strategy=rerank', f'--config.suggest.ranker_workdir={poly}',
                 mode='eval')
  return generator, poly, reranked


def pool_texts(workdir) -> set[str]:
  return set(candidate_pool.load_pool(str(workdir / 'data')).texts)


def popular_order(workdir) -> list[str]:
  """The most popular next queries of the workdir's training split, counted here by hand."""
  from mtn_jax.data import sessions  # pylint: disable=g-import-not-at-top
  train = sessions.load_split(str(workdir / 'data'), 'train')
  counts = {}
  for i in range(train.num_sessions):
    for query in train.session_texts(i)[1:]:
      counts[query] = counts.get(query, 0) + 1
  return sorted(counts, key=lambda q: -counts[q])  # stable: the first seen wins a tie


@pytest.mark.slow
def test_rerank_eval_scores_the_strategy_beside_its_sources(rerank_run):
  generator, poly, reranked = rerank_run
  results = json.loads((generator / 'eval' / 'rerank_first16_results.json').read_text())
  assert set(results['scores']) == {'model', 'generate', 'retrieve', *trivial.SUGGESTERS}
  assert set(results['scores_excluding_session']) == set(results['scores'])
  strategy = results['strategy']
  assert strategy['strategy'] == 'rerank' and strategy['ranker_workdir'] == str(poly)
  assert strategy['retriever_workdir'] == str(poly)  # the ranker retrieves too
  assert 'scored by Poly-encoder' in strategy['label']
  assert 'rerank: ' in reranked.stdout
  # 'generate' is the workdir's own beam: the figures of its plain evaluation.
  plain = json.loads((generator / 'eval' / 'first16_results.json').read_text())
  assert results['scores']['generate'] == plain['scores']['model']
  assert results['pairs'] == plain['pairs'] > 0
  # Every reranked suggestion is a pooled candidate: a beam hypothesis, a pool entry (the
  # retrieved ones are), or one of the session's queries so far; best first.
  beams = {(s['session'], s['position']): {c['query'] for c in s['suggestions']}
           for s in read_jsonl(generator / 'eval' / 'first16_samples.jsonl')}
  pool = pool_texts(poly)
  samples = read_jsonl(generator / 'eval' / 'rerank_first16_samples.jsonl')
  assert len(samples) == len(beams) > 0
  for sample in samples:
    ranked = sample['suggestions']
    assert 0 < len(ranked) <= 5  # decode.top_k
    beam = beams[(sample['session'], sample['position'])]
    for suggestion in ranked:
      assert suggestion['query'] in beam | pool | set(sample['context']), (suggestion, sample)
    scores = [s['score'] for s in ranked]
    assert scores == sorted(scores, reverse=True)
    assert sample['predicted'] == ranked[0]['query']
  # The ranker's candidate vectors were cached in its own workdir.
  assert (poly / 'candidate_cache' / 'meta.json').exists()


@pytest.mark.slow
def test_rerank_refuses_a_ranker_of_another_vocabulary(rerank_run, tmp_path):
  generator = rerank_run[0]
  results_path = generator / 'eval' / 'rerank_first16_results.json'
  before = results_path.read_text()
  other = tmp_path / 'other'
  cli.run(other, *FEW, '--config.data.min_word_count=3', '--config.train.max_steps=1',
          config=RANKER_CONFIG)
  refused = cli.run(generator, *FEW, '--config.suggest.strategy=rerank',
                    f'--config.suggest.ranker_workdir={other}', mode='eval', check=False)
  assert refused.returncode == 1, refused.stderr[-3000:]
  assert 'Traceback' not in refused.stderr
  errors_ = [line for line in refused.stderr.splitlines() if line.startswith('error:')]
  assert len(errors_) == 1 and refused.stderr.rstrip().endswith(errors_[0])
  assert 'vocabulary' in errors_[0] and str(other) in errors_[0] and str(generator) in errors_[0]
  assert results_path.read_text() == before  # nothing written


@pytest.mark.slow
def test_rerank_decode_writes_pooled_candidates_best_first(rerank_run, tmp_path):
  generator, poly, _ = rerank_run
  samples = read_jsonl(generator / 'eval' / 'rerank_first16_samples.jsonl')
  contexts = [s['context'] for s in samples[:3]]
  sessions_file = tmp_path / 'sessions.txt'
  sessions_file.write_text(''.join('\t'.join(c) + '\n' for c in contexts))
  beam_out, reranked_out = tmp_path / 'beam.jsonl', tmp_path / 'reranked.jsonl'
  cli.run(generator, *FEW, f'--config.decode.input={sessions_file}',
          f'--config.decode.output={beam_out}', mode='decode')
  decoded = cli.run(generator, *FEW, f'--config.decode.input={sessions_file}',
                    f'--config.decode.output={reranked_out}', '--config.suggest.strategy=rerank',
                    f'--config.suggest.ranker_workdir={poly}', mode='decode')
  assert 'reranked' in decoded.stdout
  beams, records = read_jsonl(beam_out), read_jsonl(reranked_out)
  # One record per session (a suggestion after its last query), in the file's order.
  assert [r['context'] for r in records] == [r['context'] for r in beams] == contexts
  pool = pool_texts(poly)
  for record, beam in zip(records, beams):
    ranked = record['suggestions']
    assert 0 < len(ranked) <= 5
    assert len({s['query'] for s in ranked}) == len(ranked)  # deduplicated
    allowed = {s['query'] for s in beam['suggestions']} | pool | set(record['context'])
    assert {s['query'] for s in ranked} <= allowed
    scores = [s['score'] for s in ranked]
    assert scores == sorted(scores, reverse=True)


@pytest.mark.slow
def test_rerank_decode_of_a_raw_log_puts_a_habitual_users_habit_query_first(rerank_run,
                                                                          tmp_path):
  """A user who came back to the same two queries three times: once their past shows the
  habit, the most issued query outside the session goes first. The two are words no model
  here can write (outside the vocabulary, never in the session when suggested)."""
  generator, poly, _ = rerank_run
  log = tmp_path / 'log.tsv'
  cli.write_log(log, [(7, [['qqbank', 'qqmail']] * 3 + [['weather boston',
                                                        'weather boston hourly']]),
                      (8, [['weather boston']])])
  output = tmp_path / 'habits.jsonl'
  cli.run(generator, *FEW, f'--config.decode.input={log}', f'--config.decode.output={output}',
          '--config.suggest.strategy=rerank', f'--config.suggest.ranker_workdir={poly}',
          '--config.suggest.habit_rate=0.5', '--config.suggest.habit_min_past=3',
          '--config.decode.exclude_session_queries=True', mode='decode')
  first = {(r['user'], r['session'], r['position']): r['suggestions'][0]['query']
           for r in read_jsonl(output)}
  # Session 1, past 'qqbank qqmail' (one later query, below habit_min_past): no habit.
  assert first[7, 1, 0] != 'qqmail'
  # Session 2, past 'qqbank qqmail qqbank qqmail' (2 of its 3 later queries were the habit
  # of their moment): the most issued query outside the session.
  assert first[7, 2, 0] == 'qqmail'
  # Session 3: 'qqbank' (3 times, issued first), at both positions; no habit for user 8.
  assert first[7, 3, 0] == first[7, 3, 1] == 'qqbank'
  assert first[8, 4, 0] not in ('qqbank', 'qqmail')


# IMDNA on the same demo sessions as a third source of 'rerank' candidates.
IMDNA_TINY = ('--config.data.source=demo', '--config.model.emb_dim=8',
              '--config.model.state_dim=8', '--config.model.hidden_units=16',
              '--config.imdna.num_documents=4', '--config.imdna.batch_size=16',
              '--config.train.max_steps=3')


@pytest.fixture(scope='module')
def imdna_run(tmp_path_factory):
  """A 3-step IMDNA on the generator's demo sessions (its vocabulary is its own)."""
  workdir = tmp_path_factory.mktemp('imdna')
  trained = cli.run(workdir, *FEW, *IMDNA_TINY, config='configs/imdna_aol.py')
  # Its pace in its own terms: a batch's rows are question slots, its 'tokens' questions.
  assert re.search(r' \d+ question slots/s \d+ questions/s, ', trained.stdout), trained.stdout
  return workdir


def next_queries_by_hand(library, documents, context, probabilities) -> list[str]:
  """In each retrieved session (best first), the queries after the first one sharing most
  words with the context's last query, each once and none of the context's; ranked by the
  mean probability of their words in the vocabulary (none known: 0), ties in that order."""
  last = set(context[-1].split())
  found = []
  for document in documents:
    if document < 0:
      continue
    queries = library.extra['document_queries'][document]
    overlaps = [len(last & set(q.split())) for q in queries]
    for query in queries[overlaps.index(max(overlaps)) + 1:]:
      if query not in context and query not in found:
        found.append(query)
  word_ids = {w: i for i, w in enumerate(library.vocab.words) if i >= len(SPECIAL_TOKENS)}

  def mean_probability(query):
    ids = [word_ids[w] for w in query.split() if w in word_ids]
    return sum(float(probabilities[i]) for i in ids) / len(ids) if ids else 0.0

  return sorted(found, key=lambda q: -mean_probability(q))


@pytest.mark.slow
def test_imdna_proposes_what_its_own_evaluation_ranks(imdna_run, rerank_run):
  """The proposer reads a context (its documents: BM25 over the training sessions, the
  user's own left out) exactly as IMDNA's training and evaluation do."""
  # pylint: disable=g-import-not-at-top
  from mtn_jax import inference
  from mtn_jax.data import sessions
  from mtn_jax.inference import imdna_proposer
  config = cli.config(*FEW, *IMDNA_TINY, name='imdna_aol')
  trained = inference.load_trained(config, str(imdna_run))
  proposer = imdna_proposer.NextQueryProposer(trained, str(imdna_run))
  library = proposer.library
  questions = library.splits['valid']
  contexts = library.extra['valid']['contexts']
  split = sessions.load_split(str(rerank_run[0] / 'data'), 'valid')  # the generator's
  session_of, position_of = split.pair_positions()
  assert contexts == [split.session_texts(i)[:t + 1] for i, t in zip(session_of, position_of)]
  probabilities = trained.task.answer_scores(trained.params, library, questions, 16)
  # The proposals worked out here from the evaluation's documents and probabilities (the
  # proposer's helpers have unit tests of their own in test_imdna.py).
  expected = [next_queries_by_hand(library, questions.documents[i], c, probabilities[i])[:3]
              for i, c in enumerate(contexts)]
  proposed = proposer.propose(contexts, 3, users=np.asarray(split.users)[session_of])
  assert proposed == expected
  assert sum(map(len, proposed)) > 0
  # Without the users a user's own training sessions may be read: other documents (these
  # validation users have training sessions among the documents).
  assert np.isin(split.users, library.extra['document_users']).any()
  assert proposer.propose(contexts, 3) != proposed


@pytest.mark.slow
def test_rerank_adds_imdna_next_queries(imdna_run, rerank_run, tmp_path):
  import shutil  # pylint: disable=g-import-not-at-top
  generator = tmp_path / 'generator'
  shutil.copytree(rerank_run[0], generator)
  poly = rerank_run[1]
  out = cli.run(generator, *FEW, '--config.suggest.strategy=rerank',
                f'--config.suggest.ranker_workdir={poly}', '--config.suggest.retrieved=0',
                '--config.suggest.imdna_proposed=3',
                f'--config.suggest.imdna_workdir={imdna_run}', mode='eval')
  assert 'IMDNA proposed next queries' in out.stdout
  results = json.loads((generator / 'eval' / 'rerank_first16_results.json').read_text())
  # retrieved=0: no pool entries, IMDNA's instead.
  assert set(results['scores']) == {'model', 'generate', 'imdna', *trivial.SUGGESTERS}
  strategy = results['strategy']
  assert strategy['imdna_workdir'] == str(imdna_run) and strategy['retrieved'] == 0
  assert 'beam 5 + IMDNA top 3 + session queries, scored by Poly-encoder' in strategy['label']
  # Every reranked suggestion is a beam hypothesis, one of IMDNA's next queries (logged
  # training queries, so pool entries) or a query of the session.
  beams = {(s['session'], s['position']): {c['query'] for c in s['suggestions']}
           for s in read_jsonl(rerank_run[0] / 'eval' / 'first16_samples.jsonl')}
  pool = pool_texts(poly)
  taken_from_imdna = 0
  for sample in read_jsonl(generator / 'eval' / 'rerank_first16_samples.jsonl'):
    beam = beams[(sample['session'], sample['position'])]
    queries = {s['query'] for s in sample['suggestions']}
    assert queries <= beam | pool | set(sample['context'])
    taken_from_imdna += len(queries - beam - set(sample['context']))
  assert taken_from_imdna > 0


# The habit rule at a rate the demo users reach: 4 of the test split's 24 contexts get a habit.
HABITS = ('--config.suggest.habit_rate=0.01', '--config.suggest.habit_min_past=1')


@pytest.mark.slow
def test_rerank_with_imdna_and_habits_decodes_what_eval_scored(imdna_run, rerank_run,
                                                               tmp_path):
  """Every rule of 'rerank' at once (the Poly-encoder's scores, IMDNA's next queries, a
  user's habit query first): eval's lists, for users, are what decode writes for a log of
  those users' sessions (under the user-facing protocol: see
  `assert_decode_writes_what_eval_scored`)."""
  import shutil  # pylint: disable=g-import-not-at-top
  from mtn_jax.data import sessions  # pylint: disable=g-import-not-at-top
  from mtn_jax.inference import habits  # pylint: disable=g-import-not-at-top
  generator = tmp_path / 'generator'
  shutil.copytree(rerank_run[0], generator)
  rerank = ('--config.suggest.strategy=rerank', f'--config.suggest.ranker_workdir={rerank_run[1]}',
            '--config.suggest.imdna_proposed=3', f'--config.suggest.imdna_workdir={imdna_run}',
            *HABITS)
  cli.run(generator, *FEW, *rerank, mode='eval')
  lists = generator / 'eval' / 'rerank_first16_lists.jsonl'
  # The habit rule decided some of these lists: where it names a query, that query is first.
  test = sessions.load_split(str(generator / 'data'), 'test')
  firsts = [[user.first(test.session_texts(i)[:t + 1], 0.01, 1)
             for t in range(test.lengths[i] - 1)]  # read before `carried` moves on
            for i, user in enumerate(habits.carried(
                habits.past_queries(str(generator / 'data'), test)))]
  habit_firsts = 0
  for pair in read_jsonl(lists):
    first = firsts[pair['session']][pair['position']]
    if first:
      habit_firsts += 1
      assert pair['suggestions'][0]['query'] == first
  assert habit_firsts > 0
  assert_raw_log_decode_writes_what_eval_scored(generator, lists, tmp_path, *FEW, *rerank,
                                                protocols=(True,))


@pytest.mark.slow
def test_imdna_of_other_sessions_is_refused(rerank_run, tmp_path):
  """Only the sessions matter: another vocabulary of the same sessions is the same corpus;
  another split of them is not (its documents could hold the sessions being scored)."""
  from mtn_jax.data import preprocess  # pylint: disable=g-import-not-at-top
  generator, poly, _ = rerank_run
  words = tmp_path / 'words'
  cli.run(words, '--config.data.min_word_count=3', mode='preprocess')
  assert preprocess.session_difference(str(generator / 'data'), str(words / 'data')) is None
  other = tmp_path / 'other'
  cli.run(other, '--config.data.split_seed=1', mode='preprocess')
  refused = cli.run(generator, *FEW, '--config.suggest.strategy=rerank',
                    f'--config.suggest.ranker_workdir={poly}',
                    f'--config.suggest.imdna_workdir={other}', mode='eval', check=False)
  assert refused.returncode == 1, refused.stderr[-3000:]
  assert 'Traceback' not in refused.stderr
  errors_ = [line for line in refused.stderr.splitlines() if line.startswith('error:')]
  assert len(errors_) == 1 and refused.stderr.rstrip().endswith(errors_[0])
  assert f'config.suggest.imdna_workdir={other}' in errors_[0]
  assert 'their train.text.txt differ' in errors_[0]


@pytest.mark.slow
def test_rerank_oracle_script_prints_each_choice(rerank_run):
  import subprocess  # pylint: disable=g-import-not-at-top
  generator, poly, _ = rerank_run
  result = subprocess.run(
      [sys.executable, 'experiments/rerank_oracle.py', '--config=configs/demo.py',
       f'--workdir={generator}', *cli.TINY, *FEW, '--config.decode.eval_split=valid',
       '--config.suggest.strategy=rerank', f'--config.suggest.ranker_workdir={poly}'],
      cwd=cli.REPO, env=cli.env(), capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  bleu = dict(re.findall(r'^  (\S.*?)\s+BLEU\s+([\d.]+)$', result.stdout, re.M))
  assert len(bleu) == 7, result.stdout
  figures = {name: float(value) for name, value in bleu.items()}
  # Knowing the reference, a choice among all candidates is at least as good as the ranker's.
  assert figures['oracle: any pooled candidate'] >= figures["the ranker's first choice"]
  assert 'is the previous query for' in result.stdout


@pytest.mark.slow
def test_graded_poly_encoder_with_lexical_negatives_trains_and_evaluates(tmp_path):
  """The real command line: the lexical neighbours reach the training and validation
  batches, and the trained ranker is evaluated on the pool."""
  graded = ('--config.model.session_candidates=True', '--config.model.lexical_negatives=4')
  run = lambda *args, mode='train': cli.run(tmp_path, *FEW, *graded, *args, mode=mode,
                                            config=RANKER_CONFIG)
  run('--config.train.max_steps=3')
  from mtn_jax.training import metric_writer  # pylint: disable=g-import-not-at-top
  valid = metric_writer.read_metrics(str(tmp_path), 'valid')
  assert valid and all(np.isfinite(r['loss']) for r in valid)
  assert {p.name for p in (tmp_path / 'data' / 'pool_bm25').glob('*.top_k.npz')} == {
      'train.top_k.npz', 'valid.top_k.npz'}
  run(mode='eval')
  results = json.loads((tmp_path / 'eval' / 'first16_results.json').read_text())
  assert results['pairs'] > 0 and '"r1_of_20"' in json.dumps(results)


# The protocols' keys in an eval list (exclude_session_queries=False, True).
BOTH_PROTOCOLS = (False, True)


def assert_decode_writes_what_eval_scored(workdir, lists_path, tmp_path, *overrides,
                                          config='configs/demo.py',
                                          protocols=BOTH_PROTOCOLS):
  """Every pair eval scored (its lists.jsonl), typed as a session whose last query is the
  pair's context, decoded under `protocols` (exclude_session_queries values; both by
  default): the same lists, the same scores; the user-facing lists hold no query of their
  session. A strategy orders its candidates whatever the protocol, which only filters the
  shown list (`Pipeline.show`): the strategies other than the generator's own and the
  learned one are decoded under one protocol each, the two between them."""
  pairs = read_jsonl(lists_path)
  assert pairs
  sessions_file = tmp_path / f'{lists_path.stem}.sessions.txt'
  sessions_file.write_text(''.join('\t'.join(p['context']) + '\n' for p in pairs))
  for exclude in protocols:
    key = 'suggestions_excluding_session' if exclude else 'suggestions'
    output = tmp_path / f'{lists_path.stem}.{key}.jsonl'
    cli.run(workdir, *FEW, *overrides, f'--config.decode.input={sessions_file}',
            f'--config.decode.output={output}',
            f'--config.decode.exclude_session_queries={exclude}', mode='decode', config=config)
    decoded = read_jsonl(output)
    assert [r['context'] for r in decoded] == [p['context'] for p in pairs]
    for record, pair in zip(decoded, pairs):
      assert_same_list(record['suggestions'], pair[key], (exclude, pair['context']), abs=1e-4)
  for pair in pairs:
    assert not {s['query'] for s in pair['suggestions_excluding_session']} & set(pair['context'])


@pytest.mark.slow
def test_generate_suggests_and_scores_what_the_code_before_the_move_did(rerank_run):
  """The generator (the same run as the record's: tiny sizes, 4 steps) is evaluated as the
  code before the role packages evaluated it, figure for figure and list for list, and its
  lists under both protocols are the ones that code's `--mode=decode` wrote for the same
  contexts (tests/golden.py)."""
  evaluated = rerank_run[0] / 'first_eval'
  golden.assert_unchanged_since_the_move('generate', evaluated)
  before = golden.before_move()['generate']
  pairs = read_jsonl(evaluated / 'eval' / 'first16_lists.jsonl')
  for exclude, key in ((False, 'suggestions'), (True, 'suggestions_excluding_session')):
    decoded = before[f'decode_exclude_{exclude}']
    assert [r['context'] for r in decoded] == [p['context'] for p in pairs]
    for record, pair in zip(decoded, pairs):
      expected, shown = record['suggestions'], pair[key]
      if exclude:  # golden.EMPTY_NOT_SHOWN: the record's list less its empty suggestion
        expected = [s for s in expected if s['query']]  # (then a hypothesis more, if any)
        shown = shown[:len(expected)]
      assert_same_list(expected, shown, (exclude, pair['context']), rel=golden.FLOAT_ROUNDING)


# The record's Poly-encoder (tests/golden.py): the demo ranker as it was before its scores were
# scaled, 6 steps in one go.
UNSCALED = ('--config.model.scaled_scores=False', '--config.train.max_steps=6')
# The record's strategies of a ranker (experiments/golden_outputs.py's).
RECORDED_STRATEGIES = ('retrieve', 'rerank', 'rerank_imdna', 'rerank_habits')


@pytest.fixture(scope='module')
def unscaled_poly(tmp_path_factory):
  """The record's Poly-encoder, trained and evaluated (its pool entries)."""
  workdir = tmp_path_factory.mktemp('poly-unscaled')
  cli.run(workdir, *FEW, *UNSCALED, config=RANKER_CONFIG)
  cli.run(workdir, *FEW, *UNSCALED, mode='eval', config=RANKER_CONFIG)
  return workdir


@pytest.mark.slow
@pytest.mark.parametrize('strategy', RECORDED_STRATEGIES)
def test_each_strategy_scores_what_the_code_before_the_move_did(strategy, rerank_run,
                                                                 unscaled_poly, imdna_run,
                                                                 tmp_path):
  """Retrieve, rerank, rerank with IMDNA's proposals and with habits, on the record's runs:
  eval's figures and lists are the record's (tests/golden.py)."""
  generator = tmp_path / 'generator'
  shutil.copytree(rerank_run[0], generator)
  record = golden.golden_outputs()
  cli.run(generator, *FEW, *record.strategies(unscaled_poly, imdna_run)[strategy], mode='eval')
  golden.assert_unchanged_since_the_move(strategy, generator, record.eval_prefix(strategy),
                                         ranker=True)


@pytest.mark.slow
def test_ranker_and_imdna_evaluate_as_the_code_before_the_move_did(unscaled_poly, imdna_run):
  """The Poly-encoder's own evaluation (its pool entries as suggestions) and IMDNA's (its
  answers) are the record's (tests/golden.py)."""
  golden.assert_unchanged_since_the_move('ranker', unscaled_poly, ranker=True)
  # The whole split, as the record holds it.
  cli.run(imdna_run, *FEW, *IMDNA_TINY, '--config.decode.max_eval_sessions=0', mode='eval',
          config='configs/imdna_aol.py')
  golden.assert_unchanged_since_the_move('imdna', imdna_run)


@pytest.mark.slow
def test_eval_scores_exactly_what_decode_writes(rerank_run, poly_run, tmp_path):
  """One pipeline: for retrieve, rerank (with the training log's popular and co-occurring
  queries among the sources) and blend, and a ranker's own pool entries, eval's scored lists
  are decode's output. (The generator's own: test_end_to_end.py's samples, decoded, and
  test_serving.py's suggestions, under the protocols both.)"""
  generator, poly, _ = rerank_run
  rerank = ('--config.suggest.strategy=rerank', f'--config.suggest.ranker_workdir={poly}',
            '--config.suggest.popular=3', '--config.suggest.cooccurring=3')
  cli.run(generator, *FEW, *rerank, mode='eval')
  results = json.loads((generator / 'eval' / 'rerank_first16_results.json').read_text())
  assert {'popular', 'cooccurring'} <= set(results['scores'])
  assert 'the 3 most popular + the 3 most co-occurring' in results['strategy']['label']
  assert_decode_writes_what_eval_scored(generator,
                                        generator / 'eval' / 'rerank_first16_lists.jsonl',
                                        tmp_path, *rerank, protocols=(True,))
  # The Poly-encoder's pool entries for the generator's sessions ('retrieve').
  retrieve = ('--config.suggest.strategy=retrieve', f'--config.suggest.ranker_workdir={poly}')
  cli.run(generator, *FEW, *retrieve, mode='eval')
  # Retrieved deep enough that top_k are shown once the session's queries are dropped.
  top_k = cli.config(*FEW, *retrieve).decode.top_k
  assert {len(p['suggestions_excluding_session'])
          for p in read_jsonl(generator / 'eval' / 'retrieve_first16_lists.jsonl')} == {top_k}
  assert_decode_writes_what_eval_scored(generator,
                                        generator / 'eval' / 'retrieve_first16_lists.jsonl',
                                        tmp_path, *retrieve, protocols=(False,))
  # The generator's beam blended with the training log's lists by quotas.
  blend = ('--config.suggest.strategy=blend',
           '--config.suggest.blend=popular:2,generate:2,cooccurring:2')
  evaluated = cli.run(generator, *FEW, *blend, mode='eval').stdout
  # Its co-occurring lists are the followers alone, named apart from the other strategies'.
  assert 'Co-occurring next queries alone (a source)' in evaluated
  assert 'then MPC (a source)' not in evaluated
  results = json.loads((generator / 'eval' / 'blend_first16_results.json').read_text())
  assert {'generate', 'popular', 'cooccurring'} <= set(results['scores'])
  assert results['strategy']['blend'] == 'popular:2,generate:2,cooccurring:2'
  lists = read_jsonl(generator / 'eval' / 'blend_first16_lists.jsonl')
  for pair in lists:  # the two most popular next queries the session does not hold, first
    shown = [s['query'] for s in pair['suggestions_excluding_session']]
    assert [s['source'] for s in pair['suggestions_excluding_session'][:2]] == ['popular'] * 2
    assert shown[:2] == [q for q in popular_order(generator) if q not in pair['context']][:2]
  assert_decode_writes_what_eval_scored(generator,
                                        generator / 'eval' / 'blend_first16_lists.jsonl',
                                        tmp_path, *blend, protocols=(True,))
  # The ranker's own pool entries ('generate' of a ranker).
  cli.run(poly_run[0], *FEW, mode='eval', config=RANKER_CONFIG)
  assert_decode_writes_what_eval_scored(poly_run[0], poly_run[0] / 'eval' / 'first16_lists.jsonl',
                                        tmp_path, config=RANKER_CONFIG)
