"""The one task of prompt pairs: tokens, answers, a per-prompt metric, named positions, strata, families.

    task = pair_task(model, "agreement.csv")          # or a list of row dicts: pair_task(model, rows)
    discovery, heldout = task.split()                 # whole families held out (circuits.evidence)

Rows (CSV with a header, or JSONL; docs/guide/own-task.md) have `clean`, `corrupted`, `correct`,
`incorrect` (one token each; not read with the probability metric) and optionally `family` (the unit
held out; without it each prompt is its own), `stratum` and `pos:NAME` (text of the clean prompt whose
last token is the position, `text#k` its k-th occurrence; the text covers whole tokens, give or take
the whitespace around it: "to" is never the end of " store"). The edge circuit views the same task
(`circuits.edge_circuits.tasks.pair_edge_task`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from circuits.evidence import FamilySplit, label_strata, split_families
from interp import edges
from interp.interventions.metrics import AnswerMetric, logit_diff_metric, prob_metric
from interp.model import HookedTransformer
from interp.model.tokens import index_tokens, record_padding
from interp.tasks.pairs import (
    POSITION_PREFIX,
    check_families,
    check_pairs,
    occurrences,
    pair_rows,
    position_columns,
    position_spec,
    read_pairs,
)

ALL = "all"  # the one stratum of prompts given none
NO_FAMILY = "pair {}"  # each pair its own family when the file has no family column (from 1, as messages)
CHANGED = "changed"  # the name of the positions where clean and corrupted prompts differ
MAX_CHANGED = 4  # positions named one by one ("changed 1", ...) at most; more: the first and the last


@dataclass(frozen=True, kw_only=True)
class PairTask:
    """Prompt pairs with their answers. clean, corrupted: [n, pos] right-padded to one width;
    end, corrupted_end: [n] each prompt's last real token (where the metric reads); incorrect: None
    with the probability metric; metric_kind: "logit_diff" or "prob" (`interp.tasks.pairs.METRICS`);
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
    answers: tuple[str, str] = ("correct", "incorrect")  # what the correct and incorrect answers are called

    @property
    def metric_name(self) -> str:
        """ "logit_diff(correct - incorrect)", "p(correct)": the metric with the task's answers' names."""
        correct, incorrect = self.answers
        return f"p({correct})" if self.metric_kind == "prob" else f"logit_diff({correct} - {incorrect})"

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
                "counterfactual ablation patches heads and edges position by position, so make each "
                "pair's prompts the same length, or ablate with the mean over the corrupted prompts "
                "(--ablation mean)"
            )
        same = (self.clean == self.corrupted).all(-1).nonzero()[:, 0].tolist()
        if same:
            raise ValueError(
                f"{self.name}: {len(same)} pairs have the same clean and corrupted prompt (pair "
                f"{same[0] + 1}, family {self.families[same[0]]!r}); counterfactual ablation changes nothing "
                "on them, so every effect there would be 0: give each pair a corrupted prompt that differs, "
                "drop those pairs, or ablate with the mean over the corrupted prompts (--ablation mean)"
            )

    def check_mean_reference(self, rows: Tensor, side: str) -> None:
        """Refuse mean ablation over the corrupted prompts of `rows` (one side of the split) where a clean
        prompt of them is longer than every one: its last positions would have no mean (refused only
        after the edge scores and the mask's training otherwise)."""
        longest = int(self.corrupted_end[rows].max())
        over = [i for i in rows.tolist() if int(self.end[i]) > longest]
        if over:
            i = over[0]
            raise ValueError(
                f"{self.name}: pair {i + 1}'s clean prompt is {int(self.end[i]) + 1} tokens long, longer "
                f"than every {side} corrupted prompt (at most {longest + 1}), so mean ablation over them "
                "has no mean at its last positions: give corrupted prompts at least as long, or use "
                "--ablation zero"
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
            self, clean=index_tokens(self.clean, (rows, slice(width))),
            corrupted=self.corrupted[rows, :width],
            correct=self.correct[rows], incorrect=None if self.incorrect is None else self.incorrect[rows],
            end=self.end[rows], corrupted_end=self.corrupted_end[rows],
            positions={name: pos[rows] for name, pos in self.positions.items()},
            families=tuple(self.families[i] for i in rows.tolist()),
            strata=tuple(self.strata[i] for i in rows.tolist()),
        )  # fmt: skip

    @property
    def family_labels(self) -> list[str] | None:
        """Each prompt's family [n], or None where each prompt is its own (`has_families` False)."""
        return list(self.families) if self.has_families else None

    def stratum_masks(self) -> list[tuple[str, str, Tensor]]:
        """The prompts' strata and families, where there are two or more (without families: strata only)."""
        return stratum_masks(self.strata, self.family_labels)

    def family_split(self, heldout: Sequence[str] | None = None, seed: int = 0) -> FamilySplit:
        """Discovery and held-out families: `heldout`, else the task's own `heldout_families`, else
        half of them drawn with `seed`."""
        if not self.has_families and len(self) < 2:
            raise ValueError(
                f"{self.name} has {len(self)} prompt pair; what is found is tested on prompts that did not "
                "find it, so give two or more"
            )
        heldout = heldout if heldout is not None else self.heldout_families
        if self.has_families and heldout is None:
            check_families(self.families, self.name)  # not the advice to add a family column
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


def with_right_padding(tokens: Int[Tensor, "n pos"], ends: Int[Tensor, " n"]) -> Int[Tensor, "n pos"]:
    """`tokens` with the mask of their right padding after `ends` recorded (`record_padding`), so that every
    run reads the exact padding; unchanged where no prompt is padded."""
    real = right_padding_mask(ends, tokens.shape[1])
    return tokens if real is None else record_padding(tokens, real)


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
    """The index of the last token of the k-th occurrence of spec's text (`text#k`) in `text` that
    covers whole tokens: it starts where a token starts and ends where one ends (whitespace at either
    end, in the text or in those tokens, aside). An occurrence inside a token ("to" in " store") is not
    counted; fewer than k occurrences are refused, naming how many there are and where."""
    needle, k = position_spec(spec, where)
    spans = _TokenSpans(model, tokens)
    decoded, whole, inside = spans.text, [], []
    for start in occurrences(decoded, needle):
        first = start + len(needle) - len(needle.lstrip())  # the occurrence's first and last non-space
        end = start + len(needle.rstrip())
        a, b = spans.token_at(first), spans.token_at(end - 1)
        token_start, token_end = spans.start(a), spans.start(b + 1)
        if not decoded[token_start:first].strip() and not decoded[end:token_end].strip():
            whole.append(b)
            if len(whole) == k:
                return b
            continue
        inside.append(decoded[token_start:token_end])
    shown = "" if decoded == text else f" (the tokenizer reads it as {decoded!r})"
    within = f" and {len(inside)} within longer tokens ({', '.join(map(repr, inside))})" if inside else ""
    raise ValueError(
        f"{where} is {spec!r}, but {needle!r} does not occur {k} time(s) as whole tokens in the clean "
        f"prompt {text!r}"
        f"{shown}: it occurs {len(whole)} time(s) as whole tokens{within}; a position's text covers whole "
        "tokens (words), not part of one"
    )


class _TokenSpans:
    """Where each token of `tokens` starts in their decoded text (special tokens, such as BOS, cover no
    text): the length of the decoded text of the tokens before it that the whole text begins with (a
    character split over tokens counts at its last one). Found by bisection, decoding few prefixes."""

    def __init__(self, model: HookedTransformer, tokens: list[int]) -> None:
        self.tokenizer, self.tokens = model.tokenizer, tokens
        self.text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        self.starts: dict[int, int] = {0: 0, len(tokens): len(self.text)}

    def start(self, index: int) -> int:
        """Where token `index` starts (len(tokens): where the text ends)."""
        if index not in self.starts:
            prefix = self.tokenizer.decode(self.tokens[:index], skip_special_tokens=True)
            self.starts[index] = len(os.path.commonprefix([prefix, self.text]))
        return self.starts[index]

    def token_at(self, char: int) -> int:
        """The token whose text holds character `char`: the last token starting at or before it."""
        low, high = 0, len(self.tokens) - 1
        while low < high:
            middle = (low + high + 1) // 2
            if self.start(middle) <= char:
                low = middle
            else:
                high = middle - 1
        return low


def pair_task(
    model: HookedTransformer,
    source: str | Path | Sequence[Mapping[str, str]],
    name: str | None = None,
    metric: str = "logit_diff",
) -> PairTask:
    """A `PairTask` from a prompt-pair file (see the module docstring) or its rows, with `metric`
    ("logit_diff" or "prob": `interp.tasks.pairs.METRICS`); every prompt whole, never cut to the
    context (its end is where the metric reads)."""
    name = name or (Path(source).name if isinstance(source, str | Path) else "pairs")
    rows = read_pairs(source) if isinstance(source, str | Path) else pair_rows(source, name)
    if not rows:
        raise ValueError(f"{name} has no prompt pairs.")
    check_pairs(rows, name, metric)
    if model.tokenizer is None:
        raise ValueError(f"{model.cfg.model_name} has no tokenizer, so it cannot read text prompt pairs.")
    position_names = [column[len(POSITION_PREFIX) :] for column in position_columns(rows)]  # checked

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
    end = torch.tensor([len(ids) - 1 for ids in clean_ids])
    clean = with_right_padding(clean, end)
    positions = {
        p: torch.tensor([
            _position(model, ids, row["clean"], row[POSITION_PREFIX + p], f"{name}: pair {n}'s pos:{p}")
            for n, (row, ids) in enumerate(zip(rows, clean_ids, strict=True), 1)
        ])
        for p in position_names
    }  # fmt: skip
    has_families = any("family" in row for row in rows)  # `check_pairs`: then every pair has one

    def answers(key: str) -> Tensor:
        ids = []
        for i, row in enumerate(rows):
            try:
                ids.append(model.to_single_token(row[key]))
            except ValueError as error:
                raise ValueError(f"{name}: pair {i + 1}'s {key} answer: {error}") from error
        return torch.tensor(ids)

    correct, incorrect = answers("correct"), None if metric == "prob" else answers("incorrect")
    if incorrect is not None and bool((correct == incorrect).any()):
        i = int((correct == incorrect).nonzero()[0, 0])
        raise ValueError(
            f"{name}: pair {i + 1}'s correct {rows[i]['correct']!r} and incorrect {rows[i]['incorrect']!r} "
            f"answers are the same token of {model.cfg.model_name} ({int(correct[i])}), so the logit "
            "difference is 0 on every prompt: give each pair an incorrect answer that is another token"
        )
    return PairTask(
        name=name, clean=clean, corrupted=corrupted, correct=correct, incorrect=incorrect,
        end=end,
        corrupted_end=torch.tensor([len(ids) - 1 for ids in corrupted_ids]), positions=positions,
        families=tuple(
            str(row["family"]) if has_families else NO_FAMILY.format(i + 1) for i, row in enumerate(rows)
        ),
        strata=tuple(row.get("stratum") or ALL for row in rows), has_families=has_families,
        metric_kind=metric,
    )  # fmt: skip
