"""TransformerLens's key/value cache: each layer's keys and values of the tokens run so far, and
their attention mask, so that a forward pass over new tokens costs only their positions.

`cache = HookedTransformerKeyValueCache.init_cache(model.cfg, model.cfg.device, batch_size)`, then
`model(tokens, past_kv_cache=cache)` runs the new tokens after the cached ones and appends them;
`cache.freeze()` keeps the cache as it is (each call then continues the same prefix).
Keys are stored as the attention uses them: after q/k norms and rotary, per key/value head.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.config import Config


@dataclass
class HookedTransformerKeyValueCacheEntry:
    """One layer's cached keys and values, [batch, pos_so_far, n_kv_heads, d_head] each."""

    past_keys: Float[Tensor, "batch pos_so_far kv_head d_head"]
    past_values: Float[Tensor, "batch pos_so_far kv_head d_head"]
    frozen: bool = False

    @classmethod
    def init_cache_entry(
        cls, cfg: Config, device: torch.device | str | None, batch_size: int = 1
    ) -> HookedTransformerKeyValueCacheEntry:
        shape = (batch_size, 0, cfg.n_kv_heads, cfg.d_head)
        return cls(
            torch.empty(shape, device=device, dtype=cfg.dtype),
            torch.empty(shape, device=device, dtype=cfg.dtype),
        )

    def append(
        self,
        new_keys: Float[Tensor, "batch new_pos kv_head d_head"],
        new_values: Float[Tensor, "batch new_pos kv_head d_head"],
    ) -> tuple[Float[Tensor, "batch pos kv_head d_head"], Float[Tensor, "batch pos kv_head d_head"]]:
        """The cached keys and values followed by the new ones (kept unless the cache is frozen)."""
        if new_keys.shape[0] != self.past_keys.shape[0]:
            raise ValueError(
                f"The KV cache was made for a batch of {self.past_keys.shape[0]} prompts, got "
                f"{new_keys.shape[0]}: init_cache(cfg, device, batch_size={new_keys.shape[0]})."
            )
        keys = torch.cat([self.past_keys.to(new_keys), new_keys], dim=1)
        values = torch.cat([self.past_values.to(new_values), new_values], dim=1)
        if not self.frozen:
            self.past_keys, self.past_values = keys, values
        return keys, values


@dataclass
class HookedTransformerKeyValueCache:
    """Every layer's `HookedTransformerKeyValueCacheEntry` and the attention mask of the cached
    tokens ([batch, pos_so_far], 1: a real token)."""

    entries: list[HookedTransformerKeyValueCacheEntry]
    previous_attention_mask: Int[Tensor, "batch pos_so_far"]
    frozen: bool = field(default=False)

    @classmethod
    def init_cache(
        cls, cfg: Config, device: torch.device | str | None, batch_size: int = 1
    ) -> HookedTransformerKeyValueCache:
        """An empty cache for a model of config `cfg` and batches of `batch_size` prompts."""
        entries = [
            HookedTransformerKeyValueCacheEntry.init_cache_entry(cfg, device, batch_size)
            for _ in range(cfg.n_layers)
        ]
        return cls(entries, torch.empty((batch_size, 0), device=device, dtype=torch.long))

    @property
    def n_cached(self) -> int:
        """How many positions are cached."""
        return self.previous_attention_mask.shape[1]

    def check_fits(self, cfg: Config, layers: tuple[int, int] | None = None) -> None:
        """Refuse a cache made for a model of another shape (layers, key/value heads, d_head), one whose
        layers hold other numbers of tokens than its mask records, and a run of only `layers` (start,
        stop) that would add to it (a frozen cache may be read part way)."""
        shapes = {tuple(entry.past_keys.shape[2:]) for entry in self.entries}
        if len(self.entries) != cfg.n_layers or shapes != {(cfg.n_kv_heads, cfg.d_head)}:
            made = " or ".join(map(str, sorted(shapes)))
            made = f"{len(self.entries)} layers of {made} (key/value heads, d_head)"
            raise ValueError(
                f"This KV cache was made for another model ({made}); {cfg.model_name} has {cfg.n_layers} "
                f"layers of ({cfg.n_kv_heads}, {cfg.d_head}): make one with init_cache(model.cfg, device, "
                "batch_size)."
            )
        counts = {entry.past_keys.shape[1] for entry in self.entries}
        if counts != {self.n_cached}:
            raise ValueError(
                f"This KV cache's layers hold {sorted(counts)} tokens where its mask records "
                f"{self.n_cached}: a run that started or stopped at a layer filled only some of them; make "
                "a new one with init_cache(model.cfg, device, batch_size)."
            )
        if layers is not None and not self.frozen and tuple(layers) != (0, cfg.n_layers):
            raise ValueError(
                f"a run of layers {layers[0]} to {layers[1]} would add its tokens to those layers' KV "
                "caches only, leaving the cache's layers out of step (later runs on it read wrong keys): "
                "run every layer with past_kv_cache, freeze the cache (past_kv_cache.freeze()) to read it "
                "without adding, or leave start_at_layer and stop_at_layer out."
            )

    def freeze(self) -> None:
        """Keep the cache as it is: later forward passes read it but append nothing."""
        self.frozen = True
        for entry in self.entries:
            entry.frozen = True

    def unfreeze(self) -> None:
        self.frozen = False
        for entry in self.entries:
            entry.frozen = False

    def append_attention_mask(self, attention_mask: Int[Tensor, "batch new_pos"]) -> Int[Tensor, "batch pos"]:
        """The mask of the cached tokens followed by `attention_mask` (kept unless frozen)."""
        attention_mask = attention_mask.to(self.previous_attention_mask.device, torch.long)
        updated = torch.cat([self.previous_attention_mask, attention_mask], dim=-1)
        if not self.frozen:
            self.previous_attention_mask = updated
        return updated

    def __getitem__(self, layer: int) -> HookedTransformerKeyValueCacheEntry:
        return self.entries[layer]
