# ruff: noqa: F811 (the fixtures imported from test_cpu_q4 are test arguments)
"""Phi-3/4 (fused q/k/v and gate/up, partial rotary, LongRoPE) runs as transformers defines it,
from a model folder and from the GGUF llama.cpp's converter writes of it.

The tiny models (tests/engine/tiny_models.py) are laid out as Phi-4-mini: 12 of each head's 16
dimensions rotate. "phi3-longrope" takes short factors within its original 256 tokens and long
ones beyond; Pagoda chooses them per position (pagoda/engine/layers/rotary.py), transformers per
sequence, so the two agree on every sequence that stays within 256 tokens.
"""

import pytest
import torch
import transformers
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

from pagoda.engine import LLM
from pagoda.engine.errors import ModelLoadError
from pagoda.engine.layers.rotary import RotaryTables, rope_spec
from pagoda.engine.loading.gguf import GGUFModelFile
from pagoda.engine.models.phi3 import architecture, config_from_gguf
from tests.engine.family_parity import (
    LLAMA_CPP_QUANTIZED_NEAR_TIE,
    FakeGGUFSettings,
    assert_gguf_tokenizer_is_the_folders,
    assert_same_argmax,
    engine_logits,
    greedy_disagreements_with_llama_cpp,
    hf_logits,
    round_matrices_to_fp16,
)
from tests.engine.hf_reference import load_hf_model
from tests.engine.llama_cpp_converter import quantize_with_llama_cpp
from tests.engine.llama_cpp_references import llama_cpp_records
from tests.engine.models.test_native_decode import PROMPTS, _decoding, _engine
from tests.engine.models.test_native_decode_layers import _assert_fused_steps_are_eager
from tests.engine.models.test_parity import (
    CHATS,
    LONG_TEXT,
    NUM_THREADS,
    assert_greedy_parity,
    parity_prompts,
    save_tiny_variant,
)
from tests.engine.quantization.test_cpu_q4 import q4, q4_chosen  # noqa: F401 (fixtures)
from tests.engine.test_triton_engine import greedy as triton_greedy

pytestmark = pytest.mark.usefixtures("fresh_gguf_metadata_cache")

VARIANTS = ("phi3", "phi3-longrope")
ORIGINAL_CONTEXT = 256  # phi3-longrope's original_max_position_embeddings


@pytest.fixture(scope="module")
def prompts(llama_cpp_ggufs) -> list[list[int]]:
    folder, _ = llama_cpp_ggufs["phi3"]
    return parity_prompts(transformers.AutoTokenizer.from_pretrained(folder))


@pytest.fixture(scope="module")
def hf_models(llama_cpp_ggufs) -> dict:
    return {v: load_hf_model(llama_cpp_ggufs[v][0]) for v in VARIANTS}


@pytest.mark.parametrize("variant", VARIANTS)
def test_phi3_folder_predicts_transformers_next_token_at_every_position(
        variant, llama_cpp_ggufs, hf_models, prompts):
    folder, _ = llama_cpp_ggufs[variant]
    assert max(map(len, prompts)) < ORIGINAL_CONTEXT
    for i, (ours, theirs) in enumerate(zip(engine_logits(folder, prompts),
                                           hf_logits(hf_models[variant], prompts), strict=True)):
        assert_same_argmax(ours, theirs, f"{variant} prompt {i}")
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_phi3_sliding_window_windows_every_layer_as_transformers_does(tmp_path_factory, prompts):
    """24 keys: the chat prompts (~45 tokens) run past it at every layer, in 16-token chunks."""
    folder = save_tiny_variant(tmp_path_factory, None, "phi3-window24")
    chats = prompts[:len(CHATS)]
    assert min(map(len, chats)) > 24
    for i, (ours, theirs) in enumerate(zip(engine_logits(folder, chats),
                                           hf_logits(load_hf_model(folder), chats), strict=True)):
        assert_same_argmax(ours, theirs, f"prompt {i}")
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("variant", VARIANTS)
def test_phi3_greedy_through_the_scheduler_matches_transformers(
        variant, llama_cpp_ggufs, hf_models, prompts):
    folder, _ = llama_cpp_ggufs[variant]
    llm = LLM(str(folder), num_kv_blocks=128, num_threads=NUM_THREADS, max_num_batched_tokens=16)
    assert_greedy_parity(llm, hf_models[variant], prompts)


@pytest.mark.parametrize("variant", VARIANTS)
def test_phi3_gguf_gives_the_folders_logits_to_fp16_rounding(variant, llama_cpp_ggufs, prompts):
    folder, gguf_file = llama_cpp_ggufs[variant]
    reference = round_matrices_to_fp16(load_hf_model(folder))
    for ours, theirs in zip(engine_logits(gguf_file, prompts), hf_logits(reference, prompts),
                            strict=True):
        # The file keeps longrope's factors as float32 (1.1 is 1.10000002): a few 1e-5 apart.
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("variant", VARIANTS)
def test_phi3_gguf_config_states_what_the_folders_does(variant, llama_cpp_ggufs):
    folder, gguf_file = llama_cpp_ggufs[variant]
    want = transformers.AutoConfig.from_pretrained(folder)
    got = config_from_gguf(GGUFModelFile(gguf_file))

    for field in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "max_position_embeddings", "vocab_size", "sliding_window",
                  "original_max_position_embeddings", "tie_word_embeddings", "eos_token_id"):
        assert getattr(got, field) == getattr(want, field), field
    theirs, ours = want.rope_parameters, got.rope_parameters
    for key in ("rope_type", "rope_theta", "partial_rotary_factor"):
        assert ours[key] == theirs[key], key
    if theirs["rope_type"] == "longrope":
        for key in ("short_factor", "long_factor"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-6), key
        # What transformers computes from the lengths, sqrt(1 + ln(4096 / 256) / ln(256)), the
        # file states.
        assert ours["attention_factor"] == pytest.approx((1 + 4 / 8) ** 0.5)


def test_phi3_gguf_chat_template_and_tokens_are_the_files(llama_cpp_ggufs, tmp_path):
    folder, gguf_file = llama_cpp_ggufs["phi3"]
    assert_gguf_tokenizer_is_the_folders(gguf_file, folder, tmp_path)


@pytest.mark.parametrize(("variant", "n_ctx"), [("phi3", 512), ("phi3-longrope", 256)])
def test_phi3_gguf_greedy_tokens_equal_llama_cpps(variant, n_ctx, llama_cpp_ggufs):
    """phi3-longrope against llama.cpp at a 256-token context, where it takes the short factors
    as we do below position 256 (at -c 512 it takes the long ones at every position)."""
    record, = llama_cpp_records("tiny_families.json", family=variant, type="f16", n_ctx=n_ctx)
    assert not greedy_disagreements_with_llama_cpp(llama_cpp_ggufs[variant][1], record)


@pytest.mark.parametrize(("variant", "n_ctx"), [("phi3", 512), ("phi3-longrope", 256)])
def test_phi3_q4_k_m_greedy_tokens_equal_llama_cpps(
        variant, n_ctx, llama_cpp_ggufs, tmp_path):
    """llama-quantize's Q4_K_M (with rows 64 wide: Q5_0 layers, a Q8_0 embedding), which we
    read exactly; llama.cpp also rounds activations to 8 bits, so ties are wider."""
    q4 = quantize_with_llama_cpp(llama_cpp_ggufs[variant][1],
                                 tmp_path / f"tiny-{variant}.Q4_K_M.gguf")
    record, = llama_cpp_records("tiny_families.json", family=variant, type="Q4_K_M", n_ctx=n_ctx)
    assert not greedy_disagreements_with_llama_cpp(q4, record, LLAMA_CPP_QUANTIZED_NEAR_TIE)


@pytest.mark.parametrize("variant", VARIANTS)
def test_phi3_decode_steps_run_in_one_c_call_with_the_eager_logits(
        variant, q4, q4_chosen, llama_cpp_ggufs):
    """Quantized to int4, every linear has a C kernel: the one-call step runs the fused q/k/v,
    the 12 rotated dimensions of 16 and the longrope table's rows."""
    engine = _engine(llama_cpp_ggufs[variant][0], quantization="int4")
    _decoding(engine, PROMPTS, steps=2)
    _assert_fused_steps_are_eager(engine, steps=3)


@pytest.mark.slow  # Triton's interpreter runs its kernels on the CPU: ~10 s on a quiet machine
def test_phi3_on_the_triton_kernels_gives_the_torch_paths_greedy_tokens(llama_cpp_ggufs):
    """The Triton rotary kernel on the 12 rotated dimensions of each 16, with longrope's table
    (SmolLM3's NoPE layers skip the rotary call on every backend alike)."""
    folder, _ = llama_cpp_ggufs["phi3-longrope"]
    assert triton_greedy(folder, "triton") == triton_greedy(folder, "torch")


def test_longrope_table_is_transformers_short_one_below_the_original_context_and_long_above(
        llama_cpp_ggufs):
    config = transformers.AutoConfig.from_pretrained(llama_cpp_ggufs["phi3-longrope"][0])
    positions = 2 * ORIGINAL_CONTEXT
    ours = RotaryTables(config, rope_spec(config, 16), positions, torch.float32,
                        torch.device("cpu"))
    hf = Phi3RotaryEmbedding(config)
    x = torch.zeros(1)
    short_cos, _ = hf(x, torch.arange(ORIGINAL_CONTEXT)[None])  # a sequence within 256 tokens
    long_cos, _ = hf(x, torch.arange(positions)[None])  # one past it: long factors throughout

    assert torch.equal(ours.cos[:ORIGINAL_CONTEXT], short_cos[0])
    assert torch.equal(ours.cos[ORIGINAL_CONTEXT:], long_cos[0, ORIGINAL_CONTEXT:])
    assert not torch.allclose(short_cos[0], long_cos[0, :ORIGINAL_CONTEXT])


def test_longrope_positions_keep_their_logits_when_the_sequence_outgrows_the_original_context(
        llama_cpp_ggufs, hf_models):
    """Ours per position: a token's logits do not change when later tokens cross 256 (so cached
    keys stay valid); they are transformers' on the text cut to 256 tokens. Transformers instead
    rotates the whole longer sequence by the long factors."""
    folder, _ = llama_cpp_ggufs["phi3-longrope"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tokenizer.encode(LONG_TEXT)
    assert len(ids) > ORIGINAL_CONTEXT
    ours, = engine_logits(folder, [ids])
    within, whole = hf_logits(hf_models["phi3-longrope"], [ids[:ORIGINAL_CONTEXT], ids])

    torch.testing.assert_close(ours[:ORIGINAL_CONTEXT], within, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(whole[:ORIGINAL_CONTEXT], within, atol=1e-2)


_PHI3_KEYS = {"phi3.embedding_length": 64, "phi3.attention.head_count": 4,
              "phi3.attention.head_count_kv": 2, "phi3.block_count": 2,
              "phi3.feed_forward_length": 128, "phi3.context_length": 4096,
              "phi3.rope.dimension_count": 12, "phi3.rope.scaling.original_context_length": 256}


def test_a_phi3_file_with_one_of_the_two_longrope_factor_tensors_is_refused():
    settings = FakeGGUFSettings("phi3", _PHI3_KEYS, {"rope_factors_long.weight": [1.0] * 6})
    with pytest.raises(ModelLoadError, match="rope_factors_short and rope_factors_long"):
        config_from_gguf(settings)


def test_a_longrope_factor_tensor_of_the_wrong_length_is_refused(llama_cpp_ggufs):
    _, gguf_file = llama_cpp_ggufs["phi3-longrope"]
    with pytest.raises(ModelLoadError, match=r"rope_factors_long.weight .*needs 8 floats"):
        GGUFModelFile(gguf_file).small_vector("rope_factors_long.weight", 8)


def test_a_phi3_file_whose_heads_do_not_divide_its_width_is_refused():
    settings = FakeGGUFSettings("phi3", _PHI3_KEYS | {"phi3.attention.head_count": 5}, {})
    with pytest.raises(ModelLoadError, match="5 attention heads"):
        config_from_gguf(settings)


def test_a_phi3_file_sliding_window_windows_every_layer_as_transformers_does():
    """Phi-3-mini's files state its 2047-key window (llama.cpp ignores it); Phi-4's state 0."""
    def config(window: int):
        keys = _PHI3_KEYS | {"phi3.attention.sliding_window": window}
        return config_from_gguf(FakeGGUFSettings("phi3", keys, {}))

    windowed, unwindowed = config(2047), config(0)
    assert architecture(windowed).shape.layer_windows == (2047, 2047)
    assert architecture(unwindowed).shape.layer_windows == (0, 0)
