"""Cache tags: the blocks a chat's requests found or saved are listed under its tag, and
forgetting the tag (the chat was deleted for good) removes the blocks only it used; blocks
another chat used, or that no tag lists, stay."""

from __future__ import annotations

from hashlib import blake2b
from pathlib import Path

import pytest

from pagoda.engine.core.block_pool import hash_block_tokens
from pagoda.engine.disk_cache.store import (
    TAGS_FOLDER,
    DiskBlockStore,
    check_cache_tag,
    clear_folder,
    forget_tag,
)
from tests.engine.disk_cache.test_disk_prefix_cache import BLOCK, GREEDY, engine, generate, history

FINGERPRINT = "cd" * 16
MiB = 1 << 20


def block(n: int) -> tuple[bytes, tuple[int, ...], bytes]:
    tokens = tuple(range(n * 16, n * 16 + 16))
    return blake2b(repr(tokens).encode(), digest_size=16).digest(), tokens, bytes([n]) * 64


def h(n: int) -> bytes:
    return block(n)[0]


def on_disk(folder: Path, block_hash: bytes) -> bool:
    return any(folder.rglob(block_hash.hex() + ".kv"))


@pytest.fixture
def store(tmp_path) -> DiskBlockStore:
    store = DiskBlockStore(tmp_path, FINGERPRINT, MiB)
    store.save([block(n) for n in range(1, 6)])
    return store


def test_forgetting_a_tag_removes_the_blocks_only_it_used(store, tmp_path):
    store.record_tags({"chat-a": [h(1), h(2), h(3)], "chat-b": [h(3), h(4)]})

    assert forget_tag(tmp_path, "chat-a") == 2

    assert not on_disk(tmp_path, h(1)) and not on_disk(tmp_path, h(2))
    assert on_disk(tmp_path, h(3))  # chat-b used it too
    assert on_disk(tmp_path, h(4)) and on_disk(tmp_path, h(5))  # chat-b's; untagged
    tags = tmp_path / FINGERPRINT / TAGS_FOLDER
    assert sorted(p.name for p in tags.iterdir()) == ["chat-b.hashes"]


def test_a_tag_listed_twice_is_forgotten_once(store, tmp_path):
    store.record_tags({"chat-a": [h(1)]})
    store.record_tags({"chat-a": [h(1), h(2)]})

    assert forget_tag(tmp_path, "chat-a") == 2
    assert forget_tag(tmp_path, "chat-a") == 0


def test_lines_that_are_not_hashes_are_skipped(store, tmp_path):
    tags = tmp_path / FINGERPRINT / TAGS_FOLDER
    tags.mkdir()
    (tags / "chat-a.hashes").write_text(f"not a hash\n\nabc\n../../x\n{h(1).hex()}\n\xff\n")

    assert forget_tag(tmp_path, "chat-a") == 1
    assert not on_disk(tmp_path, h(1)) and on_disk(tmp_path, h(2))


def test_an_unknown_tag_or_folder_removes_nothing(store, tmp_path):
    assert forget_tag(tmp_path, "never-used") == 0
    assert forget_tag(tmp_path / "missing", "never-used") == 0
    assert store.stats().num_blocks == 5


@pytest.mark.parametrize("tag", ["", "../chat", "a/b", "chat 1", "x" * 101, "ü", None])
def test_a_tag_that_cannot_name_a_file_is_refused(tag, tmp_path):
    with pytest.raises(ValueError, match="cache_tag"):
        check_cache_tag(tag)
    with pytest.raises(ValueError, match="cache_tag"):
        forget_tag(tmp_path, tag)


def test_clearing_the_folder_removes_the_tags_too(store, tmp_path):
    store.record_tags({"chat-a": [h(1)]})

    clear_folder(tmp_path)

    assert not any(tmp_path.rglob("*.hashes")) and not any(tmp_path.rglob("*.kv"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from tests.engine.tiny_models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama", seed=0)


def chained_hashes(tokens: list[int], block: int = BLOCK) -> list[bytes]:
    """The hashes of the full blocks of `block` tokens, as the prefix cache names them."""
    hashes: list[bytes] = []
    for i in range(len(tokens) // block):
        hashes.append(hash_block_tokens(hashes[-1] if hashes else None,
                                        tokens[i * block:(i + 1) * block]))
    return hashes


def generate_tagged(eng, prompt: list[int], request_id: str, tag: str):
    eng.add_request(request_id, prompt, GREEDY, cache_tag=tag)
    final = None
    while eng.has_unfinished_requests():
        for out in eng.step():
            final = out if out.finished else final
    return final


def test_deleting_one_chat_keeps_the_prefix_it_shared_with_another(tiny, tmp_path):
    shared = history(32)
    chat_a = shared + history(40, start=500)
    chat_b = shared + history(40, start=900)
    first = engine(tiny, tmp_path)
    generate_tagged(first, chat_a, "a", "conversation-1")
    generate_tagged(first, chat_b, "b", "conversation-2")  # its prefix: memory hits
    first.close()

    removed = forget_tag(tmp_path, "conversation-1")

    own_a = chained_hashes(chat_a)[2:]
    assert removed >= len(own_a)  # its prompt's own blocks, and its reply's
    assert not any(on_disk(tmp_path, x) for x in own_a)
    assert all(on_disk(tmp_path, x) for x in chained_hashes(chat_b))
    assert cached_tokens_in_a_new_engine(tiny, tmp_path, chat_b) == 64  # all it can
    assert cached_tokens_in_a_new_engine(tiny, tmp_path, chat_a) == 32  # the shared part


def cached_tokens_in_a_new_engine(tiny: Path, folder: Path, prompt: list[int]) -> int:
    eng = engine(tiny, folder)
    try:
        return generate(eng, prompt).num_cached_tokens
    finally:
        eng.close()


def test_requests_without_a_tag_list_nothing(tiny, tmp_path):
    first = engine(tiny, tmp_path)
    generate(first, history(40))
    first.close()

    assert any(tmp_path.rglob("*.kv")) and not any(tmp_path.rglob("*.hashes"))


def test_the_engine_refuses_a_tag_that_cannot_name_a_file(tiny):
    eng = engine(tiny, None)

    with pytest.raises(ValueError, match="cache_tag"):
        eng.add_request("r", history(20), GREEDY, cache_tag="../other")
    assert not eng.has_unfinished_requests()


def test_forgetting_and_clearing_never_delete_through_linked_folders(store, tmp_path):
    store.record_tags({"chat-a": [h(1), h(2)]})
    decoy = tmp_path.parent / f"{tmp_path.name}-decoy"
    decoy.mkdir()
    fingerprint_folder = tmp_path / FINGERPRINT
    tags = fingerprint_folder / TAGS_FOLDER
    tags.rename(decoy / "tags")
    tags.symlink_to(decoy / "tags", target_is_directory=True)
    shard = fingerprint_folder / h(3).hex()[:2]
    shard.rename(decoy / "shard")
    shard.symlink_to(decoy / "shard", target_is_directory=True)
    kept = sorted(p.relative_to(decoy) for p in decoy.rglob("*"))

    assert forget_tag(tmp_path, "chat-a") == 0
    clear_folder(tmp_path)

    assert sorted(p.relative_to(decoy) for p in decoy.rglob("*")) == kept
