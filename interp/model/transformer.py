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

import dataclasses
import difflib
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

import interp.checks as checks
from interp.config import Config, place
from interp.io.checkpoint import save_checkpoint
from interp.io.devices import transformer_lens_device
from interp.io.sources import LoadedWeights, official_name, read_source
from interp.model.cache import ActivationCache
from interp.model.components import Block, Norm, soft_cap
from interp.model.generation import generate
from interp.model.hooks import OPT_IN_HOOKS, HookSettings, opt_in_setting
from interp.model.stacked import StackedWeights
from interp.model.tokens import decode, encode, single_token, str_tokens
from interp.model.weights import process_weights
from interp.types import head_label

ReturnType = Literal["logits", "loss", "both"] | None
Hook = tuple[str | Callable[[str], bool], Callable]
ModelInput = str | Sequence[str] | Tensor


def next_token_loss(
    logits: Float[Tensor, "batch pos d_vocab"], tokens: Int[Tensor, "batch pos"], per_token: bool = False
) -> Float[Tensor, ""] | Float[Tensor, "batch pos_minus_1"]:
    """Cross-entropy of predicting token t+1 from position t, in nats (mean, or per position)."""
    log_probs = logits[:, :-1].float().log_softmax(-1)
    loss = -log_probs.gather(-1, tokens[:, 1:, None].to(log_probs.device))[..., 0]
    return loss if per_token else loss.mean()


class HookedTransformer(StackedWeights, HookedRootModule):
    """A decoder-only transformer with TransformerLens hook names. See the module docstring.

    `tokenizer` is a `transformers` tokenizer, or None for models that work on token ids only.
    The config is copied: `model.cfg` describes this model's weights (its device and dtype follow
    the model). Opt-in hook points are switched on the model (`model.hook_settings`, `settings`).
    """

    def __init__(self, cfg: Config, tokenizer: Any = None):
        super().__init__()
        self.cfg = dataclasses.replace(cfg)
        cfg = self.cfg
        self.hook_settings = HookSettings()
        self.tokenizer = tokenizer
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))
        self.hook_embed = HookPoint()
        if cfg.positional == "learned":
            self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model))
            self.hook_pos_embed = HookPoint()
        self.blocks = nn.ModuleList(Block(cfg, layer, self.hook_settings) for layer in range(cfg.n_layers))
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

    @property
    def device(self) -> torch.device:
        return self.W_E.device

    @property
    def dtype(self) -> torch.dtype:
        return self.W_E.dtype

    def _apply(self, fn: Callable, recurse: bool = True) -> HookedTransformer:
        """Moves and casts (`to`, `cuda`, `half`, ...) keep cfg.device and cfg.dtype current."""
        super()._apply(fn, recurse)
        place(self.cfg, self.W_E.device, self.W_E.dtype)
        return self

    # --- construction from weights -------------------------------------------------------------

    @classmethod
    def from_weights(cls, loaded: LoadedWeights) -> HookedTransformer:
        """A model holding `loaded`'s weights (no random initialisation), in eval mode."""
        with torch.device("meta"):
            model = cls(loaded.cfg, loaded.tokenizer)
        missing, unexpected = model.load_state_dict(loaded.state_dict, strict=False, assign=True)
        if missing or unexpected:
            raise ValueError(
                f"The weights do not match the config of {loaded.cfg.model_name} (missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}). Re-create the checkpoint."
            )
        place(model.cfg, model.W_E.device, model.W_E.dtype)
        return model.eval()

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
        """TransformerLens's entry point: load with its weight processing (norms folded, writing
        weights and the unembedding centred, value biases folded into b_O; none of it changes
        log-probs) and its device default (a GPU where there is one).

        `model_name` is anything `interp.load_model` takes, or one of TransformerLens's aliases
        ("gpt2-small", "pythia-70m"); or pass `hf_model=`, a transformers model. As in
        TransformerLens, RMSNorm models skip centring (RMSNorm keeps the mean).
        """
        if kwargs:
            raise TypeError(
                f"from_pretrained got unsupported arguments {sorted(kwargs)}; interp supports fold_ln, "
                "center_writing_weights, center_unembed, fold_value_biases, device, dtype, tokenizer, "
                "hf_model."
            )
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        source = official_name(model_name) if hf_model is None else hf_model
        model = cls.from_weights(read_source(source, tokenizer))
        model = model.to(device=transformer_lens_device() if device is None else device, dtype=dtype)
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

    # --- opt-in hooks (see interp.model.hooks) --------------------------------------------------

    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """hook_result: each head's output, [batch, pos, head, d_model] (costs memory)."""
        self._switch_hooks(use_attn_result=use_attn_result)

    def set_use_split_qkv_input(self, use_split_qkv_input: bool) -> None:
        """hook_q_input/k_input/v_input: per-head attention inputs, [batch, pos, head, d_model]."""
        self._switch_hooks(use_split_qkv_input=use_split_qkv_input)

    def set_use_attn_in(self, use_attn_in: bool) -> None:
        """hook_attn_in: one per-head attention input shared by q, k and v, [batch, pos, head, d_model]."""
        self._switch_hooks(use_attn_in=use_attn_in)

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool) -> None:
        """hook_mlp_in: the MLP's input before ln2, [batch, pos, d_model]."""
        self._switch_hooks(use_hook_mlp_in=use_hook_mlp_in)

    def _switch_hooks(self, **settings: bool) -> None:
        allowed = set(HookSettings.names())
        if set(settings) - allowed:
            raise ValueError(f"Only {sorted(allowed)} can be changed at run time.")
        if settings.get("use_attn_in") and self.cfg.group_size > 1:
            raise ValueError(
                "hook_attn_in needs one key/value head per query head; use set_use_split_qkv_input."
            )
        for key, value in settings.items():
            setattr(self.hook_settings, key, bool(value))

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
        return [
            head_label(layer, head) for layer in range(self.cfg.n_layers) for head in range(self.cfg.n_heads)
        ]

    # --- hooks ---------------------------------------------------------------------------------

    def check_hook_name(self, name: str) -> None:
        """Raise a KeyError naming the closest hook names if `name` is not a hook point."""
        if name in self.hook_dict:
            setting = opt_in_setting(name)
            if setting is not None and not getattr(self.hook_settings, setting):
                raise KeyError(
                    f"{name!r} is an opt-in hook: call model.set_{setting}(True) "
                    f"(or use `with model.settings({setting}=True):`) to make it fire."
                )
            return
        close = difflib.get_close_matches(name, self.hook_dict.keys(), n=5, cutoff=0.6)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"No hook point named {name!r}.{hint} List them with model.hook_dict.")

    def _enable_hook(self, name: str | Callable, hook: Callable, dir: str) -> None:
        if isinstance(name, str):
            self.check_hook_name(name)
        if not callable(hook):
            raise TypeError(f"the hook at {name!r} must be a function hook(activation, hook), got {hook!r}")
        if dir == "fwd":  # a returned value replaces the activation: check it, naming the hook
            inner = hook

            def checked(activation: Tensor, hook: HookPoint) -> Any:
                out = inner(activation, hook=hook)
                checks.check_hook_output(hook.name, inner, activation, out)
                return out

            checked.__name__ = getattr(inner, "__name__", type(inner).__name__)  # TransformerLens shows it
            hook = checked
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
        names = self.hook_names(names_filter)
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
        for suffix, setting in OPT_IN_HOOKS.items():
            if not getattr(self.hook_settings, setting):
                names = [n for n in names if not n.endswith(suffix)]
        return names

    def hook_names(
        self, names_filter: str | Sequence[str] | Callable[[str], bool] | None = None
    ) -> list[str]:
        """The hook points a names_filter selects (None: every hook that fires in the current settings);
        names given explicitly are checked (`check_hook_name`)."""
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
            tokens = self.input_tokens(input, prepend_bos)
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

    def input_tokens(self, input: ModelInput, prepend_bos: bool | None = None) -> Int[Tensor, "batch pos"]:
        """Token ids [batch, pos] on the model's device from text (tokenized with the BOS policy), a
        list of texts, or ids ([pos] or [batch, pos]), checked to be integers within the vocabulary."""
        if isinstance(input, str) or (isinstance(input, Sequence) and not isinstance(input, Tensor)):
            return self.to_tokens(input, prepend_bos=prepend_bos)
        if not isinstance(input, Tensor):
            raise TypeError(f"Expected text or a tensor of token ids, got {type(input).__name__}.")
        return checks.check_tokens(self.cfg, input).to(self.device).long()  # dtype, shape, empty, range

    # --- tokenization (see interp.model.tokens) --------------------------------------------------

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
        tokens = encode(self._require_tokenizer(), self.cfg, text, prepend_bos, padding_side, truncate)
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
        tokens = self.to_tokens(input, prepend_bos, padding_side)[0] if isinstance(input, str) else input
        return str_tokens(tokenizer, tokens)

    def to_single_token(self, text: str) -> int:
        """The id of `text` if it is exactly one token (mind the leading space: " Mary")."""
        return single_token(self._require_tokenizer(), text, self.cfg.model_name)

    def to_string(self, tokens: int | Sequence[int] | Int[Tensor, "... pos"]) -> str | list[str]:
        """Text of token ids: an id, a list or [pos] tensor -> str; [batch, pos] -> one str per row."""
        return decode(self._require_tokenizer(), tokens)

    def _require_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise ValueError(
                f"{self.cfg.model_name} has no tokenizer: pass token ids instead of text, or attach one "
                "with model.tokenizer = transformers.AutoTokenizer.from_pretrained(...)."
            )
        return self.tokenizer

    # --- generation -----------------------------------------------------------------------------

    generate = generate  # interp.model.generation.generate, as a method

    # --- saving --------------------------------------------------------------------------------

    def save(self, directory: str | Path) -> Path:
        """Write a checkpoint directory (config.json, model.safetensors, tokenizer/) atomically."""
        return save_checkpoint(self, directory)

    @contextmanager
    def settings(self, **overrides: Any) -> Iterator[HookedTransformer]:
        """Temporarily change runtime settings, e.g. `with model.settings(use_attn_result=True):`."""
        old = {key: getattr(self.hook_settings, key) for key in overrides if hasattr(self.hook_settings, key)}
        try:
            self._switch_hooks(**overrides)
            yield self
        finally:
            self._switch_hooks(**old)
