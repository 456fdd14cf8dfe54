"""A hookable decoder-only transformer.

Every activation passes through a `HookPoint` named as in TransformerLens
(`blocks.{L}.attn.hook_pattern`, ...). The forward pass, for tokens t of shape [batch, pos]:

  1. x = W_E[t] (+ W_pos[positions] for learned positions)              # [batch, pos, d_model]
  2. for each block L:
       sequential:  x = x + Attn(LN1(x));  x = x + MLP(LN2(x))
       parallel:    x = x + Attn(LN1(x)) + MLP(LN2(x))                    (GPT-NeoX)
       attn-only:   x = x + Attn(LN1(x))
     (post_norm: Attn and MLP outputs pass through LN1_post / LN2_post before being added,
     Gemma 2; without pre_norm LN1 and LN2 are the identity, OLMo 2; with experts the MLP is a
     routed mixture, Mixtral)
  3. logits = LN_final(x) @ W_U + b_U (soft-capped with output_logits_soft_cap) # [batch, pos, d_vocab]

Attention (per query head h; key/value head h // group_size under grouped-query attention):
  q = x W_Q[h] + b_Q[h],  k = x W_K + b_K,  v = x W_V + b_V              # [batch, pos, head, d_head]
  (q_ln, k_ln normalise q and k with qk_norm; rotary models then rotate the first `rotary_dim`
  dims of q and k)
  scores = soft_cap(q k^T / attn_scale), causally masked (local layers: also beyond window_size)
                                                                         # [batch, head, q_pos, k_pos]
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
import tqdm
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from interp.cache import ActivationCache
from interp.checkpoint import save_checkpoint
from interp.config import Config
from interp.devices import module_weight
from interp.metrics import next_token_loss
from interp.transformer_lens_api import TransformerLensModel

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

    Normalises the last `n_dims` dims of its input; `shape` is the shape of its weight (default
    [d_model]; q/k norms: [head, d_head]). hook_scale: the input's shape with the normalised dims
    1 (the divisor: sqrt(var + eps) or sqrt(mean(x^2) + eps)); hook_normalized: the input's shape
    (after the elementwise weight and bias). Computed in float32 and cast back, as `transformers`
    does. After `fold_ln` a foldable norm has no weight or bias (they live in the next layer's
    weights); `folded` overrides cfg.norm_folded for norms that cannot fold (post- and q/k norms).
    """

    def __init__(
        self, cfg: Config, shape: tuple[int, ...] | None = None, n_dims: int = 1, folded: bool | None = None
    ):
        super().__init__()
        shape = (cfg.d_model,) if shape is None else shape
        folded = cfg.norm_folded if folded is None else folded
        self.center = cfg.normalization == "layernorm"
        self.eps = cfg.norm_eps
        self.dims = tuple(range(-n_dims, 0))
        self.w = nn.Parameter(torch.ones(shape)) if not folded else None
        self.b = nn.Parameter(torch.zeros(shape)) if self.center and not folded else None
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        dtype = x.dtype
        x = _upcast(x)
        if self.center:
            x = x - x.mean(self.dims, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(self.dims, keepdim=True) + self.eps).sqrt())
        x = (x / scale).to(dtype)
        if self.w is not None:
            x = x * self.w
        if self.b is not None:
            x = x + self.b
        return self.hook_normalized(x)


def soft_cap(x: Tensor, cap: float | None) -> Tensor:
    """cap * tanh(x / cap): squashes x smoothly into (-cap, cap) (Gemma 2); identity for cap None."""
    return x if cap is None else (x / cap).tanh() * cap


def rotary_inv_freq(rotary_dim: int, base: float) -> Float[Tensor, " rotary_dim_half"]:
    """Inverse frequencies of rotary position embeddings (Su et al. 2021), one per dim pair."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float32, device="cpu") / rotary_dim
    return 1.0 / (base**exponents)


def apply_rotary(
    x: Float[Tensor, "batch pos head d_head"],
    cos: Float[Tensor, "pos rotary_dim"],
    sin: Float[Tensor, "pos rotary_dim"],
    adjacent_pairs: bool = False,
) -> Float[Tensor, "batch pos head d_head"]:
    """Rotate the first rotary_dim dims of each head: pairs (i, i + rotary_dim/2) (GPT-NeoX /
    Llama convention), or with `adjacent_pairs` pairs (2i, 2i + 1) (GPT-J). cos and sin hold each
    pair's angle at both of its dims (see Attention._rotary_cos_sin)."""
    rotary_dim = cos.shape[-1]
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    if adjacent_pairs:
        pairs = x_rot.unflatten(-1, (-1, 2))  # [..., rotary_dim/2, 2]
        rotated = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    else:
        half = rotary_dim // 2
        rotated = torch.cat([-x_rot[..., half:], x_rot[..., :half]], dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    x_rot = (_upcast(x_rot) * cos + _upcast(rotated) * sin).to(x.dtype)
    return torch.cat([x_rot, x_pass], dim=-1)


class Attention(nn.Module):
    """Multi-head (optionally grouped-query) causal self-attention with a hook on every step.

    Key and value weights are stored per key/value head as `_W_K`, `_W_V`, `_b_K`, `_b_V`
    (TransformerLens's names); `W_K`, `W_V`, `b_K`, `b_V` are per query head, [head, ...] (each
    key/value head repeated for its group; the parameters themselves without grouped-query attention).
    State dicts with either name load.

    `layer` selects the per-layer choices of the config: global or local (sliding-window)
    attention, rotary base, and whether the layer uses positions at all.
    """

    def __init__(self, cfg: Config, layer: int = 0):
        super().__init__()
        self.cfg = cfg
        h, kv, d, e = cfg.n_heads, cfg.n_kv_heads, cfg.d_model, cfg.d_head
        self.W_Q = nn.Parameter(torch.empty(h, d, e))
        self._W_K = nn.Parameter(torch.empty(kv, d, e))
        self._W_V = nn.Parameter(torch.empty(kv, d, e))
        self.W_O = nn.Parameter(torch.empty(h, e, d))
        self.b_Q = nn.Parameter(torch.zeros(h, e)) if cfg.qkv_bias else None
        self._b_K = nn.Parameter(torch.zeros(kv, e)) if cfg.qkv_bias else None
        self._b_V = nn.Parameter(torch.zeros(kv, e)) if cfg.qkv_bias else None
        self.b_O = nn.Parameter(torch.zeros(d)) if cfg.attn_out_bias else None
        if cfg.qk_norm != "none":
            n_dims = 2 if cfg.qk_norm == "all_heads" else 1
            self.q_ln = Norm(cfg, (h, e), n_dims, folded=False)
            self.k_ln = Norm(cfg, (kv, e), n_dims, folded=False)
        self.window_size = cfg.window_size if cfg.attn_types[layer] == "local" else None
        self.rotary = cfg.positional == "rotary" and layer not in cfg.nope_layers
        if self.rotary:
            # A plain float32 attribute, not a buffer: casting the model to bf16 must not round it.
            if self.window_size is not None and cfg.rotary_base_local is not None:
                self.rotary_inv_freq = rotary_inv_freq(cfg.rotary_dim, cfg.rotary_base_local)
            elif cfg.rotary_inv_freq is not None:
                self.rotary_inv_freq = torch.tensor(cfg.rotary_inv_freq, dtype=torch.float32, device="cpu")
            else:
                self.rotary_inv_freq = rotary_inv_freq(cfg.rotary_dim, cfg.rotary_base)
            self.hook_rot_q = HookPoint()
            self.hook_rot_k = HookPoint()
        for name in ["q", "k", "v", "attn_scores", "pattern", "z", "result"]:
            setattr(self, f"hook_{name}", HookPoint())
        self.register_load_state_dict_pre_hook(_rename_kv_parameters)

    def _per_query_head(self, x: Tensor | None) -> Tensor | None:
        if x is None or self.cfg.group_size == 1:
            return x
        return x.repeat_interleave(self.cfg.group_size, dim=0)

    @property
    def W_K(self) -> Float[Tensor, "head d_model d_head"]:
        return self._per_query_head(self._W_K)

    @property
    def W_V(self) -> Float[Tensor, "head d_model d_head"]:
        return self._per_query_head(self._W_V)

    @property
    def b_K(self) -> Float[Tensor, "head d_head"] | None:
        return self._per_query_head(self._b_K)

    @property
    def b_V(self) -> Float[Tensor, "head d_head"] | None:
        return self._per_query_head(self._b_V)

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
        if self.cfg.rotary_adjacent_pairs:
            angles = angles.repeat_interleave(2, dim=-1)  # dims 2i, 2i + 1: pair i
        else:
            angles = torch.cat([angles, angles], dim=-1)  # dims i, i + rotary_dim/2: pair i
        return angles.cos(), angles.sin()

    def _needs_explicit_pattern(self) -> bool:
        """Whether the scores must be materialised: something observes the scores or pattern, or
        they are soft-capped (else fused SDPA is used)."""
        return bool(
            self.cfg.attn_scores_soft_cap is not None
            or self.hook_attn_scores._forward_hooks
            or self.hook_pattern._forward_hooks
            or self.hook_attn_scores._backward_hooks
            or self.hook_pattern._backward_hooks
        )

    def _visible(self, q_pos: int, k_pos: int, device: torch.device) -> Tensor:
        """[q_pos, k_pos] bool: which keys each query sees (causal, and within the window if local).
        Queries are the last q_pos of k_pos positions (earlier ones come from the KV cache)."""
        query = torch.arange(k_pos - q_pos, k_pos, device=device)[:, None]
        key = torch.arange(k_pos, device=device)[None, :]
        visible = key <= query
        if self.window_size is not None:
            visible &= query - key < self.window_size
        return visible

    def forward(
        self,
        q_input: Float[Tensor, "batch pos d_model"] | Float[Tensor, "batch pos head d_model"],
        k_input: Float[Tensor, "batch pos d_model"] | Float[Tensor, "batch pos kv_head d_model"],
        v_input: Float[Tensor, "batch pos d_model"] | Float[Tensor, "batch pos kv_head d_model"],
        past_kv: dict[str, Tensor] | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        cfg = self.cfg
        q = self.hook_q(self._project(q_input, self.W_Q, self.b_Q))  # [batch, pos, head, d_head]
        k = self.hook_k(self._project(k_input, self._W_K, self._b_K))  # [batch, pos, kv_head, d_head]
        v = self.hook_v(self._project(v_input, self._W_V, self._b_V))  # [batch, pos, kv_head, d_head]
        if cfg.qk_norm != "none":
            q, k = self.q_ln(q), self.k_ln(k)
        offset = 0 if past_kv is None or "k" not in past_kv else past_kv["k"].shape[1]
        if self.rotary:
            positions = torch.arange(offset, offset + q.shape[1], device=q.device)
            cos, sin = self._rotary_cos_sin(positions)
            q = self.hook_rot_q(apply_rotary(q, cos, sin, cfg.rotary_adjacent_pairs))
            k = self.hook_rot_k(apply_rotary(k, cos, sin, cfg.rotary_adjacent_pairs))
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
            scores = soft_cap(
                torch.einsum("bqhe,bkhe->bhqk", q, k) / cfg.attn_scale, cfg.attn_scores_soft_cap
            )
            visible = self._visible(q_pos, k_pos, q.device)
            scores = self.hook_attn_scores(scores.masked_fill(~visible, float("-inf")))
            pattern = self.hook_pattern(_upcast(scores).softmax(dim=-1).to(q.dtype))
            z = torch.einsum("bhqk,bkhe->bqhe", pattern, v)
        else:
            causal_only = offset == 0 and self.window_size is None
            z = F.scaled_dot_product_attention(
                q.transpose(1, 2),
                k.transpose(1, 2),
                v.transpose(1, 2),
                attn_mask=None if causal_only else self._visible(q_pos, k_pos, q.device),
                is_causal=causal_only,
                scale=1 / cfg.attn_scale,
            ).transpose(1, 2)
        z = self.hook_z(z)  # [batch, pos, head, d_head]
        if cfg.use_attn_result:
            result = self.hook_result(torch.einsum("bqhe,hed->bqhd", z, self.W_O))
            out = result.sum(dim=2)
        else:
            h, e, d = self.W_O.shape
            out = z.reshape(*z.shape[:2], h * e) @ self.W_O.reshape(h * e, d)
        return out if self.b_O is None else out + self.b_O


def _rename_kv_parameters(module: Attention, state_dict: dict[str, Tensor], prefix: str, *args: Any) -> None:
    """Load "attn.W_K" (interp's older name, TransformerLens's without grouped-query attention) as _W_K."""
    for name in ("W_K", "W_V", "b_K", "b_V"):
        if prefix + name in state_dict:
            state_dict[prefix + "_" + name] = state_dict.pop(prefix + name)


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


class MixtureOfExperts(nn.Module):
    """Routed experts (Mixtral): each token goes to `experts_per_token` of `num_experts` gated MLPs.

    router logits = x W_router; weights = softmax(logits) (float32), keeping the top
    experts_per_token renormalised to sum to 1; out = sum_e weight_e * expert_e(x).
    Hooks: hook_router_logits [batch, pos, expert]; hook_expert_indices [batch, pos, k];
    hook_expert_weights [batch, pos, expert] (zero for experts not chosen); hook_expert_out
    [batch, pos, expert, d_model] (each expert's weighted output, zero where not chosen; they sum
    to the layer's output). Each expert runs only on its tokens, so `experts.E.hook_pre` etc. are
    [1, n_tokens_routed_to_E, d_mlp].
    """

    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.W_router = nn.Parameter(torch.empty(cfg.d_model, cfg.num_experts))
        self.experts = nn.ModuleList(MLP(cfg) for _ in range(cfg.num_experts))
        for name in ["router_logits", "expert_indices", "expert_weights", "expert_out"]:
            setattr(self, f"hook_{name}", HookPoint())

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        batch, pos, d_model = x.shape
        logits = self.hook_router_logits(x @ self.W_router)
        top_weights, indices = _upcast(logits).softmax(-1).topk(self.cfg.experts_per_token, dim=-1)
        indices = self.hook_expert_indices(indices)
        top_weights = top_weights / top_weights.sum(-1, keepdim=True)
        weights = torch.zeros_like(_upcast(logits)).scatter(-1, indices, top_weights)
        weights = self.hook_expert_weights(weights).flatten(0, 1)  # [batch * pos, expert]
        tokens = x.reshape(-1, d_model)
        chosen = F.one_hot(indices, self.cfg.num_experts).sum(-2).flatten(0, 1)  # [batch * pos, expert]
        outs = []
        for e, expert in enumerate(self.experts):
            out = torch.zeros_like(tokens)
            rows = chosen[:, e].nonzero()[:, 0]
            if len(rows):
                out[rows] = (expert(tokens[rows][None])[0] * weights[rows, e, None]).to(x.dtype)
            outs.append(out)
        expert_out = self.hook_expert_out(torch.stack(outs, dim=1).view(batch, pos, -1, d_model))
        return expert_out.sum(dim=2)


class Block(nn.Module):
    """One transformer block; see the module docstring for the residual wiring.

    With `use_split_qkv_input`, ln1 runs separately on the per-head query, key and value inputs, so
    its hooks fire three times per forward (a cache keeps the value input's, [batch, pos, kv_head, 1]).
    `use_attn_in` gives one per-head input (hook_attn_in) for all three; `use_hook_mlp_in` hooks the
    MLP's input before ln2 (hook_mlp_in).
    """

    def __init__(self, cfg: Config, layer: int = 0):
        super().__init__()
        self.cfg = cfg
        self.ln1 = Norm(cfg) if cfg.pre_norm else nn.Identity()
        self.attn = Attention(cfg, layer)
        if cfg.post_norm:
            self.ln1_post = Norm(cfg, folded=False)
        if not cfg.attn_only:
            self.ln2 = Norm(cfg) if cfg.pre_norm else nn.Identity()
            self.mlp = MLP(cfg) if cfg.num_experts is None else MixtureOfExperts(cfg)
            if cfg.post_norm:
                self.ln2_post = Norm(cfg, folded=False)
        names = ["resid_pre", "attn_out", "resid_post", "q_input", "k_input", "v_input", "attn_in"]
        if not cfg.attn_only:
            names += ["mlp_in", "mlp_out"] + ([] if cfg.parallel_residual else ["resid_mid"])
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
        elif cfg.use_attn_in:
            normed = self.ln1(self.hook_attn_in(_per_head(resid_pre, cfg.n_heads)))
            attn_out = self.attn(normed, normed, normed, past_kv=past_kv)
        else:
            normed = self.ln1(resid_pre)
            attn_out = self.attn(normed, normed, normed, past_kv=past_kv)
        if cfg.post_norm:
            attn_out = self.ln1_post(attn_out)
        attn_out = self.hook_attn_out(attn_out)
        if cfg.attn_only:
            return self.hook_resid_post(resid_pre + attn_out)
        resid_mid = resid_pre if cfg.parallel_residual else self.hook_resid_mid(resid_pre + attn_out)
        mlp_out = self.mlp(self.ln2(self._mlp_in(resid_mid)))
        if cfg.post_norm:
            mlp_out = self.ln2_post(mlp_out)
        mlp_out = self.hook_mlp_out(mlp_out)
        if cfg.parallel_residual:
            return self.hook_resid_post(resid_pre + attn_out + mlp_out)
        return self.hook_resid_post(resid_mid + mlp_out)

    def _mlp_in(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        return self.hook_mlp_in(x.clone()) if self.cfg.use_hook_mlp_in else x


def _per_head(x: Float[Tensor, "batch pos d_model"], n: int) -> Float[Tensor, "batch pos n d_model"]:
    return x.unsqueeze(2).expand(-1, -1, n, -1)


# ---------------------------------------------------------------------------------------------
# The model

# Hook points that fire only when their setting is on (hook name suffix -> Config field).
_OPT_IN_HOOKS = {
    "hook_result": "use_attn_result",
    "_input": "use_split_qkv_input",
    "hook_attn_in": "use_attn_in",
    "hook_mlp_in": "use_hook_mlp_in",
}


class HookedTransformer(TransformerLensModel, HookedRootModule):
    """A decoder-only transformer with TransformerLens hook names. See the module docstring.

    `tokenizer` is a `transformers` tokenizer, or None for models that work on token ids only.
    TransformerLens's API beyond this class lives in `interp.transformer_lens_api`.
    """

    def __init__(self, cfg: Config, tokenizer: Any = None):
        super().__init__()
        self.cfg = cfg
        cfg._model = self  # cfg.device and cfg.dtype are the model's
        self.tokenizer = tokenizer
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))
        self.hook_embed = HookPoint()
        if cfg.positional == "learned":
            self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model))
            self.hook_pos_embed = HookPoint()
        self.blocks = nn.ModuleList(Block(cfg, layer) for layer in range(cfg.n_layers))
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
            if name.split(".")[-1].lstrip("_").startswith("W_"):
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
        return self._stack("W_K")

    @property
    def W_V(self) -> Float[Tensor, "layer head d_model d_head"]:
        """Per query head, as W_K."""
        return self._stack("W_V")

    @property
    def W_O(self) -> Float[Tensor, "layer head d_head d_model"]:
        return self._stack("W_O")

    @property
    def device(self) -> torch.device:
        return self.W_E.device

    @property
    def dtype(self) -> torch.dtype:
        return self.W_E.dtype

    # --- hooks ---------------------------------------------------------------------------------

    def check_hook_name(self, name: str) -> None:
        """Raise a KeyError naming the closest hook names if `name` is not a hook point."""
        if name in self.hook_dict:
            for suffix, setting in _OPT_IN_HOOKS.items():
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
        remove_batch_dim: bool = False,
        **forward_kwargs: Any,
    ) -> tuple[Any, ActivationCache]:
        """Run the model and cache activations of the hooks that `names_filter` selects.

        Only the selected hooks are cached (a single name costs no more than a forward pass).
        With return_type=None the forward stops after the last block a selected hook lives in.
        `device` moves each cached tensor as it is made (e.g. "cpu" to free GPU memory); `incl_bwd`
        also caches gradients under "<name>_grad" when the caller runs `.backward()` on the output;
        `remove_batch_dim` drops the batch dim of a one-prompt run's cache.
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
        cache = ActivationCache(cache, self)
        return (None if stop_early else out), (cache.remove_batch_dim() if remove_batch_dim else cache)

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
        for suffix, setting in _OPT_IN_HOOKS.items():
            if not getattr(self.cfg, setting):
                names = [n for n in names if not n.endswith(suffix)]
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
        """x W_U + b_U, soft-capped where the model caps its logits (Gemma 2)."""
        logits = x.to(self.W_U.device) @ self.W_U
        logits = logits if self.b_U is None else logits + self.b_U
        return soft_cap(logits, self.cfg.output_logits_soft_cap)

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
        self,
        text: str | Sequence[str],
        prepend_bos: bool | None = None,
        padding_side: Literal["left", "right"] | None = None,
        move_to_device: bool = True,
        truncate: bool = True,
    ) -> Int[Tensor, "batch pos"]:
        """Tokenize text (padded to the longest prompt, on the right by default) with this model's
        BOS policy; `truncate` cuts prompts to the context length n_ctx.

        `prepend_bos=None` uses `cfg.default_prepend_bos`: what the model saw in training
        (GPT-2 and Pythia: <|endoftext|> first, as TransformerLens; Llama: <s>; SmolLM2 and Qwen: none).
        interp has no attention mask: run left-padded batches only where pads cannot matter.
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
        if truncate:
            ids = [row[: self.cfg.n_ctx] for row in ids]
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        width = max(len(row) for row in ids)
        tokens = torch.full((len(ids), width), pad or 0, dtype=torch.long)
        left = (padding_side or "right") == "left"
        for i, row in enumerate(ids):
            if left:
                tokens[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            else:
                tokens[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        return tokens.to(self.device) if move_to_device else tokens

    def to_str_tokens(
        self,
        input: str | Sequence[str] | Sequence[int] | Tensor,
        prepend_bos: bool | None = None,
        padding_side: Literal["left", "right"] | None = None,
    ) -> list[str] | list[list[str]]:
        """One string per token of a prompt (text, a list of ids, a [pos] / [1, pos] tensor);
        a list of prompts gives a list of such lists."""
        tokenizer = self._require_tokenizer()
        if isinstance(input, Sequence) and not isinstance(input, str) and input and isinstance(input[0], str):
            return [self.to_str_tokens(text, prepend_bos, padding_side) for text in input]
        if isinstance(input, str):
            tokens = self.to_tokens(input, prepend_bos, padding_side)[0]
        else:
            tokens = torch.as_tensor(input)
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

    def to_string(self, tokens: int | Sequence[int] | Int[Tensor, "... pos"]) -> str | list[str]:
        """Text of token ids: an id, a list or [pos] tensor -> str; [batch, pos] -> one str per row."""
        tokenizer = self._require_tokenizer()
        tokens = torch.as_tensor(tokens)
        if tokens.ndim <= 1:
            return tokenizer.decode(tokens.reshape(-1).tolist())
        return [tokenizer.decode(row.tolist()) for row in tokens]

    # --- generation ----------------------------------------------------------------------------

    @torch.no_grad()
    def generate(
        self,
        input: str | Int[Tensor, "batch pos"],
        max_new_tokens: int = 20,
        stop_at_eos: bool = True,
        eos_token_id: int | None = None,
        do_sample: bool | None = None,
        top_k: int | None = None,
        temperature: float | None = None,
        use_past_kv_cache: bool = True,
        prepend_bos: bool | None = None,
        return_type: Literal["input", "str", "tokens"] = "input",
        verbose: bool = False,
        seed: int | None = None,
    ) -> str | Int[Tensor, "batch pos"]:
        """Greedy or sampled continuation; by default text in -> text out, tokens in -> tokens out.

        Greedy unless `do_sample=True` (temperature 1 unless given) or a temperature > 0 is given;
        (TransformerLens samples by default). With the KV cache each new token costs one position's
        forward pass. Batched token input must share one length (no padding), since padding would
        sit between prompt and continuation. `verbose` shows a progress bar.
        """
        if isinstance(input, str):
            tokens = self.to_tokens(input, prepend_bos=prepend_bos)
        else:
            tokens = self._as_tokens(input, prepend_bos)
        sample = do_sample if do_sample is not None else bool(temperature)
        temperature = 1.0 if temperature is None else temperature
        if sample and temperature <= 0:
            raise ValueError(f"Sampling needs a temperature > 0, got {temperature}; or use do_sample=False.")
        generator = torch.Generator(device=tokens.device).manual_seed(seed) if seed is not None else None
        if eos_token_id is None and stop_at_eos and self.tokenizer is not None:
            eos_token_id = self.tokenizer.eos_token_id
        eos = eos_token_id if stop_at_eos else None
        past_kv = [{} for _ in self.blocks] if use_past_kv_cache else None
        finished = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
        step_input = tokens
        for _ in tqdm.trange(max_new_tokens, disable=not verbose):
            logits = self(step_input if use_past_kv_cache else tokens, past_kv=past_kv)[:, -1].float()
            if not sample:
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
        if return_type == "str" or (return_type == "input" and isinstance(input, str)):
            prepended = isinstance(input, str) and (
                self.cfg.default_prepend_bos if prepend_bos is None else prepend_bos
            )
            text = self.to_string(tokens[:, int(prepended) :])  # without the BOS, as TransformerLens
            return text[0] if len(text) == 1 else text
        return tokens

    # --- saving --------------------------------------------------------------------------------

    def save(self, directory: str | Path) -> Path:
        """Write a checkpoint directory (config.json, model.safetensors, tokenizer/) atomically."""
        return save_checkpoint(self, directory)

    @contextmanager
    def settings(self, **overrides: Any) -> Iterator[HookedTransformer]:
        """Temporarily change runtime settings, e.g. `with model.settings(use_attn_result=True):`."""
        allowed = set(_OPT_IN_HOOKS.values())
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
