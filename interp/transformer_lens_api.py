"""TransformerLens's `HookedTransformer` and `HookedTransformerConfig` API on interp's model.

TransformerLens users' code runs on interp after changing only the import
(`from interp import HookedTransformer`). The model's own methods (forward, run_with_cache,
to_tokens, generate, ...) already take TransformerLens's arguments; this module adds the rest of
the surface as two mixins, so that `model.py` and `config.py` stay small:

- `TransformerLensConfig` (a base of `Config`): TransformerLens's config names as read-only views of
  interp's fields (`cfg.device`, `cfg.dtype`, `cfg.act_fn`, `cfg.normalization_type`, ...).
- `TransformerLensModel` (a base of `HookedTransformer`): `from_pretrained` with TransformerLens's
  weight processing defaults, stacked weights and biases, `OV`/`QK` as `FactoredMatrix`,
  `tokens_to_residual_directions`, `accumulated_bias`, the `set_use_*` switches and small helpers.

Deliberate differences are listed, with reasons, in docs/migrating-from-transformer-lens.md.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.metrics import next_token_loss

if TYPE_CHECKING:
    from interp.model import HookedTransformer

_NORMALIZATION_TYPES = {"layernorm": "LN", "rmsnorm": "RMS"}
_POSITIONAL_TYPES = {"learned": "standard", "rotary": "rotary", "none": "none"}


def transformer_lens_device() -> torch.device:
    """TransformerLens's default device for from_pretrained: a GPU where there is one, else the CPU
    (interp.load_model's default is interp.default_device: $INTERP_DEVICE, else CPU)."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


# TransformerLens's HookedTransformerConfig arguments -> interp's Config fields (same meaning).
_CONFIG_NAMES = {
    "n_layers": "n_layers", "d_model": "d_model", "n_ctx": "n_ctx", "d_head": "d_head",
    "n_heads": "n_heads", "d_mlp": "d_mlp", "d_vocab": "d_vocab", "attn_only": "attn_only",
    "n_key_value_heads": "n_kv_heads", "gated_mlp": "gated_mlp", "rotary_dim": "rotary_dim",
    "rotary_base": "rotary_base", "eps": "norm_eps", "parallel_attn_mlp": "parallel_residual",
    "default_prepend_bos": "default_prepend_bos", "model_name": "model_name",
    "initializer_range": "init_std", "use_attn_result": "use_attn_result",
    "use_split_qkv_input": "use_split_qkv_input", "use_hook_mlp_in": "use_hook_mlp_in",
    "use_attn_in": "use_attn_in",
}  # fmt: skip
_FROM_NORMALIZATION_TYPE = {"LN": "layernorm", "RMS": "rmsnorm"}
_FROM_POSITIONAL_TYPE = {"standard": "learned", "rotary": "rotary"}


def _official_name(model_name: str) -> str:
    """TransformerLens's alias ("gpt2-small") -> the transformers id ("gpt2"); other names unchanged."""
    from transformer_lens.supported_models import get_official_model_name

    if not isinstance(model_name, str) or model_name.lower() in sys.modules["interp.loading"].OFFLINE_MODELS:
        return model_name
    try:
        return get_official_model_name(model_name)
    except ValueError:
        return model_name


class TransformerLensConfig:
    """TransformerLens's `HookedTransformerConfig` names, read-only, computed from interp's fields.

    `device` and `dtype` are those of the model the config belongs to (there is no separate setting
    to disagree with them): move the model with `model.to(...)`.
    """

    _model: HookedTransformer | None = None  # set by HookedTransformer.__init__

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the config without its model (e.g. to send it to another process)."""
        return {k: v for k, v in self.__dict__.items() if k != "_model"}

    def __deepcopy__(self, memo: dict[int, Any]) -> TransformerLensConfig:
        """Deep copies keep the link to the model (its copy, when the model is being copied)."""
        new = copy.copy(self)
        memo[id(self)] = new
        new.__dict__.update({k: copy.deepcopy(v, memo) for k, v in self.__dict__.items()})
        return new

    @property
    def device(self) -> str:
        """e.g. "cpu" or "cuda:0" (a string, as in TransformerLens)."""
        return str(self._model.device) if self._model is not None else "cpu"

    @property
    def dtype(self) -> torch.dtype:
        return self._model.dtype if self._model is not None else torch.float32

    @property
    def act_fn(self) -> str:
        return self.activation

    @property
    def normalization_type(self) -> Literal["LN", "LNPre", "RMS", "RMSPre"]:
        """ "LN"/"RMS", with "Pre" once fold_ln has moved the norm's weights into the next layer."""
        return _NORMALIZATION_TYPES[self.normalization] + ("Pre" if self.norm_folded else "")

    @property
    def positional_embedding_type(self) -> str:
        return _POSITIONAL_TYPES[self.positional]

    @property
    def n_key_value_heads(self) -> int | None:
        """None without grouped-query attention, as in TransformerLens."""
        return None if self.n_kv_heads == self.n_heads else self.n_kv_heads

    @property
    def d_vocab_out(self) -> int:
        return self.d_vocab

    @property
    def eps(self) -> float:
        return self.norm_eps

    @property
    def parallel_attn_mlp(self) -> bool:
        return self.parallel_residual

    @property
    def original_architecture(self) -> str:
        return self.architecture

    @property
    def tokenizer_name(self) -> str:
        return self.model_name

    @property
    def use_attn_scale(self) -> bool:
        return True

    @property
    def attn_scale(self) -> float:
        return float(self.d_head) ** 0.5

    @property
    def final_rms(self) -> bool:
        return False

    @property
    def n_params(self) -> int:
        """Weights in attention and MLP matrices (TransformerLens's count: no embeddings, norms or biases)."""
        attn = self.n_layers * (2 * self.n_heads + 2 * self.n_kv_heads) * self.d_model * self.d_head
        n_mlp_matrices = 0 if self.attn_only else 3 if self.gated_mlp else 2
        mlp = self.n_layers * n_mlp_matrices * self.d_model * self.d_mlp
        return attn + mlp


class TransformerLensModel:
    """TransformerLens's `HookedTransformer` API beyond what interp's model has natively."""

    # --- loading -----------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls,
        model_name: str,
        fold_ln: bool = True,
        center_writing_weights: bool = True,
        center_unembed: bool = True,
        fold_value_biases: bool = True,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str = torch.float32,
        tokenizer: Any = None,
        hf_model: Any = None,
        **kwargs: Any,
    ) -> HookedTransformer:
        """Load a model with TransformerLens's weight processing (norms folded, writing weights and
        the unembedding centred, value biases folded into b_O); none of it changes log-probs.

        `model_name` is anything `interp.load_model` takes, or one of TransformerLens's aliases
        ("gpt2-small", "pythia-70m"); or pass `hf_model=`, a transformers model. As in
        TransformerLens, RMSNorm models skip centring (RMSNorm keeps the mean), and the device
        defaults to a GPU where there is one.
        """
        load_model = sys.modules[
            "interp.loading"
        ].load_model  # above the model classes: looked up, not imported

        if kwargs:
            raise TypeError(
                f"from_pretrained got unsupported arguments {sorted(kwargs)}; interp supports fold_ln, "
                "center_writing_weights, center_unembed, fold_value_biases, device, dtype, tokenizer, "
                "hf_model."
            )
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        model = load_model(
            _official_name(model_name) if hf_model is None else hf_model,
            device=transformer_lens_device() if device is None else device,
            dtype=dtype,
            tokenizer=tokenizer,
        )
        from interp.weights import process_weights

        layernorm = model.cfg.normalization == "layernorm"
        process_weights(
            model,
            fold_ln=fold_ln,
            center_writing_weights=center_writing_weights and layernorm,
            center_unembed=center_unembed,
            fold_value_biases=fold_value_biases,
        )
        return model

    @classmethod
    def from_pretrained_no_processing(cls, model_name: str, **kwargs: Any) -> HookedTransformer:
        """`from_pretrained` with raw weights: equal to `transformers`' model, parameter for parameter."""
        processing = ("fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases")
        return cls.from_pretrained(model_name, **{**dict.fromkeys(processing, False), **kwargs})

    # --- weights, stacked over layers ---------------------------------------------------------------

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
        """W_E and W_pos concatenated (learned positions only)."""
        if self.cfg.positional != "learned":
            raise AttributeError(f"{self.cfg.model_name} has {self.cfg.positional} positions, no W_pos.")
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
        return self.W_U[:, torch.as_tensor(tokens, device=self.W_U.device)].movedim(0, -1)

    # --- embedding as TransformerLens's modules compute it -----------------------------------------

    @property
    def embed(self) -> WeightView:
        """`model.embed(tokens)`: W_E[tokens], [batch, pos, d_model] (what hook_embed sees); `.W_E`."""
        return WeightView(lambda tokens: self.W_E[tokens], W_E=self.W_E)

    @property
    def pos_embed(self) -> WeightView:
        """`model.pos_embed(tokens)`: learned position embeddings of tokens' positions, [batch, pos,
        d_model] (what hook_pos_embed sees); `.W_pos`."""
        if self.cfg.positional != "learned":
            raise AttributeError(f"{self.cfg.model_name} has {self.cfg.positional} positions, no pos_embed.")
        return WeightView(
            lambda tokens: self.W_pos[: tokens.shape[-1]].expand(*tokens.shape, -1), W_pos=self.W_pos
        )

    # --- opt-in hooks ------------------------------------------------------------------------------

    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """hook_result: each head's output, [batch, pos, head, d_model] (costs memory)."""
        self.cfg.use_attn_result = use_attn_result

    def set_use_split_qkv_input(self, use_split_qkv_input: bool) -> None:
        """hook_q_input/k_input/v_input: per-head attention inputs, [batch, pos, head, d_model]."""
        self.cfg.use_split_qkv_input = use_split_qkv_input

    def set_use_attn_in(self, use_attn_in: bool) -> None:
        """hook_attn_in: one per-head attention input shared by q, k and v, [batch, pos, head, d_model]."""
        if use_attn_in and self.cfg.group_size > 1:
            raise ValueError(
                "hook_attn_in needs one key/value head per query head; use set_use_split_qkv_input."
            )
        self.cfg.use_attn_in = use_attn_in

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool) -> None:
        """hook_mlp_in: the MLP's input before ln2, [batch, pos, d_model]."""
        self.cfg.use_hook_mlp_in = use_hook_mlp_in

    # --- small helpers -------------------------------------------------------------------------------

    def loss_fn(
        self,
        logits: Float[Tensor, "batch pos d_vocab"],
        tokens: Int[Tensor, "batch pos"],
        attention_mask: Tensor | None = None,
        per_token: bool = False,
    ) -> Tensor:
        """Next-token cross-entropy in nats (see `interp.next_token_loss`)."""
        if attention_mask is not None:
            raise ValueError(
                "interp has no attention masks: pass unpadded tokens, or per_token=True and mask yourself."
            )
        return next_token_loss(logits, tokens, per_token=per_token)

    def to_single_str_token(self, int_token: int) -> str:
        return self.to_str_tokens(torch.tensor([int_token]))[0]

    def get_token_position(
        self,
        single_token: str | int,
        input: str | Tensor,
        mode: Literal["first", "last"] = "first",
        prepend_bos: bool | None = None,
        padding_side: Literal["left", "right"] | None = None,
    ) -> int:
        """Position of `single_token` (a string of one token, or an id) in one prompt."""
        tokens = self.to_tokens(input, prepend_bos, padding_side) if isinstance(input, str) else input
        tokens = tokens[0] if tokens.ndim == 2 and tokens.shape[0] == 1 else tokens
        if tokens.ndim != 1:
            raise ValueError(f"get_token_position takes one prompt; got shape {tuple(tokens.shape)}.")
        token = self.to_single_token(single_token) if isinstance(single_token, str) else single_token
        found = (tokens == token).nonzero()[:, 0]
        if not len(found):
            raise ValueError(f"Token {single_token!r} does not occur in the input.")
        return int(found[0] if mode == "first" else found[-1])

    def all_head_labels(self) -> list[str]:
        return [f"L{layer}H{head}" for layer in range(self.cfg.n_layers) for head in range(self.cfg.n_heads)]


class WeightView:
    """One of TransformerLens's small modules (embed, pos_embed) as a view of interp's flat
    parameters: callable like the module, with its weights as attributes (`model.embed.W_E`)."""

    def __init__(self, forward: Callable[[Tensor], Tensor], **weights: Tensor):
        self._forward = forward
        self.__dict__.update(weights)

    def __call__(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return self._forward(tokens)
