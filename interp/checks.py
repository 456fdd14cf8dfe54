"""Checks of inputs at the library's boundary: one place, one message style.

Every message says what is wrong, the value that was passed, and what to pass instead. Wrong
types raise TypeError, wrong values ValueError (docs/errors.md lists every check and where it runs);
where TransformerLens asserts, the error is also an AssertionError (`HookNameError`, `InvalidArgumentError`),
so TL code that catches AssertionError keeps working.
A leaf of the layers: imports nothing of interp but interp.config and interp.types.
"""

from __future__ import annotations

import contextlib
import functools
import math
import operator
import stat
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from interp.config import Config
from interp.types import Head

INTERP_DIR = str(Path(__file__).resolve().parent)


def user_stacklevel() -> int:
    """The `stacklevel` for `warnings.warn`, called in the function that warns, that names the first
    line outside interp (and contextlib): the user's call."""
    frame, level = sys._getframe(1), 1
    while frame is not None and (
        frame.f_code.co_filename.startswith(INTERP_DIR) or frame.f_code.co_filename == contextlib.__file__
    ):
        frame, level = frame.f_back, level + 1
    return level


RESAMPLE_MASK_ERROR = (
    "Ablation.mask (1 at real tokens, 0 at padding) is for mean ablation (zero and counterfactual "
    "ablation ignore it); resample ablation draws whole reference prompts, so give unpadded references "
    "at least as long as the inputs"
)


class HookNameError(KeyError, AssertionError):
    """A name that is no hook point, or an opt-in hook that is switched off (TL asserts here)."""


class InvalidArgumentError(ValueError, AssertionError):
    """A value TransformerLens asserts on (hook_attn_in on grouped-query attention, remove_batch_dim
    of several prompts): a ValueError, and an AssertionError for code that catches TL's."""


def _show(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_gradient_dtype(dtype: torch.dtype, what: str) -> None:
    """Refuse `what`, which takes gradients, on a float16 model: float16's range (smallest normal 6e-5)
    rounds small gradients, such as a low probability's, towards 0 and then to 0, without a sign."""
    if dtype == torch.float16:
        raise ValueError(
            f"{what} takes gradients, which float16 rounds to 0 below 6e-8 (a probability of 1e-8 gives "
            "scores of 0): run it on the model in bfloat16 (model.to(torch.bfloat16), float32's range) "
            "or float32"
        )


def check_int(value: Any, what: str, example: int = 0) -> int:
    """`value` as an int: Python, NumPy and 0-d tensor integers pass; bools, floats (even 2.0) and
    anything else raise TypeError (whose message suggests `example`)."""
    if isinstance(value, bool) or (isinstance(value, Tensor) and value.dtype == torch.bool):
        raise TypeError(f"{what} must be an integer, got the bool {value!r}; pass an int such as {example}")
    if isinstance(value, Tensor):
        if value.ndim != 0 or value.is_floating_point() or value.is_complex():
            raise TypeError(f"{what} must be an integer, got the tensor {_show(value)}; pass an int")
        return int(value.item())
    try:
        return operator.index(value)
    except TypeError:
        kind = type(value).__name__
        raise TypeError(
            f"{what} must be an integer, got {kind} {_show(value)}; pass an int such as {example}"
        ) from None


def check_count(value: Any, what: str, minimum: int = 1) -> int:
    """An integer of at least `minimum` (a number of steps, prompts, tokens, ...); bools and floats
    such as 2.5 are refused, never rounded."""
    value = check_int(value, what, example=max(minimum, 1))
    if value < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value}; pass {minimum} or more")
    return value


def check_number(
    value: Any,
    what: str,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    allow_inf: bool = False,
) -> float:
    """A real number within [low, high] (an open end when `low_open` / `high_open`): finite unless
    `allow_inf`, never NaN; bools and strings are refused."""
    interval = " and ".join(
        text
        for bound, text in (
            (low, f"{'>' if low_open else '>='} {low}"),
            (high, f"{'<' if high_open else '<='} {high}"),
        )
        if bound is not None
    )
    wanted = f"a {'' if allow_inf else 'finite '}number{' ' + interval if interval else ''}"
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        and not (isinstance(value, Tensor) and value.ndim == 0)
    ):
        raise TypeError(f"{what} must be {wanted}, got {type(value).__name__} {_show(value)}")
    number = float(value)
    outside = (
        math.isnan(number)
        or (math.isinf(number) and not allow_inf)
        or (low is not None and (number <= low if low_open else number < low))
        or (high is not None and (number >= high if high_open else number > high))
    )
    if outside:
        raise ValueError(f"{what} must be {wanted}, got {number!r}; pass {wanted}")
    return number


def check_layers(cfg: Config, layers: Iterable[Any], what: str = "layer") -> list[int]:
    """Layer indices as ints within [0, n_layers) (negative indices are refused, not wrapped)."""
    if isinstance(layers, str | bytes):
        raise TypeError(f"{what}s must be a sequence of ints, got the string {layers!r}")
    out = []
    for layer in layers:
        layer = check_int(layer, what)
        if not 0 <= layer < cfg.n_layers:
            raise ValueError(
                f"{what} {layer} out of range: the model has {cfg.n_layers} layers; "
                f"pass 0..{cfg.n_layers - 1}"
            )
        out.append(layer)
    return out


def check_head(cfg: Config, head: Any) -> Head:
    """(layer, head) as two ints within the model's layers and heads."""
    if isinstance(head, str | bytes) or not isinstance(head, Sequence | Tensor) or len(head) != 2:
        raise TypeError(f"a head must be a (layer, head) pair of ints, got {_show(head)}; pass e.g. (0, 1)")
    layer, index = check_int(head[0], "a head's layer"), check_int(head[1], "a head's index")
    if not (0 <= layer < cfg.n_layers and 0 <= index < cfg.n_heads):
        raise ValueError(
            f"head ({layer}, {index}) out of range: the model has {cfg.n_layers} layers x {cfg.n_heads} "
            f"heads; pass layers 0..{cfg.n_layers - 1} and heads 0..{cfg.n_heads - 1}"
        )
    return layer, index


def check_heads(cfg: Config, heads: Iterable[Any]) -> list[Head]:
    """Every (layer, head) checked by `check_head`; returns them as tuples of ints."""
    if isinstance(heads, str | bytes) or not isinstance(heads, Iterable):
        raise TypeError(f"heads must be a sequence of (layer, head) pairs, got {_show(heads)}")
    return [check_head(cfg, head) for head in heads]


def check_positions(positions: Any, n_pos: int, batch: int | None = None, what: str = "position") -> Any:
    """Positions (an int, a list of ints, a LongTensor [batch], or None) within [-n_pos, n_pos)."""
    if positions is None:
        return None
    if isinstance(positions, Tensor):
        if positions.is_floating_point() or positions.dtype == torch.bool:
            raise TypeError(f"{what}s must be integers, got a {positions.dtype} tensor; pass a LongTensor")
        if positions.ndim > 1:
            raise ValueError(f"{what}s must be [batch], got shape {tuple(positions.shape)}")
        if batch is not None and positions.ndim == 1 and len(positions) != batch:
            raise ValueError(f"{what}s hold {len(positions)} values for {batch} prompts; pass one per prompt")
        values = positions.flatten().tolist()
    elif isinstance(positions, Sequence) and not isinstance(positions, str | bytes):
        values = [check_int(p, what) for p in positions]
    else:
        values = [check_int(positions, what)]
    for p in values:
        if not -n_pos <= p < n_pos:
            raise ValueError(f"{what} {p} out of range for prompts of {n_pos} positions; pass 0..{n_pos - 1}")
    return positions


def check_token_ids(cfg: Config, ids: Any, what: str = "token id", output: bool = False) -> Tensor:
    """Token ids (int, list or tensor) as a LongTensor within [0, d_vocab) (`output`: ids of the
    logits, [0, d_vocab_out)): negative ids are refused, since indexing would wrap them to the end."""
    if isinstance(ids, Tensor):
        if ids.is_floating_point() or ids.dtype == torch.bool or ids.is_complex():
            raise TypeError(f"{what}s must be integers, got a {ids.dtype} tensor; pass token ids")
        tensor = ids
    elif isinstance(ids, Sequence) and not isinstance(ids, str | bytes):
        tensor = torch.tensor([check_int(i, what) for i in ids], dtype=torch.long)
    else:
        tensor = torch.tensor(check_int(ids, what), dtype=torch.long)
    n = cfg.d_vocab_out if output else cfg.d_vocab
    if tensor.numel() and (tensor.min() < 0 or tensor.max() >= n):
        bad = tensor[(tensor < 0) | (tensor >= n)].flatten()[0].item()
        vocabulary = "output vocabulary (the logits)" if output and n != cfg.d_vocab else "vocabulary"
        raise ValueError(
            f"{what} {bad} out of range: the {vocabulary} holds ids 0..{n - 1} (negative ids are "
            "not counted from the end); pass ids from model.to_tokens or model.to_single_token"
        )
    return tensor


# The dtype names a model loads in (TransformerLens's `HookedTransformer.DTYPE_FROM_STRING`).
DTYPE_FROM_STRING = {
    "float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float64": torch.float64,
}  # fmt: skip


def check_dtype(dtype: Any) -> torch.dtype:
    """A floating torch.dtype, or its name as TransformerLens takes it ("float16", "fp16", "bf16", ...)."""
    if isinstance(dtype, str) and dtype in DTYPE_FROM_STRING:
        return DTYPE_FROM_STRING[dtype]
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    error = ValueError if isinstance(dtype, str | torch.dtype) else TypeError
    names = ", ".join(DTYPE_FROM_STRING)
    raise error(f"dtype={dtype!r}: pass a floating torch.dtype (e.g. torch.float16) or one of {names}")


def check_texts(text: Any) -> None:
    """Text to tokenize: a string, or a non-empty list of strings (token ids go in a tensor)."""
    if isinstance(text, str):
        return
    if not isinstance(text, Sequence):
        raise TypeError(f"text must be a string or a list of strings, got {_show(text)}")
    if len(text) == 0:
        raise ValueError("the input is an empty list: pass a text, a list of texts or a tensor of token ids")
    bad = next((item for item in text if not isinstance(item, str)), None)
    if bad is not None:
        raise TypeError(
            f"a list given to the model must hold texts, got {type(bad).__name__} {_show(bad)}; pass token "
            "ids as a tensor, e.g. torch.tensor([[1, 2, 3]])"
        )


def check_tokens(cfg: Config, tokens: Any, max_pos: int | None = None) -> Tensor:
    """Token ids [batch, pos] (or [pos]): integer dtype, at least one prompt and one position, ids
    within the vocabulary, and at most `max_pos` positions when given (e.g. the context n_ctx)."""
    if not isinstance(tokens, Tensor):
        raise TypeError(f"tokens must be a tensor of token ids, got {type(tokens).__name__}")
    if tokens.is_floating_point() or tokens.dtype == torch.bool or tokens.is_complex():
        raise ValueError(
            f"Token ids must be an integer tensor, got dtype {tokens.dtype}. Pass token ids (e.g. from "
            "model.to_tokens), or embeddings via start_at_layer=0."
        )
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tokens.ndim != 2:
        raise ValueError(f"Tokens must be [batch, pos] or [pos], got shape {tuple(tokens.shape)}.")
    if tokens.shape[0] == 0 or tokens.shape[1] == 0:
        raise ValueError(
            f"tokens are empty (shape {tuple(tokens.shape)}): pass at least one prompt of at least one token"
        )
    if tokens.min() < 0 or tokens.max() >= cfg.d_vocab:
        bad = tokens[(tokens < 0) | (tokens >= cfg.d_vocab)].flatten()[0].item()
        raise ValueError(
            f"Token ids must lie in [0, {cfg.d_vocab}); got {tokens.min().item()}..{tokens.max().item()} "
            f"(first out of range: {bad}; {cfg.model_name} embeds ids 0..{cfg.d_vocab - 1}, and negative ids "
            "are not counted from the end); pass ids from model.to_tokens, below d_vocab"
        )
    if max_pos is not None and tokens.shape[1] > max_pos:
        raise ValueError(
            f"prompts of {tokens.shape[1]} tokens are longer than the model's context of {max_pos}; "
            f"pass prompts of at most {max_pos} tokens"
        )
    return tokens


def check_loss_targets(logits: Tensor, tokens: Any) -> Tensor:
    """The tokens a next-token loss reads its targets from: an integer tensor of the logits'
    [batch, pos] shape, every id within the logits' vocabulary."""
    if not isinstance(tokens, Tensor) or tokens.is_floating_point() or tokens.dtype == torch.bool:
        kind = f"a {tokens.dtype} tensor" if isinstance(tokens, Tensor) else type(tokens).__name__
        raise TypeError(
            f"the loss's tokens must be an integer tensor of token ids, got {kind}; pass token ids"
        )
    if tuple(tokens.shape) != tuple(logits.shape[:2]):
        raise ValueError(
            f"the loss's tokens {tuple(tokens.shape)} must have the logits' [batch, pos] shape "
            f"{tuple(logits.shape[:2])}; pass the tokens the logits were computed from"
        )
    d_vocab = logits.shape[-1]
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= d_vocab):
        low, high = tokens.min().item(), tokens.max().item()
        raise ValueError(
            f"the loss's token ids must lie in [0, {d_vocab}), got {low}..{high}; pass the tokens the "
            "logits were computed from"
        )
    return tokens


def check_token_pair(clean: Tensor, corrupted: Tensor) -> None:
    """Clean and corrupted token batches agree: one [batch, pos] shape, at least one prompt."""
    if clean.shape != corrupted.shape:
        raise ValueError(
            f"clean {tuple(clean.shape)} and corrupted {tuple(corrupted.shape)} tokens must have the same "
            "[batch, pos] shape: pair each clean prompt with one corrupted prompt of the same length "
            "(right-pad prompt pairs of different lengths with interp.edges.pad_pair)"
        )
    if clean.ndim < 1 or clean.shape[0] == 0:
        raise ValueError(f"the prompt pairs are empty (shape {tuple(clean.shape)}): pass at least one pair")


def check_padding_mask(
    mask: Any, n_rows: int | None, n_pos: int | None, what: str = "Ablation.mask"
) -> Tensor:
    """A padding mask [n_rows, n_pos] (None: any) of 1/True at real tokens and 0/False at padding, as
    a bool tensor on the CPU."""
    if not isinstance(mask, Tensor):
        raise TypeError(
            f"{what} must be a tensor [prompt, pos] of 1 (real token) and 0 (padding), "
            f"got {type(mask).__name__}"
        )
    if mask.ndim != 2 or n_rows not in (None, mask.shape[0]) or n_pos not in (None, mask.shape[1]):
        expected = f"[{'n_ref' if n_rows is None else n_rows}, {'pos' if n_pos is None else n_pos}]"
        raise ValueError(
            f"{what} is {tuple(mask.shape)}: it must be {expected}, one row per reference prompt and "
            "one column per position (1 at real tokens, 0 at padding)"
        )
    if mask.dtype != torch.bool and not ((mask == 0) | (mask == 1)).all():
        bad = mask[(mask != 0) & (mask != 1)][0].item()
        raise ValueError(
            f"{what} holds {bad}: a padding mask is 1 at real tokens and 0 at padding, nothing else"
        )
    return mask.bool().cpu()


def check_distinct_pair(clean: Tensor, corrupted: Tensor, what: str = "the corrupted run") -> None:
    """Refuse clean == corrupted where `what` is read from the corrupted prompts (nothing differs)."""
    if clean.shape == corrupted.shape and torch.equal(clean.cpu(), corrupted.cpu()):
        raise ValueError(
            f"clean and corrupted tokens are identical, so {what} equals the clean run and every "
            "normalised score is 0/0; pass corrupted prompts that differ from the clean ones"
        )


def check_metric_output(value: Any, batch: int, what: str = "the metric", finite: bool = True) -> Tensor:
    """A metric's value: a tensor of one value per prompt ([batch]), finite unless `finite=False`."""
    if not isinstance(value, Tensor):
        raise TypeError(
            f"{what} must return a tensor of one value per prompt, got {type(value).__name__}; "
            "return e.g. logits[:, -1, answer] (shape [batch])"
        )
    if tuple(value.shape) != (batch,):
        raise ValueError(
            f"{what} must return one value per prompt (shape ({batch},)), got shape {tuple(value.shape)}; "
            "do not average over prompts (interp does), and read one position"
        )
    if not value.is_floating_point():
        value = value.float()
    if finite and not torch.isfinite(value).all():
        bad = int((~torch.isfinite(value)).nonzero()[0])
        raise ValueError(f"{what} is not finite on prompt {bad} ({value[bad].item()}); check the metric")
    return value


def check_denominator(gap: float, scale: float, what: str) -> None:
    """Refuse a normalised value whose denominator is (numerically) zero: abs(gap) <= 1e-6 * scale, `scale`
    the size of the values it is a difference of (a metric of probabilities near 1e-7 has gaps of that
    size), as `interventions.stats.defined_gap`."""
    if not math.isfinite(gap) or abs(gap) <= 1e-6 * abs(scale):
        raise ValueError(
            f"{what} is undefined: its denominator is {gap:.3g} (the metric does not change between the "
            "two runs it is normalised by). Use prompts the model does the task on, corrupted prompts that "
            "differ from the clean ones, or another ablation."
        )


def check_hook_output(hook_name: str, hook_fn: Any, act: Tensor, out: Any, what: str = "activation") -> None:
    """A hook's return value: None, or a tensor of the activation's (or, for a backward hook, the
    gradient's) shape, dtype and device."""
    if out is None:
        return
    who = f"hook {getattr(hook_fn, '__name__', type(hook_fn).__name__)!s} at {hook_name!r}"
    if isinstance(out, tuple) and len(out) == 1 and what == "gradient":  # TransformerLens allows (grad,)
        out = out[0]
    if not isinstance(out, Tensor):
        raise TypeError(
            f"{who} returned {type(out).__name__} {_show(out, 40)}: return None or a tensor shaped like "
            f"the {what} {tuple(act.shape)}"
        )
    if out.shape != act.shape:
        raise ValueError(
            f"{who} returned shape {tuple(out.shape)}, but the {what} is {tuple(act.shape)}: "
            f"return a tensor of the {what}'s shape (or None to keep it)"
        )
    if out.dtype != act.dtype:
        raise ValueError(
            f"{who} returned dtype {out.dtype}, but the {what} is {act.dtype}: return value.to({act.dtype})"
        )
    if out.device != act.device:
        raise ValueError(
            f"{who} returned a tensor on {out.device}, but the {what} is on {act.device}: return "
            f"value.to({str(act.device)!r})"
        )


def checked_hook(hook_fn: Any, dir: str, hook_name: Any = None) -> Callable:
    """`hook_fn` wrapped so that its return value is checked by `check_hook_output` (a forward hook's
    value replaces the activation, a backward hook's the gradient), naming the hook."""
    if not callable(hook_fn):
        where = f" at {hook_name!r}" if hook_name is not None else ""
        raise TypeError(f"the hook{where} must be a function hook(activation, hook), got {_show(hook_fn)}")
    what = "gradient" if dir == "bwd" else "activation"

    @functools.wraps(hook_fn)
    def checked(tensor: Tensor, hook: Any) -> Any:
        out = hook_fn(tensor, hook=hook)
        check_hook_output(hook.name, hook_fn, tensor, out, what)
        return out

    return checked


def all_finite(tensor: Tensor, hook_name: str = "") -> Tensor:
    """A 0-d bool tensor, read later so that no device waits: `tensor` holds no NaN or inf (attention
    scores may hold -inf, where they are masked). One min/max pass: NaN propagates into both."""
    if tensor.numel() == 0 or not tensor.is_floating_point():
        return torch.ones((), dtype=torch.bool, device=tensor.device)
    low, high = torch.aminmax(tensor)
    if hook_name.endswith("hook_attn_scores"):
        return ~(high.isnan() | (high == float("inf")))
    return low.isfinite() & high.isfinite()


def warn_non_finite(where: str, output: str, weights: Mapping[str, Tensor]) -> None:
    """Warn (once per place, as Python's warnings do) that a forward pass turned non-finite at `where`,
    naming the first non-finite weight if there is one."""
    weight = first_non_finite(weights)
    cause = (
        f"the weight {weight} holds NaN/inf"
        if weight is not None
        else "no weight is non-finite: check hooks that return values, the input, and the dtype's range"
    )
    warnings.warn(
        f"NaN/inf first appear at {where} in this forward pass ({output} hold NaN/inf); {cause}. Every "
        "result computed from it is NaN/inf",
        RuntimeWarning,
        stacklevel=3,
    )


def first_non_finite(state_dict: Mapping[str, Tensor]) -> str | None:
    """The name of the first floating-point tensor holding NaN or inf, or None (one min/max pass per
    tensor, `all_finite`: no tensor of flags as large as the weights)."""
    for name, tensor in state_dict.items():
        floating = isinstance(tensor, Tensor) and tensor.is_floating_point() and not tensor.is_meta
        if floating and not bool(all_finite(tensor)):
            return name
    return None


def check_finite_weights(state_dict: Mapping[str, Tensor], source: Any = "the weights") -> None:
    """Refuse weights holding NaN or inf, naming the first bad parameter."""
    name = first_non_finite(state_dict)
    if name is not None:
        tensor = state_dict[name]
        n_bad = int((~torch.isfinite(tensor)).sum())
        raise ValueError(
            f"{source} hold non-finite values: {name} {tuple(tensor.shape)} has {n_bad} NaN/inf entries; "
            "the checkpoint is corrupt or was saved after training diverged: load another checkpoint"
        )


def check_regular_file(path: str | Path, what: str = "file") -> Path:
    """A path that exists and is a regular file (not a FIFO, device or directory), before opening it."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"no such file or directory: {str(path)!r} ({what})") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"{what} {str(path)!r} is not a regular file; pass the path of a file")
    return path


def check_config_matches_weights(
    cfg: Config, state_dict: Mapping[str, Tensor], source: Any = "the weights"
) -> None:
    """The config agrees with the weights' shapes (layers, vocabulary, width, heads), checked before any
    block is built: a config claiming 100,000 layers fails here, not after building them."""
    found = set()
    for name in state_dict:
        if name.startswith("blocks."):
            index = name.split(".", 2)[1]
            if index.isdigit():
                found.add(int(index))
    if found != set(range(cfg.n_layers)):
        shown = sorted(found)
        raise ValueError(
            f"the config says {cfg.n_layers} layers, but {source} hold {len(found)} "
            f"(blocks {shown[:3]}{'...' if len(shown) > 3 else ''}); fix n_layers (num_hidden_layers) in the "
            "config, or load the weights it belongs to"
        )
    expected = {
        "W_E": (cfg.d_vocab, cfg.d_model),
        "blocks.0.attn.W_Q": (cfg.n_heads, cfg.d_model, cfg.d_head),
    }
    for name, shape in expected.items():
        if name in state_dict and tuple(state_dict[name].shape) != shape:
            raise ValueError(
                f"the config says {name} is {shape} (d_vocab, d_model, n_heads, d_head), but {source} hold "
                f"{tuple(state_dict[name].shape)}; fix the config, or load the weights it belongs to"
            )


def check_loaded_weights(cfg: Config, state_dict: Mapping[str, Tensor], source: Any = "the weights") -> None:
    """What every reader of weights checks before a model is built: shapes against the config, and
    finite values."""
    check_config_matches_weights(cfg, state_dict, source)
    check_finite_weights(state_dict, source)


def check_finite_scores(scores: Tensor, what: str, label: Any = None) -> None:
    """Refuse scores holding NaN or inf before anything is ranked or typed from them (NaN sorts as
    the largest value, so it would be selected silently). `label(index tuple)` names an entry."""
    bad = ~torch.isfinite(scores)
    if bad.any():
        first = tuple(int(i) for i in bad.nonzero()[0])
        name = label(first) if label is not None else str(first)
        raise ValueError(
            f"{what} hold {int(bad.sum())} non-finite values (first: {name} = {scores[first].item()}); "
            "nothing is ranked or typed from them. Check the model's weights for NaN/inf, the metric, "
            "and that the clean and corrupted prompts differ"
        )


def check_heads_add_up(cfg: Config, needs: str, instead: str) -> None:
    """Refuse, before any run, what reads each head's output z_h W_O[h] as a part of the residual stream
    (`needs`: who does and why; `instead`: what runs on the model) on a model whose heads' outputs are
    not parts of it: post-norm models (Gemma 2 and 3, OLMo 2) normalise each attention output as a
    whole (ln1_post, at a scale of the whole output) before it reaches the residual stream."""
    if cfg.post_norm:
        raise ValueError(
            f"{needs}, but {cfg.model_name} normalises each attention output as a whole (ln1_post) before it "
            f"reaches the residual stream, so per-head outputs do not add up to it. {instead}"
        )


def check_attention_mask(mask: Any, shape: tuple[int, int], device: Any = None) -> Tensor:
    """An attention mask [batch, pos] (a [pos] one: one prompt) on `device`, refused unless it has the
    input's `shape` (batch, pos)."""
    mask = torch.as_tensor(mask, device=device)
    mask = mask[None] if mask.ndim == 1 else mask
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(
            f"attention_mask has shape {tuple(mask.shape)}; it must match the input's {shape[0]} prompts of "
            f"{shape[1]} positions, {tuple(shape)}."
        )
    return mask


def check_residual(residual: Any, d_model: int, layer: int) -> Tensor:
    """`residual`, a residual stream [batch, pos, d_model] to run from block `layer`, else a ValueError
    saying what to pass."""
    if not isinstance(residual, Tensor) or residual.ndim != 3 or residual.shape[-1] != d_model:
        shape = tuple(residual.shape) if isinstance(residual, Tensor) else type(residual).__name__
        raise ValueError(
            f"start_at_layer={layer} runs from a residual stream [batch, pos, d_model={d_model}], got "
            f"{shape}; pass the residual stream before block {layer} (e.g. a cache's "
            f"blocks.{layer}.hook_resid_pre)"
        )
    return residual
