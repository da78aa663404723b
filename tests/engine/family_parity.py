"""What the families' tests hold our engine to: transformers' fp32 logits at every position of a
teacher-forced prompt (one model folder), the folder's logits from llama.cpp's GGUF of it (to
its fp16 rounding), and llama.cpp's own greedy tokens on that file."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from pagoda.engine import LLM, SamplingParams
from pagoda.engine.config import EngineConfig
from pagoda.engine.loading.gguf import GGUFModelFile
from pagoda.engine.loading.loader import load_model
from pagoda.engine.worker.evaluation import prompt_logits
from pagoda.engine.worker.model_runner import ModelRunner
from tests.engine.llama_cpp_references import FileRecord, sha256

# Two fp32 logits this close are a tie: either token is a correct greedy choice.
NEAR_TIE = 1e-4
# llama.cpp's two best log-probabilities this close: its kernels and ours may order them apart.
LLAMA_CPP_NEAR_TIE = 0.05
# On a quantized file llama.cpp also rounds each activation to 8 bits before its dot products
# (we keep them exact): on the tiny families' llama-quantize Q4_K_M that moves a logit by up to
# ~0.2, so two tokens this close in llama.cpp may come out in either order.
LLAMA_CPP_QUANTIZED_NEAR_TIE = 0.2
# 16-token chunks: each prompt's later chunks attend to keys cached by earlier ones.
PREFILL_CHUNK = 16


def engine_logits(source: Path, prompts: list[list[int]]) -> list[torch.Tensor]:
    """Our fp32 logits after every token of each prompt, prefilled in PREFILL_CHUNK chunks."""
    runner = ModelRunner(load_model(source, quantization="none"),
                         EngineConfig(num_kv_blocks=64, dtype=torch.float32, num_threads=1))
    return [prompt_logits(runner, ids, chunk=PREFILL_CHUNK) for ids in prompts]


@torch.inference_mode()
def hf_logits(model, prompts: list[list[int]]) -> list[torch.Tensor]:
    return [model(torch.tensor([ids])).logits[0].float() for ids in prompts]


def eager_hf_model(folder: Path, **config):
    """transformers' fp32 model on its eager attention: the one that applies softcaps and
    sinks. config: settings that override config.json's."""
    return transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager", **config).eval()


@torch.no_grad()
def round_matrices_to_fp16(model):
    """The model with each matrix as llama.cpp's f16 file holds it (norms stay fp32 there)."""
    for parameter in model.parameters():
        if parameter.ndim == 2:
            parameter.copy_(parameter.half().float())
    return model


# What llama.cpp's f16 file of a hybrid mixture of experts keeps in float32: the routers, the
# shared experts' gates and the DeltaNets' convolution taps (as it does norms).
HYBRID_MOE_KEPT_FLOAT32 = ("mlp.gate.weight", "shared_expert_gate.weight", "conv1d.weight")


@torch.no_grad()
def round_as_the_f16_file(model, kept_float32: tuple[str, ...] = HYBRID_MOE_KEPT_FLOAT32):
    """The model with each matrix and each layer's stacked experts as llama.cpp's f16 file holds
    them, but the parameters named by kept_float32's endings."""
    for name, parameter in model.named_parameters():
        if parameter.ndim >= 2 and not name.endswith(kept_float32):
            parameter.copy_(parameter.half().float())
    return model


def assert_gguf_tokenizer_is_the_folders(gguf_file: Path, folder: Path, cache: Path) -> None:
    """The chat template, special tokens and ids a GGUF file's own tokenizer gives are the
    folder's it was converted from."""
    _, ours = GGUFModelFile(gguf_file).config_and_tokenizer(cache)
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    assert ours.chat_template == theirs.chat_template
    for token in ("bos_token", "eos_token", "pad_token"):
        assert getattr(ours, token) == getattr(theirs, token), token
    chat = [{"role": "user", "content": "用三句话介绍一下长城, then say it in English."}]
    assert (ours.apply_chat_template(chat, add_generation_prompt=True)
            == theirs.apply_chat_template(chat, add_generation_prompt=True))


def assert_same_argmax(ours: torch.Tensor, reference: torch.Tensor, label: str) -> None:
    """The same next token after every position, but where the reference's top two tie."""
    top2 = reference.topk(2, dim=-1)
    gap = top2.values[:, 0] - top2.values[:, 1]
    differ = (ours.argmax(-1) != top2.indices[:, 0]) & (gap > NEAR_TIE)
    assert not differ.any(), (f"{label}: another next token at positions "
                              f"{differ.nonzero().flatten().tolist()} of {len(reference)}")


def greedy_disagreements_with_llama_cpp(gguf_file: Path, record: FileRecord,
                                        near_tie: float = LLAMA_CPP_NEAR_TIE) -> list[str]:
    """The record's prompts on which our greedy tokens (EOS ignored, as recorded) differ from
    llama.cpp's on the very file it ran, up to its first near-tie (there either token is right,
    the record keeps only llama.cpp's, and the tokens after it continue another text)."""
    assert sha256(gguf_file) == record.sha256, (
        f"{gguf_file.name} is not the file llama.cpp's tokens were recorded on: rerun "
        "tests/engine/data/llama_cpp/record.py")
    llm = LLM(str(gguf_file), num_kv_blocks=64, num_threads=1)
    params = SamplingParams(temperature=0, max_tokens=len(record.continuations[0].llama_cpp_tokens),
                            ignore_eos=True)
    outputs = llm.generate([c.prompt_ids for c in record.continuations], params)
    disagreements = []
    for i, (c, out) in enumerate(zip(record.continuations, outputs, strict=True)):
        ours = list(out.outputs[0].token_ids)
        ties = [j for j, gap in enumerate(c.top2_logprob_gaps) if gap <= near_tie]
        compared = ties[0] if ties else len(c.llama_cpp_tokens)
        if ours[:compared] != c.llama_cpp_tokens[:compared]:
            disagreements.append(f"prompt {i}: ours {ours}, llama.cpp's {c.llama_cpp_tokens} "
                                 f"(n_ctx {record.n_ctx})")
    return disagreements


class FakeGGUFSettings:
    """A GGUF file's keys and tensors as a family's config_from_gguf reads them, without a file:
    a token table of 100 x 64, other tensors where `vectors` holds them."""

    def __init__(self, architecture: str, metadata: dict, vectors: dict[str, list[float]]):
        self.architecture = architecture
        self._metadata, self._vectors = metadata, vectors

    def metadata(self, key: str) -> object:
        return self._metadata.get(key)

    def tensor_dims(self, name: str) -> tuple[int, ...] | None:
        if name == "token_embd.weight":
            return (100, 64)
        return (len(self._vectors[name]),) if name in self._vectors else None

    def small_vector(self, name: str, length: int) -> list[float] | None:
        return self._vectors.get(name)
