"""A stdio server's stdout as lines of JSON-RPC (pagoda/app/components/tools/mcp/stdio_streams.py): lines
split across reads, a line over the bound kept only by its ends, and the reply id read there so
that its caller is answered in words rather than left waiting."""

from __future__ import annotations

import mcp.types as mcp_types

from pagoda.app.components.tools.mcp.stdio_streams import (
    REPLY_TOO_LARGE,
    LineSplitter,
    OversizedLine,
    parsed,
    reply_id,
)


def test_lines_split_across_reads_come_out_whole():
    splitter = LineSplitter(max_bytes=100)
    assert splitter.feed(b'{"a"') == []
    assert splitter.feed(b': 1}\n{"b": 2}\n{"c"') == [b'{"a": 1}', b'{"b": 2}']
    assert splitter.feed(b": 3}\n") == [b'{"c": 3}']


def test_a_line_over_the_bound_keeps_only_its_size_and_ends_and_the_next_line_is_whole():
    splitter = LineSplitter(max_bytes=1000)
    pieces = [b'{"jsonrpc": "2.0", "id": 7, "result": "', *[b"x" * 300] * 10, b'"}\n{"ok": 1}\n']
    lines = [line for piece in pieces for line in splitter.feed(piece)]
    oversized, after = lines
    assert isinstance(oversized, OversizedLine)
    assert oversized.size == sum(len(p) for p in pieces) - len(b'\n{"ok": 1}\n')
    assert oversized.head.startswith(b'{"jsonrpc": "2.0", "id": 7,')
    assert oversized.tail.endswith(b'xx"}') and len(oversized.tail) == 256
    assert after == b'{"ok": 1}'


def test_a_replys_id_is_read_at_its_start_or_at_its_end():
    assert reply_id(OversizedLine(10**8, b'{"jsonrpc":"2.0","id":7,"result":{"content', b"")) == 7
    assert reply_id(OversizedLine(10**8, b'{"result":{"content":[{"text":"',
                                  b'xx"}]},"jsonrpc":"2.0","id":"a-1"}')) == "a-1"
    assert reply_id(OversizedLine(10**8, b'{"jsonrpc":"2.0","result":{"content":[',
                                  b'xx"}]},"id":8}')) == 8


def test_a_request_or_an_id_inside_the_text_is_not_taken_for_a_reply():
    request = OversizedLine(10**8, b'{"jsonrpc":"2.0","id":3,"method":"sampling/createMessage"',
                            b'"}}')
    assert reply_id(request) is None
    id_last = OversizedLine(10**8, b'{"jsonrpc":"2.0","method":"sampling/createMessage"',
                            b'"}},"id":3}')
    assert reply_id(id_last) is None
    quoted = OversizedLine(10**8, b'{"result":{"content":[{"text":"',
                           b'xx \\"id\\": 9}"}]}, "id": 4, "jsonrpc": "2.0"}')
    assert reply_id(quoted) is None


def test_a_reply_over_the_bound_answers_its_caller_with_its_size_in_words():
    notes: list[str] = []
    line = OversizedLine(40 * 1024 * 1024, b'{"jsonrpc":"2.0","id":5,"result":{', b"}}")
    message = parsed(line, 16 * 1024 * 1024, notes.append).message
    assert isinstance(message, mcp_types.JSONRPCError) and message.id == 5
    assert message.error.data == REPLY_TOO_LARGE
    assert message.error.message == ("the server's reply was 40.0 MiB, more than the 16 MiB "
                                     "Pagoda reads of one reply: it was not read")
    assert notes == []


def test_a_message_over_the_bound_that_is_no_reply_is_said_in_the_servers_log():
    notes: list[str] = []
    line = OversizedLine(20 * 1024 * 1024, b'{"jsonrpc":"2.0","method":"notifications/x"', b"}")
    assert parsed(line, 16 * 1024 * 1024, notes.append) is None
    assert notes == [("[pagoda] the server wrote a message of 20.0 MiB, more than the 16 MiB "
                      "Pagoda reads of one: it was not read")]


def test_a_line_that_is_not_json_rpc_is_said_in_the_servers_log():
    notes: list[str] = []
    assert isinstance(parsed(b"hello from a print()", 100, notes.append), Exception)
    assert notes == [("[pagoda] the server wrote a line that is not a JSON-RPC message: "
                      "hello from a print()")]
