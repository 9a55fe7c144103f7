"""The shell of mixdiag's self-contained HTML pages (``analyze --html``, ``tune --html``).

One document layout and style for every page: plotly.js inlined so a page works offline, the title
as heading and a one-line verdict under it, then the page's own body.
"""
from __future__ import annotations

import html

STYLE = """body{font-family:sans-serif;margin:1.5em;} table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:left} .verdict{font-size:1.2em;font-weight:bold}"""


def page(title: str, verdict: str, body: str) -> str:
    """A complete HTML document: ``title`` (escaped) as title and heading, ``verdict`` (escaped) as the
    headline paragraph, then ``body`` (HTML, inserted as is)."""
    from plotly.offline import get_plotlyjs  # plotly.js is ~4 MB of text: loaded only when a page is written

    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{STYLE}</style>
<script type="text/javascript">{get_plotlyjs()}</script></head><body>
<h1>{html.escape(title)}</h1>
<p class="verdict">{html.escape(verdict)}</p>
{body}
</body></html>"""
