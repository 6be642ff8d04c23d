"""Atomic writes: a temporary file in the same folder, then os.replace. A failure leaves any
existing file untouched."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from capplan.errors import InputError


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call write(tmp_path), then rename tmp_path over path."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise InputError(f"{path}: folder {folder} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        write(Path(tmp))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the user's usual mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))
