"""Copying one slot of every recurrent layer's states out as bytes and back in: the checkpoints
that the disk tier of the prefix cache (pagoda.engine.disk_cache.tier) saves and restores.

A slot's bytes hold, layer by layer (the recurrent ones, in the model's order) and state by
state (as the layer's mixer lists them), its values in the states' dtype (float32). Copies are
plain: a checkpoint is taken once per prompt or turn, not once per block, so it goes through no
staging buffer of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class RecurrentStateIO:
    """recurrent_states: per layer, its state tensors [slot, *shape] (None at an attention
    layer), as the model runner allocates them."""

    def __init__(self, recurrent_states: Sequence[tuple[torch.Tensor, ...] | None]) -> None:
        self.states = [state for layer in recurrent_states for state in layer or ()]
        if not self.states:
            raise ValueError("a model without recurrent layers has no states to copy")
        self.device = self.states[0].device
        self._sizes = [state[0].numel() * state.element_size() for state in self.states]
        self.bytes_per_slot = sum(self._sizes)

    @torch.inference_mode()
    def copy_out(self, slots: list[int]) -> list[memoryview]:
        """The slots' states as they are now, one byte buffer each, on the host."""
        index = torch.tensor(slots, device=self.device)
        parts = [state.index_select(0, index).reshape(len(slots), -1).view(torch.uint8)
                 for state in self.states]
        rows = torch.cat(parts, 1).to("cpu").numpy()
        return [memoryview(row) for row in rows]

    @torch.inference_mode()
    def copy_in(self, slots: list[int], payloads: list[bytes | memoryview]) -> None:
        """Write whole slots' states (bytes as `copy_out` gave them) into the slots."""
        for payload in payloads:
            if len(payload) != self.bytes_per_slot:
                raise ValueError(f"a slot of recurrent states holds {self.bytes_per_slot} "
                                 f"bytes, not {len(payload)}")
        index = torch.tensor(slots, device=self.device)
        raw = torch.frombuffer(bytearray().join(payloads), dtype=torch.uint8)
        rows = raw.reshape(len(slots), -1).to(self.device)
        start = 0
        for state, size in zip(self.states, self._sizes, strict=True):
            part = rows[:, start:start + size].contiguous().view(state.dtype)
            state.index_copy_(0, index, part.reshape(len(slots), *state.shape[1:]))
            start += size

    def layout(self) -> str:
        """The states' shapes and dtypes, for the fingerprint of the files they are saved in."""
        return ";".join(f"{list(state.shape[1:])} {state.dtype}" for state in self.states)
