"""The in-context learning score (Olsson et al. 2022), per document, in nats:

    icl = mean loss over the late window - mean loss over the early window

negative when the model predicts later tokens better, from their context. Losses are unembedded only
at the positions read (`token_losses`): a long document's logits are most of a forward pass's memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

import interp
from circuits.evidence import mean_ci
from circuits.icl.sequences import Windows

LOGITS_PER_CHUNK = 2**26  # logits unembedded at once (256 MiB of float32)


def token_losses(
    model: interp.HookedTransformer,
    final_resid: Float[Tensor, "batch pos d_model"],
    tokens: Int[Tensor, "batch pos"],
    at: Sequence[int] | None = None,
) -> Float[Tensor, "batch n_at"]:
    """The loss (nats) of each token t in `at` (default: 1 .. pos - 1), -log p(token t), from the final
    residual stream at t - 1 through the final norm and the unembedding, LOGITS_PER_CHUNK logits at a
    time. Differentiable in final_resid."""
    at = range(1, tokens.shape[1]) if at is None else at
    before = torch.as_tensor([t - 1 for t in at], device=final_resid.device)
    targets = tokens[:, [t for t in at]].to(final_resid.device).flatten()  # [batch * n_at]
    normed = model.ln_final(final_resid[:, before]).flatten(0, 1)  # [batch * n_at, d_model]
    per_chunk = max(1, LOGITS_PER_CHUNK // model.cfg.d_vocab_out)
    losses = [
        torch.nn.functional.cross_entropy(model.unembed(rows[None])[0].float(), target, reduction="none")
        for rows, target in zip(normed.split(per_chunk), targets.split(per_chunk), strict=True)
    ]
    return torch.cat(losses).view(len(tokens), len(before))


def icl_scores(
    model: interp.HookedTransformer,
    final_resid: Float[Tensor, "batch pos d_model"],
    tokens: Int[Tensor, "batch pos"],
    windows: Windows,
) -> Float[Tensor, " batch"]:
    """Each document's ICL score (nats), unembedding only the windows' positions."""
    early, late = windows.tokens(windows.early), windows.tokens(windows.late)
    losses = token_losses(model, final_resid, tokens, [*early, *late])
    return losses[:, len(early) :].mean(-1) - losses[:, : len(early)].mean(-1)


@dataclass(kw_only=True)
class ICLScore:
    """The ICL score of documents: its mean, a 95% bootstrap CI over documents, the mean losses in the
    two windows (nats), and each document's score."""

    score: float
    ci: tuple[float, float]
    early_loss: float
    late_loss: float
    per_document: Float[Tensor, " n_documents"]

    @property
    def n_documents(self) -> int:
        return len(self.per_document)


def icl_score(losses: Float[Tensor, "batch pos_minus_1"], windows: Windows, seed: int = 0) -> ICLScore:
    """The ICL score of documents from their per-token losses ([:, t - 1] is token t's)."""
    early = [t - 1 for t in windows.tokens(windows.early)]
    late = [t - 1 for t in windows.tokens(windows.late)]
    per_document = (losses[:, late].mean(-1) - losses[:, early].mean(-1)).double()
    return ICLScore(
        score=per_document.mean().item(),
        ci=mean_ci(per_document, seed),
        early_loss=losses[:, early].mean().item(),
        late_loss=losses[:, late].mean().item(),
        per_document=per_document.float(),
    )
