"""Copying whole KV-cache blocks out of the cache and back in, as bytes: what the disk tier of
the prefix cache (pagoda.engine.disk_cache.tier) saves and restores.

One block's bytes hold its tokens' keys and values in every layer of its KV cache group, as
[layer][key, value][token][kv head][head dim] in the cache's dtype. Copies out are taken at once
on the engine thread (the block may be reused the next step); turning them into bytes and
writing them is left to whoever takes them. A cache on a CUDA device is copied through a pinned
host buffer (pagoda.engine.disk_cache.host_staging); a cache in host memory directly. A model with
several KV cache groups has one KVBlockIO per group (`group_block_ios`): each group's layers,
block ids and block shape are its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from pagoda.engine.disk_cache.host_staging import DEFAULT_MAX_BYTES, HostStaging


class KVBlockIO:
    """staging: the host buffer copies go through; by default a pinned one for a CUDA cache,
    none (direct copies) for a cache in host memory."""

    def __init__(self, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 staging: HostStaging | None = None) -> None:
        self.kv_caches = kv_caches
        key = kv_caches[0][0]
        self.device = key.device
        self.dtype = key.dtype
        # [layer][key, value][token][kv head][head dim] of one block
        self.block_shape = (len(kv_caches), 2, *key.shape[1:])
        self.bytes_per_block = _bytes_per_block(kv_caches)
        if staging is None and self.device.type == "cuda":
            staging = HostStaging(self.device, max(DEFAULT_MAX_BYTES, self.bytes_per_block))
        if staging is not None and staging.max_bytes < self.bytes_per_block:
            raise ValueError(f"a staging buffer of at most {staging.max_bytes} bytes cannot "
                             f"hold a KV block of {self.bytes_per_block}")
        self.staging = staging

    @torch.inference_mode()
    def copy_out(self, block_ids: list[int]) -> list[memoryview]:
        """The blocks' contents as they are now, one byte buffer each, on the host."""
        index = torch.tensor(block_ids, device=self.device)
        if self.staging is None:
            data = self._gather(index).to("cpu").contiguous().view(torch.uint8)
        else:
            data = self._gather_staged(index)
        as_bytes = data.reshape(len(block_ids), -1).numpy()
        return [memoryview(row) for row in as_bytes]

    @torch.inference_mode()
    def copy_in(self, block_ids: list[int], payloads: list[bytes | memoryview]) -> None:
        """Write whole blocks (bytes as `copy_out` gave them) into the cache."""
        for payload in payloads:
            if len(payload) != self.bytes_per_block:
                raise ValueError(f"a KV block holds {self.bytes_per_block} bytes, not "
                                 f"{len(payload)}")
        index = torch.tensor(block_ids, device=self.device)
        if self.staging is None:
            self._scatter(index, torch.frombuffer(bytearray().join(payloads), dtype=torch.uint8))
        else:
            self._scatter_staged(index, payloads)

    def _gather(self, index: torch.Tensor) -> torch.Tensor:
        """The blocks at `index`, [block][layer][key, value]..., on the cache's device."""
        return torch.stack([torch.stack((k.index_select(0, index), v.index_select(0, index)), 1)
                            for k, v in self.kv_caches], 1)

    def _gather_staged(self, index: torch.Tensor) -> torch.Tensor:
        """The blocks at `index` as bytes in host memory of their own (the staging buffer is
        reused: the writer keeps what it is given until it is on disk)."""
        out = torch.empty(len(index) * self.bytes_per_block, dtype=torch.uint8)
        step = self._blocks_per_part()
        for start in range(0, len(index), step):
            data = self._gather(index[start:start + step]).view(torch.uint8).reshape(-1)
            host = self.staging.take(data.numel())
            host.copy_(data, non_blocking=True)
            self.staging.fence()
            self.staging.wait()
            begin = start * self.bytes_per_block
            out[begin:begin + data.numel()].copy_(host)
        return out

    def _scatter_staged(self, index: torch.Tensor, payloads: list[bytes | memoryview]) -> None:
        """Write the payloads into the cache at `index` through the staging buffer, a part at a
        time; the copies to the device run on while the host goes on (the next `take` waits)."""
        step = self._blocks_per_part()
        for start in range(0, len(payloads), step):
            part = payloads[start:start + step]
            host = self.staging.take(len(part) * self.bytes_per_block)
            for row, payload in zip(host.numpy().reshape(len(part), -1), part, strict=True):
                row[:] = np.frombuffer(payload, dtype=np.uint8)
            self._scatter(index[start:start + step], host.to(self.device, non_blocking=True))
            self.staging.fence()

    def _scatter(self, index: torch.Tensor, raw: torch.Tensor) -> None:
        """Write the blocks' bytes `raw` (on any device) into the cache at `index`."""
        data = raw.view(self.dtype).reshape(len(index), *self.block_shape).to(self.device)
        for layer, (k, v) in enumerate(self.kv_caches):
            k.index_copy_(0, index, data[:, layer, 0])
            v.index_copy_(0, index, data[:, layer, 1])

    def _blocks_per_part(self) -> int:
        return self.staging.max_bytes // self.bytes_per_block


def group_block_ios(kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                    layer_groups: Sequence[Sequence[int]]) -> list[KVBlockIO]:
    """One KVBlockIO per KV cache group, over the caches of its layers (`layer_groups`: each
    group's layer indices into `kv_caches`); on CUDA they share one staging buffer, as the
    engine thread copies one group at a time."""
    groups = [[kv_caches[layer] for layer in layers] for layers in layer_groups]
    device = groups[0][0][0].device  # (a hybrid's first layer may be recurrent: no cache)
    staging = None
    if device.type == "cuda":
        largest = max(_bytes_per_block(caches) for caches in groups)
        staging = HostStaging(device, max(DEFAULT_MAX_BYTES, largest))
    return [KVBlockIO(caches, staging) for caches in groups]


def _bytes_per_block(kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
    key = kv_caches[0][0]
    return key[0].numel() * key.element_size() * 2 * len(kv_caches)
