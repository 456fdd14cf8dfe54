"""Tokenization with a model's BOS policy: text <-> token ids, without the model itself."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from jaxtyping import Int
from torch import Tensor

from interp.config import Config


def encode(
    tokenizer: Any,
    cfg: Config,
    text: str | Sequence[str],
    prepend_bos: bool | None = None,
    padding_side: Literal["left", "right"] | None = None,
    truncate: bool = True,
) -> Int[Tensor, "batch pos"]:
    """Token ids [batch, pos] on the CPU, padded to the longest prompt (right unless padding_side is
    "left"); BOS first when prepend_bos (None: cfg.default_prepend_bos); cut to n_ctx if truncate."""
    return encode_with_mask(tokenizer, cfg, text, prepend_bos, padding_side, truncate)[0]


def pad_token_id(tokenizer: Any) -> int:
    """The id padding is written with: the tokenizer's pad token, else its EOS (as TransformerLens)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return pad or 0


def encode_with_mask(
    tokenizer: Any,
    cfg: Config,
    text: str | Sequence[str],
    prepend_bos: bool | None = None,
    padding_side: Literal["left", "right"] | None = None,
    truncate: bool = True,
) -> tuple[Int[Tensor, "batch pos"], Int[Tensor, "batch pos"]]:
    """`encode`'s tokens and their attention mask [batch, pos] (1: a real token, 0: padding), known
    exactly from each prompt's length (a pad id that also serves as BOS or EOS is not mistaken)."""
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


def str_tokens(tokenizer: Any, tokens: Sequence[int] | Tensor) -> list[str]:
    """One string per token of one prompt ([pos] or [1, pos])."""
    tokens = torch.as_tensor(tokens)
    tokens = tokens.reshape(-1) if tokens.ndim == 2 and tokens.shape[0] == 1 else tokens
    if tokens.ndim != 1:
        raise ValueError(f"to_str_tokens takes one prompt; got shape {tuple(tokens.shape)}.")
    return [tokenizer.decode([t]) for t in tokens.tolist()]


def single_token(tokenizer: Any, text: str, model_name: str) -> int:
    """The id of `text` if it is exactly one token (mind the leading space: " Mary")."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        pieces = [tokenizer.decode([i]) for i in ids]
        raise ValueError(
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
