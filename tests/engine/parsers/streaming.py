"""Helpers to stream a reply in pieces and compare what it adds up to, ids aside."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import strategies as st

from pagoda.engine.parsers.tool_calls import ParsedReply, StreamDelta, ToolParser, join_deltas


def pieces(text: str, cuts: set[int]) -> list[str]:
    """text cut at the given positions (those inside it)."""
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(text)), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def cuts_of(text: str) -> st.SearchStrategy[set[int]]:
    return st.sets(st.integers(0, max(len(text), 1)), max_size=max(len(text), 1))


def stream(parser: ToolParser, chunks: list[str]) -> list[StreamDelta]:
    streamer = parser.streamer()
    return [*(streamer.feed(chunk) for chunk in chunks), streamer.finish()]


def streamed(parser: ToolParser, chunks: list[str]) -> ParsedReply:
    return join_deltas(stream(parser, chunks))


def shape(reply: ParsedReply) -> tuple[str | None, list[tuple[str, str]]]:
    """A reply without its random ids."""
    return reply.content, [(call.name, call.arguments) for call in reply.tool_calls]


@contextmanager
def warnings_logged(logger_name: str = "pagoda.engine.parsers") -> Iterator[list[logging.LogRecord]]:
    """The warnings the parsers log inside the block."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
