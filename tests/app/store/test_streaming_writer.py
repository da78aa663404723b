"""The throttled writer: on disk from the first token, at most twice a second, always at the end."""

from itertools import pairwise

import pytest

from pagoda.app.store import ConversationStore, GenerationStats, StoreError, StreamingWriter


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class RecordingStore:
    """Wraps a real store and notes the time of every streaming flush."""

    def __init__(self, store: ConversationStore, clock: FakeClock) -> None:
        self.store = store
        self.clock = clock
        self.flush_times: list[float] = []

    def update_streaming(self, mid: int, content: str, reasoning: str | None = None) -> None:
        self.flush_times.append(self.clock())
        self.store.update_streaming(mid, content, reasoning)

    def __getattr__(self, name: str):
        return getattr(self.store, name)


@pytest.fixture
def reply(store: ConversationStore):
    cid = store.create_conversation().id
    store.append_user_message(cid, "tell me a story")
    return store.start_assistant_message(cid)


def test_first_token_is_written_at_once(store: ConversationStore, reply) -> None:
    writer = StreamingWriter(store, reply.id, clock=FakeClock())
    writer.append("Once")
    assert store.get_message(reply.id).content == "Once"


def test_flushes_at_most_twice_per_second(store: ConversationStore, reply) -> None:
    clock = FakeClock()
    recorder = RecordingStore(store, clock)
    writer = StreamingWriter(recorder, reply.id, clock=clock)
    for i in range(300):  # 3 seconds of tokens every 10 ms
        clock.now = i * 0.01
        writer.append(f"t{i} ")
    gaps = [b - a for a, b in pairwise(recorder.flush_times)]
    assert all(gap >= 0.5 - 1e-9 for gap in gaps)
    assert 6 <= len(recorder.flush_times) <= 7
    assert store.get_message(reply.id).content == writer.flushed_text


def test_finish_always_writes_the_full_text_and_stats(store: ConversationStore, reply) -> None:
    clock = FakeClock()
    writer = StreamingWriter(store, reply.id, clock=clock)
    writer.append("Once")
    writer.append(" upon a time")  # same instant: not flushed yet
    assert store.get_message(reply.id).content == "Once"
    writer.finish("stop", GenerationStats(ttft_s=0.1), completion_tokens=4)
    done = store.get_message(reply.id)
    assert (done.content, done.status, done.completion_tokens) == (
        "Once upon a time",
        "complete",
        4,
    )
    assert writer.flushed_text == "Once upon a time"


def test_interrupt_and_fail_write_the_text_so_far(store: ConversationStore, reply) -> None:
    writer = StreamingWriter(store, reply.id, clock=FakeClock())
    writer.append("Once")
    writer.append(" upon")
    writer.interrupt()
    assert store.get_message(reply.id).content == "Once upon"
    assert store.get_message(reply.id).status == "interrupted"
    again = store.regenerate(reply.id)
    failing = StreamingWriter(store, again.id, clock=FakeClock())
    failing.append("Tw")
    failing.append("ice")
    failing.fail("engine crashed")
    assert (store.get_message(again.id).content, store.get_message(again.id).error) == (
        "Twice",
        "engine crashed",
    )


def test_stalled_stream_is_flushed_by_a_timer_tick(store: ConversationStore, reply) -> None:
    clock = FakeClock()
    writer = StreamingWriter(store, reply.id, clock=clock)
    writer.append("a")
    writer.append("b")
    writer.flush_if_due()
    assert store.get_message(reply.id).content == "a"
    clock.now = 0.6
    writer.flush_if_due()
    assert store.get_message(reply.id).content == "ab"


def test_writer_refuses_use_after_the_end(store: ConversationStore, reply) -> None:
    writer = StreamingWriter(store, reply.id, clock=FakeClock())
    writer.finish("stop")
    with pytest.raises(StoreError, match="already ended"):
        writer.append("more")
