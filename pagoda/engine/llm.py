"""`LLM`: offline batch generation in vLLM's shape."""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace

from tqdm import tqdm

from pagoda.engine.config import EngineConfig
from pagoda.engine.llm_engine import EngineStats, LLMEngine
from pagoda.engine.outputs import RequestOutput
from pagoda.engine.parsers.harmony import is_harmony_template
from pagoda.engine.parsers.harmony_frame import framed
from pagoda.engine.parsers.tool_use import ToolUse
from pagoda.engine.requests.constraints import one_constraint
from pagoda.engine.sampling.params import SamplingParams, response_format_constraint
from pagoda.engine.text.chat_template import Message, encode_chat, is_conversation

Prompt = str | list[int]


class LLM:
    """`LLM()` loads the default model; `LLM("path/to/model", max_num_seqs=32)` another.

    Keyword arguments are EngineConfig fields.
    """

    def __init__(self, model: str | os.PathLike | None = None, **engine_kwargs) -> None:
        self.engine = LLMEngine(None if model is None else str(model), EngineConfig(**engine_kwargs))
        self._ids = itertools.count()

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> LLM:
        """Wrap an engine that is already built (e.g. one sharing loaded weights)."""
        llm = cls.__new__(cls)
        llm.engine = engine
        llm._ids = itertools.count()
        return llm

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        return self._run(list(prompts), params, use_tqdm)

    def chat(self, messages: Sequence[Message] | Sequence[Sequence[Message]],
             params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = False, *, tools: Sequence[Mapping] | None = None,
             response_format: Mapping | None = None,
             chat_template_kwargs: Mapping | None = None) -> RequestOutput | list[RequestOutput]:
        """One conversation gives one output; a list of conversations gives a list. `tools`
        (OpenAI's function definitions) go into each prompt as the model's template takes them
        (pagoda/engine/text/tool_prompt.py); the replies are text, parsed by pagoda.engine.parsers.
        `response_format` (OpenAI's) constrains every reply, as
        SamplingParams.structured_outputs does (a harmony model's final message, inside its
        frame: pagoda/engine/parsers/harmony_frame.py)."""
        if not messages:
            raise ValueError("chat() needs messages: a conversation (a list of role/content "
                             "messages) or a list of conversations")
        single = is_conversation(messages)
        conversations = [messages] if single else list(messages)
        prompts = [encode_chat(self.tokenizer, c, tools=tools,
                               template_kwargs=chat_template_kwargs) for c in conversations]
        if response_format is not None:
            harmony = is_harmony_template(self.tokenizer.chat_template or "")
            params = _with_response_format(params, response_format, len(prompts), harmony)
        outputs = self._run(prompts, params, use_tqdm)
        return outputs[0] if single else outputs

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def _run(self, prompts: list[Prompt], params, use_tqdm: bool) -> list[RequestOutput]:
        params_list = _broadcast_params(params, len(prompts))
        ids = []
        try:
            for prompt, p in zip(prompts, params_list, strict=True):
                request_id = f"llm-{next(self._ids)}"
                self.engine.add_request(request_id, prompt, p)
                ids.append(request_id)
            return self._drain(ids, use_tqdm)
        finally:
            for request_id in ids:
                self.engine.abort_request(request_id)

    def _drain(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        with tqdm(total=len(ids), disable=not use_tqdm, desc="generating") as bar:
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.finished:
                        finished[out.request_id] = out
                        bar.update(1)
        return [finished[i] for i in ids]


def _with_response_format(params, response_format: Mapping, n: int,
                          harmony: bool) -> list[SamplingParams]:
    constraint = response_format_constraint(response_format)
    if harmony and constraint is not None:
        constraint = framed(constraint, ToolUse("none", None))
    given = _broadcast_params(params, n)
    sources = (("response_format", constraint is not None),
               ("SamplingParams.structured_outputs",
                any(p.structured_outputs is not None for p in given)))
    one_constraint([name for name, constrains in sources if constrains])
    return [replace(p, structured_outputs=constraint) if constraint else p for p in given]


def _broadcast_params(params, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams() for _ in range(n)]
    if isinstance(params, SamplingParams):
        return [params] * n
    params = list(params)
    if len(params) != n:
        raise ValueError(f"got {len(params)} SamplingParams for {n} prompts: give one or one each")
    return params
