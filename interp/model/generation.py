"""Generation: greedy or sampled continuation of prompts, with a KV cache."""

from __future__ import annotations

from typing import Literal

import torch
import tqdm
from jaxtyping import Float, Int
from torch import Tensor, nn

from interp.checks import check_int
from interp.model.kv_cache import HookedTransformerKeyValueCache
from interp.model.tokens import recorded_padding


@torch.no_grad()
def generate(
    model: nn.Module,
    input: str | list[str] | Int[Tensor, "batch pos"] | Float[Tensor, "batch pos d_model"] = "",
    max_new_tokens: int = 10,
    stop_at_eos: bool = True,
    eos_token_id: int | None = None,
    do_sample: bool | None = None,
    top_k: int | None = None,
    temperature: float | None = None,
    use_past_kv_cache: bool = True,
    prepend_bos: bool | None = None,
    padding_side: Literal["left", "right"] | None = None,
    return_type: Literal["input", "str", "tokens", "embeds"] = "input",
    verbose: bool = False,
    seed: int | None = None,
) -> str | list[str] | Int[Tensor, "batch pos"] | Float[Tensor, "batch pos d_model"]:
    """Greedy or sampled continuation by a HookedTransformer; by default text in -> text out (a list
    of texts -> a list), tokens in -> tokens out, token embeddings in -> embeddings out.
    `return_type="embeds"` gives the token embeddings W_E[tokens] of prompt and continuation
    ([batch, pos, d_model], as TransformerLens). Embeddings as input are token embeddings
    (`model.embed(tokens)`, [batch, pos, d_model], without positions: they are added as for
    tokens); as in TransformerLens, `return_type="tokens"` or "str" then gives the new tokens only.

    Greedy unless `do_sample=True` (temperature 1 unless given) or a temperature > 0 is given;
    (TransformerLens samples by default). With the KV cache each new token costs one position's
    forward pass. A list of texts of mixed lengths is padded on the left (`padding_side`) and run
    with its attention mask, so each prompt continues as it would alone; so are ids padded on the
    left that carry their mask (`model.to_tokens(texts, padding_side="left")`). Ids padded on the
    right are refused: their shorter prompts would continue after the padding. `verbose` shows a
    progress bar.
    """
    if not model.cfg.causal:
        raise ValueError(
            f"{model.cfg.model_name} has bidirectional attention: each position sees the tokens after it, "
            "so it does not predict the next token and cannot generate. Run it on whole sequences instead."
        )
    if return_type not in ("input", "str", "tokens", "embeds"):
        raise ValueError(f"return_type must be 'input', 'str', 'tokens' or 'embeds', got {return_type!r}.")
    if check_int(max_new_tokens, "max_new_tokens", 10) < 0:
        raise ValueError(f"max_new_tokens must be 0 or more, got {max_new_tokens}.")
    if top_k is not None and not 1 <= check_int(top_k, "top_k", 50) <= model.cfg.d_vocab:
        raise ValueError(f"top_k must be from 1 to the vocabulary's {model.cfg.d_vocab}, got {top_k}.")
    mask = None
    prompt_embeds = None  # embeddings given as input; the prompt then has no tokens
    if isinstance(input, str) or (isinstance(input, list) and all(isinstance(t, str) for t in input)):
        side = "left" if padding_side is None else padding_side
        tokens, mask = model.to_tokens_and_mask(input, prepend_bos=prepend_bos, padding_side=side)
        _refuse_right_padding(mask, "texts")
    elif isinstance(input, Tensor) and input.is_floating_point():
        if input.ndim != 3 or input.shape[-1] != model.cfg.d_model:
            raise ValueError(
                f"A floating-point tensor given to generate is read as embeddings [batch, pos, d_model="
                f"{model.cfg.d_model}], but this {input.dtype} tensor has shape {tuple(input.shape)}; "
                "pass token ids as an integer tensor, token embeddings (model.embed(tokens)), or text."
            )
        prompt_embeds = input.to(model.W_E.device, model.W_E.dtype)
        tokens = torch.empty((input.shape[0], 0), dtype=torch.long, device=model.W_E.device)
    else:
        tokens = model.input_tokens(input, prepend_bos)
        mask = recorded_padding(tokens)  # ids from to_tokens carry the mask of their padding
        if mask is None:  # other ids: the forward pass's rule (leading pad ids where padding is on the left)
            _, mask = model._tokens_and_mask(tokens, prepend_bos, padding_side, None)
        mask = None if mask is None or bool(mask.all()) else mask
        _refuse_right_padding(mask, "ids")
    sample = do_sample if do_sample is not None else bool(temperature)
    temperature = 1.0 if temperature is None else temperature
    if sample and temperature <= 0:
        raise ValueError(f"Sampling needs a temperature > 0, got {temperature}; or use do_sample=False.")
    generator = torch.Generator(device=tokens.device).manual_seed(seed) if seed is not None else None
    if eos_token_id is None and stop_at_eos and model.tokenizer is not None:
        eos_token_id = model.tokenizer.eos_token_id
    eos = eos_token_id if stop_at_eos else None
    past_kv_cache = (
        HookedTransformerKeyValueCache.init_cache(model.cfg, model.device, tokens.shape[0])
        if use_past_kv_cache
        else None
    )
    finished = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    prompt_length = tokens.shape[1]
    step_input, step_mask = tokens, torch.ones_like(tokens) if mask is None else mask  # decided here, once
    positions = prompt_length + (0 if prompt_embeds is None else prompt_embeds.shape[1])
    room = model.cfg.n_ctx - positions + 1  # new tokens that fit: the last needs no forward pass of its own
    if 0 < room < max_new_tokens and eos is None:  # refused now, not after `room` forward passes
        raise ValueError(_past_context(model, positions, max_new_tokens, room))
    for step in tqdm.trange(max_new_tokens, disable=not verbose):
        if 0 < room == step:
            raise ValueError(
                f"{_past_context(model, positions, max_new_tokens, room)} (no prompt ended at EOS)"
            )
        if prompt_embeds is not None:
            logits = _logits_after_embeds(model, prompt_embeds, tokens, past_kv_cache)
        elif use_past_kv_cache:
            logits = model(step_input, past_kv_cache=past_kv_cache, attention_mask=step_mask)[:, -1].float()
        else:
            full_mask = torch.ones_like(tokens) if mask is None else mask
            logits = model(tokens, attention_mask=full_mask)[:, -1].float()
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
        if mask is not None:
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        # The KV cache keeps the prompt's mask; a new token is real even where its id is the pad id.
        step_input, step_mask = next_token[:, None], torch.ones_like(next_token[:, None])
        if eos is not None and finished.all():
            break
    if prompt_embeds is not None and return_type in ("input", "embeds"):
        return torch.cat([prompt_embeds, model.W_E[tokens]], dim=1)
    if return_type == "embeds":
        return model.W_E[tokens]
    if return_type == "str" or (return_type == "input" and not isinstance(input, Tensor)):
        prepended = not isinstance(input, Tensor) and (
            model.cfg.default_prepend_bos if prepend_bos is None else prepend_bos
        )
        rows = [row if mask is None else row[mask[i].bool()] for i, row in enumerate(tokens)]
        if eos is not None:  # a row that stopped ends at its first EOS, as alone (the batch filled it on)
            n_new = tokens.shape[1] - prompt_length
            rows = [_through_first(row, len(row) - n_new, eos) for row in rows]
        text = [model.to_string(row[int(prepended) :]) for row in rows]  # without pads and BOS, as TL
        return text[0] if isinstance(input, str) or (len(text) == 1 and return_type == "str") else text
    return tokens


def _through_first(row: Int[Tensor, " pos"], start: int, token: int) -> Int[Tensor, " pos"]:
    """`row` up to and including the first `token` at or after `start` (all of it where there is none)."""
    found = (row[start:] == token).nonzero()
    return row if len(found) == 0 else row[: start + int(found[0]) + 1]


def _refuse_right_padding(mask: Int[Tensor, "batch pos"] | None, what: str) -> None:
    """Refuse prompts padded on the right (a pad after a real token): generate continues after each
    row's last position, which for their shorter prompts is padding."""
    if mask is not None and bool((mask[:, 1:] < mask[:, :-1]).any()):
        raise ValueError(
            f"generate continues after each prompt's last position: pad a batch of {what} on the left "
            "(padding_side='left'; the default for texts), not the right."
        )


def _past_context(model: nn.Module, positions: int, max_new_tokens: int, room: int) -> str:
    return (
        f"a prompt of {positions} positions and max_new_tokens={max_new_tokens} go past "
        f"{model.cfg.model_name}'s context of {model.cfg.n_ctx}: lower max_new_tokens to {room} or shorten "
        "the prompt"
    )


def _logits_after_embeds(
    model: nn.Module,
    prompt_embeds: Float[Tensor, "batch prompt_pos d_model"],
    new_tokens: Int[Tensor, "batch new_pos"],
    past_kv_cache: HookedTransformerKeyValueCache | None,
) -> Float[Tensor, "batch d_vocab"]:
    """The next token's logits after token embeddings and the tokens generated so far: the positions
    not yet in the KV cache (all of them without one) run from block 0, with learned (or shortformer)
    positions."""
    embeds = torch.cat([prompt_embeds, model.W_E[new_tokens]], dim=1)
    if embeds.shape[1] > model.cfg.n_ctx:
        raise ValueError(
            f"The embeddings and new tokens are {embeds.shape[1]} positions but {model.cfg.model_name} has "
            f"a context of {model.cfg.n_ctx}; shorten the prompt or lower max_new_tokens."
        )
    n_cached = 0 if past_kv_cache is None else past_kv_cache.n_cached
    residual = embeds[:, n_cached:]
    pos_embed = None
    if model.cfg.learned_positions:
        pos_embed = model.W_pos[n_cached : embeds.shape[1]].expand_as(residual)
    if model.cfg.positional == "learned":
        residual, pos_embed = residual + pos_embed, None
    logits = model(residual, start_at_layer=0, past_kv_cache=past_kv_cache, shortformer_pos_embed=pos_embed)
    return logits[:, -1].float()
