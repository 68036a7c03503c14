"""How the service's tests talk to it in this process: FastAPI's TestClient, and the address
of a caller on this machine (the service answers some routes only to local callers)."""

import warnings

from starlette import exceptions

with warnings.catch_warnings():
  # starlette asks for httpx2 in place of httpx; the project's tests use httpx elsewhere too,
  # and the client works the same with either.
  warnings.simplefilter('ignore', exceptions.StarletteDeprecationWarning)
  from fastapi.testclient import TestClient  # pylint: disable=g-import-not-at-top,unused-import

LOOPBACK = ('127.0.0.1', 50000)
