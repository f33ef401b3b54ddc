"""HTML documents translated with their markup kept byte for byte (markup.py does the rest).

Read with the standard library's `html.parser`, event by event, each event's source text kept:

- translated: the text of the document, block by block (a block ends at any tag that is not
  inline: `<p>`, `<li>`, `<td>`, `<h1>`, `<div>`, `<title>` ...; inline tags such as `<b>`,
  `<a href>`, `<em>`, `<span>`, `<br>`, `<img>` stay within the sentence as markup), and the
  values of the attributes `alt`, `title`, `placeholder` and `aria-label` on any element;
- copied as they are: every tag (but for those attribute values), comments, the doctype, and the
  whole content of `<script>`, `<style>`, `<pre>`, `<code>`, `<kbd>`, `<samp>`, `<textarea>`,
  `<svg>`, `<math>`, `<template>`, and of any element with `translate="no"` or the class
  `notranslate` (its attributes too; the others' attributes are translated); inside a sentence
  such an element is one piece of markup.

Entities are decoded for translation; a character that the source wrote as an entity (`&nbsp;`,
`&copy;`, `&#169;`) is written back in that form, and `&`, `<`, `>` of the translation (and the
quote of an attribute) are escaped.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from html.parser import HTMLParser

from translate.markup import Markup, translate_blocks

INLINE = set(
    "a abbr acronym b bdi bdo big br cite data del dfn em font i img ins label mark q s small span strike "
    "strong sub sup time tt u wbr".split()
)
OPAQUE = set("script style pre code kbd samp textarea svg math template noscript".split())
VOID = set("area base br col embed hr img input link meta param source track wbr".split())
ATTRIBUTES = ("alt", "title", "placeholder", "aria-label")
_ATTRIBUTE = re.compile(
    r"(?<=\s)(?P<name>[^\s\"'>/=]+)(?P<eq>\s*=\s*)(?:\"(?P<dq>[^\"]*)\"|'(?P<sq>[^']*)'|(?P<bare>[^\s\"'=<>`]+))"
)


class _Events(HTMLParser):
    """The events of a document as (kind, tag or None, attrs, start offset)."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=False)
        self.events: list[tuple[str, str | None, list, int]] = []
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.feed(text)
        if self.rawdata.startswith("<"):  # a tag or comment the document leaves open at its end: copied, as
            self._add("decl")  # a browser drops it (close() would hand it over as text to translate)
            self.rawdata = ""
        self.close()

    def _add(self, kind: str, tag: str | None = None, attrs: list | None = None) -> None:
        line, column = self.getpos()
        self.events.append((kind, tag, attrs or [], self.line_starts[line - 1] + column))

    def handle_starttag(self, tag, attrs):
        self._add("start", tag, attrs)

    def handle_startendtag(self, tag, attrs):
        self._add("startend", tag, attrs)

    def handle_endtag(self, tag):
        self._add("end", tag)

    def handle_data(self, data):
        self._add("text")

    def handle_entityref(self, name):
        self._add("text")

    def handle_charref(self, name):
        self._add("text")

    def handle_comment(self, data):
        self._add("comment")

    def handle_decl(self, decl):
        self._add("decl")

    def handle_pi(self, data):
        self._add("decl")

    def unknown_decl(self, data):
        self._add("decl")


def _translate_no(attrs: list) -> bool:
    """translate="no" or class notranslate: the element, its attributes too, left as it is."""
    values = {k.lower(): (v or "") for k, v in attrs}
    return values.get("translate", "").lower() == "no" or "notranslate" in values.get("class", "").split()


def _is_opaque(tag: str, attrs: list) -> bool:
    return tag in OPAQUE or _translate_no(attrs)


class _Document:
    """The document as output parts: source text (str) and references to translated texts."""

    def __init__(self, text: str) -> None:
        self.markup = Markup(text)
        self.texts: list[str] = []  # blocks and attribute values to translate
        self.parts: list[object] = []  # str, or ("block" | "attribute", index, quote)
        self.block: list[str] = []  # the block being read: decoded text and markup characters
        self.entities: dict[str, str] = {}  # character -> the entity the source wrote it as

    def add_text(self, raw: str) -> None:
        decoded = html.unescape(raw)
        if raw.startswith("&") and len(decoded) == 1 and decoded != raw:
            self.entities.setdefault(decoded, raw)  # the first spelling of a character wins
        self.block.append(decoded)

    def add_inline(self, parts: list[object]) -> None:
        self.block.append(self.markup.code(parts))

    def end_block(self) -> None:
        if self.block:
            self.texts.append("".join(self.block))
            self.parts.append(("block", len(self.texts) - 1, None))
            self.block = []

    def tag(self, raw: str) -> list[object]:
        """A start tag's parts: its source with the translatable attribute values referenced."""
        parts: list[object] = []
        last = 0
        for m in _ATTRIBUTE.finditer(raw):
            if m.group("name").lower() not in ATTRIBUTES:
                continue
            group = next(g for g in ("dq", "sq", "bare") if m.group(g) is not None)
            value, start = m.group(group), m.start(group)
            self.texts.append(html.unescape(value))
            quote = "'" if group == "sq" else '"'
            bare = '"' * (group == "bare")  # a bare value comes back quoted
            parts += [raw[last:start] + bare, ("attribute", len(self.texts) - 1, quote), bare]
            last = start + len(value)
        parts.append(raw[last:])
        return parts


def _read(text: str) -> _Document:
    """The document's blocks, attribute values and parts, event by event."""
    doc = _Document(text)
    events = _Events(text).events
    ends = [start for *_, start in events[1:]] + [len(text)]
    opaque: list[object] | None = None  # the parts of an element copied whole
    opaque_tag, depth, inline = None, 0, False
    for (kind, tag, attrs, start), end in zip(events, ends):
        raw = text[start:end]
        if opaque is not None:  # inside an element copied whole
            opaque.append(raw)
            depth += (kind == "start" and tag == opaque_tag) - (kind == "end" and tag == opaque_tag)
            if depth == 0:
                doc.add_inline(opaque) if inline else doc.parts.extend(opaque)
                opaque = None
            continue
        if kind == "text":
            doc.add_text(raw)
        elif kind in ("start", "startend") and _is_opaque(tag, attrs):
            inline = bool(doc.block) or tag in INLINE | {"code", "kbd", "samp", "span"}
            if not inline:
                doc.end_block()
            head = [raw] if _translate_no(attrs) else doc.tag(raw)  # a <textarea>'s placeholder, a <pre>'s title
            if kind == "startend" or tag in VOID:
                doc.add_inline(head) if inline else doc.parts.extend(head)
            else:
                opaque, opaque_tag, depth = head, tag, 1
        elif kind in ("start", "startend", "end") and tag in INLINE:
            doc.add_inline(doc.tag(raw) if kind != "end" else [raw])
        elif kind == "comment" and doc.block:
            doc.add_inline([raw])
        else:  # a block's tag, a comment between blocks, a declaration
            doc.end_block()
            doc.parts.extend(doc.tag(raw) if kind in ("start", "startend") else [raw])
    if opaque is not None:  # an element never closed
        doc.add_inline(opaque) if inline else doc.parts.extend(opaque)
    doc.end_block()
    return doc


def translate_html(text: str, translate_batch: Callable[[list[str]], list[str]], **split) -> str:
    """The HTML document `text` translated (see the module's docstring); `translate_batch`:
    sentences in, translations out, in order; `split`: the options of segment.split_sentences."""
    doc = _read(text)
    translations = translate_blocks(doc.texts, translate_batch, **split)

    table = {c: e for c, e in doc.entities.items() if c not in "&<>\"'"}
    table.update({"&": "&amp;", "<": "&lt;", ">": "&gt;"})

    def escape(s: str, quote: str | None) -> str:
        quoted = {quote: "&quot;" if quote == '"' else "&#x27;"} if quote else {}
        return "".join(quoted.get(c) or table.get(c, c) for c in s)

    def render(parts: list[object]) -> str:
        out = []
        for part in parts:
            if isinstance(part, str):
                out.append(part)
            else:
                kind, i, quote = part
                if kind == "attribute":
                    out.append(escape(translations[i], quote))
                else:  # a block: its text escaped, its markup's parts rendered
                    for piece in doc.markup.split(translations[i]):
                        out.append(escape(piece, None) if isinstance(piece, str) else render(piece))  # type: ignore[arg-type]
        return "".join(out)

    return render(doc.parts)
