"""Results of patching and ablation sweeps: per-prompt values of every patched run, labelled by
the grid the runs form, with means and bootstrap CIs (`interp.interventions.stats`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product

import pandas as pd
from jaxtyping import Float
from torch import Tensor

from interp.interventions.stats import bootstrap_ci


@dataclass(kw_only=True)
class PatchResult:
    """Per-example metric values of a set of patched runs, with labels.

    values: [n_patches, batch] metric of each patched run on each prompt.
    index: one row per patch (columns component, layer, head, position).
    dims, coords: the grid the patches form (e.g. ("layer", "head") with their labels);
      `mean()` / `per_example()` reshape values to it.
    target, source: the metric on the unpatched target and source runs, [batch].
    """

    values: Tensor
    index: pd.DataFrame
    dims: tuple[str, ...]
    coords: dict[str, list]
    metric_name: str = "metric"
    target: Tensor | None = None
    source: Tensor | None = None
    method: str = "activation patching"
    extra: dict = field(default_factory=dict)

    def per_example(self) -> Float[Tensor, "*grid batch"]:
        return self.values.view(*[len(self.coords[d]) for d in self.dims], self.values.shape[-1])

    def mean(self) -> Float[Tensor, "*grid"]:
        """The batch-mean metric as a tensor shaped like the grid, e.g. [layer, head]."""
        return self.per_example().mean(-1)

    def to_dataframe(self) -> pd.DataFrame:
        """Tidy: one row per patch and prompt (component, layer, head, position, metric, example, value)."""
        n, batch = self.values.shape
        frame = self.index.loc[self.index.index.repeat(batch)].reset_index(drop=True)
        frame["metric"] = self.metric_name
        frame["example"] = list(range(batch)) * n
        frame["value"] = self.values.reshape(-1).numpy()
        return frame

    def summary(self, n_boot: int = 1000, ci: float = 0.95, seed: int = 0) -> pd.DataFrame:
        """One row per patch: mean over prompts and a percentile bootstrap CI (resampling prompts)."""
        low, high = bootstrap_ci(self.values, n_boot, ci, seed)
        frame = self.index.copy()
        frame["metric"] = self.metric_name
        frame["mean"] = self.values.mean(-1).numpy()
        frame["ci_low"], frame["ci_high"] = low.numpy(), high.numpy()
        frame["n"] = self.values.shape[-1]
        return frame


def grid_index(component: str, dims: tuple[str, ...], coords: dict[str, list]) -> pd.DataFrame:
    """One row per patch of a grid (every combination of the coords of dims): component, layer,
    head, position (None where the grid has no such axis)."""
    rows = [dict(zip(dims, labels, strict=True)) for labels in product(*(coords[d] for d in dims))]
    frame = pd.DataFrame(rows, columns=list(dims))
    frame.insert(0, "component", component)
    for column in ("layer", "head", "position"):
        if column not in frame:
            frame[column] = None
    return frame[["component", "layer", "head", "position"]]
