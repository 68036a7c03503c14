"""A fork server for the tests' command-line runs (tests/cli.py): `python -m mtn_jax.main`
without paying for the interpreter's start and the libraries' imports on every run.

A tiny run takes 4 to 10 s on a 2-core CPU, and about 3 s of that is starting Python and
importing JAX, Flax, Optax, Orbax and grain; the suite makes well over a hundred such runs.
This server imports those libraries and the package once -- without starting a JAX backend,
so that no device count, XLA flag or compilation has happened yet -- and forks a child per
run. The child takes the run's working directory, environment, arguments and standard
streams, then runs `mtn_jax.main` as `python -m` would (`runpy`, as `__main__`): its exit
code, uncaught exceptions and interpreter shutdown (threads joined, `atexit`) are the real
ones. What children share, unlike fresh interpreters: the string-hash seed (so the order of
a set of strings) and NumPy's unseeded global generator (the package draws from seeded ones;
Python's `random` reseeds itself in a forked child). The resume tests of test_train.py start
their first run as a fresh process (`cli.popen`), so a result that hung on the hash seed
would still differ there. The standard library's `multiprocessing.forkserver` cannot stand
in: its children run a function, not a `__main__` module with its own `sys.argv` and
standard streams.

Protocol (one JSON line each way, on two pipes whose descriptors are this script's
arguments): a request {arguments (those after `-m mtn_jax.main`), env, cwd, stdin, stdout,
stderr} (the last three are paths) is answered by {"pid": child} at once and by {"status":
returncode} when the child ends (negative: killed by that signal, as `subprocess` reports
it). End of input stops the server. `MTN_JAX_TEST_FORK=0` runs every test run in a fresh
interpreter instead (tests/cli.py).
"""

import json
import os
import pathlib
import runpy
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def serve(requests, replies) -> dict:
  """Answers requests until the input ends (then exits); returns only in a forked child,
  the request that child is to run."""
  for line in requests:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
      requests.close()
      replies.close()
      return request
    replies.write(json.dumps({'pid': pid}) + '\n')
    replies.flush()
    _, wait_status = os.waitpid(pid, 0)
    replies.write(json.dumps({'status': os.waitstatus_to_exitcode(wait_status)}) + '\n')
    replies.flush()
  sys.exit(0)


def become(request: dict) -> None:
  """Makes this forked child look like a fresh `python -m mtn_jax.main ...` process."""
  os.setpgid(0, 0)  # its own process group, like a `subprocess` child killed on a time-out
  for fd, path, flags in ((0, request['stdin'], os.O_RDONLY),
                          (1, request['stdout'], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                          (2, request['stderr'], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
    opened = os.open(path, flags, 0o644)
    os.dup2(opened, fd)
    os.close(opened)
  os.chdir(request['cwd'])
  os.environ.clear()
  os.environ.update(request['env'])
  sys.argv = ['-m', *request['arguments']]  # runpy makes the first the module's path
  sys.path[0] = request['cwd']  # `python -m` puts the working directory first


def main() -> None:
  read_fd, write_fd = map(int, sys.argv[1:3])
  sys.path[0] = str(REPO)
  # What every mode imports; `mtn_jax.main` itself is left to the child, since it defines
  # the command line's flags and runs as `__main__` there.
  # pylint: disable=g-import-not-at-top,unused-import
  import jax
  import jax.numpy
  import flax.linen
  import optax
  import orbax.checkpoint
  import grain
  from mtn_jax import cli, config_lib, main_job
  from mtn_jax.inference import pipeline, suggest, trained
  # pylint: enable=g-import-not-at-top,unused-import
  with os.fdopen(read_fd, 'r') as requests, os.fdopen(write_fd, 'w') as replies:
    request = serve(requests, replies)
  become(request)
  runpy.run_module('mtn_jax.main', run_name='__main__', alter_sys=True)


if __name__ == '__main__':
  main()
