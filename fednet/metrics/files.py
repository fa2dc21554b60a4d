"""Writing the results folder safely: every file goes through a temporary file in the same folder,
flushed, fsynced and renamed over the old one (os.replace), so a failed write (disk full, read-only
file system, no permission) never leaves half a file and never destroys the good one. Errors become
OutputError, one line that names the path."""
from __future__ import annotations

import errno
import json
import math
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from fednet.errors import FednetError


class OutputError(FednetError):
    """A file or folder of the results could not be written (the message names the path)."""

    def __init__(self, path: str | Path, err: OSError) -> None:
        self.path = Path(path)
        self.errno = err.errno
        reason = err.strerror or str(err) or type(err).__name__
        super().__init__(f"cannot write {path}: {reason}")


def clean_json(v: Any) -> Any:
    """JSON has no NaN/inf: null means "not a number" in our files."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): clean_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [clean_json(x) for x in v]
    return v


def make_dir(path: Path) -> None:
    """mkdir -p; an OSError becomes OutputError naming the folder."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(e.filename or path, e) from None


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (best effort: some file systems refuse it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _unlink(p: Path) -> None:
    try:
        p.unlink()
    except OSError:
        pass


@contextmanager
def atomic_file(path: str | Path, text: bool = False) -> Iterator[IO[Any]]:
    """Open a temporary file next to `path`; on a clean exit it is fsynced and renamed to `path`.

    On any error the temporary file is removed and `path` keeps its old content; an OSError
    becomes OutputError("cannot write PATH: reason")."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:  # O_EXCL: never follow a planted link; 0o666 & ~umask like a plain open()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as e:
        raise OutputError(path, e) from None
    try:
        with os.fdopen(fd, "w" if text else "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as e:
        _unlink(tmp)
        raise OutputError(path, e) from None
    except BaseException:
        _unlink(tmp)
        raise
    fsync_dir(path.parent)


def write_bytes(path: str | Path, data: bytes) -> None:
    """Replace `path` with `data` atomically."""
    with atomic_file(path) as fh:
        fh.write(data)


def write_text(path: str | Path, text: str) -> None:
    """Replace `path` with `text` (UTF-8) atomically."""
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, data: Any) -> None:
    """Replace `path` with indented JSON (NaN/inf as null) atomically."""
    write_text(path, json.dumps(clean_json(data), indent=2) + "\n")


def write_jsonl(path: str | Path, rows: list[Any]) -> None:
    """Replace `path` with one JSON object per line atomically."""
    write_text(path, "".join(json.dumps(clean_json(r)) + "\n" for r in rows))


def remove(path: Path) -> None:
    """Delete a file if it is there; an OSError other than 'not there' becomes OutputError."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as e:
        raise OutputError(path, e) from None


WRITE_ERRNOS = frozenset({errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
