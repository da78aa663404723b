"""Copying whole KV-cache blocks out of the cache and back in, as bytes: what the disk tier of
the prefix cache (engine.disk_cache.tier) saves and restores.

One block's bytes hold every layer's keys and values for its tokens, laid out as
[layer][key, value][token][kv head][head dim] in the cache's dtype. Copies out are taken at once
on the engine thread (the block may be reused the next step); turning them into bytes and
writing them is left to whoever takes them.
"""

from __future__ import annotations

import torch


class KVBlockIO:
    def __init__(self, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.kv_caches = kv_caches
        key = kv_caches[0][0]
        self.device = key.device
        self.dtype = key.dtype
        # [layer][key, value][token][kv head][head dim] of one block
        self.block_shape = (len(kv_caches), 2, *key.shape[1:])
        self.bytes_per_block = key[0].numel() * key.element_size() * 2 * len(kv_caches)

    @torch.inference_mode()
    def copy_out(self, block_ids: list[int]) -> list[memoryview]:
        """The blocks' contents as they are now, one byte buffer each, on the host."""
        index = torch.tensor(block_ids, device=self.device)
        data = torch.stack([torch.stack((k.index_select(0, index), v.index_select(0, index)), 1)
                            for k, v in self.kv_caches], 1)
        data = data.to("cpu").contiguous()
        as_bytes = data.view(torch.uint8).reshape(len(block_ids), -1).numpy()
        return [memoryview(row) for row in as_bytes]

    @torch.inference_mode()
    def copy_in(self, block_ids: list[int], payloads: list[bytes | memoryview]) -> None:
        """Write whole blocks (bytes as `copy_out` gave them) into the cache."""
        for payload in payloads:
            if len(payload) != self.bytes_per_block:
                raise ValueError(f"a KV block holds {self.bytes_per_block} bytes, not "
                                 f"{len(payload)}")
        raw = torch.frombuffer(bytearray().join(payloads), dtype=torch.uint8)
        data = raw.view(self.dtype).reshape(len(block_ids), *self.block_shape).to(self.device)
        index = torch.tensor(block_ids, device=self.device)
        for layer, (k, v) in enumerate(self.kv_caches):
            k.index_copy_(0, index, data[:, layer, 0])
            v.index_copy_(0, index, data[:, layer, 1])
