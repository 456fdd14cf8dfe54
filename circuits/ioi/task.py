"""IOI as a task of prompt pairs on the one analysis path (`circuits.path.head_path`): families the
templates, held-out families IOI's held-out split, strata the two name orders; `find_ioi_circuit`
adds IOI's own steps (path patching from the logits back, the paper's classes)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from circuits.path.task import PairTask
from interp.model import HookedTransformer
from interp.tasks.ioi import ioi_dataset_for

IOI_POSITIONS = ("IO", "S1", "S2")
SPLITS = (("discovery", "template"), ("heldout", "held-out template"))


def ioi_pair_task(model: HookedTransformer, n_prompts: int = 64, seed: int = 0) -> PairTask:
    """`n_prompts` IOI prompts of each split against their ABC corruptions: answer IO, wrong answer S at
    END; positions IO, S1, S2; family "template k" or "held-out template k"; stratum the name order."""
    parts = [(ioi_dataset_for(model, n_prompts, seed, split)[:2], prefix) for split, prefix in SPLITS]
    width = max(prompts.tokens.shape[1] for (clean, abc), _ in parts for prompts in (clean, abc))

    def stacked(tokens: list[torch.Tensor]) -> torch.Tensor:  # [n, width], right-padded with 0
        return torch.cat([F.pad(t, (0, width - t.shape[1])) for t in tokens])

    families = tuple(f"{prefix} {int(t)}" for (clean, _), prefix in parts for t in clean.template)
    return PairTask(
        name="ioi",
        clean=stacked([clean.tokens for (clean, _), _ in parts]),
        corrupted=stacked([abc.tokens for (_, abc), _ in parts]),
        correct=torch.cat([clean.io_token for (clean, _), _ in parts]),
        incorrect=torch.cat([clean.s_token for (clean, _), _ in parts]),
        end=torch.cat([clean.positions["END"] for (clean, _), _ in parts]),
        corrupted_end=torch.cat([abc.positions["END"] for (_, abc), _ in parts]),
        positions={
            name: torch.cat([clean.positions[name] for (clean, _), _ in parts]) for name in IOI_POSITIONS
        },
        families=families,
        strata=tuple(order for (clean, _), _ in parts for order in clean.order),
        heldout_families=tuple(f for f in dict.fromkeys(families) if f.startswith(SPLITS[1][1])),
    )
