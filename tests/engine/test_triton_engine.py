"""The engine forced onto the Triton kernels gives the torch path's greedy tokens.

Without a GPU the kernels run on CPU tensors under Triton's interpreter, so the model is tiny;
the prompts still cover chunked prefill (chunks starting mid-block), prefix cache hits and
batched decodes of ragged lengths.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before pagoda.kernels.triton_* are imported

import pytest
from gguf import GGMLQuantizationType as QType
from tiny_gguf import write_tiny_gguf
from tiny_models import save_tiny_model

from pagoda.engine import LLM, SamplingParams
from pagoda.engine.spec_decode.ngram_proposer import NgramProposer

SHARED_PREFIX = list(range(100, 140))


# Qwen2 is Llama with biases on q, k and v, and Qwen3 Llama with norms on queries and keys: the
# two cover what Llama's layers run (each interpreted family is ~15 s of the suite); a tied
# vocabulary runs in the window test below (the default model's).
@pytest.fixture(scope="module", params=["qwen2", "qwen3"])
def tiny_model_dir(request, tmp_path_factory, default_model):
    return save_tiny_model(tmp_path_factory.mktemp(request.param), request.param,
                           default_model.path)


def prompts() -> list[list[int]]:
    """Ragged lengths; two share a 40-token prefix, so the second reads it from the cache."""
    return [SHARED_PREFIX + [7, 8, 9], list(range(300, 305)), SHARED_PREFIX + [11],
            list(range(500, 533))]


def greedy(model_dir, backend: str, num_speculative_tokens: int = 0) -> list[list[int]]:
    # A 24-token budget splits the longer prompts into chunks that start mid-block.
    # Every draft found is verified, in batched steps too, whatever it costs here.
    llm = LLM(str(model_dir), num_kv_blocks=64, num_threads=1, kernel_backend=backend,
              max_num_batched_tokens=24, num_speculative_tokens=num_speculative_tokens,
              speculative_cost_model=False)
    assert llm.engine.runner.model.ops.name == backend
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    first = llm.generate(prompts()[:2], params)
    second = llm.generate(prompts()[2:], params)  # after the first: a prefix cache hit
    assert second[0].num_cached_tokens >= 32
    if num_speculative_tokens:
        stats = llm.stats()
        assert 0 < stats.spec_accepted_tokens < stats.spec_draft_tokens, "nothing was verified"
    return [o.outputs[0].token_ids for o in first + second]


@pytest.mark.slow
def test_triton_kernels_give_the_torch_paths_greedy_tokens(tiny_model_dir):
    assert greedy(tiny_model_dir, "triton") == greedy(tiny_model_dir, "torch")


@pytest.mark.slow
def test_triton_kernels_verify_drafts_as_the_torch_path_decodes(tiny_model_dir, monkeypatch,
                                                                request):
    """On Qwen3 alone: verifying drafts is the same kernels' work whatever the family (the
    families' own parts are checked above), and each interpreted run is ~10 s of the suite."""
    if request.node.callspec.params["tiny_model_dir"] != "qwen3":
        pytest.skip("drafts are verified on the Qwen3 model only")
    want = greedy(tiny_model_dir, "torch")
    future = {tuple(p): tokens for p, tokens in zip(prompts(), want, strict=True)}

    def oracle(self, seq, max_drafts):
        """A tiny random model never repeats itself, so draft its known reply instead."""
        drafts = future[tuple(seq.prompt_token_ids)][seq.num_output_tokens:][:min(max_drafts, 3)]
        if seq.num_output_tokens % 3 == 0 and drafts:  # and sometimes a wrong last draft
            drafts[-1] = drafts[-1] - 1 if drafts[-1] > 0 else 1
        return drafts

    monkeypatch.setattr(NgramProposer, "propose", oracle)
    assert greedy(tiny_model_dir, "triton", 4) == want


@pytest.mark.slow
def test_triton_quantized_linears_give_the_torch_paths_greedy_tokens(tmp_path):
    """int4 layers through the Triton int4 kernel and the int8 vocabulary through its split
    into int4 halves, against PyTorch's CPU kernels on the same weights; a chunked prompt
    includes a step where nothing samples (the lm_head gets no rows). The tiny GGUF's
    vocabulary is 260 tokens: with the default tokenizer's 49,152 the interpreted lm_head was
    ~6 minutes of this test, and its size is not what the test is about. Two tokens a prompt:
    the first from the GEMM of a 24-row step, the second from the GEMV of a 2-row decode step
    (two more decode steps ran the same launches again, ~40% of the interpreted time)."""
    model = write_tiny_gguf(tmp_path / "tiny.gguf").path
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)

    def quantized_greedy(backend: str) -> list[list[int]]:
        llm = LLM(str(model), num_kv_blocks=16, num_threads=1, kernel_backend=backend,
                  max_num_batched_tokens=24, quantization="int4")
        outputs = llm.generate([list(range(100, 143)), list(range(200, 205))], params)
        return [o.outputs[0].token_ids for o in outputs]

    assert quantized_greedy("triton") == quantized_greedy("torch")


@pytest.mark.slow
def test_triton_kernels_read_each_kv_cache_groups_own_tables(tmp_path_factory, default_model):
    """A Qwen3 whose first layer alone has an 8-token window keeps that layer's blocks in a KV
    cache group of its own (tables, slots, blocks given back behind the window)."""
    from tests.engine.models.test_parity import save_tiny_variant

    folder = save_tiny_variant(tmp_path_factory, default_model.path, "qwen3-window8-first")
    assert greedy(folder, "triton") == greedy(folder, "torch")


@pytest.mark.slow
def test_triton_runs_a_file_of_iq4_xs_q5_k_and_q3_k_blocks_as_its_dequantized_self(tmp_path):
    """The GGUF types people download reach the GPU's kernels widened to grouped int8 at load
    (exactly: tests/engine/quantization/test_cpu_k_blocks.py) and through its int8 path: greedy
    tokens equal to the torch path's on the file dequantized to floats."""
    mixed = {"ffn_down": QType.Q5_K, "attn_v": QType.Q5_K, "attn_output": QType.Q3_K}
    model = write_tiny_gguf(tmp_path / "tiny.IQ4_XS.gguf", matrix_type=QType.IQ4_XS,
                            mixed=mixed).path
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)

    def greedy_tokens(backend: str, quantization: str) -> list[list[int]]:
        llm = LLM(str(model), num_kv_blocks=16, num_threads=1, kernel_backend=backend,
                  quantization=quantization)
        return llm.generate([list(range(100, 106))], params)[0].outputs[0].token_ids

    assert greedy_tokens("triton", "auto") == greedy_tokens("torch", "none")


def mtp_replies_and_drafts(folder, backend: str) -> tuple[list[list[int]], list[list[int]]]:
    """The tiny Qwen3.5 with a multi-token-prediction block drafting 3 a step: the replies,
    and every draft the block offers."""
    llm = LLM(str(folder), num_kv_blocks=32, num_threads=1, kernel_backend=backend,
              num_speculative_tokens=3, speculative_cost_model=False)
    assert llm.engine.runner.model.ops.name == backend
    offered: list[list[int]] = []
    proposer = llm.engine.scheduler.proposer
    offer = proposer.offer

    def record(seq, drafts):
        offered.append(list(drafts))
        offer(seq, drafts)

    proposer.offer = record
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    outs = llm.generate([SHARED_PREFIX[:37], list(range(300, 318))], params)
    return [o.outputs[0].token_ids for o in outs], offered


@pytest.mark.slow
def test_triton_kernels_chain_mtp_drafts_as_the_torch_path(tmp_path):
    """The block's chained passes attend through the Triton kernels' varlen metadata (one
    query a sequence, in its blocks and its scratch blocks past them)."""
    from tests.engine.spec_decode.test_mtp_drafts import add_mtp_block

    folder = save_tiny_model(tmp_path / "qwen3.5", "qwen3.5")
    add_mtp_block(folder)
    triton = mtp_replies_and_drafts(folder, "triton")
    assert triton == mtp_replies_and_drafts(folder, "torch")
    assert {len(drafts) for drafts in triton[1]} == {3}
