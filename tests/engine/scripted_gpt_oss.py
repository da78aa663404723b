"""A tiny gpt-oss (tests/engine/tiny_models.py's variant) whose weights are set so that greedy
decoding writes one harmony reply: its analysis, then its final answer, in gpt-oss's frames
with their special tokens, whatever the user asked. For the tests of the window's path from a
real gpt-oss model to its thinking block; harmony's tokenizer and template are
tests/engine/harmony_chat.py's, with the reply's words as whole tokens.

How it is set: every layer adds nothing to the residual (zero outputs) but the first, whose
window of two keys (the token before and itself) and zero queries and keys average the two
tokens' values, so the residual holds the token and its predecessor. The LM head reads that
pair: a lookup of the next token from the last two. Two tokens say which frame comes next:
`<|channel|>` opens the analysis after the prompt's end and the final answer after `<|end|>`
(the role implied, as harmony allows); `<|message|>` opens the analysis's text after
"analysis" and the answer after "final"."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from tests.engine.harmony_chat import STOP_TOKENS, harmony_tokenizer
from tests.engine.tiny_models import tiny_config

ANALYSIS, FINAL = "Two plus three makes five.", "It is 5."
# The reply, after the prompt's last two tokens (the "n" and "t" of `<|start|>assistant`).
REPLY = ("<|channel|>", "analysis", "<|message|>", ANALYSIS, "<|end|>",
         "<|channel|>", "final", "<|message|>", FINAL, "<|return|>")
_PROMPT_END = ("n", "t")
_WORDS = ("analysis", "final", ANALYSIS, FINAL)
_SLOT = 8.0  # a token's embedding: SLOT at its own dimension (an RMS of 1 over 64)
_COPY = 16  # where the first layer writes the pair's average
_MARGIN = 10.0


def save_scripted_gpt_oss(path: Path) -> Path:
    """The model and its tokenizer saved as an HF folder at path; returns path."""
    path.mkdir(parents=True, exist_ok=True)
    harmony_tokenizer().save_pretrained(path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer.add_tokens(list(_WORDS))
    tokenizer.save_pretrained(path)
    stops = tokenizer.convert_tokens_to_ids(list(STOP_TOKENS))
    config = tiny_config("gpt-oss", vocab_size=len(tokenizer))
    config.sliding_window = 2
    config.bos_token_id, config.eos_token_id, config.pad_token_id = None, stops, stops[-1]
    model = transformers.GptOssForCausalLM(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        _set_weights(model, tokenizer)
    model.save_pretrained(path)
    transformers.GenerationConfig(eos_token_id=stops, pad_token_id=stops[-1]).save_pretrained(
        path)
    return path


def _set_weights(model: transformers.GptOssForCausalLM, tokenizer) -> None:
    ids = tokenizer.convert_tokens_to_ids
    sequence = [ids(t) for t in (*_PROMPT_END, *REPLY)]
    slots = {token: slot for slot, token in enumerate(dict.fromkeys(sequence[:-1]))}
    hidden = model.config.hidden_size
    assert len(slots) <= _COPY and _COPY + len(slots) <= hidden
    generator = torch.Generator().manual_seed(0)
    embedding = model.model.embed_tokens.weight
    # Other tokens (the prompt's) live apart, where the LM head does not read.
    embedding[:, hidden // 2:] = torch.randn(embedding.shape[0], hidden // 2,
                                             generator=generator) * 2 ** 0.5
    for token, slot in slots.items():
        embedding[token].zero_()
        embedding[token, slot] = _SLOT
    for layer in model.model.layers:
        layer.input_layernorm.weight.fill_(1.0)
        layer.post_attention_layernorm.weight.fill_(1.0)
        layer.self_attn.sinks.fill_(-30.0)
    model.model.norm.weight.fill_(1.0)
    first = model.model.layers[0].self_attn
    for slot in slots.values():  # key-value head 0 carries the slots; query head 0 reads it
        first.v_proj.weight[slot, slot] = 1.0
        first.o_proj.weight[_COPY + slot, slot] = 1.0
    head = model.lm_head.weight
    for before, token, after in zip(sequence, sequence[1:], sequence[2:], strict=False):
        head[after, slots[token]] = _MARGIN
        head[after, _COPY + slots[before]] = _MARGIN
