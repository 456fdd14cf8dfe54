"""Each head's change of the ICL score when ablated (ablated - clean, nats; positive: the model uses its
context less without it): attributed for every head at once (one forward and backward pass: the sum
over positions and d_head of (ablated z - z) * d(ICL score)/dz), or exact for a set of heads (interp's
engine, `read_site_sets`, from the clean run's residual stream at the set's first block). The ablated z
(zero, mean over every position, another document's) come from `interp.interventions.ablation`."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

import interp
from circuits.icl.score import icl_scores, token_losses
from circuits.icl.sequences import Windows
from interp.interventions.ablation import Ablation, Replacement, ablation_sites
from interp.interventions.engine import RunOptions, final_resid_hook, read_site_sets, read_with_grad
from interp.types import Head, Progress, as_stage, counted

ICL_ABLATIONS = ("mean", "zero", "resample")
ATTRIBUTION_STAGE = "Attribution: forward and backward passes"  # the stages progress(stage, done, total)
EXACT_ABLATIONS_STAGE = "Exact ablations"  # reports: head_attributions, ablated_icl_scores


def ranked_heads(grid: Float[Tensor, "layer head"]) -> list[Head]:
    """Every head of `grid`, the largest value first."""
    n_heads = grid.shape[1]
    return [(int(i) // n_heads, int(i) % n_heads) for i in grid.flatten().argsort(descending=True)]


def check_icl_ablation(ablation: str) -> None:
    """Refuse an ablation the ICL score does not take (not one of ICL_ABLATIONS)."""
    if ablation not in ICL_ABLATIONS:
        raise ValueError(f"unknown ablation {ablation!r}; choose one of {', '.join(ICL_ABLATIONS)}")


def ablated_z(
    model: interp.HookedTransformer,
    z: dict[str, Float[Tensor, "batch pos head d_head"]],
    ablation: str,
    seed: int = 0,
    real: Bool[Tensor, "batch pos"] | None = None,
) -> dict[str, Tensor]:
    """What replaces each hook_z of `z` (name -> the documents' z) under `ablation`, broadcastable to
    [batch, pos, head, d_head]: "mean" one mean per head over every position of every document (the
    `real` ones only, where given), "zero" 0, "resample" another document's z at each position (each
    document's drawn with `seed` among the others, never itself)."""
    check_icl_ablation(ablation)
    if ablation == "resample":
        n_documents = len(next(iter(z.values())))
        if n_documents < 2:
            raise ValueError(
                "resample ablation gives each document another's z: it needs at least 2 documents"
            )
        shift = torch.randint(1, n_documents, (n_documents,), generator=torch.Generator().manual_seed(seed))
        other = (torch.arange(n_documents) + shift) % n_documents
        return {name: values[other.to(values.device)] for name, values in z.items()}
    mask = None if real is None else real.flatten()[:, None]
    if ablation == "mean":  # every (document, position) a reference row of one position
        reference = {name: values.flatten(0, 1)[:, None] for name, values in z.items()}
    else:
        reference = z
    replacement = Replacement(model, list(z), Ablation(ablation, reference=reference, seed=seed, mask=mask))
    return {name: replacement.values(name, len(values)) for name, values in z.items()}


def head_attributions(
    model: interp.HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    windows: Windows,
    ablation: str = "mean",
    seed: int = 0,
    batch_size: int = 4,
    progress: Progress | None = None,
) -> tuple[Float[Tensor, "batch layer head"], Float[Tensor, "batch pos_minus_1"]]:
    """(each document's attributed change of its ICL score per head, its per-token losses), in nats: one
    forward and backward pass per `batch_size` documents, keeping every document's z and gradient (2 x
    batch x pos x d_model floats per layer) for the mean ablation."""
    names = model.layer_hook_names("z")
    z: dict[str, list[Tensor]] = {name: [] for name in names}
    grads: dict[str, list[Tensor]] = {name: [] for name in names}
    losses = []
    for chunk in counted(tokens.split(batch_size), progress, ATTRIBUTION_STAGE):
        with read_with_grad(model, names) as kept:
            resid = model(chunk, stop_at_layer=model.cfg.n_layers)
            score = icl_scores(model, resid, chunk, windows)
            chunk_grads = torch.autograd.grad(score.sum(), [kept[name] for name in names])
        with torch.no_grad():
            losses.append(token_losses(model, resid.detach(), chunk).cpu())
        for name, grad in zip(names, chunk_grads, strict=True):
            z[name].append(kept[name].detach())
            grads[name].append(grad)
    every_z = {name: torch.cat(parts) for name, parts in z.items()}
    values = ablated_z(model, every_z, ablation, seed)
    per_layer = [((values[name] - every_z[name]) * torch.cat(grads[name])).sum((1, 3)) for name in names]
    return torch.stack(per_layer, 1).float().cpu(), torch.cat(losses).float()


@torch.inference_mode()
def ablated_icl_scores(
    model: interp.HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    windows: Windows,
    head_sets: Sequence[Sequence[Head]],
    ablation: str = "mean",
    seed: int = 0,
    progress: Progress | None = None,
) -> tuple[Float[Tensor, "batch pos_minus_1"], Float[Tensor, " batch"], Float[Tensor, "n_sets batch"]]:
    """(the clean run's per-token losses, its ICL score per document, the ICL score per document with
    each set of heads ablated), in nats; one clean run caches what the ablated runs start from."""
    final = final_resid_hook(model)
    z_names = [
        interp.act_name("z", layer) for layer in sorted({layer for heads in head_sets for layer, _ in heads})
    ]
    starts = sorted({min(layer for layer, _ in heads) for heads in head_sets if heads})
    start_names = [interp.act_name("resid_pre", layer) for layer in starts]
    _, cache = model.run_with_cache(tokens, names_filter=[*z_names, *start_names, final], return_type=None)
    losses = token_losses(model, cache[final], tokens).cpu()

    def score(acts: dict[str, Tensor]) -> Tensor:
        return icl_scores(model, acts[final], tokens, windows).float().cpu()

    if progress is not None:
        progress(EXACT_ABLATIONS_STAGE, 0, len(head_sets))

    ablated = read_site_sets(
        model,
        tokens,
        [ablation_sites(model, heads=heads) for heads in head_sets],
        [final],
        score,
        ablated_z(model, {name: cache[name] for name in z_names}, ablation, seed),
        target={name: cache[name] for name in [*start_names, final]},
        options=RunOptions(progress=as_stage(progress, EXACT_ABLATIONS_STAGE)),
    )
    clean = score({final: cache[final]})
    return losses.float(), clean, torch.stack(ablated) if ablated else clean.new_empty(0, len(tokens))
