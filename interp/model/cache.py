"""Cached activations, and the residual-stream decompositions built on them.

The API is TransformerLens's `ActivationCache` (argument names, defaults, return types: a tensor,
or `(tensor, labels)` with `return_labels=True`). Positions: `pos_slice` is TransformerLens's (None,
an int, a tuple/slice, or a list of positions, the same for every prompt); interp adds `pos`, one
position per prompt (a LongTensor [batch], e.g. each IOI prompt's END). Layers: `layer=None` or -1
means the final residual stream (the unembedding's input); other negative layers are refused (TransformerLens
reads them as an empty range).
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterator
from typing import Literal

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

import interp.checks as checks
from interp.config import Config
from interp.io.devices import module_weight
from interp.types import Pos

_BLOCK_HOOKS = {
    "resid_pre",
    "resid_mid",
    "resid_post",
    "attn_out",
    "mlp_out",
    "attn_in",
    "mlp_in",
    "q_input",
    "k_input",
    "v_input",
}
_ATTN_HOOKS = {"q", "k", "v", "z", "result", "pattern", "attn_scores", "rot_q", "rot_k"}
_MLP_HOOKS = {"pre", "post", "pre_linear", "mid"}  # mid: SoLU's, before its LayerNorm
_ALIASES = {"attn": "pattern", "attn_logits": "attn_scores", "mlp_pre": "pre", "mlp_post": "post",
            "key": "k", "query": "q", "value": "v"}  # fmt: skip
# TransformerLens's compact names: name, layer, optional sublayer ("k6a", "pre2", "scale29ln1").
_COMPACT_NAME = re.compile(r"([a-z]+)(\d+)([a-z]?.*)")


def act_name(name: str, layer: int | None = None, sublayer: str | None = None) -> str:
    """Full hook name from TransformerLens shorthand.

    act_name("pattern", 3) -> "blocks.3.attn.hook_pattern"; act_name("resid_pre", 0);
    act_name("scale", 2, "ln1") -> "blocks.2.ln1.hook_scale"; act_name("scale") -> "ln_final.hook_scale";
    TransformerLens's compact names: act_name("k6a") -> "blocks.6.attn.hook_k",
    act_name("scale29ln1") -> "blocks.29.ln1.hook_scale".
    """
    if "." in name or name.startswith("hook_"):
        return name
    compact = _COMPACT_NAME.fullmatch(name) if layer is None else None
    if compact is not None:
        name, layer_digits, suffix = compact.groups()
        layer = int(layer_digits)
        sublayer = sublayer or (suffix if suffix in ("ln1", "ln2") else None)
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


PosSlice = int | slice | tuple | list | Tensor | None


def _pos_index(pos_slice: PosSlice) -> int | slice | Tensor:
    """TransformerLens's position slice as an index: None (all), an int (drops the pos dim),
    a tuple (slice(*tuple)), a slice, or a list/tensor of positions (keeps the dim)."""
    pos_slice = getattr(pos_slice, "slice", pos_slice)  # a transformer_lens Slice object
    if pos_slice is None:
        return slice(None)
    if isinstance(pos_slice, tuple):
        return slice(*pos_slice)
    if isinstance(pos_slice, int | slice):
        return pos_slice
    if isinstance(pos_slice, Tensor) and pos_slice.ndim == 0:
        return int(pos_slice)
    return torch.as_tensor(pos_slice, dtype=torch.long)


def _select(x: Float[Tensor, "... pos d"], pos_slice: PosSlice, pos: Tensor | None) -> Tensor:
    """Positions of x (pos dim second to last): TransformerLens's `pos_slice`, or interp's
    per-prompt `pos` ([batch], one position per prompt: x must be [..., batch, pos, d])."""
    if pos is None:
        index = _pos_index(pos_slice)
        if isinstance(index, Tensor):
            return x.index_select(-2, index.to(x.device))
        return x[..., index, :]
    if pos_slice is not None:
        raise ValueError(
            "Pass pos_slice (the same positions for every prompt) or pos (one per prompt), not both."
        )
    if not isinstance(pos, Tensor) or pos.ndim != 1:
        raise ValueError(
            "pos takes one position per prompt (a LongTensor [batch]); "
            "for the same position in every prompt use pos_slice=, e.g. pos_slice=-1."
        )
    return select_pos(x, pos)


READ_REAL_TOKENS = (
    "pass pos=model.last_positions(tokens) (each prompt's last real token) or pos= one position per "
    "prompt [batch]; or pad on the left (model.default_padding_side = 'left'), where -1 is every "
    "prompt's last token"
)


def refuse_reading_padding(
    real_tokens: Bool[Tensor, "batch pos"] | None, pos_slice: PosSlice, pos: Tensor | None, what: str
) -> None:
    """Raise, saying what to pass, where `pos_slice` (the same positions in every prompt) or `pos` (one
    per prompt) reads a prompt's padding: a position where `real_tokens` [batch, pos] is False.
    Every position (pos_slice None) is TransformerLens's whole tensor, padding included, and passes."""
    index = _pos_index(pos_slice)
    if real_tokens is None or (pos is None and isinstance(index, slice) and index == slice(None)):
        return
    real = real_tokens if real_tokens.ndim == 2 else real_tokens[None]
    batch, n_pos = real.shape
    rows = torch.arange(batch, device=real.device)
    if pos is not None:
        read = torch.as_tensor(pos, device=real.device).reshape(-1) % n_pos
        padding = ~real[rows, read] if read.numel() == batch else torch.zeros(batch, dtype=torch.bool)
        read_of = read
    else:
        columns = torch.arange(n_pos, device=real.device)[index].reshape(-1)
        read_padding = ~real[:, columns]  # [batch, k]
        padding = read_padding.any(-1)
        read_of = columns[read_padding.long().argmax(-1)] if columns.numel() else rows
    if not bool(padding.any()):
        return
    i = int(padding.nonzero()[0, 0])
    where = real[i].nonzero()[:, 0]
    span = f"{int(where[0])}..{int(where[-1])}" if where.numel() else "none"
    asked = f"pos_slice={pos_slice!r}" if pos is None else "pos"
    raise ValueError(
        f"{what}: {asked} reads position {int(read_of[i])} of prompt {i}, its padding (its real tokens "
        f"are positions {span} of {n_pos}); {READ_REAL_TOKENS}."
    )


def head_contribution_linearisation(cfg: Config) -> str:
    """In words, for reports: what `ActivationCache.stack_head_contributions` takes as each head's
    contribution to the residual stream on a model of `cfg`."""
    if not cfg.post_norm:
        return "each head's output z_h W_O[h]"
    return (
        "each head's share of its layer's attention output with the post-attention norm (ln1_post) frozen "
        "at its scale in the clean run, w * z_h W_O[h] / s (the standard linearisation: the shares add up "
        "to each attention output in that run, while removing a head would also move the norm's scale)"
    )


def direct_attribution_linearisation(cfg: Config) -> str:
    """In words, for reports: how a head's direct logit attribution (`stack_head_contributions` with
    the final norm applied, `apply_ln_to_stack`) linearises the norms between its output and the logits."""
    words = (
        f"{head_contribution_linearisation(cfg)}, through the final norm at its scale in the clean run "
        "(frozen, as TransformerLens does)"
    )
    cap = cfg.output_logits_soft_cap
    if cap is not None:
        words += (
            f", onto the logits before their soft cap ({cap} * tanh(x / {cap})): the cap is monotone, so an "
            "attribution's sign carries over to the capped logits, its size and the attributions' sum do not"
        )
    return words


# Stacks returned by apply_ln_to_stack, so that logit_attrs can refuse to normalise one twice.
_NORMALISED: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()

Stack = Float[Tensor, "component *batch_and_pos d_model"]
Tokens = str | int | Int[Tensor, ""] | Int[Tensor, " batch"] | Int[Tensor, "batch pos"]


class ActivationCache:
    """Activations from one run, by full hook name or TransformerLens shorthand.

    cache["blocks.3.attn.hook_pattern"], cache["pattern", 3], cache["pattern", -1] (the last layer),
    cache["scale", 2, "ln1"]. After `remove_batch_dim()` (a one-prompt cache) tensors lose their
    batch dim and `has_batch_dim` is False.

    `real_tokens` [batch, pos] (True: a prompt's real token; None: no padding, or not known) is the
    run's padding, which `run_with_cache` records: a `pos_slice` or `pos` that would read a prompt's
    padding (-1 on a right-padded batch) is refused, saying what to pass, in every function here.
    """

    def __init__(
        self,
        cache_dict: dict[str, Tensor],
        model: nn.Module,
        has_batch_dim: bool = True,
        real_tokens: Bool[Tensor, "batch pos"] | None = None,
    ):
        self.cache_dict = cache_dict
        self.model = model
        self.has_batch_dim = has_batch_dim
        self.real_tokens = real_tokens

    def _select(
        self, x: Float[Tensor, "... pos d"], pos_slice: PosSlice, pos: Tensor | None, rows: PosSlice = None
    ) -> Tensor:
        """`x`'s positions `pos_slice` or `pos`, refused where they read the padding of a prompt
        (of those `rows` selects: a batch_slice)."""
        real = self.real_tokens
        if real is not None and rows is not None:
            real = _index_dim(real if real.ndim == 2 else real[None], 0, _pos_index(rows))
        refuse_reading_padding(real, pos_slice, pos, "This cache is of a padded batch")
        return _select(x, pos_slice, pos)

    def __getitem__(self, key: str | tuple) -> Tensor:
        if isinstance(key, str) and key in self.cache_dict:
            return self.cache_dict[key]
        if isinstance(key, tuple):
            name, *rest = key
            if rest and rest[0] is not None and rest[0] < 0:
                rest[0] += self.model.cfg.n_layers
            name = act_name(name, *rest)
        else:
            name = act_name(key)
        if name not in self.cache_dict:
            self.model.check_hook_name(name)
            raise KeyError(f"{name!r} was not cached; widen names_filter in run_with_cache.")
        return self.cache_dict[name]

    def __contains__(self, name: str) -> bool:
        return name in self.cache_dict

    def __iter__(self) -> Iterator[str]:
        return iter(self.cache_dict)

    def __len__(self) -> int:
        return len(self.cache_dict)

    def __repr__(self) -> str:
        return f"ActivationCache with keys {list(self.cache_dict)}"

    def keys(self):
        return self.cache_dict.keys()

    def values(self):
        return self.cache_dict.values()

    def items(self):
        return self.cache_dict.items()

    @property
    def has_embed(self) -> bool:
        return "hook_embed" in self.cache_dict

    @property
    def has_pos_embed(self) -> bool:
        return "hook_pos_embed" in self.cache_dict

    def to(self, device: str | torch.device) -> ActivationCache:
        """Move every tensor to `device`, in place (as TransformerLens); returns the cache."""
        self.cache_dict = {k: v.to(device) for k, v in self.cache_dict.items()}
        return self

    def toggle_autodiff(self, mode: bool = False) -> None:
        """Turn autograd off (or on) globally, as TransformerLens: `torch.set_grad_enabled(mode)`."""
        torch.set_grad_enabled(mode)

    def remove_batch_dim(self) -> ActivationCache:
        """Drop the batch dim of a one-prompt cache, in place; returns the cache."""
        if not self.has_batch_dim:
            return self
        sizes = {v.shape[0] for v in self.cache_dict.values() if v.ndim}
        if sizes - {1}:
            raise checks.InvalidArgumentError(
                f"remove_batch_dim needs a cache of one prompt; this one has batch size {max(sizes)}."
            )
        self.cache_dict = {k: v[0] if v.ndim else v for k, v in self.cache_dict.items()}
        self.real_tokens = None if self.real_tokens is None else self.real_tokens[0]
        self.has_batch_dim = False
        return self

    def apply_slice_to_batch_dim(self, batch_slice: PosSlice) -> ActivationCache:
        """A new cache of the prompts `batch_slice` selects (an int drops the batch dim)."""
        if not self.has_batch_dim:
            raise ValueError("This cache has no batch dim (remove_batch_dim was called).")
        index = _pos_index(batch_slice)
        sliced = {
            k: v.index_select(0, index.to(v.device)) if isinstance(index, Tensor) else v[index]
            for k, v in self.cache_dict.items()
        }
        real = self.real_tokens
        real = None if real is None else _index_dim(real, 0, index)
        return ActivationCache(sliced, self.model, has_batch_dim=not isinstance(index, int), real_tokens=real)

    def _layer(self, layer: int | None) -> int:
        """A residual-stream index in [0, n_layers]: None and -1 mean n_layers (the final stream). Other
        negative layers are refused: TransformerLens reads them as an empty range (or fails)."""
        n_layers = self.model.cfg.n_layers
        if layer is None or layer == -1:
            return n_layers
        if not 0 <= layer <= n_layers:
            meant = f"; from the end, pass layer={layer + n_layers + 1}" if -n_layers - 1 <= layer < 0 else ""
            raise ValueError(
                f"layer={layer} is outside [0, {n_layers}] (None or -1: the final stream); TransformerLens "
                f"does not count other negative layers from the end{meant}"
            )
        return layer

    # --- the residual stream as a sum of components ---------------------------------------------

    def accumulated_resid(
        self,
        layer: int | None = None,
        incl_mid: bool = False,
        apply_ln: bool = False,
        pos_slice: PosSlice = None,
        mlp_input: bool = False,
        return_labels: bool = False,
        *,
        pos: Tensor | None = None,
    ) -> Stack | tuple[Stack, list[str]]:
        """The residual stream before each layer up to `layer` (default: all, plus the final one).

        Labels "0_pre", "0_mid" (incl_mid), ..., "final_post". With apply_ln, the final stream's
        norm is recomputed on each component (the logit lens); earlier layers use the cached scale.
        """
        cfg = self.model.cfg
        layer = self._layer(layer)
        parts, labels = [], []
        for i in range(layer + 1):
            if i == cfg.n_layers:
                parts.append(self["resid_post", cfg.n_layers - 1])
                labels.append("final_post")
                break
            parts.append(self["resid_pre", i])
            labels.append(f"{i}_pre")
            if (incl_mid and i < layer) or (mlp_input and i == layer):
                parts.append(self["resid_mid", i])
                labels.append(f"{i}_mid")
        stack = torch.stack([self._select(p, pos_slice, pos) for p in parts])
        if apply_ln:
            recompute = layer == cfg.n_layers
            stack = self.apply_ln_to_stack(
                stack, layer, mlp_input, pos_slice, recompute_ln=recompute, pos=pos
            )
        return (stack, labels) if return_labels else stack

    def decompose_resid(
        self,
        layer: int | None = None,
        mlp_input: bool = False,
        mode: Literal["all", "mlp", "attn"] = "all",
        apply_ln: bool = False,
        pos_slice: PosSlice = None,
        incl_embeds: bool = True,
        return_labels: bool = False,
        *,
        pos: Tensor | None = None,
    ) -> Stack | tuple[Stack, list[str]]:
        """The residual stream before `layer` (default: the final one) as the sum of its writers.

        Components: "embed" (plus "pos_embed"), then each earlier layer's "L_attn_out" and
        "L_mlp_out" (`mode` keeps only "attn" or "mlp" ones; with `mlp_input`, also layer `layer`'s
        attention output). With everything included they sum exactly to resid_pre of `layer`
        (resid_mid with `mlp_input`, the final resid_post by default).
        """
        cfg = self.model.cfg
        layer = self._layer(layer)
        incl_attn, incl_mlp = mode != "mlp", mode != "attn" and not cfg.attn_only
        parts, labels = [], []
        if incl_embeds:
            for name in self._embedding_components():
                parts.append(self[f"hook_{name}"])
                labels.append(name)
        for i in range(layer):
            if incl_attn:
                parts.append(self["attn_out", i])
                labels.append(f"{i}_attn_out")
            if incl_mlp:
                parts.append(self["mlp_out", i])
                labels.append(f"{i}_mlp_out")
        if mlp_input and incl_attn:
            parts.append(self["attn_out", layer])
            labels.append(f"{layer}_attn_out")
        stack = torch.stack([self._select(p, pos_slice, pos) for p in parts])
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, mlp_input, pos_slice, pos=pos)
        return (stack, labels) if return_labels else stack

    def _embedding_components(self) -> list[str]:
        """The cached embeddings that write the residual stream ("embed", "pos_embed"). A shortformer
        model's positions do not, yet TransformerLens lists them (its components then do not sum to the
        residual stream): refused rather than a stack of other components than TL's."""
        names = [name for name in ("embed", "pos_embed") if f"hook_{name}" in self.cache_dict]
        if "pos_embed" in names and self.model.cfg.positional == "shortformer":
            raise ValueError(
                "This shortformer model's positions (hook_pos_embed) are not in the residual stream, so they "
                "are no component of it; TransformerLens would list them anyway. Cache without them "
                "(names_filter=lambda name: name != 'hook_pos_embed'), or pass incl_embeds=False."
            )
        return names

    def _head_result(self, layer: int) -> Float[Tensor, "*batch pos head d_model"]:
        """Each head's output z_h W_O[h] (no b_O): cached hook_result, else computed from hook_z."""
        name = f"blocks.{layer}.attn.hook_result"
        if name in self.cache_dict:
            return self.cache_dict[name]
        z = self["z", layer]  # [*batch, pos, head, d_head]
        W_O = module_weight(self.model.blocks[layer].attn, "W_O", z.device)  # read in if offloaded
        return torch.einsum("...he,hed->...hd", z, W_O)

    def _head_outputs_at(self, layer: int, pos_slice: PosSlice, pos: Tensor | None) -> Tensor:
        """Each head's output z_h W_O[h] at the positions read, [head, *batch_and_pos, d_model]: cached
        hook_result's, else hook_z's selected first, then through W_O."""
        name = f"blocks.{layer}.attn.hook_result"
        if name in self.cache_dict:
            return self._select(self.cache_dict[name].movedim(-2, 0), pos_slice, pos)
        z = self._select(self["z", layer].movedim(-2, 0), pos_slice, pos)  # [head, *batch_and_pos, d_head]
        W_O = module_weight(self.model.blocks[layer].attn, "W_O", z.device)  # read in if offloaded
        return torch.einsum("h...e,hed->h...d", z, W_O)

    def compute_head_results(self) -> None:
        """Add each layer's hook_result (per-head outputs) to the cache, computed from hook_z."""
        for layer in range(self.model.cfg.n_layers):
            self.cache_dict[f"blocks.{layer}.attn.hook_result"] = self._head_result(layer)

    def stack_head_results(
        self,
        layer: int = -1,
        return_labels: bool = False,
        incl_remainder: bool = False,
        pos_slice: PosSlice = None,
        apply_ln: bool = False,
        *,
        pos: Tensor | None = None,
    ) -> Stack | tuple[Stack, list[str]]:
        """Each head's output (z_h W_O[h], without b_O) in layers before `layer`, labelled "L0H3".

        `incl_remainder` adds the rest of the residual stream (resid_post of layer - 1 minus the
        heads) as a last component, "remainder"; at layer 0, as in TransformerLens, the final
        residual stream (its index layer - 1 is -1). Refused on post-norm models, whose heads' outputs
        are no parts of the residual stream (TransformerLens returns them anyway):
        `stack_head_contributions` is their linearised share.
        """
        checks.check_heads_add_up(
            self.model.cfg,
            "stack_head_results splits the residual stream into each head's output",
            "stack_head_contributions gives each head's share with ln1_post frozen at this run's scale (a "
            "linearisation; cache blocks.L.ln1_post.hook_scale too: model.head_contribution_hook_names()); "
            "decompose_resid splits it into each layer's hook_attn_out, which add up; or patch/ablate heads "
            "at hook_z.",
        )
        return self.stack_head_contributions(
            layer, return_labels, incl_remainder, pos_slice, apply_ln, pos=pos
        )

    def stack_head_contributions(
        self,
        layer: int = -1,
        return_labels: bool = False,
        incl_remainder: bool = False,
        pos_slice: PosSlice = None,
        apply_ln: bool = False,
        *,
        pos: Tensor | None = None,
    ) -> Stack | tuple[Stack, list[str]]:
        """Each head's contribution to the residual stream in layers before `layer`, labelled "L0H3";
        arguments as `stack_head_results`. Where attention outputs join the stream as they are, each
        head's output z_h W_O[h] (`stack_head_results`'s stack). In a post-norm model (Gemma 2 and 3,
        OLMo 2), which normalises each attention output as a whole (ln1_post), each head's share of it
        with the norm frozen at this run's scale, w * z_h W_O[h] / s (`Block.head_contributions`): the
        standard linearisation, as TransformerLens freezes the final norm for direct logit attribution.
        The shares add up exactly to each attention output (less its normalised b_O and ln1_post's
        bias) in this run; they are not what removing a head would change, which also moves the scale.
        Reads hook_z (or hook_result) and, post-norm, ln1_post.hook_scale of each layer
        (`model.head_contribution_hook_names()`).
        """
        cfg = self.model.cfg
        layer = self._layer(layer)
        parts, labels = [], []
        for i in range(layer):
            result = self._head_outputs_at(i, pos_slice, pos)  # [head, *batch_and_pos, d_model]
            if cfg.post_norm:
                scale = self._select(self[f"blocks.{i}.ln1_post.hook_scale"], pos_slice, pos)
                result = self.model.blocks[i].head_contributions(result.movedim(0, -2), scale).movedim(-2, 0)
            parts.append(result)
            labels += [f"L{i}H{h}" for h in range(cfg.n_heads)]
        return self._finish_stack(
            parts, labels, layer, incl_remainder, apply_ln, return_labels, pos_slice, pos
        )

    def _finish_stack(
        self,
        parts: list[Tensor],
        labels: list[str],
        layer: int,
        incl_remainder: bool,
        apply_ln: bool,
        return_labels: bool,
        pos_slice: PosSlice,
        pos: Tensor | None,
    ) -> Stack | tuple[Stack, list[str]]:
        """Concatenate per-component parts [component, ...] of the stream before `layer`, with the
        remainder of resid (if asked), normalised by the norm that reads it (if asked)."""
        stack = torch.cat(parts) if parts else self._select(self["hook_embed"], pos_slice, pos)[None][:0]
        if incl_remainder:
            # TransformerLens's: resid_post of layer - 1, so at layer 0 (no components) the final stream
            resid = self._select(self["resid_post", layer - 1], pos_slice, pos)
            stack = torch.cat([stack, (resid - stack.sum(0))[None]])
            labels.append("remainder")
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, pos_slice=pos_slice, pos=pos)
        return (stack, labels) if return_labels else stack

    def get_neuron_results(
        self,
        layer: int,
        neuron_slice: PosSlice = None,
        pos_slice: PosSlice = None,
        *,
        pos: Tensor | None = None,
    ) -> Float[Tensor, "*batch_and_pos neuron d_model"]:
        """Each neuron's contribution post[n] W_out[n] to the residual stream (not cached)."""
        post = self._select(self["post", layer], pos_slice, pos)  # [*batch_and_pos, d_mlp]
        W_out = self.model.blocks[layer].mlp.W_out  # [d_mlp, d_model]
        index = _pos_index(neuron_slice)
        if isinstance(index, Tensor):
            post, W_out = post.index_select(-1, index.to(post.device)), W_out[index]
        else:
            post, W_out = post[..., index], W_out[index]
            if isinstance(index, int):
                post, W_out = post[..., None], W_out[None]
        return post[..., None] * W_out

    def stack_neuron_results(
        self,
        layer: int,
        pos_slice: PosSlice = None,
        neuron_slice: PosSlice = None,
        return_labels: bool = False,
        incl_remainder: bool = False,
        apply_ln: bool = False,
        *,
        pos: Tensor | None = None,
    ) -> Stack | tuple[Stack, list[str]]:
        """Every neuron's output in layers before `layer`, labelled "L0N5" (memory: neurons x d_model)."""
        layer = self._layer(layer)
        d_mlp = self.model.cfg.d_mlp
        neurons = torch.arange(d_mlp)[_pos_index(neuron_slice)].reshape(-1).tolist()
        parts, labels = [], []
        for i in range(layer):
            parts.append(self.get_neuron_results(i, neuron_slice, pos_slice, pos=pos).movedim(-2, 0))
            labels += [f"L{i}N{n}" for n in neurons]
        return self._finish_stack(
            parts, labels, layer, incl_remainder, apply_ln, return_labels, pos_slice, pos
        )

    def stack_activation(
        self, activation_name: str, layer: int = -1, sublayer_type: str | None = None
    ) -> Float[Tensor, "layer ..."]:
        """One activation of every layer before `layer`, stacked: e.g. stack_activation("pattern")."""
        return torch.stack([self[activation_name, i, sublayer_type] for i in range(self._layer(layer))])

    def get_full_resid_decomposition(
        self,
        layer: int | None = None,
        mlp_input: bool = False,
        expand_neurons: bool = True,
        apply_ln: bool = False,
        pos_slice: PosSlice = None,
        return_labels: bool = False,
        *,
        pos: Tensor | None = None,
    ) -> Stack | tuple[Stack, list[str]]:
        """The residual stream before `layer` split into every head, every neuron (or each MLP with
        expand_neurons=False), "embed", "pos_embed" and the summed biases ("bias"). Sums exactly to it.
        """
        cfg = self.model.cfg
        layer = self._layer(layer)
        heads, labels = self.stack_head_results(layer + int(mlp_input), True, pos_slice=pos_slice, pos=pos)
        parts = [heads]
        if not cfg.attn_only and layer > 0:
            if expand_neurons:
                mlps, mlp_labels = self.stack_neuron_results(layer, pos_slice, return_labels=True, pos=pos)
            else:
                mlps, mlp_labels = self.decompose_resid(
                    layer, mode="mlp", pos_slice=pos_slice, incl_embeds=False, return_labels=True, pos=pos
                )
            parts.append(mlps)
            labels += mlp_labels
        for name in self._embedding_components():
            parts.append(self._select(self[f"hook_{name}"], pos_slice, pos)[None])
            labels.append(name)
        bias = self.model.accumulated_bias(layer, mlp_input, include_mlp_biases=expand_neurons)
        parts.append(bias.to(heads.dtype).expand(1, *heads.shape[1:]))
        labels.append("bias")
        stack = torch.cat(parts)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, mlp_input, pos_slice, pos=pos)
        return (stack, labels) if return_labels else stack

    def apply_ln_to_stack(
        self,
        residual_stack: Stack,
        layer: int | None = None,
        mlp_input: bool = False,
        pos_slice: PosSlice = None,
        batch_slice: PosSlice = None,
        has_batch_dim: bool = True,
        recompute_ln: bool = False,
        *,
        pos: Tensor | None = None,
    ) -> Stack:
        """Apply the norm before `layer` (default: ln_final) linearly, with its cached scale.

        Each component is centred (LayerNorm), divided by the scale the norm computed on the full
        residual stream, and multiplied by the norm's weight when it is not folded (TransformerLens
        omits the weight; with folded norms, its default, the two agree). The norm's bias is a
        constant and is left out. `pos_slice`/`pos` say which positions the stack holds (already
        applied to it); `recompute_ln` at the final layer instead runs ln_final on each component.
        """
        n_layers = self.model.cfg.n_layers
        layer = self._layer(layer)
        batch_index = _pos_index(batch_slice)
        if has_batch_dim and batch_slice is not None:
            residual_stack = _index_dim(residual_stack, 1, batch_index)
        if layer == n_layers:
            if mlp_input:
                raise ValueError("mlp_input=True needs a layer before the final one (ln_final has no MLP).")
            norm, scale_name = self.model.ln_final, "ln_final.hook_scale"
        else:
            sub = "ln2" if mlp_input else "ln1"
            if not self.model.cfg.pre_norm:
                return residual_stack  # no norm before attention or MLP (OLMo 2): they read the stream as is
            norm, scale_name = getattr(self.model.blocks[layer], sub), f"blocks.{layer}.{sub}.hook_scale"
        if norm.identity:
            return residual_stack  # a model without norms reads the stream as is
        if recompute_ln and layer == n_layers:
            stack = norm(residual_stack)
        else:
            rows = batch_slice if self.has_batch_dim and pos is None else None  # the prompts the stack holds
            scale = self._select(self._one_scale(scale_name), pos_slice, pos, rows)
            if batch_slice is not None and self.has_batch_dim:  # the scale has prompts, the stack may not
                scale = _index_dim(scale, 0, batch_index)
            elif not has_batch_dim and self.has_batch_dim and scale.shape[0] > 1:
                raise ValueError(
                    f"the stack has no batch dim (has_batch_dim=False) but the cache holds {scale.shape[0]} "
                    "prompts, whose norm scales differ: pass batch_slice= (the prompt the stack is of, as "
                    "TransformerLens), or the stack with its batch dim"
                )
            if (
                has_batch_dim
                and self.has_batch_dim
                and scale.ndim == 2  # one position per prompt (an int pos_slice, or pos=): [batch, 1]
                and residual_stack.ndim >= 2
                and residual_stack.shape[-2] != scale.shape[0]
            ):
                raise checks.InvalidArgumentError(
                    f"pos_slice={pos_slice!r} (or pos=) says the stack holds one position per prompt, but "
                    f"its shape {tuple(residual_stack.shape)} is not [..., batch={scale.shape[0]}, d_model]: "
                    "pos_slice names the positions already taken from the stack (TransformerLens's "
                    "contract). Slice the stack too (e.g. decompose_resid(pos_slice=-1)), or pass "
                    "pos_slice=None for a stack over every position"
                )
            stack = norm.apply_to_stack(residual_stack, scale)
        _NORMALISED[id(stack)] = stack
        return stack

    def _one_scale(self, name: str) -> Tensor:
        """The cached norm scale `name` [batch, pos, 1]; ln1's cached per head ([batch, pos, head, 1],
        with use_split_qkv_input) is the same for every head unless their inputs were edited."""
        scale = self[name]
        if scale.dim() < (4 if self.has_batch_dim else 3):
            return scale
        if not bool((scale == scale[..., :1, :]).all()):
            raise ValueError(
                f"{name} differs between heads (their inputs were edited), so no one scale applies to the "
                "residual stream: cache a run without those edits, or with use_split_qkv_input off"
            )
        return scale[..., 0, :]

    def logit_attrs(
        self,
        residual_stack: Stack,
        tokens: Tokens,
        incorrect_tokens: Tokens | None = None,
        pos_slice: PosSlice = None,
        batch_slice: PosSlice = None,
        has_batch_dim: bool = True,
        *,
        pos: Tensor | None = None,
    ) -> Float[Tensor, "component ..."]:
        """Direct logit attribution: each component's contribution to the logit of `tokens` (minus
        that of `incorrect_tokens`), through the final norm's cached scale, which this applies
        itself, as TransformerLens does: pass a raw stack (e.g. decompose_resid(pos_slice=-1)) and
        the positions it holds.
        """
        cap = self.model.cfg.output_logits_soft_cap
        if cap is not None:
            raise ValueError(
                f"{self.model.cfg.model_name} soft-caps its logits ({cap} * tanh(logits / {cap})), so "
                "logits are not a sum of per-component contributions and direct logit attribution "
                "cannot add up to the logit difference. Patch or ablate components instead."
            )
        if _NORMALISED.get(id(residual_stack)) is residual_stack:
            raise ValueError(
                "This stack has been through apply_ln_to_stack already, and logit_attrs applies the "
                "final norm itself (as in TransformerLens). Pass the stack from before apply_ln "
                "(e.g. decompose_resid(..., apply_ln=False)), or dot the normalised stack with "
                "model.tokens_to_residual_directions(tokens) yourself."
            )
        directions = self.model.tokens_to_residual_directions(tokens)
        if incorrect_tokens is not None:
            shape, wrong = (
                torch.as_tensor(0 if isinstance(t, str) else t).shape for t in (tokens, incorrect_tokens)
            )
            if shape != wrong:
                raise ValueError(
                    f"tokens and incorrect_tokens differ in shape: {tuple(shape)} vs {tuple(wrong)}."
                )
            directions = directions - self.model.tokens_to_residual_directions(incorrect_tokens)
        stack = self.apply_ln_to_stack(
            residual_stack,
            -1,
            pos_slice=pos_slice,
            batch_slice=batch_slice,
            has_batch_dim=has_batch_dim,
            pos=pos,
        )
        per_prompt = directions.ndim == 2 and directions.shape[0] == stack.shape[1]
        if has_batch_dim and stack.ndim == 4 and per_prompt and not isinstance(_pos_index(batch_slice), int):
            directions = directions.unsqueeze(-2)  # [batch, 1, d_model]: broadcast over positions
        try:
            torch.broadcast_shapes(stack.shape, directions.shape)
        except RuntimeError:
            raise ValueError(
                f"logit_attrs takes a stack [component, batch, (pos,) d_model] and tokens [batch] (one per "
                f"prompt) or [batch, pos]; got a stack {tuple(residual_stack.shape)} and token directions "
                f"{tuple(directions.shape)}. A residual stream [batch, pos, d_model] is one component: pass "
                "resid[None] (and pos_slice= for the positions it holds)"
            ) from None
        return (stack * directions.to(stack.dtype)).sum(-1)


def _index_dim(x: Tensor, dim: int, index: int | slice | Tensor) -> Tensor:
    if isinstance(index, Tensor):
        return x.index_select(dim, index.to(x.device))
    return x[(slice(None),) * dim + (index,)]
