"""Qwen3.5's multi-token-prediction (MTP) block as the drafter: read from a folder's mtp.*
tensors, run over every position the model computes, and its draft for each step is the one
transformers' own layers give for the block; greedy output with its drafts verified is the
output without speculation.

The tiny Qwen3.5 (tests/engine/tiny_models.py) gets a random block beside its weights, as the
released folders carry one. Its reference: the block's embedding and hidden norms and fc by
hand, then its decoder layer, final norm and the model's lm_head as a one-layer Qwen3.5 of
transformers (its attention reads the block's keys at every earlier position, as ours does).
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from pagoda.engine import LLM, SamplingParams
from pagoda.engine.errors import ModelLoadError
from pagoda.engine.models.registry import optional_weight_shapes
from pagoda.engine.spec_decode.draft_sources import DraftSources, drafts_that_pay
from pagoda.engine.spec_decode.step_cost import StepCost
from tests.engine.llama_cpp_converter import convert_to_gguf, gguf_model_name
from tests.engine.models.test_parity import NUM_THREADS
from tests.engine.test_batch_invariance import SENTENCES
from tests.engine.tiny_models import save_tiny_model

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
SPEC = {"num_speculative_tokens": 2, "speculative_cost_model": False,
        "num_threads": NUM_THREADS, "num_kv_blocks": 64}


def add_mtp_block(folder, seed: int = 1) -> None:
    """Random mtp.* tensors (the names and shapes Pagoda reads) in the folder's weight file,
    as released folders hold them (the converter reads the model's files only), and
    config.json's mtp_num_hidden_layers."""
    generator = torch.Generator().manual_seed(seed)
    config = transformers.AutoConfig.from_pretrained(folder)
    block = {name: torch.randn(shape, generator=generator) * (0.02 if len(shape) > 1 else 0.1)
             for name, shape in optional_weight_shapes(config).items()}
    weights = load_file(folder / "model.safetensors")
    save_file(weights | block, folder / "model.safetensors", metadata={"format": "pt"})
    settings = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(settings | {"mtp_num_hidden_layers": 1}))


@pytest.fixture(scope="module")
def qwen35_mtp(tmp_path_factory):
    folder = save_tiny_model(tmp_path_factory.mktemp("qwen35-mtp"), "qwen3.5")
    add_mtp_block(folder)
    return folder


@pytest.fixture(scope="module")
def prompts(qwen35_mtp) -> list[list[int]]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(qwen35_mtp)
    ids = [tokenizer.encode(f"Note {i}. " + " ".join(SENTENCES[i:] + SENTENCES[:i]))
           for i in range(3)]
    return [p[:n] for p, n in zip(ids, (70, 19, 40), strict=True)]


def replies(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    return [list(out.outputs[0].token_ids) for out in llm.generate(prompts, GREEDY)]


def reference_drafts(folder, tokens: list[int]) -> list[int]:
    """The block's greedy draft at each position t < len(tokens) - 1 (for token t + 2), from
    the model's hidden states over `tokens`."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    mtp = mtp_tensors(folder)
    ids = torch.tensor([tokens])
    with torch.no_grad():
        hidden = model.model(ids).last_hidden_state[0, :-1]  # after the final norm
        eps = model.config.rms_norm_eps

        def norm(x, name):
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
            return x * (1 + mtp[f"mtp.{name}.weight"])

        embedded = model.model.embed_tokens(ids[0, 1:])
        x = torch.cat((norm(embedded, "pre_fc_norm_embedding"),
                       norm(hidden, "pre_fc_norm_hidden")), dim=-1) @ mtp["mtp.fc.weight"].T
        block = one_layer_model(model, mtp)
        logits = block(inputs_embeds=x[None]).logits[0]
    return logits.argmax(-1).tolist()


def mtp_tensors(folder) -> dict[str, torch.Tensor]:
    return {name: tensor for name, tensor in load_file(folder / "model.safetensors").items()
            if name.startswith("mtp.")}


def one_layer_model(model, mtp: dict[str, torch.Tensor]):
    """transformers' Qwen3.5 of the block's one full-attention layer, its final norm the
    block's and its lm_head the model's."""
    config = transformers.AutoConfig.from_pretrained(model.config._name_or_path)
    config.num_hidden_layers = 1
    config.layer_types = ["full_attention"]
    block = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    state = {f"model.layers.0.{name[len('mtp.layers.0.'):]}": tensor
             for name, tensor in mtp.items() if name.startswith("mtp.layers.0.")}
    state |= {"model.norm.weight": mtp["mtp.norm.weight"],
              "model.embed_tokens.weight": model.model.embed_tokens.weight,
              "lm_head.weight": model.lm_head.weight}
    block.load_state_dict(state)
    return block


def recording_offers(llm: LLM) -> list[tuple[int, int]]:
    """(the sequence's token count, the draft) of every draft the runner offers."""
    offers: list[tuple[int, int]] = []
    sources = llm.engine.scheduler.proposer
    offer = sources.offer

    def record(seq, drafts):
        offers.append((len(seq.all_token_ids), drafts[0]))
        offer(seq, drafts)

    sources.offer = record
    return offers


def test_a_folder_with_an_mtp_block_drafts_with_it_when_speculating(qwen35_mtp):
    on = LLM(str(qwen35_mtp), **SPEC)
    assert on.engine.runner.model.mtp is not None
    assert isinstance(on.engine.scheduler.proposer, DraftSources)
    off = LLM(str(qwen35_mtp), num_threads=NUM_THREADS, num_kv_blocks=64)
    assert off.engine.runner.model.mtp is None  # not even built without speculation


def test_each_draft_is_the_blocks_greedy_token_as_transformers_computes_it(qwen35_mtp,
                                                                           prompts):
    """Every step verifies the draft (no cost model), whatever is kept; after each step the
    runner drafts from the position before the sequence's last token."""
    llm = LLM(str(qwen35_mtp), **(SPEC | {"max_num_batched_tokens": 16}))
    offers = recording_offers(llm)
    prompt = prompts[0]
    reply = replies(llm, [prompt])[0]
    want = reference_drafts(qwen35_mtp, prompt + reply)
    assert len(offers) >= len(reply) // 2
    assert [draft for _, draft in offers] == [want[n - 2] for n, _ in offers]


def test_greedy_output_with_mtp_drafts_is_the_output_without(qwen35_mtp, prompts):
    off = LLM(str(qwen35_mtp), num_threads=NUM_THREADS, num_kv_blocks=64)
    on = LLM(str(qwen35_mtp), **SPEC)
    assert replies(on, prompts) == replies(off, prompts)
    assert on.stats().spec_draft_tokens > 0


def test_qwen3_next_drafts_with_its_block_of_experts(tmp_path, prompts):
    """Qwen3-Next's block has the layers' mixture of experts; the reply is the reply, and its
    converted file (the experts' 3-D tensors in the block after the model's) drafts the
    folder's drafts."""
    folder = save_tiny_model(tmp_path / "qwen3-next", "qwen3-next")
    add_mtp_block(folder)
    off = LLM(str(folder), num_threads=NUM_THREADS, num_kv_blocks=64)
    on = LLM(str(folder), **SPEC)
    assert on.engine.runner.model.mtp is not None
    offers = recording_offers(on)
    assert replies(on, prompts) == replies(off, prompts)
    assert on.stats().spec_draft_tokens > 0
    gguf = convert_to_gguf(folder, tmp_path / "tiny-qwen3-next-mtp.f32.gguf", outtype="f32",
                           name=gguf_model_name("qwen3-next"))
    from_file = LLM(str(gguf), **SPEC)
    file_offers = recording_offers(from_file)
    assert replies(from_file, prompts) == replies(off, prompts)
    assert file_offers == offers


def test_a_folder_with_part_of_an_mtp_block_is_refused(qwen35_mtp, tmp_path):
    folder = save_tiny_model(tmp_path / "partial", "qwen3.5")
    block = mtp_tensors(qwen35_mtp)
    del block["mtp.fc.weight"]
    save_file(block, folder / "mtp.safetensors")
    with pytest.raises(ModelLoadError, match="mtp.fc.weight"):
        LLM(str(folder), **SPEC)


def test_a_gguf_file_with_the_block_drafts_what_its_folder_drafts(qwen35_mtp, prompts):
    """llama.cpp's converter writes the block (by default) as one more block, blk.8 with its
    nextn.* tensors, and counts it in block_count and nextn_predict_layers: the file (f32)
    has the folder's 8 layers and drafts the folder's drafts."""
    gguf = convert_to_gguf(qwen35_mtp, qwen35_mtp.parent / "tiny-qwen3.5-mtp.f32.gguf",
                           outtype="f32", name=gguf_model_name("qwen3.5"))
    from_file, from_folder = LLM(str(gguf), **SPEC), LLM(str(qwen35_mtp), **SPEC)
    assert from_file.engine.runner.model.shape.num_layers == 8
    offers = [recording_offers(llm) for llm in (from_file, from_folder)]
    assert replies(from_file, prompts[:2]) == replies(from_folder, prompts[:2])
    assert offers[0] == offers[1] and offers[0]


def test_the_block_makes_as_many_drafts_a_step_as_pay():
    """A 1-row step takes 1.0 s, 0.1 s of it the block's first pass; each row more 0.2 s,
    each chained pass 0.1 s: at 90% kept, 1 + .9 + .81 + .73 tokens in 1.6 + 0.2 s beat fewer
    drafts; at 60%, one draft (1.6 tokens in 1.2 s) beats two (1.96 in 1.5 s); at 10%, a
    plain step's 1 token in 0.9 s beats any."""
    cost = StepCost({1: 1.0, 2: 1.2, 3: 1.4, 4: 1.6})
    assert drafts_that_pay(0.9, cost, 0.1, 0.1, max_drafts=3) == 3
    assert drafts_that_pay(0.9, cost, 0.1, 0.1, max_drafts=2) == 2
    assert drafts_that_pay(0.6, cost, 0.1, 0.1, max_drafts=3) == 1
    assert drafts_that_pay(0.1, cost, 0.1, 0.1, max_drafts=3) == 0


def test_the_engine_stops_running_a_block_whose_drafts_do_not_pay(qwen35_mtp, prompts):
    """A random block's drafts are seldom kept: after 32 checks (shadow checks, as the cost
    model does not verify them) the engine stops it; the reply is the reply."""
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    off = LLM(str(qwen35_mtp), num_threads=NUM_THREADS, num_kv_blocks=64)
    on = LLM(str(qwen35_mtp), num_speculative_tokens=2, num_threads=NUM_THREADS,
             num_kv_blocks=64)
    assert on.engine.runner.drafts_with_mtp
    assert (on.generate([prompts[0]], params)[0].outputs[0].token_ids
            == off.generate([prompts[0]], params)[0].outputs[0].token_ids)
    assert not on.engine.runner.drafts_with_mtp
    assert on.engine.scheduler.proposer.model.num_checked >= 32
