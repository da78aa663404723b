"""The one worker thread that reads files into Documents, for every chat: the files attached in
the composer and those of a chat's folders, one at a time (a 200-page PDF is CPU work)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

_executor: ThreadPoolExecutor | None = None


def reading_thread() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagoda-documents")
    return _executor
