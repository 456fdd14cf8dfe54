"""A model's weights as TransformerLens names them, stacked over layers: `W_Q` ... `b_out`
[layer, ...], `OV`/`QK` as `FactoredMatrix`, the embedding views, token directions.

`StackedWeights` is part of `HookedTransformer` (a section of its class, kept in its own module);
it reads the blocks' parameters and never changes them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.checks import check_token_ids
from interp.io.devices import module_weight


class StackedWeights:
    """Weights of every block stacked over layers (offloaded blocks are read in). Per query head
    under grouped-query attention (each key/value head repeated for its group), as TransformerLens's
    `HookedTransformer` gives them; zeros for biases a model does not have."""

    def _stack(self, attr: str, module: str = "attn") -> Tensor:
        """One weight of every block, stacked on the model's device (offloaded blocks are read in)."""
        return torch.stack([module_weight(getattr(b, module), attr, self.device) for b in self.blocks])

    @property
    def W_Q(self) -> Float[Tensor, "layer head d_model d_head"]:
        return self._stack("W_Q")

    @property
    def W_K(self) -> Float[Tensor, "layer head d_model d_head"]:
        """Per query head: under grouped-query attention each key head is repeated for its group."""
        return self._stack("W_K")

    @property
    def W_V(self) -> Float[Tensor, "layer head d_model d_head"]:
        """Per query head, as W_K."""
        return self._stack("W_V")

    @property
    def W_O(self) -> Float[Tensor, "layer head d_head d_model"]:
        return self._stack("W_O")

    def _stack_or_zeros(self, attr: str, module: str, shape: tuple[int, ...]) -> Tensor:
        """[layer, *shape]; zeros for layers without the parameter (e.g. biases of Llama models)."""
        parts = []
        for block in self.blocks:
            value = getattr(getattr(block, module), attr)
            parts.append(torch.zeros(shape, device=self.device, dtype=self.dtype) if value is None else value)
        return torch.stack(parts)

    @property
    def b_Q(self) -> Float[Tensor, "layer head d_head"]:
        return self._stack_or_zeros("b_Q", "attn", (self.cfg.n_heads, self.cfg.d_head))

    @property
    def b_K(self) -> Float[Tensor, "layer head d_head"]:
        """Per query head, as W_K."""
        return self._stack_or_zeros("b_K", "attn", (self.cfg.n_heads, self.cfg.d_head))

    @property
    def b_V(self) -> Float[Tensor, "layer head d_head"]:
        """Per query head, as W_V."""
        return self._stack_or_zeros("b_V", "attn", (self.cfg.n_heads, self.cfg.d_head))

    @property
    def b_O(self) -> Float[Tensor, "layer d_model"]:
        return self._stack_or_zeros("b_O", "attn", (self.cfg.d_model,))

    def _require_mlps(self) -> None:
        if self.cfg.attn_only:
            raise AttributeError(f"{self.cfg.model_name} is attention-only: it has no MLP weights.")

    @property
    def W_in(self) -> Float[Tensor, "layer d_model d_mlp"]:
        self._require_mlps()
        return self._stack("W_in", "mlp")

    @property
    def W_gate(self) -> Float[Tensor, "layer d_model d_mlp"]:
        self._require_mlps()
        if not self.cfg.gated_mlp:
            raise AttributeError(f"{self.cfg.model_name} has no gated MLP, so no W_gate.")
        return self._stack("W_gate", "mlp")

    @property
    def W_out(self) -> Float[Tensor, "layer d_mlp d_model"]:
        self._require_mlps()
        return self._stack("W_out", "mlp")

    @property
    def b_in(self) -> Float[Tensor, "layer d_mlp"]:
        self._require_mlps()
        return self._stack_or_zeros("b_in", "mlp", (self.cfg.d_mlp,))

    @property
    def b_out(self) -> Float[Tensor, "layer d_model"]:
        self._require_mlps()
        return self._stack_or_zeros("b_out", "mlp", (self.cfg.d_model,))

    @property
    def W_E_pos(self) -> Float[Tensor, "d_vocab_plus_n_ctx d_model"]:
        """W_E and W_pos concatenated: what writes the residual stream before block 0 (learned positions
        only: shortformer positions are not in the residual stream)."""
        if self.cfg.positional != "learned":
            why = "its W_pos does not write the residual stream" if self.cfg.learned_positions else "no W_pos"
            raise AttributeError(f"{self.cfg.model_name} has {self.cfg.positional} positions: {why}.")
        return torch.cat([self.W_E, self.W_pos])

    @property
    def OV(self):
        """W_V W_O per head, [layer, head, d_model, d_model], as a TransformerLens `FactoredMatrix`
        (`.AB` is the full matrix; `.eigenvalues`, `.svd()`, indexing [layer, head] work)."""
        from transformer_lens.FactoredMatrix import FactoredMatrix

        return FactoredMatrix(self.W_V, self.W_O)

    @property
    def QK(self):
        """W_Q W_K^T per head (the bilinear form of attention scores, before rotary positions),
        [layer, head, d_model, d_model], as a `FactoredMatrix`."""
        from transformer_lens.FactoredMatrix import FactoredMatrix

        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    def accumulated_bias(
        self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True
    ) -> Float[Tensor, " d_model"]:
        """Sum of the biases written to the residual stream before `layer` (b_O, and b_out unless
        include_mlp_biases=False); with mlp_input, also layer `layer`'s b_O."""
        total = torch.zeros(self.cfg.d_model, device=self.device, dtype=self.dtype)
        for i, block in enumerate(self.blocks[: layer + int(mlp_input)]):
            if block.attn.b_O is not None:
                total = total + block.attn.b_O
            if include_mlp_biases and i < layer and not self.cfg.attn_only and block.mlp.b_out is not None:
                total = total + block.mlp.b_out
        return total

    def tokens_to_residual_directions(self, tokens: str | int | Tensor) -> Float[Tensor, "... d_model"]:
        """The unembedding direction (a column of W_U) of each token: [*tokens.shape, d_model]."""
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        tokens = check_token_ids(self.cfg, tokens, output=True)  # a negative id would wrap to the end
        return self.W_U[:, tokens.to(self.W_U.device)].movedim(0, -1)

    # --- embedding as TransformerLens's modules compute it -----------------------------------------

    @property
    def embed(self) -> WeightView:
        """`model.embed(tokens)`: W_E[tokens], [batch, pos, d_model] (what hook_embed sees); `.W_E`."""
        return WeightView(lambda tokens: self.W_E[tokens], W_E=self.W_E)

    @property
    def pos_embed(self) -> WeightView:
        """`model.pos_embed(tokens, past_kv_pos_offset=0, attention_mask=None)`: learned (or shortformer)
        position embeddings of tokens' positions, [batch, pos, d_model] (what hook_pos_embed sees); `.W_pos`.
        With an attention mask (over cached and new tokens, as TransformerLens's) positions count from
        each prompt's first real token and pads get zeros."""
        if not self.cfg.learned_positions:
            raise AttributeError(f"{self.cfg.model_name} has {self.cfg.positional} positions, no pos_embed.")

        def pos_embed(
            tokens: Tensor, past_kv_pos_offset: int = 0, attention_mask: Tensor | None = None
        ) -> Tensor:
            n = tokens.shape[-1]
            if attention_mask is None:
                offset = past_kv_pos_offset
                return self.W_pos[offset : offset + n].expand(*tokens.shape, -1).clone()  # not a view
            mask = attention_mask.to(self.W_pos.device).bool()
            positions = (mask.long().cumsum(-1) - 1).clamp(min=0)[:, past_kv_pos_offset:]
            return self.W_pos[positions] * mask[:, past_kv_pos_offset:, None].to(self.W_pos.dtype)

        return WeightView(pos_embed, W_pos=self.W_pos)


class WeightView:
    """One of TransformerLens's small modules (embed, pos_embed) as a view of interp's flat
    parameters: callable like the module, with its weights as attributes (`model.embed.W_E`)."""

    def __init__(self, forward: Callable[..., Tensor], **weights: Tensor):
        self._forward = forward
        self.__dict__.update(weights)

    def __call__(
        self, tokens: Int[Tensor, "batch pos"], *args: Any, **kwargs: Any
    ) -> Float[Tensor, "batch pos d_model"]:
        return self._forward(tokens, *args, **kwargs)
