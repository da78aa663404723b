"""Responses kept in the server's memory for GET /v1/responses/{id} and previous_response_id:
a count cap, the oldest dropped first. Never written to disk, nor to the app's chats."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from pagoda.engine.server.errors import APIError
from pagoda.engine.server.protocol import ChatMessage

# How many responses are kept. Each holds its conversation, which fits the model's context (a
# longer one would not have been answered), so the cap bounds the memory.
DEFAULT_MAX_STORED = 512


@dataclass(slots=True, frozen=True)
class StoredResponse:
    body: dict  # the response object, as returned
    conversation: tuple[ChatMessage, ...]  # its input and output, as the next turn's history


class ResponseStore:
    def __init__(self, max_stored: int = DEFAULT_MAX_STORED) -> None:
        self._max = max_stored
        self._responses: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._responses)

    def put(self, response: StoredResponse) -> None:
        self._responses[response.body["id"]] = response
        while len(self._responses) > self._max:
            self._responses.popitem(last=False)

    def get(self, response_id: str, param: str | None = None) -> StoredResponse:
        stored = self._responses.get(response_id)
        if stored is None:
            raise self._not_found(response_id, param)
        return stored

    def delete(self, response_id: str) -> None:
        if self._responses.pop(response_id, None) is None:
            raise self._not_found(response_id, None)

    def _not_found(self, response_id: str, param: str | None) -> APIError:
        return APIError(404, f"Response with id {response_id!r} not found: this server keeps "
                             f"the last {self._max} responses made with store=true, in memory, "
                             "until it stops", param=param, code="response_not_found")
