"""Glossaries: source terms that must come out as one fixed target term.

A glossary file (`terms.tsv`) is UTF-8 text, one entry a line: the source term, a TAB, the target
term, e.g. `pull request<TAB>demande de fusion`. Blank lines and lines starting with `#` are
skipped; spaces around each term are dropped. Anything else (no TAB, two TABs, an empty term,
one source term given two different targets) is a UserError naming the file and line.

Matching:
- whole words: an occurrence is neither preceded nor followed by a letter, digit or `_`; the
  spaces inside a term match any run of whitespace;
- case: a term written all in lower case matches in any case ("cloud" matches "Cloud" and
  "CLOUD"); a term with a capital letter matches only as written ("US" does not match "us").
  The target comes out as written, except that where a lower-case term matched a capitalised
  occurrence (a sentence start) its first letter is capitalised too, and where it matched an
  occurrence in capitals it is put in capitals;
- overlaps: at one position the longest term wins; a term and a protected span compete by
  protect.py's rule (the first to start wins, then the longest).

Each occurrence is masked as a placeholder (protect.py), so the model places it as a unit, and
the placeholder comes back as the target term exactly once (missing: added at the end, as for
every protected span). An empty glossary changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from translate.errors import UserError
from translate.protect import Span
from translate.textio import read_lines


@dataclass(frozen=True)
class Glossary:
    entries: dict[str, str]  # source term -> target term, as written in the file
    _regexes: list[tuple[re.Pattern, dict[str, str]]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        exact = {s: t for s, t in self.entries.items() if s != s.lower()}
        folded = {s.lower(): t for s, t in self.entries.items() if s == s.lower()}
        regexes = [(_alternation(exact, 0), exact), (_alternation(folded, re.IGNORECASE), folded)]
        object.__setattr__(self, "_regexes", [(r, terms) for r, terms in regexes if terms])

    def __bool__(self) -> bool:
        return bool(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def find(self, text: str) -> list[Span]:
        """Every occurrence of a term in `text` (the longest at each position; occurrences at
        different positions may overlap), as spans of kind "term" whose output is the target."""
        spans = []
        for regex, terms in self._regexes:
            for m in regex.finditer(text):
                found = m.group(1)
                key = " ".join(found.split())
                target = terms[key if key in terms else key.lower()]
                spans.append(Span(m.start(1), m.end(1), found, "term", _cased(target, found, key in terms)))
        return spans


def _alternation(terms: dict[str, str], flags: int) -> re.Pattern:
    """A regex that matches, at each position where a term starts, the longest (zero-width, so
    that finditer finds the occurrences at every position)."""
    words = sorted(terms, key=len, reverse=True)
    body = "|".join(r"\s+".join(map(re.escape, w.split())) for w in words)
    return re.compile(rf"(?<!\w)(?=({body})(?!\w))", flags)


def _cased(target: str, found: str, exact: bool) -> str:
    if exact or not found[:1].isupper():
        return target
    if len(found) > 1 and found.isupper():
        return target.upper()
    return target[:1].upper() + target[1:]


def parse_glossary(lines: Iterable[str], name: str) -> Glossary:
    """A glossary from the lines of a file called `name` (see the module's docstring)."""
    entries: dict[str, str] = {}
    where: dict[str, int] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            found = "no TAB" if len(fields) == 1 else f"{len(fields) - 1} TABs"
            raise UserError(f"{name}:{number}: expected 'source term<TAB>target term', found {found}")
        source, target = (" ".join(f.split()) for f in fields)
        if not source or not target:
            raise UserError(f"{name}:{number}: the {'source' if not source else 'target'} term is empty")
        key = source if source != source.lower() else source.lower()
        if key in entries and entries[key] != target:
            raise UserError(f"{name}:{number}: {source!r} already has the target {entries[key]!r} (line {where[key]})")
        entries[key] = target
        where.setdefault(key, number)
    return Glossary(entries)


def glossary_of_request(value: object) -> Glossary:
    """The glossary of a request's `"glossary"` field (serve): a JSON object of source term ->
    target term, read by the rules of a file (spaces around and inside a term normalised, a
    lower-case term folded); ValueError with a one-line message (the server's 400) otherwise."""
    if not isinstance(value, dict) or not all(isinstance(t, str) for t in value.values()):
        raise ValueError('"glossary" must be an object of source term -> target term (strings)')
    entries: dict[str, str] = {}
    for term, target in value.items():
        source, target = " ".join(term.split()), " ".join(target.split())
        if not source:
            raise ValueError('"glossary": a source term is empty')
        if not target:
            raise ValueError(f'"glossary": the target of {term!r} is empty')
        key = source if source != source.lower() else source.lower()
        if key in entries and entries[key] != target:
            raise ValueError(f'"glossary": {term!r} is given two targets, {entries[key]!r} and {target!r}')
        entries[key] = target
    return Glossary(entries)


def load_glossary(path: str | Path) -> Glossary:
    """The glossary of a `terms.tsv` file; a missing or malformed file is a UserError."""
    return parse_glossary(read_lines(Path(path), "glossary"), str(path))
