"""Tool calls get ids in OpenAI's shape, a new one for every call."""

from __future__ import annotations

import re

from pagoda.engine.parsers.registry import tool_parser
from pagoda.engine.parsers.tool_calls import new_tool_call_id
from tests.engine.parsers.recorded_replies import HERMES


def test_ids_look_like_openai_ids():
    assert re.fullmatch(r"call_[A-Za-z0-9]{24}", new_tool_call_id())


def test_every_call_gets_its_own_id():
    calls = tool_parser("hermes").parse(HERMES["qwen2.5_two_calls_after_text"].text).tool_calls
    assert len({call.id for call in calls}) == len(calls) == 2
    assert all(re.fullmatch(r"call_[A-Za-z0-9]{24}", call.id) for call in calls)
