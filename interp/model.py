"""A hookable decoder-only transformer.

Every activation passes through a `HookPoint` named as in TransformerLens
(`blocks.{L}.attn.hook_pattern`, ...). The forward pass, for tokens t of shape [batch, pos]:

  1. x = W_E[t] (+ W_pos[positions] for learned positions)              # [batch, pos, d_model]
  2. for each block L:
       sequential:  x = x + Attn(LN1(x));  x = x + MLP(LN2(x))
       parallel:    x = x + Attn(LN1(x)) + MLP(LN2(x))                    (GPT-NeoX)
       attn-only:   x = x + Attn(LN1(x))
  3. logits = LN_final(x) @ W_U + b_U                                    # [batch, pos, d_vocab]

Attention (per query head h; key/value head h // group_size under grouped-query attention):
  q = x W_Q[h] + b_Q[h],  k = x W_K + b_K,  v = x W_V + b_V              # [batch, pos, head, d_head]
  (rotary models rotate the first `rotary_dim` dims of q and k)
  scores = q k^T / sqrt(d_head), causally masked                        # [batch, head, q_pos, k_pos]
  z = softmax(scores) v;  out = sum_h z[h] W_O[h] + b_O                  # [batch, pos, d_model]
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from interp.cache import ActivationCache
from interp.config import Config
from interp.devices import module_weight

ReturnType = Literal["logits", "loss", "both"] | None
Hook = tuple[str | Callable[[str], bool], Callable]
ModelInput = str | Sequence[str] | Tensor

# ---------------------------------------------------------------------------------------------
# Building blocks


def _upcast(x: Tensor) -> Tensor:
    """At least float32 (bf16/fp16 norms, softmaxes and rotations are computed in float32)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


class Norm(nn.Module):
    """LayerNorm or RMSNorm with hooks on the scale and the normalised output.

    hook_scale: [batch, pos, 1] (the divisor: sqrt(var + eps) or sqrt(mean(x^2) + eps));
    hook_normalized: [batch, pos, d_model] (after the elementwise weight and bias).
    Computed in float32 and cast back, as `transformers` does. After `fold_ln` the norm has no
    weight or bias (they live in the next layer's weights).
    """

    def __init__(self, cfg: Config):
        super().__init__()
        self.center = cfg.normalization == "layernorm"
        self.eps = cfg.norm_eps
        self.w = nn.Parameter(torch.ones(cfg.d_model)) if not cfg.norm_folded else None
        has_bias = self.center and not cfg.norm_folded
        self.b = nn.Parameter(torch.zeros(cfg.d_model)) if has_bias else None
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        dtype = x.dtype
        x = _upcast(x)
        if self.center:
            x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        x = (x / scale).to(dtype)
        if self.w is not None:
            x = x * self.w
        if self.b is not None:
            x = x + self.b
        return self.hook_normalized(x)


def rotary_inv_freq(rotary_dim: int, base: float) -> Float[Tensor, " rotary_dim_half"]:
    """Inverse frequencies of rotary position embeddings (Su et al. 2021), one per dim pair."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float32, device="cpu") / rotary_dim
    return 1.0 / (base**exponents)


def apply_rotary(
    x: Float[Tensor, "batch pos head d_head"],
    cos: Float[Tensor, "pos rotary_dim"],
    sin: Float[Tensor, "pos rotary_dim"],
) -> Float[Tensor, "batch pos head d_head"]:
    """Rotate the first rotary_dim dims of each head, in halves (GPT-NeoX / Llama convention)."""
    rotary_dim = cos.shape[-1]
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated_half = torch.cat([-x_rot[..., half:], x_rot[..., :half]], dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    x_rot = (_upcast(x_rot) * cos + _upcast(rotated_half) * sin).to(x.dtype)
    return torch.cat([x_rot, x_pass], dim=-1)


class Attention(nn.Module):
    """Multi-head (optionally grouped-query) causal self-attention with a hook on every step."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        h, kv, d, e = cfg.n_heads, cfg.n_kv_heads, cfg.d_model, cfg.d_head
        self.W_Q = nn.Parameter(torch.empty(h, d, e))
        self.W_K = nn.Parameter(torch.empty(kv, d, e))
        self.W_V = nn.Parameter(torch.empty(kv, d, e))
        self.W_O = nn.Parameter(torch.empty(h, e, d))
        self.b_Q = nn.Parameter(torch.zeros(h, e)) if cfg.qkv_bias else None
        self.b_K = nn.Parameter(torch.zeros(kv, e)) if cfg.qkv_bias else None
        self.b_V = nn.Parameter(torch.zeros(kv, e)) if cfg.qkv_bias else None
        self.b_O = nn.Parameter(torch.zeros(d)) if cfg.attn_out_bias else None
        if cfg.positional == "rotary":
            # A plain float32 attribute, not a buffer: casting the model to bf16 must not round it.
            if cfg.rotary_inv_freq is not None:
                self.rotary_inv_freq = torch.tensor(cfg.rotary_inv_freq, dtype=torch.float32, device="cpu")
            else:
                self.rotary_inv_freq = rotary_inv_freq(cfg.rotary_dim, cfg.rotary_base)
            self.hook_rot_q = HookPoint()
            self.hook_rot_k = HookPoint()
        for name in ["q", "k", "v", "attn_scores", "pattern", "z", "result"]:
            setattr(self, f"hook_{name}", HookPoint())

    def _project(self, x: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
        """x: [batch, pos, d_model] or per-head [batch, pos, head, d_model] -> [batch, pos, head, d_head]."""
        if x.ndim == 4:
            out = torch.einsum("bphd,hde->bphe", x, W)
        else:
            n, d, e = W.shape
            out = (x @ W.permute(1, 0, 2).reshape(d, n * e)).view(*x.shape[:2], n, e)
        return out if b is None else out + b

    def _rotary_cos_sin(self, positions: Int[Tensor, " pos"]) -> tuple[Tensor, Tensor]:
        inv_freq = self.rotary_inv_freq.to(positions.device)
        angles = positions.float()[:, None] * inv_freq[None, :]  # [pos, rotary_dim/2], float32
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos(), angles.sin()

    def _needs_explicit_pattern(self) -> bool:
        """Whether anything observes the attention scores or pattern (else fused SDPA is used)."""
        return bool(
            self.hook_attn_scores._forward_hooks
            or self.hook_pattern._forward_hooks
            or self.hook_attn_scores._backward_hooks
            or self.hook_pattern._backward_hooks
        )

    def forward(
        self,
        q_input: Float[Tensor, "batch pos d_model"] | Float[Tensor, "batch pos head d_model"],
        k_input: Float[Tensor, "batch pos d_model"] | Float[Tensor, "batch pos kv_head d_model"],
        v_input: Float[Tensor, "batch pos d_model"] | Float[Tensor, "batch pos kv_head d_model"],
        past_kv: dict[str, Tensor] | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        cfg = self.cfg
        q = self.hook_q(self._project(q_input, self.W_Q, self.b_Q))  # [batch, pos, head, d_head]
        k = self.hook_k(self._project(k_input, self.W_K, self.b_K))  # [batch, pos, kv_head, d_head]
        v = self.hook_v(self._project(v_input, self.W_V, self.b_V))  # [batch, pos, kv_head, d_head]
        offset = 0 if past_kv is None or "k" not in past_kv else past_kv["k"].shape[1]
        if cfg.positional == "rotary":
            positions = torch.arange(offset, offset + q.shape[1], device=q.device)
            cos, sin = self._rotary_cos_sin(positions)
            q = self.hook_rot_q(apply_rotary(q, cos, sin))
            k = self.hook_rot_k(apply_rotary(k, cos, sin))
        if past_kv is not None:
            if offset:
                k = torch.cat([past_kv["k"], k], dim=1)
                v = torch.cat([past_kv["v"], v], dim=1)
            past_kv["k"], past_kv["v"] = k, v
        if cfg.group_size > 1:
            k = k.repeat_interleave(cfg.group_size, dim=2)  # [batch, key_pos, head, d_head]
            v = v.repeat_interleave(cfg.group_size, dim=2)
        q_pos, k_pos = q.shape[1], k.shape[1]
        if self._needs_explicit_pattern():
            scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(cfg.d_head)
            future = torch.ones(q_pos, k_pos, dtype=torch.bool, device=q.device).triu(offset + 1)
            scores = self.hook_attn_scores(scores.masked_fill(future, float("-inf")))
            pattern = self.hook_pattern(_upcast(scores).softmax(dim=-1).to(q.dtype))
            z = torch.einsum("bhqk,bkhe->bqhe", pattern, v)
        else:
            z = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=offset == 0
            ).transpose(1, 2)
        z = self.hook_z(z)  # [batch, pos, head, d_head]
        if cfg.use_attn_result:
            result = self.hook_result(torch.einsum("bqhe,hed->bqhd", z, self.W_O))
            out = result.sum(dim=2)
        else:
            h, e, d = self.W_O.shape
            out = z.reshape(*z.shape[:2], h * e) @ self.W_O.reshape(h * e, d)
        return out if self.b_O is None else out + self.b_O


_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "relu": F.relu,
}


class MLP(nn.Module):
    """Feed-forward layer: act(x W_in + b_in) W_out + b_out, or gated: (act(x W_gate) * x W_in) W_out
    (SwiGLU with act = silu; biases where the architecture has them).

    Hooks: hook_pre (the activation's input; the gate in gated MLPs), hook_pre_linear (gated only),
    hook_post (what W_out reads). All [batch, pos, d_mlp].
    """

    def __init__(self, cfg: Config):
        super().__init__()
        self.act = _ACTIVATIONS[cfg.activation]
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp)) if cfg.mlp_bias else None
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model)) if cfg.mlp_bias else None
        self.W_gate = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp)) if cfg.gated_mlp else None
        self.b_gate = nn.Parameter(torch.zeros(cfg.d_mlp)) if cfg.gated_mlp and cfg.mlp_bias else None
        self.hook_pre = HookPoint()
        if cfg.gated_mlp:
            self.hook_pre_linear = HookPoint()
        self.hook_post = HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        linear = x @ self.W_in
        if self.b_in is not None:
            linear = linear + self.b_in
        if self.W_gate is None:
            post = self.hook_post(self.act(self.hook_pre(linear)))
        else:
            gate = x @ self.W_gate
            gate = self.hook_pre(gate if self.b_gate is None else gate + self.b_gate)
            post = self.hook_post(self.act(gate) * self.hook_pre_linear(linear))
        out = post @ self.W_out
        return out if self.b_out is None else out + self.b_out


class Block(nn.Module):
    """One transformer block; see the module docstring for the residual wiring.

    With `use_split_qkv_input`, ln1 runs separately on the per-head query, key and value inputs, so
    its hooks fire three times per forward (a cache keeps the value input's, [batch, pos, kv_head, 1]).
    """

    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.ln1 = Norm(cfg)
        self.attn = Attention(cfg)
        if not cfg.attn_only:
            self.ln2 = Norm(cfg)
            self.mlp = MLP(cfg)
        names = ["resid_pre", "attn_out", "resid_post", "q_input", "k_input", "v_input"]
        if not cfg.attn_only:
            names += ["mlp_out"] + ([] if cfg.parallel_residual else ["resid_mid"])
        for name in names:
            setattr(self, f"hook_{name}", HookPoint())

    def forward(
        self, resid_pre: Float[Tensor, "batch pos d_model"], past_kv: dict | None = None
    ) -> Float[Tensor, "batch pos d_model"]:
        cfg = self.cfg
        resid_pre = self.hook_resid_pre(resid_pre)
        if cfg.use_split_qkv_input:
            q_in = self.hook_q_input(_per_head(resid_pre, cfg.n_heads))
            k_in = self.hook_k_input(_per_head(resid_pre, cfg.n_kv_heads))
            v_in = self.hook_v_input(_per_head(resid_pre, cfg.n_kv_heads))
            attn_out = self.attn(self.ln1(q_in), self.ln1(k_in), self.ln1(v_in), past_kv=past_kv)
        else:
            normed = self.ln1(resid_pre)
            attn_out = self.attn(normed, normed, normed, past_kv=past_kv)
        attn_out = self.hook_attn_out(attn_out)
        if cfg.attn_only:
            return self.hook_resid_post(resid_pre + attn_out)
        if cfg.parallel_residual:
            mlp_out = self.hook_mlp_out(self.mlp(self.ln2(resid_pre)))
            return self.hook_resid_post(resid_pre + attn_out + mlp_out)
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(resid_mid)))
        return self.hook_resid_post(resid_mid + mlp_out)


def _per_head(x: Float[Tensor, "batch pos d_model"], n: int) -> Float[Tensor, "batch pos n d_model"]:
    return x.unsqueeze(2).expand(-1, -1, n, -1)


# ---------------------------------------------------------------------------------------------
# The model


class HookedTransformer(HookedRootModule):
    """A decoder-only transformer with TransformerLens hook names. See the module docstring.

    `tokenizer` is a `transformers` tokenizer, or None for models that work on token ids only.
    """

    def __init__(self, cfg: Config, tokenizer: Any = None):
        super().__init__()
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))
        self.hook_embed = HookPoint()
        if cfg.positional == "learned":
            self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model))
            self.hook_pos_embed = HookPoint()
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_final = Norm(cfg)
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab))
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab)) if cfg.unembed_bias else None
        self.init_weights()
        self.setup()

    # --- weights -------------------------------------------------------------------------------

    def init_weights(self, seed: int | None = None) -> None:
        """Normal(0, init_std) weights, GPT-2 style (output projections scaled by 1/sqrt(2 n_layers))."""
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        std = self.cfg.init_std
        for name, param in self.named_parameters():
            if name.split(".")[-1].startswith("W_"):
                scale = std / math.sqrt(2 * self.cfg.n_layers) if name.endswith(("W_O", "W_out")) else std
                with torch.no_grad():
                    param.copy_(torch.randn(param.shape, generator=generator) * scale)

    def _stack(self, attr: str, module: str = "attn") -> Tensor:
        """One weight of every block, stacked on the model's device (offloaded blocks are read in)."""
        return torch.stack([module_weight(getattr(b, module), attr, self.device) for b in self.blocks])

    @property
    def W_Q(self) -> Float[Tensor, "layer head d_model d_head"]:
        return self._stack("W_Q")

    @property
    def W_K(self) -> Float[Tensor, "layer head d_model d_head"]:
        """Per query head: under grouped-query attention each key head is repeated for its group."""
        return self._stack("W_K").repeat_interleave(self.cfg.group_size, dim=1)

    @property
    def W_V(self) -> Float[Tensor, "layer head d_model d_head"]:
        """Per query head, as W_K."""
        return self._stack("W_V").repeat_interleave(self.cfg.group_size, dim=1)

    @property
    def W_O(self) -> Float[Tensor, "layer head d_head d_model"]:
        return self._stack("W_O")

    @property
    def OV(self) -> Float[Tensor, "layer head d_model d_model"]:
        """W_V W_O per head: what a head writes to the residual stream for what it reads."""
        return self.W_V @ self.W_O

    @property
    def QK(self) -> Float[Tensor, "layer head d_model d_model"]:
        """W_Q W_K^T per head: the bilinear form of attention scores (before rotary positions)."""
        return self.W_Q @ self.W_K.transpose(-1, -2)

    @property
    def device(self) -> torch.device:
        return self.W_E.device

    @property
    def dtype(self) -> torch.dtype:
        return self.W_E.dtype

    # --- hooks ---------------------------------------------------------------------------------

    def check_hook_name(self, name: str) -> None:
        """Raise a KeyError naming the closest hook names if `name` is not a hook point."""
        opt_in = {"hook_result": "use_attn_result", "_input": "use_split_qkv_input"}
        if name in self.hook_dict:
            for suffix, setting in opt_in.items():
                if name.endswith(suffix) and not getattr(self.cfg, setting):
                    raise KeyError(
                        f"{name!r} is an opt-in hook: set model.cfg.{setting} = True "
                        f"(or use `with model.settings({setting}=True):`) to make it fire."
                    )
            return
        close = difflib.get_close_matches(name, self.hook_dict.keys(), n=5, cutoff=0.6)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"No hook point named {name!r}.{hint} List them with model.hook_dict.")

    def _enable_hook(self, name: str | Callable, hook: Callable, dir: str) -> None:
        if isinstance(name, str):
            self.check_hook_name(name)
        super()._enable_hook(name, hook, dir)

    def run_with_cache(
        self,
        input: ModelInput,
        names_filter: str | Sequence[str] | Callable[[str], bool] | None = None,
        device: str | torch.device | None = None,
        return_type: ReturnType = "logits",
        incl_bwd: bool = False,
        **forward_kwargs: Any,
    ) -> tuple[Any, ActivationCache]:
        """Run the model and cache activations of the hooks that `names_filter` selects.

        Only the selected hooks are cached (a single name costs no more than a forward pass).
        With return_type=None the forward stops after the last block a selected hook lives in.
        `device` moves each cached tensor as it is made (e.g. "cpu" to free GPU memory); `incl_bwd`
        also caches gradients under "<name>_grad" when the caller runs `.backward()` on the output.
        """
        names = self._resolve_names(names_filter)
        stop_early = (
            return_type is None
            and not incl_bwd
            and forward_kwargs.get("stop_at_layer") is None
            and forward_kwargs.get("past_kv") is None
            and self._blocks_needed(names) < self.cfg.n_layers
        )
        if stop_early:
            start = forward_kwargs.get("start_at_layer") or 0
            forward_kwargs["stop_at_layer"] = max(self._blocks_needed(names), start)
        cache: dict[str, Tensor] = {}

        def save(tensor: Tensor, hook: HookPoint) -> None:
            cache[hook.name] = tensor.detach().to(device) if device else tensor.detach()

        def save_grad(tensor: Tensor, hook: HookPoint) -> None:
            cache[f"{hook.name}_grad"] = tensor.detach().to(device) if device else tensor.detach()

        fwd = [(name, save) for name in names]
        bwd = [(name, save_grad) for name in names] if incl_bwd else []
        with self.hooks(fwd_hooks=fwd, bwd_hooks=bwd, reset_hooks_end=not incl_bwd):
            out = self(input, return_type=return_type, **forward_kwargs)
        return (None if stop_early else out), ActivationCache(cache, self)

    def _blocks_needed(self, names: Sequence[str]) -> int:
        """How many blocks a forward must run for every hook in `names` to fire (embedding hooks: 0)."""
        needed = 0
        for name in names:
            if name.startswith("blocks."):
                needed = max(needed, int(name.split(".")[1]) + 1)
            elif not name.startswith("hook_"):  # ln_final.*
                needed = self.cfg.n_layers
        return needed

    def _active_hook_names(self) -> list[str]:
        """Hook points that fire in the current settings (opt-in hooks only when enabled)."""
        names = list(self.hook_dict)
        if not self.cfg.use_attn_result:
            names = [n for n in names if not n.endswith("hook_result")]
        if not self.cfg.use_split_qkv_input:
            names = [n for n in names if not n.endswith("_input")]
        return names

    def _resolve_names(self, names_filter) -> list[str]:
        if names_filter is None:
            return self._active_hook_names()
        if isinstance(names_filter, str):
            names_filter = [names_filter]
        if callable(names_filter):
            return [name for name in self._active_hook_names() if names_filter(name)]
        for name in names_filter:
            self.check_hook_name(name)
        return list(names_filter)

    # --- forward -------------------------------------------------------------------------------

    def forward(
        self,
        input: ModelInput,
        return_type: ReturnType = "logits",
        loss_per_token: bool = False,
        prepend_bos: bool | None = None,
        start_at_layer: int | None = None,
        stop_at_layer: int | None = None,
        past_kv: list[dict] | None = None,
    ) -> Any:
        """Tokens [batch, pos] (or text) -> logits [batch, pos, d_vocab], loss, or both.

        `loss` is the mean next-token cross-entropy in nats ([batch, pos-1] with loss_per_token).
        `start_at_layer=L` takes the residual stream before block L ([batch, pos, d_model]) as
        input; `stop_at_layer=L` returns the residual stream before block L. `past_kv` is a list
        of per-layer dicts that caches keys and values across calls (for generation).
        """
        if start_at_layer is None:
            tokens = self._as_tokens(input, prepend_bos)
            residual = self._embed(tokens, past_kv)
            start_at_layer = 0
        else:
            tokens, residual = None, input
        for layer in range(start_at_layer, self.cfg.n_layers if stop_at_layer is None else stop_at_layer):
            residual = self.blocks[layer](residual, past_kv=None if past_kv is None else past_kv[layer])
        if stop_at_layer is not None or return_type is None:
            return residual if stop_at_layer is not None else None
        logits = self.unembed(self.ln_final(residual))
        if return_type == "logits":
            return logits
        if tokens is None:
            raise ValueError("return_type='loss' needs tokens; it cannot start at a layer.")
        loss = next_token_loss(logits, tokens, per_token=loss_per_token)
        return loss if return_type == "loss" else (logits, loss)

    def unembed(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_vocab"]:
        logits = x.to(self.W_U.device) @ self.W_U
        return logits if self.b_U is None else logits + self.b_U

    def _embed(self, tokens: Int[Tensor, "batch pos"], past_kv: list[dict] | None) -> Tensor:
        offset = 0 if not past_kv or "k" not in past_kv[0] else past_kv[0]["k"].shape[1]
        if offset + tokens.shape[1] > self.cfg.n_ctx:
            raise ValueError(
                f"The input has {offset + tokens.shape[1]} tokens but {self.cfg.model_name} has a "
                f"context of {self.cfg.n_ctx}; shorten or split the prompt."
            )
        residual = self.hook_embed(self.W_E[tokens])
        if self.cfg.positional == "learned":
            positions = torch.arange(offset, offset + tokens.shape[1], device=tokens.device)
            residual = residual + self.hook_pos_embed(self.W_pos[positions].expand_as(residual))
        return residual

    def _as_tokens(self, input: ModelInput, prepend_bos: bool | None) -> Int[Tensor, "batch pos"]:
        if isinstance(input, str) or (isinstance(input, Sequence) and not isinstance(input, Tensor)):
            return self.to_tokens(input, prepend_bos=prepend_bos)
        if not isinstance(input, Tensor):
            raise TypeError(f"Expected text or a tensor of token ids, got {type(input).__name__}.")
        if input.is_floating_point() or input.dtype == torch.bool:
            raise ValueError(
                f"Token ids must be an integer tensor, got dtype {input.dtype}. "
                "Pass token ids (e.g. from model.to_tokens), or embeddings via start_at_layer=0."
            )
        if input.ndim == 1:
            input = input[None]
        if input.ndim != 2:
            raise ValueError(f"Tokens must be [batch, pos] or [pos], got shape {tuple(input.shape)}.")
        if input.numel() and (input.min() < 0 or input.max() >= self.cfg.d_vocab):
            raise ValueError(
                f"Token ids must lie in [0, {self.cfg.d_vocab}); "
                f"got {input.min().item()}..{input.max().item()}."
            )
        return input.to(self.device).long()

    # --- tokenization --------------------------------------------------------------------------

    def _require_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise ValueError(
                f"{self.cfg.model_name} has no tokenizer: pass token ids instead of text, or attach one "
                "with model.tokenizer = transformers.AutoTokenizer.from_pretrained(...)."
            )
        return self.tokenizer

    def to_tokens(
        self, text: str | Sequence[str], prepend_bos: bool | None = None
    ) -> Int[Tensor, "batch pos"]:
        """Tokenize text (right-padded to the longest prompt) with this model's BOS policy.

        `prepend_bos=None` uses `cfg.default_prepend_bos`: what the model saw in training
        (GPT-2 and Pythia: <|endoftext|> first, as TransformerLens; Llama: <s>; SmolLM2 and Qwen: none).
        """
        tokenizer = self._require_tokenizer()
        texts = [text] if isinstance(text, str) else list(text)
        prepend_bos = self.cfg.default_prepend_bos if prepend_bos is None else prepend_bos
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        if prepend_bos:
            bos = self.cfg.bos_token_id if self.cfg.bos_token_id is not None else tokenizer.bos_token_id
            if bos is None:
                raise ValueError(
                    f"{self.cfg.model_name}'s tokenizer has no BOS token; use prepend_bos=False."
                )
            ids = [[bos, *row] for row in ids]
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        width = max(len(row) for row in ids)
        tokens = torch.full((len(ids), width), pad or 0, dtype=torch.long)
        for i, row in enumerate(ids):
            tokens[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        return tokens.to(self.device)

    def to_str_tokens(self, input: str | Tensor, prepend_bos: bool | None = None) -> list[str]:
        """One string per token of a single prompt (text or a [pos] / [1, pos] tensor)."""
        tokenizer = self._require_tokenizer()
        tokens = self.to_tokens(input, prepend_bos)[0] if isinstance(input, str) else input
        tokens = tokens.reshape(-1) if tokens.ndim == 2 and tokens.shape[0] == 1 else tokens
        if tokens.ndim != 1:
            raise ValueError(f"to_str_tokens takes one prompt; got shape {tuple(tokens.shape)}.")
        return [tokenizer.decode([t]) for t in tokens.tolist()]

    def to_single_token(self, text: str) -> int:
        """The id of `text` if it is exactly one token (mind the leading space: " Mary")."""
        ids = self._require_tokenizer()(text, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            pieces = [self.tokenizer.decode([i]) for i in ids]
            raise ValueError(
                f"{text!r} is {len(ids)} tokens in {self.cfg.model_name} ({pieces}), not one. "
                "Choose a single-token string (names usually need a leading space, e.g. ' Mary')."
            )
        return ids[0]

    def to_string(self, tokens: Int[Tensor, "... pos"]) -> str | list[str]:
        tokenizer = self._require_tokenizer()
        if tokens.ndim == 1:
            return tokenizer.decode(tokens.tolist())
        return [tokenizer.decode(row.tolist()) for row in tokens]

    # --- generation ----------------------------------------------------------------------------

    @torch.no_grad()
    def generate(
        self,
        input: str | Int[Tensor, "batch pos"],
        max_new_tokens: int = 20,
        temperature: float = 0.0,
        top_k: int | None = None,
        seed: int | None = None,
        stop_at_eos: bool = True,
        use_kv_cache: bool = True,
    ) -> str | Int[Tensor, "batch pos"]:
        """Greedy (temperature 0) or sampled continuation. Text in -> text out; tokens in -> tokens out.

        With the KV cache each new token costs one position's forward pass. Batched token input
        must share one length (no padding), since padding would sit between prompt and continuation.
        """
        tokens = self._as_tokens(input, None) if not isinstance(input, str) else self.to_tokens(input)
        generator = torch.Generator(device=tokens.device).manual_seed(seed) if seed is not None else None
        eos = self.tokenizer.eos_token_id if (self.tokenizer is not None and stop_at_eos) else None
        past_kv = [{} for _ in self.blocks] if use_kv_cache else None
        finished = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
        step_input = tokens
        for _ in range(max_new_tokens):
            logits = self(step_input if use_kv_cache else tokens, past_kv=past_kv)[:, -1].float()
            if temperature == 0:
                next_token = logits.argmax(-1)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = logits.topk(top_k, dim=-1).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                next_token = torch.multinomial(logits.softmax(-1), 1, generator=generator)[:, 0]
            if eos is not None:
                next_token = torch.where(finished, torch.full_like(next_token, eos), next_token)
                finished |= next_token == eos
            tokens = torch.cat([tokens, next_token[:, None]], dim=1)
            step_input = next_token[:, None]
            if eos is not None and finished.all():
                break
        return self.to_string(tokens[0]) if isinstance(input, str) else tokens

    # --- saving --------------------------------------------------------------------------------

    def save(self, directory: str | Path) -> Path:
        """Write a checkpoint directory (config.json, model.safetensors, tokenizer/) atomically."""
        from interp.loading import save_checkpoint

        return save_checkpoint(self, directory)

    @contextmanager
    def settings(self, **overrides: Any) -> Iterator[HookedTransformer]:
        """Temporarily change runtime settings, e.g. `with model.settings(use_attn_result=True):`."""
        allowed = {"use_attn_result", "use_split_qkv_input"}
        if set(overrides) - allowed:
            raise ValueError(f"Only {sorted(allowed)} can be changed at run time.")
        old = {key: getattr(self.cfg, key) for key in overrides}
        try:
            for key, value in overrides.items():
                setattr(self.cfg, key, value)
            yield self
        finally:
            for key, value in old.items():
                setattr(self.cfg, key, value)


def next_token_loss(
    logits: Float[Tensor, "batch pos d_vocab"], tokens: Int[Tensor, "batch pos"], per_token: bool = False
) -> Tensor:
    """Cross-entropy of predicting tokens[:, 1:] from logits[:, :-1], in nats."""
    log_probs = logits[:, :-1].float().log_softmax(-1)
    loss = -log_probs.gather(-1, tokens[:, 1:, None])[..., 0]  # [batch, pos-1]
    return loss if per_token else loss.mean()
