"""mtn_jax from Python: a trained workdir's suggestions, as `--mode=suggest` and the service
give them.

    from configs import aol                            # the checkout on the path (PYTHONPATH)
    from mtn_jax import api
    config = aol.get_config('small')                   # the config W was trained with,
    config.data.raw_files = LOG                        # overridden as on its command line
    suggester = api.load(config, 'W')
    suggester.suggest(['cheap flights'])               # [{'query', 'score', ...}, ...]
    suggester.suggest(['cheap flights'], past=['hotels in paris', 'weather paris'], k=10)
    suggester.suggest_many([['weather'], ['ebay', 'ebay motors']])

A session is read as the service reads a request (`serving.engine.Engine.check`): each query
normalised as the corpus's are, and one the model cannot read refused with a ValueError that
names it (`session[2]`: an empty query, a control character, more words than the model
reads), as is a session of more queries than the model reads. `past` is the user's earlier
queries, oldest first, which a model or strategy that reads a user's past takes its latest of
(`Suggester.past_read`); the lists are the service's for a user whose history holds them.
The protocol is the user-facing one (no query of the session suggested again) unless the
config sets `decode.exclude_session_queries`. A suggestion holds what the service's response
does (`serving.app.Suggestion`). Parameters live on one device; each batch size and session
length compiles once, on the first call that needs it (kept between processes only where
JAX's compilation cache is set, `JAX_COMPILATION_CACHE_DIR`). `user` names a training user by
the log's id, as the service's `user` does, for a ranker that knows its training users by id
(the zero attention family's HEM, `Suggester.knows_users`); any other model refuses it.
"""

from __future__ import annotations

import dataclasses
import operator
import os
from collections.abc import Sequence

import ml_collections

from mtn_jax import cli
from mtn_jax import config_lib
from mtn_jax.inference import pipeline as pipeline_lib
from mtn_jax.inference import suggest as suggest_lib
from mtn_jax.inference import inputs
from mtn_jax.inference import trained as trained_lib
from mtn_jax.serving import app as app_lib
from mtn_jax.serving import engine as engine_lib

_SUGGESTION_FIELDS = frozenset(app_lib.Suggestion.model_fields)


@dataclasses.dataclass
class Suggester:
  """A workdir's suggestion pipeline answering sessions (see the module docstring)."""

  engine: engine_lib.Engine

  @property
  def past_read(self) -> int:
    """How many of a user's latest earlier queries the lists read (0: none)."""
    return self.engine.past_read

  @property
  def knows_users(self) -> bool:
    """Whether the lists read a training user's id (`user`)."""
    return self.engine.knows_users

  @property
  def info(self) -> dict:
    """What the service's page says of the model: its name, step, strategy, top_k, ..."""
    return self.engine.info()

  def suggest(self, session: Sequence[str], *, past: Sequence[str] = (),
              user: str | None = None, k: int | None = None) -> list[dict]:
    """The suggestions after `session` (its queries so far, oldest first), best first:
    {'query', 'score', ...} as `--mode=suggest` and the service give them; `k` of them
    (default `config.decode.top_k`). `past`: the user's earlier queries, oldest first;
    `user`: their id in the training log."""
    return self.suggest_many([session], pasts=[past], users=[user], k=k)[0]

  def suggest_many(self, sessions: Sequence[Sequence[str]], *,
                   pasts: Sequence[Sequence[str]] | None = None,
                   users: Sequence[str | None] | None = None,
                   k: int | None = None) -> list[list[dict]]:
    """`suggest` of each session (with each user's `pasts` and id, `users`), in batches of
    at most `config.serve.max_batch`: the same lists as one at a time."""
    if isinstance(sessions, str):
      raise TypeError('sessions: a list of sessions, each a list of queries')
    if isinstance(users, str):  # its letters would be read as users
      raise TypeError('users: a list of user ids (str or None), one a session')
    for name, given in (('pasts', pasts), ('users', users)):
      if given is not None and len(given) != len(sessions):
        raise ValueError(f'{name}: {len(given)} for {len(sessions)} sessions')
    pasts = pasts if pasts is not None else [()] * len(sessions)
    users = users if users is not None else [None] * len(sessions)
    if k is not None:
      # operator.index takes every integer type (a numpy one too) and refuses a float, whose
      # fraction would be dropped; a bool is refused as the service refuses `true`.
      try:
        whole = None if isinstance(k, bool) else operator.index(k)
      except TypeError:
        whole = None
      if whole is None:
        raise TypeError(f'k: a whole number, got {k!r}')
      k = whole
    requests = [self._request(i, session, past, user, k)
                for i, (session, past, user) in enumerate(zip(sessions, pasts, users))]
    # What the service answers of each suggestion (`app.Suggestion`), no more.
    return [[{key: value for key, value in suggestion.items()
              if key in _SUGGESTION_FIELDS and value is not None} for suggestion in shown]
            for shown in self.engine.run(requests)]

  def _request(self, i: int, session: Sequence[str], past: Sequence[str], user: str | None,
               k: int | None) -> engine_lib.Request:
    where = f'sessions[{i}]'
    # Read once: an iterator (a generator) would be used up by the check below, and its
    # queries then read as none (the past silently dropped, the session refused as empty).
    session, past = (texts if isinstance(texts, str) else list(texts)
                     for texts in (session, past))
    for name, texts in (('', session), ('past', past)):
      if isinstance(texts, str) or not all(isinstance(q, str) for q in texts):
        raise TypeError(f'{where}{"." + name if name else ""}: a list of queries (str), got '
                        f'{texts!r}')
    if user is not None:
      if not isinstance(user, str):  # as the service refuses a number
        raise TypeError(f'{where}.user: the training log\'s id as a str, got {user!r}')
      if not self.knows_users:
        # The service takes a user to keep their past; here the past is given (`past`).
        raise ValueError(f'{where}.user: this model knows no user by id'
                         + (': give their earlier queries as past' if self.past_read
                            else ' (it reads no user): leave it out'))
    try:
      request = self.engine.check(list(session), k, user)
    except engine_lib.BadInput as e:
      raise ValueError(str(e) if e.field == 'k' else f'{where}.user: {e.message}'
                       if e.field == 'user' else f'{where}: {e}') from None
    if not past:
      return request
    if not self.past_read:
      raise ValueError(f'{where}.past: this model reads no user\'s past (it was trained '
                       'without users\' histories, and its strategy reads none): leave it out')
    for j, text in enumerate(past):
      if refused := inputs.refused_character(text):
        raise ValueError(f'{where}.past[{j}]: holds {refused}: a query is text')
    # Normalised as the service's history keeps a user's queries; one of nothing once
    # normalised (blank) is no query.
    history = tuple(q for q in (self.engine.reader.query(text) for text in past) if q)
    return dataclasses.replace(request, history=history[max(0, len(history) - self.past_read):])


def load(config: ml_collections.ConfigDict, workdir: str, log=print) -> Suggester:
  """The suggester of `workdir`'s best checkpoint under `config`, the config it was trained
  with as the command line takes it (`configs/aol.py`'s `get_config('small')` and the same
  overrides, set on it): refused as `--mode=suggest` refuses it where it cannot work or is not
  the workdir's model (the decoding settings, `config.decode` and `config.suggest`, may
  differ). `log` gets the notes the command line prints.

  Raises:
    mtn_jax.errors.Error: a config it cannot take (the key named), no trained model there.
  """
  workdir = os.path.expanduser(workdir)
  config = config.copy_and_resolve_references()
  unknown = cli.unknown_key(config)  # a key set in a notebook as in a config file
  if unknown:
    raise config_lib.ConfigError(unknown)
  config_lib.expand_home(config)
  config_lib.validate(config, 'suggest')
  trained_lib.check_config(config, workdir)
  config = suggest_lib.with_protocol(config, user_facing=True)
  pipeline = pipeline_lib.Pipeline.load(config, workdir, log=log)
  return Suggester(engine_lib.Engine(pipeline, config.serve.max_batch,
                                     bool(config.decode.exclude_session_queries)))
