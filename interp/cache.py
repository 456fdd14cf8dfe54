"""Cached activations, and the residual-stream decompositions built on them.

Positions: methods that take `pos` accept None (all positions), an int (one position for every
prompt) or a LongTensor [batch] (one position per prompt, e.g. each IOI prompt's END).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.devices import module_weight

if TYPE_CHECKING:
    from interp.model import HookedTransformer

_BLOCK_HOOKS = {
    "resid_pre",
    "resid_mid",
    "resid_post",
    "attn_out",
    "mlp_out",
    "q_input",
    "k_input",
    "v_input",
}
_ATTN_HOOKS = {"q", "k", "v", "z", "result", "pattern", "attn_scores", "rot_q", "rot_k"}
_MLP_HOOKS = {"pre", "post", "pre_linear"}
_ALIASES = {"attn": "pattern", "attn_logits": "attn_scores", "mlp_pre": "pre", "mlp_post": "post"}

Pos = int | Int[Tensor, " batch"] | None


def act_name(name: str, layer: int | None = None, sublayer: str | None = None) -> str:
    """Full hook name from TransformerLens shorthand.

    act_name("pattern", 3) -> "blocks.3.attn.hook_pattern"; act_name("resid_pre", 0);
    act_name("scale", 2, "ln1") -> "blocks.2.ln1.hook_scale"; act_name("scale") -> "ln_final.hook_scale".
    """
    if "." in name or name.startswith("hook_"):
        return name
    name = _ALIASES.get(name, name)
    if name in {"embed", "pos_embed"}:
        return f"hook_{name}"
    if name in {"scale", "normalized"}:
        if layer is None:
            return f"ln_final.hook_{name}"
        return f"blocks.{layer}.{sublayer or 'ln1'}.hook_{name}"
    if layer is None:
        raise KeyError(f"{name!r} needs a layer, e.g. ({name!r}, 0).")
    if layer < 0:
        raise KeyError("Use a non-negative layer index in hook names.")
    if name in _BLOCK_HOOKS:
        return f"blocks.{layer}.hook_{name}"
    if name in _ATTN_HOOKS:
        return f"blocks.{layer}.attn.hook_{name}"
    if name in _MLP_HOOKS:
        return f"blocks.{layer}.mlp.hook_{name}"
    known = sorted(_BLOCK_HOOKS | _ATTN_HOOKS | _MLP_HOOKS | {"embed", "pos_embed", "scale", "normalized"})
    raise KeyError(f"Unknown activation {name!r}; known short names: {', '.join(known)}.")


def select_pos(x: Float[Tensor, "... batch pos d"], pos: Pos) -> Tensor:
    """Index the pos dim (second to last) with None, an int, or one position per prompt [batch]."""
    if pos is None:
        return x
    if isinstance(pos, int):
        return x[..., pos, :]
    index = pos.to(x.device).view(*([1] * (x.ndim - 3)), -1, 1, 1).expand(*x.shape[:-2], 1, x.shape[-1])
    return x.gather(-2, index).squeeze(-2)


class ActivationCache:
    """Activations from one run, by full hook name or TransformerLens shorthand.

    cache["blocks.3.attn.hook_pattern"], cache["pattern", 3], cache["scale", 2, "ln1"].
    """

    def __init__(self, activations: dict[str, Tensor], model: HookedTransformer):
        self.activations = activations
        self.model = model

    def __getitem__(self, key: str | tuple) -> Tensor:
        name = act_name(*key) if isinstance(key, tuple) else act_name(key)
        if name not in self.activations:
            self.model.check_hook_name(name)
            raise KeyError(f"{name!r} was not cached; widen names_filter in run_with_cache.")
        return self.activations[name]

    def __contains__(self, name: str) -> bool:
        return name in self.activations

    def __iter__(self) -> Iterator[str]:
        return iter(self.activations)

    def __len__(self) -> int:
        return len(self.activations)

    def keys(self):
        return self.activations.keys()

    def items(self):
        return self.activations.items()

    def to(self, device: str | torch.device) -> ActivationCache:
        return ActivationCache({k: v.to(device) for k, v in self.activations.items()}, self.model)

    # --- the residual stream as a sum of components ---------------------------------------------

    def accumulated_resid(
        self, layer: int | None = None, incl_mid: bool = False, pos: Pos = None, apply_ln: bool = False
    ) -> tuple[Float[Tensor, "component batch ... d_model"], list[str]]:
        """Residual stream before each layer up to `layer` (default: all, plus the final one).

        Returns the stack and its labels ("0_pre", "0_mid", ..., "final_post").
        """
        n_layers = self.model.cfg.n_layers
        layer = n_layers if layer is None else layer
        parts, labels = [], []
        for i in range(layer + 1):
            if i == n_layers:
                parts.append(self[f"blocks.{n_layers - 1}.hook_resid_post"])
                labels.append("final_post")
                break
            parts.append(self["resid_pre", i])
            labels.append(f"{i}_pre")
            if incl_mid and f"blocks.{i}.hook_resid_mid" in self.model.hook_dict and i < layer:
                parts.append(self["resid_mid", i])
                labels.append(f"{i}_mid")
        stack = select_pos(torch.stack(parts), pos)
        return (self.apply_ln_to_stack(stack, layer, pos=pos) if apply_ln else stack), labels

    def decompose_resid(
        self, layer: int | None = None, pos: Pos = None, apply_ln: bool = False, mlp_input: bool = False
    ) -> tuple[Float[Tensor, "component batch ... d_model"], list[str]]:
        """The residual stream before `layer` (default: the final one) as the sum of its writers.

        Components: "embed" (plus "pos_embed"), then each earlier layer's "L_attn_out" and
        "L_mlp_out" (with `mlp_input`, also layer `layer`'s attention output). They sum exactly to
        resid_pre of `layer` (or resid_mid with `mlp_input`, or the final resid_post).
        """
        cfg = self.model.cfg
        layer = cfg.n_layers if layer is None else layer
        parts, labels = [self["hook_embed"]], ["embed"]
        if cfg.positional == "learned":
            parts.append(self["hook_pos_embed"])
            labels.append("pos_embed")
        for i in range(layer + (1 if mlp_input else 0)):
            parts.append(self["attn_out", i])
            labels.append(f"{i}_attn_out")
            if not cfg.attn_only and not (mlp_input and i == layer):
                parts.append(self["mlp_out", i])
                labels.append(f"{i}_mlp_out")
        stack = select_pos(torch.stack(parts), pos)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, pos=pos, mlp_input=mlp_input)
        return stack, labels

    def stack_head_results(
        self, layer: int | None = None, pos: Pos = None, apply_ln: bool = False
    ) -> tuple[Float[Tensor, "component batch ... d_model"], list[str]]:
        """Each head's output (z_h W_O[h], without the bias b_O) in layers before `layer`, labelled "L.H".

        Uses cached hook_result when present, else computes it from cached hook_z.
        """
        cfg = self.model.cfg
        layer = cfg.n_layers if layer is None else layer
        parts, labels = [], []
        for i in range(layer):
            if f"blocks.{i}.attn.hook_result" in self.activations:
                result = self["result", i]  # [batch, pos, head, d_model]
            else:
                z = self["z", i]  # [batch, pos, head, d_head]
                W_O = module_weight(self.model.blocks[i].attn, "W_O", z.device)  # [head, d_head, d_model]
                result = torch.einsum("bphe,hed->bphd", z, W_O)
            parts.append(result.movedim(2, 0))
            labels += [f"{i}.{h}" for h in range(cfg.n_heads)]
        stack = select_pos(torch.cat(parts), pos)
        return (self.apply_ln_to_stack(stack, layer, pos=pos) if apply_ln else stack), labels

    def apply_ln_to_stack(
        self,
        stack: Float[Tensor, "component batch ... d_model"],
        layer: int | None = None,
        pos: Pos = None,
        mlp_input: bool = False,
    ) -> Float[Tensor, "component batch ... d_model"]:
        """Apply the norm before `layer` (default: ln_final) linearly, with its cached scale.

        Each component is centred (LayerNorm), divided by the scale the norm computed on the full
        residual stream, and multiplied by the norm's weight. The norm's bias is a constant and is
        left out, so components sum to the normalised stream minus that bias.
        """
        n_layers = self.model.cfg.n_layers
        layer = n_layers if layer is None else layer
        if layer == n_layers:
            norm, scale = self.model.ln_final, self["scale"]
        else:
            sub = "ln2" if mlp_input else "ln1"
            norm, scale = getattr(self.model.blocks[layer], sub), self["scale", layer, sub]
        scale = select_pos(scale, pos)
        if norm.center:
            stack = stack - stack.mean(-1, keepdim=True)
        stack = stack / scale
        return stack if norm.w is None else stack * module_weight(norm, "w", stack.device)

    def logit_attrs(
        self,
        stack: Float[Tensor, "component batch ... d_model"],
        tokens: Int[Tensor, " batch"] | int,
        incorrect_tokens: Int[Tensor, " batch"] | int | None = None,
    ) -> Float[Tensor, "component batch ..."]:
        """Direct logit attribution: each component's contribution to the logit of `tokens`
        (minus that of `incorrect_tokens`). Pass a stack that has been through apply_ln_to_stack.
        """
        W_U = self.model.W_U
        directions = W_U[:, tokens]
        if incorrect_tokens is not None:
            directions = directions - W_U[:, incorrect_tokens]
        directions = directions.T if directions.ndim == 2 else directions  # [batch, d_model] or [d_model]
        if directions.ndim == 2 and stack.ndim == 4:
            directions = directions[:, None, :]  # broadcast over positions
        return (stack * directions).sum(-1)
