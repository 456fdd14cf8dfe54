"""Path patching (Wang et al. 2022; Goldowsky-Dill et al. 2023): the effect of corrupting senders'
outputs along their paths to receivers only, everything else frozen to the clean run. Runs through
the intervention engine (`interp.interventions.engine`).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch
from jaxtyping import Int
from torch import Tensor

from interp.checks import check_distinct_pair, check_int
from interp.interventions.engine import (
    Intervention,
    RunOptions,
    Site,
    cached_run,
    check_logit_pos,
    check_pair,
    metric_values,
    read_site_sets,
    run_site_sets,
    start_names,
    takes_run_options,
)
from interp.interventions.metrics import Metric, check_reads_real_tokens
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


@takes_run_options("logit_pos", "logit_tokens", "batch_size", "base")
def path_patching(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: Metric,
    receivers: Sequence[Receiver] | str = "logits",
    senders: Sequence[Sender | Sequence[Sender]] | None = None,
    *,
    sender_pos: Pos = None,
    receiver_pos: Pos = None,
    freeze_mlps: bool = False,
    options: RunOptions = RunOptions(),
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
      head of that group shares; with `ungroup_grouped_query_attention` (one copy of each key and
      value per query head, as TransformerLens), the input of head h's copy only.
    senders: a list of senders (each its own run: a sweep) or of lists of senders (patched
      together); default every head in layers before the last receiver (all layers for logits).
    sender_pos, receiver_pos: None (all positions), int, or LongTensor [batch] per prompt
      (e.g. receivers' queries at END).
    options: `RunOptions`' logit_pos (the positions the metric reads: logits only there),
      logit_tokens (only their logits are computed in the patched runs), batch_size and base (the
      engine's interventions made in every run, the clean and corrupted ones included, e.g. heads
      mean-ablated: `ablation.ablation_interventions`, before the path's own).
    Returns a PatchResult with dims ("layer", "head") for the default sweep, else ("patch",).
    """
    return PathPatcher(model, clean, corrupted, options)(
        metric, receivers, senders, sender_pos=sender_pos, receiver_pos=receiver_pos, freeze_mlps=freeze_mlps
    )


class PathPatcher:
    """`path_patching` on one pair of prompt batches, run 1 (the clean and corrupted runs, cached)
    done once for any number of calls with other receivers, senders or metrics, e.g. the steps of
    a circuit discovery. `options`: how every call's runs are made (see `path_patching`).
    The caches hold what the model computed under the hooks active at construction: a call under
    other hooks, or after the weights changed, raises (`is_current`)."""

    def __init__(
        self,
        model: HookedTransformer,
        clean: Int[Tensor, "batch pos"],
        corrupted: Int[Tensor, "batch pos"],
        options: RunOptions = RunOptions(),
    ):
        if not isinstance(options, RunOptions):
            raise TypeError(
                f"PathPatcher's fourth argument is its RunOptions, got {type(options).__name__}: pass "
                "RunOptions(logit_pos=..., base=...)"
            )
        options.refuse_unused("PathPatcher", ("logit_pos", "logit_tokens", "batch_size", "base"))
        logit_pos = options.logit_pos
        clean, corrupted = check_pair(model, clean, corrupted)
        check_distinct_pair(clean, corrupted, "every path-patched run (senders carry clean values)")
        check_logit_pos(logit_pos, clean)
        self.corrupted = corrupted
        cfg = model.cfg
        names = {act_name("z", layer) for layer in range(cfg.n_layers)}
        names |= {act_name("mlp_out", layer) for layer in range(cfg.n_layers)} if not cfg.attn_only else set()
        names |= set(start_names(model))
        self.model, self.clean, self.batch, self.options = model, clean, clean.shape[0], options
        self._state = model.run_state()
        runs = [cached_run(model, tokens, names, logit_pos, options.base) for tokens in (clean, corrupted)]
        (self.clean_logits, self.clean_cache), (self.corrupted_logits, self.corrupted_cache) = runs

    def is_current(self) -> bool:
        """Whether the model has the hooks and weights it had when the runs were cached."""
        return self.model.run_state() == self._state

    def __call__(
        self,
        metric: Metric,
        receivers: Sequence[Receiver] | str = "logits",
        senders: Sequence[Sender | Sequence[Sender]] | None = None,
        *,
        sender_pos: Pos = None,
        receiver_pos: Pos = None,
        freeze_mlps: bool = False,
    ) -> PatchResult:
        """Runs 2 and 3 of `path_patching` (its arguments) on the cached runs, made as the patcher's
        options say."""
        if not self.is_current():
            raise ValueError(
                "the model's hooks or weights changed since this PathPatcher cached its clean and "
                "corrupted runs; make a new PathPatcher under the hooks the sweep runs with"
            )
        model, cfg = self.model, self.model.cfg
        logit_pos = self.options.logit_pos
        metric = check_reads_real_tokens(model, metric, self.clean, self.corrupted, logit_pos=logit_pos)
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
        values = torch.empty(len(sender_sets), batch)
        order = sorted(
            range(len(sender_sets)), key=lambda i: min((s[0] for s in sender_sets[i]), default=cfg.n_layers)
        )
        n_reads = 1 if to_logits else len({layer for layer, _, _ in receivers})
        run_bytes = n_reads * self.clean.numel() * cfg.d_model * torch.finfo(model.dtype).bits // 8
        fit = min(64, (2**29) // max(1, run_bytes))  # run 2's reads: ~512 MiB
        chunk = max(self.options.batch_size or 1, fit)
        for start in range(0, len(order), chunk):
            indices = order[start : start + chunk]
            values[indices] = self._patched(
                [sender_sets[i] for i in indices], metric, receivers, sender_pos, receiver_pos,
                freeze_mlps,
            )  # fmt: skip
        if grid:
            index = grid_index("z", dims, coords)
        else:
            labels = [
                " + ".join(_sender_label(s) for s in sender_set) or "none" for sender_set in sender_sets
            ]
            dims, coords = ("patch",), {"patch": labels}
            index = pd.DataFrame({"component": labels, "layer": None, "head": None, "position": None})
        return PatchResult(
            values=values,
            index=index,
            dims=dims,
            coords=coords,
            target=metric_values(metric, self.clean_logits, batch),
            source=metric_values(metric, self.corrupted_logits, batch),
            method="path patching",
            extra={"receivers": receivers, "freeze_mlps": freeze_mlps},
        )

    def _patched(
        self,
        sender_sets: Sequence[Sequence[Sender]],
        metric: Metric,
        receivers: Sequence[Receiver] | str,
        sender_pos: Pos,
        receiver_pos: Pos,
        freeze_mlps: bool,
    ) -> Tensor:
        """Runs 2 and 3 of path patching for each sender set, on the engine: [n_sets, batch]."""
        model, cfg, clean, options = self.model, self.model.cfg, self.clean_cache, self.options
        if isinstance(receivers, str):  # the final residual stream: run 2 is the measured run
            runs = [self._run2(senders, cfg.n_layers, sender_pos, freeze_mlps) for senders in sender_sets]
            return run_site_sets(model, self.clean, runs, None, metric, target=clean, options=options)
        layers = sorted({layer for layer, _, _ in receivers})
        # Run 2 reads each receiver layer's input where the block before it ends (as resid_post).
        reads = {layer: act_name("resid_post", layer - 1) for layer in layers if layer > 0}
        clean_reads = {name: clean[act_name("resid_pre", layer)] for layer, name in reads.items()}
        runs = [self._run2(senders, layers[-1], sender_pos, freeze_mlps) for senders in sender_sets]
        recorded = (
            read_site_sets(
                model,
                self.clean,
                runs,
                list(reads.values()),
                dict,
                target={**clean, **clean_reads},
                options=RunOptions(batch_size=options.batch_size, base=options.base),
            )
            if reads
            else [{} for _ in runs]
        )
        # Run 3: the clean run with the receivers' inputs replaced by what run 2 recorded.
        runs = []
        for inputs in recorded:
            run = []
            for layer in layers:
                value = inputs[reads[layer]] if layer in reads else clean[act_name("resid_pre", layer)]
                for letter in "qkv":
                    heads = sorted(
                        {
                            h if letter == "q" or cfg.ungroup_grouped_query_attention else h // cfg.group_size
                            for r_layer, h, which in receivers
                            if r_layer == layer and letter in which
                        }
                    )
                    if heads:
                        site = Site(act_name(f"{letter}_input", layer), head=heads, pos=receiver_pos)
                        run.append(Intervention(site, value[:, :, None, :]))  # [batch, pos, 1, d_model]
            runs.append(run)
        return run_site_sets(model, self.clean, runs, None, metric, target=clean, options=options)

    def _run2(self, senders: Sequence[Sender], stop: int, sender_pos: Pos, freeze_mlps: bool) -> list:
        """Run 2's interventions for one sender set in the blocks before `stop`: from the first
        sender's block on, every head's z frozen to clean (and the MLPs with freeze_mlps), the senders'
        outputs corrupted at sender_pos."""
        cfg, clean, corrupted = self.model.cfg, self.clean_cache, self.corrupted_cache
        run = []
        for layer in range(min((s[0] for s in senders), default=stop), stop):
            z = act_name("z", layer)
            run.append(Intervention(Site(z), clean))
            run += [
                Intervention(Site(z, head=unit, pos=sender_pos), corrupted)
                for s_layer, unit in senders
                if s_layer == layer and unit != "mlp"
            ]
            if cfg.attn_only:
                continue
            mlp = act_name("mlp_out", layer)
            if freeze_mlps:
                run.append(Intervention(Site(mlp), clean))
            if any(s_layer == layer and unit == "mlp" for s_layer, unit in senders):
                run.append(Intervention(Site(mlp, pos=sender_pos), corrupted))
        return run


def _is_sender(sender) -> bool:
    """(layer, head) or (layer, "mlp"); a set of senders is a sequence of such pairs."""
    return isinstance(sender, tuple) and len(sender) == 2 and not isinstance(sender[0], tuple | list)


def _sender_label(sender: Sender) -> str:
    layer, unit = sender
    return f"MLP{layer}" if unit == "mlp" else f"L{layer}H{unit}"
