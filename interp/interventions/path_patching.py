"""Path patching (Wang et al. 2022; Goldowsky-Dill et al. 2023): the effect of corrupting senders'
outputs along their paths to receivers only, everything else frozen to the clean run. Runs through
the intervention engine (`interp.interventions.engine`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.checks import check_distinct_pair, check_int
from interp.interventions.engine import (
    LogitBuffer,
    Site,
    cached_run,
    check_logit_pos,
    check_pair,
    final_resid_hook,
    forward_logit_copies,
    logit_columns,
    metric_values,
    overwritten_z,
    resid_names,
    resid_stack,
    site_mask,
)
from interp.interventions.metrics import Metric
from interp.interventions.results import PatchResult, grid_index
from interp.model.cache import act_name
from interp.model.transformer import HookedTransformer
from interp.types import Pos

Sender = tuple[int, int | str]  # (layer, head) or (layer, "mlp")
Receiver = tuple[int, int, str]  # (layer, head, "q" | "k" | "v" | any combination, e.g. "qkv")


def _check_senders(model: HookedTransformer, senders: Sequence[Sender]) -> None:
    cfg = model.cfg
    for sender in senders:
        if not isinstance(sender, tuple | list) or len(sender) != 2:
            raise TypeError(f"a sender must be (layer, head) or (layer, 'mlp'), got {sender!r}")
        layer, unit = sender
        layer = check_int(layer, f"sender {sender}'s layer")
        if unit != "mlp":
            unit = check_int(unit, f"sender {sender}'s head")
        if not 0 <= layer < cfg.n_layers:
            raise ValueError(f"sender {sender}: layer must lie in [0, {cfg.n_layers})")
        if unit == "mlp":
            if cfg.attn_only:
                raise ValueError(f"sender {sender}: this model is attention-only and has no MLPs")
        elif not (isinstance(unit, int) and 0 <= unit < cfg.n_heads):
            raise ValueError(
                f"sender {sender}: give (layer, head) with head in [0, {cfg.n_heads}) or (layer, 'mlp')"
            )


def _check_receivers(model: HookedTransformer, receivers: Sequence[Receiver] | str) -> None:
    if isinstance(receivers, str):
        if receivers not in ("logits", "resid_final"):
            raise ValueError(
                f"receivers must be 'logits' or a list of (layer, head, 'q'|'k'|'v'), got {receivers!r}"
            )
        return
    if not receivers:
        raise ValueError("receivers is empty: give (layer, head, 'qkv') tuples or 'logits'")
    cfg = model.cfg
    for receiver in receivers:
        layer, head, inputs = receiver
        layer, head = (
            check_int(layer, f"receiver {receiver}'s layer"),
            check_int(head, f"receiver {receiver}'s head"),
        )
        if not 0 <= layer < cfg.n_layers or not 0 <= head < cfg.n_heads:
            raise ValueError(
                f"receiver {receiver}: layer in [0, {cfg.n_layers}) and head in [0, {cfg.n_heads}) needed"
            )
        if not inputs or set(inputs) - set("qkv"):
            raise ValueError(f"receiver {receiver}: the input must be a combination of 'q', 'k', 'v'")


def path_patching(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: Metric,
    receivers: Sequence[Receiver] | str = "logits",
    senders: Sequence[Sender | Sequence[Sender]] | None = None,
    sender_pos: Pos = None,
    receiver_pos: Pos = None,
    freeze_mlps: bool = False,
    metric_name: str = "metric",
    batch_size: int | None = None,
    logit_pos: Pos = None,
    logit_tokens: Tensor | None = None,
) -> PatchResult:
    """Path patching (Wang et al. 2022, sec. 3.1 and appendix B; Goldowsky-Dill et al. 2023): the
    effect of senders -> receivers paths, one patched run per sender (or per set of senders).

    Semantics (the clean run is the target; corrupted activations travel only along the paths):
      run 1: cache the clean and corrupted runs.
      run 2: the clean run in which every sender's output (hook_z of the head, or mlp_out) is
        set to its corrupted value at `sender_pos`, and the output (hook_z) of every other head,
        at every layer and position, is frozen to its clean value. MLPs are recomputed, as in the
        IOI paper, so sender -> MLP -> receiver paths count as part of the path; with
        freeze_mlps=True they are frozen to clean too (only direct sender -> receiver paths).
        Normalisations are always recomputed. Record the receivers' inputs.
      run 3: the clean run in which the receivers' inputs (at `receiver_pos`) are replaced by the
        values recorded in run 2, and everything else, downstream of the receivers included, is
        recomputed. The metric is measured on this run.
    receivers: (layer, head, "q"/"k"/"v"/"qkv"...) -- the query/key/value input of that head
      (hook_q_input/k_input/v_input); or "logits" (the final residual stream: the metric of run 2).
      Grouped-query attention: keys and values are computed per key/value head, so a receiver
      (layer, h, "k") patches the input of key/value head h // group_size, which every query
      head of that group shares.
    senders: a list of senders (each its own run: a sweep) or of lists of senders (patched
      together); default every head in layers before the last receiver (all layers for logits).
    sender_pos, receiver_pos: None (all positions), int, or LongTensor [batch] per prompt
      (e.g. receivers' queries at END).
    logit_pos: the positions the metric reads; logits only there (see forward_logits).
    logit_tokens: the token ids the metric reads there; only their logits are computed in the
      patched runs (see `PathPatcher.__call__`).
    Returns a PatchResult with dims ("layer", "head") for the default sweep, else ("patch",).
    """
    return PathPatcher(model, clean, corrupted, logit_pos)(
        metric, receivers, senders, sender_pos, receiver_pos, freeze_mlps, metric_name, batch_size,
        logit_tokens,
    )  # fmt: skip


class PathPatcher:
    """`path_patching` on one pair of prompt batches, run 1 (the clean and corrupted runs, cached)
    done once for any number of calls with other receivers, senders or metrics, e.g. the steps of
    a circuit discovery. The caches hold what the model computed under the hooks active at
    construction: a call under other hooks, or after the weights changed, raises (`is_current`)."""

    def __init__(
        self,
        model: HookedTransformer,
        clean: Int[Tensor, "batch pos"],
        corrupted: Int[Tensor, "batch pos"],
        logit_pos: Pos = None,
    ):
        clean, corrupted = check_pair(model, clean, corrupted)
        check_distinct_pair(clean, corrupted, "every path-patched run (senders carry clean values)")
        check_logit_pos(logit_pos, clean)
        cfg = model.cfg
        names = {act_name("z", layer) for layer in range(cfg.n_layers)}
        names |= {act_name("mlp_out", layer) for layer in range(cfg.n_layers)} if not cfg.attn_only else set()
        names |= set(resid_names(model)) | {final_resid_hook(model)}
        self.model, self.batch, self.logit_pos = model, clean.shape[0], logit_pos
        self._state = _model_state(model)
        self.clean_logits, self.clean_cache = cached_run(model, clean, names, logit_pos)
        self.corrupted_logits, self.corrupted_cache = cached_run(model, corrupted, names, logit_pos)

    def is_current(self) -> bool:
        """Whether the model has the hooks and weights it had when the runs were cached."""
        return _model_state(self.model) == self._state

    def __call__(
        self,
        metric: Metric,
        receivers: Sequence[Receiver] | str = "logits",
        senders: Sequence[Sender | Sequence[Sender]] | None = None,
        sender_pos: Pos = None,
        receiver_pos: Pos = None,
        freeze_mlps: bool = False,
        metric_name: str = "metric",
        batch_size: int | None = None,
        logit_tokens: Tensor | None = None,
    ) -> PatchResult:
        """Runs 2 and 3 of `path_patching` (its arguments) on the cached runs. logit_tokens: the
        token ids the metric reads at logit_pos (e.g. each prompt's answers): only their logits are
        computed in the patched runs, the others are NaN."""
        if not self.is_current():
            raise ValueError(
                "the model's hooks or weights changed since this PathPatcher cached its clean and "
                "corrupted runs; make a new PathPatcher under the hooks the sweep runs with"
            )
        model, cfg = self.model, self.model.cfg
        _check_receivers(model, receivers)
        to_logits = isinstance(receivers, str)
        last_layer = cfg.n_layers if to_logits else max(r[0] for r in receivers)
        grid = senders is None
        if grid:
            dims = ("layer", "head")
            coords = {"layer": list(range(last_layer)), "head": list(range(cfg.n_heads))}
            senders = [(layer, head) for layer in coords["layer"] for head in coords["head"]]
        sender_sets = [[s] if _is_sender(s) or isinstance(s, str) else list(s) for s in senders]
        for sender_set in sender_sets:
            _check_senders(model, sender_set)
        batch = self.batch
        batch_size = batch_size or max(1, 64 // batch)
        values = torch.empty(len(sender_sets), batch)
        buffer = LogitBuffer(logit_columns(model, logit_tokens))
        order = sorted(
            range(len(sender_sets)), key=lambda i: min((s[0] for s in sender_sets[i]), default=cfg.n_layers)
        )
        with torch.no_grad():
            for chunk in [order[i : i + batch_size] for i in range(0, len(order), batch_size)]:
                logits = _path_patch_chunk(
                    model,
                    [sender_sets[i] for i in chunk],
                    receivers,
                    self.clean_cache,
                    self.corrupted_cache,
                    sender_pos,
                    receiver_pos,
                    freeze_mlps,
                    self.logit_pos,
                    buffer,
                )
                for i, copy in zip(chunk, logits, strict=True):
                    values[i] = metric_values(metric, copy, batch)
        if grid:
            index = grid_index("z", dims, coords)
        else:
            labels = [
                " + ".join(_sender_label(s) for s in sender_set) or "none" for sender_set in sender_sets
            ]
            dims, coords = ("patch",), {"patch": labels}
            index = pd.DataFrame({"component": labels, "layer": None, "head": None, "position": None})
        return PatchResult(
            values,
            index,
            dims,
            coords,
            metric_name,
            target=metric_values(metric, self.clean_logits, batch),
            source=metric_values(metric, self.corrupted_logits, batch),
            method="path patching",
            extra={"receivers": receivers, "freeze_mlps": freeze_mlps},
        )


def _model_state(model: HookedTransformer) -> tuple:
    """The model's active hooks (each registration's id) and its parameters' in-place versions."""
    hooks = tuple(
        (name, tuple(point._forward_hooks), tuple(point._backward_hooks))
        for name, point in model.hook_dict.items()
        if point._forward_hooks or point._backward_hooks
    )
    versions = tuple(parameter._version for parameter in model.parameters())
    settings = tuple(getattr(model.hook_settings, name) for name in model.hook_settings.names())
    return hooks, versions, settings


def _is_sender(sender) -> bool:
    """(layer, head) or (layer, "mlp"); a set of senders is a sequence of such pairs."""
    return isinstance(sender, tuple) and len(sender) == 2 and not isinstance(sender[0], tuple | list)


def _sender_label(sender: Sender) -> str:
    layer, unit = sender
    return f"MLP{layer}" if unit == "mlp" else f"L{layer}H{unit}"


def _path_patch_chunk(
    model: HookedTransformer,
    sender_sets: Sequence[Sequence[Sender]],
    receivers: Sequence[Receiver] | str,
    clean: Mapping[str, Tensor],
    corrupted: Mapping[str, Tensor],
    sender_pos: Pos,
    receiver_pos: Pos,
    freeze_mlps: bool,
    logit_pos: Pos,
    buffer: LogitBuffer,
) -> Iterator[Float[Tensor, "batch pos d_vocab"]]:
    """Runs 2 and 3 of path patching for len(sender_sets) stacked copies of the clean run: each
    copy's logits in turn (in `buffer`, `forward_logit_copies`)."""
    cfg = model.cfg
    n = len(sender_sets)
    resid = resid_stack(model, clean)
    batch = resid[0].shape[0]
    start = min((s[0] for sender_set in sender_sets for s in sender_set), default=cfg.n_layers)
    to_logits = isinstance(receivers, str)
    receiver_layers = sorted({r[0] for r in receivers}) if not to_logits else []
    stop = cfg.n_layers if to_logits else receiver_layers[-1]

    # Run 2: senders corrupted, other heads (and optionally MLPs) frozen to clean; record receivers' inputs.
    def frozen(kind: str, layer: int, act: Tensor | None = None) -> Tensor:
        """[n * batch, ...]: clean values (or act's, for recomputed MLPs), senders' corrupted."""
        name = act_name(kind, layer)
        base = act.unflatten(0, (n, batch)) if act is not None else None
        out = base.clone() if base is not None else clean[name].expand(n, *clean[name].shape).clone()
        for i, sender_set in enumerate(sender_sets):
            for s_layer, unit in sender_set:
                if s_layer != layer or (unit == "mlp") != (kind == "mlp_out"):
                    continue
                site = Site(name, head=None if unit == "mlp" else unit, pos=sender_pos)
                out[i] = torch.where(site_mask(site, out.shape[1:], out.device), corrupted[name], out[i])
        return out.flatten(0, 1)

    def frozen_mlp(layer: int):
        def hook(act: Tensor, hook) -> Tensor:
            return frozen("mlp_out", layer, None if freeze_mlps else act)

        return hook

    recorded: dict[int, Tensor] = {}

    def record(layer: int):
        def hook(act: Tensor, hook) -> None:
            recorded[layer] = act.unflatten(0, (n, batch))

        return hook

    hooks = []
    for layer in range(max(start, 0), stop):
        if not cfg.attn_only and (freeze_mlps or any(s == (layer, "mlp") for ss in sender_sets for s in ss)):
            hooks.append((act_name("mlp_out", layer), frozen_mlp(layer)))
    hooks += [
        (act_name("resid_pre", layer), record(layer)) for layer in receiver_layers if start <= layer < stop
    ]
    if start < stop:
        run2 = resid[start].repeat(n, 1, 1)
        with model.hooks(fwd_hooks=hooks):
            for layer in range(start, stop):
                with overwritten_z(model, layer, frozen("z", layer)):
                    run2 = model(run2, start_at_layer=layer, stop_at_layer=layer + 1)
        if to_logits:  # the receiver is the final residual stream: run 2 is the measured run
            return forward_logit_copies(model, run2, batch, logit_pos, cfg.n_layers, buffer)
        recorded[stop] = run2.unflatten(0, (n, batch))
    elif to_logits:  # no sender before the end: the clean run
        return forward_logit_copies(model, resid[-1].repeat(n, 1, 1), batch, logit_pos, cfg.n_layers, buffer)
    for layer in receiver_layers:
        if layer not in recorded:  # every sender is at or after this receiver: its input is clean
            recorded[layer] = resid[layer].expand(n, *resid[layer].shape)

    # Run 3: clean run with the receivers' inputs replaced by what run 2 recorded.
    def patch_inputs(layer: int, letter: str, heads: list[int]):
        site = Site(act_name(f"{letter}_input", layer), head=heads, pos=receiver_pos)

        def hook(act: Tensor, hook) -> Tensor:
            act = act.unflatten(0, (n, batch))
            value = recorded[layer][:, :, :, None, :]  # [n, batch, pos, 1, d_model]
            mask = site_mask(site, act.shape[1:], act.device)
            return torch.where(mask, value, act).flatten(0, 1)

        return hook

    hooks = []
    for layer in receiver_layers:
        for letter in "qkv":
            heads = sorted(
                {
                    h if letter == "q" else h // cfg.group_size
                    for r_layer, h, inputs in receivers
                    if r_layer == layer and letter in inputs
                }
            )
            if heads:
                hooks.append((act_name(f"{letter}_input", layer), patch_inputs(layer, letter, heads)))
    # Only the receivers' blocks need separate query/key/value inputs (they cost more than one input).
    x = resid[receiver_layers[0]].repeat(n, 1, 1)
    with model.settings(use_split_qkv_input=True), model.hooks(fwd_hooks=hooks):
        for layer in range(receiver_layers[0], cfg.n_layers):
            with model.settings(use_split_qkv_input=layer in receiver_layers):
                x = model(x, start_at_layer=layer, stop_at_layer=layer + 1)
    return forward_logit_copies(model, x, batch, logit_pos, cfg.n_layers, buffer)
