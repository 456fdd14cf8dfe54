"""TransformerLens 2.18's tests run on interp: the one list of what is skipped, each with its reason.

A key is a file under tests/conformance (the whole file), or a test in it with or without its
parameters ("integration/test_kv_cache.py::test_freeze_cache"). A listed file that imports
TransformerLens internals removed in TL 4 is reported as one skipped item. Reasons show in pytest's summary
(`-ra`). See README.md in this directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent

TL_COMPONENTS = (
    "compares TL's own Attention/GroupedQueryAttention components (transformer_lens.components, "
    "removed in TL 4); interp's grouped-query attention is tested against transformers"
)
GPT2_TOKENS = "asserts GPT-2's token ids, vocabulary or tokenizer name (SmolLM2's tokenizer here, no hub)"
HUB_LOSS = "asserts the loss of a hub model (GPT-2, SoLU, Pythia, othello-gpt) on its text"
HUB_DTYPES = "loads GPT-2, TinyStories and Pythia from the hub in each dtype"
TRAINED_NUMBERS = "asserts numbers of a trained hub model (solu-2l / GPT-2 small), not model-agnostic"

SKIPS: dict[str, str] = {
    # Files that cannot be imported: TL 4 removed the TL internals they test.
    "acceptance/test_tokenizer_special_tokens.py": (
        "imports transformer_lens.loading_from_pretrained (removed in TL 4) to build hub models' configs"
    ),
    **{
        f"integration/test_grouped_query_attention.py::{name}": TL_COMPONENTS
        for name in (
            "test_grouped_query_attention_output_is_correct",
            "test_ungroup_grouped_query_attention_flag_produces_same_result",
        )
    },
    "integration/test_only_tokenizer.py": (
        "imports transformer_lens.loading_from_pretrained (removed in TL 4) for hub models' configs"
    ),
    # Hub models or numbers of trained hub models.
    "acceptance/test_evals.py": "IOI accuracy of GPT-2 small and MMLU data from the hub",
    "acceptance/test_hooked_transformer.py::test_model": HUB_LOSS,
    "acceptance/test_hooked_transformer.py::test_othello_gpt": HUB_LOSS,
    "acceptance/test_hooked_transformer.py::test_from_pretrained_no_processing": HUB_LOSS,
    "acceptance/test_hooked_transformer.py::test_process_weights_inplace": HUB_LOSS,
    "acceptance/test_hooked_transformer.py::test_from_pretrained_revision": "loads GPT-2's revisions (hub)",
    "acceptance/test_hooked_transformer.py::test_bloom_similarity_with_hf_model_with_kv_cache_activated": (
        "loads BLOOM-560m from the hub"
    ),
    "acceptance/test_hooked_transformer.py::test_dtype_float": HUB_DTYPES,
    "acceptance/test_hooked_transformer.py::test_half_precision": HUB_DTYPES,
    "acceptance/test_hooked_transformer.py::test_all_tinystories_models_exist": "asks the hub for configs",
    "acceptance/test_hooked_transformer.py::test_all_pythia_models_exist": "asks the hub for configs",
    "integration/test_head_detector.py::Test_detect_head_successful": TRAINED_NUMBERS,
    "integration/test_head_detector.py::Test_specific_heads": TRAINED_NUMBERS,
    "integration/test_head_detector.py::test_detect_head_exclude_bos": TRAINED_NUMBERS,
    "integration/test_head_detector.py::test_detect_head_exclude_current_token": TRAINED_NUMBERS,
    "integration/test_head_detector.py::test_detect_head_exclude_bos_and_current_token": TRAINED_NUMBERS,
    "integration/test_head_detector.py::test_detect_head_with_cache": TRAINED_NUMBERS,
    "integration/test_head_detector.py::test_detect_head_with_invalid_head_name": (
        "asserts the wording of TL 2.18's head_detector error; TL 4.3's head_detector words it differently"
    ),
    "unit/test_svd_interpreter.py::test_svd_interpreter": TRAINED_NUMBERS,
    "unit/test_svd_interpreter.py::test_w_in_when_fold_ln_is_false": TRAINED_NUMBERS,
    "unit/test_svd_interpreter.py::test_svd_interpreter_fails_on_invalid_vector_type": (
        "expects the beartype error of TL 2.18's SVDInterpreter; TL 4.3's raises ValueError"
    ),
    # SmolLM2's tokenizer instead of GPT-2's.
    "integration/test_tokenization_methods.py::test_set_tokenizer_during_initialization": GPT2_TOKENS,
    "integration/test_tokenization_methods.py::test_set_tokenizer_lazy": GPT2_TOKENS,
    "integration/test_tokenization_methods.py::test_to_tokens_default": GPT2_TOKENS,
    "integration/test_tokenization_methods.py::test_to_tokens_without_bos": GPT2_TOKENS,
    "integration/test_tokenization_methods.py::test_to_tokens_truncate": GPT2_TOKENS,
    "integration/test_tokenization_methods.py::test_to_string_multiple": GPT2_TOKENS,
    "integration/test_tokenization_methods.py::test_to_str_tokens_default": GPT2_TOKENS,
    "integration/test_tokenization_methods.py::test_to_single_token": GPT2_TOKENS,
    "integration/test_tokenization_methods.py::test_to_single_str_tokent": GPT2_TOKENS,
    "integration/test_tokenization_methods.py::test_tokens_to_residual_directions": GPT2_TOKENS,
    "integration/test_utils_tokens.py::test_test_prompt": GPT2_TOKENS,
    "integration/test_d_vocab.py::test_d_vocab_from_tokenizer": GPT2_TOKENS,
    "integration/test_d_vocab.py::test_d_vocab_from_tokenizer_name": GPT2_TOKENS,
    # Deliberate differences (docs/migrating-from-transformer-lens.md).
    "integration/test_d_vocab.py::test_d_vocab_out_set_d_vocab_infer": GPT2_TOKENS,
    "integration/test_start_at_layer.py::test_start_at_layer_kwargs": (
        "asserts input_to_embed returns an attention mask for one unpadded prompt (TL: an all-ones mask "
        "when the tokenizer pads on the left); interp returns None, nothing to mask. Its shortformer "
        "start_at_layer run is tests/test_tl_architectures.py's"
    ),
    "acceptance/test_hooked_transformer.py::test_pos_embed_hook": (
        "expects a right-padded list of texts to be run without a mask, so its pad positions get position "
        "embeddings; interp masks them (zero position embeddings at pads, as TL does for left padding)"
    ),
    "integration/test_tokenization_methods.py::test_get_token_position_not_found": GPT2_TOKENS,
}


class _ImportSkippedItem(pytest.Item):
    """The one item of a listed file that cannot be imported under TransformerLens 4."""

    def runtest(self):
        pytest.skip(SKIPS[_relative(self.path)])

    def reportinfo(self):
        return self.path, 0, self.name


class _ListedModule(pytest.Module):
    """A file listed whole: its tests are collected and skipped; if it cannot be imported (TL 4
    removed what it imports), one skipped item stands for it."""

    def collect(self):
        try:
            return super().collect()
        except self.CollectError:
            return [_ImportSkippedItem.from_parent(self, name="(file)")]


def _relative(path: Path) -> str:
    return Path(path).relative_to(HERE).as_posix()


def pytest_pycollect_makemodule(module_path, parent):
    if _relative(module_path) in SKIPS:
        return _ListedModule.from_parent(parent, path=module_path)
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE not in Path(item.path).parents or item.get_closest_marker("skip"):
            continue
        relative = _relative(item.path)
        parts = item.nodeid.split("::")[1:]
        base = [part.split("[")[0] for part in parts]
        keys = [f"{relative}::{'::'.join(base[:n])}" for n in range(len(base), 0, -1)] + [relative]
        for key in [f"{relative}::{'::'.join(parts)}", *keys]:
            if key in SKIPS:
                item.add_marker(pytest.mark.skip(reason=SKIPS[key]))
                break
