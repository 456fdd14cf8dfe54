"""Generation: greedy or sampled continuation of prompts, with a KV cache."""

from __future__ import annotations

from typing import Literal

import torch
import tqdm
from jaxtyping import Int
from torch import Tensor, nn


@torch.no_grad()
def generate(
    model: nn.Module,
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
    """Greedy or sampled continuation by a HookedTransformer; by default text in -> text out,
    tokens in -> tokens out.

    Greedy unless `do_sample=True` (temperature 1 unless given) or a temperature > 0 is given;
    (TransformerLens samples by default). With the KV cache each new token costs one position's
    forward pass. Batched token input must share one length (no padding), since padding would
    sit between prompt and continuation. `verbose` shows a progress bar.
    """
    if isinstance(input, str):
        tokens = model.to_tokens(input, prepend_bos=prepend_bos)
    else:
        tokens = model.input_tokens(input, prepend_bos)
    sample = do_sample if do_sample is not None else bool(temperature)
    temperature = 1.0 if temperature is None else temperature
    if sample and temperature <= 0:
        raise ValueError(f"Sampling needs a temperature > 0, got {temperature}; or use do_sample=False.")
    generator = torch.Generator(device=tokens.device).manual_seed(seed) if seed is not None else None
    if eos_token_id is None and stop_at_eos and model.tokenizer is not None:
        eos_token_id = model.tokenizer.eos_token_id
    eos = eos_token_id if stop_at_eos else None
    past_kv = [{} for _ in model.blocks] if use_past_kv_cache else None
    finished = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    step_input = tokens
    for _ in tqdm.trange(max_new_tokens, disable=not verbose):
        logits = model(step_input if use_past_kv_cache else tokens, past_kv=past_kv)[:, -1].float()
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
            model.cfg.default_prepend_bos if prepend_bos is None else prepend_bos
        )
        text = model.to_string(tokens[:, int(prepended) :])  # without the BOS, as TransformerLens
        return text[0] if len(text) == 1 else text
    return tokens
