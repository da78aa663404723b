"""The tool parsers by name, and the one a chat template's syntax calls for."""

from __future__ import annotations

from pagoda.engine.errors import PagodaError
from pagoda.engine.parsers.hermes import HermesToolParser
from pagoda.engine.parsers.llama3_json import Llama3JsonToolParser
from pagoda.engine.parsers.mistral import MistralToolParser
from pagoda.engine.parsers.tool_calls import ToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    parser.name: parser for parser in (HermesToolParser, Llama3JsonToolParser, MistralToolParser)
}


class UnknownToolParserError(PagodaError, ValueError):
    """A tool parser was asked for by a name no family has."""


def tool_parser(name: str) -> ToolParser:
    """The tool parser called name ("hermes", "llama3_json", "mistral")."""
    parser = TOOL_PARSERS.get(name)
    if parser is None:
        raise UnknownToolParserError(
            f"unknown tool parser {name!r}: choose one of {', '.join(sorted(TOOL_PARSERS))}")
    return parser()


def tool_parser_for_template(chat_template: str) -> ToolParser | None:
    """The parser for the tool-call syntax a chat template teaches its model; None when the
    template shows none of the families' markers."""
    if "<tool_call>" in chat_template:
        return HermesToolParser()
    if "[TOOL_CALLS]" in chat_template:
        return MistralToolParser()
    if "<|python_tag|>" in chat_template or _teaches_llama3_json(chat_template):
        return Llama3JsonToolParser()
    return None


def _teaches_llama3_json(chat_template: str) -> bool:
    # Llama 3.2's template has no python tag: it asks for {"name": ..., "parameters": ...} and
    # answers with the ipython role, ending turns with <|eot_id|>.
    llama3 = "<|eot_id|>" in chat_template or "ipython" in chat_template
    return llama3 and '"parameters"' in chat_template
