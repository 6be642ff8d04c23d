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


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call write(tmp_path), then rename tmp_path over path (a regular file or nothing)."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise InputError(f"{path}: folder {folder} does not exist")
    check_replaceable(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        write(Path(tmp))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the user's usual mode
        check_replaceable(path)  # again: something may have appeared while we wrote
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))
