"""The real, trained Gemma 3 270M (gemma-3-270m-q4_k_m.gguf, tests/engine/real_gemma3.py) runs
as transformers and llama.cpp run it.

The reference is transformers' Gemma3ForCausalLM in fp32 on the file's own weights, dequantized
by our loader ("none"): building it from transformers' own GGUF reader takes about 4 minutes
here. Ours runs the file as a user does ("auto": its Q4_K, Q6_K, Q5_0 and Q8_0 blocks through
the quantized kernels), so the two part only where the reference's two best logits nearly tie.

Slow: opening the file reads a 262,144-token vocabulary (~15 s), and building the engine times
its kernels; both are shared by the module's tests.
"""

import pytest
import torch
import transformers
from transformers.initialization import no_init_weights

from pagoda.engine import LLM, SamplingParams
from pagoda.engine.config import EngineConfig
from pagoda.engine.llm_engine import LLMEngine
from pagoda.engine.loading.gguf import GGUFModelFile
from pagoda.engine.loading.loader import LoadedModel, metadata_cache_folder
from pagoda.engine.models.gemma3 import config_from_gguf
from pagoda.engine.models.registry import expected_weight_shapes
from tests.engine.llama_cpp_references import llama_cpp_records
from tests.engine.real_gemma3 import gemma3_270m_file

pytestmark = pytest.mark.slow

# ~200 tokens: prose, code and French.
MIXED_TEXT = """The old lighthouse keeper climbed the spiral stairs every evening at dusk. From \
the lamp room he could see the whole bay: the fishing boats coming home, the gulls circling the \
harbour wall, and far out to sea the dark line where the weather was turning.

def moving_average(values, window):
    \"\"\"Return the average of each run of `window` consecutive values.\"\"\"
    totals = []
    for start in range(len(values) - window + 1):
        totals.append(sum(values[start:start + window]) / window)
    return totals

Le lendemain matin, la brume couvrait encore le port. Les pêcheurs attendaient sur le quai en \
buvant leur café, et personne ne voulait partir avant que le soleil ne perce enfin les nuages.
"""
# llama.cpp's own agreement with transformers on such a text, and the widest top-2 logit gap
# (in the reference) at which its predictions differed: both quantized paths part from fp32 there.
MIN_AGREEMENT = 0.94
NEAR_TIE = 0.4
FRANCE = " the capital of the country of France. It is the largest city in France"


@pytest.fixture(scope="module")
def gemma3_270m() -> tuple[GGUFModelFile, transformers.PretrainedConfig, object]:
    """The file, its config as Pagoda builds it and its tokenizer (cached by content)."""
    path = gemma3_270m_file()
    file = GGUFModelFile(path)
    _, tokenizer = file.config_and_tokenizer(metadata_cache_folder(path))
    return file, config_from_gguf(file), tokenizer


@pytest.fixture(scope="module")
def llm(gemma3_270m) -> LLM:
    file, config, tokenizer = gemma3_270m
    weights = file.weights(expected_weight_shapes(config), config, quantization="auto")
    loaded = LoadedModel("gemma-3-270m", file.path, config, tokenizer, weights)
    return LLM.from_engine(LLMEngine(config=EngineConfig(num_kv_blocks=64), loaded=loaded))


@pytest.fixture(scope="module")
def reference(gemma3_270m) -> transformers.Gemma3ForCausalLM:
    """transformers' model in fp32 on the file's weights as our loader dequantizes them."""
    file, config, _ = gemma3_270m
    weights = file.weights(expected_weight_shapes(config), config, quantization="none")
    with no_init_weights():
        model = transformers.Gemma3ForCausalLM(config)
    model.load_state_dict({name: w.float() for name, w in weights.items()}, strict=False)
    model.tie_weights()
    return model.eval()


def test_gemma3_270m_predicts_the_next_token_as_transformers_does_but_at_near_ties(
        gemma3_270m, llm, reference):
    _, _, tokenizer = gemma3_270m
    ids = tokenizer.encode(MIXED_TEXT)
    assert len(ids) >= 150
    out, = llm.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=1))
    ours = torch.tensor([lp.top[0].token_id for lp in out.prompt_logprobs[1:]])
    with torch.inference_mode():
        logits = reference(torch.tensor([ids])).logits[0, :-1].float()
    top2 = logits.topk(2, dim=-1)
    missed = ours != top2.indices[:, 0]
    gaps = (top2.values[:, 0] - top2.values[:, 1])[missed]

    assert 1 - missed.float().mean().item() >= MIN_AGREEMENT
    assert (gaps <= NEAR_TIE).all(), f"missed transformers' choice at top-2 gaps {gaps.tolist()}"


def test_gemma3_270m_continues_the_capital_of_france_as_llama_cpp_and_transformers_do(
        gemma3_270m, llm, reference):
    """Their text, or theirs up to a token where our pick and theirs are both within NEAR_TIE
    of transformers' best logit. Which kernel a layer runs is timed at load, so a loaded
    machine may pick another of two exact-enough paths and part at such a tie (seen at the
    12th token, "largest" against "capital")."""
    _, _, tokenizer = gemma3_270m
    prompt = tokenizer.encode("The capital of France is")
    theirs = tokenizer.encode(FRANCE, add_special_tokens=False)
    out, = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=len(theirs)))
    ours = list(out.outputs[0].token_ids)
    parted = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    if parted is None:
        assert out.outputs[0].text.startswith(FRANCE)
        return
    assert parted >= 8, f"parted at token {parted}: {out.outputs[0].text!r}"
    with torch.inference_mode():
        logits = reference(torch.tensor([prompt + theirs[:parted]])).logits[0, -1]
    behind = (logits.max() - logits[[ours[parted], theirs[parted]]]).tolist()
    assert max(behind) <= NEAR_TIE, f"token {parted}: {behind} behind transformers' best"


def test_gemma3_270m_greedy_tokens_part_from_llama_cpps_only_at_near_ties(
        gemma3_270m, llm, reference):
    """llama.cpp's recorded continuations on this very file: ours equal them to the end, or up
    to a token where both picks are within NEAR_TIE of transformers' best logit (after
    llama.cpp's tokens); the texts differ after it. llama.cpp's own gap there may be wide: its
    kernels round activations to 8 bits (at one such token it gave 0.62 to the token fp32 ranks
    second by 0.26)."""
    file, _, _ = gemma3_270m
    record, = llama_cpp_records("gemma3_270m.json", family="gemma3")
    assert record.file == file.path.name
    params = SamplingParams(temperature=0, ignore_eos=True,
                            max_tokens=len(record.continuations[0].llama_cpp_tokens))
    outputs = llm.generate([c.prompt_ids for c in record.continuations], params)
    for c, out in zip(record.continuations, outputs, strict=True):
        ours, theirs = list(out.outputs[0].token_ids), c.llama_cpp_tokens
        assert len(ours) == len(theirs)
        parted = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
        if parted is None:
            continue
        with torch.inference_mode():
            logits = reference(torch.tensor([c.prompt_ids + theirs[:parted]])).logits[0, -1]
        behind = (logits.max() - logits[[ours[parted], theirs[parted]]]).tolist()
        assert max(behind) <= NEAR_TIE, (
            f"prompt {c.prompt_ids}: token {parted} is {ours[parted]}, llama.cpp's "
            f"{theirs[parted]}, {behind[0]:.3f} and {behind[1]:.3f} behind transformers' best"
            f"\nours {ours}\nllama.cpp's {theirs}")
