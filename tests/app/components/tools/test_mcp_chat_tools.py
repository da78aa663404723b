"""A chat's tools from a real MCP server (tests/app/components/tools/mcp_test_server.py over stdio,
through McpHub): the turn's calls reach the server, its results and failures go back to the
model, and Settings → Tools (kept in the store) decides which servers run and what always runs."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from pagoda.app.backends import ToolCallRecord
from pagoda.app.components.chat.chat_session import ChatSession
from pagoda.app.components.tools import McpHub, McpServerConfig, ToolConfigError
from pagoda.app.components.tools.chat_tools import McpChatTools
from pagoda.app.components.tools.settings import (
    SETTING,
    ToolSettings,
    ToolSettingsModel,
    settings_from,
)
from tests.app.components.fake_backend import WAIT_S, eventually
from tests.app.components.fake_tools import answer

TEST_SERVER = str(Path(__file__).with_name("mcp_test_server.py"))


def stdio_server(name: str = "calc") -> McpServerConfig:
    return McpServerConfig(name, command=sys.executable, args=(TEST_SERVER,))


@pytest.fixture
def hub() -> Iterator[McpHub]:
    opened = McpHub(start_timeout_s=30.0)
    yield opened
    opened.close()


@pytest.fixture
def saved(store) -> list[dict]:
    return []


@pytest.fixture
def tool_settings(hub, store, saved) -> ToolSettingsModel:
    def save(value: dict) -> None:
        saved.append(value)
        store.set_setting(SETTING, value)
    return ToolSettingsModel(save, hub.configure, ToolSettings(servers=(stdio_server(),)))


async def open_tool_chat(store, db, source, view, hub, tool_settings,
                         selectors=("calc",)) -> ChatSession:
    cid = store.create_conversation().id
    session = ChatSession(cid, db, source, view, tools=McpChatTools(hub, tool_settings))
    await session.open()
    await session.save_settings(replace(session.settings, tools=selectors))
    return session


async def asked(session: ChatSession, call_id: str) -> None:
    await eventually(lambda: any(c.id == call_id and c.state == "asking"
                                 for v in session.views for c in v.tool_calls), "the question")


@pytest.mark.slow
async def test_a_call_reaches_the_mcp_server_and_its_result_the_model(store, db, source, view,
                                                                      backend, hub,
                                                                      tool_settings):
    session = await open_tool_chat(store, db, source, view, hub, tool_settings)
    task = session.spawn(session.send("What is 20 + 22?"))
    first = await asyncio.wait_for(backend.next_request(), 30)
    names = [spec.name for spec in first.options.tools]
    assert {"add", "echo", "fail"} <= set(names)
    add = next(spec for spec in first.options.tools if spec.name == "add")
    assert add.description == "Add two integers." and "a" in add.parameters["properties"]
    await first.call_tools(ToolCallRecord("c1", "add", '{"a": 20, "b": 22}'))
    await asked(session, "c1")
    assert session.views[-1].tool_calls[0].server == "calc"
    answer(session, "c1", "run")
    second = await asyncio.wait_for(backend.next_request(), 30)
    assert (second.messages[-1].role, second.messages[-1].content) == ("tool", "42")
    await second.say("42.", "stop")
    await asyncio.wait_for(task, WAIT_S)


@pytest.mark.slow
async def test_a_failing_tool_and_bad_arguments_are_told_to_the_model(store, db, source, view,
                                                                      backend, hub,
                                                                      tool_settings):
    tool_settings.allow_always("calc/fail")
    tool_settings.allow_always("calc/add")
    session = await open_tool_chat(store, db, source, view, hub, tool_settings)
    task = session.spawn(session.send("break things"))
    first = await asyncio.wait_for(backend.next_request(), 30)
    await first.call_tools(ToolCallRecord("c1", "fail", "{}"),
                           ToolCallRecord("c2", "add", '{"a": 1'),
                           ToolCallRecord("c3", "nope", "{}"))
    await eventually(lambda: any(c.id == "c3" and c.state == "asking" for v in session.views
                                 for c in v.tool_calls), "the unknown tool's question")
    answer(session, "c3", "run")
    second = await asyncio.wait_for(backend.next_request(), 30)
    results = [m.content for m in second.messages if m.role == "tool"]
    assert "it failed on purpose" in results[0]
    assert "not JSON" in results[1]
    assert "no tool named 'nope'" in results[2]
    await second.finish()
    await asyncio.wait_for(task, WAIT_S)
    path = await db.current_path(session.conversation_id)
    assert [m.finish_reason for m in path if m.role == "tool"] == ["failed"] * 3


@pytest.mark.slow
async def test_a_server_that_cannot_start_leaves_the_chat_without_its_tools(store, db, source,
                                                                            view, backend, hub,
                                                                            tool_settings):
    tool_settings.add_servers([McpServerConfig("ghost", command="/no/such/mcp-server")])
    session = await open_tool_chat(store, db, source, view, hub, tool_settings,
                                   selectors=("ghost",))
    task = session.spawn(session.send("hello"))
    request = await asyncio.wait_for(backend.next_request(), 30)
    assert request.options.tools == ()
    assert "/no/such/mcp-server" in view.notices[-1] and "left out" in view.notices[-1]
    assert hub.status("ghost").state == "failed"
    await request.finish()
    await asyncio.wait_for(task, WAIT_S)


def test_tool_settings_are_kept_in_the_store_and_read_back(hub, store, tool_settings, saved):
    tool_settings.change(max_calls_per_turn=3, call_timeout_s=30.0)
    tool_settings.allow_always("calc/add")
    again = settings_from(store.get_setting(SETTING))
    assert again == tool_settings.settings
    assert again.servers[0].args == (TEST_SERVER,)
    assert len(saved) == 2


def test_settings_that_cannot_be_used_are_refused_in_words_and_change_nothing(tool_settings):
    before = tool_settings.settings
    with pytest.raises(ToolConfigError, match="1 to 64 tool calls"):
        tool_settings.change(max_calls_per_turn=0)
    with pytest.raises(ToolConfigError, match="named 'calc'"):
        tool_settings.change(servers=(stdio_server(), stdio_server()))
    assert tool_settings.settings == before


def test_removing_a_server_stops_it_and_forgets_what_always_ran(hub, tool_settings):
    tool_settings.allow_always("calc/add")
    tool_settings.remove_server("calc")
    assert hub.configs() == [] and tool_settings.settings.always_allowed == frozenset()


def test_damaged_stored_settings_fall_back_to_the_defaults():
    assert settings_from({"mcpServers": "{not json", "max_calls_per_turn": "many"}) == \
        ToolSettings()
    assert settings_from(None) == ToolSettings()
