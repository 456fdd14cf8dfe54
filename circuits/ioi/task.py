"""IOI's families and IOI as a task of prompt pairs on the one analysis path (`circuits.path.head_path`):
families the templates, held-out families IOI's held-out split, strata the two name orders;
`find_ioi_circuit` adds IOI's own steps (path patching from the logits back, the paper's classes).
`split_names`: what each split of `ioi_dataset_for` draws its prompts from; `drawn_families`: of it,
what a set of prompts drew (the finding's chose and tested)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from circuits.path.task import PairTask, with_right_padding
from interp.model import HookedTransformer
from interp.tasks.ioi import ioi_dataset_for, single_token_names, trained_on_ioi
from interp.tasks.ioi_prompts import IOIPrompts
from interp.tasks.ioi_templates import (
    BABA_TEMPLATES,
    HELDOUT_NAMES,
    HELDOUT_OBJECTS,
    HELDOUT_PLACES,
    HELDOUT_TEMPLATES,
    NAMES,
    OBJECTS,
    PLACES,
    TOY_DISCOVERY_TEMPLATES,
    TOY_IOI_TEMPLATES,
)
from interp.tasks.ioi_toy import ToyIOITask

IOI_POSITIONS = ("IO", "S1", "S2")
SPLITS = (("discovery", "template"), ("heldout", "held-out template"))
TEXT_POOLS = {  # a text model's split -> the templates, names, places and objects it draws from
    "discovery": (BABA_TEMPLATES, NAMES, PLACES, OBJECTS),
    "heldout": (HELDOUT_TEMPLATES, HELDOUT_NAMES, HELDOUT_PLACES, HELDOUT_OBJECTS),
}


def split_names(model: HookedTransformer, split: str) -> dict[str, list[str]]:
    """The families the `split` ("discovery", "heldout") of `ioi_dataset_for(model, ...)` draws its
    prompts from, by axis: the templates ("T3", as validation's strata name them: template 3 of the
    toy task's list, or of BABA_TEMPLATES + HELDOUT_TEMPLATES, where a held-out one is T15 or later),
    the names that are one token for the model, the places and objects (a toy model: its templates
    and names; every split shares its places and objects)."""
    if trained_on_ioi(model):
        return toy_families(split)
    families = text_families(split)
    names = single_token_names(model, TEXT_POOLS[split][1])
    return {"templates": families.pop("templates"), "names": list(names), **families}


def text_families(split: str) -> dict[str, list[str]]:
    """A text model's `split` without its names (which names are one token depends on the model):
    its templates, places and objects."""
    templates, _, places, objects = TEXT_POOLS[split]
    first = 0 if split == "discovery" else len(BABA_TEMPLATES)  # `ioi_dataset_for`'s template indices
    return {"templates": [f"T{first + k}" for k in range(len(templates))], "places": list(places),
            "objects": list(objects)}  # fmt: skip


def toy_families(split: str) -> dict[str, list[str]]:
    """A toy IOI model's `split` (`ioi_dataset_for`): its templates and names."""
    held_out = split == "heldout"
    templates = [k for k in range(len(TOY_IOI_TEMPLATES)) if (k in TOY_DISCOVERY_TEMPLATES) != held_out]
    task = ToyIOITask()
    half = len(task.name_tokens) // 2
    tokens = task.name_tokens[half:] if held_out else task.name_tokens[:half]
    return {"templates": [f"T{k}" for k in templates], "names": [task.vocab[t] for t in tokens.tolist()]}


def drawn_families(model: HookedTransformer, split: str, prompts: IOIPrompts) -> dict[str, list[str]]:
    """`split_names` with its templates cut to those `prompts` (drawn from the split) use: a small
    set leaves some out, which then neither chose nor tested anything."""
    return split_names(model, split) | prompt_families(prompts)


def prompt_families(prompts: IOIPrompts) -> dict[str, list[str]]:
    """The templates of prompts a caller gave (their other families unknown)."""
    return {"templates": [f"T{k}" for k in sorted(set(prompts.template.tolist()))]}


def ioi_pair_task(model: HookedTransformer, n_prompts: int = 64, seed: int = 0) -> PairTask:
    """`n_prompts` IOI prompts of each split against their ABC corruptions: answer IO, wrong answer S at
    END; positions IO, S1, S2; family "template k" or "held-out template k"; stratum the name order."""
    # (clean, abc, family prefix) per split
    splits = [(*ioi_dataset_for(model, n_prompts, seed, split)[:2], prefix) for split, prefix in SPLITS]
    cleans, abcs = [clean for clean, _, _ in splits], [abc for _, abc, _ in splits]
    width = max(prompts.tokens.shape[1] for prompts in cleans + abcs)

    def stacked(tokens: list[torch.Tensor]) -> torch.Tensor:  # [n, width], right-padded with 0
        return torch.cat([F.pad(t, (0, width - t.shape[1])) for t in tokens])

    families = tuple(f"{prefix} {int(t)}" for clean, _, prefix in splits for t in clean.template)
    end = torch.cat([clean.positions["END"] for clean in cleans])
    return PairTask(
        name="ioi",
        clean=with_right_padding(stacked([clean.tokens for clean in cleans]), end),
        corrupted=stacked([abc.tokens for abc in abcs]),
        correct=torch.cat([clean.io_token for clean in cleans]),
        incorrect=torch.cat([clean.s_token for clean in cleans]),
        end=end,
        corrupted_end=torch.cat([abc.positions["END"] for abc in abcs]),
        positions={name: torch.cat([clean.positions[name] for clean in cleans]) for name in IOI_POSITIONS},
        families=families,
        strata=tuple(order for clean in cleans for order in clean.order),
        heldout_families=tuple(f for f in dict.fromkeys(families) if f.startswith(SPLITS[1][1])),
        answers=("IO", "S"),
    )
