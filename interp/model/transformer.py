"""A hookable decoder-only transformer.

Every activation passes through a `HookPoint` named as in TransformerLens
(`blocks.{L}.attn.hook_pattern`, ...). The forward pass, for tokens t of shape [batch, pos]:

  1. x = W_E[t] (+ W_pos[positions] for learned positions)              # [batch, pos, d_model]
     (shortformer positions p = W_pos[positions] stay out of x: each block adds p to its query and key
     inputs, after LN1)
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
  scores = soft_cap(q k^T / attn_scale), causally masked unless bidirectional (local layers: also
  beyond window_size; with an attention mask also at pads, and positions count from each prompt's
  first real token)
                                                                         # [batch, head, q_pos, k_pos]
  z = softmax(scores) v;  out = sum_h z[h] W_O[h] + b_O                  # [batch, pos, d_model]
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.utilities import Slice

import interp.checks as checks
from interp.config import Config, attach_hook_settings, place
from interp.io.checkpoint import save_checkpoint
from interp.io.devices import transformer_lens_device
from interp.io.sources import LoadedWeights, official_name, read_source
from interp.model.cache import ActivationCache, act_name, refuse_reading_padding
from interp.model.components import Block, Norm, soft_cap
from interp.model.generation import generate
from interp.model.hooks import OPT_IN_HOOKS, HookPoint, HookSettings, observer, opt_in_setting
from interp.model.kv_cache import HookedTransformerKeyValueCache
from interp.model.stacked import StackedWeights, WeightView
from interp.model.tokens import (
    RunLayout,
    TokenMethods,
    check_no_left_padding,
    first_real,
    has_pad_token,
    key_mask_and_positions,
    mark_last_positions,
    pad_token_id,
    padding_mask,
    record_padding,
    recorded_padding,
)
from interp.model.weights import process_weights, refactor_factored_attn_matrices
from interp.types import head_label

ReturnType = Literal["logits", "loss", "both"] | None
NamesFilter = str | Sequence[str] | Callable[[str], bool] | None
"""Hook names, or a filter of names (None: every hook point that fires)."""
# The families TransformerLens 2's HookedTransformer.from_pretrained runs without a BOS (Qwen 2 and 3);
# it prepends one for all others. interp.load_model keeps each model's own policy instead.
TL_NO_BOS_ARCHITECTURES = frozenset({"qwen2", "qwen3"})
DTYPE_FROM_STRING = checks.DTYPE_FROM_STRING  # TransformerLens's `HookedTransformer.DTYPE_FROM_STRING`
# Hooks whose activations are [batch, head, query_pos, key_pos]: a pos_slice keeps query positions.
_QUERY_FIRST_HOOKS = ("hook_pattern", "hook_attn_scores")
Hook = tuple[str | Callable[[str], bool], Callable]
ModelInput = str | Sequence[str] | Tensor


def _at_positions(tensor: Tensor, name: str, positions: Slice, pos_slice: Any) -> Tensor:
    """A cached activation [batch, pos, ...] (a pattern's queries: [batch, head, query, key]) at
    `run_with_cache`'s `pos_slice`; an expert's hooks (its routed tokens, no positions) whole."""
    if ".experts." in name:
        return tensor
    pos_dim = 2 if name.endswith(_QUERY_FIRST_HOOKS) else 1
    try:
        return positions.apply(tensor, dim=pos_dim)
    except IndexError as error:
        n_pos = tensor.shape[pos_dim]
        raise ValueError(
            f"pos_slice={pos_slice!r} selects positions outside the run's {n_pos} positions ({error}); "
            f"pass positions in [-{n_pos}, {n_pos})"
        ) from error


def next_token_loss(
    logits: Float[Tensor, "batch pos d_vocab"],
    tokens: Int[Tensor, "batch pos"],
    per_token: bool = False,
    attention_mask: Int[Tensor, "batch pos"] | None = None,
) -> Float[Tensor, ""] | Float[Tensor, "batch pos_minus_1"]:
    """Cross-entropy of predicting token t+1 from position t, in nats (mean, or per position).
    With an attention mask (1: real token), as TransformerLens: a position counts only where it and
    the next token are real (per_token: 0 elsewhere; the mean is over the counted positions)."""
    checks.check_loss_targets(logits, tokens)
    log_probs = logits[:, :-1].float().log_softmax(-1)
    loss = -log_probs.gather(-1, tokens[:, 1:, None].to(log_probs.device))[..., 0]
    if attention_mask is None:
        return loss if per_token else loss.mean()
    mask = attention_mask.to(loss.device).bool()
    counted = mask[:, :-1] & mask[:, 1:]
    loss = torch.where(counted, loss, 0.0)  # not loss * counted: NaN at padding stays out
    return loss if per_token else loss.sum() / counted.sum()


def _refuse_loss_over_padding(real: Int[Tensor, "batch pos"] | None, texts: bool = False) -> None:
    """Refuse the loss of prompts padded on the right, run without a given mask, where TransformerLens
    masks nothing and counts the predictions of the padding: token ids from `to_tokens` (their mean
    loss) or a list of texts (`texts`: their mean or per-token loss, whose padding interp masks)."""
    if real is None or bool(real[:, -1].all()):  # no padding, or on the left: TransformerLens masks it
        return
    prompt, what = int((~real.bool()).any(1).nonzero()[0]), "text" if texts else "prompt"
    per_token = "" if texts else ", or loss_per_token=True to mask it yourself"
    raise checks.InvalidArgumentError(
        f"these {'texts' if texts else 'token ids'} are padded on the right ({what} {prompt} has "
        f"{int(real[prompt].sum())} real tokens of {real.shape[1]}), and TransformerLens's loss of them "
        "counts the predictions of the padding; pass attention_mask=model.to_tokens_and_mask(texts)[1] to "
        f"count real tokens only (as TransformerLens does given that mask){per_token}"
    )


# TransformerLens's state-dict names of the embedding and unembedding -> interp's.
_TL_OUTER_NAMES = {"embed.W_E": "W_E", "pos_embed.W_pos": "W_pos", "unembed.W_U": "W_U", "unembed.b_U": "b_U"}


def _rename_transformer_lens_parameters(model: nn.Module, state_dict: dict, prefix: str, *args: Any) -> None:
    """Load a TransformerLens state dict: its embedding names, without its attention mask buffers,
    and without a zero b_U where this model has none (the attention's W_K names load in `Attention`)."""
    for tl_name, name in _TL_OUTER_NAMES.items():
        if prefix + tl_name in state_dict:
            state_dict[prefix + name] = state_dict.pop(prefix + tl_name)
    for key in [
        k for k in state_dict if k.endswith((".attn.mask", ".attn.IGNORE", ".rotary_sin", ".rotary_cos"))
    ]:
        del state_dict[key]
    b_U = state_dict.get(prefix + "b_U")
    if model.b_U is None and b_U is not None and not bool(b_U.any()):
        del state_dict[prefix + "b_U"]


class HookedTransformer(StackedWeights, TokenMethods, HookedRootModule):
    """A decoder-only transformer with TransformerLens hook names. See the module docstring.

    `tokenizer` is a `transformers` tokenizer, or None for models that work on token ids only.
    The config is copied: `model.cfg` describes this model's weights (its device and dtype follow
    the model). Opt-in hook points are switched on the model (`model.hook_settings`, `settings`).
    """

    def __init__(self, cfg: Config | Any, tokenizer: Any = None):
        super().__init__()
        settings: dict[str, Any] = {}
        if not isinstance(cfg, Config):
            if not callable(getattr(cfg, "model_settings", None)):
                raise TypeError(
                    f"HookedTransformer takes an interp.Config or an interp.HookedTransformerConfig, "
                    f"got {type(cfg).__name__}."
                )
            settings = cfg.model_settings(tokenizer)  # e.g. interp.HookedTransformerConfig's
            cfg, tokenizer = settings["config"], settings["tokenizer"]
        self.cfg = dataclasses.replace(cfg)
        cfg = self.cfg
        self.hook_settings = HookSettings()
        attach_hook_settings(cfg, self.hook_settings)  # cfg.use_attn_result etc. read them
        self.tokenizer = tokenizer
        self.default_padding_side = "right"  # TransformerLens's default (the tokenizer's padding_side)
        self.copied_parameters = 0  # parameters that copy others (`interp.ungrouped`'s key/value heads)
        self.run_layout: RunLayout | None = None  # the tokens of the forward pass under way (`RunLayout`)
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))
        self.hook_tokens = HookPoint()  # opt-in (use_hook_tokens)
        self.hook_embed = HookPoint()
        if cfg.learned_positions:
            self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model))
            self.hook_pos_embed = HookPoint()
        self.blocks = nn.ModuleList(Block(cfg, layer, self.hook_settings) for layer in range(cfg.n_layers))
        self.ln_final = Norm(cfg)
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab_out))
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab_out)) if cfg.unembed_bias else None
        if self.W_E.device.type != "meta":  # meta weights (from_weights) hold no values to draw
            self.init_weights()
        self.setup()
        self.register_load_state_dict_pre_hook(_rename_transformer_lens_parameters)
        if settings:
            self._switch_hooks(**settings["hook_settings"])
            device = settings["device"] or transformer_lens_device()  # TL: a GPU where there is one
            self.to(device=device, dtype=settings["dtype"])

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            prop = getattr(type(self), name, None)
            if isinstance(prop, property) and prop.fget is not None:
                prop.fget(self)  # a property that raised AttributeError: re-raise its own message
            raise

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "cfg" and "hook_settings" in self.__dict__:  # a new Config (weight processing)
            attach_hook_settings(value, self.hook_settings)
        super().__setattr__(name, value)

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
        advice = f"The weights do not match the config of {loaded.cfg.model_name}"
        try:
            missing, unexpected = model.load_state_dict(loaded.state_dict, strict=False, assign=True)
        except RuntimeError as error:  # a parameter of another shape
            shapes = [line.strip() for line in str(error).splitlines() if "size mismatch" in line]
            raise ValueError(f"{advice} ({'; '.join(shapes[:3])}). Re-create the checkpoint.") from None
        if missing or unexpected:
            raise ValueError(
                f"{advice} (missing {missing[:5]}, unexpected {unexpected[:5]}). Re-create the checkpoint."
            )
        place(model.cfg, model.W_E.device, model.W_E.dtype)
        if loaded.padding_side is not None:  # a saved model's, as it was saved
            model.default_padding_side = loaded.padding_side
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
        default_padding_side: Literal["left", "right"] = "right",
        default_prepend_bos: bool | None = None,
        refactor_factored_attn_matrices: bool = False,
        checkpoint_index: int | None = None,
        checkpoint_value: int | None = None,
        **kwargs: Any,
    ) -> HookedTransformer:
        """TransformerLens's entry point: load with its weight processing (norms folded, writing
        weights and the unembedding centred, value biases folded into b_O; none of it changes
        log-probs) and its device default (a GPU where there is one).

        `model_name` is anything `interp.load_model` takes, or one of TransformerLens's aliases
        ("gpt2-small", "pythia-70m"); or pass `hf_model=`, a transformers model. As in
        TransformerLens, RMSNorm models skip centring (RMSNorm keeps the mean).

        `default_padding_side` is where `to_tokens` pads (and "left" masks leading pad ids of token
        input); `default_prepend_bos` is whether `to_tokens` prepends BOS (None: TransformerLens 2's
        `HookedTransformer.from_pretrained` default, True for every model with a BOS token except Qwen 2/3;
        TL 4's `TransformerBridge` also leaves it out for GPT-NeoX, Phi, Granite and SmolLM3: pass
        False to compare with those; `interp.load_model` keeps the model's
        own policy instead); `refactor_factored_attn_matrices` rebalances W_Q/W_K and W_V/W_O per head as TL
        does (same outputs). `checkpoint_index`/`checkpoint_value` raise: interp loads one checkpoint.
        """
        if checkpoint_index is not None or checkpoint_value is not None:
            raise ValueError(
                "interp loads one checkpoint, not a training run's series: pass the checkpoint itself "
                "(a path or hub revision) as model_name, without checkpoint_index/checkpoint_value."
            )
        if default_padding_side not in ("left", "right"):
            raise ValueError(f"default_padding_side must be 'left' or 'right', got {default_padding_side!r}.")
        if kwargs:
            raise TypeError(
                f"from_pretrained got unsupported arguments {sorted(kwargs)}; interp supports fold_ln, "
                "center_writing_weights, center_unembed, fold_value_biases, device, dtype, tokenizer, "
                "hf_model, default_padding_side, default_prepend_bos, refactor_factored_attn_matrices."
            )
        dtype = checks.check_dtype(dtype)
        source = official_name(model_name) if hf_model is None else hf_model
        model = cls.from_weights(read_source(source, tokenizer))
        model = model.to(device=transformer_lens_device() if device is None else device, dtype=dtype)
        layernorm = model.cfg.normalization == "layernorm"
        if center_unembed and model.cfg.output_logits_soft_cap:  # as TransformerLens: skipped, with a word
            warnings.warn(
                f"{model.cfg.model_name} soft-caps its logits, so centring W_U would change its "
                "probabilities: center_unembed is not applied.",
                stacklevel=2,
            )
            center_unembed = False
        process_weights(
            model,
            fold_ln=fold_ln,
            center_writing_weights=center_writing_weights and layernorm,
            center_unembed=center_unembed,
            fold_value_biases=fold_value_biases,
        )
        if refactor_factored_attn_matrices:
            model.refactor_factored_attn_matrices()
        if model.b_U is None:  # TransformerLens's models always hold b_U (zeros where it was none)
            model.b_U = nn.Parameter(torch.zeros(model.cfg.d_vocab_out, device=model.W_U.device, dtype=dtype))
            model.cfg.unembed_bias = True
        model.default_padding_side = default_padding_side
        if default_prepend_bos is None:  # TransformerLens's default: BOS first, but where TL loads without
            bos = model.cfg.bos_token_id
            bos = getattr(model.tokenizer, "bos_token_id", None) if bos is None else bos
            default_prepend_bos = bos is not None and model.cfg.architecture not in TL_NO_BOS_ARCHITECTURES
        model.cfg.default_prepend_bos = default_prepend_bos
        return model

    def tl_parameters(self) -> dict[str, Tensor]:
        """The parameters under TransformerLens's names (`embed.W_E`, `unembed.W_U`,
        `blocks.0.attn.W_K`, ...; key/value weights per query head, as TL's HookedTransformer), for
        TL 4's tools that read them (`SVDInterpreter`); `load_state_dict` takes these names too."""
        outer = {name: tl_name for tl_name, name in _TL_OUTER_NAMES.items()}
        params = {}
        for name, param in self.named_parameters():
            module, _, attr = name.rpartition(".")
            if attr in ("_W_K", "_W_V", "_b_K", "_b_V"):  # per query head, as TL's
                params[f"{module}.{attr[1:]}"] = getattr(self.get_submodule(module), attr[1:])
            else:
                params[outer.get(name, name)] = param
        return params

    def refactor_factored_attn_matrices(self) -> None:
        """TransformerLens's rebalancing of W_Q/W_K and W_V/W_O per head, in place
        (`interp.model.weights.refactor_factored_attn_matrices`); outputs are unchanged."""
        refactor_factored_attn_matrices(self)

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

    def set_ungroup_grouped_query_attention(self, ungroup: bool) -> None:
        """hook_k, hook_v (and hook_k_input, hook_v_input) per query head under grouped-query attention."""
        self._switch_hooks(ungroup_grouped_query_attention=ungroup)

    def _switch_hooks(self, **settings: bool) -> None:
        self.hook_settings.switch(self.cfg.group_size, **settings)

    # --- small helpers -------------------------------------------------------------------------------

    def loss_fn(
        self,
        logits: Float[Tensor, "batch pos d_vocab"],
        tokens: Int[Tensor, "batch pos"],
        attention_mask: Tensor | None = None,
        per_token: bool = False,
    ) -> Tensor:
        """Next-token cross-entropy in nats (see `interp.next_token_loss`; padding excluded with a mask)."""
        return next_token_loss(logits, tokens, per_token=per_token, attention_mask=attention_mask)

    def all_head_labels(self) -> list[str]:
        return [
            head_label(layer, head) for layer in range(self.cfg.n_layers) for head in range(self.cfg.n_heads)
        ]

    # --- hooks ---------------------------------------------------------------------------------

    def check_hooks_to_add(
        self,
        hook_point: HookPoint,
        hook_point_name: str,
        hook: Callable,
        dir: Literal["fwd", "bwd"] = "fwd",
        is_permanent: bool = False,
        prepend: bool = False,
    ) -> None:
        """TransformerLens's check before `model.add_hook` adds a hook: an opt-in hook that is switched
        off raises (`check_hook_name`; an AssertionError too, as TL's), instead of never firing."""
        self.check_hook_name(hook_point_name)

    def check_hook_name(self, name: str) -> None:
        """Raise a KeyError naming the closest hook names if `name` is not a hook point."""
        if name in self.hook_dict:
            setting = opt_in_setting(name)
            if setting is not None and not getattr(self.hook_settings, setting):
                raise checks.HookNameError(
                    f"{name!r} is an opt-in hook: call model.set_{setting}(True) "
                    f"(or use `with model.settings({setting}=True):`) to make it fire."
                )
            return
        close = difflib.get_close_matches(name, self.hook_dict.keys(), n=5, cutoff=0.6)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise checks.HookNameError(f"No hook point named {name!r}.{hint} List them with model.hook_dict.")

    def add_hook(
        self,
        name: str | Callable[[str], bool],
        hook: Callable,
        dir: Literal["fwd", "bwd"] = "fwd",
        is_permanent: bool = False,
        level: int | None = None,
        prepend: bool = False,
    ) -> None:
        """TransformerLens's `add_hook`: a hook name (an opt-in hook switched off raises), or a filter
        of names, which adds the hook to the hook points it selects that fire (`hook_names`)."""
        if isinstance(name, str):
            self.check_hook_name(name)  # an unknown name: HookNameError with suggestions, as hooks()
        for point in [name] if isinstance(name, str) else self.hook_names(name):
            super().add_hook(point, hook, dir, is_permanent, level, prepend)

    def _enable_hook(self, name: str | Callable, hook: Callable, dir: str) -> None:
        """`hooks()` and `run_with_hooks`: a name is checked, a filter selects hook points that fire."""
        for point in [name] if isinstance(name, str) else self.hook_names(name):
            self.check_hook_name(point)
            super()._enable_hook(point, hook, dir)

    def add_caching_hooks(self, names_filter: NamesFilter = None, *args: Any, **kwargs: Any) -> dict:
        """TransformerLens's, caching the hook points `names_filter` selects that fire (`hook_names`)."""
        return super().add_caching_hooks(self.hook_names(names_filter), *args, **kwargs)

    def get_caching_hooks(self, names_filter: NamesFilter = None, *args: Any, **kwargs: Any) -> tuple:
        """TransformerLens's (cache, fwd hooks, bwd hooks) for the hook points `names_filter` selects
        that fire (`hook_names`)."""
        return super().get_caching_hooks(self.hook_names(names_filter), *args, **kwargs)

    def remove_all_hook_fns(
        self,
        direction: Literal["fwd", "bwd", "both"] = "both",
        including_permanent: bool = False,
        level: int | None = None,
    ) -> None:
        """TransformerLens's, visiting only the hook points that hold hooks: each reset (every
        `hooks()` context's end) then costs microseconds, not a module write per hook point."""
        for hook_point in self.hook_points():
            if hook_point.fwd_hooks or hook_point.bwd_hooks:
                hook_point.remove_hooks(direction, including_permanent=including_permanent, level=level)

    def clear_contexts(self) -> None:
        """TransformerLens's, visiting only the hook points whose context holds something."""
        for hook_point in self.hook_points():
            if hook_point.ctx:
                hook_point.clear_context()

    def run_with_cache(
        self,
        input: ModelInput,
        names_filter: NamesFilter = None,
        device: str | torch.device | None = None,
        return_type: ReturnType = "logits",
        incl_bwd: bool = False,
        remove_batch_dim: bool = False,
        pos_slice: int | slice | tuple | list | Tensor | Slice | None = None,
        reset_hooks_end: bool = True,
        clear_contexts: bool = False,
        return_cache_object: bool = True,
        **forward_kwargs: Any,
    ) -> tuple[Any, ActivationCache | dict[str, Tensor]]:
        """Run the model and cache activations of the hooks that `names_filter` selects.

        Only the selected hooks are cached (a single name costs no more than a forward pass).
        With return_type=None the forward stops after the last block a selected hook lives in.
        `device` moves each cached tensor as it is made (e.g. "cpu" to free GPU memory); `incl_bwd`
        runs `.backward()` on the output (one value: return_type="loss"), as TransformerLens does, and
        also caches the gradients under "<name>_grad";
        `remove_batch_dim` drops the batch dim of a one-prompt run's cache. `pos_slice` keeps only those
        positions (TransformerLens's `Slice`: an int keeps its dim) of every activation [batch, pos, ...],
        of the query dim of patterns; a mixture-of-experts layer's `experts.E` hooks (that expert's
        routed tokens, no position axis) are kept whole.
        As TransformerLens: `clear_contexts` clears every hook's context after the run, and
        `return_cache_object=False` gives the cache as a dict; `reset_hooks_end=False` (the caching
        hooks left on the model) is refused.
        """
        if not reset_hooks_end:
            raise ValueError(
                "run_with_cache(reset_hooks_end=False) would leave its caching hooks on the model, which "
                "interp does not do: for hooks that stay, use add_hook(..., is_permanent=True) or "
                "model.hooks(...)"
            )
        names = self.hook_names(names_filter)
        start, stop = self._layer_range(
            forward_kwargs.get("start_at_layer"), forward_kwargs.get("stop_at_layer")
        )
        if forward_kwargs.get("start_at_layer") is not None:
            forward_kwargs["start_at_layer"] = start
        if forward_kwargs.get("stop_at_layer") is not None:
            forward_kwargs["stop_at_layer"] = stop
        may_stop = (
            return_type is None
            and not incl_bwd
            and forward_kwargs.get("stop_at_layer") is None
            and forward_kwargs.get("past_kv_cache") is None
        )
        # the last block a cached hook or a hook on the model (add_hook, hooks()) needs
        hooked = [name for name, point in self.hook_dict.items() if point.has_hooks()] if may_stop else []
        needed = self._blocks_needed([*names, *hooked]) if may_stop else self.cfg.n_layers
        stop_early = needed < self.cfg.n_layers
        if stop_early:
            forward_kwargs["stop_at_layer"] = max(needed, start)
        cache: dict[str, Tensor] = {}

        real_tokens = self._real_tokens(input, forward_kwargs)
        positions = None if pos_slice is None else Slice.unwrap(pos_slice)
        if positions is not None:  # only these positions are kept: every prompt's must be real
            refuse_reading_padding(real_tokens, pos_slice, None, "run_with_cache of a padded batch")
            real_tokens = None

        def kept(tensor: Tensor, name: str) -> Tensor:
            tensor = tensor.detach().to(device) if device else tensor.detach()
            return tensor if positions is None else _at_positions(tensor, name, positions, pos_slice)

        @observer  # reads only: the run computes what it computes uncached (fused attention too)
        def save(tensor: Tensor, hook: HookPoint) -> None:
            cache[hook.name] = kept(tensor, hook.name)

        def save_grad(tensor: Tensor, hook: HookPoint) -> None:
            cache[f"{hook.name}_grad"] = kept(tensor, hook.name)

        fwd = [(name, save) for name in names]
        bwd = [(name, save_grad) for name in names] if incl_bwd else []
        was_caching, self.is_caching = self.is_caching, True  # forward leaves the non-finite check to us
        try:
            with self.hooks(fwd_hooks=fwd, bwd_hooks=bwd):
                out = self(input, return_type=return_type, **forward_kwargs)
                if incl_bwd:
                    self._backward_of(out)
        finally:
            self.is_caching = was_caching
        self._warn_if_cache_non_finite(cache, out)
        if clear_contexts:
            self.clear_contexts()
        cache = ActivationCache(cache, self, real_tokens=real_tokens)
        cache = cache.remove_batch_dim() if remove_batch_dim else cache
        return (None if stop_early else out), (cache if return_cache_object else dict(cache.items()))

    @staticmethod
    def _backward_of(out: Any) -> None:
        """`run_with_cache(incl_bwd=True)`'s backward pass, from its one-value output."""
        if not isinstance(out, Tensor) or out.numel() != 1 or not out.requires_grad:
            raise ValueError(
                "run_with_cache(incl_bwd=True) runs .backward() on the output, as TransformerLens does, so "
                "it needs one value with a gradient: pass return_type='loss' (not under torch.no_grad()); "
                "for another metric, cache with a backward hook (model.hooks(bwd_hooks=...)) and call "
                "metric(logits).backward() yourself"
            )
        out.backward()

    def _real_tokens(self, input: ModelInput, forward_kwargs: dict[str, Any]) -> Tensor | None:
        """Each prompt's real tokens [batch, pos] (bool) in a run of `forward(input, **forward_kwargs)`:
        its exact mask (text, ids from `to_tokens`, `attention_mask=`), else the positions up to each
        prompt's last real token (`last_positions`); None where no prompt is padded."""
        mask = forward_kwargs.get("attention_mask")
        if forward_kwargs.get("start_at_layer") is None:
            tokens, mask = self._tokens_and_mask(
                input,
                forward_kwargs.get("prepend_bos"),
                forward_kwargs.get("padding_side"),
                mask,
                forward_kwargs.get("past_kv_cache") is not None,
            )
            mask = recorded_padding(tokens) if mask is None else mask
            last = None if mask is not None else self._last_positions_of(tokens, None)
            if last is not None:
                mask = torch.arange(tokens.shape[1], device=last.device) <= last[:, None]
        if mask is None:
            return None
        mask = torch.as_tensor(mask).bool()
        return None if bool(mask.all()) else mask

    def _warn_if_cache_non_finite(self, cache: dict[str, Tensor], out: Any) -> None:
        """Warn, naming the first cached hook (in the order they fired) that holds NaN/inf, if the output
        (or, without one, any cached activation) is not finite."""
        outputs = [t for t in (out if isinstance(out, tuple) else [out]) if isinstance(t, Tensor)]
        checked = [("", t) for t in outputs] or list(cache.items())
        if not checked or checked[0][1].device.type == "meta":
            return
        device = checked[0][1].device
        if bool(torch.stack([checks.all_finite(t, name).to(device) for name, t in checked]).all()):
            return
        first = next((name for name, t in cache.items() if not bool(checks.all_finite(t, name))), None)
        where = f"{first} (the first cached hook holding them)" if first else "a hook that was not cached"
        what = "the outputs" if outputs else "the cached activations"
        checks.warn_non_finite(where, what, self.state_dict())

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

    def hook_names(self, names_filter: NamesFilter = None) -> list[str]:
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

    def layer_hook_names(self, name: str) -> list[str]:
        """The hook `name` (`act_name`'s shorthand) of every block, in layer order:
        layer_hook_names("z") -> ["blocks.0.attn.hook_z", ...], every head's z."""
        return [act_name(name, layer) for layer in range(self.cfg.n_layers)]

    def head_contribution_hook_names(self) -> list[str]:
        """What `ActivationCache.stack_head_contributions` reads of a run: every block's hook_z and, in a
        post-norm model, its ln1_post.hook_scale (each head's share is taken at that scale)."""
        names = self.layer_hook_names("z")
        if self.cfg.post_norm:
            names += [f"blocks.{layer}.ln1_post.hook_scale" for layer in range(self.cfg.n_layers)]
        return names

    # --- forward -------------------------------------------------------------------------------

    def _layer_range(self, start_at_layer: int | None, stop_at_layer: int | None) -> tuple[int, int]:
        """The blocks `blocks[start_at_layer:stop_at_layer]` runs, as (start, stop) in [0, n_layers];
        negative values count from the end as in Python and TransformerLens (stop_at_layer=-1: all
        blocks but the last). Values outside [-n_layers, n_layers] raise (a slice would clip them)."""
        n = self.cfg.n_layers
        bounds = []
        for name, value, default in (
            ("start_at_layer", start_at_layer, 0),
            ("stop_at_layer", stop_at_layer, n),
        ):
            if value is None:
                bounds.append(default)
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not -n <= value <= n:
                raise ValueError(
                    f"{name}={value!r}: {self.cfg.model_name} has {n} blocks, so it must be an int in "
                    f"[{-n}, {n}] (negative values count from the end, as in blocks[{name.split('_')[0]}:])."
                )
            bounds.append(int(value) + n if value < 0 else int(value))
        return bounds[0], bounds[1]

    def forward(
        self,
        input: ModelInput,
        return_type: ReturnType = "logits",
        loss_per_token: bool = False,
        prepend_bos: bool | None = None,
        padding_side: Literal["left", "right"] | None = None,
        start_at_layer: int | None = None,
        tokens: Int[Tensor, "batch pos"] | None = None,
        attention_mask: Int[Tensor, "batch pos"] | None = None,
        stop_at_layer: int | None = None,
        past_kv_cache: HookedTransformerKeyValueCache | None = None,
        shortformer_pos_embed: Float[Tensor, "batch pos d_model"] | None = None,
    ) -> Any:
        """Tokens [batch, pos] (or text) -> logits [batch, pos, d_vocab], loss, or both.

        `loss` is the mean next-token cross-entropy in nats ([batch, pos-1] with loss_per_token).
        `start_at_layer=L` takes the residual stream before block L ([batch, pos, d_model]) as
        input (`tokens=` then gives the loss its targets); `stop_at_layer=L` returns the residual
        stream before block L; negative L count from the end (TransformerLens's slice
        `blocks[start_at_layer:stop_at_layer]`). `past_kv_cache` (a `HookedTransformerKeyValueCache`)
        holds the keys and values of earlier calls: the input continues them and is appended.

        Padding, as TransformerLens: `attention_mask` [batch, pos] (1: real token, 0: pad) keeps every
        query from attending to pads and counts positions from each prompt's first real token
        (learned and rotary positions), so a left-padded prompt gives the logits it gives alone.
        A list of texts of mixed lengths builds its mask itself (padded on `padding_side`, default
        `model.default_padding_side`); token ids get TransformerLens's mask from their pad ids when
        they are padded on the left (`padding_side`, else `default_padding_side`) or continue a KV cache.
        Bidirectional models refuse padding masks and KV caches (`_check_bidirectional_run`).

        `shortformer_pos_embed` [batch, pos, d_model]: a shortformer model's positions (what
        `input_to_embed` returns third), which every block adds to its query and key inputs; a run
        from tokens makes them itself, one from a residual stream (`start_at_layer=`) needs them.
        """
        start, stop = self._layer_range(start_at_layer, stop_at_layer)
        self._check_shortformer_pos_embed(shortformer_pos_embed, start_at_layer is not None and start < stop)
        given_mask = exact_mask = attention_mask  # given, or recorded on the ids: last real tokens exactly
        if start_at_layer is None:
            tokens, attention_mask = self._tokens_and_mask(
                input, prepend_bos, padding_side, attention_mask, past_kv_cache is not None
            )
            exact_mask = recorded_padding(tokens) if exact_mask is None else exact_mask
            batch, n_pos = tokens.shape
        else:
            residual = checks.check_residual(input, self.cfg.d_model, start_at_layer)
            batch, n_pos = residual.shape[:2]
        self._check_bidirectional_run(attention_mask, past_kv_cache)
        past_mask = None if past_kv_cache is None else past_kv_cache.previous_attention_mask
        key_mask, positions = key_mask_and_positions(attention_mask, batch, n_pos, past_mask, self.device)
        n_cached = 0 if past_kv_cache is None else past_kv_cache.n_cached
        if past_kv_cache is not None:
            past_kv_cache.check_fits(self.cfg, (start, stop))
            current = torch.ones(batch, n_pos, dtype=torch.long) if attention_mask is None else attention_mask
            past_kv_cache.append_attention_mask(current)
        with self._laid_out(RunLayout(positions, (exact_mask, attention_mask), n_cached, n_pos)):
            if start_at_layer is None:
                if self.hook_settings.use_hook_tokens:
                    tokens = self.hook_tokens(tokens)
                query_mask = None if attention_mask is None else attention_mask.to(self.device)
                residual, shortformer_pos_embed = self._embed(tokens, n_cached, positions, query_mask)
            elif shortformer_pos_embed is not None:
                shortformer_pos_embed = shortformer_pos_embed.to(residual.device, residual.dtype)
            # the residual stream after each stage, read once at the end
            finite = [checks.all_finite(residual)]
            for layer in range(start, stop):
                residual = self.blocks[layer](
                    residual,
                    past_kv_cache_entry=None if past_kv_cache is None else past_kv_cache[layer],
                    attention_mask=key_mask,
                    positions=positions,
                    shortformer_pos_embed=shortformer_pos_embed,
                )
                finite.append(checks.all_finite(residual))
            if stop_at_layer is not None:
                returned = "the returned residual values"
                self._warn_if_non_finite(finite, start, start_at_layer is None, returned)
                return residual
            normalized = self.ln_final(residual)  # runs with return_type=None too: its hooks fire, as TL's
        if return_type is None:
            self._warn_if_non_finite(finite, start, start_at_layer is None, "the activations")
            return None
        logits = self._unembed(normalized)
        text = isinstance(input, str) or (isinstance(input, Sequence) and not isinstance(input, Tensor))
        if start_at_layer is None and past_kv_cache is None and not (text and attention_mask is None):
            # each prompt's last real token (text: from its exact mask), so metrics refuse padding
            last, first = self._last_positions_of(tokens, exact_mask), first_real(exact_mask)
            mark_last_positions(logits, last, first)
        finite.append(checks.all_finite(logits))
        self._warn_if_non_finite(finite, start, start_at_layer is None, "the logits")
        if return_type == "logits":
            return logits
        if tokens is None:
            raise ValueError("return_type='loss' after start_at_layer needs the targets: pass tokens=.")
        if attention_mask is None and not loss_per_token:
            _refuse_loss_over_padding(recorded_padding(tokens))
        _refuse_loss_over_padding(attention_mask if text and given_mask is None else None, texts=True)
        loss = next_token_loss(logits, tokens, per_token=loss_per_token, attention_mask=attention_mask)
        return loss if return_type == "loss" else (logits, loss)

    def _check_shortformer_pos_embed(self, pos_embed: Tensor | None, runs_blocks_from_residual: bool) -> None:
        """Refuse positions a model does not read, and a shortformer model's blocks run from a residual
        stream without them (TransformerLens would run them without positions)."""
        shortformer = self.cfg.positional == "shortformer"
        if pos_embed is not None and not shortformer:
            raise ValueError(
                f"shortformer_pos_embed is for shortformer positions; {self.cfg.model_name} has "
                f"{self.cfg.positional!r} positions, so pass None (what input_to_embed returns)."
            )
        if shortformer and runs_blocks_from_residual and pos_embed is None:
            raise ValueError(
                f"{self.cfg.model_name} has shortformer positions: each block adds them to its query and key "
                "inputs, and the residual stream does not hold them. Pass shortformer_pos_embed= "
                "(input_to_embed's third value, [batch, pos, d_model]) with start_at_layer."
            )

    def _check_bidirectional_run(self, attention_mask: Tensor | None, past_kv_cache: Any) -> None:
        """Bidirectional attention runs unpadded prompts without a KV cache (else raise, saying why)."""
        if self.cfg.causal:
            return
        if past_kv_cache is not None:
            raise ValueError(
                f"{self.cfg.model_name} has bidirectional attention: every position attends to later ones, "
                "so keys and values cached before a token was appended are not what a run of the whole "
                "sequence computes. Run the whole sequence without past_kv_cache (generation is undefined)."
            )
        if attention_mask is not None and not bool(torch.as_tensor(attention_mask).bool().all()):
            raise ValueError(
                f"{self.cfg.model_name} has bidirectional attention and this batch is padded: "
                "TransformerLens's bidirectional attention ignores the padding mask (real tokens attend to "
                "pads), interp would mask them, so neither is chosen silently. Run prompts of one length "
                "(or one prompt at a time)."
            )

    def _warn_if_non_finite(self, finite: list[Tensor], start: int, embedded: bool, output: str) -> None:
        """Warn, naming the first stage, if the residual stream after the embedding (or the input), a
        block, or the logits (the last flag when present) turned non-finite. One read of the flags; no
        warning here while `run_with_cache` runs, which names the first cached hook itself."""
        if self.is_caching or finite[0].device.type == "meta":
            return
        flags = torch.stack([flag.to(finite[0].device) for flag in finite])
        if bool(flags.all()):
            return
        stage = int((~flags).nonzero()[0])
        if stage == 0:
            where = (
                "hook_embed (the embedding)" if embedded else f"the input residual stream of block {start}"
            )
        elif stage < len(finite) - (output == "the logits"):
            where = f"blocks.{start + stage - 1}.hook_resid_post (the output of block {start + stage - 1})"
        else:
            where = "the logits (ln_final and the unembedding)"
        checks.warn_non_finite(where, output, self.state_dict())

    def _tokens_and_mask(
        self,
        input: ModelInput,
        prepend_bos: bool | None,
        padding_side: Literal["left", "right"] | None,
        attention_mask: Tensor | None,
        continues_cache: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Token ids and the attention mask to run them with (None: no padding to mask)."""
        if isinstance(input, str) or (isinstance(input, Sequence) and not isinstance(input, Tensor)):
            tokens, lengths_mask = self.to_tokens_and_mask(input, prepend_bos, padding_side)
            mask = lengths_mask if attention_mask is None else attention_mask
        else:
            tokens = self.input_tokens(input, prepend_bos)
            recorded = recorded_padding(tokens)
            mask = attention_mask
            side = self.default_padding_side if padding_side is None else padding_side
            if mask is None and recorded is not None:  # ids from to_tokens: their padding is known
                # left padding masked; right padding runs unmasked, as TransformerLens's (no real token
                # attends to it; metrics read each prompt's last real token from the record), but not
                # into a KV cache: the tokens that continue it follow the padding and must not read it
                left_padded = bool(recorded[:, 0].eq(0).any())
                mask = recorded if left_padded or continues_cache else None
            elif mask is None and self.tokenizer is not None:
                bos = self.cfg.bos_token_id
                bos = self.tokenizer.bos_token_id if bos is None else bos
                prepend = self.cfg.default_prepend_bos if prepend_bos is None else prepend_bos
                if side == "left" or continues_cache:
                    mask = padding_mask(tokens, pad_token_id(self.tokenizer), side, prepend, bos)
                elif padding_side is None and has_pad_token(self.tokenizer):
                    check_no_left_padding(tokens, pad_token_id(self.tokenizer), prepend, bos)
        if mask is None:
            return tokens, None
        mask = checks.check_attention_mask(mask, tokens.shape, self.device)
        return tokens, (None if bool(mask.bool().all()) else mask.long())

    def attention_mask_of(
        self,
        input: ModelInput,
        prepend_bos: bool | None = None,
        padding_side: Literal["left", "right"] | None = None,
    ) -> Int[Tensor, "batch pos"] | None:
        """The attention mask [batch, pos] (1: real token) `forward` runs `input` with: for runs that
        start after the embedding (`start_at_layer=`, `attention_mask=`). None: nothing is masked
        (no padding, or token ids padded on the right, whose padding no real token attends to)."""
        return self._tokens_and_mask(input, prepend_bos, padding_side, None)[1]

    def first_positions(self, input: ModelInput) -> Int[Tensor, " batch"]:
        """Each prompt's first real token [batch] on the CPU: its left padding's length (0 without)."""
        tokens, mask = self._tokens_and_mask(input, None, None, None)
        first = first_real(mask)
        return torch.zeros(tokens.shape[0], dtype=torch.long) if first is None else first

    def input_to_embed(
        self,
        input: ModelInput,
        prepend_bos: bool | None = None,
        padding_side: Literal["left", "right"] | None = None,
        attention_mask: Tensor | None = None,
        past_kv_cache: HookedTransformerKeyValueCache | None = None,
    ) -> tuple[
        Float[Tensor, "batch pos d_model"],
        Int[Tensor, "batch pos"],
        Float[Tensor, "batch pos d_model"] | None,
        Tensor | None,
    ]:
        """TransformerLens's first step of forward: (residual before block 0, tokens, the shortformer
        positions (None unless the model has them), attention mask (None: no padding)).
        `model(residual, start_at_layer=0, attention_mask=mask, shortformer_pos_embed=...)` continues it."""
        continues_cache = past_kv_cache is not None
        tokens, mask = self._tokens_and_mask(
            input, prepend_bos, padding_side, attention_mask, continues_cache
        )
        if self.hook_settings.use_hook_tokens:
            tokens = self.hook_tokens(tokens)
        past_mask = None if past_kv_cache is None else past_kv_cache.previous_attention_mask
        _, positions = key_mask_and_positions(mask, *tokens.shape, past_mask, self.device)
        query_mask = None if mask is None else mask.to(self.device)
        n_cached = 0 if past_kv_cache is None else past_kv_cache.n_cached
        residual, shortformer_pos_embed = self._embed(tokens, n_cached, positions, query_mask)
        return residual, tokens, shortformer_pos_embed, mask

    def toggle_autodiff(self, mode: bool = False) -> None:
        """Turn autograd off (or on) globally, as TransformerLens: `torch.set_grad_enabled(mode)`."""
        torch.set_grad_enabled(mode)

    @property
    def unembed(self) -> WeightView:
        """`model.unembed(x)`: x W_U + b_U, soft-capped where the model caps its logits (Gemma 2),
        [batch, pos, d_vocab]; `.W_U`, `.b_U` (zeros where the model has no bias, as TransformerLens)."""
        b_U = self.b_U if self.b_U is not None else torch.zeros(self.cfg.d_vocab_out, device=self.W_U.device)
        return WeightView(self._unembed, W_U=self.W_U, b_U=b_U.to(self.W_U.dtype))

    def _unembed(
        self, x: Float[Tensor, "batch pos d_model"], columns: Int[Tensor, " k"] | None = None
    ) -> Float[Tensor, "batch pos d_vocab"]:
        """The logits of every token, or only of the token ids `columns` ([batch, pos, k])."""
        W_U, b_U = self.W_U, self.b_U
        if columns is not None:
            columns = columns.to(W_U.device)
            W_U, b_U = W_U[:, columns], None if b_U is None else b_U[columns]
        logits = x.to(W_U.device) @ W_U
        logits = logits if b_U is None else logits + b_U
        return soft_cap(logits, self.cfg.output_logits_soft_cap)

    def _embed(
        self,
        tokens: Int[Tensor, "batch pos"],
        offset: int = 0,
        positions: Tensor | None = None,
        query_mask: Tensor | None = None,
    ) -> tuple[Float[Tensor, "batch pos d_model"], Float[Tensor, "batch pos d_model"] | None]:
        """(the residual stream before block 0, the shortformer positions or None) of `tokens` that
        follow `offset` cached positions."""
        if offset + tokens.shape[1] > self.cfg.n_ctx:
            raise ValueError(
                f"The input has {offset + tokens.shape[1]} tokens but {self.cfg.model_name} has a "
                f"context of {self.cfg.n_ctx}; shorten or split the prompt."
            )
        residual = self.hook_embed(self.W_E[tokens])
        if not self.cfg.learned_positions:
            return residual, None
        if positions is None:
            # a copy per prompt, not a view of W_pos: a hook may edit it in place (as in TL)
            pos_embed = self.W_pos[offset : offset + tokens.shape[1]].expand_as(residual).clone()
        else:  # per prompt, past its left padding; zero at pads (as TransformerLens)
            pos_embed = self.W_pos[positions.to(self.W_pos.device)]
            if query_mask is not None:
                pos_embed = pos_embed * query_mask[..., None].to(pos_embed.dtype)
        pos_embed = self.hook_pos_embed(pos_embed)
        if self.cfg.positional == "shortformer":
            return residual, pos_embed
        return residual + pos_embed, None

    def input_tokens(self, input: ModelInput, prepend_bos: bool | None = None) -> Int[Tensor, "batch pos"]:
        """Token ids [batch, pos] on the model's device from text (tokenized with the BOS policy), a
        list of texts, or ids ([pos] or [batch, pos]), checked to be integers within the vocabulary."""
        if isinstance(input, str) or (isinstance(input, Sequence) and not isinstance(input, Tensor)):
            return self.to_tokens(input, prepend_bos=prepend_bos)
        if not isinstance(input, Tensor):
            raise TypeError(f"Expected text or a tensor of token ids, got {type(input).__name__}.")
        tokens = checks.check_tokens(self.cfg, input).to(self.device).long()  # dtype, shape, empty, range
        mask = recorded_padding(input)
        return tokens if mask is None else record_padding(tokens, mask.to(self.device))

    # --- generation -----------------------------------------------------------------------------

    generate = generate  # interp.model.generation.generate, as a method

    # --- saving --------------------------------------------------------------------------------

    def save(self, directory: str | Path) -> Path:
        """Write a checkpoint directory (config.json, model.safetensors, tokenizer/) atomically."""
        return save_checkpoint(self, directory)

    @contextmanager
    def _laid_out(self, layout: RunLayout) -> Iterator[None]:
        """Within: `run_layout` is `layout` (a forward pass's tokens, for its hooks)."""
        outer, self.run_layout = self.run_layout, layout
        try:
            yield
        finally:
            self.run_layout = outer

    @contextmanager
    def given_z(self, values: Mapping[int, Tensor]) -> Iterator[HookedTransformer]:
        """Within: block L's heads output values[L] [batch, pos, head, d_head] instead of computing
        z, for runs whose z is wholly overwritten (frozen or ablated heads). hook_z, hook_result and
        everything after them run as usual; q, k, v and the pattern are computed only when a hook
        observes them (or a KV cache is filled), so no hook sees something else than without it."""
        for layer in values:
            if not 0 <= layer < self.cfg.n_layers:
                raise ValueError(f"given_z: layer {layer} out of range, the model has {self.cfg.n_layers}")
        try:
            for layer, z in values.items():
                self.blocks[layer].attn.given_z = z
            yield self
        finally:
            for layer in values:
                self.blocks[layer].attn.given_z = None

    def run_state(self) -> tuple:
        """What a cached run of this model stays valid under: the hooks on it (each registration's
        id), its parameters' tensors (where their data lives, dtype and device: weights replaced
        without an in-place op, `load_state_dict(assign=True)`, `param.data = ...`, `model.to(...)`)
        and in-place versions, and its hook settings. An equal state computes the same activations."""
        hooks = tuple((name, point.hook_ids()) for name, point in self.hook_dict.items() if point.has_hooks())
        versions = tuple(
            (parameter.data_ptr(), parameter.dtype, parameter.device, parameter._version)
            for parameter in self.parameters()
        )
        settings = tuple(getattr(self.hook_settings, name) for name in self.hook_settings.names())
        return hooks, versions, settings

    @contextmanager
    def settings(self, **overrides: Any) -> Iterator[HookedTransformer]:
        """Temporarily change runtime settings, e.g. `with model.settings(use_attn_result=True):`."""
        old = {key: getattr(self.hook_settings, key) for key in overrides if hasattr(self.hook_settings, key)}
        try:
            self._switch_hooks(**overrides)
            yield self
        finally:
            self._switch_hooks(**old)
