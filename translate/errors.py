"""The one exception type for user mistakes, and the checks every command shares.

Anything the user can fix (a config key, a path, a corrupt file, a full disk) raises
`UserError` with one line that names the file, key or line at fault. The CLI prints it on
stderr without a traceback and exits with status 2. Real bugs keep their traceback.
docs/errors.md lists every case and what the user sees.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


class UserError(Exception):
    """A mistake the user can fix; its message is one self-contained line."""

    exit_code = 2


# errno values that describe the user's disk or permissions, never a fault in the code
DISK_FULL = {errno.ENOSPC, errno.EDQUOT}
ENVIRONMENT = DISK_FULL | {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR}


def os_error_line(error: OSError) -> str | None:
    """One line for an OSError that the user's disk or permissions caused (naming the file);
    None for any other, which is left to show its traceback."""
    if error.errno not in ENVIRONMENT:
        return None
    where = f"{error.filename}: " if error.filename else ""
    if error.errno in DISK_FULL:
        return f"{where}the disk is full ({error.strerror}); free some space and run again"
    return f"{where}{error.strerror or os.strerror(error.errno)}"


def is_disk_full(error: BaseException | None) -> bool:
    """Whether `error`, or an error that led to it, is a full disk or quota (torch.save, for one,
    turns the OSError of a failed write into a RuntimeError)."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in DISK_FULL:
            return True
        error = error.__cause__ or error.__context__
    return False


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` says a tensor did not fit: torch.OutOfMemoryError (CUDA), the CPU
    allocator's RuntimeError, or Python's MemoryError."""
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    return isinstance(error, RuntimeError) and "can't allocate memory" in str(error)


def check_output_path(path: str | Path, what: str, inputs: Iterable[str | Path | None] = ()) -> Path:
    """A file the user asked us to write: its directory must exist and be writable, and it
    must be neither a directory nor one of `inputs` (writing it would destroy them)."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{what} {path} is a directory; give a file name")
    if not path.parent.is_dir():
        why = "is not a directory" if path.parent.exists() else "does not exist"
        raise UserError(f"{what} {path}: directory {path.parent} {why}")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise UserError(f"{what} {path}: directory not writable: {path.parent}")
    if path.exists() and any(p is not None and Path(p).exists() and path.samefile(p) for p in inputs):
        raise UserError(f"{what} {path} is one of the input files; choose another file")
    return path


def text_lines(f: IO[bytes], name: str) -> Iterator[str]:
    """The lines of a UTF-8 byte stream without their ending (LF or CRLF), a leading BOM dropped;
    undecodable bytes are a UserError naming the file, line and column. Closes `f` at the end."""
    with f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise UserError(
                    f"{name}:{number}: not UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1})"
                ) from None
            if number == 1:
                line = line.removeprefix("\ufeff")
            yield line.removesuffix("\n").removesuffix("\r")


@contextmanager
def atomic_write(path: str | Path, mode: str = "w") -> Iterator[IO]:
    """A file object for `path` that lands there only if the block succeeds: it writes a temporary
    file in the same directory, fsyncs it, gives it the permissions a new file would get (the
    umask's), and renames it over `path`; on any error the temporary file is removed and the
    file that was at `path` is left as it was."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8", "newline": "\n"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
