"""The one exception type for user mistakes.

Anything the user can fix (a config key, a path, a corrupt file) raises `UserError`
with one line that names the file, key or line at fault. The CLI prints it on stderr
without a traceback and exits with status 2. Real bugs keep their traceback.
"""


class UserError(Exception):
    """A mistake the user can fix; its message is one self-contained line."""

    exit_code = 2
