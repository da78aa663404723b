"""A host buffer that KV blocks pass through between a CUDA cache and bytes (pagoda.engine.disk_cache.
block_io). Page-locked (pinned), so that a copy to or from the GPU is one DMA transfer that runs
without the host (a pageable one is copied again by the driver, through a staging buffer of its
own, and waits); reused, since pinning memory costs more than copying into it."""

from __future__ import annotations

import torch

DEFAULT_MAX_BYTES = 64 << 20


class HostStaging:
    """One host buffer, grown to the largest batch asked for, never past `max_bytes` (a larger
    batch goes through it in parts). Pinned where `device` is a CUDA device (`pin`); on a CPU it
    is plain memory and nothing in it is asynchronous.

    A copy that uses the buffer asynchronously is `fence`d once it is queued; the next `take`
    waits for it to end, so the buffer is never rewritten while a transfer still reads it."""

    def __init__(self, device: torch.device, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes={max_bytes} must be >= 1")
        self.pin = device.type == "cuda"
        self.max_bytes = max_bytes
        self._buffer = torch.empty(0, dtype=torch.uint8)
        self._in_use: torch.cuda.Event | None = None

    @property
    def capacity(self) -> int:
        """Bytes the buffer holds now (0 until the first `take`)."""
        return self._buffer.numel()

    def take(self, nbytes: int) -> torch.Tensor:
        """The buffer's first `nbytes` as a uint8 tensor on the host, free to write."""
        if not 0 < nbytes <= self.max_bytes:
            raise ValueError(f"{nbytes} bytes do not fit a staging buffer of at most "
                             f"{self.max_bytes}")
        self.wait()
        if nbytes > self.capacity:
            # At least half as large again: a batch size that creeps up one block at a time
            # should not pin memory anew at every step.
            size = min(self.max_bytes, max(nbytes, self.capacity * 3 // 2))
            self._buffer = torch.empty(size, dtype=torch.uint8, pin_memory=self.pin)
        return self._buffer[:nbytes]

    def fence(self) -> None:
        """The copies queued so far on the current CUDA stream use the buffer: `take` and
        `wait` wait for them."""
        if self.pin:
            self._in_use = torch.cuda.Event()
            self._in_use.record()

    def wait(self) -> None:
        """Return once the fenced copies have ended (at once on a CPU)."""
        if self._in_use is not None:
            self._in_use.synchronize()
            self._in_use = None
