"""The end of a list of calls where the model starts over: under tool_choice "required" the
reply is a JSON list of calls (pagoda/engine/parsers/listed_calls.py), and a small model, having
written its call, often writes the same call again until max_tokens. A call written a second
time, character for character, ends the reply after the calls before it.

The guard reads the reply's text as it comes and passes on what is safe to send: a call that
begins as an earlier one did is held back (with the comma before it) until it differs from
every earlier call, so a repeat is never sent, not even in part."""

from __future__ import annotations

from pagoda.engine.parsers.json_call import JsonValueScanner


class RepeatedCallGuard:
    def __init__(self) -> None:
        self.repeated = False
        self._in_list = False
        self._calls: list[str] = []  # the complete calls so far, as written
        self._call: JsonValueScanner | None = None  # the call being written
        self._held = ""  # text not yet passed on: a separator and a call like an earlier one
        self._holding = False

    def feed(self, text: str) -> str:
        """What of `text` may be passed on now ("" once the reply has repeated a call, and
        "]" closing the list at the repeat)."""
        passed = []
        for char in text:
            if self.repeated:
                break
            passed.append(self._step(char))
        return "".join(passed)

    def flush(self) -> str:
        """What is held when the reply ends without closing its list (max_tokens)."""
        return "" if self.repeated else self._release("")

    def cut(self, text: str) -> str:
        """A whole reply, ended before its first repeated call (as `feed` would pass it)."""
        return self.feed(text) + self.flush()

    def _step(self, char: str) -> str:
        if self._call is None:
            return self._between_calls(char)
        self._call.consume(char)
        if self._call.broken:  # not JSON after all: nothing to guard
            self._call, self._in_list = None, False
            return self._release(char)
        passed = self._in_call(char)
        if self._call.done:
            return passed + self._call_written()
        return passed

    def _between_calls(self, char: str) -> str:
        if not self._in_list:
            self._in_list = char == "["
            return char
        if char == "{":
            self._call = JsonValueScanner()
            self._call.consume(char)
            self._holding = bool(self._calls)
            return self._in_call(char)
        if char == "]":
            self._in_list = False
            return self._release(char)
        if self._calls:  # the comma and white space after a call: held with what follows
            self._held += char
            return ""
        return char

    def _in_call(self, char: str) -> str:
        if not self._holding:
            return char
        self._held += char
        if any(call.startswith(self._call.raw) for call in self._calls):
            return ""
        self._holding = False
        return self._release("")

    def _call_written(self) -> str:
        """A call's last character read: held to here, it is an earlier call written again."""
        written, self._call = self._call.raw, None
        if self._holding and written in self._calls:
            self.repeated = True
            self._held = ""
            return "]"
        self._calls.append(written)
        return ""

    def _release(self, char: str) -> str:
        held, self._held = self._held, ""
        return held + char
