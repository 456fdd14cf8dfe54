"""Offline, self-contained HTML views: attention patterns (circuitsvis) and heat maps.

Everything here works without network access. circuitsvis's own HTML loads its JavaScript from a
CDN; we inline the bundle that ships inside the circuitsvis Python package instead.

A report page is built from fragments:

    page = html_page("Heads", [attention_patterns_html(toks, pattern, names), heatmap_html(...)])
    write_text("report.html", page)

html_page puts the 1.3 MB circuitsvis bundle once in <head>; fragments only hold a <div> and a small
render call. In a notebook, show_attention(...) displays on its own (it embeds the bundle).
"""

import functools
import hashlib
import html
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path

import circuitsvis
import numpy as np
import torch

from interp.io.files import write_text_atomic as write_text  # noqa: F401  (public: atomic HTML writes)

CIRCUITSVIS_BUNDLE = Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js"
_NEEDS_BUNDLE = 'data-interp-needs="circuitsvis"'  # marks fragments that call CircuitsVis.render


@functools.cache
def circuitsvis_bundle() -> str:
    """circuitsvis's browser bundle (defines the global `CircuitsVis`), safe to put inside <script>."""
    if not CIRCUITSVIS_BUNDLE.is_file():
        raise FileNotFoundError(
            f"circuitsvis bundle not found at {CIRCUITSVIS_BUNDLE}; reinstall it: pip install circuitsvis"
        )
    js = CIRCUITSVIS_BUNDLE.read_text(encoding="utf-8")
    # "</script" would end the inline <script> early; inside JS strings "<\/script" means the same.
    js = re.sub(r"</(script)", r"<\\/\1", js, flags=re.IGNORECASE)
    # The source map is not shipped next to the page.
    return re.sub(r"\n//# sourceMappingURL=\S+\s*$", "\n", js)


def script_json(value) -> str:
    """JSON for a JS literal inside <script>: '<', '>', '&' escaped so no string can close the tag."""
    text = json.dumps(value, ensure_ascii=True, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _to_numpy(values, name: str, ndim: int) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().to("cpu", torch.float64).numpy()
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(array.shape)}")
    return array


# ---------------------------------------------------------------------------------------------
# Attention patterns (circuitsvis)


def attention_patterns_html(
    str_tokens: Sequence[str], pattern, head_names: Sequence[str] | None = None
) -> str:
    """Fragment rendering circuitsvis's AttentionPatterns for one prompt; needs html_page's bundle.

    str_tokens: [pos] token strings; pattern: [head, query_pos, key_pos] attention probabilities;
    head_names: [head] labels (default "Head 0", ...). Pass e.g. cache["pattern", L][0].
    """
    props = script_json(_attention_props(str_tokens, pattern, head_names))
    div_id = "interp-attn-" + hashlib.sha256(props.encode()).hexdigest()[:12]  # same report, same page
    view = _view_of_script(div_id, "s.previousElementSibling")
    render_call = f"CircuitsVis.render({view}.id, CircuitsVis.AttentionPatterns, {props});"
    return (
        f'<div class="interp-attention" {_NEEDS_BUNDLE} style="position: relative; margin: 15px 0;">'
        f'<div id="{div_id}"></div><script>{render_call}</script></div>\n'
    )


def _view_of_script(element_id: str, from_script: str) -> str:
    """A JS expression: the element an inline script renders into, found from the script (`s`) by
    `from_script`, given an id no other element has, so that identical fragments on one page each
    get their own; where a notebook runs the script elsewhere, the element found by its id."""
    return (
        f"(function (s, id) {{ var view = s ? {from_script} : null;"
        " if (!view || view.id !== id) { view = document.getElementById(id); }"
        " for (var n = 1; document.getElementById(view.id) !== view; n++) { view.id = id + '-' + n; }"
        f" return view; }})(document.currentScript, {script_json(element_id)})"
    )


def _attention_props(str_tokens, pattern, head_names) -> dict:
    str_tokens = list(str_tokens)
    if not all(isinstance(t, str) for t in str_tokens):
        raise ValueError("str_tokens must be a list of str (use model.to_str_tokens)")
    pattern = _to_numpy(pattern, "pattern [head, query_pos, key_pos]", ndim=3)
    n_heads, n_query, n_key = pattern.shape
    if n_query != len(str_tokens) or n_key != len(str_tokens):
        raise ValueError(
            f"pattern has shape {pattern.shape} but there are {len(str_tokens)} tokens; "
            "pass one prompt's pattern [head, pos, pos], e.g. cache['pattern', layer][0]"
        )
    if not np.isfinite(pattern).all():
        raise ValueError("pattern contains NaN or inf; pass softmaxed attention probabilities")
    if head_names is None:
        head_names = [f"Head {h}" for h in range(n_heads)]
    head_names = [str(name) for name in head_names]
    if len(head_names) != n_heads:
        raise ValueError(f"got {len(head_names)} head_names for {n_heads} heads in pattern")
    return {
        # AttentionPatterns inserts each token as raw HTML (dangerouslySetInnerHTML): escape it so it
        # shows as text. Head names are rendered as React text, so they stay unescaped.
        "tokens": [html.escape(t) for t in str_tokens],
        "attention": np.round(pattern, 4).tolist(),  # 4 decimals: plenty for colours, small pages
        "headLabels": head_names,
    }


class AttentionView:
    """Notebook display of attention patterns; works offline (embeds the circuitsvis bundle)."""

    def __init__(self, fragment: str):
        self.fragment = fragment

    def _repr_html_(self) -> str:
        return f"<script>{circuitsvis_bundle()}</script>\n{self.fragment}"


def show_attention(
    str_tokens: Sequence[str], pattern, head_names: Sequence[str] | None = None
) -> AttentionView:
    """Jupyter: `show_attention(model.to_str_tokens(text), cache["pattern", 0][0])` as a cell's last line."""
    return AttentionView(attention_patterns_html(str_tokens, pattern, head_names))


# ---------------------------------------------------------------------------------------------
# Heat maps (plain HTML, no JavaScript)

_NEGATIVE = (33, 102, 172)  # blue
_ZERO = (255, 255, 255)  # white
_POSITIVE = (178, 24, 43)  # red
_MISSING = "#dddddd"


def _mix(a: tuple, b: tuple, t: float) -> tuple:
    return tuple(round(x + (y - x) * t) for x, y in zip(a, b, strict=True))


def _cell_colour(value: float, limit: float, signed: bool) -> tuple:
    """RGB: blue-white-red over [-limit, limit] if signed, else white-red over [0, limit] (a negative
    value white, as 0: an unsigned scale has no colour for it)."""
    t = min(abs(value) / limit, 1.0) if limit > 0 and (signed or value > 0) else 0.0
    return _mix(_ZERO, _NEGATIVE if signed and value < 0 else _POSITIVE, t)


def _css_rgb(rgb: tuple) -> str:
    return "rgb({}, {}, {})".format(*rgb)


def heatmap_html(
    values,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    title: str = "",
    *,
    signed: bool | None = None,
    limit: float | None = None,
    value_format: str = "{:.2f}",
    axes: tuple[str, str] = ("layer", "head"),
    caption: str = "",
    approximate=None,
) -> str:
    """A [row, col] grid of numbers (e.g. [layer, head] scores) as a coloured HTML table.

    signed: diverging blue-white-red scale centred on 0 (default: if any value is negative),
    otherwise white-red from 0 (a negative value white, as 0). limit: |value| mapped to full colour
    (default: max |value|).
    NaN cells are grey. Hover a cell for its row, column and value. axes: the names of the rows and
    the columns. caption: a line under the title (what a value means). approximate: [row, col] bool,
    the cells whose values are estimates: shown as "~value" in italics, "estimate" in their tooltip.
    """
    row_axis, col_axis = axes
    values = _to_numpy(values, "values [row, col]", ndim=2)
    n_rows, n_cols = values.shape
    if len(row_labels) != n_rows or len(col_labels) != n_cols:
        raise ValueError(
            f"values has shape {values.shape} but got {len(row_labels)} row_labels "
            f"and {len(col_labels)} col_labels"
        )
    if np.isinf(values).any():
        raise ValueError("values contains inf; clip or mask it (NaN is shown as a grey cell)")
    flags = np.zeros(values.shape) if approximate is None else _to_numpy(approximate, "approximate", ndim=2)
    if flags.shape != values.shape:
        raise ValueError(f"approximate has shape {flags.shape}: give one flag per value, {values.shape}")
    finite = values[~np.isnan(values)]
    if signed is None:
        signed = bool((finite < 0).any())
    if limit is None:
        limit = float(np.abs(finite).max()) if finite.size else 0.0
    if not (math.isfinite(limit) and limit >= 0):
        raise ValueError(f"limit must be a finite number >= 0, got {limit}")

    cell = "padding: 2px 6px; text-align: right; font: 12px monospace; border: 1px solid #fff;"
    label = "padding: 2px 6px; font: 12px monospace; text-align: right; color: #333;"
    corner = f"{html.escape(row_axis)} \\ {html.escape(col_axis)}"
    header = "".join(f'<th style="{label}">{html.escape(str(c))}</th>' for c in col_labels)
    rows = []
    for r, row_label in enumerate(row_labels):
        cells = []
        for c, col_label in enumerate(col_labels):
            value = values[r, c]
            text = "–" if math.isnan(value) else value_format.format(value)
            estimate = bool(flags[r, c]) and not math.isnan(value)
            text = f"~{text}" if estimate else text
            tooltip = html.escape(
                f"{row_axis} {row_label}, {col_axis} {col_label}: {text}"
                + (" (estimate)" if estimate else "")
            )
            if math.isnan(value):
                background, ink = _MISSING, "#555"
            else:
                rgb = _cell_colour(value, limit, signed)
                background = _css_rgb(rgb)
                ink = "#fff" if 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] < 140 else "#000"
            cells.append(
                f'<td title="{tooltip}" style="{cell} background: {background}; color: {ink};'
                + (' font-style: italic;">' if estimate else '">')
                + f"{html.escape(text)}</td>"
            )
        rows.append(f'<tr><th style="{label}">{html.escape(str(row_label))}</th>{"".join(cells)}</tr>')

    low = _css_rgb(_NEGATIVE if signed else _ZERO)
    high = _css_rgb(_POSITIVE)
    gradient = f"{low}, {_css_rgb(_ZERO)}, {high}" if signed else f"{low}, {high}"
    low_text = value_format.format(-limit if signed else 0.0)
    legend = (
        '<div style="display: flex; align-items: center; gap: 6px; font: 12px monospace; margin-top: 4px;">'
        f"<span>{html.escape(low_text)}</span>"
        f'<span style="display: inline-block; width: 160px; height: 10px; border: 1px solid #ccc; '
        f'background: linear-gradient(to right, {gradient});"></span>'
        f"<span>{html.escape(value_format.format(limit))}</span></div>"
    )
    heading = "font: bold 14px sans-serif; margin: 4px 0;"
    header_html = f'<h3 style="{heading}">{html.escape(title)}</h3>' if title else ""
    if caption:
        style = "font-size: 13px; margin: 2px 0 6px;"
        header_html += f'<p class="interp-caption" style="{style}">{html.escape(caption)}</p>'
    return (
        f'<div class="interp-heatmap" style="margin: 15px 0;">{header_html}'
        f'<table style="border-collapse: collapse;">'
        f'<thead><tr><th style="{label}">{corner}</th>{header}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>{legend}</div>\n"
    )


def heatmap_grid(heatmaps: Sequence[str], min_width: int = 380) -> str:
    """Heat map fragments side by side, as many per row as the page's width allows (each at least
    `min_width` px wide), instead of one under another."""
    return (
        '<div class="interp-heatmaps" style="display: grid; gap: 8px 24px; align-items: start; '
        f'grid-template-columns: repeat(auto-fill, minmax({min_width}px, 1fr));">'
        + "".join(f'<div style="min-width: 0; overflow-x: auto;">{fragment}</div>' for fragment in heatmaps)
        + "</div>\n"
    )


# ---------------------------------------------------------------------------------------------
# Zoomable SVG (plain inline JavaScript)

_ZOOM_SCRIPT = """(function (view) {
  var svg = view.querySelector("svg"), first = JSON.parse(view.dataset.first);
  var whole = JSON.parse(view.dataset.whole), limits = JSON.parse(view.dataset.scales), at = null;
  function size() { return [svg.clientWidth || 1, svg.clientHeight || 1]; }
  function show(x, y, scale) {
    var wh = size();
    scale = Math.min(Math.max(scale, limits[0] / 4), limits[1] * 4);
    at = [x, y, scale];
    svg.setAttribute("viewBox", [x, y, wh[0] / scale, wh[1] / scale].map(function (v) {
      return v.toFixed(2); }).join(" "));
  }
  function frame(r, bounded) {  /* r: [x, y, w, h]; too wide at the smallest scale: keep its right end */
    var wh = size(), scale = Math.min(wh[0] / r[2], wh[1] / r[3]);
    if (bounded) { scale = Math.min(Math.max(scale, limits[0]), limits[1]); }
    var w = wh[0] / scale, h = wh[1] / scale;
    show(r[2] > w ? r[0] + r[2] - w : r[0] + (r[2] - w) / 2, r[1] + (r[3] - h) / 2, scale);
  }
  function zoom(factor, px, py) {
    var s = at[2], t = Math.min(Math.max(s * factor, limits[0] / 4), limits[1] * 4);
    show(at[0] + px / s - px / t, at[1] + py / s - py / t, t);
  }
  function centre(factor) { var wh = size(); zoom(factor, wh[0] / 2, wh[1] / 2); }
  var actions = {fit: function () { frame(first, true); }, whole: function () { frame(whole, false); },
                 "in": function () { centre(1.25); }, out: function () { centre(0.8); }};
  view.querySelectorAll("button[data-zoom]").forEach(function (button) {
    button.addEventListener("click", actions[button.dataset.zoom]);
  });
  svg.addEventListener("wheel", function (event) {
    event.preventDefault();
    var box = svg.getBoundingClientRect();
    zoom(Math.exp(-event.deltaY * 0.002), event.clientX - box.left, event.clientY - box.top);
  }, {passive: false});
  var drag = null;
  svg.addEventListener("pointerdown", function (event) {
    drag = [event.clientX, event.clientY]; svg.setPointerCapture(event.pointerId);
  });
  svg.addEventListener("pointermove", function (event) {
    if (!drag) { return; }
    show(at[0] - (event.clientX - drag[0]) / at[2], at[1] - (event.clientY - drag[1]) / at[2], at[2]);
    drag = [event.clientX, event.clientY];
  });
  svg.addEventListener("pointerup", function () { drag = null; });
  window.addEventListener("resize", actions.fit);
  actions.fit();
})(%s);"""


def zoomable_svg_html(
    svg: str,
    first_view: tuple[float, float, float, float],
    whole: tuple[float, float, float, float],
    height: int,
    scales: tuple[float, float] = (0.75, 2.5),
) -> str:
    """An SVG (one <svg> element) in a `height` px frame as wide as the page, with zoom (mouse wheel,
    buttons) and pan (drag); no network, plain JavaScript.

    first_view: (x, y, width, height) in the SVG's units, framed when the page opens and by "fit";
    whole: the whole drawing ("whole"). scales: the smallest and largest pixels per unit "fit" uses;
    a first view too wide for the smallest is shown from its right end.
    """
    for name, rect in (("first_view", first_view), ("whole", whole)):
        if len(rect) != 4 or not all(math.isfinite(v) for v in rect) or min(rect[2:]) <= 0:
            raise ValueError(f"{name} must be (x, y, width, height) with width, height > 0, got {rect}")
    if height <= 0 or not 0 < scales[0] <= scales[1]:
        raise ValueError(f"need height > 0 and 0 < smallest <= largest scale, got {height}, {scales}")
    if not svg.lstrip().startswith("<svg"):
        raise ValueError("svg must be one <svg> element")
    view_id = "interp-zoom-" + hashlib.sha256(svg.encode()).hexdigest()[:12]
    x, y, w, h = first_view
    svg = svg.lstrip().replace(
        "<svg",
        f'<svg viewBox="{x:.2f} {y:.2f} {w:.2f} {h:.2f}" preserveAspectRatio="xMinYMin meet" '
        'style="width: 100%; height: 100%; max-width: none; display: block; cursor: grab; '
        'touch-action: none;"',
        1,
    )
    buttons = "".join(
        f'<button type="button" data-zoom="{action}" title="{tip}">{label}</button>'
        for action, label, tip in (
            ("fit", "fit", "back to the first view"),
            ("whole", "whole graph", "everything"),
            ("in", "+", "zoom in (or the mouse wheel)"),
            ("out", "−", "zoom out (or the mouse wheel)"),
        )
    )
    data = (
        f"data-first='{script_json(list(first_view))}' data-whole='{script_json(list(whole))}' "
        f"data-scales='{script_json(list(scales))}'"
    )
    return (
        f'<div class="interp-zoom" id="{view_id}" {data}>'
        f'<div class="interp-zoom-buttons" style="display: flex; gap: 6px; margin: 4px 0;">{buttons}'
        '<span style="color: #555; font-size: .9em;">wheel: zoom, drag: pan</span></div>'
        f'<div style="height: {height}px; border: 1px solid #ddd; overflow: hidden;">{svg}</div>'
        f"<script>{_ZOOM_SCRIPT % _view_of_script(view_id, 's.parentElement')}</script></div>\n"
    )


# ---------------------------------------------------------------------------------------------
# Pages and files


STYLESHEET = """  /* every report page: spaced tables, headings, legends */
body { font: 15px/1.5 system-ui, sans-serif; margin: 24px auto; max-width: 1320px; padding: 0 16px; }
h1 { font-size: 1.6em; margin: 0 0 .6em; }
h2 { font-size: 1.25em; margin: 1.6em 0 .5em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: .5em 0 1em; font-variant-numeric: tabular-nums; }
th, td { padding: 4px 10px; border-bottom: 1px solid #e4e4e4; text-align: left; vertical-align: top; }
th { background: #f4f4f4; font-weight: 600; } tr:nth-child(even) td { background: #fafafa; }
svg, img { max-width: 100%; height: auto; } figure { margin: 0; } figcaption { color: #555; font-size: .9em; }
.legend, .note { color: #444; background: #f7f7f2; border-left: 3px solid #bbb; padding: 6px 12px; }
"""


def html_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain HTML table of text cells (escaped): a header row of `columns`, then `rows`."""
    head = "".join(f"<th>{html.escape(column)}</th>" for column in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def html_page(title: str, sections: Sequence[str]) -> str:
    """A complete HTML document from fragments (raw HTML); includes the circuitsvis bundle once if needed."""
    body = "\n".join(sections)
    bundle = f"<script>{circuitsvis_bundle()}</script>\n" if _NEEDS_BUNDLE in body else ""
    title = html.escape(title)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{title}</title>\n<style>{STYLESHEET}</style>\n{bundle}</head>\n"
        "<body>\n"
        f"<h1>{title}</h1>\n{body}\n</body>\n</html>\n"
    )
