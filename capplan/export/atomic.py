"""Atomic writes: a temporary file in the same folder, then os.replace. A failure, Ctrl-C or
SIGTERM (the CLI turns it into SystemExit) leaves any existing file untouched and removes the
temporary file. Only a regular file is ever replaced: a symlink, FIFO, device node or folder
at the target is refused (os.replace would turn it into a regular file, `/dev/null` included
when run as root). `atomic_write_all` writes several files all or none: every temporary file
is written before the first rename."""

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


def _missing_folder(folder: Path) -> str:
    """Why `folder` takes no file: it, or a folder above it, is a file ("/etc/passwd is a
    file, not a folder"), or it does not exist."""
    for p in (folder, *folder.parents):
        if p.exists() and not p.is_dir():
            return f"{p} is a file, not a folder"
    return f"folder {folder} does not exist"


def _temp_beside(path: Path, failure: str) -> str:
    """An empty temporary file in `path`'s folder (its name hides it), after checking the folder
    exists and the target is absent or a regular file; `failure` (with {folder}) heads the
    one-line error when the folder takes no file."""
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise InputError(f"{path}: {_missing_folder(folder)}")
    check_replaceable(path)
    _check_confined(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise InputError(f"{path}: {failure.format(folder=folder)} ({e.strerror or e})") from None
    os.close(fd)
    return tmp


Staged = tuple[Path, Callable[[Path], None]]
"""A file to write: its path and the function that writes its content to a given path."""


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call write(tmp_path), then rename tmp_path over path (a regular file or nothing)."""
    atomic_write_all([(Path(path), write)])


def atomic_write_all(files: list[Staged]) -> list[Path]:
    """Write several files all or none: every file's content goes to its temporary file first;
    only when all are written (and every target is still absent or a regular file, inside its
    folder) are they renamed over their targets. A failure before that leaves every target as
    it was and removes every temporary file. Returns the paths written, in order."""
    temps: list[tuple[Path, str]] = []
    try:
        for path, write in files:
            path = Path(path)
            tmp = _temp_beside(path, "cannot write")
            temps.append((path, tmp))
            _fill(path, tmp, write)
        for path, _ in temps:  # again: something may have appeared while we wrote
            check_replaceable(path)
            _check_confined(path)  # again, just before the rename
        done: list[Path] = []
        for path, tmp in temps:
            try:
                os.replace(tmp, path)
            except OSError as e:
                raise InputError(f"{path}: cannot write ({e.strerror or e})"
                                 + _also_written(done)) from None
            done.append(path)
        return done
    finally:
        for _, tmp in temps:
            Path(tmp).unlink(missing_ok=True)


def _fill(path: Path, tmp: str, write: Callable[[Path], None]) -> None:
    """write(tmp) with the user's usual file mode; an OSError names the target."""
    try:
        write(Path(tmp))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the user's usual mode
    except OSError as e:  # name the target, not the temporary file
        raise InputError(f"{path}: cannot write ({e.strerror or e})") from None


def _also_written(done: list[Path]) -> str:
    return f"; written before it: {', '.join(map(str, done))}" if done else ""


def text_file(path: Path, text: str) -> Staged:
    """A text file to write (UTF-8)."""
    return Path(path), lambda p: p.write_text(text, encoding="utf-8")


def bytes_file(path: Path, data: bytes) -> Staged:
    """A file of bytes to write."""
    return Path(path), lambda p: p.write_bytes(data)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_all([text_file(path, text)])
