"""A request's reasoning budget (SamplingParams.thinking_token_budget): at most N tokens of
reasoning, after which the engine writes the end of the reasoning itself, token by token, and
the model goes on with its answer.

Reasoning opens where the prompt ends inside it (a template that ends with `<think>`), or where
the reply writes the opening marker: at its very start for the `<think>` families, before any
message for harmony's analysis channel, which may open again later in the same reply. It closes
where the model writes the closing marker. Markers are found in the tokens' text, not their ids:
a model may spell `</think>` in other tokens than the tokenizer would. The tokens of a marker
are not reasoning; every other token between the markers counts, so a reply reasons N tokens
and then closes. The one exception: tokens whose text may begin the closing marker (`</`) are
counted once they turn out not to, and so are tokens that write part of a character (bytes of
its UTF-8), once it is whole; where the budget runs out on such text the reasoning may run over
by those few tokens (fewer than the marker has characters), rather than a closing the model had
begun being cut or a character broken.

Plain Python, no tensors: the worker asks which token, if any, each sampled position must be
(`forced_tokens`), and allows only that one there (pagoda/engine/worker/logits_controls.py)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, replace


@dataclass(slots=True, frozen=True)
class ReasoningMarkers:
    """How a model's reasoning opens and closes, as text. `closing` is what the engine writes to
    close it (the closing marker, with what the model's template writes around it);
    `reopens`: a later marker opens reasoning again (harmony), else only the reply's start can
    (a later `<think>` is the answer's text)."""

    opening: str
    closing_marker: str
    closing: str
    reopens: bool = False

    def opened_by(self, prompt_tail: str) -> bool:
        """Whether a prompt ending with `prompt_tail` (its last tokens' text, special tokens
        kept) leaves the reply inside the reasoning."""
        return prompt_tail.rstrip().endswith(self.opening)

    def closing_ids(self, encode: Callable[[str], list[int]]) -> list[int]:
        """`closing` as the tokenizer writes it after other text (`encode`: text to ids, no
        special tokens added): alone, a SentencePiece tokenizer would begin it with a space."""
        before = encode(_TEXT_BEFORE)
        after = encode(_TEXT_BEFORE + self.closing)
        if after[:len(before)] == before and len(after) > len(before):
            return after[len(before):]
        return encode(self.closing)


# Any text that ends with a word: what `closing` is tokenized after.
_TEXT_BEFORE = "so"


class _Phase(enum.Enum):
    AT_START = enum.auto()  # the reply's start, which may open the reasoning
    OUTSIDE = enum.auto()  # not reasoning; a later opening marker counts (harmony)
    REASONING = enum.auto()
    FORCING = enum.auto()  # writing the closing tokens
    DONE = enum.auto()  # nothing more to watch


@dataclass(slots=True, frozen=True)
class _Scan:
    """Where a reply stands after some tokens: `text` is what a marker may still complete,
    `spent` the reasoning tokens so far, `pending` those after them that may be the start of
    the closing marker or write part of a character (`unfinished`, its bytes so far),
    `written` the closing tokens forced so far."""

    phase: _Phase
    text: str = ""
    spent: int = 0
    pending: int = 0
    unfinished: bytes = b""
    written: int = 0


class ReasoningBudget:
    """One request's budget over its reply. `closing_ids`: `markers.closing` as the model's
    tokenizer writes it after reasoning text; `token_bytes`: the bytes one token stands for
    (markers are ASCII, so a token's own text holds whatever part of a marker it writes)."""

    def __init__(self, budget: int, markers: ReasoningMarkers, closing_ids: list[int], *,
                 opened: bool, token_bytes: Callable[[int], bytes]) -> None:
        assert closing_ids, "the closing text has tokens"
        self.budget = budget
        self._markers = markers
        self._closing_ids = closing_ids
        self._token_bytes = token_bytes
        self._first = self._open(_Scan(_Phase.REASONING), "") if opened else \
            _Scan(_Phase.OUTSIDE if markers.reopens else _Phase.AT_START)
        self._scan = self._first
        self._scanned = 0  # the output tokens `_scan` has read

    def forced_tokens(self, output: list[int], drafts: list[int]) -> list[int | None]:
        """For each position that samples (after `output`, then after each draft), the token
        the budget writes there; None where the model picks."""
        if len(output) < self._scanned:  # never expected: the output only grows
            self._scan, self._scanned = self._first, 0
        for token in output[self._scanned:]:
            self._scan = self._step(self._scan, token)
        self._scanned = len(output)
        scan = self._scan
        forced = [self._forced(scan)]
        for token in drafts:
            scan = self._step(scan, token)
            forced.append(self._forced(scan))
        return forced

    def _forced(self, scan: _Scan) -> int | None:
        return self._closing_ids[scan.written] if scan.phase is _Phase.FORCING else None

    def _step(self, scan: _Scan, token: int) -> _Scan:
        if scan.phase is _Phase.DONE:
            return scan
        if scan.phase is _Phase.FORCING:
            written = scan.written + 1
            if written < len(self._closing_ids):
                return replace(scan, written=written)
            return self._closed(scan, "")
        raw = self._token_bytes(token)
        text = scan.text + _text(raw)
        if scan.phase is _Phase.AT_START:
            return self._at_start(scan, text)
        if scan.phase is _Phase.OUTSIDE:
            return self._outside(scan, text)
        return self._reasoning(scan, text, _unfinished_char(scan.unfinished + raw))

    def _at_start(self, scan: _Scan, text: str) -> _Scan:
        opening = self._markers.opening
        written = text.lstrip()
        if written.startswith(opening):
            return self._open(scan, written[len(opening):])
        if opening.startswith(written):
            return replace(scan, text=text)
        return _Scan(_Phase.DONE)

    def _outside(self, scan: _Scan, text: str) -> _Scan:
        before, found, after = text.partition(self._markers.opening)
        if found:
            return self._open(scan, after)
        return replace(scan, text=_tail(before, self._markers.opening))

    def _open(self, scan: _Scan, text: str) -> _Scan:
        """Reasoning opens with `text` written after its marker (by the same token)."""
        opened = replace(scan, phase=_Phase.REASONING, text="", pending=0, unfinished=b"")
        if self._markers.closing_marker in text:
            return self._reasoning(opened, text, b"")  # closed by the same token
        if opened.spent >= self.budget:
            return self._forcing(opened, text)
        return replace(opened, text=text)

    def _reasoning(self, scan: _Scan, text: str, unfinished: bytes) -> _Scan:
        """`unfinished`: the reasoning's last bytes where they begin a character that later
        tokens finish."""
        marker = self._markers.closing_marker
        _, closed, after = text.partition(marker)
        if closed:
            return self._closed(scan, after)
        tail = _tail(text, marker)
        waits = _ends_with_start_of(tail, marker) or unfinished
        if waits and scan.pending < len(marker) - 1:
            # Not counted yet: the model may be closing its reasoning, which no budget cuts,
            # or be halfway through a character, which the closing would break (for at most
            # as many tokens as the marker could take: "<<<<" never ends).
            return replace(scan, text=tail, pending=scan.pending + 1, unfinished=unfinished)
        spent = scan.spent + scan.pending + 1
        if spent >= self.budget:
            return self._forcing(replace(scan, spent=spent, pending=0), text)
        return replace(scan, spent=spent, pending=0, text=tail, unfinished=unfinished)

    def _forcing(self, scan: _Scan, text: str) -> _Scan:
        """The budget is spent after `text`: the closing begins, without its leading line
        break where the reasoning has just written one."""
        first = _text(self._token_bytes(self._closing_ids[0]))
        skip = len(self._closing_ids) > 1 and first.isspace() and text.endswith(first)
        return replace(scan, phase=_Phase.FORCING, text="", unfinished=b"", written=int(skip))

    def _closed(self, scan: _Scan, after: str) -> _Scan:
        if not self._markers.reopens:
            return _Scan(_Phase.DONE)
        return self._outside(replace(scan, phase=_Phase.OUTSIDE, text="", written=0), after)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def _unfinished_char(raw: bytes) -> bytes:
    """The bytes at the end of `raw` that begin a UTF-8 character not yet complete."""
    for back in range(1, min(len(raw), 4) + 1):
        byte = raw[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: its lead is further back
            continue
        length = 2 if 0xC0 <= byte < 0xE0 else 3 if 0xE0 <= byte < 0xF0 else \
            4 if 0xF0 <= byte < 0xF8 else 1
        return raw[-back:] if length > back else b""
    return b""


def _ends_with_start_of(text: str, marker: str) -> bool:
    return any(marker.startswith(text[-size:])
               for size in range(1, min(len(text), len(marker) - 1) + 1))


def _tail(text: str, marker: str) -> str:
    """The end of `text` that the next token could complete into `marker`."""
    return text[len(text) - len(marker) + 1:] if len(text) >= len(marker) else text
