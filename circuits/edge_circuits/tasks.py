"""Edge-circuit tasks: prompt pairs and a per-prompt metric (IOI, induction, or the user's CSV/JSONL
file of pairs; see `circuits.edge_circuits.find` for the file format and the JSON schema)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from jaxtyping import Int
from torch import Tensor

from circuits.pairs_file import check_pairs, read_pairs
from interp import edges
from interp.model import HookedTransformer
from interp.tasks.ioi import ioi_dataset_for
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
        """(kind, name, members [prompt] bool) of each stratum and family with two or more of them."""
        kinds = [("stratum", self.strata), ("family", self.families)]
        return [
            (kind, name, torch.tensor([label == name for label in labels]))
            for kind, labels in kinds
            if labels is not None and len(set(labels)) > 1
            for name in dict.fromkeys(labels)
        ]

    @property
    def n_prompts(self) -> int:
        return self.clean.shape[0]


def ioi_task(
    model: HookedTransformer, n_prompts: int = 64, seed: int = 0, split: str = "discovery"
) -> EdgeTask:
    """IOI prompts of `interp.tasks.ioi`'s discovery or held-out split (templates, names, places and
    objects) against the ABC distribution (three other names); logit(IO) - logit(S) at END. The
    family of a prompt is its template ("template 3"; "held-out template 3")."""
    clean, abc, _ = ioi_dataset_for(model, n_prompts, seed, split)
    metric = edges.logit_diff_metric(clean.io_token, clean.s_token, clean.positions["END"])
    mask = padding_mask(abc.positions["END"] + 1, abc.tokens.shape[1])
    prefix = "template" if split == "discovery" else "held-out template"
    return EdgeTask(
        name="ioi", clean=clean.tokens, corrupted=abc.tokens, metric=metric,
        metric_name="logit_diff(IO - S)", corrupted_mask=mask,
        families=[f"{prefix} {int(template)}" for template in clean.template], strata=list(clean.order),
    )  # fmt: skip


def padding_mask(lengths: Int[Tensor, " batch"], width: int) -> Int[Tensor, "batch pos"] | None:
    """The mask of right-padded prompts of these lengths (1 at real tokens, 0 at padding); None where
    no prompt is padded."""
    return None if bool((lengths == width).all()) else (torch.arange(width) < lengths[:, None]).long()


def induction_task(
    model: HookedTransformer, n_prompts: int = 64, seq_len: int = 10, seed: int = 0
) -> EdgeTask:
    """[BOS] A A[:-1] -> A[-1] against [BOS] B A[:-1] (B random, B[-1] != A[-1]): the model must find
    A[-2] earlier and copy what followed it. Metric: logit(A[-1]) - logit(B[-1]) at the last position."""
    generator = torch.Generator().manual_seed(seed)
    bos = model.cfg.bos_token_id
    if bos is None and model.tokenizer is not None:
        bos = model.tokenizer.bos_token_id
    low = 1 if bos == 0 else 0
    high = model.cfg.d_vocab if model.tokenizer is None else min(model.cfg.d_vocab, len(model.tokenizer))
    if 2 * seq_len + int(model.cfg.default_prepend_bos) > model.cfg.n_ctx:
        raise ValueError(
            f"seq_len={seq_len} does not fit {model.cfg.model_name}'s context of {model.cfg.n_ctx}."
        )
    first = torch.randint(low, high, (n_prompts, seq_len), generator=generator)
    other = torch.randint(low, high, (n_prompts, seq_len), generator=generator)
    same = other[:, -1] == first[:, -1]
    other[same, -1] = (first[same, -1] + 1 - low) % (high - low) + low
    clean = torch.cat([first, first[:, :-1]], 1)
    corrupted = torch.cat([other, first[:, :-1]], 1)
    if model.cfg.default_prepend_bos and bos is not None:
        column = torch.full((n_prompts, 1), bos)
        clean, corrupted = torch.cat([column, clean], 1), torch.cat([column, corrupted], 1)
    last = torch.full((n_prompts,), clean.shape[1] - 1)  # stated: a last token that is the pad id is real
    metric = edges.logit_diff_metric(first[:, -1], other[:, -1], last)
    return EdgeTask(
        name="induction", clean=clean, corrupted=corrupted, metric=metric,
        metric_name="logit_diff(A[-1] - B[-1])",
    )  # fmt: skip


def file_task(model: HookedTransformer, path: str | Path, metric: str = "logit_diff") -> EdgeTask:
    """The user's prompt pairs (see the module docstring) with a logit-difference or probability metric."""
    rows = read_pairs(path)
    check_pairs(rows, path, metric)
    if model.tokenizer is None:
        raise ValueError(f"{model.cfg.model_name} has no tokenizer, so it cannot read text prompt pairs.")

    def ids(text: str, number: int, which: str) -> list[int]:
        tokens = model.to_tokens(text, truncate=False)[0].tolist()
        if len(tokens) > model.cfg.n_ctx:  # never cut a prompt: its end is where the metric reads
            raise ValueError(
                f"{path}: pair {number}'s {which} prompt is {len(tokens)} tokens long, longer than "
                f"{model.cfg.model_name}'s context of {model.cfg.n_ctx} tokens; shorten it to at most "
                f"{model.cfg.n_ctx} tokens"
            )
        return tokens

    clean_ids = [ids(row["clean"], number, "clean") for number, row in enumerate(rows, 1)]
    corrupted_ids = [ids(row["corrupted"], number, "corrupted") for number, row in enumerate(rows, 1)]
    pad = model.tokenizer.pad_token_id if model.tokenizer.pad_token_id is not None else 0
    clean, corrupted = edges.pad_pair(clean_ids, corrupted_ids, pad)
    clean_end = torch.tensor([len(row) - 1 for row in clean_ids])
    corrupted_end = torch.tensor([len(row) - 1 for row in corrupted_ids])
    correct = torch.tensor([model.to_single_token(row["correct"]) for row in rows])
    if metric == "prob":
        name = "p(correct)"
        made = edges.prob_metric(correct, clean_end), edges.prob_metric(correct, corrupted_end)
    else:
        incorrect = torch.tensor([model.to_single_token(row["incorrect"]) for row in rows])
        name = "logit_diff(correct - incorrect)"
        made = (
            edges.logit_diff_metric(correct, incorrect, clean_end),
            edges.logit_diff_metric(correct, incorrect, corrupted_end),
        )
    mask = padding_mask(corrupted_end + 1, corrupted.shape[1])
    families = None
    if any("family" in row for row in rows):  # the optional family column (`check_pairs`: in every pair)
        families = [str(row["family"]) for row in rows]
    return EdgeTask(
        name=Path(path).name, clean=clean, corrupted=corrupted, metric=made[0], metric_name=name,
        corrupted_metric=made[1], corrupted_mask=mask, families=families,
    )  # fmt: skip


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
    """The prompts that test a circuit `edge_task(model, task, n_prompts, seed)` finds: IOI's held-out
    split (other templates, names, places, objects), fresh random induction sequences; None for a
    prompt-pair file (`find_edge_circuit` holds out its families, or else some of its prompts)."""
    if task == "ioi":
        return ioi_task(model, n_prompts, seed, split="heldout")
    if task == "induction":
        return induction_task(model, n_prompts, seed=seed + 1)
    return None
