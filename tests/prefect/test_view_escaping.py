"""The lock view's markdown keeps user strings literal (issue 34): parsed the way a markdown renderer does.

Flow run, task run, deployment and work pool names are the user's; whatever they contain, the view has
one heading, one link (to the run, at our own URL), no image, no HTML and two cells a row.
"""

from __future__ import annotations

from markdown_it import MarkdownIt

from prefect_volcano._board import _markdown, escape_markdown

HOSTILE = "# h1 [x](http://evil.example) ![i](http://img.example/p.png) | cell <b>bold</b> *em* `code`\n## h2"
URL = "http://127.0.0.1:4200/runs/flow-run/0190aa00-0000-7000-8000-000000000000"


def _tokens(text: str) -> list:
    return list(MarkdownIt("commonmark").enable("table").parse(text))


def _walk(tokens: list) -> list:
    for token in tokens:
        yield token
        yield from _walk(token.children or [])


def test_hostile_names_open_no_heading_link_image_html_or_cell() -> None:
    record = {
        "state": "held",
        "fencing_token": "7",
        "flow_run_name": HOSTILE,
        "flow_run_url": URL,
        "flow_run_id": "0190aa00-0000-7000-8000-000000000000",
        "task_run_name": HOSTILE,
        "task_run_id": "0190aa00-0000-7000-8000-000000000001",
        "deployment_name": HOSTILE,
        "work_pool_name": HOSTILE,
        "work_queue_name": HOSTILE,
        "note": HOSTILE,
    }
    page = _markdown("rollup", record)
    tokens = list(_walk(_tokens(page)))
    kinds = [t.type for t in tokens]
    assert kinds.count("heading_open") == 1, page
    links = [t.attrs.get("href") for t in tokens if t.type == "link_open"]
    assert links == [URL], (links, page)
    assert "image" not in kinds and "html_inline" not in kinds and "html_block" not in kinds, page
    rows = [i for i, t in enumerate(tokens) if t.type == "tr_open"]
    for start in rows:
        end = next(i for i in range(start, len(tokens)) if tokens[i].type == "tr_close")
        cells = [t for t in tokens[start:end] if t.type in ("td_open", "th_open")]
        assert len(cells) == 2, page
    rendered = MarkdownIt("commonmark").enable("table").render(page)
    assert "# h1 [x](http://evil.example) ![i](http://img.example/p.png)" in rendered, rendered  # literal


def test_an_escaped_string_renders_as_its_own_text_even_at_the_start_of_a_line() -> None:
    html = MarkdownIt("commonmark").enable("table").render(escape_markdown(HOSTILE)).strip()
    literal = " ".join(HOSTILE.split()).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    assert html == f"<p>{literal}</p>", html
