"""The pooling and ordering of 'rerank' (`mtn_jax.inference.pipeline.Rankers.order`), its
ranker replaced by given scores, and what is shown of it (`pipeline.show`)."""

from __future__ import annotations

import dataclasses
import math
import types

import numpy as np
import pytest
from sacrebleu.metrics import BLEU

from mtn_jax import tasks
from mtn_jax.inference import pipeline


def rankers_with_scores(scores: dict[str, float], use_mbr: bool) -> pipeline.Rankers:
  rankers = pipeline.Rankers(ranker=None, mbr=use_mbr)
  rankers.score_lists = lambda sessions, lists, batch_rows: [
      [np.asarray([scores[q] for q in texts], np.float32) for texts in session_lists]
      for session_lists in lists]
  return rankers


def expected_utilities(scores: dict[str, float]) -> dict[str, float]:
  """MBR's expected utility of each candidate against all of them as evidence, weighted by
  the softmax of their scores, with sacrebleu's sentence BLEU (add-one smoothing of orders 2
  to 4, words as given): an independent reference for `mbr.rerank`."""
  bleu = BLEU(tokenize='none', smooth_method='add-k', smooth_value=1, effective_order=True)
  total = sum(math.exp(s) for s in scores.values())
  return {c: sum(math.exp(s) / total * bleu.sentence_score(c, [h]).score / 100
                 for h, s in scores.items())
          for c in scores}


SESSION = ['cheap flights', 'cheap flights paris']
BEAM = [['cheap hotels'], ['cheap flights paris hotel', 'paris hotel', 'cheap flights paris']]
OTHER = [['flights'], ['cheap flights paris hotels']]
SCORES = {'cheap hotels': 0.5, 'flights': 0.1, 'cheap flights': 0.2,
          'cheap flights paris hotel': 2.0, 'paris hotel': 2.1,
          'cheap flights paris hotels': 1.9, 'cheap flights paris': 1.0}


def test_rerank_pools_deduplicates_and_orders_by_score():
  out = rankers_with_scores(SCORES, use_mbr=False).order([SESSION], [[BEAM], [OTHER]],
                                                         batch_rows=1)
  first, second = out[0]
  assert [c['query'] for c in first] == ['cheap hotels', 'cheap flights', 'flights']
  # 'cheap flights paris' is in the beam and the session: once. Best score first.
  assert [c['query'] for c in second] == ['paris hotel', 'cheap flights paris hotel',
                                          'cheap flights paris hotels', 'cheap flights paris',
                                          'cheap flights']
  excluded = pipeline.show(second, SESSION, True, top_k=10)
  assert [c['query'] for c in excluded] == ['paris hotel', 'cheap flights paris hotel',
                                            'cheap flights paris hotels']
  # The paper's protocol shows the first top_k, the session's queries among them.
  assert pipeline.show(second, SESSION, False, top_k=2) == second[:2]
  assert pipeline.show(second, SESSION, True, top_k=2) == excluded[:2]


def test_rerank_with_mbr_picks_the_consensus_of_the_rankers_distribution():
  ranked = rankers_with_scores(SCORES, use_mbr=False).order([SESSION], [[BEAM], [OTHER]],
                                                            batch_rows=1)[0][1]
  with_mbr = rankers_with_scores(SCORES, use_mbr=True).order([SESSION], [[BEAM], [OTHER]],
                                                             batch_rows=1)[0][1]
  # The second position's five candidates (the beam's, the other source's and the session's)
  # are the evidence; each is scored by its expected utility, best first.
  utilities = expected_utilities({c['query']: SCORES[c['query']] for c in ranked})
  assert [c['query'] for c in with_mbr] == [
      'cheap flights paris hotel', 'cheap flights paris', 'cheap flights paris hotels',
      'paris hotel', 'cheap flights']
  assert [c['score'] for c in with_mbr] == pytest.approx(
      [utilities[c['query']] for c in with_mbr], rel=1e-6)
  assert [c['model_score'] for c in with_mbr] == pytest.approx(
      [SCORES[c['query']] for c in with_mbr])
  # The best-scored 'paris hotel' shares little with the rest of the mass; the consensus of
  # the three 'cheap flights paris ...' candidates is chosen.
  assert ranked[0]['query'] == 'paris hotel'
  assert {c['query'] for c in with_mbr} == {c['query'] for c in ranked}


def test_what_is_shown_under_the_user_facing_protocol_is_the_order_with_the_session_dropped():
  # MBR's evidence is every candidate, the session's queries too, as in the generator's own
  # MBR: the user-facing list is that order with the session's queries dropped, then cut (to
  # 2 of the 3 left: 'paris hotel' is not shown).
  rankers = rankers_with_scores(SCORES, use_mbr=True)
  with_mbr = rankers.order([SESSION], [[BEAM], [OTHER]], batch_rows=1)[0][1]
  shown = pipeline.show(with_mbr, SESSION, True, top_k=2)
  utilities = expected_utilities({q: SCORES[q] for q in (
      'cheap flights paris hotel', 'paris hotel', 'cheap flights paris',
      'cheap flights paris hotels', 'cheap flights')})
  assert [c['query'] for c in shown] == ['cheap flights paris hotel', 'cheap flights paris hotels']
  assert [c['score'] for c in shown] == pytest.approx(
      [utilities[c['query']] for c in shown], rel=1e-6)


def test_rerank_keeps_the_generators_order_on_ties_and_pools_no_empty_text():
  """Candidates the ranker scores alike keep the order they were pooled in (the beam's
  first); an empty or blank candidate is never pooled, however a ranker would score it."""
  scores = {'b': 1.0, 'a': 1.0, 'c': 1.0, 'x': 0.5, '': 9.0, ' ': 9.0}
  out = rankers_with_scores(scores, use_mbr=False).order(
      [['x']], [[[['b', '', 'a', ' ']]], [[['c']]]], batch_rows=1)
  assert [c['query'] for c in out[0][0]] == ['b', 'a', 'c', 'x']
  # Enough ties that an unstable sort reorders them (numpy's default does past a few dozen
  # bytes): every one in its pooled order.
  tied = [f'q{i}' for i in range(24)]
  out = rankers_with_scores({**dict.fromkeys(tied, 1.0), 'x': 0.5}, use_mbr=False).order(
      [['x']], [[[['x', *tied]]]], batch_rows=1)
  assert [c['query'] for c in out[0][0]] == [*tied, 'x']


def test_each_position_shows_its_list_without_any_query_of_the_session_so_far(tmp_path):
  """`Pipeline.suggest`: after each output position the user-facing protocol drops every
  query of the session up to it (not the last alone), and only those."""
  from configs import default  # pylint: disable=g-import-not-at-top
  from mtn_jax.inference.inputs import Context  # pylint: disable=g-import-not-at-top
  config = default.get_config()
  config.suggest.strategy = 'generate'
  config.decode.exclude_session_queries = True
  config.decode.top_k = 10
  suggester = pipeline.Pipeline(pipeline.Settings.from_config(config), None, None, None, None,
                                None, str(tmp_path))
  ranked = [{'query': q, 'score': -float(i)} for i, q in enumerate(['a', 'b', 'c', 'd'])]
  suggester.ordered = lambda contexts, **_: [[ranked] * (len(c.queries) - c.first_output)
                                             for c in contexts]
  lists = suggester.suggest([Context(('a', 'b', 'c'), 0, {}), Context(('c', 'b'), 1, {})],
                            positions='all')
  assert [[[s['query'] for s in at] for at in by_context] for by_context in lists] == [
      [['b', 'c', 'd'], ['c', 'd'], ['d']], [['a', 'd']]]


def test_retrieve_keeps_top_k_after_the_session_queries_are_dropped(tmp_path, monkeypatch):
  """'retrieve' asks the ranker for enough pool entries that the user-facing list still holds
  top_k when the ranker's best are the session's own queries (dropped), and no more."""
  import types  # pylint: disable=g-import-not-at-top
  from configs import default  # pylint: disable=g-import-not-at-top
  from mtn_jax.inference import sources as sources_lib  # pylint: disable=g-import-not-at-top
  from mtn_jax.inference.inputs import Context  # pylint: disable=g-import-not-at-top
  config = default.get_config()
  config.suggest.strategy = 'retrieve'
  config.decode.exclude_session_queries = True
  config.decode.top_k = 3
  session = ('a', 'b', 'c', 'd')
  asked = []

  class RankedSessionFirst:
    """A ranker whose best entries are the session's queries, then the pool's others."""

    def __init__(self, retriever, k, history_queries):
      del retriever, history_queries
      self.k = k
      asked.append(k)

    def propose(self, contexts, **_):
      pool = [*reversed(session), *(f'p{i}' for i in range(20))]
      return [[[{'query': q, 'score': -float(i)} for i, q in enumerate(pool[:self.k])]]
              for _ in contexts]

  monkeypatch.setattr(sources_lib, 'Retrieve', RankedSessionFirst)
  ranker = types.SimpleNamespace(cfg=types.SimpleNamespace(max_session_queries=len(session)))
  suggester = pipeline.Pipeline(pipeline.Settings.from_config(config), ranker, ranker,
                                object(), None, None, str(tmp_path))
  shown = suggester.suggest([Context(session, len(session) - 1, {})], positions='last')
  assert [s['query'] for s in shown[0][0]] == ['p0', 'p1', 'p2']
  assert asked == [3 + len(session)]


def test_the_habit_rule_comes_last_and_moves_only_the_habit_query():
  """The habit query goes first of the final order (MBR's too), every other candidate in the
  order it had without the rule, those ranked above it included; a query the user has just
  typed is no habit query to suggest (the next most issued one is)."""
  habitual = ['bank', 'mail', 'bank', 'mail', 'bank']  # 3 hits of 4: 'bank', then 'mail'
  scores = {**SCORES, 'bank': 0.6, 'mail': 0.55}
  for use_mbr in (False, True):
    with_habit = rankers_with_scores(scores, use_mbr)
    with_habit.habit_rate, with_habit.habit_min_past = 0.5, 3
    got = with_habit.order([SESSION], [[BEAM], [OTHER]], batch_rows=1,
                           histories=[habitual])[0][1]
    # The same candidates without the rule: 'bank' pooled by a source instead.
    without = rankers_with_scores(scores, use_mbr).order(
        [SESSION], [[BEAM], [OTHER], [[[], ['bank']]]], batch_rows=1)[0][1]
    assert got[0]['query'] == 'bank'
    assert got == [*(c for c in without if c['query'] == 'bank'),
                   *(c for c in without if c['query'] != 'bank')]
  typed = ['cheap flights', 'bank']
  got = with_habit.order([typed], [[BEAM]], batch_rows=1, histories=[habitual])[0]
  assert [ranked[0]['query'] for ranked in got] == ['bank', 'mail']


def test_a_session_query_the_ranker_ties_with_a_sources_stands_after_it():
  """The session's queries are pooled after every source: on a tie of the ranker's scores
  the generator's candidate stands first."""
  out = rankers_with_scores({'b': 1.0, 'x': 1.0, 'y': 1.0}, use_mbr=False).order(
      [['x']], [[[['b']]], [[['y']]]], batch_rows=1)
  assert [c['query'] for c in out[0][0]] == ['b', 'y', 'x']


class ReadsTheSessionSoFar:
  """A stand-in ranker whose score of a candidate after position t is 100 times the sum of
  the word ids of query t, plus the sum of the candidate's word ids."""

  def score_candidates(self, params, batch, candidates):
    del params
    queries = batch['queries'][:, :-1]  # [rows, positions, words]: the padding query off
    return 100.0 * queries.sum(-1)[:, :, None] + candidates.sum(-1)


def test_the_ranker_scores_each_candidate_after_its_own_position():
  """`Rankers.score_lists`: the score after position t reads the session up to query t (not
  one query before or after), and each candidate's own score comes back in its list's
  order, whatever the padding of the candidates and of the sessions batched together."""
  from mtn_jax.data.vocab import Vocab  # pylint: disable=g-import-not-at-top
  vocab = Vocab.from_counts({w: 2 for w in 'a b c d e f'.split()}, 1)
  trained = types.SimpleNamespace(vocab=vocab, params={}, task=ReadsTheSessionSoFar(),
                                  cfg=types.SimpleNamespace(max_query_words=3))
  sessions_queries = [['a', 'b c', 'd'], ['e f'], ['c', 'a']]
  candidate_lists = [[['b'], ['c', 'd e'], []], [['a', 'f', 'b', 'c']], [['d'], ['e', 'a']]]
  got = pipeline.Rankers(trained).score_lists(sessions_queries, candidate_lists, batch_rows=2)
  ids = lambda text: sum(vocab.encode_text(text))
  for queries, lists, scores in zip(sessions_queries, candidate_lists, got):
    assert len(scores) == len(lists)
    for t, (texts, values) in enumerate(zip(lists, scores)):
      assert values.tolist() == [100.0 * ids(queries[t]) + ids(c) for c in texts]


class StandInSource:
  """A source proposing '<the query at that position> next' after each output position."""

  name = 'generate'

  def propose(self, contexts, *, positions, batch_rows, widths=None):
    del batch_rows, widths
    from mtn_jax.inference import sources  # pylint: disable=g-import-not-at-top
    return [[[{'query': f'{so_far[-1]} next', 'score': 0.0}] for so_far in session]
            for session in sources.sessions_so_far(contexts, positions)]


def test_rerank_of_contexts_pools_each_sources_list_at_its_own_position(tmp_path):
  """`Pipeline.ordered` with 'rerank': a context whose first output is not its first query
  gets, after each output position, the sources' candidates for that position."""
  from configs import default  # pylint: disable=g-import-not-at-top
  from mtn_jax.inference.inputs import Context  # pylint: disable=g-import-not-at-top
  config = default.get_config()
  suggester = pipeline.Pipeline(pipeline.Settings.from_config(config), None, None, None, None,
                                None, str(tmp_path))
  suggester.rankers = pipeline.Rankers(ranker=None)
  suggester.rankers.score_lists = lambda sessions, lists, batch_rows: [
      [np.asarray([float(q.endswith('next')) for q in texts], np.float32) for texts in by_t]
      for by_t in lists]
  suggester.rerank_sources = lambda: [StandInSource()]
  lists = suggester.ordered([Context(('a', 'b', 'c'), 1, {}), Context(('d',), 0, {})],
                            positions='all')
  assert [[[c['query'] for c in at] for at in by_context] for by_context in lists] == [
      [['b next', 'a', 'b'], ['c next', 'a', 'b', 'c']], [['d next', 'd']]]


def test_the_settings_read_each_key_of_the_config():
  """`Settings.from_config`: every setting from its own key (none another's), and the blend's
  plan kept for 'learned' as well, whose workdir without a ranker suggests by it."""
  from configs import default  # pylint: disable=g-import-not-at-top
  config = default.get_config()
  config.suggest.strategy = 'learned'
  config.suggest.session_first, config.suggest.unrelated_first = 4, 2
  config.suggest.ranker_workdir, config.suggest.retriever_workdir = '/ranker', '/retriever'
  config.suggest.popular, config.suggest.cooccurring = 3, 7
  config.suggest.retrieved, config.suggest.imdna_proposed = 11, 13
  config.suggest.past_queries, config.data.history_queries = 50, 0
  config.suggest.blend = 'generate:3,popular:2'
  s = pipeline.Settings.from_config(config)
  assert (s.session_first, s.unrelated_first) == (4, 2)
  assert (s.ranker_workdir, s.retriever_workdir) == ('/ranker', '/retriever')
  assert (s.popular, s.cooccurring, s.retrieved, s.imdna_proposed) == (3, 7, 11, 13)
  assert (s.past_queries, s.history_queries) == (50, 0)
  assert s.blend == (('generate', 3), ('popular', 2))


def generate_pipeline(tmp_path, **suggest):
  """A pipeline of the default config (the 'generate' strategy) with no model, its
  `config.suggest` keys set as given."""
  from configs import default  # pylint: disable=g-import-not-at-top
  config = default.get_config()
  for key, value in suggest.items():
    config.suggest[key] = value
  return pipeline.Pipeline(pipeline.Settings.from_config(config), None, None, None, None, None,
                           str(tmp_path))


def test_a_blend_of_contexts_reads_the_whole_session_and_is_scored_by_the_places_shown(
    tmp_path):
  """`Pipeline.suggest` with 'blend': the quotas leave out every query of the session so far
  (not the previous one alone), and what is shown is scored 1 / its place."""
  from mtn_jax.inference import popular  # pylint: disable=g-import-not-at-top
  from mtn_jax.inference.inputs import Context  # pylint: disable=g-import-not-at-top
  suggester = generate_pipeline(tmp_path)
  suggester.settings = dataclasses.replace(
      suggester.settings, strategy='blend', blend=pipeline.parse_blend('generate:2,popular:1'),
      search=dataclasses.replace(suggester.settings.search, top_k=3,
                                 exclude_session_queries=True))
  suggester.log_counts = popular.LogCounts.of_sessions([['s', 'p']])
  beam = [{'query': q, 'score': 0.0} for q in ('a', 'g1', 'g2', 'g3')]
  suggester._generate = lambda: types.SimpleNamespace(  # pylint: disable=protected-access
      propose=lambda contexts, **_: [[beam] * (len(c.queries) - c.first_output)
                                     for c in contexts])
  [[shown]] = suggester.suggest([Context(('a', 'b'), 1, {})], positions='all')
  assert [(c['query'], c['score']) for c in shown] == [('g1', 1), ('g2', 1 / 2), ('p', 1 / 3)]


def test_what_a_pipeline_reads_of_a_users_past(tmp_path):
  """`past_read`: the model's own history_queries, or `past_queries` where the habit rule or
  a learned ranker's source of the past reads it; `latest_past` keeps the latest of them."""
  habit = generate_pipeline(tmp_path, past_queries=2)
  habit.rankers = pipeline.Rankers(ranker=None, habit_rate=0.5)
  assert habit.past_read == 2 and habit.latest_past(('a', 'b', 'c')) == ('b', 'c')
  for names, read in ((['generate', 'history_about'], 2), (['generate', 'popular'], 0)):
    ranked = generate_pipeline(tmp_path, past_queries=2)
    ranked.learned_ranker = types.SimpleNamespace(source_names=names)
    assert ranked.past_read == read
  assert generate_pipeline(tmp_path, past_queries=2).latest_past(('a', 'b')) == ()


def test_the_rerank_sources_and_the_pool_depths(tmp_path, monkeypatch):
  """The sources of 'rerank' are the generator first, then the log's lists asked for (none
  of depth 0), the log's counts loaded where either one is; the pool depth is top_k plus a
  session's queries where the pool entries are the suggestions, `config.suggest.retrieved`
  where they are candidates to rerank."""
  from mtn_jax.inference import popular  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(popular.LogCounts, 'of_workdir', staticmethod(lambda workdir: 'counts'))
  settings = generate_pipeline(tmp_path, popular=0, cooccurring=3, retrieved=11).settings
  reranking = pipeline.Pipeline(settings, None, None, None, pipeline.Rankers(ranker=None), None,
                                str(tmp_path))
  sources = reranking.rerank_sources()
  assert [s.name for s in sources] == ['generate', 'cooccurring']
  assert sources[1].counts == 'counts' and sources[1].k == 3
  assert reranking.pool_depth() == 11
  generating = generate_pipeline(tmp_path)
  generating.suggester = types.SimpleNamespace(cfg=types.SimpleNamespace(max_session_queries=4))
  assert generating.pool_depth() == generating.settings.top_k + 4


def test_a_pipeline_shows_the_protocol_and_depth_it_is_asked_for(tmp_path):
  """`Pipeline.show` takes the protocol and top_k given (evaluation shows both protocols),
  its own where none is given."""
  suggester = generate_pipeline(tmp_path)
  ranked = [{'query': q, 'score': 0.0} for q in ('a', 'b', 'c', 'd')]
  own = suggester.settings.exclude_session_queries
  assert [c['query'] for c in suggester.show(ranked, ['a'], not own, 2)] == (
      ['a', 'b'] if own else ['b', 'c'])
  assert [c['query'] for c in suggester.show(ranked, ['a'], True, 1)] == ['b']
  assert [c['query'] for c in suggester.show(ranked, ['a'], True, 3)] == ['b', 'c', 'd']


def test_a_splits_rerank_sources_read_each_pairs_own_session_so_far(tmp_path):
  """`Pipeline.split_lists` with 'rerank': IMDNA is asked after each pair's whole session so
  far, for its session's user, and the ranker pools every source's candidates of that pair
  (not a neighbour's)."""
  from tests.test_popular import toy_split  # pylint: disable=g-import-not-at-top
  from mtn_jax.inference import popular  # pylint: disable=g-import-not-at-top
  split = toy_split(tmp_path)  # sessions [a b], [a c], [a b], [x b c], [y d]
  split = dataclasses.replace(split, users=np.arange(10, 15))
  suggester = generate_pipeline(tmp_path, popular=0, cooccurring=1)
  suggester.trained = types.SimpleNamespace(task=object())  # no beam of its own
  suggester.log_counts = popular.LogCounts(split)
  asked = []
  suggester.proposer = types.SimpleNamespace(
      propose=lambda contexts, k, users: asked.append(list(users)) or [
          ['/'.join(c)] for c in contexts])
  suggester.rankers = pipeline.Rankers(ranker=None)
  suggester.rankers.score_lists = lambda sessions, lists, batch_rows: [
      [np.asarray([len(q) for q in texts], np.float32) for texts in by_t] for by_t in lists]
  got = suggester.split_lists(split, queries_per_batch=8, log=lambda *a, **k: None)
  assert asked == [[10, 11, 12, 13, 13, 14]]  # each pair's own user, kept out of reach
  assert got.sources == {'imdna': [['a'], ['a'], ['a'], ['x'], ['x/b'], ['y']],
                         'cooccurring': [['b'], ['b'], ['b'], ['b'], ['c'], ['d']]}
  assert [[c['query'] for c in ranked] for ranked in got.ordered] == [
      ['a', 'b'], ['a', 'b'], ['a', 'b'], ['x', 'b'], ['x/b', 'c', 'x', 'b'], ['y', 'd']]


def test_the_learned_lists_are_the_rankers_order_scored_by_place(tmp_path, monkeypatch):
  """`Pipeline.ordered` with a learned ranker: the pool best first by the ranker's score,
  each suggestion scored 1 / its place, the ranker's own score kept as 'model_score'."""
  from mtn_jax.inference import learned  # pylint: disable=g-import-not-at-top
  from mtn_jax.inference import popular  # pylint: disable=g-import-not-at-top
  from mtn_jax.inference.inputs import Context  # pylint: disable=g-import-not-at-top
  texts = ['a', 'b', 'c']
  pool = types.SimpleNamespace(texts=texts, features=np.asarray([[0.2], [0.9], [0.5]]))
  monkeypatch.setattr(learned, 'lists_and_features', lambda *a, **k: (
      {'generate': [[[{'query': q} for q in texts]]]}, [[pool]]))
  suggester = generate_pipeline(tmp_path, session_first=0, attested_only=False)
  suggester.learned_ranker = types.SimpleNamespace(scores=lambda x: x[:, 0],
                                                   source_names=['generate'])
  suggester.log_counts = popular.LogCounts.of_sessions([])
  [[ranked]] = suggester.ordered([Context(('q',), 0, {})], positions='last')
  assert [(c['query'], c['score'], c['model_score'], c['sources']) for c in ranked] == [
      ('b', 1, 0.9, ['generate']), ('c', 1 / 2, 0.5, ['generate']),
      ('a', 1 / 3, 0.2, ['generate'])]


def test_a_ranker_of_another_vocabulary_is_refused_naming_both_workdirs(tmp_path):
  """...and the `config.data` settings their corpora were built with that differ, where
  both corpora record them (two demo configs of other sizes, say)."""
  import json  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  from mtn_jax import errors  # pylint: disable=g-import-not-at-top
  from mtn_jax.data.vocab import Vocab  # pylint: disable=g-import-not-at-top
  ours, other = (Vocab.from_counts({w: 2 for w in words}, 1) for words in ('ab', 'ac'))
  assert ours.kind == other.kind and ours.fingerprint != other.fingerprint
  check = pipeline._check_vocab  # pylint: disable=protected-access
  ranker, run = str(tmp_path / 'ranker'), str(tmp_path / 'run')
  with pytest.raises(errors.Error, match=r'ranker_workdir=\S+/ranker: .* is not the one of '
                     r'\S+/run \(.*\): train the ranker on the same corpus'):
    check(types.SimpleNamespace(vocab=other), ours, 'ranker_workdir', ranker, run)
  for workdir, users in ((ranker, 600), (run, 1500)):
    (tmp_path / workdir / 'data').mkdir(parents=True)
    (tmp_path / workdir / 'data' / 'manifest.json').write_text(json.dumps(
        {'data_config': {'demo_users': users, 'min_count': 1, 'raw_files': workdir}}))
  with pytest.raises(errors.Error, match=re.escape(
      ', their corpora built with other settings (config.data.demo_users: 600 there, 1500 '
      'here): train the ranker')):
    check(types.SimpleNamespace(vocab=other), ours, 'ranker_workdir', ranker, run)
  check(types.SimpleNamespace(vocab=ours), ours, 'ranker_workdir', ranker, run)


def test_a_ranker_workdir_without_checkpoints_is_named_as_the_setting_at_fault(tmp_path):
  """An empty folder, or a trained ranker's checkpoints/ folder given for its workdir, is
  refused naming config.suggest.ranker_workdir (not "train first", which reads as this run's
  own workdir), and the folder that would do where there is one."""
  import re  # pylint: disable=g-import-not-at-top
  from configs import demo  # pylint: disable=g-import-not-at-top
  from mtn_jax import errors  # pylint: disable=g-import-not-at-top
  load = pipeline._load  # pylint: disable=protected-access
  (tmp_path / 'empty').mkdir()
  with pytest.raises(errors.Error, match=re.escape(
      f'config.suggest.ranker_workdir={tmp_path}/empty: no checkpoints there (the workdir of a '
      'trained Bi-, Poly- or Cross-encoder run, which holds checkpoints/)') + '$'):
    load(demo.get_config(), str(tmp_path / 'empty'), 'ranker_workdir')
  (tmp_path / 'ranker' / 'checkpoints' / '90').mkdir(parents=True)
  with pytest.raises(errors.Error, match=re.escape(
      f'which holds checkpoints/); {tmp_path}/ranker holds them: name it')):
    load(demo.get_config(), str(tmp_path / 'ranker' / 'checkpoints'), 'ranker_workdir')


def test_a_blend_that_leaves_the_beam_no_place_is_noted(tmp_path, monkeypatch):
  """Quotas of the log's lists that fill `config.decode.top_k` before the beam (or a plan
  with no beam) are noted when the pipeline loads; every config's own blend leaves the beam
  a place."""
  from configs import aol, default, demo  # pylint: disable=g-import-not-at-top
  assert [pipeline.beam_place(pipeline.parse_blend(plan)) for plan in (
      'popular:5,generate:10', 'generate:2,popular:1', 'popular:3,cooccurring:5,generate:10',
      'popular:5')] == [5, 0, 8, None]
  for config in (default.get_config(), demo.get_config(), aol.get_config('small')):
    assert pipeline.beam_place(pipeline.parse_blend(config.suggest.blend)) < (
        config.decode.top_k), config.suggest.blend
  monkeypatch.setattr(pipeline.popular.LogCounts, 'of_workdir', lambda workdir: None)
  suggests = types.SimpleNamespace(task=object.__new__(type('Stub', (tasks.Suggests,), {})))
  for plan, noted in (('popular:5,generate:10', True), ('popular:4,generate:10', False),
                      ('popular:2', True)):
    config = default.get_config()
    config.suggest.strategy, config.suggest.blend, config.decode.top_k = 'blend', plan, 5
    said = []
    pipeline.Pipeline.load(config, str(tmp_path), log=said.append, trained=suggests)
    assert said == ([f"Note: config.suggest.blend='{plan}' leaves the beam no place of the 5 "
                     "shown (config.decode.top_k) where the training log's lists fill their "
                     'quotas.'] if noted else []), plan


def test_an_imdna_run_without_sessions_is_named_for_what_it_is(tmp_path):
  """A movies run (its data folder holds a knowledge base, no corpus of sessions) given as
  config.suggest.imdna_workdir: refused naming the kind of run that serves there."""
  import re  # pylint: disable=g-import-not-at-top
  from mtn_jax import errors  # pylint: disable=g-import-not-at-top
  (tmp_path / 'movies' / 'data').mkdir(parents=True)
  (tmp_path / 'movies' / 'data' / 'movies.documents.txt').write_text('a movie\n')
  with pytest.raises(errors.Error, match=re.escape(
      f'config.suggest.imdna_workdir={tmp_path}/movies: no corpus of sessions in '
      f'{tmp_path}/movies/data (a configs/imdna_aol.py run trained on the sessions of '
      f'{tmp_path}/run; a configs/imdna_movies.py run answers questions on movies)')):
    pipeline._check_sessions(  # pylint: disable=protected-access
        str(tmp_path / 'movies'), str(tmp_path / 'run'))
