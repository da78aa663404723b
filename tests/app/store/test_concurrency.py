"""The GUI thread and a worker thread share one store."""

import threading

from pagoda.app.store import ConversationStore

UPDATES = 200


def stream(store: ConversationStore, mid: int, word: str, errors: list[BaseException]) -> None:
    try:
        text = ""
        for i in range(UPDATES):
            text += f"{word}{i} "
            store.update_streaming(mid, text)
        store.finish_message(mid, text, "stop")
    except Exception as error:  # noqa: BLE001 - reported to the main thread
        errors.append(error)


def test_two_threads_streaming_into_two_conversations_lose_nothing(store) -> None:
    replies = []
    for name in ("left", "right"):
        cid = store.create_conversation(name).id
        store.append_user_message(cid, f"{name} question")
        replies.append(store.start_assistant_message(cid))
    errors: list[BaseException] = []
    threads = [
        threading.Thread(target=stream, args=(store, reply.id, word, errors))
        for reply, word in zip(replies, ("L", "R"), strict=True)
    ]
    for thread in threads:
        thread.start()
    reads = 0
    while any(t.is_alive() for t in threads):  # the GUI keeps reading meanwhile
        store.list_conversations()
        reads += 1
    for thread in threads:
        thread.join()

    assert errors == []
    for reply, word in zip(replies, ("L", "R"), strict=True):
        done = store.get_message(reply.id)
        assert done.status == "complete"
        assert done.content == "".join(f"{word}{i} " for i in range(UPDATES))
    assert reads > 0
