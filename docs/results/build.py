"""The results pages (docs/results/*.md), made from the JSON under docs/results/data/.

    python docs/results/build.py            # rewrite the pages
    python docs/results/build.py --check    # exit 1 if a page differs from what the data make

data/<page>.json holds a page: its title, introduction and sections. A section is either a saved
result (`interp <command> --save FILE.json`, read back with `circuits.results_file.load_result` and
summarised here) or figures reported with their machine, date and command (tables and text in the
JSON). data/machines.json names each machine by its CPU and cores. Every section's first line says
where its figures come from. The tests check that the pages are up to date (tests/test_docs.py).

A reported section that compares the page's saved results names them in "figures_from" (a short name
-> the file) and takes each of their figures from the file, never by hand: `{{gemma|PATH|SPEC}}` is
the value at PATH of that saved result, formatted by SPEC (Python's format spec; a number's minus
sign is printed "−"). PATH reads attributes (a method's value where it takes no arguments) and
[keys]: a dict's key, a list's index, the item whose name is the key (`classes[name_mover]`), a head
table's row or column (`extras.table[L11H2]`, `extras.table[k_composition]`) and a row's columns
(`[induction_effect[L=13]]`). Any other figure of such a section must be one that another section
of the page gives (`hand_figures`, checked by tests/test_docs.py).
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
ROOT = HERE.parents[1]
PAGES = ("heads", "ioi", "circuits", "icl", "performance")
GENERATED = (
    "<!-- Made by docs/results/build.py from docs/results/data/: edit the data or the script and "
    "run `python docs/results/build.py`, not this page. -->"
)


def machines() -> dict[str, dict[str, str]]:
    return json.loads((DATA / "machines.json").read_text())


def machine_name(key: str) -> str:
    machine = machines()[key]
    return machine["cpu"] + (f" ({machine['rate']})" if machine["rate"] else "")


def provenance(section: dict[str, Any]) -> str:
    """The section's first line: machine, date, command, and where the figures come from."""
    keys = section["machine"] if isinstance(section["machine"], list) else [section["machine"]]
    label = "**Machines**" if len(keys) > 1 else "**Machine**"
    parts = [f"{label}: {' and '.join(map(machine_name, keys))}", f"**date**: {section['date']}"]
    commands = ", ".join(f"`{command}`" for command in section["commands"])
    parts.append(f"**command{'s' if len(section['commands']) > 1 else ''}**: {commands}")
    if "note" in section:
        parts[-1] += f" ({section['note']})"
    if section["kind"] == "saved":
        parts.append(
            f"{section['seconds']:.1f} s, interp at commit {section['commit']}; the saved result: "
            f"[data/{section['saved']}](data/{section['saved']})"
        )
    else:
        parts.append(f"source: {section['source']}")
    return "> " + "; ".join(parts) + "."


def table(columns: list[str], rows: list[list[str]], align: str | None = None) -> str:
    align = align or "l" * len(columns)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(columns) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


PLACEHOLDER = re.compile(r"\{\{(?P<name>[^|}]+)\|(?P<path>[^|}]+)\|(?P<spec>[^}]*)\}\}")
PATH_STEP = re.compile(r"\.?(?P<attribute>[A-Za-z_]\w*)|\[(?P<key>(?:[^][]|\[[^]]*\])+)\]")  # [key[L=13]] too
# a figure in prose: a decimal or a percentage, signed or not (counts and head labels are not)
FIGURE = re.compile(r"(?<![\w.])[+−-]?\d[\d,]*(?:\.\d+%?|%)")


@functools.cache
def saved_result(file: str) -> Any:
    from circuits.results_file import load_result

    return load_result(DATA / file)


def step(value: Any, attribute: str | None, key: str | None) -> Any:
    """One step of a placeholder's PATH: `.attribute` or `[key]`."""
    if attribute is not None:
        found = getattr(value, attribute)
        return found() if inspect.ismethod(found) else found  # a method of no arguments: its value
    if hasattr(value, "columns") and key not in value.columns:  # a head table's row ("L11H2")
        from interp.types import label_head

        layer, index = label_head(key)
        return value[(value["layer"] == layer) & (value["head"] == index)].iloc[0]
    if isinstance(value, dict) or hasattr(value, "iloc"):  # a dict's key, a table's column, a row's value
        return value[key]
    if key.isdigit():
        return value[int(key)]
    (found,) = [item for item in value if getattr(item, "name", None) == key]
    return found


def figure(figures_from: dict[str, str], match: re.Match[str]) -> str:
    """A placeholder's value, formatted."""
    if match["name"] not in figures_from:
        raise ValueError(f"{match[0]} names no saved result of the section's figures_from {figures_from}")
    value = saved_result(figures_from[match["name"]])
    path = match["path"]
    steps = list(PATH_STEP.finditer(path))
    if "".join(found[0] for found in steps) != path:
        raise ValueError(f"cannot read the path {path!r} of {match[0]}")
    try:
        for found in steps:
            value = step(value, found["attribute"], found["key"])
    except (AttributeError, KeyError, IndexError, ValueError) as error:
        problem = f"{type(error).__name__}: {error}"
        raise ValueError(f"{match[0]}: {path} has no {found[0]!r} ({problem})") from error
    text = format(value, match["spec"])
    return text if isinstance(value, str) else text.replace("-", "−")


def fill(text: str, figures_from: dict[str, str]) -> str:
    return PLACEHOLDER.sub(functools.partial(figure, figures_from), text)


def body(blocks: list[dict[str, Any]], figures_from: dict[str, str] | None) -> list[str]:
    """A reported section's blocks as markdown, its placeholders filled from `figures_from` (None: left
    as written)."""
    out = []
    for block in blocks:
        if "text" in block:
            out.append(block["text"])
        elif "table" in block:
            out.append(table(**block["table"]))
        else:
            out.append("```bash\n" + block["code"] + "\n```")
    return out if figures_from is None else [fill(text, figures_from) for text in out]


def hand_figures(section: dict[str, Any]) -> list[str]:
    """The figures of a reported section written by hand, not taken from a saved result."""
    return FIGURE.findall(PLACEHOLDER.sub("", "\n".join(body(section["body"], None))))


def pm(value: float, se: float) -> str:
    return f"{value:.2f} ± {se:.2f}"


def effects(row: Any, name: str) -> list[str]:
    """A head's causal effect alone and with the other candidates ablated (blank: not a candidate; "–":
    not measured with the others ablated, the head is confirmed alone at every repeat length)."""
    if math.isnan(row[name]):
        return ["", ""]
    with_others = row[f"{name}_with_others"]
    return [
        pm(row[name], row[f"{name}_se"]),
        "–" if math.isnan(with_others) else pm(with_others, row[f"{name}_with_others_se"]),
    ]


def chosen_and_held_out(row: Any, kind: str) -> str:
    """A type's score on the discovery token family, and "→" its score on the held-out one where the
    head was a candidate."""
    held_out = row.get(f"{kind}_held_out_score", math.nan)
    return f"{row[kind]:.2f}" + ("" if math.isnan(held_out) else f" → {held_out:.2f}")


def heads_section(finding: Any) -> list[str]:
    """A saved `interp heads` finding: the typed heads, their scores and causal effects."""
    report = finding.extras.rows(finding)  # every column of every head, the settings as recorded
    table_ = report.table
    typed = table_[table_["types"].map(len) > 0]
    sinks = typed["types"].map(lambda types: list(types) == ["first_token"])
    n_sinks, typed = int(sinks.sum()), typed[~sinks]
    lengths = report.settings["induction_lengths"]
    rows = []
    for _, row in typed.iterrows():
        types = []
        for kind in row["types"]:
            confirmed = f"{kind}_confirmed" in row and bool(row[f"{kind}_confirmed"])
            types.append(kind.replace("_", "-") + (" ✓" if confirmed else ""))
        rows.append(
            [
                f"L{row['layer']}H{row['head']}",
                ", ".join(types),
                chosen_and_held_out(row, "previous_token"),
                chosen_and_held_out(row, "induction"),
                *effects(row, "induction_effect"),
                *effects(row, "previous_token_effect"),
            ]
        )
    columns = [
        "head",
        "types (✓: confirmed by ablation)",
        "previous-token (chosen → held out)",
        f"induction (lowest of lengths {' / '.join(map(str, lengths))}; chosen → held out)",
        "Δloss alone (nats)",
        "Δloss, other candidates ablated",
        "Δinduction score alone",
        "Δinduction score, others ablated",
    ]
    induction = typed[typed["types"].map(lambda types: "induction" in types)]
    previous = typed[typed["types"].map(lambda types: "previous_token" in types)]
    s = report.settings
    lines = [
        f"{finding.provenance}; {s['n_samples']} random sequences per repeat length "
        f"({', '.join(map(str, lengths))} tokens) of {s['discovery_tokens']} choose the candidates, "
        f"{s['n_samples']} fresh ones per length of {s['held_out_tokens']} (seed {s['held_out_seed']}) test "
        "them: their scores again (after →; ✓ needs it over the type's threshold) and their effects. "
        "Δloss: the loss on the repeated half with the head mean-ablated minus the clean loss; "
        "Δinduction score: how much ablating a previous-token head lowers the induction heads' score (± one "
        "standard error over the held-out sequences; –: not measured with the others ablated, the head is "
        "confirmed alone at every repeat length)."
        + (f" Not listed: {n_sinks} heads typed first-token only (attention sinks)." if n_sinks else ""),
        table(columns, rows, "llrrrrrr"),
    ]
    findings = []
    if "induction" in report.group_effects and len(induction):
        alone, composition = induction["induction_effect"], induction["k_composition"]
        measured = induction[induction["induction_effect_with_others"].notna()]  # not confirmed alone
        after = measured["induction_effect_with_others"]
        heads = ", ".join(
            f"L{layer}H{head}" for layer, head in zip(measured["layer"], measured["head"], strict=True)
        )
        values = f"{after.min():.2f}–{after.max():.2f}" if len(after) > 1 else f"{after.max():.2f}"
        added = (
            f"; ablated after the others, {heads} add{'s' * (len(after) == 1)} {values} nats (the rest are "
            "confirmed alone, not run so)"
            if len(after)
            else ""
        )
        together = report.group_effects["induction"][0]
        strongest = induction.loc[alone.idxmax()]
        pattern = (
            f"back each other up: ablating any one alone moves the repeated-half loss by at most "
            f"{alone.max():.2f} nats"
            if alone.max() < together / 2
            else f"do not back each other up: L{strongest['layer']}H{strongest['head']} alone moves the "
            f"repeated-half loss by {alone.max():.2f} nats"
        )
        n_candidates = int(table_["induction_effect"].notna().sum())  # what the group effect ablates
        findings.append(
            f"The {len(induction)} induction heads {pattern}, ablating all {n_candidates} candidates "
            f"together by {pm(*report.group_effects['induction'])} nats{added}. They K-compose with the "
            f"previous-token heads at {composition.min():.2f}–{composition.max():.2f}."
        )
    if "previous_token" in report.group_effects and len(previous):
        findings.append(
            f"The {len(previous)} previous-token heads: alone they lower the induction heads' "
            f"score by at most {previous['previous_token_effect'].max():.2f}, all together by "
            f"{pm(*report.group_effects['previous_token'])}."
        )
    return lines + [" ".join(findings)]


def percent(value: float) -> str:
    return f"{value:+.0%}".replace("-", "−")


def recovered_interval(validation: Any) -> str:
    """The held-out recovered share's CI, "95% CI 62%–100%", or why it has none."""
    low, high = validation.recovered_ci
    if math.isnan(low) or math.isnan(high):
        return validation.recovered_ci_text(0)[1:-1]  # why there is none, without its parentheses
    return f"95% CI {low:.0%}–{high:.0%}"


def ci(low: float, high: float) -> str:
    if math.isnan(low) or math.isnan(high):
        return "(no CI)"
    return f"[{percent(low)}, {percent(high)}]"


CLASS_NAMES = {
    "name_mover": "name movers",
    "negative_name_mover": "negative name movers",
    "s_inhibition": "S-inhibition",
    "s_suppression": "S-suppression",
    "induction": "induction",
    "duplicate_token": "duplicate-token",
    "previous_token": "previous-token",
    "backup_name_mover": "backup name movers",
}


def completeness_sentence(figures: Any) -> str:
    """The evaluation's largest completeness gap and what the circuit recovers with the unclassified heads."""
    evaluation = figures.evaluation
    worst = max(evaluation.completeness, key=lambda subset: subset["gap"])
    heads = ", ".join(f"L{layer}H{head}" for layer, head in sorted(worst["heads"]))
    sentence = (
        f"Completeness (Wang et al.'s |F(C∖K) − F(M∖K)| / F(M), over {len(evaluation.completeness)} "
        f"subsets K of the circuit: each class and random ones) is {evaluation.completeness_max_gap:.0%} "
        f"at most, for K = {heads}: without K the circuit keeps {worst['circuit_logit_diff']:.2f} of the "
        f"logit diff, the whole model {worst['model_logit_diff']:.2f}."
    )
    if evaluation.recovered_with_unclassified is not None:
        sentence += (
            f" Kept with the circuit, the unclassified heads change what it recovers on the discovery "
            f"prompts to {evaluation.recovered_with_unclassified:.0%}."
        )
    return sentence


def _verdict_cell(check) -> str:
    """A class's verdict and the strata it holds in, or why it is unconfirmed."""
    if check.unconfirmed_because:
        return f"{check.verdict} ({check.unconfirmed_because})"
    return f"{check.verdict} (holds in {', '.join(s.name for s in check.strata if s.holds)})"


def ioi_section(result: Any) -> list[str]:
    """A saved `interp ioi` result (a Finding): baseline, classes with their evidence, evaluation,
    validation."""
    from circuits.ioi.results import CLASS_KIND

    figures = result.extras
    base, evaluation, validation = figures.baseline, figures.evaluation, figures.heldout
    checks = {check.name: check for check in result.classes}
    rows = []
    for name, heads in figures.class_heads.items():
        if not heads:
            continue
        kind = CLASS_KIND.get(name, "")
        check = checks.get(name)
        rows.append(
            [
                CLASS_NAMES.get(name, name),
                ", ".join(f"L{h.layer}H{h.head} ({percent(h.effect)})" for h in heads),
                f"{kind} " + ", ".join(f"{h.attention[kind]:.2f}" for h in heads) if kind else "",
                ", ".join(
                    f"IO {h.direct_logit_attribution['IO']:+.2f} / S {h.direct_logit_attribution['S']:+.2f}"
                    for h in heads
                ),
                f"{percent(check.heldout.beyond)} {ci(*check.heldout.beyond_ci)}" if check else "",
                _verdict_cell(check) if check else "",
            ]
        )
    if figures.unclassified:
        rows.append(
            [
                "unclassified",
                ", ".join(f"L{h.layer}H{h.head} ({percent(h.effect)})" for h in figures.unclassified),
                "",
                "",
                "",
                "",
            ]
        )
    columns = [
        "class",
        "heads (path-patching drop)",
        "attention",
        "direct logit attribution",
        "held out: drop beyond random heads (95% CI)",
        "verdict",
    ]
    return [
        f"{result.provenance}; {base.n_prompts} discovery prompts (seed {result.settings.seed}), "
        f"corruption {result.settings.corrupted}. Logit diff (IO − S) {base.logit_diff:.2f} (95% CI "
        f"{base.logit_diff_ci[0]:.2f}–{base.logit_diff_ci[1]:.2f}), accuracy {base.accuracy:.0%}, IO "
        f"top-1 {base.top1_io:.0%}.",
        table(columns, rows),
        "Beside each head: its path-patching drop, (clean − patched) / clean logit diff when its path is "
        "patched from the ABC run (positive: the head helps predict IO); held out, each class's drop is "
        "clean − ablated. "
        f"The circuit alone, every other head mean-ablated, recovers {evaluation.recovered:.0%} of the "
        f"logit difference on the discovery prompts (faithfulness {evaluation.faithfulness:.0%}) and "
        f"{validation.recovered:.0%} ({recovered_interval(validation)}, faithfulness "
        f"{validation.faithfulness:.0%}) on "
        f"{validation.n_prompts} held-out prompts{figures.held_out_scope(result)}: {validation.prompts}. "
        + completeness_sentence(figures)
        + " A class is *confirmed* when it beats as many random heads from the same layers on the "
        "held-out prompts pooled and in at least one name order and one held-out template, and in both "
        "orders and most templates unless those that fall short differ from the others no more than "
        "chance (permutation test, p >= 0.05); a class that beats them pooled but falls short in an order "
        "(most templates), the strata differing beyond chance, is *order-* (*template-*) *dependent*; any "
        "other class is *unconfirmed*."
        + (
            f" Direct logit attribution: {result.settings.attribution}."
            if result.settings.attribution
            else ""
        ),
    ]


def circuit_section(result: Any) -> list[str]:
    """A saved `interp circuit` result: size, faithfulness, the curve's summary, the top edges."""
    summary = result.json_data(top=8)
    task, method, circuit, curve = summary["task"], summary["method"], summary["circuit"], summary["curve"]
    low, high = circuit["faithfulness_ci"]
    how = (
        f"the smallest reaching faithfulness ≥ {circuit['size_target']}"
        if circuit["size_target"] is not None
        else "requested"
    )
    held_out = task["n_heldout"] is not None
    tested = "held-out prompts" if held_out else "the prompts that found it"
    lines = [
        f"{result.provenance}; task {task['name']}: {task['n_prompts']} discovery prompt pairs"
        + (f", {task['n_heldout']} held out ({task['split']})" if held_out else "")
        + f"; {task['metric']} clean {task['clean_metric']:.2f}, corrupted {task['corrupted_metric']:.2f}; "
        f"{method['name']} ({method['steps']} steps), {method['ablation']} ablation.",
        f"The circuit: {circuit['n_edges']} of {summary['graph']['n_edges']} edges ({how}, on the discovery "
        f"prompts), {len(circuit['nodes'])} of {summary['graph']['n_nodes']} nodes, faithfulness "
        f"{circuit['faithfulness']:.2f} [{low:.2f}, {high:.2f}] on {tested} (95% CI over "
        f"{circuit.get('ci_resamples', 'prompts')})"
        + (
            f"; {circuit['discovery_faithfulness']:.2f} on the discovery prompts: {circuit['held_out_note']}."
            if held_out
            else "."
        ),
    ]
    if curve is not None:
        random = curve["random"]
        lines.append(
            f"Over MIB's ten circuit sizes, on {tested}: CPR {curve['cpr']:.2f}, CMD {curve['cmd']:.2f} "
            f"(random circuits asked for at the same sizes: CPR {random['cpr']:.2f}, "
            f"CMD {random['cmd']:.2f})."
        )
    edges = circuit["edges"][:8]
    if any(edge.get("removal_effect") is not None for edge in edges):  # rank-only scores (prune, ensemble)
        rows = [
            [f"`{edge['writer']}`", f"`{edge['reader']}`", f"{edge['removal_effect']:+.2f}"]
            + ["measured" if edge["removal_measured"] else "estimated (gradient)"]
            for edge in edges
        ]
        column = f"effect of removal (m(circuit without it) − m(circuit), on {tested})"
        lines.append(table(["writer", "reader", column, ""], rows, "llrl"))
        return lines
    rows = [[f"`{edge['writer']}`", f"`{edge['reader']}`", f"{edge['score']:+.2f}"] for edge in edges]
    lines.append(table(["writer", "reader", "score (m(edge ablated) − m(clean))"], rows, "llr"))
    return lines


def icl_section(finding: Any) -> list[str]:
    """A saved `interp icl` finding: the held-out ICL score, each class against random heads, the top heads,
    the documents."""
    figures = finding.extras
    return [f"Model: {finding.provenance}.", *figures.headline(finding), *figures.chose_lines(finding)]


def fv_section(finding: Any) -> list[str]:
    """A saved `interp icl --fv` finding: what chose and what tested, the held-out tests, the FV heads."""
    figures = finding.extras
    written = (
        [f"A head's output in the function vector: {figures.written}, averaged."] if figures.written else []
    )
    chose = "; ".join([*finding.family_lines(), *figures.chose_lines(finding)]) + "."
    return [f"Model: {finding.provenance}.", chose, *figures.headline(finding), *written]


RENDERERS = {
    "heads": heads_section,
    "ioi": ioi_section,
    "circuit": circuit_section,
    "icl": icl_section,
    "fv": fv_section,
}


def saved_section(section: dict[str, Any]) -> list[str]:
    """A saved result's summary, then (a Finding's) how many of its classes chance alone could confirm and
    which of them Holm's correction keeps."""
    from circuits.sections import multiplicity_lines

    kind = json.loads((DATA / section["saved"]).read_text())["kind"]
    result = saved_result(section["saved"])
    return RENDERERS[getattr(result, "analysis", kind)](result) + multiplicity_lines(
        getattr(result, "classes", [])
    )


def section_text(section: dict[str, Any]) -> list[str]:
    """A section's blocks after its provenance line."""
    if section["kind"] == "saved":
        return saved_section(section)
    return body(section["body"], section.get("figures_from", {}))


def page_spec(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.json").read_text())


def page(name: str) -> str:
    spec = page_spec(name)
    parts = [f"# {spec['title']}", GENERATED, spec["intro"]]
    for section in spec["sections"]:
        parts.append(f"## {section['title']}")
        parts.append(provenance(section))
        parts += section_text(section)
    return "\n\n".join(parts) + "\n"


def index() -> str:
    rows = [[machine_name(key), machine["date"] or "per figure"] for key, machine in machines().items()]
    titles = {name: page_spec(name)["title"] for name in PAGES}
    links = "\n".join(f"- [{titles[name]}]({name}.md)" for name in PAGES)
    return (
        "\n\n".join(
            [
                "# Results",
                GENERATED,
                "What interp finds on the models it ships with, on SmolLM2-135M-Instruct and on Gemma 3 "
                "270M, and how fast. "
                "Every section states the machine, the date and the command its figures come from; the pages "
                "are made by `python docs/results/build.py` from the JSON under `docs/results/data/` (saved "
                "results, `interp <command> --save FILE.json`, which `interp render FILE.json` shows in any "
                "format, and figures reported with their machine, date and command).",
                links,
                "The machines:",
                table(["machine", "date"], rows),
            ]
        )
        + "\n"
    )


def build() -> dict[Path, str]:
    """Every page's path -> its text, made from the data."""
    pages = {HERE / f"{name}.md": page(name) for name in PAGES}
    pages[HERE / "index.md"] = index()
    return pages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is not what the data make")
    options = parser.parse_args()
    stale = []
    for path, text in build().items():
        if options.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(path.relative_to(ROOT))
        else:
            path.write_text(text)
    if stale:
        sys.exit(f"out of date: {', '.join(map(str, stale))}; run python docs/results/build.py")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
