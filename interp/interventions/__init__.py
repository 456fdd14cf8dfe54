"""The intervention layer: the engine of patched runs, patching, ablation, metrics, statistics."""
