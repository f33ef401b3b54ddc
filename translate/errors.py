"""The one exception type for user mistakes, and how errors of the environment are recognised.

Anything the user can fix (a config key, a path, a corrupt file, a full disk) raises
`UserError` with one line that names the file, key or line at fault. The CLI prints it on
stderr without a traceback and exits with status 2. Real bugs keep their traceback.
docs/errors.md lists every case and what the user sees.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable


class UserError(Exception):
    """A mistake the user can fix; its message is one self-contained line."""

    exit_code = 2


def run_script(main: Callable[[], object]) -> None:
    """Run a script's `main`: a UserError ends it with one `error:` line (status 2), as the CLI does."""
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)


# errno values that describe the user's disk or permissions, never a fault in the code
DISK_FULL = {errno.ENOSPC, errno.EDQUOT}
ENVIRONMENT = DISK_FULL | {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR}


def os_error_line(error: OSError, then: str = "run again") -> str | None:
    """One line for an OSError that the user's disk or permissions caused (naming the file);
    None for any other, which is left to show its traceback. `then`: what to do once space is freed."""
    if error.errno not in ENVIRONMENT:
        return None
    where = f"{error.filename}: " if error.filename else ""
    if error.errno in DISK_FULL:
        return f"{where}the disk is full ({error.strerror}); free some space and {then}"
    return f"{where}{error.strerror or os.strerror(error.errno)}"


def is_disk_full(error: BaseException | None) -> bool:
    """Whether `error`, or an error that led to it, is a full disk or quota (torch.save, for one,
    turns the OSError of a failed write into a RuntimeError)."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in DISK_FULL:
            return True
        error = error.__cause__ or error.__context__
    return False
