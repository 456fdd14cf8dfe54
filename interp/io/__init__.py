"""The io layer: where weights come from (sources, architectures, checkpoints) and where they live
(devices); atomic writes (files) and the one JSON format of results (serialize). Reads and writes
(Config, state dict, tokenizer); never builds a model."""
