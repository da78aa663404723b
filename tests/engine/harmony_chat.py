"""A small tokenizer with harmony's special tokens and a chat template in harmony's frames, for
the tests of gpt-oss's chat format (its real tokenizer, o200k_harmony, is not to be had here).

The tokenizer is byte-level with one token per byte and no merges, then the special tokens as
gpt-oss's tokenizer adds them (whole tokens, kept in the text with skip_special_tokens=False).
The template is ours, written to the format (not gpt-oss's own): a system message that says the
reasoning effort, as gpt-oss's template does from its `reasoning_effort` variable, the tools in a
developer message, past calls to the commentary channel after their reasoning (read from
`thinking`, as gpt-oss's template reads it), and `<|start|>assistant` to open the reply."""

from __future__ import annotations

import functools

import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SPECIAL_TOKENS = ("<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>",
                  "<|constrain|>", "<|return|>", "<|call|>")
# The tokens that end a reply (gpt-oss's generation config lists these three).
STOP_TOKENS = ("<|return|>", "<|call|>", "<|endoftext|>")

HARMONY_TEMPLATE = (
    "<|start|>system<|message|>You are a test model.\n"
    "Reasoning: {{ reasoning_effort | default('medium') }}\n"
    "# Valid channels: analysis, commentary, final.<|end|>"
    "{%- if tools %}<|start|>developer<|message|># Tools"
    "{%- for tool in tools %}{{ '\\n' + tool.function.name }}: "
    "{{ tool.function.parameters | tojson }}{%- endfor %}<|end|>{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}"
    "{%- if message.thinking %}<|start|>assistant<|channel|>analysis<|message|>"
    "{{ message.thinking }}<|end|>{%- endif %}"
    "{%- for call in message.tool_calls %}<|start|>assistant to=functions."
    "{{ call.function.name }}<|channel|>commentary json<|message|>"
    "{{ call.function.arguments | tojson }}<|call|>{%- endfor %}"
    "{%- elif message.role == 'assistant' %}"
    "<|start|>assistant<|channel|>final<|message|>{{ message.content }}<|end|>"
    "{%- elif message.role == 'tool' %}"
    "<|start|>functions.tool to=assistant<|channel|>commentary<|message|>"
    "{{ message.content }}<|end|>"
    "{%- else %}<|start|>{{ message.role }}<|message|>{{ message.content }}<|end|>{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|start|>assistant{%- endif %}")


@functools.cache
def harmony_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """Built in memory (no files), once per session."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={char: i for i, char in enumerate(alphabet)},
                                   merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|return|>", pad_token="<|endoftext|>",
        chat_template=HARMONY_TEMPLATE)
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS)})
    return tokenizer


def stop_token_ids() -> list[int]:
    return harmony_tokenizer().convert_tokens_to_ids(list(STOP_TOKENS))
