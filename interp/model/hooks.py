"""Hook settings: which opt-in hook points fire. They belong to a model, not to its `Config`.

Opt-in hook points cost memory (per-head copies of the residual stream), so they fire only while
their setting is on: `model.set_use_attn_result(True)`, or for a block of code
`with model.settings(use_attn_result=True):`. Library code that needs one switches it with
`model.settings`, which restores the previous value on exit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from transformer_lens import hook_points

import interp.checks as checks


class HookPoint(hook_points.HookPoint):
    """TransformerLens's HookPoint whose hooks have their return values checked: every route
    (`model.hooks`, `run_with_hooks`, `model.add_hook`, `hook_point.add_hook`) ends in `add_hook`, so
    a hook returning the wrong shape, dtype, device or type raises an error naming it
    (`checks.checked_hook`), forward and backward."""

    def add_hook(self, hook: Callable, dir: str = "fwd", *args: Any, **kwargs: Any) -> Any:
        handle = super().add_hook(checks.checked_hook(hook, dir, self.name), dir, *args, **kwargs)
        if dir == "fwd" and getattr(hook, "observes_only", False):
            live = set(self._forward_hooks)  # forget removed hooks' ids
            observers = {i for i in getattr(self, "_observer_ids", ()) if i in live}
            self._observer_ids = observers | {handle.hook.id}
        return handle

    def has_hooks(self) -> bool:
        """Whether a forward or backward hook is on this point."""
        return bool(self._forward_hooks or self._backward_hooks)

    def only_observed(self) -> bool:
        """Whether every hook on this point is a forward `observer` (it reads, never changes, the
        activation, and no gradient is hooked): the computation may then skip the activation and
        make it for the observers alone."""
        return not self._backward_hooks and not self.writing_hooks()

    def writing_hooks(self) -> list[Callable]:
        """The forward hooks on this point that may change its activation (all but `observer`s)."""
        observers = getattr(self, "_observer_ids", set())
        return [hook for i, hook in self._forward_hooks.items() if i not in observers]

    def hook_ids(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The ids of the forward and backward hooks on this point (each registration has its own)."""
        return tuple(self._forward_hooks), tuple(self._backward_hooks)


def observer(hook: Callable) -> Callable:
    """Mark a forward hook as one that only reads its activation (it returns None; checked), e.g.
    `run_with_cache`'s: the computation is then the one without it (fused attention stays fused),
    so a cached run's outputs are the uncached run's, bit for bit."""

    @functools.wraps(hook)
    def observe(tensor: Any, hook: Any) -> None:
        if observe.__wrapped__(tensor, hook=hook) is not None:
            raise ValueError(f"the observer hook at {hook.name!r} returned a value; an observer returns None")

    observe.observes_only = True
    return observe


@dataclass
class HookSettings:
    """The opt-in hook points of one model (shared by its blocks).

    use_attn_result: `attn.hook_result`, each head's output [batch, pos, head, d_model].
    use_split_qkv_input: `hook_q_input`/`hook_k_input`/`hook_v_input`, per-head attention inputs
        [batch, pos, head (key/value heads for k and v), d_model]; the block's norm runs per head.
    use_hook_mlp_in: `hook_mlp_in`, the MLP's input before ln2 [batch, pos, d_model].
    use_attn_in: `hook_attn_in`, one per-head attention input shared by q, k and v.
    use_hook_tokens: `hook_tokens`, the input token ids [batch, pos] (a hook may replace them).
    ungroup_grouped_query_attention: under grouped-query attention, `hook_k`, `hook_v` (and the
        split `hook_k_input`, `hook_v_input`) hold one copy per query head [batch, pos, head, ...]
        (TransformerLens's switch); the weights stay per key/value head.
    """

    use_attn_result: bool = False
    use_split_qkv_input: bool = False
    use_hook_mlp_in: bool = False
    use_attn_in: bool = False
    use_hook_tokens: bool = False
    ungroup_grouped_query_attention: bool = False

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def switch(self, group_size: int, **settings: bool) -> None:
        """Turn settings on or off (`group_size`: query heads per key/value head of the model)."""
        unknown = set(settings) - set(self.names())
        if unknown:
            raise ValueError(f"{sorted(unknown)}: only {list(self.names())} can be changed at run time.")
        if settings.get("use_attn_in") and group_size > 1:
            raise checks.InvalidArgumentError(
                "hook_attn_in needs one key/value head per query head; use set_use_split_qkv_input."
            )
        both = {"use_attn_in", "use_split_qkv_input"}
        if all(settings.get(key, getattr(self, key)) for key in both):  # hook_attn_in would not fire
            raise checks.InvalidArgumentError(
                "use_attn_in and use_split_qkv_input are two ways to hook the attention's input and "
                "cannot both be on (as in TransformerLens): turn one off first."
            )
        for key, value in settings.items():
            setattr(self, key, bool(value))


# Hook points that fire only when their setting is on: hook name suffix -> setting.
OPT_IN_HOOKS = {
    "hook_result": "use_attn_result",
    "_input": "use_split_qkv_input",
    "hook_attn_in": "use_attn_in",
    "hook_mlp_in": "use_hook_mlp_in",
    "hook_tokens": "use_hook_tokens",
}


def opt_in_setting(hook_name: str) -> str | None:
    """The setting a hook point needs to fire (None: it always fires)."""
    return next((setting for suffix, setting in OPT_IN_HOOKS.items() if hook_name.endswith(suffix)), None)
