"""What the engine in this process is asked for one reply: the sampling, the tools for the
prompt and how its reply is read (pagoda.engine.parsers, as Pagoda's server reads it), the constraint
from the reply format or from a tool_choice that forces a call."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pagoda.app.backends.errors import InvalidRequestError, clause
from pagoda.app.backends.tool_options import refused_in_words, tool_use
from pagoda.app.backends.types import ReplyFormat, SamplingOptions
from pagoda.engine import SamplingParams
from pagoda.engine.parsers.tool_use import ToolUse
from pagoda.engine.requests.tools import tools_constraint
from pagoda.engine.sampling.fields import sampling_values
from pagoda.engine.sampling.params import StructuredOutputsParams


@dataclass(slots=True, frozen=True)
class LocalRequest:
    """`params` with its constraint; `use` the tools for the prompt and the reply's reading;
    `constrained_by` names what the constraint comes from, to say which setting cannot be
    followed (None: no constraint)."""

    params: SamplingParams
    use: ToolUse
    constrained_by: str | None
    enable_thinking: bool | None = None


def local_request(options: SamplingOptions) -> LocalRequest:
    """InvalidRequestError, in words naming the setting, for what the engine cannot take."""
    use = tool_use(options)
    params = sampling_params(options)
    thinking = options.enable_thinking
    with refused_in_words():
        tools = tools_constraint(use)
    if tools is not None:
        return LocalRequest(replace(params, structured_outputs=tools[1]), use,
                            "the parameters of this chat's tools", thinking)
    if options.reply_format is not None:
        constraint = _constraint(options.reply_format)
        return LocalRequest(replace(params, structured_outputs=constraint), use,
                            "this chat's reply format", thinking)
    return LocalRequest(params, use, None, thinking)


def sampling_params(options: SamplingOptions) -> SamplingParams:
    try:
        return SamplingParams(**sampling_values(options), max_tokens=options.max_tokens,
                              seed=options.seed, stop=list(options.stop))
    except ValueError as exc:
        raise InvalidRequestError(f"This chat's sampling settings are invalid: {clause(exc)}.") from exc


def _constraint(reply_format: ReplyFormat) -> StructuredOutputsParams:
    try:
        if reply_format.schema is None:
            return StructuredOutputsParams(json_object=True)
        return StructuredOutputsParams(json=reply_format.schema)
    except ValueError as exc:
        raise InvalidRequestError(f"This chat's reply format cannot be used: {clause(exc)}.") from exc
