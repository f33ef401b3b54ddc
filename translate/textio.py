"""Text files in and out: the one home of line reading, output-path checks and atomic writes.

`read_lines` reads a UTF-8 file (or stdin for the string "-") lazily, line ends and a leading BOM
dropped; `read_all_lines` is the same as a list that must not be empty; `read_text` reads a
whole document as it is. `check_output_path` is
the one check of a file the user asked us to write; `atomic_write` writes it under a temporary
name renamed at the end, so an error never leaves a half-written file. `write_translations`,
`write_json` and `write_text` are the writers the commands use.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Literal

from translate.errors import UserError

Translation = list[tuple[str, float]]  # one input line's n-best list: (text, score), best first


# ---------------------------------------------------------------------------- reading


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
                    + (compressed(raw) if number == 1 else "")
                ) from None
            if number == 1:
                line = line.removeprefix("\ufeff")
            yield line.removesuffix("\n").removesuffix("\r")


def read_lines(path: str | Path = "-", what: str = "input") -> Iterator[str]:
    """The lines of a UTF-8 text file, or of stdin for the string "-" (a Path is always a file),
    without line ends, read lazily. A missing file, a directory or undecodable bytes raise a
    UserError naming the file (and line); `what` names the file's role in the message."""
    if isinstance(path, str) and path == "-":
        return text_lines(_stdin(), "<stdin>")
    return text_lines(_open(Path(path), what), str(path))


def _open(path: Path, what: str) -> IO[bytes]:
    if not path.exists():
        raise UserError(f"{what} file not found: {path}")
    if path.is_dir():
        raise UserError(f"{what} file {path} is a directory; give a text file")
    return path.open("rb")


def check_same_length(path: str | Path, lines: list[str], ref: str | Path, references: list[str]) -> None:
    """A UserError unless the two files have as many lines; it says so where the longer one's extra
    lines are blank ones at its end (an editor's extra newline)."""
    if len(lines) == len(references):
        return
    message = f"{path} has {len(lines)} line{'s' * (len(lines) != 1)} but {ref} has {len(references)}: they must match"
    longer, name = (lines, path) if len(lines) > len(references) else (references, ref)
    blank = next((k for k, line in enumerate(reversed(longer)) if line.strip()), len(longer))
    if blank >= abs(len(lines) - len(references)):
        message += f" ({name} ends in {blank} blank line{'s' * (blank > 1)})"
    raise UserError(message)


def check_references(path: str | Path, references: list[str]) -> None:
    """A UserError where a reference file has only blank lines: a score against it means nothing."""
    if not any(line.strip() for line in references):
        raise UserError(f"reference file {path} has only blank lines: nothing to score against")


def read_all_lines(path: str | Path, what: str) -> list[str]:
    """All the lines of a file (see read_lines) as a list; an empty file is a UserError."""
    lines = list(read_lines(Path(path), what))
    if not lines:
        raise UserError(f"{what} file {path} is empty: nothing to score")
    return lines


def read_text(path: str | Path = "-", what: str = "input") -> str:
    """A whole UTF-8 file (or stdin for the string "-") as it is, line ends included (a document:
    HTML, Markdown), a leading BOM dropped; the same errors as read_lines."""
    if isinstance(path, str) and path == "-":
        f, name = _stdin(), "<stdin>"
    else:
        f, name = _open(Path(path), what), str(path)
    with f:
        raw = f.read()
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        hint = compressed(raw)
        raise UserError(f"{name}:{line}: not UTF-8 (byte {raw[e.start]:#04x} at column {column}){hint}") from None


COMPRESSED = {b"\x1f\x8b": "gzip", b"\xfd7zXZ\x00": "xz", b"(\xb5/\xfd": "zstd", b"PK\x03\x04": "zip"}


def compressed(head: bytes) -> str:
    """Where a file's first bytes are those of a compressed file, a hint saying so."""
    kind = next((kind for magic, kind in COMPRESSED.items() if head.startswith(magic)), None)
    return f": a {kind} file? decompress it first" if kind else ""


def _stdin() -> IO[bytes]:
    """stdin's bytes through a file object of our own (a duplicate of its descriptor): a reader
    thread still blocked in it at exit then holds no lock that Python's shutdown needs."""
    if sys.stdin is None:  # started with stdin closed (<&-)
        raise UserError("stdin is closed: give --input FILE, or pipe the text in")
    try:
        return open(os.dup(sys.stdin.fileno()), "rb")
    except (AttributeError, OSError, ValueError):  # no real descriptor (e.g. replaced by a test)
        return sys.stdin.buffer


# ---------------------------------------------------------------------------- writing


_DESCRIPTOR = re.compile(r"/dev/(?:(stdout)|(stderr)|fd/(\d+))|/proc/(self|\d+)/fd/(\d+)")  # a name of an open file


def descriptor_of(path: str | Path) -> int | None:
    """The descriptor of this process that `path` names (/dev/stdout: 1, /dev/fd/N: N), if any."""
    m = _DESCRIPTOR.fullmatch(os.path.abspath(path))
    if m is None or m[4] not in (None, "self", str(os.getpid())):
        return None
    return 1 if m[1] else 2 if m[2] else int(m[3] or m[5])


def is_special_file(path: str | Path) -> bool:
    """Whether `path` names an open descriptor (/dev/stdout, /dev/fd/N: whatever file the shell put
    there; atomic_write writes through the descriptor) or is, through its links, a FIFO, a device or
    a socket: such a file is written into where it is, never replaced by a new one."""
    if descriptor_of(path) is not None:
        return True
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def through_link(path: str | Path) -> Path:
    """The file a symbolic link names (written through, as an editor does), else `path` itself; a
    link to a special file stays as given (/dev/stdout's target may be a pipe, which has no path)."""
    path = Path(path)
    return Path(os.path.realpath(path)) if path.is_symlink() and not is_special_file(path) else path


def check_output_path(
    path: str | Path, what: str, inputs: Iterable[str | Path | None] = (), follow_link: bool = True
) -> Path:
    """A file to write (with `follow_link`, as for a path the user named: a symbolic link's file): its
    directory must exist and be writable, and it must be neither a directory nor one of `inputs`
    (writing it would destroy them). Returns the path to write."""
    path = through_link(path) if follow_link else Path(path)
    if is_special_file(path):  # written into where it is: its directory does not matter
        if not os.access(path, os.W_OK):  # a closed descriptor too
            raise UserError(f"{what} {path} is not writable (or not open)")
        if stat.S_ISSOCK(os.stat(path).st_mode):
            raise UserError(f"{what} {path} is a socket; give a file, a pipe or a device")
        if any(p is not None and Path(p).exists() and os.path.samefile(path, p) for p in inputs):
            raise UserError(f"{what} {path} is one of the input files; choose another file")
        return path
    if path.is_dir():
        raise UserError(f"{what} {path} is a directory; give a file name")
    if not path.parent.is_dir():
        why = "is not a directory" if path.parent.exists() else "does not exist"
        raise UserError(f"{what} {path}: directory {path.parent} {why}")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise UserError(f"{what} {path}: directory not writable: {path.parent}")
    if path.exists() and any(p is not None and Path(p).exists() and path.samefile(p) for p in inputs):
        raise UserError(f"{what} {path} is one of the input files; choose another file")
    if path.exists() and (not os.access(path, os.W_OK) or not path.stat().st_mode & 0o222):  # root too
        raise UserError(f"{what} {path} is read-only; make it writable or choose another file")
    return path


def _read_umask() -> int:
    """The process's umask: from /proc where Linux shows it, else by setting it and setting it
    back (which is why it is read once, at import, before any thread of ours creates a file)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


UMASK = _read_umask()  # the permissions atomic_write gives a new file: 0o666 & ~UMASK


@contextmanager
def atomic_path(path: str | Path, suffix: str = ".tmp") -> Iterator[Path]:
    """A temporary path in `path`'s directory (named .NAME.XXXX`suffix`; a writer that goes by the
    suffix, as matplotlib does, gets one ending in `path`'s) that lands at `path` only if the block
    succeeds: it is fsynced, given the permissions of the file it replaces (a new file: the
    umask's) and renamed over `path`; on any error it is removed and the file that was at `path`
    is left as it was. A symbolic link at `path` is replaced, not followed (check_output_path gives
    the file a link the user named stands for). A FIFO or a device (`/dev/stdout`) is written into
    directly: it cannot be replaced, and what is written into it is gone at once anyway."""
    path = Path(path)
    if is_special_file(path):
        yield path
        return
    try:
        permissions = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:  # no file there yet (or none we can see): a new file's
        permissions = 0o666 & ~UMASK
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, permissions)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_write(path: str | Path, mode: str = "w") -> Iterator[IO]:
    """A file object for `path` that lands there only if the block succeeds (atomic_path)."""
    if (fd := descriptor_of(path)) is not None:  # written through it: its offset is the shell's, nothing truncated
        with open(os.dup(fd), mode, **({} if "b" in mode else {"encoding": "utf-8", "newline": "\n"})) as f:
            yield f
        return
    with (
        atomic_path(path) as tmp,
        open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8", "newline": "\n"})) as f,
    ):
        yield f


def write_text(path: str | Path, text: str, what: str = "--output") -> None:
    """Write `text` to the file `path` (checked, atomic)."""
    with atomic_write(check_output_path(path, what)) as f:
        f.write(text)


def write_json(obj: Any, path: str | Path, what: str = "--json") -> None:
    """Write `obj` as indented JSON (checked, atomic)."""
    write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n", what)


def format_translation(index: int, translation: Translation, nbest_format: Literal["text", "tsv"]) -> str:
    """The output lines of one input line: its texts one a line ('text'), or
    index<TAB>score<TAB>text ('tsv'); texts never break a line (or a TSV field)."""
    out = []
    for text, score in translation:
        text = " ".join(text.splitlines())
        if nbest_format == "tsv":
            out.append(f"{index}\t{score:.4f}\t{text.replace(chr(9), ' ')}\n")
        else:
            out.append(text + "\n")
    return "".join(out)


def write_translations(
    translations: Iterable[Translation], output: str | Path = "-", *, nbest_format: Literal["text", "tsv"] = "text"
) -> int:
    """Write translations (from decoding.translate_lines, through Engine.translate) to a file or stdout ('-'); returns
    the input line count.

    'text': each hypothesis's text on its own line (K lines per input line for K-best lists);
    'tsv': index<TAB>score<TAB>text, index counting input lines from 0. stdout is flushed after
    every input line (pipes and terminals see each translation at once); a file is written
    atomically.
    """
    if nbest_format not in ("text", "tsv"):
        raise UserError(f"n-best format must be 'text' or 'tsv', got {nbest_format!r}")
    if str(output) == "-":
        return _write(translations, sys.stdout, nbest_format, flush=True)
    path = check_output_path(output, "--output")
    with atomic_write(path) as f:
        return _write(translations, f, nbest_format, flush=False)


def _write(translations: Iterable[Translation], f: IO[str], nbest_format: Literal["text", "tsv"], flush: bool) -> int:
    count = 0
    for count, translation in enumerate(translations, start=1):
        f.write(format_translation(count - 1, translation, nbest_format))
        if flush:
            f.flush()
    return count
