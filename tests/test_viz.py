"""interp.viz: offline HTML, checked in headless Chromium (see tests/browser.py) and as plain HTML."""

import json
import os
import re

import numpy as np
import pytest
import torch
from browser import render_in_chromium  # tests/browser.py (pytest puts tests/ on sys.path)

from interp.viz import (
    attention_patterns_html,
    heatmap_html,
    html_page,
    script_json,
    show_attention,
    write_text,
    zoomable_svg_html,
)

SCRIPT_PAYLOAD = "</script><script>alert(1)</script>"
IMG_PAYLOAD = '<img/src="x"/onerror="alert(2)">'  # runs if a token is inserted as raw HTML
REMOTE_SCRIPT = re.compile(r"<script[^>]*\bsrc\s*=\s*[\"']?(https?:)?//", re.IGNORECASE)
BUNDLE_START = "var CircuitsVis="  # first statement of circuitsvis's iife.js
CELL_RGB = re.compile(r"<td[^>]*background: rgb\((\d+), (\d+), (\d+)\)")


def causal_pattern(n_heads: int, n_pos: int, seed: int) -> torch.Tensor:
    """Random causal attention probabilities [head, query_pos, key_pos]."""
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(n_heads, n_pos, n_pos, generator=generator)
    future = torch.triu(torch.ones(n_pos, n_pos, dtype=torch.bool), diagonal=1)
    return scores.masked_fill(future, float("-inf")).softmax(dim=-1)


def test_page_renders_offline_in_chromium(tmp_path):
    tokens_a = ["<s>", " Mary", " and", SCRIPT_PAYLOAD, IMG_PAYLOAD, " &amp;"]
    tokens_b = ["<s>", " When", " John"]
    heads_a = ["L0H0", "L0H1", "L0H2"]
    heads_b = ["L1H0", SCRIPT_PAYLOAD]
    scores = np.array([[0.5, -1.0, 0.0], [2.0, np.nan, -0.25]])
    page = html_page(
        "Attention <report>",
        [
            attention_patterns_html(tokens_a, causal_pattern(3, len(tokens_a), seed=0), heads_a),
            attention_patterns_html(tokens_b, causal_pattern(2, len(tokens_b), seed=1), heads_b),
            heatmap_html(scores, ["0", SCRIPT_PAYLOAD], ["h0", "h1", "h2"], title="Head scores"),
        ],
    )
    assert not REMOTE_SCRIPT.search(page)
    assert page.count(BUNDLE_START) == 1

    # Only circuitsvis's JS makes these: a canvas of [pos x pos] pixels for the combined pattern and
    # for each head (drawn by tfjs), one caption per head and one button per token.
    drawn_a = f'.interp-attention canvas[width="{len(tokens_a)}"][height="{len(tokens_a)}"]'
    drawn_b = f'.interp-attention canvas[width="{len(tokens_b)}"][height="{len(tokens_b)}"]'
    expected = {
        drawn_a: 1 + len(heads_a),
        drawn_b: 1 + len(heads_b),
        ".interp-attention figcaption": len(heads_a) + len(heads_b),
        ".interp-attention .tokens button": len(tokens_a) + len(tokens_b),
        ".interp-heatmap td": scores.size,
        "img": 0,
    }
    result = render_in_chromium(
        write_text(tmp_path / "page.html", page),
        selectors=tuple(expected),
        wait_for={drawn_a: expected[drawn_a], drawn_b: expected[drawn_b]},
    )

    assert result.script_errors == []
    assert result.dialogs == []
    assert result.external_requests == []
    assert result.missing == []
    assert result.counts == expected
    assert result.counts[".interp-heatmap td"] == scores.size
    # Hostile tokens and labels show as text.
    text = result.text
    for shown in ["Attention <report>", SCRIPT_PAYLOAD, IMG_PAYLOAD, "&amp;", "<s>", "L0H2", "-0.25"]:
        assert shown in text, shown
    assert text.count(SCRIPT_PAYLOAD) == 3  # a token, a head name, a heat-map row label


def test_notebook_view_renders_offline_in_chromium(tmp_path):
    tokens = ["<s>", SCRIPT_PAYLOAD, " cat"]
    view = show_attention(tokens, causal_pattern(2, len(tokens), seed=2), ["A", "B"])
    notebook_html = view._repr_html_()
    assert not REMOTE_SCRIPT.search(notebook_html)
    assert notebook_html.count(BUNDLE_START) == 1

    cell_page = f"<!DOCTYPE html><meta charset='utf-8'><body>{notebook_html}</body>"
    result = render_in_chromium(
        write_text(tmp_path / "cell.html", cell_page),
        selectors=(".interp-attention .tokens button",),
        wait_for={".interp-attention .tokens button": len(tokens)},
    )
    assert result.script_errors == []
    assert result.dialogs == []
    assert result.counts[".interp-attention .tokens button"] == len(tokens)
    assert SCRIPT_PAYLOAD in result.text


def test_identical_viewers_on_one_page_each_render(tmp_path):
    """Two identical attention viewers, and two identical zoomable drawings, on one page: each draws
    its own (an id shared by both left the second empty, its buttons driving the first)."""
    tokens = ["<s>", " a", " b"]
    viewer = attention_patterns_html(tokens, causal_pattern(2, len(tokens), seed=3), ["A", "B"])
    svg = '<svg xmlns="http://www.w3.org/2000/svg"><circle cx="5" cy="5" r="4"/></svg>'
    drawing = zoomable_svg_html(svg, first_view=(0, 0, 10, 10), whole=(0, 0, 10, 10), height=120)
    page = html_page("Twice", [viewer, viewer, drawing, drawing])
    drawn = f'.interp-attention canvas[width="{len(tokens)}"]'
    result = render_in_chromium(
        write_text(tmp_path / "twice.html", page),
        selectors=(drawn, ".interp-attention .tokens button"),
        wait_for={drawn: 2 * 3},
    )
    assert result.script_errors == [] and result.missing == []
    assert result.counts[".interp-attention .tokens button"] == 2 * len(tokens)
    boxes = re.findall(r'<svg viewBox="([^"]+)"', result.dom)
    assert len(boxes) == 2 and boxes[0] == boxes[1], boxes  # both fitted to the same frame
    assert boxes[0] != "0.00 0.00 10.00 10.00"  # fitted to the frame, not the page's static view


def test_page_without_attention_has_no_bundle():
    page = html_page("Scores", [heatmap_html(np.ones((2, 2)), ["0", "1"], ["0", "1"])])
    assert BUNDLE_START not in page
    assert "<script" not in page


def test_script_json_cannot_close_script_tag():
    text = script_json({"token": SCRIPT_PAYLOAD + "&"})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"token": SCRIPT_PAYLOAD + "&"}


def test_heatmap_colours_follow_sign_and_magnitude():
    values = np.array([[-2.0, 0.0, 1.0, 2.0]])
    cells = re.findall(CELL_RGB, heatmap_html(values, ["0"], list("abcd")))
    (neg_r, _, neg_b), zero, half, full = [tuple(map(int, c)) for c in cells]
    assert neg_b > neg_r  # negative: blue
    assert zero == (255, 255, 255)
    assert full[0] > full[2] and half[0] > half[2]  # positive: red
    assert sum(full) < sum(half) < sum(zero)  # larger |value|, darker

    unsigned = re.findall(CELL_RGB, heatmap_html([[0.0, 1.0]], ["0"], ["a", "b"]))
    assert tuple(map(int, unsigned[0])) == (255, 255, 255)


def test_heatmap_escapes_labels_and_title():
    table = heatmap_html([[1.0]], ["<b>row</b>"], ['"col"'], title="<i>t</i>")
    assert "<b>" not in table and "<i>" not in table and '"col"' not in table
    assert "&lt;b&gt;row&lt;/b&gt;" in table and "&lt;i&gt;t&lt;/i&gt;" in table


def test_heatmap_names_its_axes_in_the_corner_and_each_cells_tooltip():
    table = heatmap_html([[0.5]], ["L3"], ["value"], axes=("head", "END attends to"))
    assert "head \\ END attends to" in table
    assert 'title="head L3, END attends to value: 0.50"' in table


def test_heatmap_marks_the_cells_that_are_estimates():
    table = heatmap_html(
        [[0.5, 0.25, float("nan")]], ["L3"], ["a", "b", "c"], approximate=[[False, True, True]]
    )
    assert 'title="layer L3, head b: ~0.25 (estimate)"' in table and 'font-style: italic;">~0.25<' in table
    assert 'title="layer L3, head a: 0.50"' in table and table.count("~") == 2  # a NaN cell is no estimate
    with pytest.raises(ValueError, match="one flag per value"):
        heatmap_html([[0.5, 0.25]], ["L3"], ["a", "b"], approximate=[[True]])


@pytest.mark.parametrize(
    ("values", "rows", "cols", "message"),
    [
        (np.ones((2, 3)), ["0"], ["a", "b", "c"], "row_labels"),
        (np.ones(3), ["0"], ["a"], "2-D"),
        (np.array([[np.inf]]), ["0"], ["a"], "inf"),
    ],
)
def test_heatmap_rejects_bad_input(values, rows, cols, message):
    with pytest.raises(ValueError, match=message):
        heatmap_html(values, rows, cols)


@pytest.mark.parametrize(
    ("tokens", "pattern", "heads", "message"),
    [
        (["a", "b"], torch.ones(1, 3, 3), None, "2 tokens"),
        (["a", "b"], torch.ones(2, 2), None, "3-D"),
        (["a", "b"], torch.ones(2, 2, 2), ["only one"], "head_names"),
        (["a", 1], torch.ones(1, 2, 2), None, "list of str"),
        (["a", "b"], torch.full((1, 2, 2), float("nan")), None, "NaN"),
    ],
)
def test_attention_patterns_rejects_bad_input(tokens, pattern, heads, message):
    with pytest.raises(ValueError, match=message):
        attention_patterns_html(tokens, pattern, heads)


def test_write_text_replaces_atomically(tmp_path):
    path = tmp_path / "out" / "report.html"
    write_text(path, "<p>old</p>")
    write_text(path, "<p>new ✓</p>")
    assert path.read_text(encoding="utf-8") == "<p>new ✓</p>"
    assert os.listdir(path.parent) == ["report.html"]

    with pytest.raises(TypeError):
        write_text(path, None)  # fails mid-write: the old file stays, no temp file is left
    assert path.read_text(encoding="utf-8") == "<p>new ✓</p>"
    assert os.listdir(path.parent) == ["report.html"]


def test_an_unsigned_heat_map_does_not_paint_negative_values_as_positive():
    """On a white-to-red scale a negative value is white (as 0), never the red of its magnitude."""
    page = heatmap_html(np.array([[-0.8, 0.8, 0.0]]), ["0"], ["a", "b", "c"], signed=False, limit=1.0)
    colours = re.findall(r"background: (rgb\([^)]*\))", page)
    assert colours[0] == colours[2] == "rgb(255, 255, 255)" and colours[1] != colours[0]
