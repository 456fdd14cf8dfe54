"""Edge-circuit tasks: prompt pairs and a per-prompt metric, each the view (`pair_edge_task`) of the one
`circuits.path.task.PairTask`: IOI's (`circuits.ioi.task.ioi_pair_task`), repeated sequences' (induction)
or a prompt-pair file's, read once."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch
from jaxtyping import Int
from torch import Tensor

from circuits.ioi.task import ioi_pair_task
from circuits.path.task import ALL, NO_FAMILY, PairTask, pair_task, stratum_masks
from interp import edges
from interp.model import HookedTransformer
from interp.model.tokens import index_tokens
from interp.types import Metric

TASKS = ("ioi", "induction")


@dataclass(kw_only=True)
class EdgeTask:
    """Prompt pairs and a per-prompt metric. clean, corrupted: [batch, pos] right-padded to one width."""

    name: str
    clean: Int[Tensor, "batch pos"]
    corrupted: Int[Tensor, "batch pos"]
    metric: Metric
    metric_name: str
    corrupted_metric: Metric | None = None  # the metric at the corrupted prompts' positions
    corrupted_mask: Int[Tensor, "batch pos"] | None = None  # 1 at real tokens, 0 at padding (mean ablation)
    families: list[str] | None = None  # each prompt's family (template, relation, ...); None: none given
    strata: list[str] | None = None  # each prompt's stratum within families (IOI: its name order); None: none

    def stratum_masks(self) -> list[tuple[str, str, Tensor]]:
        """(kind, name, members [prompt] bool) of each stratum and family, where there are two or more."""
        return stratum_masks(self.strata, self.families)

    @property
    def n_prompts(self) -> int:
        return self.clean.shape[0]

    @property
    def pair(self) -> tuple[Tensor, Tensor, Metric]:
        """(clean, corrupted, metric): the arguments every `interp.edges` run starts with."""
        return self.clean, self.corrupted, self.metric

    def ablation(self, kind: edges.AblationKind) -> edges.Ablation:
        """`kind` of ablation on these prompts: a mean over the corrupted prompts real at each position."""
        return edges.Ablation(kind, mask=self.corrupted_mask)

    def subset(self, rows: Int[Tensor, " n"]) -> EdgeTask:
        """The prompts `rows`, as a task of their own (at the task's width; the clean ids keep their
        recorded padding, so runs read which tokens are real from it, not from pad ids)."""

        def pick(values: list[str] | None) -> list[str] | None:
            return None if values is None else [values[i] for i in rows.tolist()]

        at_corrupted = self.corrupted_metric
        return replace(
            self, clean=index_tokens(self.clean, rows), corrupted=self.corrupted[rows],
            metric=edges.subset_metric(self.metric, rows), families=pick(self.families),
            strata=pick(self.strata),
            corrupted_metric=None if at_corrupted is None else edges.subset_metric(at_corrupted, rows),
            corrupted_mask=None if self.corrupted_mask is None else self.corrupted_mask[rows],
        )  # fmt: skip


def ioi_task(
    model: HookedTransformer, n_prompts: int = 64, seed: int = 0, split: str = "discovery"
) -> EdgeTask:
    """The discovery or held-out prompts of IOI's one pair task (`circuits.ioi.task.ioi_pair_task`:
    IOI prompts against ABC prompts; logit(IO) - logit(S) at END; a prompt's family its template)."""
    task = ioi_pair_task(model, n_prompts, seed)
    discovery, heldout = task.split_rows()
    return pair_edge_task(task.subset(heldout if split == "heldout" else discovery))


def induction_task(
    model: HookedTransformer, n_prompts: int = 64, seq_len: int = 10, seed: int = 0
) -> EdgeTask:
    """[BOS] A A[:-1] -> A[-1] against [BOS] B A[:-1]; metric logit(A[-1]) - logit(B[-1]) at the last
    position. A and B are drawn together as 2 x seq_len distinct tokens, none the BOS or a special
    token (`special_token_ids`): A[-2] occurs once in A, so A[-1] is the one token that induction
    predicts, and B shares no token with A, so the corrupted prompt holds no pair of A's to copy."""
    generator = torch.Generator().manual_seed(seed)
    bos = model.cfg.bos_token_id
    if bos is None and model.tokenizer is not None:
        bos = model.tokenizer.bos_token_id
    high = model.cfg.d_vocab if model.tokenizer is None else min(model.cfg.d_vocab, len(model.tokenizer))
    ids = torch.arange(high)
    ids = ids[~torch.isin(ids, torch.tensor(model.special_token_ids(), dtype=torch.long))]
    needed = 2 * seq_len + int(model.cfg.default_prepend_bos)
    bos_and = "a BOS and " * model.cfg.default_prepend_bos
    if needed > model.cfg.n_ctx:
        raise ValueError(
            f"the induction task's prompts ({bos_and}a sequence of {seq_len} tokens twice: {needed} "
            f"tokens) do not fit {model.cfg.model_name}'s context of "
            f"{model.cfg.n_ctx}; use a model with a longer context"
        )
    if 2 * seq_len > len(ids):
        raise ValueError(
            f"seq_len={seq_len} needs {2 * seq_len} distinct tokens for A and B, but the vocabulary has "
            f"{len(ids)} that are not special: choose seq_len <= {len(ids) // 2}."
        )
    drawn = ids[torch.rand(n_prompts, len(ids), generator=generator).topk(2 * seq_len, dim=1).indices]
    first, other = drawn[:, :seq_len], drawn[:, seq_len:]
    return repeated_sequence_pairs("induction", first, other, bos if model.cfg.default_prepend_bos else None)


def repeated_sequence_pairs(
    name: str, first: Int[Tensor, "n seq"], other: Int[Tensor, "n seq"], bos: int | None = None
) -> EdgeTask:
    """[bos] A A[:-1] -> A[-1] against [bos] B A[:-1] (A: `first`, B: `other`), each pair its own family;
    metric logit(A[-1]) - logit(B[-1]) at the last position (the view of that `PairTask`)."""
    clean, corrupted = torch.cat([first, first[:, :-1]], 1), torch.cat([other, first[:, :-1]], 1)
    if bos is not None:
        column = torch.full((first.shape[0], 1), bos)
        clean, corrupted = torch.cat([column, clean], 1), torch.cat([column, corrupted], 1)
    n = first.shape[0]
    last = torch.full((n,), clean.shape[1] - 1)  # stated: a last pad-id token is real
    pairs = PairTask(
        name=name, clean=clean, corrupted=corrupted, correct=first[:, -1], incorrect=other[:, -1], end=last,
        corrupted_end=last, positions={}, families=tuple(NO_FAMILY.format(i + 1) for i in range(n)),
        strata=(ALL,) * n, has_families=False, answers=("A[-1]", "B[-1]"),
    )  # fmt: skip
    return pair_edge_task(pairs)


def pair_edge_task(task: PairTask) -> EdgeTask:
    """The edge circuit's view of a `PairTask` (nothing read or tokenised again): its metric at each
    clean and corrupted prompt's last token; families None where each prompt is its own."""
    return EdgeTask(
        name=task.name, clean=task.clean, corrupted=task.corrupted, metric=task.metric,
        metric_name=task.metric_name,
        corrupted_metric=task.corrupted_metric,
        corrupted_mask=task.corrupted_mask,
        families=task.family_labels, strata=list(task.strata),
    )  # fmt: skip


def file_task(model: HookedTransformer, path: str | Path, metric: str = "logit_diff") -> EdgeTask:
    """Every prompt pair of a file (`circuits.path.task.pair_task`'s format) with `metric`."""
    return pair_edge_task(pair_task(model, path, metric=metric))


def check_task_name(task: str) -> None:
    """Refuse a task that is neither one of TASKS nor a file's path (a name with a suffix)."""
    if task not in TASKS and not Path(task).suffix:
        raise ValueError(
            f"Unknown task {task!r}: choose ioi, induction, or a .csv/.jsonl file of prompt pairs."
        )


def edge_task(
    model: HookedTransformer, task: str, n_prompts: int = 64, seed: int = 0, metric: str = "logit_diff"
) -> EdgeTask:
    """ "ioi", "induction", or the path of a prompt-pair file."""
    check_task_name(task)
    if task == "ioi":
        return ioi_task(model, n_prompts, seed)
    if task == "induction":
        return induction_task(model, n_prompts, seed=seed)
    return file_task(model, task, metric)


def heldout_edge_task(
    model: HookedTransformer, task: str, n_prompts: int = 64, seed: int = 0
) -> EdgeTask | None:
    """The prompts that test a circuit of `edge_task(model, task, n_prompts, seed)`: IOI's held-out
    split, fresh induction sequences; None for a file (`find_edge_circuit` splits it)."""
    if task == "ioi":
        return ioi_task(model, n_prompts, seed, split="heldout")
    if task == "induction":
        return induction_task(model, n_prompts, seed=seed + 1)
    return None
