"""The components of interp's transformer: norms, attention, MLPs, experts and the block.

The maths is written out in `interp.model.transformer`'s docstring; every activation passes through a
`HookPoint` named as in TransformerLens. Components read their architecture from the `Config` and
their opt-in hook points from the model's `HookSettings` (shared, switched at run time).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn

from interp.config import Config, rotary_inv_freq
from interp.io.devices import module_weight
from interp.model.hooks import HookPoint, HookSettings
from interp.model.kv_cache import HookedTransformerKeyValueCacheEntry
from interp.types import upcast


class Norm(nn.Module):
    """LayerNorm or RMSNorm with hooks on the scale and the normalised output (or, for models
    without norms, the identity, with no hooks and no parameters).

    Normalises the last `n_dims` dims of its input; `shape` is the shape of its weight (default
    [d_model]; q/k norms: [head, d_head]). hook_scale: the input's shape with the normalised dims
    1 (the divisor: sqrt(var + eps) or sqrt(mean(x^2) + eps)); hook_normalized: the input's shape, where
    TransformerLens's HookedTransformer has it (LayerNorm: after the weight and bias; RMSNorm: x / scale,
    before the weight). Computed in float32 and cast back, as `transformers`
    does. After `fold_ln` a foldable norm has no weight or bias (they live in the next layer's
    weights); `folded` overrides cfg.norm_folded for norms that cannot fold (post- and q/k norms).
    """

    def __init__(
        self, cfg: Config, shape: tuple[int, ...] | None = None, n_dims: int = 1, folded: bool | None = None
    ):
        super().__init__()
        shape = (cfg.d_model,) if shape is None else shape
        self.identity = cfg.normalization == "none"  # no norm (TransformerLens's normalization_type=None)
        folded = self.identity or (cfg.norm_folded if folded is None else folded)
        self.center = cfg.normalization == "layernorm"
        self.eps = cfg.norm_eps
        self.dims = tuple(range(-n_dims, 0))
        self.w = nn.Parameter(torch.ones(shape)) if not folded else None
        self.b = nn.Parameter(torch.zeros(shape)) if self.center and not folded else None
        if not self.identity:
            self.hook_scale = HookPoint()
            self.hook_normalized = HookPoint()

    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        if self.identity:
            return x
        dtype = x.dtype
        x = upcast(x)
        if self.center:
            x = x - x.mean(self.dims, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(self.dims, keepdim=True) + self.eps).sqrt())
        x = (x / scale).to(dtype)
        if not self.center:  # RMSNorm: hook_normalized before the weight, as TransformerLens's RMSNorm
            x = self.hook_normalized(x)
            return x if self.w is None else x * self.w
        if self.w is not None:
            x = x * self.w
        if self.b is not None:
            x = x + self.b
        return self.hook_normalized(x)  # LayerNorm: after the weight and bias, as TransformerLens's LayerNorm

    def weight(self, d_model: int, device: str | torch.device = "cpu") -> Float[Tensor, " d_model"]:
        """The elementwise weight w as float32 (ones once folded), read in where accelerate offloaded it."""
        if self.w is None:
            return torch.ones(d_model, device=device)
        return module_weight(self, "w", device).detach().float()

    def apply_to_stack(
        self, stack: Float[Tensor, "... d_model"], scale: Float[Tensor, "... 1"]
    ) -> Float[Tensor, "... d_model"]:
        """The norm as a linear map with a given scale (from a cached run), applied to each component
        of a stack of residual-stream contributions: w * (x - mean x) / scale (RMSNorm: w * x / scale).
        No bias: the components' normalised parts add up to the norm's output minus its bias."""
        if self.identity:
            return stack
        stack = stack - stack.mean(-1, keepdim=True) if self.center else stack
        stack = stack / scale
        if self.w is not None:
            stack = stack * module_weight(self, "w", stack.device)
        return stack

    def vjp(
        self, x: Float[Tensor, "batch pos d_model"], cotangent: Float[Tensor, "batch pos reader d_model"]
    ) -> Float[Tensor, "batch pos reader d_model"]:
        """Vector-Jacobian products at x for one cotangent per reader, in closed form (float32):
        for y = w * c / s + b with c = x (- mean x for LayerNorm) and s = sqrt(mean(c^2) + eps),
        dy^T g = P(w g / s - c <w g, c> / (d s^3)), P centring for LayerNorm."""
        if self.identity:
            return cotangent.float()
        c = x.detach().float()[:, :, None, :]  # [B, P, 1, d]
        if self.center:
            c = c - c.mean(-1, keepdim=True)
        scale = (c.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()  # [B, P, 1, 1]
        if self.w is not None:  # w g, a new tensor (the weight read in if offloaded)
            g = cotangent.float() * module_weight(self, "w", cotangent.device).float()
        else:
            g = cotangent.float().clone()
        coefficient = (g @ c.transpose(-1, -2)) / (c.shape[-1] * scale.pow(3))  # <w g, c> / (d s^3)
        out = g.div_(scale).addcmul_(c, coefficient, value=-1)  # in place: no [B, P, R, d] temporaries
        return out - out.mean(-1, keepdim=True) if self.center else out


def soft_cap(x: Tensor, cap: float | None) -> Tensor:
    """cap * tanh(x / cap): squashes x smoothly into (-cap, cap) (Gemma 2); identity for cap None."""
    return x if cap is None else (x / cap).tanh() * cap


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
    cos, sin = cos[..., None, :], sin[..., None, :]  # [pos, 1, rd] or per prompt [batch, pos, 1, rd]
    x_rot = (upcast(x_rot) * cos + upcast(rotated) * sin).to(x.dtype)
    return torch.cat([x_rot, x_pass], dim=-1)


class Attention(nn.Module):
    """Multi-head (optionally grouped-query) self-attention, causal or bidirectional (`cfg.causal`),
    with a hook on every step.

    Key and value weights are stored per key/value head as `_W_K`, `_W_V`, `_b_K`, `_b_V`
    (TransformerLens's names); `W_K`, `W_V`, `b_K`, `b_V` are per query head, [head, ...] (each
    key/value head repeated for its group; the parameters themselves without grouped-query attention).
    State dicts with either name load.

    `layer` selects the per-layer choices of the config: global or local (sliding-window)
    attention, rotary base, and whether the layer uses positions at all.
    """

    def __init__(self, cfg: Config, layer: int = 0, settings: HookSettings | None = None):
        super().__init__()
        self.cfg = cfg
        self.settings = HookSettings() if settings is None else settings
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
        self.layer = layer
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
        # z given for the next forward passes (HookedTransformer.given_z): the heads' outputs are
        # taken as they are, and q, k, v and the pattern are computed only if a hook observes them.
        self.given_z: Tensor | None = None

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

    def _rotary_cos_sin(self, positions: Int[Tensor, "*batch pos"]) -> tuple[Tensor, Tensor]:
        inv_freq = self.rotary_inv_freq.to(positions.device)
        angles = positions.float()[..., None] * inv_freq  # [(batch,) pos, rotary_dim/2], float32
        if self.cfg.rotary_adjacent_pairs:
            angles = angles.repeat_interleave(2, dim=-1)  # dims 2i, 2i + 1: pair i
        else:
            angles = torch.cat([angles, angles], dim=-1)  # dims i, i + rotary_dim/2: pair i
        return angles.cos(), angles.sin()

    def _needs_explicit_pattern(self) -> bool:
        """Whether z must be computed from a materialised pattern: a hook may change the scores or
        the pattern (or hooks their gradients), or they are soft-capped. Else fused SDPA computes z,
        and the pattern is made for observers only (`hooks.observer`, e.g. `run_with_cache`'s), so
        a cached run's outputs equal the uncached run's."""
        return bool(
            self.cfg.attn_scores_soft_cap is not None
            or not self.hook_attn_scores.only_observed()
            or not self.hook_pattern.only_observed()
        )

    def _pattern(self, q: Tensor, k: Tensor, attention_mask: Tensor | None) -> Tensor:
        """The attention pattern [batch, head, q_pos, k_pos] through hook_attn_scores and hook_pattern."""
        cfg = self.cfg
        scores = soft_cap(torch.einsum("bqhe,bkhe->bhqk", q, k) / cfg.attn_scale, cfg.attn_scores_soft_cap)
        visible = self._visible(q.shape[1], k.shape[1], q.device, attention_mask)
        scores = self.hook_attn_scores(scores.masked_fill(~visible, float("-inf")))
        pattern = upcast(scores).softmax(dim=-1)
        if attention_mask is not None:  # queries that see nothing (left pads): zeros, not NaN (TL)
            pattern = torch.where(pattern.isnan(), torch.zeros_like(pattern), pattern)
        return self.hook_pattern(pattern.to(q.dtype))

    def _visible(
        self, q_pos: int, k_pos: int, device: torch.device, key_mask: Tensor | None = None
    ) -> Tensor:
        """[q_pos, k_pos] bool: which keys each query sees (causal, and within the window if local;
        every key with bidirectional attention).
        Queries are the last q_pos of k_pos positions (earlier ones come from the KV cache).
        With a key_mask ([batch, k_pos], False at padding): [batch, 1, q_pos, k_pos], pads unseen, and
        the window counted in real tokens (a KV cache may hold padding between them)."""
        query = torch.arange(k_pos - q_pos, k_pos, device=device)[:, None]
        key = torch.arange(k_pos, device=device)[None, :]
        visible = (
            key <= query if self.cfg.causal else torch.ones(q_pos, k_pos, dtype=torch.bool, device=device)
        )
        if key_mask is None:
            if self.window_size is not None:
                visible &= query - key < self.window_size
            return visible
        real = key_mask.to(device=device, dtype=torch.bool)  # [batch, k_pos]
        visible = visible & real[:, None, None, :]
        if self.window_size is not None:
            rank = real.long().cumsum(-1)  # [batch, k_pos]: each key's place among the real tokens
            distance = rank[:, -q_pos:, None] - rank[:, None, :]  # [batch, q_pos, k_pos]
            visible = visible & (distance < self.window_size)[:, None]
        return visible

    def forward(
        self,
        query_input: Float[Tensor, "batch pos d_model"] | Float[Tensor, "batch pos head d_model"],
        key_input: Float[Tensor, "batch pos d_model"] | Float[Tensor, "batch pos kv_head d_model"],
        value_input: Float[Tensor, "batch pos d_model"] | Float[Tensor, "batch pos kv_head d_model"],
        past_kv_cache_entry: HookedTransformerKeyValueCacheEntry | None = None,
        attention_mask: Tensor | None = None,
        positions: Tensor | None = None,
        only_given_z: bool = False,
    ) -> Float[Tensor, "batch pos d_model"]:
        """`past_kv_cache_entry`: this layer's cached keys and values, read and appended to.
        `attention_mask` [batch, key_pos] (cached keys included), False/0 at padding: no query attends
        to a pad; a query that sees no key at all (a left pad) gets a zero pattern and z, as in
        TransformerLens. `positions` [batch, pos]: each token's position (rotary), e.g. shifted
        past left padding. `only_given_z`: the output of `given_z` alone, nothing else computed
        (through this forward, so that weights offloaded by accelerate are read in)."""
        if only_given_z:
            return self.output(self.given_z)
        cfg = self.cfg
        ungrouped = self.settings.ungroup_grouped_query_attention and cfg.group_size > 1
        if ungrouped and past_kv_cache_entry is not None:
            raise ValueError(
                "a KV cache holds keys and values per key/value head: switch "
                "ungroup_grouped_query_attention off (model.set_ungroup_grouped_query_attention(False)) "
                "to generate or continue a cache."
            )
        kv_weights = (
            (self.W_K, self.b_K, self.W_V, self.b_V)
            if ungrouped
            else (self._W_K, self._b_K, self._W_V, self._b_V)
        )  # per query head (each key/value head repeated for its group) when ungrouped
        q = self.hook_q(self._project(query_input, self.W_Q, self.b_Q))  # [batch, pos, head, d_head]
        k = self.hook_k(self._project(key_input, *kv_weights[:2]))  # [batch, pos, kv_head, d_head]
        v = self.hook_v(self._project(value_input, *kv_weights[2:]))  # [batch, pos, kv_head, d_head]
        if cfg.qk_norm != "none":
            q = self.q_ln(q)
            if ungrouped:  # k_ln's weights are per key/value head: [.., group, kv_head, d_head]
                k = (
                    self.k_ln(k.unflatten(2, (cfg.n_kv_heads, -1)).transpose(2, 3))
                    .transpose(2, 3)
                    .flatten(2, 3)
                )
            else:
                k = self.k_ln(k)
        offset = 0 if past_kv_cache_entry is None else past_kv_cache_entry.past_keys.shape[1]
        if self.rotary:
            if positions is None:
                positions = torch.arange(offset, offset + q.shape[1], device=q.device)
            cos, sin = self._rotary_cos_sin(positions)
            q = self.hook_rot_q(apply_rotary(q, cos, sin, cfg.rotary_adjacent_pairs))
            k = self.hook_rot_k(apply_rotary(k, cos, sin, cfg.rotary_adjacent_pairs))
        if past_kv_cache_entry is not None:
            k, v = past_kv_cache_entry.append(k, v)
        if cfg.group_size > 1 and not ungrouped:
            k = k.repeat_interleave(cfg.group_size, dim=2)  # [batch, key_pos, head, d_head]
            v = v.repeat_interleave(cfg.group_size, dim=2)
        q_pos, k_pos = q.shape[1], k.shape[1]
        if self._needs_explicit_pattern():
            z = torch.einsum("bhqk,bkhe->bqhe", self._pattern(q, k, attention_mask), v)
        else:
            if self.hook_attn_scores.has_hooks() or self.hook_pattern.has_hooks():
                self._pattern(q, k, attention_mask)  # for the observers alone
            unmasked = offset == 0 and self.window_size is None and attention_mask is None
            mask = None if unmasked else self._visible(q_pos, k_pos, q.device, attention_mask)
            blind = None
            if attention_mask is not None:  # let blind queries see themselves (no NaN), then zero them
                blind = ~mask.any(-1, keepdim=True)  # [batch, 1, q_pos, 1]
                query = torch.arange(k_pos - q_pos, k_pos, device=q.device)[:, None]
                mask = mask | (blind & (torch.arange(k_pos, device=q.device)[None, :] == query))
            z = F.scaled_dot_product_attention(
                q.transpose(1, 2),
                k.transpose(1, 2),
                v.transpose(1, 2),
                attn_mask=mask,
                is_causal=unmasked and cfg.causal,
                scale=1 / cfg.attn_scale,
            ).transpose(1, 2)
            if blind is not None:
                z = z.masked_fill(blind[:, 0, :, :, None], 0.0)
        return self.output(z if self.given_z is None else self.given_z)

    def output(self, z: Float[Tensor, "batch pos head d_head"]) -> Float[Tensor, "batch pos d_model"]:
        """The heads' outputs z through hook_z (and hook_result) and W_O: the attention's output."""
        z = self.hook_z(z)  # [batch, pos, head, d_head]
        if self.settings.use_attn_result:
            result = self.hook_result(torch.einsum("bqhe,hed->bqhd", z, self.W_O))
            out = result.sum(dim=2)
        else:
            h, e, d = self.W_O.shape
            out = z.reshape(*z.shape[:2], h * e) @ self.W_O.reshape(h * e, d)
        return out if self.b_O is None else out + self.b_O


def _rename_kv_parameters(module: Attention, state_dict: dict[str, Tensor], prefix: str, *args: Any) -> None:
    """Load "attn.W_K" (interp's older name, TransformerLens's; per query head under grouped-query
    attention, as `tl_parameters` gives it) as _W_K, one per key/value head: the group's copies must be
    equal."""
    group = module.cfg.group_size
    for name in ("W_K", "W_V", "b_K", "b_V"):
        if prefix + name not in state_dict:
            continue
        value = state_dict.pop(prefix + name)
        if group > 1 and value.shape[0] == module.cfg.n_heads:  # per query head: one per group
            per_kv_head = value[::group]
            if not torch.equal(value, per_kv_head.repeat_interleave(group, dim=0)):
                raise ValueError(
                    f"{prefix}{name} holds a weight per query head that differs within a group of "
                    f"{group} query heads sharing a key/value head: it is not this grouped-query model's "
                    f"(give {module.cfg.n_kv_heads} key/value heads' weights, or equal copies per group)."
                )
            value = per_kv_head
        state_dict[prefix + "_" + name] = value


def _read_transformer_lens_gated_bias(
    module: MLP, state_dict: dict[str, Tensor], prefix: str, *args: Any
) -> None:
    """Load a TransformerLens gated MLP's state (b_in, no b_gate): TL adds b_in after the product,
    act(x W_gate) * (x W_in) + b_in, where interp (as transformers' models) adds it to x W_in, so only a
    zero b_in loads (b_gate zero too); another is refused rather than read as other numbers."""
    b_in = state_dict.get(prefix + "b_in")
    if prefix + "b_gate" in state_dict or b_in is None:
        return
    if bool(b_in.any()):
        raise ValueError(
            f"{prefix}b_in is TransformerLens's gated-MLP bias, added after the product (act(x W_gate) * "
            "(x W_in) + b_in), where interp adds b_in to x W_in (and b_gate to x W_gate), as transformers' "
            "models do: it is not zero here, so this state dict would give other numbers; load the model "
            "from its transformers checkpoint instead"
        )
    state_dict[prefix + "b_gate"] = torch.zeros_like(b_in)


_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "relu": F.relu,
    "solu_ln": lambda x: x * upcast(x).softmax(-1).to(x.dtype),  # SoLU; its LayerNorm is the MLP's `ln`
}


class MLP(nn.Module):
    """Feed-forward layer: act(x W_in + b_in) W_out + b_out, or gated: (act(x W_gate) * x W_in) W_out
    (SwiGLU with act = silu; biases where the architecture has them).

    SoLU (activation "solu_ln", Elhage et al. 2022): post = LN(pre * softmax(pre)), with the LayerNorm
    `ln` over d_mlp (its weights fold into W_out, as the block norms fold into their readers).

    Hooks: hook_pre (the activation's input; the gate in gated MLPs), hook_pre_linear (gated only),
    hook_mid (SoLU: before `ln`), hook_post (what W_out reads). All [batch, pos, d_mlp].
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
        self.ln = None
        if cfg.activation == "solu_ln":
            self.hook_mid = HookPoint()
            self.ln = Norm(cfg, (cfg.d_mlp,))
        self.hook_post = HookPoint()
        if self.b_gate is not None:
            self.register_load_state_dict_pre_hook(_read_transformer_lens_gated_bias)

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        linear = x @ self.W_in
        if self.b_in is not None:
            linear = linear + self.b_in
        if self.ln is not None:  # SoLU
            post = self.hook_post(self.ln(self.hook_mid(self.act(self.hook_pre(linear)))))
        elif self.W_gate is None:
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
        top_weights, indices = upcast(logits).softmax(-1).topk(self.cfg.experts_per_token, dim=-1)
        indices = self.hook_expert_indices(indices)
        top_weights = top_weights / top_weights.sum(-1, keepdim=True)
        weights = torch.zeros_like(upcast(logits)).scatter(-1, indices, top_weights)
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

    def __init__(self, cfg: Config, layer: int = 0, settings: HookSettings | None = None):
        super().__init__()
        self.cfg = cfg
        self.settings = HookSettings() if settings is None else settings
        self.ln1 = Norm(cfg) if cfg.pre_norm else nn.Identity()
        self.attn = Attention(cfg, layer, self.settings)
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
        self,
        resid_pre: Float[Tensor, "batch pos d_model"],
        past_kv_cache_entry: HookedTransformerKeyValueCacheEntry | None = None,
        attention_mask: Tensor | None = None,
        positions: Tensor | None = None,
        shortformer_pos_embed: Float[Tensor, "batch pos d_model"] | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        """`past_kv_cache_entry`, `attention_mask` and `positions`: see `Attention.forward`.
        `shortformer_pos_embed` (shortformer positions): added to the query and key inputs after ln1."""
        cfg = self.cfg
        mask = {"attention_mask": attention_mask, "positions": positions}
        resid_pre = self.hook_resid_pre(resid_pre)
        given = self.attn.given_z
        if given is not None and given.shape != (*resid_pre.shape[:2], cfg.n_heads, cfg.d_head):
            raise ValueError(
                f"block {self.attn.layer}'s given z is {tuple(given.shape)}; this run needs "
                f"[batch, pos, head, d_head] = {(*resid_pre.shape[:2], cfg.n_heads, cfg.d_head)}"
            )
        if given is not None and past_kv_cache_entry is None and not self._observes_attention():
            attn_out = self.attn(resid_pre, resid_pre, resid_pre, only_given_z=True)
        elif self.settings.use_split_qkv_input:
            q_in = self.hook_q_input(_per_head(resid_pre, cfg.n_heads))
            n_kv = cfg.n_heads if self.settings.ungroup_grouped_query_attention else cfg.n_kv_heads
            k_in = self.hook_k_input(_per_head(resid_pre, n_kv))
            v_in = self.hook_v_input(_per_head(resid_pre, n_kv))
            attn_out = self.attn(
                _with_positions(self.ln1(q_in), shortformer_pos_embed),
                _with_positions(self.ln1(k_in), shortformer_pos_embed),
                self.ln1(v_in),
                past_kv_cache_entry=past_kv_cache_entry,
                **mask,
            )
        elif self.settings.use_attn_in:
            normed = self.ln1(self.hook_attn_in(_per_head(resid_pre, cfg.n_heads)))
            positioned = _with_positions(normed, shortformer_pos_embed)
            attn_out = self.attn(
                positioned, positioned, normed, past_kv_cache_entry=past_kv_cache_entry, **mask
            )
        else:
            normed = self.ln1(resid_pre)
            positioned = _with_positions(normed, shortformer_pos_embed)
            attn_out = self.attn(
                positioned, positioned, normed, past_kv_cache_entry=past_kv_cache_entry, **mask
            )
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

    def head_contributions(
        self,
        result: Float[Tensor, "*batch pos head d_model"],
        post_scale: Float[Tensor, "*batch pos 1"] | None = None,
    ) -> Float[Tensor, "*batch pos head d_model"]:
        """Each head's contribution to the residual stream, from its output z_h W_O[h] (`result`, as
        hook_result): the output itself, or in a post-norm block (Gemma 2 and 3, OLMo 2) its share of the
        normalised attention output with ln1_post frozen at a run's scale (`post_scale`, its hook_scale):
        w * z_h W_O[h] / s (LayerNorm: centred too). The shares plus the normalised b_O and ln1_post's bias
        add up to the block's hook_attn_out exactly, in that run; the linearisation is exact only there."""
        if not self.cfg.post_norm:
            return result
        if post_scale is None:
            raise ValueError(
                f"block {self.attn.layer} normalises its attention output as a whole (ln1_post), so each "
                "head's contribution needs that norm's scale in the run: pass post_scale= its "
                f"blocks.{self.attn.layer}.ln1_post.hook_scale"
            )
        return self.ln1_post.apply_to_stack(result, post_scale.unsqueeze(-2))

    def _observes_attention(self) -> bool:
        """Whether a hook observes what the attention computes before z (its inputs, q, k, v, pattern)."""
        return any(
            point.has_hooks()
            for module in (self.ln1, self.attn)
            for name, point in module.named_modules()
            if isinstance(point, HookPoint) and name not in ("hook_z", "hook_result")
        ) or any(
            getattr(self, f"hook_{name}").has_hooks() for name in ("q_input", "k_input", "v_input", "attn_in")
        )

    def _mlp_in(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        return self.hook_mlp_in(x.clone()) if self.settings.use_hook_mlp_in else x


def _with_positions(
    x: Float[Tensor, "batch pos d_model"] | Float[Tensor, "batch pos head d_model"],
    pos_embed: Float[Tensor, "batch pos d_model"] | None,
) -> Tensor:
    """A query or key input plus the shortformer positions (the same for every head); x without them."""
    if pos_embed is None:
        return x
    return x + (pos_embed[:, :, None, :] if x.ndim == 4 else pos_embed)


def _per_head(x: Float[Tensor, "batch pos d_model"], n: int) -> Float[Tensor, "batch pos n d_model"]:
    """n copies of x, each its own memory (as TransformerLens's): a hook that edits one head's copy in
    place changes that head's input only, never x (the residual stream) or the other heads'."""
    return x.unsqueeze(2).repeat(1, 1, n, 1)
