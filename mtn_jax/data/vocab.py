"""Vocabularies with the special tokens every model shares: words, or subword pieces.

Ids 0..4 are fixed so that padding is always 0 and models can build decoder inputs
(`<s>` + query) and targets (query + `</s>`) without looking anything up.

- `Vocab` (`config.data.tokenizer='word'`): the training split's words; a query's tokens are
  its words (`encode_text`, `decode_text`), an unknown word is `<unk>`.
- `SentencePieceVocab` ('sentencepiece'): the pieces of a sentencepiece model trained on the
  training split (`train_sentencepiece`), with byte fallback, so that any query, unseen words
  included, is written in pieces and nothing is `<unk>`; `decode_text` joins pieces back into
  words. The model travels with the vocabulary (vocab.json, checkpoints) as base64.
Both are saved as JSON (`to_json`, `from_json`), never pickled.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import io
import json
import re
from collections.abc import Iterable, Sequence

import numpy as np

from mtn_jax import errors

PAD_ID, UNK_ID, BOS_ID, EOS_ID, SEP_ID = 0, 1, 2, 3, 4
SPECIAL_TOKENS = ('<pad>', '<unk>', '<s>', '</s>', '<sep>')


@dataclasses.dataclass(frozen=True)
class Vocab:
  """An immutable id <-> word table; `words[i]` is the word of id `i`."""

  words: tuple[str, ...]

  def __post_init__(self):
    if tuple(self.words[:len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
      raise ValueError(f'a vocabulary must start with {SPECIAL_TOKENS}')
    if len(set(self.words)) != len(self.words):
      raise ValueError('a vocabulary holds each word once')
    # The special tokens are ids, never words: a query's word spelled `<pad>` or `</s>` is
    # `<unk>` (as a token, it would end or blank the query).
    object.__setattr__(self, '_ids', {w: i for i, w in enumerate(self.words)
                                      if i >= len(SPECIAL_TOKENS)})

  @classmethod
  def from_counts(cls, counts: dict[str, int], min_count: int) -> Vocab:
    """Words seen at least `min_count` times, most frequent first (ties by word)."""
    kept = sorted((w for w, c in counts.items()
                   if c >= min_count and w not in SPECIAL_TOKENS),
                  key=lambda w: (-counts[w], w))
    return cls(SPECIAL_TOKENS + tuple(kept))

  def __len__(self) -> int:
    return len(self.words)

  def id(self, word: str) -> int:
    """The id of a query's `word`; `<unk>` for one not in the table or spelled like a special
    token."""
    return self._ids.get(word, UNK_ID)

  def encode(self, words: Iterable[str]) -> list[int]:
    return [self._ids.get(w, UNK_ID) for w in words]

  def decode(self, ids: Sequence[int] | np.ndarray,
             extended_words: Sequence[str] = ()) -> list[str]:
    """Words of `ids` up to the first `</s>` or `<pad>`; `<s>` is dropped. An id past the
    vocabulary, len(self) + k, is an extended id (a word copied from the context):
    `extended_words[k]`."""
    out = []
    for i in np.asarray(ids).tolist():
      if i in (EOS_ID, PAD_ID):
        break
      if i != BOS_ID:
        out.append(self.words[i] if i < len(self.words)
                   else extended_words[i - len(self.words)])
    return out

  kind = 'word'

  def encode_text(self, text: str) -> list[int]:
    """A query's token ids: its words (split on whitespace), `<unk>` for unknown ones."""
    return self.encode(text.split())

  def decode_text(self, ids: Sequence[int] | np.ndarray,
                  extended_words: Sequence[str] = ()) -> str:
    """The query text of `ids` (up to `</s>`): its words joined by spaces (`decode`)."""
    return ' '.join(self.decode(ids, extended_words))

  @property
  def fingerprint(self) -> str:
    """A short hash of the word list: checkpoints record it to refuse a foreign vocabulary."""
    return hashlib.sha256('\n'.join(self.words).encode()).hexdigest()[:16]

  def to_json(self) -> dict:
    return {'words': list(self.words), 'fingerprint': self.fingerprint}

  def save(self, path: str) -> None:
    with open(path, 'w', encoding='utf-8') as f:
      json.dump(self.to_json(), f, ensure_ascii=False)

  @staticmethod
  def from_json(value: dict) -> Vocab:
    """The vocabulary `to_json` wrote, of either kind."""
    if value.get('tokenizer') == SentencePieceVocab.kind:
      return SentencePieceVocab.from_model(base64.b64decode(value['model']))
    return Vocab(tuple(value['words']))

  @staticmethod
  def load(path: str) -> Vocab:
    """The vocabulary `save` wrote to `path`, or an error naming a file that is not one."""
    with open(path, encoding='utf-8') as f:
      try:
        return Vocab.from_json(json.load(f))
      except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise VocabFileError(f'{path}: not a vocabulary ({type(e).__name__}: {e}): run '
                             '--mode=preprocess again') from None


class VocabFileError(errors.Error, ValueError):
  """A vocabulary file that cannot be read as one; the message names it."""


@dataclasses.dataclass(frozen=True)
class SentencePieceVocab(Vocab):
  """The pieces of a sentencepiece model (`words[i]` is piece i); see the module docstring."""

  model: bytes = b''

  kind = 'sentencepiece'

  @classmethod
  def from_model(cls, model: bytes) -> SentencePieceVocab:
    processor = _processor(model)
    return cls(tuple(processor.id_to_piece(i) for i in range(processor.get_piece_size())),
               model)

  @property
  def processor(self):
    return _processor(self.model)

  def encode_text(self, text: str) -> list[int]:
    return self.processor.encode(text)

  def decode_text(self, ids: Sequence[int] | np.ndarray,
                  extended_words: Sequence[str] = ()) -> str:
    del extended_words  # pieces cover every word: there are no extended ids
    kept = []
    for i in np.asarray(ids).tolist():
      if i in (EOS_ID, PAD_ID):
        break
      if i >= len(SPECIAL_TOKENS) or i == UNK_ID:
        kept.append(i)
    text = self.processor.decode(kept)
    if UNK_ID in kept:  # an emitted `<unk>` stays `<unk>`, a word of its own, as with words
      text = text.replace(_UNK_SURFACE, f' {SPECIAL_TOKENS[UNK_ID]} ')
    # Single spaces, as the corpus's queries (a piece of spaces alone would leave two, or one
    # at an end); byte pieces that make no character decode to U+FFFD (`search` drops those).
    return ' '.join(text.split())

  @property
  def fingerprint(self) -> str:
    """A short hash of the model (its pieces, scores and normalisation)."""
    return hashlib.sha256(self.model).hexdigest()[:16]

  def to_json(self) -> dict:
    return {**super().to_json(), 'tokenizer': self.kind,
            'model': base64.b64encode(self.model).decode('ascii')}


# How sentencepiece writes `<unk>` in decoded text (its trainer's default `unk_surface`).
_UNK_SURFACE = '\u2047'


@functools.lru_cache(maxsize=4)
def _processor(model: bytes):
  import sentencepiece  # pylint: disable=g-import-not-at-top
  return sentencepiece.SentencePieceProcessor(model_proto=model)


def train_sentencepiece(texts: Iterable[str], vocab_size: int) -> SentencePieceVocab:
  """A unigram sentencepiece model of `vocab_size` pieces trained on `texts` (the training
  split's queries), with the project's special tokens at their ids and byte fallback, made
  the same way on every run (one thread, the texts in their order)."""
  import sentencepiece  # pylint: disable=g-import-not-at-top
  model = io.BytesIO()
  try:
    _train_pieces(sentencepiece, texts, vocab_size, model)
  except RuntimeError as e:
    # Every character the training queries use (all but the rarest 0.05 %) is a piece: a
    # log with many distinct characters needs more pieces than config_lib's floor.
    found = re.search(r'required_chars\. (\d+) vs (\d+)', str(e))
    if not found:
      raise
    raise errors.ConfigError(
        f'config.data.vocab_size={vocab_size} is too small for this log with sentencepiece: '
        f'it needs at least {found.group(2)} pieces (the special tokens, the 256 bytes and '
        'each character its training queries use)') from None
  vocab = SentencePieceVocab.from_model(model.getvalue())
  if vocab.words[:len(SPECIAL_TOKENS)] != SPECIAL_TOKENS:
    raise AssertionError(f'sentencepiece put the special tokens at '
                         f'{vocab.words[:len(SPECIAL_TOKENS)]}')
  return vocab


def _train_pieces(sentencepiece, texts: Iterable[str], vocab_size: int, model: io.BytesIO
                  ) -> None:
  sentencepiece.SentencePieceTrainer.train(
      sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab_size,
      model_type='unigram', pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
      pad_piece=SPECIAL_TOKENS[PAD_ID], unk_piece=SPECIAL_TOKENS[UNK_ID],
      bos_piece=SPECIAL_TOKENS[BOS_ID], eos_piece=SPECIAL_TOKENS[EOS_ID],
      # A control symbol, not a user-defined one: the text `<sep>` in a query is its
      # characters' pieces, never the separator's id.
      control_symbols=[SPECIAL_TOKENS[SEP_ID]], byte_fallback=True,
      character_coverage=0.9995, num_threads=1, shuffle_input_sentence=False,
      input_sentence_size=0, hard_vocab_limit=False, minloglevel=2)
