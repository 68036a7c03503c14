"""Writing files so that a reader never sees half of one: the one atomic-write helper; and
the workdir's lock, so that one run at a time writes its corpus and checkpoints.

A crash, a Ctrl-C or a full disk in the middle of a write leaves the old file (or none), never
a truncated one: the bytes go to a temporary file in the same folder, are flushed to disk, and
the temporary file then replaces the target in one `os.replace` (atomic on POSIX and Windows
within a file system). Folders are made as needed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import IO

from mtn_jax import errors


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = 'w', *, encoding: str | None = 'utf-8'
                ) -> Iterator[IO]:
  """Opens a temporary file beside `path` for writing; on a clean exit of the block it
  replaces `path`, on an exception it is removed and `path` is untouched.

  Args:
    path: the file to write.
    mode: 'w' (text, `encoding`) or 'wb' (bytes).
  """
  if mode not in ('w', 'wb'):
    raise ValueError(f"atomic_open writes whole files: mode 'w' or 'wb', got {mode!r}")
  path = os.fspath(path)
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  # A unique name in the target's folder: two writers never share a temporary file, and the
  # final rename stays within one file system.
  handle, temporary = tempfile.mkstemp(dir=folder, prefix=f'.{os.path.basename(path)}.',
                                       suffix='.tmp')
  try:
    _as_created(handle)
    with os.fdopen(handle, mode, encoding=None if 'b' in mode else encoding) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.replace(temporary, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.remove(temporary)
    raise


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = '') -> Iterator[str]:
  """A temporary path beside `path` for a library that writes a file by its name (usearch,
  a generator of its own); on a clean exit of the block it replaces `path`, on an exception
  it is removed. `suffix`: the temporary name's ending, for writers that check it."""
  path = os.fspath(path)
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  handle, temporary = tempfile.mkstemp(dir=folder, prefix=f'.{os.path.basename(path)}.',
                                       suffix=suffix or '.tmp')
  try:
    _as_created(handle)
  finally:
    os.close(handle)
  try:
    yield temporary
    os.replace(temporary, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.remove(temporary)
    raise


# When this process started (about: this module is among the first it imports).
_STARTED = time.time()


def remove_temporaries(path: str | os.PathLike) -> None:
  """Removes what `atomic_path` or `atomic_open` left beside `path` when a process was killed
  while writing it (`.<name>.<random part>...`), those made before this process started: a
  write in progress, of this process or of another of the same run (the processes of a
  multi-host run write the same files), is newer."""
  folder, name = os.path.split(os.path.abspath(os.fspath(path)))
  for entry in os.listdir(folder) if os.path.isdir(folder) else ():
    if entry.startswith(f'.{name}.'):
      with contextlib.suppress(FileNotFoundError, IsADirectoryError):
        where = os.path.join(folder, entry)
        if os.path.getmtime(where) < _STARTED:
          os.remove(where)


def _umask() -> int:
  """The process's umask, read without setting it where Linux shows it (setting it to read
  it would, for a moment, change it for every thread)."""
  try:
    with open('/proc/self/status', encoding='ascii') as f:
      for line in f:
        if line.startswith('Umask:'):
          return int(line.split()[1], 8)
  except (OSError, ValueError):
    pass
  umask = os.umask(0o022)
  os.umask(umask)
  return umask


def _as_created(handle: int) -> None:
  """The permissions a plain `open` gives a new file (0o666 less the umask): mkstemp makes
  its file private, which would leave results and data unreadable to the user's group."""
  os.fchmod(handle, 0o666 & ~_umask())


def write_text(path: str | os.PathLike, text: str) -> None:
  """Writes `text` (UTF-8) to `path` atomically."""
  with atomic_open(path) as f:
    f.write(text)


def replace_dir(build: str, target: str, old_prefix: str) -> None:
  """Makes the folder `build` the folder `target`: the old `target` renamed aside (beside it,
  its name `old_prefix` and a random part), `build` renamed in, the old one deleted. Two
  renames, not a copy: a reader meets the old folder or the new one, and a crash between
  them leaves the old one aside for the caller's clean-up of `old_prefix` folders."""
  if not os.path.exists(target):
    os.rename(build, target)
    return
  old = tempfile.mkdtemp(prefix=old_prefix, dir=os.path.dirname(os.path.abspath(target)))
  os.rmdir(old)  # a fresh name beside `target`, on its file system
  os.rename(target, old)
  os.rename(build, target)
  shutil.rmtree(old)


def cannot_create(path: str | os.PathLike) -> str | None:
  """Why a file or folder cannot be made at `path` where none is (the nearest existing
  folder above it is a file, or is not writable), else None: said before a run's work
  rather than as an OS error after it."""
  parent = os.path.dirname(os.path.abspath(path))
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    return f'{parent} is a file, not a folder'
  if not os.access(parent, os.W_OK | os.X_OK):
    return f'no permission to create it in {parent}'
  return None


def cannot_write_in(folder: str | os.PathLike) -> str | None:
  """Why files cannot be written in `folder` (or the folder made, where none is), else None:
  said before a run's work rather than as an OS error after it."""
  if os.path.isdir(folder):
    return (None if os.access(folder, os.W_OK | os.X_OK)
            else f'no permission to write in {os.path.abspath(folder)}')
  if os.path.exists(folder):
    return f'{os.path.abspath(folder)} is a file, not a folder'
  return cannot_create(folder)


class WorkdirBusy(errors.Error):
  """Another run is training or preprocessing in the workdir; the message names its process."""


# The workdir's lock file, held while a run writes its corpus or trains (`workdir_alone`).
WORKDIR_LOCK = '.workdir.lock'
_HELD: set[str] = set()  # the workdirs this process holds the lock of


@contextlib.contextmanager
def workdir_alone(workdir: str, doing: str) -> Iterator[None]:
  """Holds `workdir`'s lock for the block (`doing`, e.g. 'training', names what for), or
  raises WorkdirBusy naming the process that holds it. An advisory lock (`fcntl.flock`) the
  system releases when the process ends, however it ends, so a killed run leaves nothing to
  clean up; a process that holds it takes it again at once (training builds the corpus)."""
  workdir = os.path.abspath(workdir)
  if workdir in _HELD:
    yield
    return
  os.makedirs(workdir, exist_ok=True)
  f = open(os.path.join(workdir, WORKDIR_LOCK), 'a+', encoding='utf-8')  # pylint: disable=consider-using-with
  try:
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    f.seek(0)
    pid, _, what = f.read().strip().partition(' ')
    f.close()
    raise WorkdirBusy(f'{workdir}: another run is {what or "working"} in it (process '
                      f'{pid or "unknown"}); wait for it to end, or use another workdir'
                      ) from None
  f.seek(0)
  f.truncate()
  f.write(f'{os.getpid()} {doing}')
  f.flush()
  _HELD.add(workdir)
  try:
    yield
  finally:
    _HELD.discard(workdir)
    fcntl.flock(f, fcntl.LOCK_UN)
    f.close()
