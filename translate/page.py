"""The page to try the server: `GET /` of `translate serve`.

One self-contained file, translate/page.html (package data): its CSS and script are inline, and
it talks only to the server that sent it (its Content-Security-Policy allows nothing else):
`GET /health` for the model and its default search options, `POST /translate` with the text,
the search options, and "format" and "glossary" only when they are set (a text format and an
empty glossary send the request of a plain client). Text is sent one line a sentence ("text"
for one line, "texts" for several) and the translations come back one a line; HTML and
Markdown go whole, as one "text" with its "format".

serve.py mounts it with one route: `Route("/", index, methods=["GET"])`.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files


@cache
def page_html() -> str:
    """The page, as installed with the package."""
    return files("translate").joinpath("page.html").read_text(encoding="utf-8")


async def index(request):
    """The route handler of `GET /`: the page."""
    from starlette.responses import HTMLResponse

    return HTMLResponse(page_html(), headers={"Cache-Control": "no-cache"})
