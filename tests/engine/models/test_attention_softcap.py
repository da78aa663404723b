"""Attention logit softcapping (Gemma 2's scores = cap * tanh(scores / cap) before the softmax)
through a whole model: prefill in chunks over cached keys, then decode steps.

No family here turns it on from a file (transformers' Gemma 3 never applies its config's
attn_logit_softcapping), so the tiny Gemma 3 is given a cap on both sides: our architecture's
attention_softcap, and transformers' own Gemma 3 eager attention told to apply its softcap.
The Triton kernels, under the interpreter, give the torch path's greedy tokens."""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import pytest
import torch
import transformers
from tiny_models import save_tiny_model
from transformers.models.gemma3 import modeling_gemma3

from pagoda.engine import LLM, SamplingParams
from pagoda.engine.models import gemma3
from tests.engine.family_parity import assert_same_argmax, engine_logits, hf_logits
from tests.engine.models.test_parity import NUM_THREADS, assert_greedy_parity, parity_prompts

# Low enough that the tiny model's scores (up to ~4) are bent well below them.
CAP = 2.0


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("gemma3-softcap"), "gemma3")


@pytest.fixture(scope="module")
def prompts(folder) -> list[list[int]]:
    return parity_prompts(transformers.AutoTokenizer.from_pretrained(folder))


@contextlib.contextmanager
def capped_attention():
    """Our Gemma 3 and transformers' with their attention scores capped at CAP."""
    uncapped_architecture = gemma3.architecture
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gemma3, "architecture", lambda config: dataclasses.replace(
            uncapped_architecture(config), attention_softcap=CAP))
        patch.setattr(modeling_gemma3, "eager_attention_forward", functools.partial(
            modeling_gemma3.eager_attention_forward, softcap=CAP))
        yield


@pytest.fixture(scope="module")
def hf_eager(folder):
    """transformers' Gemma 3 on its eager attention: the one that can apply a softcap."""
    return transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager").eval()


def test_capped_scores_predict_transformers_capped_next_token_at_every_position(
        folder, prompts, hf_eager):
    some = prompts[::2]  # chats and raw text, each past the 8-key window: the greedy test has all
    uncapped = engine_logits(folder, some[:1])[0]
    with capped_attention():
        ours_all, theirs_all = engine_logits(folder, some), hf_logits(hf_eager, some)
    assert (ours_all[0] - uncapped).abs().max() > 0.05, "the cap changed nothing"
    for i, (ours, theirs) in enumerate(zip(ours_all, theirs_all, strict=True)):
        assert_same_argmax(ours, theirs, f"prompt {i}")
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_capped_greedy_through_chunked_prefill_and_decoding_matches_transformers(
        folder, prompts, hf_eager):
    with capped_attention():
        llm = LLM(str(folder), num_kv_blocks=128, num_threads=NUM_THREADS,
                  max_num_batched_tokens=16)
        assert llm.engine.runner.model.native_decode is None
        assert_greedy_parity(llm, hf_eager, prompts)


def test_capped_scores_on_the_triton_kernels_give_the_torch_paths_greedy_tokens(folder, prompts):
    """A prefill of the shortest prompt past the 8-key window, then decode steps; under Triton's
    interpreter each launch runs in Python, so this stays short."""
    shortest = min(prompts, key=len)

    def greedy(backend: str) -> list[int]:
        llm = LLM(str(folder), num_kv_blocks=16, num_threads=1, kernel_backend=backend)
        assert llm.engine.runner.model.ops.name == backend
        params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        return llm.generate([shortest], params)[0].outputs[0].token_ids

    with capped_attention():
        capped = {backend: greedy(backend) for backend in ("triton", "torch")}
    assert capped["triton"] == capped["torch"]
    assert capped["torch"] != greedy("torch"), "the cap changed nothing"
