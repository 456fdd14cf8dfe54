"""GGUF files of architectures interp has no tensor list of (`sources.GGUF_TENSORS`): read through
transformers' GGUF reader, checked and cached as the others, or refused before any tensor is read.

The files are written here with the `gguf` package from random-weight transformers models, under
transformers' own GGUF tensor names (`get_gguf_hf_weights_map`), in float32: what transformers reads
back is the model they came from, exactly.
"""

from __future__ import annotations

import json
import shutil

import gguf
import pytest
import torch
import transformers
from transformers.convert_slow_tokenizer import bytes_to_unicode
from transformers.modeling_gguf_pytorch_utils import TensorProcessor, get_gguf_hf_weights_map

import interp
from interp.io.sources import WeightsMissingError

N_LAYERS = 6  # transformers reads Gemma 3's layer pattern from its default: five local layers, then a global


def gemma3_model() -> transformers.Gemma3ForCausalLM:
    """A random Gemma 3 (text) with the settings a GGUF does not store at their transformers defaults
    (query_pre_attn_scalar, the local layers' RoPE base, the layer pattern), tied embeddings as Gemma's,
    and norms away from zero."""
    config = transformers.Gemma3TextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=N_LAYERS,
        num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=4,
        max_position_embeddings=64, bos_token_id=2, eos_token_id=1, pad_token_id=0,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(0, 0.1)
    return model


def sized_writer(path, architecture: str, config: transformers.PretrainedConfig) -> gguf.GGUFWriter:
    """A GGUF writer of `architecture` with the model's sizes: blocks, context, widths, heads."""
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    return writer


def write_gemma3_gguf(path, model: transformers.Gemma3ForCausalLM, leave_out: set[str] = frozenset()) -> None:
    """`model` as a float32 GGUF of architecture gemma3 with a small llama-type vocabulary, as llama.cpp
    writes it (norm weights stored as 1 + w, no output.weight for tied embeddings), without the tensors
    named in `leave_out`."""
    config = model.config
    writer = sized_writer(path, "gemma3", config)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["full_attention"]["rope_theta"])
    writer.add_sliding_window(config.sliding_window)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(
        ["<pad>", "<eos>", "<bos>", "<unk>", *(f"▁w{i}" for i in range(config.vocab_size - 4))]
    )
    writer.add_token_scores([0.0] * config.vocab_size)
    writer.add_token_types([3, 3, 3, 2] + [1] * (config.vocab_size - 4))  # control, unknown, normal
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    state = model.state_dict()
    for name, hf_name in sorted(get_gguf_hf_weights_map(model, TensorProcessor()).items()):
        if name in leave_out or name == "output.weight":  # tied: the embedding is the unembedding
            continue
        weight = state[hf_name].numpy()
        writer.add_tensor(name, weight + 1 if "norm" in name else weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_gemma3_gguf_loads_through_transformers_and_equals_its_model(tmp_path, cache):
    """Gemma 3 has no tensor list in interp: transformers dequantises it, interp maps its model, and the
    logits are the source model's past the local window (4 tokens); the second load reads the cache."""
    hf = gemma3_model()
    path = tmp_path / "gemma3-tiny.gguf"
    write_gemma3_gguf(path, hf)
    model = interp.load_model(path)
    assert model.cfg.architecture == "gemma3_text" and model.cfg.attn_types.count("global") == 1
    assert model.tokenizer is not None and model.cfg.default_prepend_bos  # the GGUF's tokenizer adds <bos>
    assert interp.parameter_count(model) == sum(p.numel() for p in model.parameters()) - model.W_U.numel()
    tokens = torch.randint(4, 64, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(tokens).logits, atol=1e-4, rtol=0)
        [entry] = [p for p in cache.iterdir() if p.is_dir()]
        again = interp.load_model(path)
        torch.testing.assert_close(again(tokens), model(tokens), atol=0, rtol=0)
    assert [p for p in cache.iterdir() if p.is_dir()] == [entry]
    assert again.cfg.tied_embeddings


def test_a_gguf_cached_by_other_conversion_code_is_converted_again(tmp_path, cache, monkeypatch):
    """A cache entry is named by the conversion code and versions (`conversion_key`): one that another
    version wrote (there, without tied_embeddings, as an older Config did) is not read; the GGUF is
    converted again, beside it."""
    from interp.io import sources

    path = tmp_path / "gemma3-tiny.gguf"
    write_gemma3_gguf(path, gemma3_model())
    interp.load_model(path)
    [entry] = [p for p in cache.iterdir() if p.is_dir()]
    assert entry.name.endswith(f"-{sources.conversion_key()}")
    meta = json.loads((entry / "config.json").read_text())
    del meta["config"]["tied_embeddings"]
    (entry / "config.json").write_text(json.dumps(meta))
    assert not interp.load_model(path).cfg.tied_embeddings  # the entry is read as it stands
    monkeypatch.setattr(sources, "conversion_key", lambda: "0ther0ne")
    assert interp.load_model(path).cfg.tied_embeddings
    assert sorted(p.name[-8:] for p in cache.iterdir() if p.is_dir()) == sorted([entry.name[-8:], "0ther0ne"])


def test_a_cache_entry_another_process_lands_first_is_kept(tmp_path, cache, monkeypatch):
    """Two first loads of one GGUF convert it at once; the first to land its cache entry keeps it, so a
    third process reading that entry is not left with files renamed away under it. A damaged entry
    (no config.json) is converted again."""
    from interp.io import sources
    from interp.io.checkpoint import write_checkpoint

    path = tmp_path / "gemma3-tiny.gguf"
    write_gemma3_gguf(path, gemma3_model())
    reference = interp.load_model(path)
    [entry] = [p for p in cache.iterdir() if p.is_dir()]
    shutil.rmtree(entry)
    convert = sources.read_hf_model
    landed_first = []

    def another_process_lands_first(hf_model, tokenizer=None):
        loaded = convert(hf_model, tokenizer)
        write_checkpoint(loaded, entry)  # the other process's conversion, landed as this one ends
        landed_first.append((entry / "model.safetensors").stat().st_ino)
        return loaded

    monkeypatch.setattr(sources, "read_hf_model", another_process_lands_first)
    tokens = torch.randint(4, 64, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(interp.load_model(path)(tokens), reference(tokens), atol=0, rtol=0)
    assert [(entry / "model.safetensors").stat().st_ino] == landed_first
    assert [p for p in cache.iterdir() if p.is_dir()] == [entry]
    monkeypatch.setattr(sources, "read_hf_model", convert)
    (entry / "config.json").unlink()
    with torch.no_grad():
        torch.testing.assert_close(interp.load_model(path)(tokens), reference(tokens), atol=0, rtol=0)
    assert (entry / "config.json").is_file()


@pytest.mark.parametrize("damage", ["no tokenizer", "config a list"])
def test_a_cache_entry_damaged_but_readable_is_converted_again(tmp_path, cache, damage):
    """An entry that lost its tokenizer/ (every conversion writes the GGUF's) or whose config.json holds
    JSON of another shape is damaged: converted again, not loaded without a tokenizer or a traceback."""
    path = tmp_path / "gemma3-tiny.gguf"
    write_gemma3_gguf(path, gemma3_model())
    reference = interp.load_model(path)
    [entry] = [p for p in cache.iterdir() if p.is_dir()]
    if damage == "no tokenizer":
        shutil.rmtree(entry / "tokenizer")
    else:
        (entry / "config.json").write_text("[]")
    again = interp.load_model(path)
    assert again.tokenizer is not None and (entry / "tokenizer").is_dir()
    tokens = torch.randint(4, 64, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(again(tokens), reference(tokens), atol=0, rtol=0)


def test_a_cache_directory_that_cannot_be_made_is_named_with_interp_cache(tmp_path, monkeypatch):
    path = tmp_path / "gemma3-tiny.gguf"
    write_gemma3_gguf(path, gemma3_model())
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path / "a-file" / "cache"))
    with pytest.raises(ValueError, match=r"cache directory .*a-file/cache \(\$INTERP_CACHE, else"):
        interp.load_model(path)


def test_a_gguf_of_non_finite_weights_is_refused_naming_the_file(tmp_path, cache):
    model = gemma3_model()
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[0, 0] = torch.nan
    path = tmp_path / "gemma3-nan.gguf"
    write_gemma3_gguf(path, model)
    with pytest.raises(ValueError, match=f"the weights of {path}"):
        interp.load_model(path)


def test_a_gemma3_gguf_lacking_a_tensor_of_one_block_is_refused_before_transformers_reads_it(tmp_path, cache):
    path = tmp_path / "broken.gguf"
    write_gemma3_gguf(path, gemma3_model(), {"blk.3.post_ffw_norm.weight", "output_norm.weight"})
    with pytest.raises(
        WeightsMissingError,
        match=r"broken.gguf lacks 2 tensors \(blk.3.post_ffw_norm.weight, output_norm.weight\), which a "
        r"gemma3 GGUF holds",
    ):
        interp.load_model(path)
    assert not cache.exists() or not any(p.is_dir() for p in cache.iterdir())


def test_a_gemma3_gguf_lacking_a_tensor_of_every_block_is_refused(tmp_path, cache):
    """The blocks agree, so the header cannot tell; transformers' model finds the weights it lacks."""
    path = tmp_path / "broken.gguf"
    write_gemma3_gguf(path, gemma3_model(), {f"blk.{i}.attn_q_norm.weight" for i in range(N_LAYERS)})
    with pytest.raises(WeightsMissingError, match=rf"broken.gguf lacks {N_LAYERS} of the model's weights"):
        interp.load_model(path)


def write_header_only_gguf(path, architecture: str) -> None:
    """A GGUF of `architecture` whose tensor data is cut off: only the start of its header is readable."""
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", torch.zeros(64, 16).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    path.write_bytes(path.read_bytes()[:200])


@pytest.mark.parametrize(
    ("architecture", "says"),
    [
        ("mamba", r"which transformers reads \(as model type 'mamba': AutoModelForCausalLM.from_pretrained"),
        ("rwkv6", r"which neither interp nor transformers reads; llama.cpp runs it"),
    ],
)
def test_a_gguf_interp_cannot_read_is_refused_from_the_start_of_its_header(tmp_path, architecture, says):
    """The refusal names what reads the file and what interp reads, from the architecture alone: the
    file's tensors (cut off here) are never read."""
    path = tmp_path / f"{architecture}.gguf"
    write_header_only_gguf(path, architecture)
    with pytest.raises(
        ValueError, match=rf"{architecture}.gguf is a GGUF of architecture '{architecture}', {says}"
    ):
        interp.load_model(path)
    with pytest.raises(ValueError, match=r"interp reads GGUF files of .*gemma3.*llama"):
        interp.load_model(path)


def _permuted(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """A query or key projection with each head's rotary halves interleaved, as llama.cpp stores Llama's."""
    halves = weight.reshape(n_heads, 2, weight.shape[0] // n_heads // 2, *weight.shape[1:])
    return halves.swapaxes(1, 2).reshape(weight.shape)


def write_llama_gguf(path, model: transformers.LlamaForCausalLM, scores: bool = True) -> None:
    """`model` as a float32 llama GGUF as llama.cpp's converter writes it: queries and keys permuted, a
    byte-level vocabulary (with its scores, unless not `scores`), Llama 3's RoPE scaling as per-frequency
    factors (`rope_freqs.weight`) and linear scaling as `llama.rope.scaling.*`."""
    config, state, rope = model.config, model.state_dict(), model.config.rope_parameters
    writer = sized_writer(path, "llama", config)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    if rope["rope_type"] == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([*bytes_to_unicode().values(), "<s>", "</s>"])
    writer.add_token_types([1] * 256 + [3, 3])
    if scores:  # transformers' reader wants merges or scores
        writer.add_token_scores([0.0] * config.vocab_size)
    writer.add_bos_token_id(256)
    writer.add_eos_token_id(257)
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"].numpy())
    writer.add_tensor("output_norm.weight", state["model.norm.weight"].numpy())
    writer.add_tensor("output.weight", state["lm_head.weight"].numpy())
    if rope["rope_type"] == "llama3":  # each frequency's divisor, as convert_hf_to_gguf.py computes it
        plain = 1 / rope["rope_theta"] ** (torch.arange(0, config.head_dim, 2) / config.head_dim)
        scaled = model.model.rotary_emb.inv_freq
        writer.add_tensor("rope_freqs.weight", (plain / scaled).float().numpy())
    parts = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
             "ffn_norm": "post_attention_layernorm"}  # fmt: skip
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    for layer in range(config.num_hidden_layers):
        for name, hf_name in parts.items():
            weight = state[f"model.layers.{layer}.{hf_name}.weight"]
            weight = _permuted(weight, heads[name]) if name in heads else weight
            writer.add_tensor(f"blk.{layer}.{name}.weight", weight.contiguous().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def llama_model(rope: dict) -> transformers.LlamaForCausalLM:
    config = transformers.LlamaConfig(
        vocab_size=258, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=128, tie_word_embeddings=False,
        rope_parameters=rope, bos_token_id=256, eos_token_id=257,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # larger queries and keys: a wrong rotation shows in the logits
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8)
            layer.self_attn.k_proj.weight.mul_(8)
    return model


def test_a_llama_gguf_with_llama3_rope_factors_computes_its_scaled_rope(tmp_path, cache):
    """llama.cpp writes Llama 3's RoPE scaling as per-frequency factors (rope_freqs.weight), which
    transformers' GGUF reader leaves out: interp divides the frequencies by them and equals the source
    model; a GGUF stating linear scaling in its header (which the reader leaves out too) is refused."""
    rope = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                high_freq_factor=4.0, original_max_position_embeddings=16)  # fmt: skip
    source = llama_model(rope)
    write_llama_gguf(tmp_path / "llama3.gguf", source)
    model = interp.load_model(tmp_path / "llama3.gguf")
    tokens = torch.randint(0, 256, (2, 60), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), source(tokens).logits, atol=1e-4, rtol=0)
    write_llama_gguf(
        tmp_path / "linear.gguf", llama_model(dict(rope_type="linear", rope_theta=1e4, factor=4.0))
    )
    with pytest.raises(ValueError, match=r"states RoPE scaling 'linear' \(llama.rope.scaling.type\)"):
        interp.load_model(tmp_path / "linear.gguf")
    write_llama_gguf(tmp_path / "no-scores.gguf", source, scores=False)
    with pytest.raises(ValueError, match="cannot build the tokenizer of .* lacks the field 'scores'"):
        interp.load_model(tmp_path / "no-scores.gguf")
