"""`--mode=serve`'s server (`service.run`: uvicorn, its signals, draining) around an engine
without a model, for the tests that need a process of its own but no trained model:

  python -m tests.stub_server [--config.serve.KEY=VALUE ...]

prints `Serving on http://HOST:PORT ...` once it listens (port 0: a free one)."""

from __future__ import annotations

import sys
import threading
import time

from mtn_jax.data import aol_log
from mtn_jax.serving import engine as engine_lib
from mtn_jax.serving import service as service_lib


class _Reader:
  """Normalises a query as the real reader does (`aol_log.normalize_query`)."""

  @staticmethod
  def query(text: str) -> str:
    return aol_log.normalize_query(text)


class StubEngine(engine_lib.Engine):
  """`engine.Engine`'s request checks without a model: each request is answered with its
  last query and ' more', after `seconds` a batch."""

  step, workdir, personalises, past_read, top_k = 7, '/nowhere/run', False, 0, 5
  knows_users = False
  sizes, widths = (1, 2), (1, 2, 4)

  def __init__(self, seconds: float = 0.0, suggestions=None, personalises: bool = False):
    # pylint: disable=super-init-not-called
    self.seconds, self.suggestions, self.personalises = seconds, suggestions, personalises
    self.past_read = 1000 if personalises else 0
    self.max_session_queries, self.max_query_words = 4, 10
    self.exclude_session_queries = True
    self.reader = _Reader()
    self.warmed = threading.Event()
    self.warmed.set()  # nothing to compile

  def info(self):
    return {'name': 'stub', 'step': self.step, 'workdir': self.workdir, 'score': 'none',
            'how': 'stub', 'top_k': self.top_k, 'max_session_queries': self.max_session_queries,
            'max_query_words': self.max_query_words, 'personalises': self.personalises,
            'user_facing': True}

  def run(self, requests):
    time.sleep(self.seconds)
    return [self.suggestions or [{'query': r.session[-1] + ' more', 'score': 0.0}]
            for r in requests]


def main(argv) -> None:
  prefix = '--config.serve.'
  values = {}
  for arg in argv:
    key, _, value = arg[len(prefix):].partition('=')
    if not arg.startswith(prefix) or not value:
      raise SystemExit(f'{arg}: expected {prefix}KEY=VALUE')
    field = service_lib.ServeSettings.__dataclass_fields__[key]
    values[key] = type(field.default)(value)
  settings = service_lib.ServeSettings(**{'port': 0, **values})
  service_lib.run(service_lib.Service(StubEngine(), settings, compilations=lambda: 0))


if __name__ == '__main__':
  main(sys.argv[1:])
