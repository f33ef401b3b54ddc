"""Documents in a format: plain text (one paragraph a line), HTML or Markdown, chosen by name or
by the file's extension, translated with their markup kept (markup.py, html_document.py,
markdown_document.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from translate.errors import UserError
from translate.html_document import translate_html
from translate.markdown_document import translate_markdown
from translate.segment import translate_paragraphs

FORMATS: tuple[str, ...] = ("text", "html", "markdown")
EXTENSIONS = {".html": "html", ".htm": "html", ".xhtml": "html", ".md": "markdown", ".markdown": "markdown"}


def format_of(path: str | Path, format: str | None = None) -> str:
    """The format given (checked), else the one of the file's extension; text for any other."""
    if format is not None:
        if format not in FORMATS:
            raise UserError(f"--format must be one of {', '.join(FORMATS)}, got {format!r}")
        return format
    return EXTENSIONS.get(Path(str(path)).suffix.lower(), "text")


def format_of_request(value: object) -> str:
    """A request's `"format"` field (serve), checked: ValueError with a one-line message (the
    server's 400) for anything but one of FORMATS."""
    if not isinstance(value, str) or value not in FORMATS:
        shown = {dict: "an object", list: "a list"}.get(type(value)) or json.dumps(value, ensure_ascii=False)
        raise ValueError(f'"format" must be one of {", ".join(map(json.dumps, FORMATS))}, got {shown}')
    return value


def translate_document(text: str, format: str, translate_batch: Callable[[list[str]], list[str]], **split) -> str:
    """A whole document in `format`; `translate_batch`: sentences in, translations out, in order
    (placeholders passed through); `split`: the options of segment.split_sentences."""
    if format == "html":
        return translate_html(text, translate_batch, **split)
    if format == "markdown":
        return translate_markdown(text, translate_batch, **split)
    return "\n".join(translate_paragraphs(text.split("\n"), translate_batch, **split))
