"""Subword vocabularies: the sentencepiece model round-trips queries (unseen words too),
travels as JSON, and preprocessing writes piece ids trained on the training split only."""

import json
import re
import types

import numpy as np
import pytest
import sentencepiece

from configs import default
from mtn_jax import config_lib
from mtn_jax import errors
from mtn_jax.data import extended
from mtn_jax.data import preprocess
from mtn_jax.data import sessions as sessions_lib
from mtn_jax.data.vocab import EOS_ID
from mtn_jax.data.vocab import PAD_ID
from mtn_jax.data.vocab import SentencePieceVocab
from mtn_jax.data.vocab import SPECIAL_TOKENS
from mtn_jax.data.vocab import train_sentencepiece
from mtn_jax.data.vocab import UNK_ID
from mtn_jax.data.vocab import Vocab
from mtn_jax.decoding import search
from mtn_jax.inference import inputs
from tests import cli
from tests.test_polyencoder_cli import assert_decode_writes_what_eval_scored

TRAIN = ['cheap flights to paris', 'new york hotels', 'paris hotels', 'cheap new york flights',
         'www.myspace.com', 'caf\u00e9 au lait'] * 20


def test_round_trip_of_seen_and_unseen_words():
  vocab = train_sentencepiece(TRAIN, 320)
  assert vocab.words[:len(SPECIAL_TOKENS)] == SPECIAL_TOKENS
  for text in ('cheap flights to paris', 'zurich b\u00e4ckerei 2006', 'www.myspace.com'):
    ids = vocab.encode_text(text)
    assert UNK_ID not in ids  # byte fallback writes any character
    assert vocab.decode_text(ids) == text
    # Decoding stops at </s> or padding and ignores what follows, as for words.
    assert vocab.decode_text(ids + [EOS_ID] + ids) == text
    assert vocab.decode_text(ids + [PAD_ID] + ids) == text
  # An emitted <unk> stays <unk> (config.decode.emit_unk), a word of its own as with words.
  cheap, paris = vocab.encode_text('cheap'), vocab.encode_text('paris')
  assert vocab.decode_text(cheap + [UNK_ID] + paris) == 'cheap <unk> paris'
  assert vocab.decode_text([UNK_ID, UNK_ID] + paris + [UNK_ID]) == '<unk> <unk> paris <unk>'
  # The same texts give the same model: vocabularies are reproducible.
  assert train_sentencepiece(TRAIN, 320).fingerprint == vocab.fingerprint
  # A query's text is never a special id: `<sep>` in it is its characters.
  for text in ('a<sep>b', 'x <s> </s> <pad> y'):
    ids = vocab.encode_text(text)
    assert min(ids) >= len(SPECIAL_TOKENS) and vocab.decode_text(ids) == text


def test_a_character_among_the_rarest_of_the_training_text_is_written_in_bytes():
  # Pieces go to the characters of all but the rarest 0.05 % of the training queries' text
  # (character_coverage): one seen once in it has no piece, and is read in byte pieces.
  vocab = train_sentencepiece(TRAIN * 3 + ['strasse stra\u00dfe'], 320)
  assert not any('\u00df' in piece for piece in vocab.words)
  ids = vocab.encode_text('stra\u00dfe')
  assert vocab.id('<0xC3>') in ids and vocab.decode_text(ids) == 'stra\u00dfe'


def test_a_vocabulary_too_small_for_the_logs_characters_is_one_config_error():
  texts = [''.join(chr(0x4e00 + i + j) for j in range(3)) for i in range(400)]  # 402 characters
  with pytest.raises(errors.ConfigError, match=re.escape(
      'config.data.vocab_size=600 is too small for this log with sentencepiece: it needs at '
      'least 664 pieces (the special tokens, the 256 bytes and each character its training '
      'queries use)')):
    train_sentencepiece(texts, 600)


def test_json_round_trip_and_word_vocab_unchanged(tmp_path):
  vocab = train_sentencepiece(TRAIN, 320)
  path = tmp_path / 'vocab.json'
  vocab.save(str(path))
  loaded = Vocab.load(str(path))
  assert isinstance(loaded, SentencePieceVocab) and loaded == vocab
  assert json.loads(path.read_text())['tokenizer'] == 'sentencepiece'
  words = Vocab(SPECIAL_TOKENS + ('paris',))
  assert Vocab.from_json(words.to_json()) == words and words.kind == 'word'
  assert words.decode_text(words.encode_text('paris berlin')) == 'paris <unk>'
  # No extended (copy) ids with pieces: every word is written.
  assert extended.oov_numbers([['zzyzx']], vocab, 4).tolist() == [[0, 0, 0, 0]]
  assert extended.oov_words([['zzyzx']], vocab) == []
  # Suggestions are detokenised text.
  ids = np.array([vocab.encode_text('new york hotels') + [EOS_ID]])
  assert search.suggestion_list(vocab, ids, np.array([-1.0]), 1) == [
      {'query': 'new york hotels', 'score': -1.0}]


def test_a_hypothesis_of_a_cut_character_or_odd_spaces_is_no_suggestion():
  vocab = train_sentencepiece(TRAIN, 320)
  cafe = vocab.encode_text('caf\u00e9')
  # A byte piece alone (the first byte of a two-byte character) makes no character.
  lead = vocab.id('<0xC3>')
  assert vocab.decode_text([lead]) == '\ufffd'
  paris, spaces = vocab.encode_text('paris'), vocab.encode_text(' ')
  assert vocab.decode_text(spaces + paris + spaces + spaces + paris + spaces) == 'paris paris'
  # The beam's best is a cut character: the next ones take the places asked for.
  beam = np.zeros((3, 8), np.int32)
  for row, ids in enumerate((paris + [lead], cafe, paris)):
    beam[row, :len(ids) + 1] = ids + [EOS_ID]
  assert [s['query'] for s in search.suggestion_list(
      vocab, beam, np.array([-1.0, -2.0, -3.0]), 2)] == ['caf\u00e9', 'paris']


def test_a_query_is_read_as_the_corpus_read_it_words_then_pieces():
  """Decode's and the service's reader keeps a query's first data.max_query_words words, and
  the model its first pieces (`inputs.context_split`), as preprocessing cut the corpus that
  eval reads: the same ids either way. A query of more pieces than the slots is counted."""
  vocab = train_sentencepiece(TRAIN, 320)
  reader = inputs.QueryReader(vocab, 10, 16, token_slots=8)
  assert reader.query('Cheap  Flights PARIS') == 'cheap flights paris'
  assert reader.counts['long_queries'] == 0
  long = 'cheap flights z\u00fcrich b\u00e4ckerei'
  assert len(long.split()) < 10 and len(vocab.encode_text(long)) > 8
  assert reader.query(long) == long and reader.counts['long_queries'] == 1
  assert reader.query(' '.join(['paris'] * 12)) == ' '.join(['paris'] * 10)
  assert reader.counts['long_queries'] == 2
  # As many pieces as the slots is no long query.
  exact = inputs.QueryReader(vocab, 10, 16, token_slots=len(vocab.encode_text('cheap paris')))
  assert exact.query('cheap paris') == 'cheap paris' and exact.counts['long_queries'] == 0
  assert reader.limit == '10 words, the model reading its first 8 subword pieces'
  assert inputs.QueryReader(Vocab(SPECIAL_TOKENS), 10, 16).limit == '10 words'
  # What the model reads of it: the first 8 pieces, as preprocessing wrote the corpus's.
  split = inputs.context_split([inputs.Context((long,), 0, {})], vocab, 8)
  assert split.queries[0].tolist() == vocab.encode_text(long)[:8]


def test_a_subword_model_reads_its_corpus_word_limit_in_every_mode(monkeypatch):
  """The words a query keeps are the corpus's `data.max_query_words`, not the model's piece
  slots: decode's reader cuts to them, and the service refuses more (and reads a query within
  them to its first pieces, as eval's corpus was cut)."""
  from mtn_jax.inference import pipeline  # pylint: disable=g-import-not-at-top
  from mtn_jax.inference.trained import Trained  # pylint: disable=g-import-not-at-top
  from mtn_jax.serving import engine  # pylint: disable=g-import-not-at-top
  vocab = train_sentencepiece(TRAIN, 320)
  cfg = types.SimpleNamespace(max_session_queries=4, max_query_words=8)
  trained = Trained(types.SimpleNamespace(cfg=cfg), None, vocab, 0,
                    {'config': {'data': {'max_query_words': 3}}})
  assert trained.query_words == 3
  reader = inputs.QueryReader.for_model(trained)
  assert reader.query('cheap flights to paris') == 'cheap flights to'
  monkeypatch.setattr(engine, '_listen', lambda: None)
  monkeypatch.setattr(engine.Engine, 'warm_up', lambda self, *args, **kwargs: None)
  monkeypatch.setattr(pipeline.Pipeline, 'load',
                      lambda config, workdir, log: types.SimpleNamespace(trained=trained))
  served = engine.Engine.load(default.get_config('mtn'), '/nowhere')
  assert served.max_query_words == 3
  with pytest.raises(engine.BadInput, match='4 words; the model reads at most 3'):
    served.check(['cheap flights to paris'], 1, None)
  within = 'z\u00fcrich b\u00e4ckerei caf\u00e9'
  assert len(vocab.encode_text(within)) > 8
  # Accepted whole (its words are within the limit): its pieces are cut where the model reads
  # them, as decode's and eval's are.
  assert served.check([within], 1, None).session == (reader.query(within),) == (within,)
  # A word vocabulary's model reads as many words as it has slots.
  words = Trained(types.SimpleNamespace(cfg=cfg), None, Vocab(SPECIAL_TOKENS), 0, {})
  assert words.query_words == 8


def test_a_word_holding_the_replacement_character_is_a_word_vocabularys_own():
  # Only subword byte pieces make a U+FFFD of bytes that make no character; a word
  # vocabulary's word that holds one (a log's own text) is suggested as it is.
  vocab = Vocab(SPECIAL_TOKENS + ('caf\ufffd',))
  ids = np.array([[vocab.id('caf\ufffd'), EOS_ID]])
  assert search.suggestion_list(vocab, ids, np.array([-1.0]), 1) == [
      {'query': 'caf\ufffd', 'score': -1.0}]


def test_a_search_shorter_than_a_querys_pieces_or_blocking_pieces_is_refused():
  c = default.get_config('mtn')
  c.data.source, c.data.tokenizer, c.data.max_query_tokens = 'demo', 'sentencepiece', 12
  c.decode.max_len = 12
  with pytest.raises(errors.ConfigError, match=re.escape(
      'config.decode.max_len (12) counts subword pieces with '
      "config.data.tokenizer='sentencepiece': at least config.data.max_query_tokens + 1 (13)")):
    config_lib.validate(c)
  c.decode.max_len, c.decode.block_repeats = 13, True
  with pytest.raises(errors.ConfigError, match='config.decode.block_repeats blocks repeated '
                     'tokens, which .* are pieces, not words'):
    config_lib.validate(c)
  c.decode.block_repeats = False
  config_lib.validate(c)
  # A ranker searches nothing: its decode settings are no concern of its vocabulary.
  ranker = default.get_config('polyencoder')
  ranker.data.source, ranker.data.tokenizer = 'demo', 'sentencepiece'
  ranker.decode.block_repeats = True
  config_lib.validate(ranker)


def test_preprocessing_with_sentencepiece(tmp_path):
  rows = []
  for user in range(40):
    for k, query in enumerate(('cheap flights paris', 'paris hotels', f'hotel{user} deals')):
      rows.append(f'{user}\t{query}\t2006-03-01 10:0{k}:00\n')
  log = tmp_path / 'log.tsv'
  log.write_text(''.join(rows), encoding='utf-8')
  c = default.get_config()
  c.data.raw_files = str(log)
  c.data.tokenizer = 'sentencepiece'
  c.data.vocab_size = 320
  c.data.max_query_tokens = 6
  c.data.split_fractions = (0.8, 0.1, 0.1)
  stats = preprocess.prepare(c, str(tmp_path / 'w'))
  data_dir = preprocess.data_dir(str(tmp_path / 'w'))
  vocab = sessions_lib.load_vocab(data_dir)
  assert isinstance(vocab, SentencePieceVocab) and stats['vocab_size'] == len(vocab)
  train = sessions_lib.load_split(data_dir, 'train')
  assert train.queries.shape[1] == 6  # token slots, not words
  # Each row holds the ids sentencepiece itself gives its text (the library, not the
  # project's wrapper), the first 6 of them, 0-padded.
  reference = sentencepiece.SentencePieceProcessor(model_proto=vocab.model)
  for row, text in enumerate(train.texts):
    ids = reference.encode(text)[:6]
    assert train.queries[row].tolist() == ids + [0] * (6 - len(ids)), text
  # 'paris hotels' and 'hotel{N} deals' fit in 6 pieces and round-trip; 'cheap flights paris'
  # takes 14 pieces in the model these queries train (found once, by hand), so each
  # user's is cut (40 of the 120 queries) and decodes to a prefix of itself.
  cut_rows = [row for row, text in enumerate(train.texts) if text == 'cheap flights paris']
  assert len(cut_rows) == 32  # the 32 training users'
  for row, text in enumerate(train.texts):
    decoded = vocab.decode_text(train.queries[row])
    if row in cut_rows:
      assert decoded != text and text.startswith(decoded.strip()), decoded
    else:
      assert decoded == text
  assert stats['cut_queries'] == 40
  # Trained on the training split alone.
  assert train_sentencepiece(train.texts, 320).fingerprint == vocab.fingerprint


def test_a_query_of_exactly_the_token_slots_is_not_cut():
  """Only a query of more pieces than token slots is cut and counted in `cut_queries`."""
  vocab = train_sentencepiece(TRAIN, 320)
  texts = ['paris hotels', 'cheap flights to paris']
  pieces = [vocab.encode_text(t) for t in texts]
  slots = len(pieces[0])  # the first fills every slot, the second has more pieces
  assert len(pieces[1]) > slots
  ids, cut = preprocess._encode_pieces(texts, vocab, slots)  # pylint: disable=protected-access
  assert cut == 1 and ids.tolist() == [pieces[0], pieces[1][:slots]]


@pytest.mark.slow
def test_cli_trains_and_decodes_with_subwords(tmp_path):
  overrides = ('--config.data.tokenizer=sentencepiece', '--config.data.vocab_size=400',
               '--config.data.max_query_tokens=12', '--config.decode.max_len=13',
               '--config.train.max_steps=6', '--config.model.copy=True')
  trained = cli.run(tmp_path, *overrides, mode='train')
  assert re.search(r'vocabulary \d+ subword pieces;', trained.stdout), trained.stdout
  sessions_file = tmp_path / 'in.tsv'
  sessions_file.write_text('CHEAP Flights\tparis hotels\n', encoding='utf-8')
  output = tmp_path / 'out.jsonl'
  cli.run(tmp_path, *overrides, f'--config.decode.input={sessions_file}',
          f'--config.decode.output={output}', mode='decode')
  [record] = [json.loads(line) for line in output.read_text().splitlines()]
  assert record['context'] == ['cheap flights', 'paris hotels']  # normalised as the log is
  assert record['suggestions'] and all('\u2581' not in s['query'] and '<' not in s['query']
                                       for s in record['suggestions'])  # detokenised text
  # Decode reads a query as the corpus that eval reads was cut (words, then pieces; half the
  # demo's queries take more than 12 pieces here): the lists eval scored, both protocols.
  cli.run(tmp_path, *overrides, '--config.decode.max_eval_sessions=8', mode='eval')
  lists = tmp_path / 'eval' / 'first8_lists.jsonl'
  pairs = [json.loads(line) for line in lists.read_text().splitlines()]
  vocab = sessions_lib.load_vocab(preprocess.data_dir(str(tmp_path)))
  assert any(len(vocab.encode_text(q)) > 12 for p in pairs for q in p['context'])
  (tmp_path / 'decoded').mkdir()
  assert_decode_writes_what_eval_scored(tmp_path, lists, tmp_path / 'decoded', *overrides)
  # A config that does not name the tokenizer still searches the workdir's pieces as training
  # had to: a search too short for them is refused in one line, not run.
  plain = ('--config.train.max_steps=6', '--config.model.copy=True')
  for mode in ('decode', 'eval'):
    refused = cli.run(tmp_path, *plain, f'--config.decode.input={sessions_file}', mode=mode,
                      check=False)
    assert refused.returncode == 1 and refused.stderr.strip().count('\n') == 0, refused.stderr
    assert (f'the corpus of {tmp_path} is cut into sentencepiece pieces: config.decode.max_len'
            in refused.stderr), refused.stderr
  # Nor may a config naming a smaller piece limit than the corpus's search fewer pieces.
  refused = cli.run(tmp_path, *overrides, '--config.data.max_query_tokens=6',
                    '--config.decode.max_len=7', f'--config.decode.input={sessions_file}',
                    mode='decode', check=False)
  assert refused.returncode == 1 and 'config.decode.max_len (7)' in refused.stderr, refused.stderr
  cli.run(tmp_path, *plain, '--config.decode.max_len=13', f'--config.decode.input={sessions_file}',
          f'--config.decode.output={tmp_path / "plain.jsonl"}', mode='decode')
  assert (tmp_path / 'plain.jsonl').read_text() == output.read_text()
