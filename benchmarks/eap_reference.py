"""EAP and EAP-IG: interp against the EAP-IG reference implementation (hannamw/EAP-IG, the code MIB's
circuit track pins), scores checked edge by edge, then timed in the same process.

The reference is never vendored: pass the path of a checkout (its `src/eap` package is imported;
checked here against its commit 795f560, "Merge pull request #17", the newest one stored).
It runs on TransformerLens 2.x's `HookedTransformer`, while interp is built on TransformerLens 4.3, so
both versions are installed in one virtual environment, TL 2.x as usual and TL 4.3 in a separate
folder (`--tl4`), and this script gives each side its own `transformer_lens` modules (swapped in
`sys.modules` around every call; `TwoTransformerLens`). Building that environment:

    python3 -m venv /work/venv-eapref
    /work/venv-eapref/bin/pip install torch==2.13.0          # first: the CPU wheel on disk
    /work/venv-eapref/bin/pip install "transformer-lens<3" "transformers>=5.0" matplotlib gguf circuitsvis
    /work/venv-eapref/bin/pip install "pyarrow<20"  # TL 2.16.1 pins numpy<2; pyarrow 26 needs numpy 2
        # (pip warns that datasets 5.2 wants pyarrow>=24; TL 2.x imports it fine and nothing calls it)
    /work/venv-eapref/bin/pip install --no-deps --target /work/venv-eapref/tl4 transformer-lens==4.3.0
    /work/venv-eapref/bin/pip install --no-deps -e .           # interp (its other deps come with TL 2.x)

(`pip install --dry-run ...` first shows that torch stays 2.13.0.) Then, from the repository root:

    /work/venv-eapref/bin/python benchmarks/eap_reference.py --reference /path/to/EAP-IG \\
        [--size small|gpt2] [--n-prompts 8] [--n-pos 12] [--steps 5] [--repeats 3] [--threads 2] \\
        [--batch-size 8] [--no-activations] [--device cpu]

What it does. A random-weight `transformers` GPT-2 (`--size small`: 4 layers, 4 heads, d_model 128,
vocabulary 1,000; `gpt2`: GPT-2 small's sizes, 12 x 12 x 768, vocabulary 50,257) is loaded into
interp (`interp.from_hf`) and into TL 2.x's `HookedTransformer` (`HookedTransformerConfig` +
TL's own `convert_gpt2_weights`, loaded with all of TL's weight processing off, so both compute the
function the transformers model computes; the logits of the three are compared first). Prompt pairs
are synthetic: random tokens after BOS, the corrupted prompt differs at two positions; the metric is
logit(correct) - logit(incorrect) at the last position, with a random answer pair per prompt. The
reference reads prompts as strings, so a word-level tokenizer maps "t17" to token 17 (token 0 is BOS
and padding; the script checks that the reference's tokens are the ones interp gets).

Conventions aligned. The reference sums scores over positions and d_model ('sum' aggregation), adds
them over batches and divides by the number of prompts, so its metric must return the SUM over the
batch (MIB's `logit_diff(..., mean=True)` would divide once more, by the batch size); its sign is
interp's: (corrupted - clean) activations . gradient of the metric. Edges are matched by name
(MIB's "a0.h1->m2", "input->a1.h0<q>", "m3->logits"); both graphs must hold the same edges.

  EAP                 reference "EAP" vs interp "eap": checked equal (max |diff| <= 1e-4 x max |score|)
  EAP-IG (inputs)     reference "EAP-IG-inputs" vs interp "eap-ig", ig_points="mib" (alpha = k/steps,
                      k = 0..steps-1): checked equal the same way
  EAP-IG activations  reference "EAP-IG-activations" vs interp "eap-ig-activations" (the reference's
                      definition: each group interpolated in turn at alpha = k/steps, k = 1..steps,
                      every one of those n_groups x steps runs adding its gradients to EVERY edge):
                      checked equal the same way
  grouped             interp "eap-ig-activations-grouped" (a writer's edges take its own group's runs
                      only) against the reference's own hooks and interpolation
                      (`make_hooks_and_matrices`, `tokenize_plus`, the reference's metric call) rerun
                      keeping for each writer only its own group's runs: checked equal (not timed:
                      that is not the reference's method)

The reference allocates its score matrix with device="cuda"; on a machine without CUDA (`--device
cpu`) the script gives the reference module a `torch` whose `zeros` puts that matrix on the CPU
instead (nothing else of the reference is changed). `--device cuda` has not been run: no GPU was
lent to this work. Times: best of `--repeats` runs of each side,
same process, same thread count, after one warm-up run each (which is the one checked).

Printed on 2026-11-25 (`--size small`, 8 prompts, 5 steps, `--repeats 1`, 2 threads), with interp's
eap-ig-activations as the reference defines it, on the shared 2-core CPU machine while it was still
partly busy (load average 1 to 5): the equalities hold; the times are not figures for docs/results
(earlier runs under heavier load moved the ratios between 0.6x and 3x); re-time on an idle machine.

    GPT-2 config 'small': 4 layers x 4 heads, d_model 128, vocabulary 1000, random weights (init. std 0.1)
    8 prompt pairs of 13 tokens, batch 8, 2 threads, cpu
    logits: max |interp - transformers| 3.6e-06, max |TL 2.x - transformers| 3.3e-06 (logits up to 5.4)
    479 edges, the same names in both graphs

    reference EAP vs interp eap
      largest score, reference side -0.172 (m0->m2; interp -0.172)
      max |interp - reference| 2.31e-07 = 1.3e-06 x the largest score
      Spearman rank correlation 1.0000, of |score| 1.0000
      equal to 0.0001 relative: yes
      time, best of 1: reference 3.182 s, interp 3.061 s: interp 1.04x the reference's speed

    reference EAP-IG-inputs (5 steps) vs interp eap-ig ig_points=mib
      largest score, reference side +0.1596 (m0->m1; interp +0.1596)
      max |interp - reference| 3.09e-07 = 1.9e-06 x the largest score
      Spearman rank correlation 1.0000, of |score| 1.0000
      equal to 0.0001 relative: yes
      time, best of 1: reference 28.873 s, interp 9.249 s: interp 3.12x the reference's speed

    reference EAP-IG-activations (5 steps) vs interp eap-ig-activations ig_points=paper
      largest score, reference side -0.141 (m0->m2; interp -0.141)
      max |interp - reference| 2.31e-07 = 1.6e-06 x the largest score
      Spearman rank correlation 1.0000, of |score| 1.0000
      equal to 0.0001 relative: yes
      time, best of 1: reference 219.261 s, interp 72.684 s: interp 3.02x the reference's speed

    the reference's EAP-IG-activations hooks, each writer scored by its own group, k = 1..steps
      vs interp eap-ig-activations-grouped ig_points=paper
      largest score, reference side +0.1608 (m0->m1; interp +0.1608)
      max |interp - reference| 2.38e-07 = 1.5e-06 x the largest score
      Spearman rank correlation 1.0000, of |score| 1.0000
      equal to 0.0001 relative: yes

GPT-2 small's sizes (`--size gpt2 --n-prompts 2 --n-pos 8 --no-activations --repeats 1`, an earlier
run under load average ~9, 6 min; EAP-IG activations were not run at this size):

    GPT-2 config 'gpt2': 12 layers x 12 heads, d_model 768, vocabulary 50257, random weights (init. std 0.02)
    2 prompt pairs of 9 tokens, batch 8, 2 threads, cpu
    logits: max |interp - transformers| 2.3e-06, max |TL 2.x - transformers| 2.1e-06 (logits up to 2.5)
    32,491 edges, the same names in both graphs

    reference EAP vs interp eap
      largest score, reference side +0.1181 (m0->m1; interp +0.1181)
      max |interp - reference| 2.36e-07 = 2.0e-06 x the largest score
      Spearman rank correlation 1.0000, of |score| 1.0000
      equal to 0.0001 relative: yes
      time, best of 1: reference 27.704 s, interp 9.372 s: interp 2.96x the reference's speed

    reference EAP-IG-inputs (5 steps) vs interp eap-ig ig_points=mib
      largest score, reference side +0.138 (m0->m1; interp +0.138)
      max |interp - reference| 2.38e-07 = 1.7e-06 x the largest score
      Spearman rank correlation 1.0000, of |score| 1.0000
      equal to 0.0001 relative: yes
      time, best of 1: reference 96.155 s, interp 28.616 s: interp 3.36x the reference's speed
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import transformers

SIZES = {
    "small": dict(n_layer=4, n_head=4, n_embd=128, vocab_size=1000, n_positions=64, initializer_range=0.1),
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, n_positions=1024),
}
TOLERANCE = 1e-4  # max |interp - reference| over edges, relative to the largest |reference score|


class TwoTransformerLens:
    """TransformerLens 4.3 (interp's) and 2.x (the reference's) in one process.

    Each version keeps its own `transformer_lens*` entries of `sys.modules`; `use(name)` swaps that set
    in (and, for "tl4", its folder onto the front of `sys.path`, so imports made inside find it) and
    swaps it out again on exit. Modules that imported from TransformerLens keep the objects of the
    version they were imported under."""

    def __init__(self, tl4_dir: Path) -> None:
        self.paths = {"tl4": [str(tl4_dir)], "tl2": []}
        self.saved: dict[str, dict[str, types.ModuleType]] = {"tl4": {}, "tl2": {}}
        self.current: str | None = None
        if any(_is_tl(name) for name in sys.modules):
            raise RuntimeError("transformer_lens was imported before TwoTransformerLens")

    @contextlib.contextmanager
    def use(self, name: str) -> Iterator[None]:
        previous = self.current
        self._switch(name)
        try:
            yield
        finally:
            self._switch(previous)

    def _switch(self, name: str | None) -> None:
        if name == self.current:
            return
        if self.current is not None:
            self.saved[self.current] = {k: sys.modules.pop(k) for k in list(sys.modules) if _is_tl(k)}
            for path in self.paths[self.current]:
                sys.path.remove(path)
        if name is not None:
            sys.modules.update(self.saved[name])
            sys.path[:0] = self.paths[name]
        self.current = name


def _is_tl(module: str) -> bool:
    return module == "transformer_lens" or module.startswith("transformer_lens.")


def word_tokenizer(vocab: int) -> transformers.PreTrainedTokenizerFast:
    """ "t17" -> token 17; "t0" is BOS, EOS and padding (prompts never contain it)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    word_level = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    word_level.post_processor = processors.TemplateProcessing(single="t0 $A", special_tokens=[("t0", 0)])
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=word_level, bos_token="t0", eos_token="t0", pad_token="t0", unk_token="t0",
        add_bos_token=True, padding_side="right",
    )  # fmt: skip
    # TL 2.x reloads a tokenizer from the hub unless its init_kwargs say it adds BOS itself (it does).
    tokenizer.init_kwargs.update(name_or_path="word-level", add_bos_token=True)
    return tokenizer


def reference_model(hf_model, tokenizer, device: str):  # TL 2.x must be active
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    c = hf_model.config
    cfg = HookedTransformerConfig(
        n_layers=c.n_layer, d_model=c.n_embd, n_heads=c.n_head, d_head=c.n_embd // c.n_head,
        d_mlp=4 * c.n_embd, d_vocab=c.vocab_size, n_ctx=c.n_positions, act_fn="gelu_new",
        normalization_type="LN", eps=c.layer_norm_epsilon, positional_embedding_type="standard",
        original_architecture="GPT2LMHeadModel", default_prepend_bos=True, device=device,
        use_attn_result=True, use_split_qkv_input=True, use_hook_mlp_in=True,
    )  # fmt: skip
    model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
    state = {k: v.detach().clone() for k, v in convert_gpt2_weights(hf_model, cfg).items()}
    model.load_and_process_state_dict(
        state, fold_ln=False, center_writing_weights=False, center_unembed=False,
        fold_value_biases=False, refactor_factored_attn_matrices=False,
    )  # fmt: skip
    return model.to(device).eval()


def cpu_zeros_shim(module: types.ModuleType, device: str) -> None:
    """The reference allocates scores with torch.zeros(..., device='cuda'); put them on `device`."""

    class _Torch(types.SimpleNamespace):
        def __getattr__(self, name: str):
            return getattr(torch, name)

        @staticmethod
        def zeros(*args, **kwargs):
            if kwargs.get("device") == "cuda":
                kwargs["device"] = device
            return torch.zeros(*args, **kwargs)

    module.torch = _Torch()


def best_of(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ranks = lambda x: x.argsort().argsort().double()  # noqa: E731
    return float(torch.corrcoef(torch.stack([ranks(a), ranks(b)]))[0, 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", type=Path, required=True, help="a checkout of hannamw/EAP-IG")
    parser.add_argument("--tl4", type=Path, default=Path(sys.prefix) / "tl4", help="TransformerLens 4.3")
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--n-prompts", type=int, default=8)
    parser.add_argument("--n-pos", type=int, default=12, help="tokens per prompt after BOS")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-activations", action="store_true", help="skip EAP-IG-activations")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tl = TwoTransformerLens(args.tl4)

    with tl.use("tl4"):
        import interp
        from interp import edges
        from interp.interventions.metrics import logit_diff_metric
    with tl.use("tl2"):
        import transformer_lens

        sys.path.insert(0, str(args.reference / "src"))
        import eap.attribute
        from eap.attribute import attribute
        from eap.graph import Graph
        from eap.utils import make_hooks_and_matrices, tokenize_plus

        print(f"interp {Path(interp.__file__).parent} on transformer_lens {args.tl4}")
        print(f"reference {Path(eap.attribute.__file__).parent} on {Path(transformer_lens.__file__).parent}")
    if args.device != "cuda":
        cpu_zeros_shim(eap.attribute, args.device)

    # One random GPT-2, three copies: transformers, interp, TL 2.x.
    torch.manual_seed(0)
    config = transformers.GPT2Config(**SIZES[args.size], bos_token_id=0, eos_token_id=0)
    hf_model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    vocab = config.vocab_size
    tokenizer = word_tokenizer(vocab)
    with tl.use("tl4"):
        ours = interp.from_hf(hf_model).to(args.device).eval()
    with tl.use("tl2"):
        ref = reference_model(hf_model, tokenizer, args.device)

    # Prompt pairs: BOS + random tokens (never 0); the corrupted prompt differs at two positions.
    g = torch.Generator().manual_seed(1)
    n, p = args.n_prompts, args.n_pos
    clean = torch.randint(1, vocab, (n, p), generator=g)
    corrupted = clean.clone()
    for pos in (1, p // 2):
        corrupted[:, pos] = torch.randint(1, vocab, (n,), generator=g)
    answers = torch.randint(1, vocab, (n, 2), generator=g)
    strings = lambda ids: [" ".join(f"t{int(t)}" for t in row) for row in ids]  # noqa: E731
    rows = list(zip(strings(clean), strings(corrupted), answers, strict=True))
    collate = lambda batch: ([b[0] for b in batch], [b[1] for b in batch], torch.stack([b[2] for b in batch]))  # noqa: E731, E501
    loader = torch.utils.data.DataLoader(rows, batch_size=args.batch_size, collate_fn=collate)
    bos = torch.zeros(n, 1, dtype=torch.long)
    clean_ids, corrupted_ids = torch.cat([bos, clean], 1), torch.cat([bos, corrupted], 1)
    with tl.use("tl2"):
        ref_clean = tokenize_plus(ref, strings(clean))[0].cpu()
        ref_corrupted = tokenize_plus(ref, strings(corrupted))[0].cpu()
    assert torch.equal(ref_clean, clean_ids) and torch.equal(ref_corrupted, corrupted_ids), "tokenization"

    def ref_metric(logits, clean_logits, input_lengths, label):  # the SUM over the batch (docstring)
        end = logits[torch.arange(len(logits)), input_lengths - 1]
        label = label.to(end.device)
        return (end.gather(1, label[:, :1]) - end.gather(1, label[:, 1:])).sum()

    ours_metric = logit_diff_metric(answers[:, 0], answers[:, 1])
    with torch.no_grad():
        hf_logits = hf_model(clean_ids).logits
        with tl.use("tl4"):
            ours_logits = ours(clean_ids.to(args.device)).cpu()
        with tl.use("tl2"):
            ref_logits = ref(clean_ids.to(args.device)).cpu()
    print(
        f"\nGPT-2 config '{args.size}': {config.n_layer} layers x {config.n_head} heads, d_model "
        f"{config.n_embd}, vocabulary {vocab}, random weights (init. std {config.initializer_range})"
    )
    print(
        f"{n} prompt pairs of {p + 1} tokens, batch {args.batch_size}, {args.threads} threads, {args.device}"
    )
    print(
        f"logits: max |interp - transformers| {float((ours_logits - hf_logits).abs().max()):.1e}, "
        f"max |TL 2.x - transformers| {float((ref_logits - hf_logits).abs().max()):.1e} "
        f"(logits up to {float(hf_logits.abs().max()):.1f})"
    )

    graph = Graph.from_model(ref)
    ours_graph = edges.edge_graph(ours)
    index = {ours_graph.edge_name(w, r): (w, r) for w, r in ours_graph.edges()}
    assert set(index) == set(graph.edges), "the two graphs' edges differ"
    names = list(graph.edges)
    ref_at = tuple(torch.tensor(i) for i in zip(*(graph.edges[e].matrix_index for e in names), strict=True))
    ours_at = tuple(torch.tensor(i) for i in zip(*(index[e] for e in names), strict=True))
    print(f"{len(names):,} edges, the same names in both graphs")

    def run_ref(method: str) -> torch.Tensor:
        with tl.use("tl2"):
            attribute(ref, graph, loader, ref_metric, method, ig_steps=args.steps, quiet=True)
        return graph.scores[ref_at].clone()

    def run_ours(method: str, ig_points: str = "mib") -> torch.Tensor:
        with tl.use("tl4"):
            scores = edges.edge_attribution(
                ours, clean_ids.to(args.device), corrupted_ids.to(args.device), ours_metric, method,
                steps=args.steps, batch_size=args.batch_size, ig_points=ig_points,
            )  # fmt: skip
        return scores.scores[ours_at].clone()

    def run_ref_own_group(first: int) -> torch.Tensor:
        """The reference's EAP-IG-activations runs (its hooks, its interpolation), each writer scored by
        the runs that interpolate its own group only, at alpha = k / steps, k = first..first+steps-1."""
        with tl.use("tl2"):
            total = torch.zeros(graph.n_forward, graph.n_backward)
            groups = [graph.nodes["input"]]
            for layer in range(ref.cfg.n_layers):
                groups += [graph.nodes[f"a{layer}.h0"], graph.nodes[f"m{layer}"]]
            for clean_s, corrupted_s, label in loader:
                tokens, mask, lengths, n_pos = tokenize_plus(ref, clean_s)
                corrupted_tokens = tokenize_plus(ref, corrupted_s)[0]
                (add_corrupted, _, _), corrupted_acts = make_hooks_and_matrices(
                    ref, graph, len(label), n_pos, None
                )
                (add_clean, _, _), clean_acts = make_hooks_and_matrices(ref, graph, len(label), n_pos, None)
                with torch.no_grad(), ref.hooks(fwd_hooks=add_corrupted):
                    ref(corrupted_tokens, attention_mask=mask)
                with torch.no_grad(), ref.hooks(fwd_hooks=add_clean):
                    clean_logits = ref(tokens, attention_mask=mask)
                for node in groups:
                    scores = torch.zeros(graph.n_forward, graph.n_backward, device=args.device)
                    (_, _, grad_hooks), delta = make_hooks_and_matrices(ref, graph, len(label), n_pos, scores)
                    delta += corrupted_acts - clean_acts
                    at = graph.forward_index(node)
                    for k in range(first, first + args.steps):
                        mixed = corrupted_acts[:, :, at] + k / args.steps * (
                            clean_acts[:, :, at] - corrupted_acts[:, :, at]
                        )
                        hooks = [(node.out_hook, lambda acts, hook, mixed=mixed: mixed)]
                        with ref.hooks(fwd_hooks=hooks, bwd_hooks=grad_hooks):
                            ref_metric(
                                ref(tokens, attention_mask=mask), clean_logits, lengths, label
                            ).backward()
                    total[at] += scores[at].cpu()
            total /= len(rows) * args.steps
        return total[ref_at]

    cases = [("EAP", "eap", "mib"), ("EAP-IG-inputs", "eap-ig", "mib")]
    if not args.no_activations:
        cases += [("EAP-IG-activations", "eap-ig-activations", "paper")]
        cases += [("own group, k = 1..steps", "eap-ig-activations-grouped", "paper")]
    failed = []
    for ref_method, method, ig_points in cases:
        label = f"{method}" + (f" ig_points={ig_points}" if method != "eap" else "")
        steps = "" if method == "eap" else f" ({args.steps} steps)"
        own_group = ref_method.startswith("own group")
        if own_group:
            print(f"\nthe reference's EAP-IG-activations hooks, each writer scored by its {ref_method}")
            print(f"  vs interp {label}")
            expected = run_ref_own_group(first=1)  # the reference integrates activations at k = 1..steps
        else:
            print(f"\nreference {ref_method}{steps} vs interp {label}")
            expected = run_ref(ref_method)
        mine = run_ours(method, ig_points)
        diff = float((expected - mine).abs().max())
        scale = float(expected.abs().max())
        top = int(expected.abs().argmax())
        largest, theirs = float(expected[top]), float(mine[top])
        print(f"  largest score, reference side {largest:+.4g} ({names[top]}; interp {theirs:+.4g})")
        print(f"  max |interp - reference| {diff:.2e} = {diff / scale:.1e} x the largest score")
        rho, rho_abs = spearman(expected, mine), spearman(expected.abs(), mine.abs())
        print(f"  Spearman rank correlation {rho:.4f}, of |score| {rho_abs:.4f}")
        ok = diff <= TOLERANCE * scale
        print(f"  equal to {TOLERANCE:g} relative: {'yes' if ok else 'NO'}")
        if not ok:
            failed.append(ref_method)
            continue
        if own_group:
            continue  # not the reference's method: nothing to time
        t_ref = best_of(lambda m=ref_method: run_ref(m), args.repeats)
        t_ours = best_of(lambda m=method, q=ig_points: run_ours(m, q), args.repeats)
        print(
            f"  time, best of {args.repeats}: reference {t_ref:.3f} s, interp {t_ours:.3f} s: "
            f"interp {t_ref / t_ours:.2f}x the reference's speed"
        )
    if failed:
        raise SystemExit(f"not equal: {', '.join(failed)}")


if __name__ == "__main__":
    main()
