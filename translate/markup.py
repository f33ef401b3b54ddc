"""Inline markup carried through translation: what HTML and Markdown documents share.

A document is cut into blocks of running text (a paragraph, a heading, a list item, a table
cell, an attribute value). Within a block, each inline tag or piece of inline syntax (`<b>`,
`<a href="...">`, `**`, `[`, `](url)`, an inline `<code>` element or code span, a comment)
is replaced by one private-use character (U+E000..., then planes 15 and 16), which protect.py masks as a placeholder:
the sentence is translated with the markup as units that the model places. Blocks are split into
sentences (segment.py) and every sentence of the document is translated in one call of
`translate_batch` (sentences in, translations out, in order), which must carry the markup
characters through: translate_lines with protection on does (its Protector masks them), as does
protect.protected around a model; where it does not, the lost markup is put back at the ends.

Back from translation, `restore_markup` makes the markup of each sentence come out as in the
source: each piece exactly once (a lost one is put back at the end), in the source's order at
the places the model chose (so tags stay nested as they were), and touching the words next to
it, or separated by a space, as in the source. Everything outside the blocks is copied byte for
byte. Sentences without a letter are not translated.

HTML: html_document.py; Markdown: markdown_document.py; a file of either: documents.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from translate.errors import UserError
from translate.protect import MARKUP, PRIVATE_USE
from translate.segment import translate_texts

_LETTER = re.compile(r"[^\W\d_]")
_CLOSING = set(".,;:!?)]}»”…")
_SPACES = re.compile(r"[ \t\n\r\f]+")  # HTML's whitespace: not U+00A0, which is text


def has_no_letter(sentence: str) -> bool:
    return not _LETTER.search(MARKUP.sub("", sentence))


class Markup:
    """The private-use characters of one document: `code(raw)` stands a character for a piece
    of markup (skipping any character the document itself holds); `expand` puts them back."""

    def __init__(self, document: str) -> None:
        taken = set(MARKUP.findall(document))
        every = (chr(c) for first, last in PRIVATE_USE for c in range(first, last + 1))
        self.free = (char for char in every if char not in taken)
        self.pieces: dict[str, object] = {}

    def code(self, piece: object) -> str:
        char = next(self.free, None)
        if char is None:
            raise UserError(f"too much inline markup in one document (more than {len(self.pieces):,} pieces)")
        self.pieces[char] = piece
        return char

    def split(self, text: str) -> list[str | object]:
        """`text` as its text pieces (str, possibly empty) and markup pieces (what code() got)."""
        parts: list[str | object] = []
        last = 0
        for m in MARKUP.finditer(text):
            if m.group() in self.pieces:
                parts += [text[last : m.start()], self.pieces[m.group()]]
                last = m.end()
        parts.append(text[last:])
        return parts


def restore_markup(source: str, output: str) -> str:
    """`output` with the markup characters of `source`: each exactly once, in the source's order,
    with the source's spacing around them (see the module's docstring)."""
    marks = MARKUP.findall(source)
    if not marks and not MARKUP.search(output):
        return output
    texts, seen = [""], set()
    for piece in re.split(f"({MARKUP.pattern})", output):
        if not MARKUP.fullmatch(piece):
            texts[-1] += piece
        elif piece in marks and piece not in seen:  # duplicates and strangers are dropped
            seen.add(piece)
            texts.append("")
    if len(seen) < len(marks):  # the lost ones go at the end, before the final punctuation
        body, end = re.match(r"(.*?)([\s.!?:;…]*)$", texts[-1], re.S).groups()
        texts[-1:] = [body] + [""] * (len(marks) - len(seen) - 1) + [end]
    after = {m.group(): _space(source, m.end()) for m in MARKUP.finditer(source)}
    before = {m.group(): _space(source, m.start() - 1) for m in MARKUP.finditer(source)}
    out = [texts[0] if not texts[0].strip() else _edge(texts[0], None, before[marks[0]])]
    for i, mark in enumerate(marks):
        text = texts[i + 1]
        lead, trail = after[mark], before[marks[i + 1]] if i + 1 < len(marks) else None
        out += [mark, text if i + 1 == len(marks) and not text.strip() else _edge(text, lead, trail)]
    return "".join(out)


def _space(source: str, i: int) -> bool | None:
    """Whether source[i] is whitespace; None outside the source."""
    return source[i].isspace() if 0 <= i < len(source) else None


def _edge(text: str, lead: bool | None, trail: bool | None) -> str:
    """`text` with a single space (True) or none (False) at its start (lead) and end (trail); None
    keeps what is there. A blank text becomes one space where neither side wants none and one
    does, else nothing."""
    if not text.strip():
        if lead is None and trail is None:
            return text
        return " " if False not in (lead, trail) else ""
    if lead is not None:
        text = (" " if lead and text.lstrip()[0] not in _CLOSING else "") + text.lstrip()
    if trail is not None:
        text = text.rstrip() + (" " if trail else "")
    return text


def translate_blocks(blocks: Sequence[str], translate_batch: Callable[[list[str]], list[str]], **split) -> list[str]:
    """Blocks of running text with markup characters, each translated sentence by sentence (all
    in one call), whitespace runs inside a sentence made one space, the markup restored."""

    def translate(sentences: list[str]) -> list[str]:
        sources = [_SPACES.sub(" ", s) for s in sentences]
        return [restore_markup(s, out) for s, out in zip(sources, translate_batch(sources), strict=True)]

    return translate_texts(blocks, translate, outer=True, skip=has_no_letter, **split)
