"""Atomic writes: a temporary file in the same folder, then os.replace. A failure, Ctrl-C or
SIGTERM (the CLI turns it into SystemExit) leaves any existing file untouched and removes the
temporary file. Only a regular file is ever replaced: a symlink, FIFO, device node or folder
at the target is refused (os.replace would turn it into a regular file, `/dev/null` included
when run as root)."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from capplan.errors import InputError

_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a device node"), (stat.S_ISBLK, "a device node"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def check_replaceable(path: Path) -> None:
    """InputError unless path is absent or a regular file (not following symlinks)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise InputError(f"{path}: cannot write ({e.strerror or e})") from None
    for test, kind in _KINDS:
        if test(mode):
            raise InputError(f"{path} is {kind}: capplan only replaces regular files; "
                             "write to another path")
    if not stat.S_ISREG(mode):
        raise InputError(f"{path} is not a regular file: write to another path")


_CONFINED: dict[str, Path] = {}
"""Target path -> the resolved folder it must stay in (a plan file's own exports)."""


def confine(path: Path, root: Path) -> None:
    """Writes to `path` must land inside `root` (resolved now): checked again at write time,
    before the temporary file is made and just before the rename, so a sub-folder swapped for
    a symbolic link while a long plan runs cannot carry the write outside."""
    _CONFINED[str(path)] = Path(root).resolve()


def _check_confined(path: Path) -> None:
    root = _CONFINED.get(str(path))
    if root is not None and not path.parent.resolve().is_relative_to(root):
        raise InputError(f"{path}: its folder now resolves outside {root} through a symbolic "
                         "link; nothing written")


def check_writable(path: Path) -> None:
    """Before long work whose result goes to `path`: the folder exists and takes a file, and
    the target is absent or a regular file (a benchmark's minutes are not lost at the end)."""
    path = Path(path)
    tmp = _temp_beside(path, "cannot write in {folder}")
    os.unlink(tmp)


def _temp_beside(path: Path, failure: str) -> str:
    """An empty temporary file in `path`'s folder (its name hides it), after checking the folder
    exists and the target is absent or a regular file; `failure` (with {folder}) heads the
    one-line error when the folder takes no file."""
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise InputError(f"{path}: folder {folder} does not exist")
    check_replaceable(path)
    _check_confined(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise InputError(f"{path}: {failure.format(folder=folder)} ({e.strerror or e})") from None
    os.close(fd)
    return tmp


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call write(tmp_path), then rename tmp_path over path (a regular file or nothing)."""
    path = Path(path)
    tmp = _temp_beside(path, "cannot write")
    try:
        write(Path(tmp))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the user's usual mode
        check_replaceable(path)  # again: something may have appeared while we wrote
        _check_confined(path)  # again, just before the rename
        os.replace(tmp, path)
    except OSError as e:  # name the target, not the temporary file
        Path(tmp).unlink(missing_ok=True)
        raise InputError(f"{path}: cannot write ({e.strerror or e})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))
