"""The io layer: where weights come from (sources, architectures, checkpoints) and where they live
(devices). Reads and writes (Config, state dict, tokenizer); never builds a model."""
