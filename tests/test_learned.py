"""The learned ranker's parts by hand on a toy log: reformulation templates, each candidate
source, one candidate's features, what is shown, the ranker's training on a problem whose right
order is known, and the refusal of a ranker trained for another checkpoint."""

import dataclasses
import json
import math
import os
import re
import types

import numpy as np
import pytest

from mtn_jax import errors
from mtn_jax.data.vocab import Vocab
from mtn_jax.decoding import search
from mtn_jax.inference import learned
from mtn_jax.inference import learned_training
from mtn_jax.inference import pipeline
from mtn_jax.inference import popular
from mtn_jax.inference import presentation
from mtn_jax.inference import sources
from mtn_jax.inference import subjects
from mtn_jax.inference import teacher_forcing
from mtn_jax.inference import templates
from mtn_jax.inference.inputs import Context

# (previous -> next) pairs: 'weather' gains 'chicago' twice (once after 'news'), a site form, a
# dropped word, a substitution twice.
SESSIONS = [
    ['weather', 'weather chicago', 'weather chicago il'],
    ['news', 'news chicago'],
    ['ebay', 'ebay.com'],
    ['cheap flights', 'cheap hotels', 'cheap'],
    ['cheap cars', 'cheap hotels'],
    ['google', 'ebay'],
    ['google', 'ebay'],
]


def test_templates_by_hand():
  assert templates.templates_of('weather', 'weather chicago') == ['append:chicago']
  assert templates.templates_of('chicago', 'weather chicago') == ['prepend:weather']
  assert templates.templates_of('cheap flights', 'cheap hotels') == [
      'substitute:flights>hotels']
  assert templates.templates_of('ebay', 'ebay.com') == ['dotcom']
  assert templates.templates_of('ebay', 'www.ebay.com') == ['www']
  assert templates.templates_of('www.ebay.com', 'ebay') == ['strip_site']
  assert templates.templates_of('e bay', 'ebay') == ['join']
  assert set(templates.templates_of('cheap hotels', 'cheap')) == {'drop_last'}
  assert templates.templates_of('google', 'ebay') == []  # another query, not an edit
  assert templates.templates_of('a', 'a') == []
  # One word added to a query of that word alone is both an append and a prepend.
  assert templates.templates_of('la la', 'la la la') == ['append:la', 'prepend:la']
  # Counted over pairs, kept from two occurrences on.
  learnt = templates.Templates.learn(
      (s[t], s[t + 1]) for s in SESSIONS for t in range(len(s) - 1))
  assert learnt.total == 9
  # append:chicago 2 (weather, news), substitute:*>hotels once each; dotcom once.
  assert learnt.counts == {'append:chicago': 2}
  assert learnt.propose('sports', 3) == [('sports chicago', 'append:chicago', 2)]
  assert learnt.propose('weather chicago', 3) == []  # chicago is there already
  every = templates.Templates.learn(
      [(s[t], s[t + 1]) for s in SESSIONS for t in range(len(s) - 1)], min_count=1)
  # Most frequent first, then by name: append:chicago (2), then each once, alphabetically.
  assert every.propose('cheap cars', 10) == [
      ('cheap cars chicago', 'append:chicago', 2),
      ('cheap cars il', 'append:il', 1),
      ('cheapcars.com', 'dotcom', 1),
      ('cheap', 'drop_last', 1),
      ('cheap hotels', 'substitute:cars>hotels', 1)]


def test_a_site_is_not_made_a_site_again_and_only_a_one_word_site_is_stripped():
  """'ebay.com' is already an address: no 'ebay.com.com' nor 'www.ebay.com.com' is proposed
  after it; and 'www.' / '.com' come off a one-word query only ('buy on ebay.com' is no
  site to strip)."""
  assert dict(templates.edits('ebay.com')) == {'strip_site': 'ebay'}
  assert dict(templates.edits('www.ebay.com')) == {'strip_site': 'ebay'}
  assert dict(templates.edits('buy ebay.com')) == {
      'drop_last': 'buy', 'drop_first': 'ebay.com', 'join': 'buyebay.com'}
  # Only what can name a site is made one: ASCII letters, digits, hyphens and dots, at most
  # a DNS label's 63 characters.
  assert 'dotcom' in dict(templates.edits('nj 12')) and 'www' in dict(templates.edits('a-b'))
  for not_a_name in ('<b>hi</b>', '東京 天気', 'pizza 🍕', "macy's", 'a' * 64, '.ebay'):
    assert not {'dotcom', 'www'} & set(dict(templates.edits(not_a_name))), not_a_name
  assert dict(templates.edits('a' * 63))['www'] == f'www.{"a" * 63}.com'
  # .org and .net sites alike.
  assert dict(templates.edits('wikipedia.org')) == {'strip_site': 'wikipedia'}
  assert templates.templates_of('www.python.net', 'python') == ['strip_site']


def test_templates_propose_each_text_once_at_most_k_and_no_substitution_in_one_word():
  assert templates.Templates({'substitute:flights>hotels': 2}, 2).propose('flights', 5) == []
  # 'la la' without its last word and without its first are one text, proposed once.
  assert templates.Templates({'drop_last': 3, 'drop_first': 2}, 5).propose('la la', 5) == [
      ('la', 'drop_last', 3)]
  learnt = templates.Templates({'append:a': 3, 'append:b': 2, 'append:c': 1}, 6)
  assert learnt.propose('q', 2) == [('q a', 'append:a', 3), ('q b', 'append:b', 2)]
  # The 200 most frequent templates of a kind are kept by default (a deep source needs them).
  many = templates.Templates({f'append:w{i:03d}': 2 for i in range(250)}, 500)
  assert len(many.propose('q', 300)) == 200


def test_a_query_rewritten_in_every_word_is_no_substitution():
  """Only one word swapped is a substitution: 'cheap flights' -> 'new york' is another
  query, and counting it as 'substitute:cheap>new' would propose 'new flights' later."""
  assert templates.templates_of('cheap flights', 'new york') == []
  assert templates.templates_of('cheap flights to paris', 'new flights to rome') == []


def test_a_template_never_writes_a_word_twice():
  """An append or a prepend whose word the query already holds, or a substitution whose new
  word it holds, does not apply: 'weather weather news', 'chicago weather chicago' and
  'cheap hotels hotels' are no suggestions."""
  learnt = templates.Templates(
      {'prepend:weather': 3, 'substitute:flights>hotels': 2}, 5)
  assert learnt.propose('weather news', 5) == []
  assert learnt.propose('cheap flights hotels', 5) == [('weather cheap flights hotels',
                                                         'prepend:weather', 3)]
  assert learnt.propose('cheap flights', 5) == [
      ('weather cheap flights', 'prepend:weather', 3),
      ('cheap hotels', 'substitute:flights>hotels', 2)]
  # A template that does not apply leaves the less frequent ones to apply.
  assert learnt.propose('weather cheap flights', 5) == [
      ('weather cheap hotels', 'substitute:flights>hotels', 2)]
  # Wherever the query holds the word, not only at the end it would be written at.
  learnt = templates.Templates({'append:chicago': 3, 'prepend:news': 2, 'drop_last': 1}, 6)
  assert learnt.propose('chicago weather', 5) == [('news chicago weather', 'prepend:news', 2),
                                                  ('chicago', 'drop_last', 1)]
  assert learnt.propose('weather news today', 5) == [
      ('weather news today chicago', 'append:chicago', 3),
      ('weather news', 'drop_last', 1)]


def test_templates_of_equal_count_are_proposed_in_the_order_of_their_names():
  """A tie goes to the template's name, whatever kind it is and whichever word of the
  query it substitutes: the same query gets the same list on every run (set order of the
  query's words varies with the interpreter's hash seed)."""
  learnt = templates.Templates(
      {'www': 2, 'substitute:flights>hotels': 2, 'substitute:cheap>free': 2}, 6)
  assert learnt.propose('cheap flights', 3) == [
      ('free flights', 'substitute:cheap>free', 2),
      ('cheap hotels', 'substitute:flights>hotels', 2),
      ('www.cheapflights.com', 'www', 2)]


def test_keep_per_kind_keeps_the_most_frequent_appends():
  """Any query gets the `keep_per_kind` most frequent appends (and prepends), not the first
  counted nor one more: here 'b' (3) and 'c' (2), not 'a' (1)."""
  learnt = templates.Templates(
      {'append:a': 1, 'append:b': 3, 'append:c': 2, 'prepend:x': 1}, 7, keep_per_kind=2)
  assert list(learnt.counts) == ['append:b', 'append:c', 'append:a', 'prepend:x']
  assert learnt.propose('q', 10) == [('q b', 'append:b', 3), ('q c', 'append:c', 2),
                                     ('x q', 'prepend:x', 1)]


@pytest.fixture(name='counts')
def _counts():
  return popular.LogCounts.of_sessions(SESSIONS)


def contexts():
  # Two positions of one context (after 'news', after 'weather'), one of another.
  return [Context(('news', 'weather'), 0, {}), Context(('cheap cars',), 0, {})]


def texts(lists):
  return [[[c['query'] for c in at] for at in by_context] for by_context in lists]


def test_log_sources_by_hand(counts):
  # Next queries logged: ebay 2, weather chicago, weather chicago il, news chicago, ebay.com,
  # cheap hotels 2, cheap 1: most popular first, ties to the first seen.
  assert counts.popular[:3] == ['cheap hotels', 'ebay', 'weather chicago']
  got = sources.Popular(counts, 2).propose(contexts(), positions='all')
  assert texts(got) == [[['cheap hotels', 'ebay']] * 2, [['cheap hotels', 'ebay']]]
  assert got[0][0][0]['score'] == 2.0
  # After 'weather': 'weather chicago' (once), then the popular list fills up.
  got = sources.Cooccurring(counts, 2).propose(contexts(), positions='last')
  assert texts(got) == [[['weather chicago', 'cheap hotels']], [['cheap hotels', 'ebay']]]
  assert [c['score'] for c in got[0][0]] == [1.0, 0.0]
  got = sources.Templates(counts.templates, 5).propose(contexts(), positions='all')
  assert texts(got) == [[['news chicago'], ['weather chicago']], [['cheap cars chicago']]]
  assert got[1][0][0]['template'] == 'append:chicago' and got[1][0][0]['score'] == 2.0
  # BM25 over the logged next queries: the shorter of two equal matches first, a rare word
  # outweighs a common one, the previous query itself left out, nothing without a shared word.
  matching = sources.Matching(counts, 2)
  got = matching.propose(contexts(), positions='all')
  assert texts(got) == [[['news chicago'], ['weather chicago', 'weather chicago il']],
                        [['cheap', 'cheap hotels']]]
  assert got[0][1][0]['score'] > got[0][1][1]['score'] > 0
  got = matching.propose([Context(('weather chicago',), 0, {}), Context(('zzz',), 0, {})],
                         positions='last')
  assert texts(got) == [[['weather chicago il', 'news chicago']], [[]]]
  # k of them where the previous query is not among the best (k + 1 are searched).
  assert texts(sources.Matching(counts, 1).propose([Context(('cheap cars',), 0, {})],
                                                   positions='last')) == [[['cheap']]]
  got = sources.Session().propose([Context(('a', 'b', 'a'), 1, {})], positions='all')
  assert texts(got) == [[['b', 'a'], ['a', 'b']]]
  ran = sources.propose_all([sources.Session(), sources.Popular(counts, 1)], contexts(),
                            positions='last', batch_rows=1)
  assert list(ran) == ['session', 'popular']
  assert texts(ran['session']) == [[['weather', 'news']], [['cheap cars']]]
  assert texts(ran['popular']) == [[['cheap hotels']], [['cheap hotels']]]


@pytest.mark.parametrize('name', list(sources.LOG_SOURCES))
def test_every_source_of_the_log_keeps_the_protocol(counts, name):
  """What the pipeline and the learned ranker rely on of a source, for each one (a new one
  too): it is named as its plan names it, lists each query once with a number for its
  score, and proposes the user's past exactly where it says so (`proposes_past`), so that
  every mode hands the past over to it."""
  source = sources.LOG_SOURCES[name](counts, 3)
  assert isinstance(source, sources.Source) and source.name == name
  past = ('weather chicago', 'weather radar', 'cheap hotels', 'weather radar')
  sessions_so_far = [('news', 'weather'), ('cheap cars',), ('weather', 'weather chicago')]
  with_past = source.propose([Context(s, 0, {}, history=past) for s in sessions_so_far],
                             positions='all', batch_rows=1)
  without = source.propose([Context(s, 0, {}) for s in sessions_so_far], positions='all',
                           batch_rows=1)
  assert (with_past != without) == source.proposes_past
  assert (name in sources.PAST_SOURCES) == source.proposes_past
  for lists in with_past:
    for candidates in lists:
      assert len({c['query'] for c in candidates}) == len(candidates)
      assert all(isinstance(c['query'], str) and isinstance(c['score'], float)
                 for c in candidates)


def test_two_sources_of_one_name_are_refused(counts):
  """A name keys a source's lists (and its features): a second of the same name would
  silently take the first one's place."""

  class Renamed(sources.Cooccurring):
    pass

  with pytest.raises(ValueError, match='two candidate sources share a name'):
    sources.propose_all([sources.Cooccurring(counts, 2), Renamed(counts, 2)], contexts(),
                        positions='last', batch_rows=1)


def test_the_users_own_earlier_queries_by_hand():
  # Issued: 'mail' 3 times, 'bank' and 'weather news' twice ('weather news' latest), 'maps' once.
  past = ('mail', 'bank', 'weather news', 'mail', 'maps', 'bank', 'mail', 'weather news')
  history = sources.History(3)
  got = history.propose([Context(('news', 'weather news', 'mail'), 0, {}, history=past)],
                        positions='all')
  # The session's queries so far are left out at each position, and the next one fills in.
  assert texts(got) == [[['mail', 'weather news', 'bank'], ['mail', 'bank', 'maps'],
                         ['bank', 'maps']]]
  assert [c['score'] for c in got[0][0]] == [3.0, 2.0, 2.0]
  # No history (a sessions file, a request naming no user): nothing.
  assert texts(history.propose([Context(('news',), 0, {})], positions='last')) == [[[]]]
  assert 'history' in sources.NAMES and learned.parse_sources('generate:5,history:3')
  # Only those about the session so far: sharing a word with it ('weather news' after 'news'),
  # a site standing for its name ('mail.com' once 'mail' is typed); not a lone word of it
  # ('mail', typed, is left out as a query of the session; 'bank' shares nothing).
  about = sources.HistoryAbout(3)
  got = about.propose([Context(('news', 'mail'), 0, {}, history=past + ('mail.com',))],
                      positions='all')
  assert texts(got) == [[['weather news'], ['weather news', 'mail.com']]]
  assert 'history_about' in sources.NAMES
  # A tie goes to the query issued last ('a' twice, last at 3; 'b' twice, last at 2).
  got = history.propose([Context(('x',), 0, {}, history=('a', 'b', 'b', 'a'))], positions='last')
  assert texts(got) == [[['a', 'b']]]


def test_the_history_sources_by_their_config_names(counts):
  # 'bank' and 'weather news' issued once each, 'weather news' last; only it is about 'news'.
  made = {name: sources.LOG_SOURCES[name](counts, 3)
          for name in ('history', 'history_about')}
  context = [Context(('news',), 0, {}, history=('bank', 'weather news'))]
  assert texts(made['history'].propose(context, positions='last')) == [[['weather news', 'bank']]]
  assert texts(made['history_about'].propose(context, positions='last')) == [[['weather news']]]
  assert [made[name].name for name in made] == ['history', 'history_about']


def test_contexts_without_a_past_are_the_groups_without_the_history_source():
  names = learned.feature_names(['generate', 'history'])
  column = {n: i for i, n in enumerate(names)}

  def rows(sources_of):  # each candidate's features its own values, its sources' ranks, count
    x = 1 + np.random.default_rng(len(sources_of)).random((len(sources_of), len(names)),
                                                          np.float32)
    for i, found in enumerate(sources_of):
      for name in ('generate', 'history'):
        if name not in found:
          x[i, [column[f'{name}_rank'], column[f'{name}_score']]] = np.nan
      x[i, column['num_sources']] = len(found)
    return x

  # Group 0: 'a' from both, 'b' from the past alone, 'c' (the next query) from the beam alone.
  # Group 1: the next query 'd' from the past alone. Group 2: no rows (held no next query).
  groups = learned_training.Groups(
      np.concatenate([rows([('generate', 'history'), ('history',), ('generate',)]),
                      rows([('history',), ('generate',)])]),
      np.array([0, 0, 1, 1, 0], np.int32), np.array([3, 2, 0]), np.array([0, 1, 1]),
      [['a', 'b', 'c'], ['d', 'e'], []], ['c', 'd', 'z'], [('s',), ('t',), ('u',)],
      [{'generate': ['a', 'c'], 'history': ['a', 'b']}, {'generate': ['e'], 'history': ['d']},
       {'generate': [], 'history': []}])
  bare = learned_training.without_history(groups, names)
  assert bare.texts == [['a', 'c'], [], []] and bare.sizes.tolist() == [2, 0, 0]
  assert bare.labels.tolist() == [0, 1] and bare.references == groups.references
  assert bare.lists == [{'generate': ['a', 'c']}, {'generate': ['e']}, {'generate': []}]
  assert np.isnan(bare.features[:, [column['history_rank'], column['history_score']]]).all()
  assert bare.features[:, column['num_sources']].tolist() == [1, 1]
  # The rest of a kept candidate's row ('a', 'c': rows 0 and 2 of group 0) as it was.
  kept = [i for i, n in enumerate(names) if not n.startswith('history') and n != 'num_sources']
  np.testing.assert_array_equal(bare.features[:, kept], groups.features[[0, 2]][:, kept])
  assert groups.features[0, column['num_sources']] == 2  # the groups themselves unchanged
  both = learned_training.learning_groups(groups, names)
  assert both.sizes.tolist() == [3, 2, 0, 2, 0, 0] and both.folds.tolist() == [0, 1, 1] * 2
  plain = learned.feature_names(['generate'])
  assert learned_training.learning_groups(groups, plain) is groups  # no history source: as it is
  # The past's queries about the session are the user's past too.
  names = learned.feature_names(['generate', 'history_about'])
  about = learned_training.Groups(np.ones((2, len(names)), np.float32), np.array([0, 1], np.int32),
                         np.array([2]), np.array([0]), [['a', 'b']], ['b'], [('s',)],
                         [{'generate': ['a'], 'history_about': ['b']}])
  bare = learned_training.without_history(about, names)
  assert bare.sizes.tolist() == [0] and bare.lists == [{'generate': ['a']}]


def test_imdna_proposals_keep_each_users_own_sessions_out_of_reach():
  """IMDNA's source hands the proposer each context's user (the proposer then leaves that
  user's training sessions out of its documents); where a context names no user, none."""
  asked = []

  class Proposer:
    def propose(self, sessions, k, users=None):
      asked.append(([list(s) for s in sessions], users))
      return [[f'{s[-1]} {i}' for i in range(k)] for s in sessions]

  source = sources.IMDNA(Proposer(), 2)
  got = source.propose([Context(('a', 'b'), 0, {'user': 7}), Context(('c',), 0, {'user': 3})],
                       positions='all', batch_rows=1)
  assert asked[-1] == ([['a'], ['a', 'b'], ['c']], [7, 7, 3])
  assert texts(got) == [[['a 0', 'a 1'], ['b 0', 'b 1']], [['c 0', 'c 1']]]
  assert [c['score'] for c in got[0][0]] == [-1, -2]
  source.propose([Context(('a',), 0, {'user': 7}), Context(('c',), 0, {})], positions='last',
                 batch_rows=1)
  assert asked[-1][1] is None


def test_a_split_is_proposed_a_session_length_at_a_time():
  """Evaluation's executor: each session length's contexts in batches of
  `queries_per_batch // length` rows (rounded up to the devices' multiple), the lists
  returned in the contexts' order."""
  lengths = (2, 1, 2, 3, 1, 2)
  contexts = [Context(('q',) * n, 0, {'n': i}) for i, n in enumerate(lengths)]
  calls = []
  def propose(group, rows):
    calls.append(([len(c.queries) for c in group], rows))
    return [c.info['n'] for c in group]
  out = sources.by_session_length(propose, contexts, queries_per_batch=4, multiple_of=2)
  assert out == list(range(len(lengths)))
  assert calls == [([1, 1], 4), ([2, 2], 2), ([2], 2), ([3], 2)]


def test_one_candidates_features_by_hand(counts):
  vocab = Vocab.from_counts({'weather': 9, 'chicago': 9}, 1)
  by_source = {'generate': [{'query': 'weather chicago', 'score': -0.5},
                            {'query': 'weather news', 'score': -0.9}],
               'popular': [{'query': 'ebay', 'score': 2.0},
                           {'query': 'weather chicago', 'score': 1.0}],
               'templates': [{'query': 'weather chicago', 'score': 2.0}]}
  names = ['generate', 'popular', 'templates']
  texts_ = learned.pool_texts(by_source, ('news', 'weather'), drop_session=True)
  assert texts_ == ['weather chicago', 'weather news', 'ebay']
  generator = np.array([[-3.0, -1.0], [-6.0, -2.0], [-9.0, -4.5]], np.float32)
  matrix = learned.features(texts_, by_source, ('news', 'weather'), 1, counts, generator,
                            names, vocab)
  row = dict(zip(learned.feature_names(names), matrix[0].tolist()))
  nan = float('nan')
  expected = {
      'generate_rank': 1, 'generate_score': -0.5, 'popular_rank': 2, 'popular_score': 1.0,
      'templates_rank': 1, 'templates_score': 2.0, 'num_sources': 3,
      'generator_log_prob': -3.0, 'generator_token_log_prob': -1.0, 'unknown_words': 0,
      'logged': 1, 'unseen_bigrams': 0,
      # Bigrams of the 9 logged next queries: (<s>, weather) 2, (weather, chicago) 2,
      # (chicago, </s>) 2 (news chicago too); '<s>' starts 9 bigrams, 'weather' 2, 'chicago' 3.
      'bigram_log_prob': (math.log(2.1 / 10) + math.log(2.1 / 3) + math.log(2.1 / 4)) / 3,
      'min_bigram_count': math.log1p(2),
      # 9 pairs; 'weather chicago' logged once; after 'weather' 1 of 1 pairs.
      'popularity': math.log(2) - math.log(10), 'cooccurrence': math.log(2) - math.log(2),
      'previous_followed': math.log1p(1),
      'template_frequency': math.log(3) - math.log(10),
      'shares_previous': 1, 'overlap_previous': 1 / 2, 'overlap_session': 1 / 2,
      'extends_previous': 1, 'words': 2, 'characters': 15, 'position': 1,
      'previous_words': 1}
  assert row == pytest.approx(expected, rel=1e-5)
  # 'ebay' comes from popular alone; 'weather news' has no template and an unseen bigram.
  ebay = dict(zip(learned.feature_names(names), matrix[2].tolist()))
  assert math.isnan(ebay['generate_rank']) and ebay['popular_rank'] == 1
  assert ebay['unknown_words'] == 1 and ebay['shares_previous'] == 0
  news = dict(zip(learned.feature_names(names), matrix[1].tolist()))
  assert news['logged'] == 0 and news['unseen_bigrams'] == 2
  assert math.isnan(news['template_frequency'])
  assert news['min_bigram_count'] == 0  # (weather, news) was never logged
  del nan
  # A previous query of two words: the overlaps' denominators differ (the words of both, the
  # candidate's words); words added before the previous query extend it too.
  so_far = ('news', 'cheap cars')
  by_source = {'generate': [{'query': 'cheap hotels in chicago', 'score': -1.0},
                            {'query': 'free cheap cars', 'score': -2.0}]}
  matrix = learned.features(['cheap hotels in chicago', 'free cheap cars'], by_source, so_far,
                            1, counts, generator[:2], ['generate'], vocab)
  hotels, free = (dict(zip(learned.feature_names(['generate']), r)) for r in matrix.tolist())
  assert (hotels['overlap_previous'], hotels['overlap_session']) == pytest.approx((1 / 5, 1 / 4))
  assert (hotels['extends_previous'], free['extends_previous']) == (0, 1)
  assert free['overlap_previous'] == pytest.approx(2 / 3) and free['previous_words'] == 2
  # The pool: no empty text; the session's queries left out only when asked.
  by_source = {'generate': [{'query': ''}, {'query': 'cheap cars'}, {'query': ' '}],
               'popular': [{'query': 'ebay'}, {'query': 'cheap cars'}]}
  assert learned.pool_texts(by_source, so_far, drop_session=True) == ['ebay']
  assert learned.pool_texts(by_source, so_far, drop_session=False) == ['cheap cars', 'ebay']


def test_features_of_repeats_sessions_and_the_log_by_hand(counts):
  """The features a first case leaves alike: pairs against distinct followers, a source's
  first proposal of a text, what the log holds as a next query (not as a previous one), an
  earlier query of the session, repeated words."""
  def features(texts, so_far, by_source=None, names=('generate',)):
    by_source = by_source or {'generate': [{'query': t, 'score': -1.0} for t in texts]}
    matrix = learned.features(texts, by_source, so_far, 1, counts,
                              np.zeros((len(texts), 2), np.float32), list(names),
                              Vocab.from_counts({'weather': 9}, 1))
    return [dict(zip(learned.feature_names(list(names)), r)) for r in matrix.tolist()]

  # 'google' was followed twice, both times by 'ebay': 2 pairs, 1 distinct follower.
  (ebay,) = features(['ebay'], ('google',))
  assert ebay['cooccurrence'] == pytest.approx(0.0)
  assert ebay['previous_followed'] == pytest.approx(math.log1p(2))
  # A source proposing a text twice: its first rank and score.
  (a,) = features(['a'], ('x',), {'generate': [{'query': 'a', 'score': -1.0},
                                               {'query': 'a', 'score': -2.0}]})
  assert (a['generate_rank'], a['generate_score']) == (1, -1.0)
  rows = features(['a', 'ebay'], ('x',), {'generate': [{'query': 'a', 'score': -1.0}],
                                          'popular': [{'query': 'ebay', 'score': 2.0}]},
                  ('generate', 'popular'))
  assert [r['num_sources'] for r in rows] == [1, 1]
  # 'google' opens sessions and never follows a query: not logged as a next query.
  google, dotcom = features(['google', 'ebay.com'], ('x',))
  assert (google['logged'], dotcom['logged'], dotcom['unseen_bigrams']) == (0, 1, 0)
  # 'news chicago' shares 'news' with the session's first query, not with the previous one.
  (chicago,) = features(['news chicago'], ('news', 'weather'))
  assert (chicago['overlap_session'], chicago['shares_previous']) == (0.5, 0)
  (repeated,) = features(['new york new york'], ('new york new york',))
  assert (repeated['overlap_session'], repeated['previous_words']) == (1.0, 4)
  (sale,) = features(['cheap cars for sale'], ('cheap cars',))
  assert sale['shares_previous'] == 1  # a flag, whatever the number of words shared
  # Every query of the session leaves the pool, not the previous one alone.
  assert learned.pool_texts({'generate': [{'query': 'news'}, {'query': 'ebay'}]},
                            ('news', 'cheap cars'), drop_session=True) == ['ebay']
  # Each candidate a template wrote reads its own template's count, not the first one's.
  rows = features(['weather chicago', 'weather news'], ('weather',),
                  {'generate': [{'query': 'weather news', 'score': -1.0}],
                   'templates': [{'query': 'weather chicago', 'score': 2.0},
                                 {'query': 'weather news', 'score': 5.0}]},
                  ('generate', 'templates'))
  assert [r['template_frequency'] for r in rows] == pytest.approx(
      [math.log(3) - math.log(10), math.log(6) - math.log(10)])


def test_the_position_feature_is_the_last_querys_place_in_the_session(counts, monkeypatch):
  monkeypatch.setattr(teacher_forcing, 'candidate_log_probs',
                      lambda trained, contexts, texts, **_: [
                          [np.zeros((len(t), 2), np.float32) for t in per_context]
                          for per_context in texts])
  trained = types.SimpleNamespace(vocab=Vocab.from_counts({'weather': 9}, 1))
  _, pools = learned.lists_and_features(
      trained, [Context(('news', 'weather', 'cheap cars'), 0, {})], [sources.Popular(counts, 2)],
      counts, positions='last', batch_rows=1)
  column = learned.feature_names(['popular']).index('position')
  assert pools[0][0].features[:, column].tolist() == [2, 2]
  # A context cut from a longer session: its queries' places in the whole session.
  _, pools = learned.lists_and_features(
      trained, [Context(('news', 'weather', 'cheap cars'), 1, {}, first_position=4)],
      [sources.Popular(counts, 2)], counts, positions='all', batch_rows=1)
  assert [pool.features[0, column] for pool in pools[0]] == [5, 6]
  # Pools `keep` turns down are left empty: no candidate described.
  _, pools = learned.lists_and_features(
      trained, [Context(('news', 'weather'), 0, {})], [sources.Popular(counts, 2)], counts,
      positions='all', batch_rows=1, keep=lambda i, p, texts: p == 1)
  assert [(pool.texts, pool.features.shape[0]) for pool in pools[0]] == [
      ([], 0), (['cheap hotels', 'ebay'], 2)]
  # The generator scores the candidates reading as much of the user's past as it suggests with.
  read = []

  def scored(trained, contexts, texts, history_queries=0, **_):
    del trained, contexts
    read.append(history_queries)
    return [[np.zeros((len(t), 2), np.float32) for t in c] for c in texts]

  monkeypatch.setattr(teacher_forcing, 'candidate_log_probs', scored)
  learned.lists_and_features(trained, [Context(('news',), 0, {})], [sources.Popular(counts, 2)],
                             counts, positions='last', batch_rows=1, history_queries=3)
  assert read == [3]


def test_what_is_shown_keeps_word_salad_out_and_the_session_first(counts):
  written = ('ebay', 'chicago weather', 'cheap hotels', 'weather news', 'weather chicago',
             'www.weather.com', 'news', 'weather chicago il')
  ranked = [{'query': q, 'sources': ['generate']} for q in written]
  so_far = ('news', 'weather')
  # 'chicago weather' and 'weather news' hold word pairs no query holds (nor the session's);
  # a lone word has no pair to check, and the log's words are too rare to say where they go.
  kept = presentation.presented(ranked, so_far, counts, session_first=0, attested_only=True)
  assert [c['query'] for c in kept] == ['ebay', 'cheap hotels', 'weather chicago',
                                        'www.weather.com', 'news', 'weather chicago il']
  # A template's (or the log's) candidate is kept whatever its word pairs.
  ranked[1]['sources'] = ['generate', 'templates']
  kept = presentation.presented(ranked, so_far, counts, session_first=0, attested_only=True)
  assert 'chicago weather' in [c['query'] for c in kept]
  assert not presentation.well_formed(counts, so_far)('chicago weather')
  assert presentation.well_formed(counts, ('x', 'chicago news'))('chicago news')  # the session's
  # The first 3 places: well-formed and about the session ('news' alone is only a word of
  # it); none unrelated, then one ('ebay', the best of them); the rest in order after them,
  # what is not well-formed last.
  shown = presentation.presented(ranked, so_far, counts, session_first=3, attested_only=False)
  assert [c['query'] for c in shown] == ['weather chicago', 'www.weather.com',
                                         'weather chicago il', 'ebay', 'cheap hotels', 'news',
                                         'chicago weather', 'weather news']
  shown = presentation.presented(ranked, so_far, counts, session_first=3, attested_only=False,
                            unrelated_first=1)
  assert [c['query'] for c in shown] == ['ebay', 'weather chicago', 'www.weather.com',
                                         'cheap hotels', 'news', 'weather chicago il',
                                         'chicago weather', 'weather news']
  # Nothing about the session among the candidates (all well-formed): the ranker's order
  # stands.
  unrelated = [ranked[2], ranked[0], ranked[6]]  # cheap hotels, ebay, news
  assert presentation.presented(unrelated, ('zzz',), counts, session_first=5,
                                attested_only=False, unrelated_first=1) == unrelated
  assert presentation.presented(unrelated, ('zzz',), counts, session_first=5,
                                attested_only=False) == unrelated


def test_a_users_own_earlier_query_reads_as_a_query(counts):
  # 'chicago weather' holds a word pair no logged query holds: word salad where only the
  # generator wrote it, a query where the user typed it before.
  ranked = [{'query': 'chicago weather', 'sources': ['generate']},
            {'query': 'weather chicago', 'sources': ['generate']}]
  shown = presentation.presented(ranked, ('weather',), counts, session_first=2,
                                 attested_only=False)
  assert [c['query'] for c in shown] == ['weather chicago', 'chicago weather']
  # With attested_only, what only the generator wrote and does not read as a query is dropped.
  shown = presentation.presented(ranked, ('weather',), counts, session_first=2,
                                 attested_only=True)
  assert [c['query'] for c in shown] == ['weather chicago']
  for past in ('history', 'history_about'):  # either source of the user's past
    ranked[0]['sources'] = ['generate', past]
    shown = presentation.presented(ranked, ('weather',), counts, session_first=2,
                                   attested_only=True)
    assert [c['query'] for c in shown] == ['chicago weather', 'weather chicago']


def test_the_sessions_own_queries_take_no_first_place(counts):
  """What the user-facing protocol shows of the presented list is the presentation of the
  candidates the session does not hold: a query of the session, which `show` drops, keeps
  no first place from a candidate about the session (nor lets a head query into one)."""
  ranked = [{'query': q, 'sources': ['templates']}
            for q in ('weather', 'weather chicago', 'ebay', 'weather chicago il', 'news')]
  so_far = ('news', 'weather')
  shown = presentation.presented(ranked, so_far, counts, session_first=2, attested_only=False,
                                 unrelated_first=1)
  assert [c['query'] for c in shown] == ['weather chicago', 'ebay', 'weather',
                                         'weather chicago il', 'news']
  without = [c for c in ranked if c['query'] not in so_far]
  user_facing = pipeline.show(shown, so_far, exclude_session_queries=True, top_k=5)
  assert user_facing == presentation.presented(without, so_far, counts, session_first=2,
                                               attested_only=False, unrelated_first=1)


def test_the_first_places_take_a_short_querys_site_and_no_words_added_unlogged():
  """A short query written as a site is about the session; the previous query with words
  added is kept from the first places unless the log holds it."""
  log = [['x', 'cheap cars'], ['x', 'cars for kids']]
  ranked = [{'query': q, 'sources': ['templates']}
            for q in ('cheap cars for kids', 'ebay', 'cars for kids', 'cheapcars.com', 'x')]
  so_far = ('cheap cars',)
  counts = popular.LogCounts.of_sessions(log)
  assert presentation.well_formed(counts, so_far)('cheap cars for kids')
  assert presentation.added_to('cheap cars for kids', 'cheap cars')
  assert not presentation.added_to('cars for kids', 'cheap cars')
  assert subjects.about_session(so_far)('cheapcars.com')
  # Three words joined are no address anyone types.
  assert not subjects.about_session(('pictures of cats',))('picturesofcats.com')
  shown = presentation.presented(ranked, so_far, counts, session_first=2, attested_only=False)
  assert [c['query'] for c in shown] == ['cars for kids', 'cheapcars.com',
                                         'cheap cars for kids', 'ebay', 'x']
  logged = popular.LogCounts.of_sessions(log + [['x', 'cheap cars for kids']])
  shown = presentation.presented(ranked, so_far, logged, session_first=2, attested_only=False)
  assert [c['query'] for c in shown][:2] == ['cheap cars for kids', 'cars for kids']
  # Words added to the previous query, not to an earlier one ('news'), and only whole words.
  shown = presentation.presented(ranked[0:3:2], ('news', 'cheap cars'), counts, session_first=1,
                                 attested_only=False)
  assert [c['query'] for c in shown] == ['cars for kids', 'cheap cars for kids']
  assert not presentation.added_to('cheap carsales', 'cheap cars')


def test_a_query_does_not_start_or_end_with_a_word_that_never_does():
  """'of' is used 20 times (EDGE_MIN_USES), always inside a query: a cut leaving it first or
  last is not well-formed; a word the log rarely uses ('hats') may go anywhere."""
  logged = [['x', f'pictures of cat{n}'] for n in range(presentation.EDGE_MIN_USES)]
  counts = popular.LogCounts.of_sessions(logged + [['x', 'hats']])
  assert counts.bigram_starts['of'] == presentation.EDGE_MIN_USES
  well_formed = presentation.well_formed(counts, ('pictures of cat3',))
  assert well_formed('pictures of cat7') and well_formed('cat3') and well_formed('hats')
  assert not well_formed('pictures of') and not well_formed('of cat3')
  assert not well_formed('cat3 of pictures')  # word pairs nobody typed
  # 'pictures' starts each of its 20 uses and ends none: not a query alone.
  assert not well_formed('pictures')
  # One use fewer and the log says too little about 'of' to keep it from the edges.
  fewer = popular.LogCounts.of_sessions(logged[1:])
  assert presentation.well_formed(fewer, ())('pictures of')
  # Each edge is judged by its own word's uses: a rare first word ('hats') does not let
  # 'of', which ends none of its uses, end a query.
  hats = popular.LogCounts.of_sessions(logged + [['x', 'hats of mice']])
  assert not presentation.well_formed(hats, ())('hats of')


def test_a_logged_query_is_well_formed_and_an_edge_at_the_minimum_share_is_kept():
  """'of' is used 50 times, once to start a query ('of mice'): exactly EDGE_MIN_SHARE (2%)
  of its uses, enough for 'of cat3' to read as a query. One use more inside a query and it
  starts under 2% of them: 'of cat3' is no query, but 'of mice' is, since the log holds it
  (what people typed is a query whatever its edges)."""
  logged = [['x', f'pictures of cat{n}'] for n in range(49)] + [['x', 'of mice']]
  counts = popular.LogCounts.of_sessions(logged)
  assert counts.bigram_starts['of'] == 50 and counts.bigrams[('<s>', 'of')] == 1
  assert presentation.well_formed(counts, ())('of cat3')
  more = popular.LogCounts.of_sessions(logged + [['x', 'pictures of cat49']])
  assert not presentation.well_formed(more, ())('of cat3')
  assert presentation.well_formed(more, ())('of mice')


def test_a_query_that_ends_as_the_user_ended_one_is_not_malformed():
  """'pictures' ends none of its 20 logged uses, but the user ended a query with it: the
  session's own edges and word pairs stand, so what the user typed (and a query made of
  its pairs) reads as a query."""
  logged = [['x', f'pictures of cat{n}'] for n in range(presentation.EDGE_MIN_USES)]
  counts = popular.LogCounts.of_sessions(logged)
  assert not presentation.well_formed(counts, ())('cat pictures')
  assert presentation.well_formed(counts, ('cat pictures',))('cat pictures')
  assert presentation.well_formed(counts, ('cute cat', 'cat pictures'))('cute cat pictures')


def test_about_the_session_is_about_any_of_its_queries_and_sites():
  """A candidate is about the session by a word of any of its queries, not the previous one
  alone; a site ('www.ebay.com', 'ebay.net') stands for its name; a lone word of any query
  typed is not about it; the empty query reads as no query."""
  about = subjects.about_session(('cheap flights to paris', 'hotels'))
  assert about('flights to rome') and about('hotels in rome')
  assert not about('cheap') and not about('hotels')
  assert subjects.about_session(('www.ebay.com',))('ebay coupons')
  assert subjects.about_session(('ebay',))('ebay.net')
  assert subjects.about_session(('ebay',))('www.ebay.org')
  # The site of an earlier short query of the session, not only the previous one's.
  assert subjects.about_session(('bass champs', 'fishing'))('basschamps.com')
  assert not presentation.well_formed(popular.LogCounts.of_sessions(SESSIONS), ())('')


def test_a_query_of_the_session_takes_no_first_place_under_the_papers_protocol(counts):
  """The paper's protocol keeps the session's queries among the candidates: an earlier one
  ('weather chicago') as well as the previous one goes after the first places."""
  ranked = [{'query': q, 'sources': ['templates']} for q in ('weather chicago', 'news chicago')]
  shown = presentation.presented(ranked, ('weather chicago', 'news'), counts, session_first=1,
                                 attested_only=False)
  assert [c['query'] for c in shown] == ['news chicago', 'weather chicago']


def test_a_lone_word_of_the_session_takes_no_first_place(counts):
  """A word cut from what the user typed ('cheap' after 'cheap flights') says less than the
  query did: it is not about the session, and a related query comes first."""
  about = subjects.about_session(('cheap flights',))
  assert not about('cheap') and not about('flights')
  assert about('cheap hotels')
  ranked = [{'query': q, 'sources': ['templates']} for q in ('cheap', 'cheap hotels')]
  shown = presentation.presented(ranked, ('cheap flights',), counts, session_first=1,
                                 attested_only=False)
  assert [c['query'] for c in shown] == ['cheap hotels', 'cheap']


def test_words_put_before_the_previous_query_count_as_added_to_it():
  """'free cheap cars' is 'cheap cars' with a word put before it: like one put after it, it
  takes no first place unless the log holds it."""
  assert presentation.added_to('free cheap cars', 'cheap cars')
  assert not presentation.added_to('supercheap cars', 'cheap cars')  # a word, not its end
  log = [['x', 'cheap cars'], ['x', 'free cheap'], ['x', 'cars for kids']]
  counts = popular.LogCounts.of_sessions(log)
  ranked = [{'query': q, 'sources': ['templates']}
            for q in ('free cheap cars', 'cars for kids', 'cheapcars.com')]
  assert presentation.well_formed(counts, ('cheap cars',))('free cheap cars')
  shown = presentation.presented(ranked, ('cheap cars',), counts, session_first=2,
                                 attested_only=False)
  assert [c['query'] for c in shown] == ['cars for kids', 'cheapcars.com', 'free cheap cars']


def test_the_ranker_learns_a_known_order():
  """Groups of 8 candidates whose relevant one has the largest first feature (the others are
  noise): trained on 600 groups, it puts the relevant one first in 9 of 10 new ones (chance:
  1 in 8)."""
  rng = np.random.default_rng(0)
  groups, size = 700, 8
  x = rng.normal(size=(groups * size, 3)).astype(np.float32)
  labels = np.zeros(groups * size, np.int32)
  for g in range(groups):
    labels[g * size + int(np.argmax(x[g * size:(g + 1) * size, 0]))] = 1
  data = learned_training.Groups(x, labels, np.full(groups, size), np.zeros(groups, int),
                                 [], [], [], [])
  config = types.SimpleNamespace(seed=0, suggest=types.SimpleNamespace(ranker_rounds=100))
  chosen = np.arange(groups) < 600
  booster = learned_training.train_booster(data, chosen, config, ['signal', 'noise_a', 'noise_b'])
  scores = booster.predict(x[600 * size:]).reshape(100, size)
  relevant = labels[600 * size:].reshape(100, size).argmax(1)
  assert (scores.argmax(1) == relevant).mean() >= 0.9
  gain = dict(zip(booster.feature_name(), booster.feature_importance('gain')))
  assert gain['signal'] > 10 * max(gain['noise_a'], gain['noise_b'])


def test_the_ranker_learns_listwise_from_the_chosen_groups_that_hold_the_next_query(
    monkeypatch):
  """`train_booster` hands LightGBM the rows of the chosen groups that hold a next query, in
  their groups (one without it, an empty one and one not chosen left out), with the
  XE-NDCG objective for `ranker_rounds` rounds."""
  import lightgbm  # pylint: disable=g-import-not-at-top
  given = {}

  def dataset(x, labels, group, feature_name, free_raw_data):
    del free_raw_data
    given.update(x=x, labels=labels, group=group, names=feature_name)
    return 'data'

  monkeypatch.setattr(lightgbm, 'Dataset', dataset)
  monkeypatch.setattr(lightgbm, 'train', lambda params, data, num_boost_round: (
      params, data, num_boost_round))
  # Groups: [0 1] chosen, [0 0 0] no next query, [] empty, [1 0] not chosen, [1] chosen.
  sizes = np.array([2, 3, 0, 2, 1])
  labels = np.array([0, 1, 0, 0, 0, 1, 0, 1], np.int32)
  x = np.arange(16, dtype=np.float32).reshape(8, 2)
  data = learned_training.Groups(x, labels, sizes, np.zeros(5, int), [], [], [], [])
  config = types.SimpleNamespace(seed=3, suggest=types.SimpleNamespace(ranker_rounds=7))
  params, _, rounds = learned_training.train_booster(
      data, np.array([True, True, True, False, True]), config, ['f', 'g'])
  assert given['group'].tolist() == [2, 1] and given['labels'].tolist() == [0, 1, 1]
  np.testing.assert_array_equal(given['x'], x[[0, 1, 7]])
  assert (params['objective'], params['seed'], rounds) == ('rank_xendcg', 3, 7)
  # Some columns alone: their values and names.
  learned_training.train_booster(data, np.ones(5, bool), config, ['f', 'g'], columns=[1])
  assert given['names'] == ['g'] and given['x'][:, 0].tolist() == [1, 3, 11, 13, 15]


def test_each_candidate_names_the_sources_proposing_it_once_each():
  """`proposers`: a source proposing a text twice is named once, in the sources' order."""
  by_source = {'generate': [{'query': 'a'}, {'query': 'b'}, {'query': 'a'}],
               'popular': [{'query': 'a'}, {'query': 'a'}]}
  assert learned.proposers(by_source) == {'a': ['generate', 'popular'], 'b': ['generate']}


def test_each_folds_cached_candidates_are_keyed_by_its_own_generator():
  key = {'sources': [['generate', 4]], 'fold_steps': [30, 40, None]}
  fold_key = learned_training._fold_key  # pylint: disable=protected-access
  assert [fold_key(key, k) for k in range(3)] == [
      {'sources': [['generate', 4]], 'fold': k, 'fold_step': step}
      for k, step in enumerate([30, 40, None])]


def test_a_ranker_for_another_checkpoint_or_vocabulary_is_refused(tmp_path):
  folder = tmp_path / learned.RANKER_DIR
  folder.mkdir()
  vocab = Vocab.from_counts({'a': 9}, 1)
  trained = types.SimpleNamespace(step=40, vocab=vocab)
  assert learned.LearnedRanker.load(str(tmp_path), trained) is None  # none: the fallback
  (folder / 'ranker.json').write_text(json.dumps(
      {'checkpoint_step': 30, 'vocab_fingerprint': vocab.fingerprint}))
  with pytest.raises(errors.Error, match=r'ranker.json: the ranker was trained for '
                     r'checkpoint step 30 .* \(step 40,'):
    learned.LearnedRanker.load(str(tmp_path), trained)
  (folder / 'ranker.json').write_text(json.dumps(
      {'checkpoint_step': 40, 'vocab_fingerprint': 'another'}))
  with pytest.raises(errors.Error, match='and vocabulary another, not'):
    learned.LearnedRanker.load(str(tmp_path), trained)
  # Trained on features this code no longer computes, in this order: one line, not LightGBM's
  # error at the first suggestion (or, at the same count, another column's values scored).
  names = learned.feature_names(['generate'])
  for recorded, message in ((names[:-1], f'not trained on {names[-1]}'),
                            (names + ['retired'], 'trained on retired, no longer computed'),
                            (names[::-1], 'the same features in another order')):
    (folder / 'ranker.json').write_text(json.dumps(
        {'checkpoint_step': 40, 'vocab_fingerprint': vocab.fingerprint,
         'sources': [['generate', 4]], 'features': recorded}))
    with pytest.raises(errors.Error, match=r'ranker.json: the ranker was trained on other '
                       rf'features than this code computes \({message}\): run --mode=train'):
      learned.LearnedRanker.load(str(tmp_path), trained)
  # A source this code no longer ranks (the session's queries, before it was refused).
  (folder / 'ranker.json').write_text(json.dumps(
      {'checkpoint_step': 40, 'vocab_fingerprint': vocab.fingerprint,
       'sources': [['generate', 4], ['session', 2]],
       'features': learned.feature_names(['generate', 'session'])}))
  with pytest.raises(errors.Error, match=r"ranker.json: the ranker was trained with sources "
                     r"this code does not rank \(.*'session' is no source"):
    learned.LearnedRanker.load(str(tmp_path), trained)


def test_the_candidates_are_searched_as_the_ranker_was_trained():
  default = search.SearchSettings(beam_size=10, max_len=12, length_penalty=0.6, emit_unk=False,
                                  top_k=5, exclude_session_queries=True)
  made = learned.generator_settings((('generate', 4),), default)
  assert (made.beam_size, made.top_k, made.exclude_session_queries) == (4, 4, False)
  # The ranker's generator source searches so (reading the user's past it is given).
  generate, log = learned.build_sources((('generate', 4), ('popular', 3)), None, None, default,
                                        history_queries=2)
  assert (generate.settings, generate.history_queries) == (made, 2)
  assert (log.name, log.k) == ('popular', 3)
  # A record written before the search was kept: searched as the plan says, nothing to note.
  ranker = learned.LearnedRanker(None, {'sources': [['generate', 4]]})
  assert ranker.candidate_search(default) == made
  # A record with its search: its values, whatever the config's.
  recorded = dataclasses.replace(made, length_penalty=1.0, max_len=9).to_dict()
  ranker = learned.LearnedRanker(None, {'sources': [['generate', 4]], 'search': recorded})
  assert ranker.candidate_search(default) == dataclasses.replace(made, length_penalty=1.0,
                                                                 max_len=9)
  # A record of an older version: the protocol unset (it kept the session's queries), a
  # field it lacks the plan's, a field this code no longer has left out.
  old = {'length_penalty': 1.0, 'exclude_session_queries': None, 'retired': 1}
  ranker = learned.LearnedRanker(None, {'sources': [['generate', 4]], 'search': old})
  assert ranker.candidate_search(default) == search.SearchSettings(
      beam_size=4, max_len=12, length_penalty=1.0, emit_unk=False, top_k=4,
      exclude_session_queries=False)


def test_sources_plans_are_checked():
  assert learned.parse_sources('generate:10,templates:5') == (('generate', 10),
                                                              ('templates', 5))
  for bad in ('popular:5,generate:5', 'generate:0', 'generate:3,nothing:2',
              'generate:3,generate:4', 'retrieve:3'):
    with pytest.raises(ValueError):
      learned.parse_sources(bad)
  # The session's queries: its training pools hold none, so it would meet them first live.
  with pytest.raises(ValueError, match="'session' is no source of the learned ranker"):
    learned.parse_sources('generate:3,session:2')
  # An unknown one is told the sources the ranker takes (the generator, the log's), not the
  # session's.
  assert learned.RANKER_SOURCES == ('generate', *(n for n in sources.LOG_SOURCES
                                                  if n != 'session'))
  with pytest.raises(ValueError, match=re.escape(
      "'nothing:2' is not SOURCE:N with SOURCE one of "
      f'{", ".join(learned.RANKER_SOURCES)} and N >= 1')
      + '$'):
    learned.parse_sources('generate:3,nothing:2')


def test_a_splits_chosen_sessions_are_contexts_of_their_own_user_past_and_next_queries(
    tmp_path):
  """`sources.session_contexts` of some sessions, in the order chosen: each its queries but
  the last, the next query after each, and its own session's user and past (by its index in
  the split, not its place among those chosen)."""
  from tests.test_popular import toy_split  # pylint: disable=g-import-not-at-top
  split = dataclasses.replace(toy_split(tmp_path), users=np.arange(10, 15))
  histories = [(f'h{i}',) for i in range(split.num_sessions)]
  got = sources.session_contexts(split, [3, 0], histories)
  assert [(c.queries, c.first_output, c.references, c.info, c.history) for c in got] == [
      (('x', 'b'), 0, ('b', 'c'), {'session': 3, 'user': 13}, ('h3',)),
      (('a',), 0, ('b',), {'session': 0, 'user': 10}, ('h0',))]


def test_model_batches_are_padded_to_the_first_width_that_holds_them(monkeypatch):
  """`sources.batches`: contexts by length, each batch as wide as the first of `widths` that
  holds its longest context (one exactly as long as a width fits in it)."""
  monkeypatch.setattr(sources.inputs, 'context_batch',
                      lambda task, vocab, contexts, *, rows, width, **_: ({'width': width}, None))
  trained = types.SimpleNamespace(task=None, vocab=None)
  contexts = [Context(('q',) * n, 0, {}) for n in (3, 1, 2, 4)]
  got = [(group, batch['width'])
         for group, _, batch, _ in sources.batches(trained, contexts, 2, (2, 4), 0)]
  assert got == [([1, 2], 2), ([0, 3], 4)]


def test_the_beam_after_each_position_is_its_own_columns_with_the_session_up_to_it(
    monkeypatch):
  """`sources.generated` with 'all' positions: the suggestions after position t are the
  model's output column t (a context's first output need not be 0), ranked with the session
  up to and including query t."""
  monkeypatch.setattr(sources.inputs, 'context_batch',
                      lambda task, vocab, contexts, *, rows, width, **_: (
                          {}, np.asarray([len(c.queries) for c in contexts])))
  monkeypatch.setattr(sources.search, 'ranked_suggestions',
                      lambda vocab, sequences, scores, settings, session, copied: [
                          {'query': f'column {int(sequences[0])} after {"/".join(session)}',
                           'score': float(scores[0])}])

  class Columns:
    context_keys = ()

    def suggest(self, params, inputs, settings, *, positions, lengths):
      del params, inputs, settings, positions, lengths
      columns = np.arange(4)[None, :, None]
      return np.broadcast_to(columns, (2, 4, 1)), np.zeros((2, 4, 1), np.float32)

  trained = types.SimpleNamespace(task=Columns(), vocab=None, params={},
                                  copied_words=lambda queries: ())
  got = sources.generated(trained, [Context(('a', 'b', 'c'), 1, {}), Context(('d',), 0, {})],
                          None, positions='all', batch_rows=2)
  assert texts(got) == [[['column 1 after a/b'], ['column 2 after a/b/c']],
                        [['column 0 after d']]]


def test_a_rankers_pool_entries_are_proposed_with_the_sessions_queries_among_them(
    monkeypatch):
  """`sources.retrieved` drops nothing: which protocol leaves out the session's queries is
  for `pipeline.show` to say."""
  monkeypatch.setattr(sources.inputs, 'context_batch',
                      lambda task, vocab, contexts, *, rows, width, **_: ({}, None))

  def suggestions(batch, k, sessions, exclude_session_queries):
    del batch
    return [[[{'query': q, 'score': 0.0} for q in ('a', 'p')[:k]
              if not (exclude_session_queries and q in session)] for _ in session]
            for session in sessions]

  retriever = types.SimpleNamespace(trained=types.SimpleNamespace(task=None, vocab=None),
                                    pool=None, suggestions=suggestions)
  got = sources.retrieved(retriever, [Context(('a', 'b'), 0, {})], k=2, positions='all',
                          batch_rows=1)
  assert texts(got) == [[['a', 'p'], ['a', 'p']]]


def test_a_killed_runs_half_written_groups_are_removed_when_they_are_saved_again(tmp_path):
  left = tmp_path / '.groups.npz.k3j2.npz'
  left.write_text('half')
  os.utime(left, (0, 0))
  groups = learned_training.Groups(np.zeros((1, 2), np.float32), np.ones(1, np.int32),
                                   np.ones(1, int), np.zeros(1, int), [['a']], ['a'], [('q',)],
                                   [{}])
  learned_training.save_groups(groups, str(tmp_path), {'k': 1})
  assert sorted(os.listdir(tmp_path)) == ['groups.json', 'groups.npz']


def test_imdna_scores_are_floats():
  class Proposer:
    def propose(self, contexts, k, users=None):
      del users
      return [['x', 'y'][:k] for _ in contexts]

  got = sources.IMDNA(Proposer(), 2).propose(contexts(), positions='last', batch_rows=1)
  assert [[[c['score'] for c in l] for l in ls] for ls in got] == [[[-1.0, -2.0]]] * 2
  assert all(isinstance(c['score'], float) for ls in got for l in ls for c in l)
