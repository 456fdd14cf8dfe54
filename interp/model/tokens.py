"""Tokenization with a model's BOS policy: text <-> token ids, without the model itself."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from jaxtyping import Bool, Int
from torch import Tensor

import interp.checks as checks
from interp.config import Config


def pad_token_id(tokenizer: Any) -> int:
    """The id padding is written with: the tokenizer's pad token, else its EOS (as TransformerLens)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return pad or 0


def has_pad_token(tokenizer: Any) -> bool:
    """Whether the tokenizer names a pad or an EOS token (else `pad_token_id` falls back to id 0)."""
    return tokenizer.pad_token_id is not None or tokenizer.eos_token_id is not None


def encode_with_mask(
    tokenizer: Any,
    cfg: Config,
    text: str | Sequence[str],
    prepend_bos: bool | None = None,
    padding_side: Literal["left", "right"] | None = None,
    truncate: bool = True,
) -> tuple[Int[Tensor, "batch pos"], Int[Tensor, "batch pos"]]:
    """Token ids [batch, pos] on the CPU, padded to the longest prompt (right unless padding_side is
    "left"), BOS first when prepend_bos (None: cfg.default_prepend_bos), cut to n_ctx if truncate;
    and their attention mask [batch, pos] (1: a real token, 0: padding), known exactly from each
    prompt's length (a pad id that also serves as BOS or EOS is not mistaken)."""
    if padding_side not in (None, "left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}.")
    texts = [text] if isinstance(text, str) else list(text)
    prepend_bos = cfg.default_prepend_bos if prepend_bos is None else prepend_bos
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    if prepend_bos:
        bos = cfg.bos_token_id if cfg.bos_token_id is not None else tokenizer.bos_token_id
        if bos is None:
            raise ValueError(f"{cfg.model_name}'s tokenizer has no BOS token; use prepend_bos=False.")
        ids = [[bos, *row] for row in ids]
    check_encoded(cfg, texts, ids, truncate)
    if truncate:
        ids = [row[: cfg.n_ctx] for row in ids]
    width = max(len(row) for row in ids)
    tokens = torch.full((len(ids), width), pad_token_id(tokenizer), dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    left = (padding_side or "right") == "left"
    for i, row in enumerate(ids):
        where = slice(width - len(row), width) if left else slice(0, len(row))
        tokens[i, where] = torch.tensor(row, dtype=torch.long)
        mask[i, where] = 1
    return tokens, mask


def check_encoded(cfg: Config, texts: list[str], ids: list[list[int]], truncate: bool) -> None:
    """Refuse a prompt without tokens and ids the model has no embedding for; warn when `truncate`
    cuts a prompt to the context."""
    one = len(texts) == 1
    for i, (text, row) in enumerate(zip(texts, ids, strict=True)):
        which = f"the prompt {text[:40]!r}" if one else f"prompt {i} ({text[:40]!r})"
        if not row:
            raise ValueError(
                f"{which} has no tokens: {cfg.model_name} prepends no BOS (default_prepend_bos=False), "
                "so an empty text is an empty sequence with no logits; pass a non-empty text, or "
                "prepend_bos=True where the tokenizer has a BOS token"
            )
        bad = [t for t in row if t >= cfg.d_vocab]
        if bad:
            raise ValueError(
                f"the tokenizer gives {which} token id {bad[0]}, but {cfg.model_name} embeds only ids "
                f"0..{cfg.d_vocab - 1} (d_vocab={cfg.d_vocab}): this tokenizer is not the model's; pass the "
                "model's tokenizer (model.set_tokenizer(...)) or token ids below d_vocab as a tensor"
            )
        if truncate and len(row) > cfg.n_ctx:
            warnings.warn(
                f"{which} has {len(row)} tokens, more than {cfg.model_name}'s context of {cfg.n_ctx}: "
                f"it is cut to its first {cfg.n_ctx} tokens (to_tokens' truncate=True, as TransformerLens); "
                "shorten it, or pass truncate=False to be refused instead",
                UserWarning,
                stacklevel=4,
            )


def padding_mask(
    tokens: Int[Tensor, "batch pos"], pad: int, padding_side: str, prepend_bos: bool, bos: int | None
) -> Int[Tensor, "batch pos"]:
    """TransformerLens's `get_attention_mask` for token ids: 0 at the leading (left padding) or
    trailing (right padding) run of `pad` ids, 1 elsewhere; with left padding and a BOS that is the
    pad id, the last leading pad is the prompt's BOS and stays 1."""
    is_real = tokens.ne(pad)
    counted = is_real.flip(-1).cumsum(-1).flip(-1) if padding_side == "right" else is_real.cumsum(-1)
    is_pad = counted == 0
    mask = (~is_pad).long()
    if padding_side != "right" and prepend_bos and bos == pad:
        last_pad = is_pad.sum(-1) - 1
        rows = (last_pad >= 0).nonzero()[:, 0]
        mask[rows, last_pad[rows]] = 1
    return mask


def last_real_positions(
    tokens: Int[Tensor, "batch pos"], attention_mask: Tensor | None = None, pad: int | None = None
) -> Int[Tensor, " batch"]:
    """Each prompt's last real token [batch]: the last 1 of its attention mask (exact); else, given
    the pad id, the last position before its trailing run of pad ids, less the batch's shortest such
    run (one prompt fills the width, so its own trailing pad ids are tokens); else the last position."""
    n_pos = tokens.shape[-1]
    if attention_mask is not None:
        mask = checks.check_attention_mask(attention_mask, tokens.shape, tokens.device).bool()
        where = torch.where(mask, torch.arange(n_pos, device=tokens.device), -1)
        return where.amax(-1).clamp(min=0)
    if pad is None:
        return torch.full(tokens.shape[:1], n_pos - 1, dtype=torch.long, device=tokens.device)
    trailing = tokens.ne(pad).flip(-1).long().cumsum(-1).eq(0).sum(-1)  # each prompt's trailing pad ids
    return (n_pos - 1 - (trailing - trailing.min())).clamp(min=0)


PADDING = "_interp_attention_mask"
"""The attribute of token ids from `to_tokens` that records their attention mask (1: real token),
so that the forward pass masks their left padding and metrics read each prompt's last real token,
untold."""


def record_padding(tokens: Int[Tensor, "batch pos"], mask: Int[Tensor, "batch pos"]) -> Tensor:
    """Record on `tokens` the attention mask of their padding (`to_tokens` does). A tensor made
    from them (a slice, `.clone()`, a copy on another device) does not keep the record."""
    setattr(tokens, PADDING, mask)
    return tokens


def recorded_padding(tokens: Any) -> Int[Tensor, "batch pos"] | None:
    """The attention mask `record_padding` put on `tokens` [batch, pos], on their device; None
    where they carry none."""
    mask = getattr(tokens, PADDING, None)
    if mask is None or mask.shape != tokens.shape:
        return None
    return mask.to(tokens.device)


def index_tokens(tokens: Int[Tensor, "batch pos"], index: Any) -> Int[Tensor, "rows pos_or_fewer"]:
    """tokens[index] (rows, or rows and positions), keeping the attention mask recorded on `tokens`
    (`record_padding`) for the same entries, so that a left-padded sub-batch is masked as the batch."""
    mask = recorded_padding(tokens)
    out = tokens[index]
    return out if mask is None else record_padding(out, mask[index])


def check_no_left_padding(
    tokens: Int[Tensor, "batch pos"], pad: int, prepend_bos: bool, bos: int | None
) -> None:
    """Refuse token ids without a mask that look padded on the left while the model pads on the
    right: rows that begin with pad ids TransformerLens's left-padding mask would mask
    (`padding_mask`), which the forward pass would read as tokens, giving a padded prompt another
    value than it has alone."""
    padded = (padding_mask(tokens, pad, "left", prepend_bos, bos) == 0).any(-1).nonzero()[:, 0].tolist()
    if padded:
        raise ValueError(
            f"rows {padded[:8]} of these token ids begin with the pad id {pad}: they look padded on the "
            "left, but they carry no attention mask and the model pads on the right "
            "(default_padding_side), so the padding would be read as tokens and a padded prompt would get "
            "another value than alone. Set model.default_padding_side = 'left' (every function reads it), "
            "or pass padding_side='left' or attention_mask= (from model.to_tokens_and_mask) to the forward "
            "pass; ids as model.to_tokens returns them carry their mask, a slice or copy of them does not"
        )


LAST_POSITIONS = "_interp_last_positions"
"""The attribute of logits that records their prompts' last real tokens (`mark_last_positions`)."""
FIRST_POSITIONS = "_interp_first_positions"
"""The attribute of logits that records their left-padded prompts' first real tokens."""


def mark_last_positions(
    logits: Tensor, last: Int[Tensor, " batch"] | None, first: Int[Tensor, " batch"] | None = None
) -> Tensor:
    """Record on `logits` [batch, pos, d_vocab] (the forward pass's own tensor) each prompt's last
    real token (and, for left padding, its first), so that interp's metrics refuse to read their
    padding. A tensor made from them (`.cpu()`, a slice) does not keep the record."""
    if last is not None:
        setattr(logits, LAST_POSITIONS, last)
    if first is not None and bool(first.any()):
        setattr(logits, FIRST_POSITIONS, first)
    return logits


def first_real(real: Bool[Tensor, "rows pos"] | None) -> Int[Tensor, " rows"] | None:
    """Each row's first real position (its left padding's length; 0 for a row of padding only), on
    the CPU; None for None (no mask: nothing is padded on the left)."""
    return None if real is None else real.bool().long().argmax(1).cpu()


def str_tokens(tokenizer: Any, tokens: Sequence[int] | Tensor) -> list[str]:
    """One string per token of one prompt ([pos] or [1, pos])."""
    tokens = torch.as_tensor(tokens)
    tokens = tokens.reshape(-1) if tokens.ndim == 2 and tokens.shape[0] == 1 else tokens
    if tokens.ndim != 1:
        raise checks.InvalidArgumentError(f"to_str_tokens takes one prompt; got shape {tuple(tokens.shape)}.")
    return [tokenizer.decode([t]) for t in tokens.tolist()]


def single_token(tokenizer: Any, text: str, model_name: str) -> int:
    """The id of `text` if it is exactly one token (mind the leading space: " Mary")."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        pieces = [tokenizer.decode([i]) for i in ids]
        raise checks.InvalidArgumentError(
            f"{text!r} is {len(ids)} tokens in {model_name} ({pieces}), not one. "
            "Choose a single-token string (names usually need a leading space, e.g. ' Mary')."
        )
    return ids[0]


def decode(tokenizer: Any, tokens: int | Sequence[int] | Int[Tensor, "... pos"]) -> str | list[str]:
    """Text of token ids: an id, a list or [pos] tensor -> str; [batch, pos] -> one str per row."""
    tokens = torch.as_tensor(tokens)
    if tokens.ndim <= 1:
        return tokenizer.decode(tokens.reshape(-1).tolist())
    return [tokenizer.decode(row.tolist()) for row in tokens]


def key_mask_and_positions(
    attention_mask: Tensor | None, batch: int, n_pos: int, past_mask: Tensor | None, device: torch.device
) -> tuple[Tensor | None, Tensor | None]:
    """The mask over all keys ([batch, n_cached + n_pos]: the cached tokens' `past_mask` first) and
    each new token's position, counted from its prompt's first real token; (None, None) when no
    key is padding."""
    offset = 0 if past_mask is None else past_mask.shape[1]
    if past_mask is not None and past_mask.shape[0] != batch:
        raise ValueError(
            f"The KV cache was made for a batch of {past_mask.shape[0]} prompts, got {batch}: "
            f"init_cache(cfg, device, batch_size={batch})."
        )
    if attention_mask is None:
        current = torch.ones(batch, n_pos, dtype=torch.bool, device=device)
    else:
        current = checks.check_attention_mask(attention_mask, (batch, n_pos), device).bool()
    full = current if past_mask is None else torch.cat([past_mask.to(device).bool(), current], dim=1)
    if bool(full.all()):
        return None, None
    return full, positions_of(full)[:, offset:]


def positions_of(real: Tensor) -> Int[Tensor, "batch pos"]:
    """Each token's position [batch, pos] counted from its prompt's first real token (`real` [batch,
    pos]: 1 or True at real tokens); padding takes its neighbour's (0 on the left)."""
    return (real.long().cumsum(-1) - 1).clamp(min=0)


@dataclass(frozen=True)
class RunLayout:
    """Where the tokens of the forward pass under way stand, for hooks that write values by position
    (mean and resample ablation), from what the pass computes anyway: `padded_positions` (those of
    `key_mask_and_positions`; None: no padding), the run's masks (the exact one first), the KV
    cache's length `n_cached` and the new tokens' `n_pos`. `positions` [batch or 1, pos] (each token's
    position counted from its prompt's first real token, after the cache's tokens, as the model's)
    and `real` [batch, pos] (its real tokens; None: no padding mask) are worked out when a hook first
    asks, so a pass whose hooks never ask pays nothing for them."""

    padded_positions: Int[Tensor, "batch pos"] | None
    masks: tuple[Tensor | None, ...]
    n_cached: int
    n_pos: int

    @functools.cached_property
    def positions(self) -> Int[Tensor, "batch pos"]:
        if self.padded_positions is None:
            return torch.arange(self.n_cached, self.n_cached + self.n_pos)[None]
        return self.padded_positions

    @functools.cached_property
    def real(self) -> Bool[Tensor, "batch pos"] | None:
        mask = next((mask for mask in self.masks if mask is not None), None)
        real = None if mask is None else torch.as_tensor(mask).bool()
        return None if real is None or bool(real.all()) else real


class TokenMethods:
    """The tokenization methods of `HookedTransformer` (a section of its class, kept beside the
    functions they call): text <-> token ids with the model's BOS policy and padding side."""

    def to_tokens(
        self,
        text: str | Sequence[str],
        prepend_bos: bool | None = None,
        padding_side: Literal["left", "right"] | None = None,
        move_to_device: bool = True,
        truncate: bool = True,
    ) -> Int[Tensor, "batch pos"]:
        """Tokenize text (padded to the longest prompt, on the right by default) with this model's
        BOS policy; `truncate` cuts prompts to the context length n_ctx. `padding_side=None` pads on
        `model.default_padding_side` ("right" unless set; `from_pretrained(default_padding_side=)`).

        `prepend_bos=None` uses `cfg.default_prepend_bos`: what the model saw in training
        (GPT-2 and Pythia: <|endoftext|> first, as TransformerLens; Llama: <s>; SmolLM2 and Qwen: none)
        for `interp.load_model`; TransformerLens's (BOS first but for Qwen 2/3) for `from_pretrained`.
        The ids carry their attention mask (`record_padding`): the forward pass (patching too) masks
        their left padding and metrics read each prompt's last real token, whatever the model's
        padding side; a tensor made from them (a slice, `.clone()`) does not, and needs
        `attention_mask=` (from `to_tokens_and_mask`) where it is padded on the left.
        """
        tokens = self.to_tokens_and_mask(text, prepend_bos, padding_side, move_to_device, truncate)[0]
        return tokens

    def to_tokens_and_mask(
        self,
        text: str | Sequence[str],
        prepend_bos: bool | None = None,
        padding_side: Literal["left", "right"] | None = None,
        move_to_device: bool = True,
        truncate: bool = True,
    ) -> tuple[Int[Tensor, "batch pos"], Int[Tensor, "batch pos"]]:
        """`to_tokens` and the attention mask of its padding (1: real token), which the tokens also
        carry (`record_padding`): the forward pass and metrics read it from them."""
        checks.check_texts(text)
        side = self.default_padding_side if padding_side is None else padding_side
        tokenizer = self._require_tokenizer()
        tokens, mask = encode_with_mask(tokenizer, self.cfg, text, prepend_bos, side, truncate)
        if move_to_device:
            tokens, mask = tokens.to(self.device), mask.to(self.device)
        return record_padding(tokens, mask), mask

    def last_positions(
        self,
        input: str | Sequence[str] | Int[Tensor, "batch pos"],
        attention_mask: Int[Tensor, "batch pos"] | None = None,
        padding_side: Literal["left", "right"] | None = None,
        prepend_bos: bool | None = None,
    ) -> Int[Tensor, " batch"]:
        """Each prompt's last real token [batch], where a metric reads "the last token":
        `metrics.logit_diff_metric(io, s, pos=model.last_positions(tokens))`.

        Text: exact (tokenized as `to_tokens` does). Token ids: from `attention_mask` (1: real
        token; exact) if given, else from the mask `to_tokens` recorded on them (exact); else before
        each prompt's trailing run of pad ids (the tokenizer's pad, else EOS, id) beyond the batch's
        shortest such run (none on the left: the last position).
        """
        if isinstance(input, str) or (isinstance(input, Sequence) and not isinstance(input, Tensor)):
            return last_real_positions(*self.to_tokens_and_mask(input, prepend_bos, padding_side))
        tokens = self.input_tokens(input)
        last = self._last_positions_of(
            tokens, recorded_padding(tokens) if attention_mask is None else attention_mask
        )
        return last_real_positions(tokens) if last is None else last

    def _last_positions_of(self, tokens: Tensor, exact_mask: Tensor | None) -> Int[Tensor, " batch"] | None:
        """`last_positions` of checked token ids: from their exact mask (given or recorded), else from
        their trailing pad ids (padded on either side: TransformerLens's mask of left padding marks
        right padding real); None where nothing can be padding (no mask and no tokenizer)."""
        tokenizer = getattr(self, "tokenizer", None)
        if exact_mask is None and tokenizer is None:
            return None
        return last_real_positions(tokens, exact_mask, None if tokenizer is None else pad_token_id(tokenizer))

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
            raise checks.InvalidArgumentError(
                f"get_token_position takes one prompt; got shape {tuple(tokens.shape)}."
            )
        token = self.to_single_token(single_token) if isinstance(single_token, str) else single_token
        found = (tokens == token).nonzero()[:, 0]
        if not len(found):
            raise checks.InvalidArgumentError(
                f"Token {single_token!r} does not occur in the input ({tokens.tolist()[:20]}); check "
                "prepend_bos (a BOS id occurs only when it is prepended)."
            )
        return int(found[0] if mode == "first" else found[-1])

    def special_token_ids(self) -> list[int]:
        """The ids that are not text, sorted: the configured BOS, the tokenizer's special tokens and its
        special added tokens (chat markers, control and unused slots, which ordinary training text never
        holds: 17 in SmolLM2, 6,249 in Gemma 3); the induction edge task draws from the other ids."""
        ids = {self.cfg.bos_token_id} - {None}
        tokenizer = getattr(self, "tokenizer", None)
        if tokenizer is not None:
            ids |= set(getattr(tokenizer, "all_special_ids", None) or ())
            added = getattr(tokenizer, "added_tokens_decoder", None) or {}
            ids |= {i for i, token in added.items() if getattr(token, "special", False)}
        return sorted(i for i in ids if 0 <= i < self.cfg.d_vocab)

    def set_tokenizer(self, tokenizer: Any, default_padding_side: Literal["left", "right"] = "right") -> None:
        """Attach a `transformers` tokenizer (and the side `to_tokens` pads on), as TransformerLens."""
        self.tokenizer = tokenizer
        self.default_padding_side = default_padding_side

    @property
    def default_padding_side(self) -> Literal["left", "right"]:
        """Where `to_tokens` pads: the tokenizer's `padding_side`, as in TransformerLens ("right"
        unless set by `from_pretrained(default_padding_side=)`, `set_tokenizer` or
        `model.tokenizer.padding_side = ...`)."""
        tokenizer = getattr(self, "tokenizer", None)
        return self._padding_side if tokenizer is None else tokenizer.padding_side

    @default_padding_side.setter
    def default_padding_side(self, side: Literal["left", "right"]) -> None:
        if side not in ("left", "right"):
            raise ValueError(f"default_padding_side must be 'left' or 'right', got {side!r}.")
        self._padding_side = side
        if getattr(self, "tokenizer", None) is not None:
            self.tokenizer.padding_side = side
