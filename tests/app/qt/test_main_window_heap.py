"""The window settles the heap once a model has loaded: the objects alive then (torch's, the
model's, the app's) stay out of later full collections, which froze the window for 270-330 ms
while replies streamed (docs/BENCHMARKS.md, issue 29)."""

import gc


def test_a_loaded_model_leaves_the_heap_out_of_later_full_collections(window_on, qtbot,
                                                                      tmp_path):
    window = window_on(tmp_path / "chats.db")
    gc.unfreeze()
    qtbot.waitUntil(window.host.load(None).done, timeout=10_000)
    assert gc.get_freeze_count() > 10_000  # what each full collection would otherwise walk
