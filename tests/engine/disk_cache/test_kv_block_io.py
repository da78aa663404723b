"""Whole KV blocks copied out of the cache and back in as bytes (directly, or through a reused
host buffer as from a CUDA cache), and the fingerprint that keeps one model's blocks from
another's."""

from __future__ import annotations

import pytest
import torch

from pagoda.engine.disk_cache.block_io import KVBlockIO
from pagoda.engine.disk_cache.host_staging import HostStaging
from pagoda.engine.disk_cache.tier import model_fingerprint

SHAPE = (8, 4, 2, 3)  # blocks, block size, kv heads, head dim


def caches(layers: int = 3, dtype=torch.float32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.randn(SHAPE).to(dtype), torch.randn(SHAPE).to(dtype)) for _ in range(layers)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_blocks_copied_out_and_in_elsewhere_are_the_same(dtype):
    kv = caches(dtype=dtype)
    io = KVBlockIO(kv)
    payloads = io.copy_out([5, 1])
    assert [len(p) for p in payloads] == [io.bytes_per_block] * 2

    io.copy_in([2, 7], payloads)

    for k, v in kv:
        assert torch.equal(k[2], k[5]) and torch.equal(v[7], v[1])


def test_a_copy_out_is_kept_when_the_block_changes_afterwards():
    kv = caches()
    io = KVBlockIO(kv)
    before = kv[0][0][3].clone()
    (payload,) = io.copy_out([3])
    kv[0][0][3].zero_()

    io.copy_in([3], [bytes(payload)])

    assert torch.equal(kv[0][0][3], before)


def test_a_cache_in_host_memory_is_copied_without_a_staging_buffer():
    assert KVBlockIO(caches()).staging is None


def test_blocks_through_a_reused_staging_buffer_are_the_same_and_it_grows_for_larger_batches():
    kv = caches()
    staging = HostStaging(torch.device("cpu"), max_bytes=3 * KVBlockIO(kv).bytes_per_block)
    io = KVBlockIO(kv, staging)
    block = io.bytes_per_block
    assert not staging.pin  # pinned memory is for a CUDA cache

    io.copy_in([2, 7], io.copy_out([5, 1]))
    assert staging.capacity == 2 * block
    first = [bytes(p) for p in io.copy_out([2, 7])]
    io.copy_in([0, 3, 4], io.copy_out([5, 1, 6]))

    assert staging.capacity == 3 * block
    assert first == [bytes(p) for p in io.copy_out([5, 1])]
    for k, v in kv:
        assert torch.equal(k[2], k[5]) and torch.equal(v[7], v[1])
        assert torch.equal(k[4], k[6]) and torch.equal(v[3], v[1])


def test_a_batch_larger_than_the_staging_bound_goes_through_in_parts():
    kv = caches(dtype=torch.bfloat16)
    staging = HostStaging(torch.device("cpu"), max_bytes=2 * KVBlockIO(kv).bytes_per_block + 5)
    io = KVBlockIO(kv, staging)
    before = [t.clone() for k, v in kv for t in (k[0], k[1], k[2], v[3], v[4])]

    io.copy_in([7, 6, 5, 4, 3], io.copy_out([0, 1, 2, 3, 4]))

    assert staging.capacity <= staging.max_bytes
    after = [t for k, v in kv for t in (k[7], k[6], k[5], v[4], v[3])]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_a_staging_buffer_smaller_than_a_block_is_refused():
    kv = caches()
    with pytest.raises(ValueError, match="cannot hold"):
        KVBlockIO(kv, HostStaging(torch.device("cpu"), max_bytes=10))


def test_bytes_of_another_size_are_refused():
    io = KVBlockIO(caches())

    with pytest.raises(ValueError, match="holds"):
        io.copy_in([0], [b"\0" * (io.bytes_per_block - 4)])


def test_the_fingerprint_follows_the_weights_and_the_settings(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"a" * 5000)
    settings = {"dtype": "float32", "block_size": 16}
    first = model_fingerprint(tmp_path, settings)

    assert model_fingerprint(tmp_path, dict(reversed(settings.items()))) == first
    assert model_fingerprint(tmp_path, {**settings, "block_size": 32}) != first
    weights.write_bytes(b"a" * 4999 + b"b")
    assert model_fingerprint(tmp_path, settings) != first
    assert all(c in "0123456789abcdef" for c in first)


def test_recomputing_is_costed_by_its_fastest_step_and_reading_by_recent_ones():
    from pagoda.engine.disk_cache.tier import DiskPrefixCache

    io = KVBlockIO(caches())
    disk = DiskPrefixCache(store=None, writer=None, io=io)
    assert disk.pays  # nothing measured yet: try the disk

    disk.observe_prefill(512, 0.8)  # the first step of a new shape: a kernel compiled
    disk.observe_prefill(512, 0.02)
    disk.observe_prefill(512, 0.5)  # something else ran meanwhile
    disk.read_s_per_block = 0.003

    assert disk.compute_s_per_token == pytest.approx(0.02 / 512)
    assert not disk.pays  # 3 ms to read a block of 4 tokens, 0.16 ms to compute them
    disk.read_s_per_block = 0.0001
    assert disk.pays
