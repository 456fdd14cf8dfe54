"""Edge attribution speed and memory: interp vs TransformerLens 4.3's edge-level attribution patching.

Run alone (two torch processes on two cores distort every figure):
    python benchmarks/edges.py [--n-prompts 64] [--batch-size 32] [--threads 2] [--no-tl]

1. EAP-IG (5 steps, inputs) over every edge of SmolLM2-135M (70,651 edges, grouped-query attention,
   which TransformerLens's edge attribution refuses) on 64 IOI prompts against the ABC distribution,
   with a 3 GiB memory budget (`max_memory`, which picks the batch size; --batch-size N instead runs
   N prompts at once). Targets: <= 30 s on a 2-core CPU, <= 3 GiB peak above the model.
2. EAP on a random GPT-2-config model, interp against transformer_lens.tools.analysis'
   attribution_patch(granularity="edge") on a TransformerBridge with the same weights. The scores
   must agree to 1e-4 before any time is printed (else it stops with an error; TL scores per position
   in the denoising convention: the clean and corrupted prompts swap roles, and we sum TL's
   positions). Target: >= 5x faster.
3. An EAP-IG circuit of 300 edges on SmolLM2-135M (--circuit): `find_edge_circuit` with method
   eap-ig, the faithfulness curve on (MIB's 10 sizes, top |score|, top signed and random circuits)
   and no held-out prompts, so every faithfulness is measured on the discovery prompts. This is not
   the default `interp circuit --task ioi --edges 300` (a learned mask, no curve unless --curve,
   held-out prompts; `benchmarks/circuit.py` times that). Stage by stage, beside its compute floor:
   the token positions its passes run through the blocks (forward; a position with gradients counted
   once more for its backward pass, which takes the gradients of activations only, not of weights:
   one matmul per forward matmul) times one block's matmul flops, at this process's measured matmul
   rate (`heads.matmul_rate`). Target: under 2 minutes on 2 idle cores, within 1.5x of the floor.
Prints times, ratios and the peak extra memory (RSS) of each.
"""

from __future__ import annotations

import argparse
import time

import torch
import transformers
from heads import block_flops, matmul_rate  # benchmarks/heads.py
from patching import timed  # benchmarks/patching.py

import interp
from circuits.edge_circuits import EdgeCircuitSettings, find_edge_circuit, ioi_task
from interp import edges
from interp.runtime.memory import keep_freed_memory

GPT2_SHAPE = dict(n_layer=4, n_embd=256, n_head=8, vocab_size=1000, n_positions=64, initializer_range=0.1)


def smollm2_eap_ig(n_prompts: int, batch_size: int | None) -> None:
    model = interp.load_model("smollm2-135m").eval()
    task = ioi_task(model, n_prompts)
    graph = edges.edge_graph(model)
    print(f"SmolLM2-135M: {graph.n_edges:,} edges, {n_prompts} IOI prompts of {task.clean.shape[1]} tokens")
    budget = None if batch_size is not None else "3GiB"
    run = lambda: edges.edge_attribution(  # noqa: E731
        model, task.clean, task.corrupted, task.metric, "eap-ig", steps=5, batch_size=batch_size,
        max_memory=budget,
    )  # fmt: skip
    scores, seconds, peak = timed(run)
    how = f"batch size {batch_size}" if budget is None else f"max_memory={budget}"
    print(f"  interp EAP-IG (5 steps, {how}): {seconds:6.1f} s (target <= 30 s), "
          f"peak extra RSS {peak / 2**30:.2f} GiB (target <= 3 GiB)")  # fmt: skip
    for name, score in scores.top(5):
        print(f"    {name:<22} {score:+.4f}")


def smollm2_circuit(n_prompts: int, n_edges: int = 300) -> None:
    """An EAP-IG circuit of N edges with the faithfulness curve, on the discovery prompts only (not the
    default `interp circuit`: see the module's docstring), each stage beside its floor."""
    model = interp.load_model("smollm2-135m").eval()
    task = ioi_task(model, n_prompts)
    positions = {True: 0, False: 0}  # token positions through the blocks, with and without gradients

    def count(module, args) -> None:
        positions[torch.is_grad_enabled()] += args[0].shape[0] * args[0].shape[1]

    for block in model.blocks:
        block.register_forward_pre_hook(count)
    rate, per_position = matmul_rate(model), block_flops(model)
    began = time.perf_counter()
    result = find_edge_circuit(model, task, EdgeCircuitSettings(method="eap-ig", n_edges=n_edges))
    total = time.perf_counter() - began
    floor = (2 * positions[True] + positions[False]) * per_position / rate  # backward: one matmul per matmul
    print(f"\nSmolLM2-135M EAP-IG circuit of {n_edges} edges with the faithfulness curve, {n_prompts} IOI "
          f"prompts of {task.clean.shape[1]} tokens, no held-out prompts (matmul rate {rate / 1e9:.0f} "
          "GFLOP/s):")  # fmt: skip
    for stage, seconds in result.seconds.items():
        print(f"  {stage:<8} {seconds:7.1f} s")
    print(f"  total    {total:7.1f} s (target < 120 s); compute floor {floor:.1f} s "
          f"({positions[True]:,} positions with gradients, {positions[False]:,} without): "
          f"{total / floor:.1f}x the floor (target <= 1.5x)")  # fmt: skip
    faithful = float(result.faithfulness.faithfulness[0])
    print(f"  circuit: {int(result.circuit.sum())} edges, faithfulness {faithful:.3f}")


def gpt2_vs_transformer_lens(n_prompts: int, n_pos: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformer_lens.model_bridge import TransformerBridge
    from transformer_lens.tools.analysis import attribution_patching as tl_ap

    torch.manual_seed(0)
    config = transformers.GPT2Config(**GPT2_SHAPE)
    hf_model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    ours = interp.from_hf(hf_model).eval()
    vocab = config.vocab_size
    word_level = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=word_level, unk_token="t0", pad_token="t0"
    )
    bridge = TransformerBridge.boot_transformers("gpt2", hf_model=hf_model, tokenizer=tokenizer).eval()
    generator = torch.Generator().manual_seed(1)
    clean = torch.randint(vocab, (n_prompts, n_pos), generator=generator)
    corrupted = clean.clone()
    corrupted[:, 2] = torch.randint(vocab, (n_prompts,), generator=generator)
    graph = edges.edge_graph(ours)
    print(f"\nGPT-2 config {GPT2_SHAPE}: {graph.n_edges:,} edges, {n_prompts} prompts of {n_pos} tokens")

    metric = lambda logits, ids: logits[:, -1, 5] - logits[:, -1, 7]  # noqa: E731
    mine, mine_s, mine_peak = timed(lambda: edges.edge_attribution(ours, corrupted, clean, metric, "eap"))
    tl_config = tl_ap.EdgeAttributionConfig(granularity="edge")
    tl_metric = lambda logits: logits[0, -1, 5] - logits[0, -1, 7]  # noqa: E731
    tl, tl_s, tl_peak = timed(lambda: tl_ap.attribution_patch(bridge, clean, corrupted, tl_metric, tl_config))

    names = {"embed": "input", "attn_head_out": "a{layer}.h{head}", "mlp_out": "m{layer}",
             "mlp_in": "m{layer}", "logits": "logits",
             **{f"{x}_input": f"a{{layer}}.h{{head}}<{x}>" for x in "qkv"}}  # fmt: skip
    expected = torch.zeros_like(mine.scores)
    for (w, r), score in tl.edge_scores.items():
        writer = graph.writers.index(names[w.kind].format(layer=w.layer, head=w.head))
        expected[writer, graph.readers.index(names[r.kind].format(layer=r.layer, head=r.head))] += score
    error = float((expected - mine.scores).abs().max())
    print(f"  max |interp - TransformerLens| = {error:.2e} (scores up to {float(expected.abs().max()):.3f})")
    if not error < 1e-4:
        raise SystemExit("FAIL: the edge scores differ by more than 1e-4; no timing reported")
    print(f"  interp EAP:           {mine_s:7.2f} s, peak extra RSS {mine_peak / 2**20:7.1f} MiB")
    print(f"  TransformerLens EAP:  {tl_s:7.2f} s, peak extra RSS {tl_peak / 2**20:7.1f} MiB")
    print(f"  interp is {tl_s / mine_s:.1f}x faster (target >= 5x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-prompts", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=None, help="default: picked by a 3 GiB budget")
    parser.add_argument("--gpt2-prompts", type=int, default=8)
    parser.add_argument("--gpt2-pos", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-tl", action="store_true", help="skip the TransformerLens comparison")
    parser.add_argument("--no-smollm2", action="store_true", help="skip the SmolLM2 EAP-IG timing")
    parser.add_argument(
        "--circuit",
        action="store_true",
        help="also time an EAP-IG circuit of 300 edges with the faithfulness curve, on the discovery prompts",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    if not args.no_smollm2:
        smollm2_eap_ig(args.n_prompts, args.batch_size)
    if args.circuit:
        smollm2_circuit(args.n_prompts)
    if not args.no_tl:
        gpt2_vs_transformer_lens(args.gpt2_prompts, args.gpt2_pos)
    print(f"\ntotal {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    keep_freed_memory()  # the allocator policy the interp command runs with
    main()
