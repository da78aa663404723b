"""Several drafts a step from Qwen3.5's multi-token-prediction block (pagoda.engine.models.mtp):
after its first draft the block runs again on its own output and that draft, k times in all
(num_speculative_tokens), its keys written for each drafted position and overwritten by the next
step's pass over what the model computes. Each draft is the one the block's layers give run
step by step in transformers (`reference_chain`), whichever drafts the steps before kept;
greedy output is the output without speculation; the block's keys come back with a prefix-cache
hit, from memory and from the disk tier.

The tiny Qwen3.5 with a random block (test_mtp_drafts.add_mtp_block) seldom has a draft kept,
so one test verifies scripted drafts instead (the known reply, one wrong at a moving place) while
the block drafts beside them, and another builds a block that copies the model's own prediction,
whose drafts are all kept.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from pagoda.engine import LLM, SamplingParams
from pagoda.engine.config import EngineConfig
from pagoda.engine.loading.loader import load_model
from pagoda.engine.loading.model_info import check_model_fits, read_model_headers
from pagoda.engine.models.kv_cache_sizing import model_kv_cache_bytes
from pagoda.engine.spec_decode.ngram_proposer import NgramProposer
from pagoda.engine.spec_decode.step_cost import StepCost
from tests.engine.llama_cpp_converter import convert_to_gguf, gguf_model_name
from tests.engine.models.test_parity import NUM_THREADS
from tests.engine.spec_decode.test_mtp_drafts import add_mtp_block, mtp_tensors, one_layer_model
from tests.engine.test_batch_invariance import SENTENCES
from tests.engine.tiny_models import save_tiny_model

K = 3
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
ENGINE = {"num_threads": NUM_THREADS, "num_kv_blocks": 64}
SPEC = ENGINE | {"num_speculative_tokens": K, "speculative_cost_model": False}


@pytest.fixture(scope="module")
def qwen35_mtp(tmp_path_factory):
    folder = save_tiny_model(tmp_path_factory.mktemp("qwen35-mtp"), "qwen3.5")
    add_mtp_block(folder)
    return folder


@pytest.fixture(scope="module")
def prompts(qwen35_mtp) -> list[list[int]]:
    """Four prompts of 19 to 70 tokens that share no prefix."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(qwen35_mtp)
    ids = [tokenizer.encode(f"Note {i}. " + " ".join(SENTENCES[i:] + SENTENCES[:i]))
           for i in range(4)]
    return [p[:n] for p, n in zip(ids, (70, 19, 40, 55), strict=True)]


@pytest.fixture(scope="module")
def reference(qwen35_mtp, prompts) -> list[list[int]]:
    """Each prompt's greedy reply without speculation or prefix cache."""
    llm = LLM(str(qwen35_mtp), **ENGINE, enable_prefix_caching=False)
    return replies(llm, prompts)


@pytest.fixture(scope="module")
def chain(qwen35_mtp):
    """reference_chain over the module's model, its weights read once."""
    model = transformers.AutoModelForCausalLM.from_pretrained(qwen35_mtp, dtype=torch.float32)
    block = one_layer_model(model, mtp_tensors(qwen35_mtp))
    mtp = mtp_tensors(qwen35_mtp)
    return lambda tokens, num: reference_chain(model, block, mtp, tokens, num)


def replies(llm: LLM, prompts: list[list[int]], params: SamplingParams = GREEDY
            ) -> list[list[int]]:
    return [list(out.outputs[0].token_ids) for out in llm.generate(prompts, params)]


@torch.no_grad()
def reference_chain(model, block, mtp: dict[str, torch.Tensor], tokens: list[int],
                    num_drafts: int) -> list[int]:
    """The block's drafts for the tokens after `tokens`, made one at a time: its input at
    each position t < len(tokens) - 1 is the model's hidden state there and token t + 1; at
    each position after, its own output at the one before and the draft there."""
    eps = model.config.rms_norm_eps

    def norm(x, name):
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return x * (1 + mtp[f"mtp.{name}.weight"])

    ids = torch.tensor([tokens])
    carried = model.model(ids).last_hidden_state[0, :-1]  # after the model's final norm
    following = list(tokens[1:])
    drafts: list[int] = []
    for _ in range(num_drafts):
        embedded = model.model.embed_tokens(torch.tensor(following))
        x = torch.cat((norm(embedded, "pre_fc_norm_embedding"),
                       norm(carried, "pre_fc_norm_hidden")), dim=-1) @ mtp["mtp.fc.weight"].T
        out = block.model(inputs_embeds=x[None]).last_hidden_state[0]  # after the block's norm
        drafts.append(int(block.lm_head(out[-1]).argmax()))
        following.append(drafts[-1])
        carried = torch.cat((carried, out[-1:]))
    return drafts


def recording_offers(llm: LLM) -> list[tuple[list[int], list[int]]]:
    """(the sequence's tokens, the drafts) of every offer the runner makes."""
    offers: list[tuple[list[int], list[int]]] = []
    proposer = llm.engine.scheduler.proposer
    offer = proposer.offer

    def record(seq, drafts):
        offers.append((list(seq.all_token_ids), list(drafts)))
        offer(seq, drafts)

    proposer.offer = record
    return offers


def assert_offers_are_the_chain(offers, chain, num_drafts: int = K) -> None:
    assert offers
    for tokens, drafts in offers:
        assert len(drafts) == num_drafts
        assert drafts == chain(tokens, num_drafts), len(tokens)


class ScriptedVerification(NgramProposer):
    """Proposes the next K tokens of each prompt's known greedy reply, the one at index
    (tokens so far) % (K + 1) wrong (none when that is K), so steps keep 0 to K drafts; the
    block's offers are only recorded."""

    def __init__(self, replies: dict[tuple[int, ...], list[int]], vocab_size: int) -> None:
        super().__init__(K, 1, 1)
        self.replies = replies
        self.vocab_size = vocab_size
        self.offers: list[tuple[list[int], list[int]]] = []

    def propose(self, seq, max_drafts: int) -> list[int]:
        done = len(seq.output_token_ids)
        drafts = self.replies[tuple(seq.prompt_token_ids)][done:done + min(max_drafts, K)]
        wrong = done % (K + 1)
        if wrong < len(drafts):
            drafts[wrong] = (drafts[wrong] + 1) % self.vocab_size
        return drafts

    def offer(self, seq, drafts: list[int]) -> None:
        self.offers.append((list(seq.all_token_ids), list(drafts)))


def test_each_step_drafts_the_blocks_own_chain_as_transformers_runs_it(qwen35_mtp, prompts,
                                                                       chain):
    """Prompts read in chunks of 16 tokens, every draft verified (no cost model): after each
    step, K drafts, each the block run on its own output and the draft before."""
    llm = LLM(str(qwen35_mtp), **(SPEC | {"max_num_batched_tokens": 16}))
    offers = recording_offers(llm)
    replies(llm, prompts[:2])
    assert_offers_are_the_chain(offers, chain)


def test_chained_drafts_stay_right_after_steps_that_keep_some_drafts(qwen35_mtp, prompts,
                                                                      reference, chain):
    """Steps that keep none, some or all of their drafts: the block's keys at the drafts a
    step rejected (and at its own chained positions) are written over before they are read."""
    llm = LLM(str(qwen35_mtp), **SPEC)
    scripted = ScriptedVerification({tuple(p): r for p, r in zip(prompts, reference,
                                                                 strict=True)},
                                    llm.engine.runner.vocab_size)
    llm.engine.scheduler.proposer = scripted
    assert replies(llm, prompts) == reference
    stats = llm.stats()
    assert 0 < stats.spec_accepted_tokens < stats.spec_draft_tokens
    assert_offers_are_the_chain(scripted.offers, chain)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_greedy_output_with_k_drafts_a_step_is_the_output_without(qwen35_mtp, prompts,
                                                                   reference, k):
    llm = LLM(str(qwen35_mtp), **(SPEC | {"num_speculative_tokens": k}))
    offers = recording_offers(llm)
    assert replies(llm, prompts) == reference
    assert llm.stats().spec_draft_tokens > 0
    assert {len(drafts) for _, drafts in offers} == {k}


def test_preempted_requests_resume_with_the_blocks_keys_and_identical_tokens(
        qwen35_mtp, prompts, reference, chain):
    """8 blocks of 16 tokens hold the longest request (70 + 24 tokens and K drafts) but not
    all four: the newest are preempted and restart from a checkpoint or their first token;
    their drafts after are still the chain over their tokens."""
    llm = LLM(str(qwen35_mtp), **(SPEC | {"num_kv_blocks": 8}))
    offers = recording_offers(llm)
    assert replies(llm, prompts) == reference
    assert llm.stats().num_preemptions > 0
    assert_offers_are_the_chain(offers, chain)


def test_a_request_aborted_between_steps_leaves_the_others_replies(qwen35_mtp, prompts,
                                                                   reference):
    llm = LLM(str(qwen35_mtp), **SPEC)
    engine = llm.engine
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, GREEDY)
    for _ in range(6):
        engine.step()
    assert engine.abort_request("1") is not None
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = list(out.outputs[0].token_ids)
    assert done == {str(i): reference[i] for i in (0, 2, 3)}
    assert engine.state_pool.num_free_slots == engine.state_pool.num_slots


def second_turn(prompts: list[list[int]], reference: list[list[int]]) -> list[int]:
    """A chat's next turn after prompts[1]'s: its reply, then more text."""
    return prompts[1] + reference[1] + prompts[2][:20]


def test_a_prefix_hit_brings_the_blocks_keys_back(qwen35_mtp, prompts, reference, chain):
    """The second turn starts from the first turn's checkpoint at 32 of its 43 tokens: the
    block's keys there are the first turn's, in the blocks the hit shares, and its drafts are
    those of the block run over the whole chat."""
    llm = LLM(str(qwen35_mtp), **SPEC)
    assert replies(llm, [prompts[1]]) == [reference[1]]
    offers = recording_offers(llm)
    out = llm.generate([second_turn(prompts, reference)], GREEDY)[0]
    assert out.num_cached_tokens == 32
    assert_offers_are_the_chain(offers, chain)


def test_a_prefix_hit_from_the_disk_tier_brings_the_blocks_keys_back(qwen35_mtp, prompts,
                                                                     reference, chain,
                                                                     tmp_path):
    """The disk tier saves the block's keys with the blocks: after a restart the second turn
    reads them from disk with the first turn's, and drafts as over the whole chat."""
    first = LLM(str(qwen35_mtp), **SPEC, disk_cache_dir=tmp_path)
    assert replies(first, [prompts[1]]) == [reference[1]]
    first.engine.close()
    again = LLM(str(qwen35_mtp), **SPEC, disk_cache_dir=tmp_path)
    offers = recording_offers(again)
    out = again.generate([second_turn(prompts, reference)], GREEDY)[0]
    assert out.num_cached_tokens == 32
    assert again.stats().disk_cache.hits > 0
    assert_offers_are_the_chain(offers, chain)


def copying_block(folder) -> None:
    """Make the model's layers add nothing to the token's embedding (their output projections
    zero), so that it predicts from its last token alone, and the block a copy of that
    prediction: its fc passes the embedding's half, its layer adds nothing and its final norm
    is the model's, so its draft for t + 2 is the model's prediction after token t + 1."""
    weights = load_file(folder / "model.safetensors")
    hidden = weights["model.norm.weight"].shape[0]
    for name in weights:
        if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
            weights[name] = torch.zeros_like(weights[name])
    weights["mtp.fc.weight"] = torch.cat((torch.eye(hidden), torch.zeros(hidden, hidden)), 1)
    weights["mtp.pre_fc_norm_embedding.weight"] = torch.zeros(hidden)
    weights["mtp.norm.weight"] = weights["model.norm.weight"].clone()
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})


def test_a_block_that_copies_the_models_prediction_has_every_draft_kept(tmp_path, prompts):
    folder = save_tiny_model(tmp_path / "copying", "qwen3.5")
    add_mtp_block(folder)
    copying_block(folder)
    off = LLM(str(folder), **ENGINE)
    on = LLM(str(folder), **SPEC)
    assert replies(on, prompts) == replies(off, prompts)
    stats = on.stats()
    # 24 tokens a reply: 4 a step (K drafts kept and one more), less where max_tokens ends.
    assert stats.spec_accepted_tokens == stats.spec_draft_tokens >= 4 * 15


def test_the_fit_check_counts_the_block_only_where_it_is_built(qwen35_mtp):
    """Without speculation the block is neither read nor built: its weights are not counted,
    nor its keys; with it, the KV cache the check counts is what the engine allocates (the
    block's keys in the first group's blocks, and its chained drafts' scratch blocks)."""
    block = sum(t.numel() for t in mtp_tensors(qwen35_mtp).values())
    off = EngineConfig(**ENGINE)
    on = EngineConfig(max_model_len=256, num_threads=NUM_THREADS, num_speculative_tokens=K)
    unbounded = 1 << 50
    without = check_model_fits(qwen35_mtp, off, available=unbounded).num_parameters
    assert check_model_fits(qwen35_mtp, on, available=unbounded).num_parameters == (
        without + block)
    assert not any(name.startswith("mtp.") for name in load_model(qwen35_mtp, mtp=False).weights)

    headers = read_model_headers(qwen35_mtp)
    assert headers.mtp_like == 7
    runner = LLM(str(qwen35_mtp), max_model_len=256, num_threads=NUM_THREADS,
                 num_speculative_tokens=K).engine.runner
    allocated = (sum(g.num_blocks * g.bytes_per_block for g in runner.kv_cache_groups)
                 + (runner.num_state_slots + runner.num_checkpoint_slots)
                 * runner.bytes_per_state_slot
                 + (runner.mtp_kv[0].shape[0] - runner.num_blocks)
                 * runner.bytes_per_block((runner.model.arch.mtp_like,)))
    assert model_kv_cache_bytes(headers.shape, on, headers.mtp_like) == allocated
    assert model_kv_cache_bytes(headers.shape, on) < allocated


def test_the_fit_check_of_a_gguf_file_counts_its_extra_block_only_where_it_is_built(
        qwen35_mtp, tmp_path):
    """The converter's file holds the block as blk.8 after the model's 8 layers."""
    gguf = convert_to_gguf(qwen35_mtp, tmp_path / "tiny-qwen3.5-mtp.f32.gguf", outtype="f32",
                           name=gguf_model_name("qwen3.5"))
    headers = read_model_headers(gguf)
    assert (headers.shape.num_layers, headers.mtp_like) == (8, 7)
    block = sum(t.numel for t in headers.tensors if t.name.startswith("blk.8."))
    assert block == sum(t.numel() for t in mtp_tensors(qwen35_mtp).values())
    unbounded = 1 << 50
    counted = [check_model_fits(gguf, EngineConfig(**ENGINE, num_speculative_tokens=k),
                                available=unbounded).num_parameters for k in (0, K)]
    assert counted[1] - counted[0] == block


def test_the_engine_chains_as_many_drafts_as_the_cost_model_says_pay(qwen35_mtp):
    """With the step costs of test_the_block_makes_as_many_drafts_a_step_as_pay and the
    block's passes timed at 0.1 s: once 32 drafts are checked, all kept, the block makes K a
    step; once they are seldom kept, it stops."""
    engine = LLM(str(qwen35_mtp), **SPEC).engine
    runner, block = engine.runner, engine.scheduler.proposer.model
    engine.step_cost = StepCost({1: 1.0, 2: 1.2, 3: 1.4, 4: 1.6})
    runner.mtp_seconds.observe(0.1)
    runner.mtp_chain_seconds.observe(0.1)
    runner.num_mtp_drafts = 1
    for _ in range(40):
        block.record_shadow(object(), True)
    engine._judge_the_model_drafter()
    assert (runner.num_mtp_drafts, runner.drafts_with_mtp) == (K, True)
    for _ in range(300):
        block.record_shadow(object(), False)
    engine._judge_the_model_drafter()
    assert not runner.drafts_with_mtp
