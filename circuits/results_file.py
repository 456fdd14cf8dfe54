"""One run, many formats: a command's full result as JSON, read back and rendered again.

    save_result(report, "heads.json")            # what `interp heads --save heads.json` writes
    result = load_result("heads.json")           # the same Finding, nothing recomputed
    write_result_report(result, "html", "heads.html", console)   # what `interp render` does

The file is {"schema": SCHEMA, "kind": one of KINDS, "command": ..., "settings": ..., "result": ...}
(the command and settings that made it, what `check_save_file` compares), the result in
`interp.io.serialize`'s strict JSON; functions (a task's metric) are not stored. Files of older
schemas load too (`_read_older`). While a command that keeps its stages runs, its --save file is a
`PartialResult`, rewritten as each stage finishes and resumed by the same command with the same
settings (`resume_stages`); --save never replaces a result of another command, settings or weights.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from circuits import sections
from circuits.edge_circuits.find import EdgeCircuitResult
from circuits.edge_circuits.report import FORMATS as EDGE_FORMATS
from circuits.edge_circuits.report import write_edge_report
from circuits.edge_circuits.tasks import EdgeTask
from circuits.evidence import HELD_OUT_ONLY, BeyondRandom
from circuits.finding import Finding, write_finding_report
from circuits.heads.causal import CausalEffects
from circuits.heads.pipeline import HeadSettings
from circuits.heads.results import TOKEN_AXIS, HeadFigures, class_columns, older_head_classes
from circuits.heads.scores import HeadScores
from circuits.hop import HopFigures
from circuits.hop.locate import HopSettings, not_found_lookup
from circuits.icl import (
    DocumentSplit,
    FunctionVectorFigures,
    FunctionVectorSettings,
    ICLFigures,
    ICLScore,
    ICLSettings,
    TrainingCurve,
    Windows,
)
from circuits.icl.fv_pipeline import QueryEffects
from circuits.ioi.results import HeldOut, IOIFigures
from circuits.ioi.steps import StepResult
from circuits.ioi.task import text_families, toy_families
from circuits.patch_report import FORMATS as PATCH_FORMATS
from circuits.patch_report import PatchReport, write_patch_report
from circuits.path.results import PathFigures
from circuits.path.steps import PathSettings
from circuits.retrieval import RetrievalFigures, RetrievalSettings
from circuits.stages import StageResults
from interp import edges
from interp.interventions.results import PatchResult
from interp.interventions.stats import FaithfulnessSummary
from interp.io.files import held_lock, write_text_atomic
from interp.io.serialize import decode, encode, register_dataclass
from interp.tasks.ioi_templates import BABA_TEMPLATES


@dataclass(kw_only=True)
class PartialResult:
    """What a --save file holds until its run's last stage ends. settings: what a resumed run must
    match (options, weights' fingerprint); done: each finished stage's result; notes: its lines."""

    command: str  # "heads", "ioi", "icl", "icl --fv"
    settings: dict[str, Any]
    stages: list[str]
    done: dict[str, Any]
    notes: dict[str, list[str]]

    @property
    def missing(self) -> list[str]:
        return [stage for stage in self.stages if stage not in self.done]

    def json_data(self) -> dict[str, Any]:
        """`--format json`: the command, settings, stages done and missing, notes (no stage results)."""
        return {"command": self.command, "settings": self.settings, "stages": self.stages,
                "done": list(self.done), "missing": self.missing, "notes": self.notes}  # fmt: skip


def write_partial_report(
    result: PartialResult, format: str, out: str | Path | None, console: Console
) -> None:
    """The stages a stopped run finished, with their notes, and those it did not."""
    settings = ", ".join(f"{name} {value}" for name, value in result.settings.items())
    report = sections.Report(
        title=f"interp {result.command}: partial result ({len(result.done)} of {len(result.stages)} stages)",
        headline=[
            f"Missing stages: {', '.join(result.missing) or 'none'}. This is not the command's report: "
            f"rerun `interp {result.command}` with the same options and --save to resume from here.",
            f"Settings: {settings}.",
        ],
        sections=[
            sections.Section(title=f"Done: {stage}", lines=result.notes.get(stage, []))
            for stage in result.stages
            if stage in result.done
        ],
    )
    sections.write_sections(report, format, out, console, result)


SCHEMA = "interp-result-3"
# interp-result-1: bare NaN tokens and frames as {column: values}, which decode reads; interp-result-1
# and -2: IOI's path-patching effects patched - clean, which `_read_older` negates into drops
PATCHED_MINUS_CLEAN_SCHEMAS = ("interp-result-1", "interp-result-2")
READ_SCHEMAS = (*PATCHED_MINUS_CLEAN_SCHEMAS, SCHEMA)
KINDS = {  # kind -> (result type, formats, writer)
    "circuit": (EdgeCircuitResult, EDGE_FORMATS, write_edge_report),
    "patch": (PatchReport, PATCH_FORMATS, write_patch_report),
    "finding": (Finding, sections.FORMATS, write_finding_report),
    "partial": (PartialResult, sections.FORMATS, write_partial_report),
}
RESULT_TYPES = tuple(result_type for result_type, _, _ in KINDS.values())
# older kinds -> theirs now
OLDER_KINDS = dict.fromkeys(("hop", "retrieval", "ioi", "icl", "fv", "heads"), "finding")


def _register_dataclasses() -> None:
    """Every dataclass a stored result may hold (those of its types' modules) is stored by name."""
    types = (
        *RESULT_TYPES, EdgeTask, PatchResult, ICLScore, Windows, PathFigures, PathSettings, BeyondRandom,
        StepResult, HeadScores, CausalEffects, QueryEffects, FaithfulnessSummary, HopFigures, HopSettings,
        RetrievalFigures, RetrievalSettings,
        IOIFigures,
        ICLFigures, ICLSettings, TrainingCurve, FunctionVectorFigures,
        HeadFigures, HeadSettings,
    )  # fmt: skip
    for module in [*map(inspect.getmodule, types), edges]:
        for cls in vars(module).values():
            if isinstance(cls, type) and dataclasses.is_dataclass(cls):
                register_dataclass(cls)


_register_dataclasses()


def result_kind(result: Any) -> str:
    """The kind of a command's result ("heads", "circuit", "patch", "finding" or "partial")."""
    for kind, (result_type, _, _) in KINDS.items():
        if isinstance(result, result_type):
            return kind
    raise TypeError(
        f"cannot store a {type(result).__name__}; pass one of {', '.join(t.__name__ for t in RESULT_TYPES)}."
    )


def save_result(
    result: Any, path: str | Path, command: str | None = None, settings: dict[str, Any] | None = None
) -> None:
    """Write `result` to `path` as JSON, atomically, with the `command` and `settings` that made it
    (what `check_save_file` compares a later --save with)."""
    document = {"schema": SCHEMA, "kind": result_kind(result)}
    if command is not None:
        document |= {"command": command, "settings": _plain(settings or {})}
    document["result"] = encode(result, drop_callables=True)
    write_text_atomic(path, json.dumps(document, allow_nan=False))


def load_result(path: str | Path) -> Any:
    """Read a result that `save_result` wrote."""
    try:
        document = json.loads(Path(path).read_text())
    except FileNotFoundError as error:
        raise FileNotFoundError(
            f"no result file {path}; write one with a command's --save FILE.json."
        ) from error
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not JSON ({error}); pass a file written by --save.") from error
    found = document.get("schema") if isinstance(document, dict) else type(document).__name__
    newer = re.fullmatch(r"interp-result-(\d+)", str(found))
    if newer and int(newer[1]) > int(SCHEMA.rsplit("-", 1)[1]):
        raise ValueError(
            f"{path} was saved by a newer interp (schema {found!r}; this one reads up to {SCHEMA!r}): "
            "upgrade interp to read it."
        )
    if not isinstance(document, dict) or found not in READ_SCHEMAS:
        raise ValueError(
            f"{path} is not a saved result (schema {found!r}, expected {SCHEMA!r}); "
            "write one with a command's --save FILE.json (--format json is a summary, not the full result)."
        )
    if document.get("kind") not in (*KINDS, *OLDER_KINDS):
        raise ValueError(
            f"{path} holds an unknown kind {document.get('kind')!r}; expected one of {', '.join(KINDS)}."
        )
    try:
        older = document["schema"] in PATCHED_MINUS_CLEAN_SCHEMAS
        return decode(_read_older(document["result"], older))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RuntimeError) as error:
        command = document.get("command") or {"fv": "icl --fv"}.get(document["kind"], document["kind"])
        # a hand-edited or damaged file, or one of an interp version whose result this one cannot read
        raise ValueError(
            f"{path} does not hold a readable {document['kind']} result ({type(error).__name__}: {error}); "
            f"run `interp {command}` again with --save FILE.json."
        ) from error


def _negated(value: Any) -> Any:
    """-value of a stored float ({"__float__": ...} too) or tensor's nested lists (a zero stays +0.0)."""
    if isinstance(value, list):
        return [_negated(item) for item in value]
    if isinstance(value, dict):
        flipped = {"inf": "-inf", "-inf": "inf"}
        return {"__float__": flipped.get(value["__float__"], value["__float__"])}
    return 0.0 - value


def _beyond_as_drop(older: dict[str, Any]) -> dict[str, Any]:
    """IOI's stored difference beyond random (ablated - clean) and its CI (low, high), taken out of
    `older`, as the drop beyond random, negated, and its CI (-high, -low)."""
    negated_ci = _negated(older.pop("difference_ci")["__tuple__"])[::-1]  # (-high, -low)
    return {"beyond": _negated(older.pop("difference")), "beyond_ci": {"__tuple__": negated_ci}}


def _older_stratum(name: str, fields: dict[str, Any]) -> dict[str, Any]:
    """A stored stratum of an older type as a StratumDrop's fields."""
    if name == "StratumEffect":  # IOI's: the effect beyond random heads, ablated - clean
        fields = dict(fields)
        fields |= _beyond_as_drop(fields)
    elif name == "RetrievalStratum":  # named "4 facts", "template statement" or the relation
        label = fields["name"]
        kind = (
            "facts"
            if label.endswith(" facts")
            else "template"
            if label.startswith("template ")
            else "relation"
        )
        fields = {"kind": kind, **fields}
    return {"__dataclass__": "StratumDrop", "fields": fields}


def _older_class_validation(fields: dict[str, Any]) -> dict[str, Any]:
    """IOI's stored class effects (ablated - clean, sign -1 for a class that helps) as drops."""
    older = dict(fields)
    newer = {
        "sign": -older.pop("sign"),
        "drop": _negated(older.pop("effect")),
        "random_drop": _negated(older.pop("random_effect")),
        **_beyond_as_drop(older),
    }
    return {"__dataclass__": "ClassValidation", "fields": {**older, **newer}}


def _older_class(fields: dict[str, Any], details: Sequence[str]) -> dict[str, Any]:
    """An older record of a judged class as a ClassVerdict: `details` fields moved under details; the
    random sets' effects and per-prompt effect, which it lacks, empty."""
    fields = dict(fields)
    moved = {"__items__": [[name, fields.pop(name)] for name in details]}
    empty = {"__tensor__": [], "dtype": "float32", "shape": [0]}
    fields = {"random_sets": [], "random_effects": [], "per_prompt": empty, **fields, "details": moved}
    return {"__dataclass__": "ClassVerdict", "fields": fields}


def _held_out(older: dict[str, Any], n_prompts: int, effect: str) -> BeyondRandom:
    """An older record's held-out figures as a BeyondRandom, taken out of `older`: its stored `effect`
    and CI, the mean of its random sets' effects, its difference beyond them and CI. Its random sets'
    effects are left under "random_effects" (older records: "random_changes")."""
    if "random_changes" in older:
        older["random_effects"] = older.pop("random_changes")
    return BeyondRandom(
        n_prompts=n_prompts, drop=decode(older.pop(effect)), drop_ci=decode(older.pop(f"{effect}_ci")),
        random_drop=_mean(older["random_effects"]), beyond=decode(older.pop("difference")),
        beyond_ci=decode(older.pop("difference_ci")),
    )  # fmt: skip


def _held_out_only(fields: dict[str, Any], heldout: BeyondRandom, details: Sequence[str]) -> dict[str, Any]:
    """An older class measured on held-out data only as a ClassVerdict (sign +1, no strata by default)."""
    judged = {"sign": 1, "strata": [], **fields, "heldout": encode(heldout), "discovery": None}
    return _older_class({**judged, "note": HELD_OUT_ONLY}, details)


def _mean(stored: list[Any]) -> float:
    """The mean of the random sets' stored effects (a figure such files do not hold)."""
    values = decode(stored)
    return sum(values) / len(values)


def _summary(n_prompts: int, ratio: Any, ratio_ci: Any = None) -> dict[str, Any]:
    """An older stored faithfulness `ratio` (and CI) as a stored FaithfulnessSummary, the rest NaN."""
    nan = float("nan")
    ci = (nan, nan) if ratio_ci is None else decode(ratio_ci)
    return encode(
        FaithfulnessSummary(n_prompts=n_prompts, ratio=decode(ratio), ratio_ci=ci, error=nan, within=nan)
    )


def _extras(figures: type, fields: dict[str, Any], **given: Any) -> dict[str, Any]:
    """The stored `figures` (an Extras dataclass) from `given`, else the older `fields`."""
    found = {**fields, **given}
    stored = {field.name: found[field.name] for field in dataclasses.fields(figures) if field.name in found}
    return {"__dataclass__": figures.__name__, "fields": stored}


def _older_hop_lookups(fields: dict[str, Any]) -> dict[str, Any]:
    """A HopResult's HopLookups (before 2026-11-29) as ClassVerdicts "hop j" (no head: `not_found_lookup`)."""
    lookups = []
    for node in fields["lookups"]:
        older = dict(node["fields"])
        if not older["heads"]:
            lookups.append(encode(not_found_lookup(older["hop"])))
            continue
        heldout = _held_out(older, fields["n_sequences"] // 2, "change")
        older["name"] = f"hop {older['hop']}"
        lookups.append(_held_out_only(older, heldout, ["hop", "layers", "attention"]))
    return {**fields, "lookups": lookups}


PATH_DETAILS = ("from_hop", "to_hop", "receivers", "route")  # a hop path's details


def _older_hop(fields: dict[str, Any]) -> dict[str, Any]:
    """A HopResult (before 2026-11-29) as the fields of the Finding "hop": each HopPath a ClassVerdict
    of its senders; n_random the number of random sets it compared with."""
    if any(look["__dataclass__"] == "HopLookup" for look in fields["lookups"]):
        fields = _older_hop_lookups(fields)
    half, paths = fields["n_sequences"] // 2, []
    for node in fields["paths"]:
        older = dict(node["fields"])
        heldout = _held_out(older, half, "effect")
        path = {
            "name": f"hop {older['from_hop']}", "heads": older["senders"],
            "random_sets": older["random_sets"], "random_effects": older["random_effects"],
            "verdict": "confirmed" if older["carries"] else "unconfirmed",
            **{name: older[name] for name in PATH_DETAILS},
        }  # fmt: skip
        paths.append(_held_out_only(path, heldout, PATH_DETAILS))
    random_sets = [c["fields"]["random_sets"] for c in fields["lookups"] if c["fields"]["random_sets"]]
    settings = HopSettings(
        n_sequences=fields["n_sequences"],
        seed=fields["seed"],
        min_attention=fields["min_attention"],
        n_random=len(random_sets[0]) if random_sets else HopSettings.n_random,
    )
    return {
        "analysis": "hop", "model": fields["model_name"], "provenance": fields["provenance"],
        "settings": encode(settings), "chose": encode({"sequences": [f"0-{half - 1}"]}),
        "tested": encode({"sequences": [f"{half}-{fields['n_sequences'] - 1}"]}),
        "classes": fields["lookups"], "extras": _extras(HopFigures, fields, paths=paths),
    }  # fmt: skip


def _older_path(fields: dict[str, Any]) -> dict[str, Any]:
    """A PathResult (before 2026-11-29) as the fields of the Finding "path"; provenance: the model's name."""
    axis = "families" if fields["by_family"] else "prompts"
    summary = fields.get("faithfulness_summary")
    if summary is None:
        summary = _summary(fields["n_heldout"], fields["faithfulness"], fields["faithfulness_ci"])
    return {
        "analysis": "path", "model": fields["model"], "provenance": fields["model"],
        "settings": fields["settings"], "chose": encode({axis: list(decode(fields["chose"]))}),
        "tested": encode({axis: list(decode(fields["tested"]))}), "classes": fields["classes"],
        "faithfulness": summary, "faithfulness_strata": fields.get("faithfulness_strata", []),
        "extras": _extras(PathFigures, fields),
    }  # fmt: skip


def _older_retrieval(fields: dict[str, Any]) -> dict[str, Any]:
    """A RetrievalResult (before 2026-11-29) as the fields of the Finding "retrieval". Held-out
    relations asked for, which it lacks: the default where it covers those tested, else those tested.
    Faithfulness: None where it was NaN."""
    relations, templates = decode(fields["relations"]), decode(fields["templates"])
    facts = tuple(int(a["fields"]["prompts"].split(", ")[-1].split()[0]) for a in fields["heldout_by_facts"])
    tested = tuple(relations.heldout)
    asked = RetrievalSettings.heldout_relations
    settings = RetrievalSettings(
        **decode(fields["settings"]), heldout_facts=facts, seed=fields["seed"],
        heldout_relations=asked if set(tested) <= set(asked) else tested,
    )  # fmt: skip
    ratio, n_heldout = fields["faithfulness"], fields["heldout"]["fields"]["n_prompts"]
    faithfulness = None if math.isnan(decode(ratio)) else _summary(n_heldout, ratio)
    return {
        "analysis": "retrieval", "model": fields["model_name"], "provenance": fields["provenance"],
        "settings": encode(settings),
        "chose": encode({"relations": list(relations.discovery), "templates": templates["discovery"]}),
        "tested": encode({"relations": list(tested), "templates": templates["heldout"]}),
        "classes": fields["classes"], "faithfulness": faithfulness, "faithfulness_strata": [],
        "timings": fields.get("timings", encode({})),
        "extras": _extras(RetrievalFigures, fields, attribution=fields.get("attribution", "")),
    }  # fmt: skip


def _older_ioi_classes(fields: dict[str, Any]) -> dict[str, Any]:
    """An older IOI Validation's fields, each ClassValidation as a held-out-only ClassVerdict (drop CI
    NaN; heterogeneity and writes under details)."""
    classes = []
    for name, node in fields["classes"]["__items__"]:
        if node.get("__dataclass__") == "ClassValidation":
            older, nan = node["fields"], float("nan")
            heldout = BeyondRandom(
                n_prompts=fields["n_prompts"], drop=decode(older["drop"]), drop_ci=(nan, nan),
                random_drop=decode(older["random_drop"]), beyond=decode(older["beyond"]),
                beyond_ci=decode(older["beyond_ci"]),
            )  # fmt: skip
            q, df, p, i2 = older["heterogeneity"]["__tuple__"]
            spread = {"__items__": [["Q", q], ["df", df], ["p", p], ["I2", i2]]}
            writes = {} if older["writes"] is None else {"writes": older["writes"]}
            judged = {
                "name": name, "heads": older["heads"], "sign": older["sign"], "strata": older["strata"],
                "verdict": older["verdict"], "heterogeneity": spread, **writes,
            }  # fmt: skip
            node = _held_out_only(judged, heldout, ["heterogeneity", *writes])
        classes.append([name, node])
    return {**fields, "classes": {"__items__": classes}}


def _older_ioi(fields: dict[str, Any]) -> dict[str, Any]:
    """An IOICircuitResult (before 2026-11-29) as the fields of the Finding "ioi". Such files lack the
    families: chose and tested are read from what validation says it held out (a caller's split: its
    strata's templates)."""
    settings = dict(fields["settings"]["fields"])
    model = settings.pop("model")
    provenance = settings.pop("provenance", "") or model
    validation = fields.get("validation")
    held_out = None if validation is None else validation["fields"]
    chose, tested, classes = {}, {}, []
    if held_out is not None:
        classes = [node for _, node in held_out["classes"]["__items__"]]
        described = held_out["prompts"]
        if described.startswith("held-out toy"):
            chose, tested = toy_families("discovery"), toy_families("heldout")
        elif "HELDOUT_" in described:
            chose, tested = text_families("discovery"), text_families("heldout")
        else:  # the caller's held-out prompts: the templates validation split them by
            strata = classes[0]["fields"]["strata"] if classes else []
            tested = {"templates": [s["fields"]["name"] for s in strata if s["fields"]["kind"] == "template"]}
    heldout = None if held_out is None else _extras(HeldOut, held_out)
    return {
        "analysis": "ioi", "model": model, "provenance": provenance,
        "settings": {"__dataclass__": "Settings", "fields": settings},
        "chose": encode(chose), "tested": encode(tested), "classes": classes,
        "faithfulness": None if held_out is None else held_out.get("faithfulness_summary"),
        "faithfulness_strata": [] if held_out is None else held_out.get("faithfulness_strata", []),
        "timings": fields.get("timings", encode({})),
        "extras": _extras(IOIFigures, fields, class_heads=fields["classes"], heldout=heldout),
    }  # fmt: skip


def _numbered_after_discovery(node: dict[str, Any]) -> dict[str, Any]:
    """A stored IOI Finding of a text model saved before 2026-12-01 (04f8e3d) named held-out template k
    "Tk", counted within the held-out split, so its strata and `tested` read as the discovery templates
    of that name; held-out template k is now T{len(BABA_TEMPLATES) + k}, as `ioi_dataset_for` numbers it."""
    fields = node["fields"]
    heldout = fields["extras"]["fields"].get("heldout")
    if heldout is None or "HELDOUT_" not in heldout["fields"]["prompts"]:
        return node  # a toy model's templates share one list; a caller's prompts keep their labels
    first = len(BABA_TEMPLATES)

    def renamed(label: str) -> str:
        return f"T{first + int(label[1:])}" if int(label[1:]) < first else label

    def strata(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**s, "fields": {**s["fields"], "name": renamed(s["fields"]["name"])}}
                if s["fields"]["kind"] == "template" else s for s in nodes]  # fmt: skip

    classes = [
        {**c, "fields": {**c["fields"], "strata": strata(c["fields"]["strata"])}} for c in fields["classes"]
    ]
    tested = fields["tested"]
    if isinstance(tested, dict) and "__items__" in tested:
        tested = {"__items__": [[axis, [renamed(t) for t in labels] if axis == "templates" else labels]
                                for axis, labels in tested["__items__"]]}  # fmt: skip
    fields = {**fields, "classes": classes, "faithfulness_strata": strata(fields["faithfulness_strata"]),
              "tested": tested}  # fmt: skip
    return {**node, "fields": fields}


def _older_icl_class(fields: dict[str, Any], n_prompts: int) -> dict[str, Any]:
    """ICL's ClassEffect (before 2026-11-29) as a held-out-only ClassVerdict on `n_prompts` documents."""
    fields = dict(fields)
    del fields["random_same_layers"]
    heldout = _held_out(fields, n_prompts, "change")
    return _held_out_only(fields, heldout, ["found_by", "attributed"])


def _older_icl(fields: dict[str, Any]) -> dict[str, Any]:
    """An ICLResult (before 2026-11-29) as the fields of the Finding "icl", its settings from what it
    holds."""
    chose, tested, n_ablated = fields["discovery_names"], fields["heldout_names"], fields.get("n_ablated")
    classes = fields["classes"]
    if any(c["__dataclass__"] == "ClassEffect" for c in classes):
        ablated = n_ablated or fields["heldout"]["fields"]["per_document"]["shape"][0]
        classes = [_older_icl_class(c["fields"], ablated) for c in classes]
    settings = ICLSettings(
        n_documents=len(chose) + len(tested),
        split=DocumentSplit(discovery=len(chose), ablated=n_ablated),
        windows=decode(fields["windows"]),
        ablation=fields["ablation"],
        top=len(fields["heads"]),
        n_random=len(classes[0]["fields"]["random_sets"]) if classes else ICLSettings.n_random,
        seed=fields["seed"],
    )
    return {
        "analysis": "icl", "model": fields["model_name"], "provenance": fields["provenance"],
        "settings": encode(settings), "chose": encode({"documents": chose}),
        "tested": encode({"documents": tested}), "classes": classes, "timings": fields["timings"],
        "extras": _extras(ICLFigures, fields),
    }  # fmt: skip


def _older_fv(fields: dict[str, Any]) -> dict[str, Any]:
    """A FunctionVectorResult (before 2026-11-29) as the fields of the Finding "fv": its tests as the
    classes, its settings from what it holds."""
    split, template_split = decode(fields["split"]), decode(fields["template_split"])
    classes = [fields["aie_test"], fields["vector_test"], *fields["ablations"]]
    settings = FunctionVectorSettings(
        tasks=fields["tasks"], heldout_tasks=list(split.heldout), templates=fields["templates"],
        heldout_templates=list(template_split.heldout), n_prompts=fields["n_prompts"],
        n_shots=fields["n_shots"], top=len(fields["fv_heads"]), candidates=len(fields["candidates"]),
        n_random=len(classes[0]["fields"]["random_sets"]), n_documents=fields["n_documents"],
        seed=fields["seed"],
    )  # fmt: skip
    return {
        "analysis": "fv", "model": fields["model_name"], "provenance": fields["provenance"],
        "settings": encode(settings),
        "chose": encode({"tasks": list(split.discovery), "templates": list(template_split.discovery)}),
        "tested": encode({"tasks": list(split.heldout), "templates": list(template_split.heldout)}),
        "classes": classes, "timings": fields["timings"], "extras": _extras(FunctionVectorFigures, fields),
    }  # fmt: skip


def _older_heads(fields: dict[str, Any]) -> dict[str, Any]:
    """A HeadReport (before 2026-11-29) as the fields of the Finding "heads", its table's class columns
    as the classes (`older_head_classes`)."""
    settings = dict(decode(fields["settings"]))
    table = decode(fields["table"])
    chose = settings.pop("discovery_tokens", "random token ids")
    tested = settings.pop("held_out_tokens", chose)
    settings.pop("held_out_seed", None)
    run = HeadSettings(**{name: settings.pop(name) for name in (
        "n_samples", "seed", "seq_len", "natural_text", "causal", "max_candidates")},
        n_random=settings.pop("n_random", HeadSettings.n_random))  # fmt: skip
    probe = {
        name: settings.pop(name) for name in ("induction_lengths", "max_prefix", "has_bos", "skip_gram_probe")
    }
    figures = HeadFigures(
        table=table.drop(columns=class_columns(table)), thresholds=decode(fields["thresholds"]),
        n_layers=fields["n_layers"], n_heads=fields["n_heads"], **probe, checks=settings,
        group_effects=decode(fields["group_effects"]), str_tokens=decode(fields["str_tokens"]),
        patterns=decode(fields["patterns"]),
    )  # fmt: skip
    finding = Finding(
        analysis="heads", model=fields["model_name"], provenance=fields.get("provenance", ""), settings=run,
        chose={TOKEN_AXIS: [chose]}, tested={TOKEN_AXIS: [tested]},
        classes=older_head_classes(table, run.n_samples), extras=figures,
    )  # fmt: skip
    return encode(finding)["fields"]


def _path_patching_drops(name: str, fields: dict[str, Any]) -> dict[str, Any]:
    """IOI's stored path-patching effects (patched - clean) as drops (clean - patched): effects, z and
    medians negated; attention thresholds have no sign."""
    fields = dict(fields)
    if name == "HeadEvidence":
        fields["effect"], fields["z"] = _negated(fields["effect"]), _negated(fields["z"])
        return fields
    grids = fields["effects"]["__items__"]
    fields["effects"] = {"__items__": [[step, {**grid, "__tensor__": _negated(grid["__tensor__"])}]
                                       for step, grid in grids]}  # fmt: skip
    thresholds = []
    for label, figures in fields["thresholds"]["__items__"]:
        items = [[key, _negated(value) if key == "median" else value] for key, value in figures["__items__"]]
        thresholds.append([label, {"__items__": items}])
    fields["thresholds"] = {"__items__": thresholds}
    return fields


# a command's own result type (before 2026-11-29) -> the reader of its fields as its Finding's
OLDER_FINDINGS = {
    "HopResult": _older_hop,
    "PathResult": _older_path,
    "RetrievalResult": _older_retrieval,
    "ICLResult": _older_icl,
    "FunctionVectorResult": _older_fv,
    "HeadReport": _older_heads,
    "IOICircuitResult": _older_ioi,
}


def _read_older(node: Any, patched_minus_clean: bool) -> Any:
    """A stored result as this version writes it (older types and signs converted; IOI's path-patching
    effects negated where `patched_minus_clean`, schemas interp-result-1 and -2)."""
    if isinstance(node, list):
        return [_read_older(item, patched_minus_clean) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _read_older(value, patched_minus_clean) for key, value in node.items()}
    name = node.get("__dataclass__")
    if name == "BeyondRandom" and "verdict" in node["fields"]:  # its CI's verdict, before 2026-11-30
        return {**node, "fields": {k: v for k, v in node["fields"].items() if k != "verdict"}}
    if name in ("StratumEffect", "RetrievalStratum", "Stratum"):
        return _older_stratum(name, node["fields"])
    if name == "ClassValidation" and "difference" in node["fields"]:
        return _older_class_validation(node["fields"])
    if name == "ClassCheck":
        return _older_class(node["fields"], ["attention"])
    if name == "RetrievalClass":  # retrieval's, before 2026-11-29; every retrieval class helps: sign +1
        details = ["induction_overlap", "accuracy", "random_accuracy"]
        return _older_class({"sign": 1, **node["fields"]}, details)
    if name == "Validation":
        return {**node, "fields": _older_ioi_classes(node["fields"])}
    if name == "Comparison":  # a function-vector test, saved before 2026-11-29
        fields = {**node["fields"], "sign": 1}
        fields["random_effects"] = fields.pop("random_values")
        return _older_class(fields, ["unit"])
    if patched_minus_clean and name in ("HeadEvidence", "StepResult", "IOICircuitResult"):
        node = {**node, "fields": _path_patching_drops(name, node["fields"])}
    if name in OLDER_FINDINGS:
        node = {"__dataclass__": "Finding", "fields": OLDER_FINDINGS[name](node["fields"])}
    if node.get("__dataclass__") == "Finding" and node["fields"].get("analysis") == "ioi":
        return _numbered_after_discovery(node)
    return node


def _plain(settings: dict[str, Any]) -> dict[str, Any]:
    """`settings` as JSON reads them back (tuples as lists), to compare a saved run's with a new one's."""
    return json.loads(json.dumps(settings))


def _recorded_run(path: Path) -> tuple[str, dict[str, Any] | None, Any]:
    """(command, settings or None where unrecorded, result) of the file at `path`; ValueError if none."""
    try:
        document = json.loads(path.read_text())
    except ValueError as error:  # not JSON, or not text
        raise ValueError("it is not a result file of interp") from error
    if not isinstance(document, dict) or document.get("schema") not in READ_SCHEMAS:
        raise ValueError("it is not a result file of interp")
    result = load_result(path)
    if "command" in document:
        return document["command"], document["settings"], result
    if isinstance(result, PartialResult):
        return result.command, result.settings, result
    if isinstance(result, Finding):
        return result.command, None, result
    return result_kind(result), None, result


def check_save_file(path: str | Path, command: str, settings: dict[str, Any]) -> PartialResult | None:
    """The partial result at `path` this run may resume, else None. ValueError where --save would
    replace anything else: a non-result, another command's or settings' result, or a complete one."""
    path = Path(path)
    if not path.is_file():
        return None
    afresh = f"delete {path} or pass another --save path to start afresh"
    not_replaced = f"--save does not replace it: {afresh}"
    try:
        command_there, settings_there, found = _recorded_run(path)
    except ValueError as error:
        raise ValueError(f"--save {path} exists and {error}; {not_replaced}.") from error
    state = "partial" if isinstance(found, PartialResult) else "complete"
    if command_there != command:
        raise ValueError(
            f"--save {path} holds a {state} `interp {command_there}` result, not one of `interp {command}`; "
            f"{not_replaced}."
        )
    if settings_there is None:
        raise ValueError(
            f"--save {path} holds a complete `interp {command}` result whose settings it does not record "
            f"(saved by an older interp), so it may be of other settings; {not_replaced}."
        )
    differs = [
        f"{name} {settings_there.get(name)!r} there, {value!r} now"
        + (" (the code of interp or circuits changed since)" if name == "code" else "")
        for name, value in _plain(settings).items()
        if settings_there.get(name) != value
    ]
    if differs and state == "partial":
        raise ValueError(
            f"--save {path} holds a partial run this command cannot resume ({'; '.join(differs)}). Rerun "
            f"with the options it was made with, or {afresh}."
        )
    if differs:
        raise ValueError(
            f"--save {path} holds a complete `interp {command}` result of other settings "
            f"({'; '.join(differs)}); {not_replaced}, or rerun with its settings."
        )
    if state == "complete" and "weights" in settings:  # (before the model loads: its weights may differ)
        raise ValueError(
            f"--save {path} already holds this command's complete result with these options; `interp render "
            f"{path}` shows it. {not_replaced} (or to run it again)."
        )
    return found if state == "partial" else None


def saving(path: str | Path) -> contextlib.AbstractContextManager[None]:
    """Hold `.NAME.lock` beside a --save file from before the model loads to the command's last write: a
    second command saving to the same path meanwhile is refused (ValueError), where both would pass
    `check_save_file` before either has written and the last to write would win (`held_lock`)."""
    path = Path(path)
    lock = path.with_name(f".{path.name}.lock")
    return held_lock(
        lock,
        lambda holder: ValueError(
            f"another interp command ({holder}) is saving to {path}; wait for it to finish or pass another "
            f"--save path (if no such process runs, delete {lock})"
        ),
    )


def resume_stages(
    path: str | Path,
    command: str,
    settings: dict[str, Any],
    stages: list[str],
    notes: Callable[[str, Any], list[str]],
) -> StageResults:
    """The StageResults of `interp COMMAND --save PATH`: each finished stage rewrites `path` as a
    PartialResult; a resumable one there (`check_save_file`) keeps its stages."""
    partial = PartialResult(
        command=command, settings=_plain(settings), stages=list(stages), done={}, notes={}
    )
    found = check_save_file(path, command, settings)
    if found is not None:
        if set(found.done) - set(stages):
            raise ValueError(
                f"--save {path} holds a partial run this command cannot resume (its stages "
                f"{', '.join(sorted(set(found.done) - set(stages)))} are not this run's). Rerun with the "
                f"options it was made with, or delete {path} or pass another --save path to start afresh."
            )
        partial.done, partial.notes = found.done, found.notes

    def keep(stage: str, value: Any) -> None:
        partial.done[stage] = value
        partial.notes[stage] = notes(stage, value)
        save_result(partial, path, command, settings)

    return StageResults(done=dict(partial.done), on_done=keep, resumed_from=str(path))


# a command whose Finding renders to more than KINDS' formats
COMMAND_FORMATS = {"heads": HeadFigures.formats}


def result_formats(result: Any) -> tuple[str, ...]:
    """The formats `result` renders to (a Finding: its extras')."""
    return result.extras.formats if isinstance(result, Finding) else KINDS[result_kind(result)][1]


def write_result_report(result: Any, format: str, out: str | Path | None, console: Console) -> None:
    """Render a stored result in `format`, as the command that made it does."""
    writer, formats = KINDS[result_kind(result)][2], result_formats(result)
    if format not in formats:
        raise ValueError(f"a {result_kind(result)} result renders as {', '.join(formats)}, not {format!r}.")
    writer(result, format, out, console)
