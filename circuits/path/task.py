"""The one task of prompt pairs: tokens, answers, a per-prompt metric, named positions, strata, families.

    task = pair_task(model, "agreement.csv")          # or a list of row dicts: pair_task(model, rows)
    discovery, heldout = task.split()                 # whole families held out (circuits.evidence)

Rows (CSV with a header, or JSONL; docs/guide/own-task.md) have `clean`, `corrupted`, `correct`,
`incorrect` (one token each; not read with the probability metric) and optionally `family` (the unit
held out; without it each prompt is its own), `stratum` and `pos:NAME` (text of the clean prompt whose
last token is the position, `text#k` its k-th occurrence). The edge circuit views the same task
(`circuits.edge_circuits.tasks.pair_edge_task`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from circuits.evidence import FamilySplit, label_strata, split_families
from circuits.pairs_file import check_pairs, read_pairs
from interp import edges
from interp.interventions.metrics import AnswerMetric, logit_diff_metric, prob_metric
from interp.model import HookedTransformer

POSITION_PREFIX = "pos:"
NO_FAMILY = "prompt {}"  # each prompt its own family when the file has no family column
CHANGED = "changed"  # the name of the positions where clean and corrupted prompts differ
MAX_CHANGED = 4  # positions named one by one ("changed 1", ...) at most; more: the first and the last


@dataclass(frozen=True, kw_only=True)
class PairTask:
    """Prompt pairs with their answers. clean, corrupted: [n, pos] right-padded to one width;
    end, corrupted_end: [n] each prompt's last real token (where the metric reads); incorrect: None
    with the probability metric; metric_kind: "logit_diff" or "prob" (`circuits.pairs_file.METRICS`);
    positions: NAME -> [n] token positions in the clean prompts; families, strata: one label per prompt."""

    name: str
    clean: Int[Tensor, "n pos"]
    corrupted: Int[Tensor, "n pos"]
    correct: Int[Tensor, " n"]
    incorrect: Int[Tensor, " n"] | None
    end: Int[Tensor, " n"]
    corrupted_end: Int[Tensor, " n"]
    positions: Mapping[str, Tensor]
    families: tuple[str, ...]
    strata: tuple[str, ...]
    heldout_families: tuple[str, ...] | None = None  # the task's own held-out families (None: drawn)
    has_families: bool = True  # False: each prompt is its own family (`NO_FAMILY`), held out alone
    metric_kind: str = "logit_diff"

    def __len__(self) -> int:
        return self.clean.shape[0]

    @property
    def corrupted_mask(self) -> Int[Tensor, "n pos"] | None:
        """1 at the corrupted prompts' real tokens, 0 at padding (None: none is padded)."""
        return right_padding_mask(self.corrupted_end, self.corrupted.shape[1])

    def changed_positions(self) -> Bool[Tensor, "n pos"]:
        """Where each clean prompt differs from its corrupted one: a different token, or a position past
        the corrupted prompt's end."""
        position = torch.arange(self.clean.shape[1])
        past_end = position[None] > self.corrupted_end[:, None]
        return ((self.clean != self.corrupted) | past_end) & (position[None] <= self.end[:, None])

    def with_changed_positions(self) -> PairTask:
        """The task with the positions where clean and corrupted prompts differ named: "changed" where
        each pair differs at one, "changed 1" .. "changed k" where each differs at the same k <=
        `MAX_CHANGED` (in order), else "first changed" and "last changed"; unchanged where a pair does
        not differ within its clean prompt."""
        changed = self.changed_positions()
        counts = changed.sum(1)
        if len(self) == 0 or bool((counts == 0).any()):
            return self
        rows = [row.nonzero()[:, 0] for row in changed]
        k = int(counts[0])
        if bool((counts == k).all()) and k <= MAX_CHANGED:
            names = [CHANGED] if k == 1 else [f"{CHANGED} {i + 1}" for i in range(k)]
            positions = {name: torch.stack([row[i] for row in rows]) for i, name in enumerate(names)}
        else:
            positions = {
                f"first {CHANGED}": torch.stack([row[0] for row in rows]),
                f"last {CHANGED}": torch.stack([row[-1] for row in rows]),
            }
        return replace(self, positions=positions)

    def check_ablation(self, ablation: str) -> None:
        """Refuse a counterfactual ablation of pairs whose prompts differ in length (it writes each head's
        output position by position, so a longer clean prompt would read the corrupted one's padding)
        or are the same (every effect on them would be 0)."""
        if ablation != "counterfactual":
            return
        differ = (self.end != self.corrupted_end).nonzero()[:, 0].tolist()
        if differ:
            i = differ[0]
            raise ValueError(
                f"{self.name}: {len(differ)} pairs have clean and corrupted prompts of different lengths "
                f"(pair {i + 1}: {int(self.end[i]) + 1} and {int(self.corrupted_end[i]) + 1} tokens); "
                "counterfactual ablation patches heads position by position, so make each pair's prompts "
                "the same length, or ablate with the mean over the corrupted prompts (--ablation mean)"
            )
        same = (self.clean == self.corrupted).all(-1).nonzero()[:, 0].tolist()
        if same:
            raise ValueError(
                f"{self.name}: {len(same)} pairs have the same clean and corrupted prompt (pair "
                f"{same[0] + 1}, family {self.families[same[0]]!r}); counterfactual ablation changes nothing "
                "on them, so every effect there would be 0: give each pair a corrupted prompt that differs, "
                "drop those pairs, or ablate with the mean over the corrupted prompts (--ablation mean)"
            )

    @property
    def metric(self) -> AnswerMetric:
        """logit(correct) - logit(incorrect), or p(correct), at each clean prompt's last token [n]."""
        return self._metric_at(self.end)

    @property
    def corrupted_metric(self) -> AnswerMetric:
        """The metric at each corrupted prompt's last token [n]."""
        return self._metric_at(self.corrupted_end)

    def _metric_at(self, pos: Int[Tensor, " n"]) -> AnswerMetric:
        if self.metric_kind == "prob":
            return prob_metric(self.correct, pos)
        return logit_diff_metric(self.correct, self.incorrect, pos)

    def subset(self, rows: Sequence[int] | Tensor) -> PairTask:
        rows = torch.as_tensor(rows, dtype=torch.long)
        width = int(torch.maximum(self.end[rows], self.corrupted_end[rows]).max()) + 1
        return replace(
            self, clean=self.clean[rows, :width], corrupted=self.corrupted[rows, :width],
            correct=self.correct[rows], incorrect=None if self.incorrect is None else self.incorrect[rows],
            end=self.end[rows], corrupted_end=self.corrupted_end[rows],
            positions={name: pos[rows] for name, pos in self.positions.items()},
            families=tuple(self.families[i] for i in rows.tolist()),
            strata=tuple(self.strata[i] for i in rows.tolist()),
        )  # fmt: skip

    def stratum_masks(self) -> list[tuple[str, str, Tensor]]:
        """The prompts' strata and families, where there are two or more (without families: strata only)."""
        return stratum_masks(self.strata, self.families if self.has_families else None)

    def family_split(self, heldout: Sequence[str] | None = None, seed: int = 0) -> FamilySplit:
        """Discovery and held-out families: `heldout`, else the task's own `heldout_families`, else
        half of them drawn with `seed`."""
        if not self.has_families and len(self) < 2:
            raise ValueError(
                f"{self.name} has {len(self)} prompt pair; what is found is tested on prompts that did not "
                "find it, so give two or more"
            )
        heldout = heldout if heldout is not None else self.heldout_families
        return split_families(self.families, heldout=heldout, seed=seed)

    def split_rows(self, heldout: Sequence[str] | None = None, seed: int = 0) -> tuple[Tensor, Tensor]:
        """(discovery, held-out) prompts' rows [n_side], ascending: whole families on each side (see
        `family_split`)."""
        return family_rows(self.families, self.family_split(heldout, seed))

    def split(self, heldout: Sequence[str] | None = None, seed: int = 0) -> tuple[PairTask, PairTask]:
        """(discovery, held-out) prompts: whole families on each side (see `family_split`)."""
        discovery, heldout_rows = self.split_rows(heldout, seed)
        return self.subset(discovery), self.subset(heldout_rows)


def family_rows(families: Sequence[str], split: FamilySplit) -> tuple[Tensor, Tensor]:
    """(discovery, held-out) rows [n_side], ascending, of prompts whose families are `families`."""
    held = torch.tensor([family in split.heldout for family in families])
    return (~held).nonzero()[:, 0], held.nonzero()[:, 0]


def right_padding_mask(ends: Int[Tensor, " n"], width: int) -> Int[Tensor, "n pos"] | None:
    """1 at right-padded prompts' tokens up to `ends` (each one's last real token), 0 at padding; None
    where no prompt is padded."""
    return None if bool((ends + 1 == width).all()) else (torch.arange(width) <= ends[:, None]).long()


def stratum_masks(
    strata: Sequence[str] | None, families: Sequence[str] | None
) -> list[tuple[str, str, Tensor]]:
    """(kind, label, members [prompt] bool) of each stratum and family (`circuits.evidence.label_strata`),
    for the kinds with two or more distinct labels (None: no labels)."""
    return [
        stratum
        for kind, labels in (("stratum", strata), ("family", families))
        if labels is not None and len(set(labels)) > 1
        for stratum in label_strata(kind, labels)
    ]


def _position(model: HookedTransformer, tokens: list[int], text: str, spec: str, where: str) -> int:
    """The index of the last token of the k-th occurrence of spec's text (`text#k`) in `text`."""
    needle, _, k = spec.rpartition("#") if "#" in spec else (spec, "", "1")
    if not needle or not k.isdigit() or int(k) < 1:
        raise ValueError(
            f"{where}: {spec!r} is not a position; write the text, or text#k for its k-th occurrence"
        )
    start = -1
    for _ in range(int(k)):
        start = text.find(needle, start + 1)
        if start < 0:
            raise ValueError(f"{where}: {needle!r} does not occur {k} time(s) in the clean prompt {text!r}")
    last_char = start + len(needle)  # characters of the prompt up to the occurrence's end
    for index in range(len(tokens)):
        if len(model.tokenizer.decode(tokens[: index + 1], skip_special_tokens=True)) >= last_char:
            return index
    raise ValueError(f"{where}: {needle!r} could not be placed on the clean prompt's tokens")


def pair_task(
    model: HookedTransformer,
    source: str | Path | Sequence[Mapping[str, str]],
    name: str | None = None,
    metric: str = "logit_diff",
) -> PairTask:
    """A `PairTask` from a prompt-pair file (see the module docstring) or its rows, with `metric`
    ("logit_diff" or "prob": `circuits.pairs_file.METRICS`); every prompt whole, never cut to the
    context (its end is where the metric reads)."""
    rows = read_pairs(source) if isinstance(source, str | Path) else [dict(row) for row in source]
    name = name or (Path(source).name if isinstance(source, str | Path) else "pairs")
    if not rows:
        raise ValueError(f"{name} has no prompt pairs.")
    check_pairs(rows, name, metric)
    if model.tokenizer is None:
        raise ValueError(f"{model.cfg.model_name} has no tokenizer, so it cannot read text prompt pairs.")
    position_names = sorted(
        {key[len(POSITION_PREFIX) :] for row in rows for key in row if key.startswith(POSITION_PREFIX)}
    )
    for number, row in enumerate(rows, 1):
        missing = [POSITION_PREFIX + p for p in position_names if not row.get(POSITION_PREFIX + p)]
        if missing:
            raise ValueError(
                f"{name}: pair {number} lacks {', '.join(missing)}; every pair needs each column"
            )

    def tokens_of(text: str, number: int, which: str) -> list[int]:
        tokens = model.to_tokens(text, truncate=False)[0].tolist()
        if len(tokens) > model.cfg.n_ctx:
            raise ValueError(
                f"{name}: pair {number}'s {which} prompt is {len(tokens)} tokens long, longer than "
                f"{model.cfg.model_name}'s context of {model.cfg.n_ctx} tokens; shorten it to at most "
                f"{model.cfg.n_ctx} tokens"
            )
        return tokens

    clean_ids = [tokens_of(row["clean"], number, "clean") for number, row in enumerate(rows, 1)]
    corrupted_ids = [tokens_of(row["corrupted"], number, "corrupted") for number, row in enumerate(rows, 1)]
    pad = model.tokenizer.pad_token_id if model.tokenizer.pad_token_id is not None else 0
    clean, corrupted = edges.pad_pair(clean_ids, corrupted_ids, pad)
    positions = {
        p: torch.tensor([
            _position(model, ids, row["clean"], row[POSITION_PREFIX + p], f"{name}: pair {n} pos:{p}")
            for n, (row, ids) in enumerate(zip(rows, clean_ids, strict=True), 1)
        ])
        for p in position_names
    }  # fmt: skip
    has_families = any("family" in row for row in rows)  # `check_pairs`: then every pair has one

    def answers(key: str) -> Tensor:
        return torch.tensor([model.to_single_token(row[key]) for row in rows])

    return PairTask(
        name=name, clean=clean, corrupted=corrupted, correct=answers("correct"),
        incorrect=None if metric == "prob" else answers("incorrect"),
        end=torch.tensor([len(ids) - 1 for ids in clean_ids]),
        corrupted_end=torch.tensor([len(ids) - 1 for ids in corrupted_ids]), positions=positions,
        families=tuple(
            str(row["family"]) if has_families else NO_FAMILY.format(i) for i, row in enumerate(rows)
        ),
        strata=tuple(row.get("stratum") or "all" for row in rows), has_families=has_families,
        metric_kind=metric,
    )  # fmt: skip
