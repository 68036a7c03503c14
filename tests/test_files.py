"""The one atomic-write helper: a file is there whole or as it was, never half written."""

import os
import stat

import pytest

from mtn_jax import files


def test_write_replaces_the_whole_file_and_leaves_no_temporary(tmp_path):
  path = tmp_path / 'sub' / 'results.json'
  files.write_text(path, 'first\n')
  files.write_text(path, 'second\n')
  assert path.read_text() == 'second\n'
  with files.atomic_open(path, 'wb') as f:
    f.write(b'\x00\x01')
  assert path.read_bytes() == b'\x00\x01'
  assert os.listdir(path.parent) == ['results.json']


def test_an_error_mid_write_keeps_the_old_file(tmp_path):
  path = tmp_path / 'results.json'
  files.write_text(path, 'old\n')
  with pytest.raises(RuntimeError):
    with files.atomic_open(path) as f:
      f.write('half of the new')
      raise RuntimeError('disk full')
  assert path.read_text() == 'old\n'
  with pytest.raises(KeyboardInterrupt):
    with files.atomic_path(path) as temporary:
      with open(temporary, 'w', encoding='utf-8') as f:
        f.write('half')
      raise KeyboardInterrupt
  assert path.read_text() == 'old\n'
  assert os.listdir(tmp_path) == ['results.json']
  with pytest.raises(KeyboardInterrupt):  # Ctrl-C mid-write leaves no temporary either
    with files.atomic_open(path) as f:
      f.write('half')
      raise KeyboardInterrupt
  assert os.listdir(tmp_path) == ['results.json'] and path.read_text() == 'old\n'


def test_a_written_file_is_synced_whole_before_it_is_renamed_in(tmp_path, monkeypatch):
  # A crash after the rename then finds the whole file, not an empty or truncated one.
  synced, fsync = [], os.fsync

  def spy(fd):
    synced.append(os.fstat(fd).st_size)
    return fsync(fd)
  monkeypatch.setattr(files.os, 'fsync', spy)
  files.write_text(tmp_path / 'r.json', 'x' * 100)
  assert synced == [100]


def test_atomic_path_hands_a_writer_a_name_beside_the_target(tmp_path):
  path = tmp_path / 'index.bin'
  with files.atomic_path(path) as temporary:
    assert os.path.dirname(temporary) == str(tmp_path) and not path.exists()
    with open(temporary, 'wb') as f:
      f.write(b'vectors')
  assert path.read_bytes() == b'vectors'
  with pytest.raises(ValueError, match='whole files'):
    with files.atomic_open(path, 'a'):
      pass


def test_written_files_get_the_permissions_of_a_plain_open(tmp_path):
  plain = tmp_path / 'plain.txt'
  plain.write_text('x')
  files.write_text(tmp_path / 'atomic.txt', 'x')
  with files.atomic_path(tmp_path / 'by_name.bin') as name:
    with open(name, 'wb') as f:
      f.write(b'x')
  mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)
  assert mode(tmp_path / 'atomic.txt') == mode(plain) == mode(tmp_path / 'by_name.bin')


def test_replace_dir_puts_the_new_folder_in_and_leaves_nothing_beside(tmp_path):
  target, build = tmp_path / 'index', tmp_path / 'build'
  build.mkdir()
  (build / 'a').write_text('first')
  files.replace_dir(str(build), str(target), '.old-')  # no folder there yet
  assert (target / 'a').read_text() == 'first' and not build.exists()
  build.mkdir()
  (build / 'b').write_text('second')
  files.replace_dir(str(build), str(target), '.old-')
  assert sorted(p.name for p in target.iterdir()) == ['b']
  assert sorted(p.name for p in tmp_path.iterdir()) == ['index']  # no old folder left


def test_replace_dir_cut_short_leaves_the_old_folder_aside_under_its_prefix(tmp_path,
                                                                           monkeypatch):
  target, build = tmp_path / 'index', tmp_path / 'build'
  target.mkdir()
  (target / 'a').write_text('old')
  build.mkdir()
  renames, os_rename = [], os.rename

  def rename(source, destination):
    if renames:  # the second rename, build -> target, never happens
      raise KeyboardInterrupt
    renames.append(destination)
    os_rename(source, destination)
  monkeypatch.setattr(files.os, 'rename', rename)
  with pytest.raises(KeyboardInterrupt):
    files.replace_dir(str(build), str(target), '.data-old-')
  monkeypatch.undo()
  # Under the caller's prefix, which its clean-up looks for (preprocessing's '.data-old-').
  [aside] = [p for p in tmp_path.iterdir() if p.name.startswith('.data-old-')]
  assert (aside / 'a').read_text() == 'old' and build.exists()


def test_a_killed_writers_temporaries_are_removed_and_nothing_else(tmp_path):
  """What `atomic_path` leaves beside a file when its process is killed (a ranker's model
  file) is removed before the file is written again; the file itself, another file's
  temporaries and one made since this process started (a write in progress, of another
  process of the same run) stay."""
  names = ['model.txt', '.model.txt.k3j2.tmp', '.model.txt.x9.npz', '.ranker.json.a1.tmp',
           'model.txt.bak', '.model.txt.now.tmp']
  for name in names:
    (tmp_path / name).write_text('x')
    if name != '.model.txt.now.tmp':
      os.utime(tmp_path / name, (0, 0))  # made long before this process
  with files.atomic_path(tmp_path / 'other.txt') as path:  # a temporary of the same form
    assert os.path.basename(path).startswith('.other.txt.')
  files.remove_temporaries(tmp_path / 'model.txt')
  assert sorted(os.listdir(tmp_path)) == ['.model.txt.now.tmp', '.ranker.json.a1.tmp',
                                          'model.txt', 'model.txt.bak', 'other.txt']
  files.remove_temporaries(tmp_path / 'nowhere' / 'model.txt')  # no folder: nothing to do


def test_temporaries_are_found_beside_a_relative_path_and_only_its_own(tmp_path, monkeypatch):
  """A workdir named relatively (`--workdir=W`) is looked in; a temporary of another file
  whose name starts alike (`model.txt2`), a folder of a temporary's name, and one made the
  instant this process started stay."""
  for name in ('.model.txt.a.tmp', '.model.txt2.b.tmp', '.model.txt.c.tmp'):
    (tmp_path / name).write_text('x')
    if name != '.model.txt.c.tmp':
      os.utime(tmp_path / name, (0, 0))
  os.mkdir(tmp_path / '.model.txt.d')
  os.utime(tmp_path / '.model.txt.d', (0, 0))
  monkeypatch.setattr(files, '_STARTED', os.path.getmtime(tmp_path / '.model.txt.c.tmp'))
  monkeypatch.chdir(tmp_path)
  files.remove_temporaries('model.txt')
  assert sorted(os.listdir(tmp_path)) == ['.model.txt.c.tmp', '.model.txt.d',
                                          '.model.txt2.b.tmp']
