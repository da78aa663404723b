"""One slot of every recurrent layer's states copied out as bytes and into another slot: the
checkpoints the disk tier keeps for hybrid models."""

from __future__ import annotations

import pytest
import torch

from pagoda.engine.disk_cache.state_io import RecurrentStateIO

SLOTS = 6


def states() -> list[tuple[torch.Tensor, ...] | None]:
    """A hybrid's layers as the runner allocates them: a convolution state, an attention layer
    (no state), a DeltaNet's convolution and matrix states."""
    return [(torch.randn(SLOTS, 8, 2),), None,
            (torch.randn(SLOTS, 12, 3), torch.randn(SLOTS, 2, 4, 4))]


def test_a_slot_copied_out_and_into_another_slot_is_the_same():
    layers = states()
    io = RecurrentStateIO(layers)
    assert io.bytes_per_slot == (8 * 2 + 12 * 3 + 2 * 4 * 4) * 4
    payloads = io.copy_out([4, 1])

    io.copy_in([0, 5], payloads)

    for state in (s for layer in layers for s in layer or ()):
        assert torch.equal(state[0], state[4]) and torch.equal(state[5], state[1])


def test_a_copy_out_is_kept_when_the_slot_changes_afterwards():
    layers = states()
    io = RecurrentStateIO(layers)
    before = layers[2][1][3].clone()
    (payload,) = io.copy_out([3])
    layers[2][1][3].zero_()

    io.copy_in([3], [payload])

    assert torch.equal(layers[2][1][3], before)


def test_a_payload_of_another_size_is_refused():
    io = RecurrentStateIO(states())
    with pytest.raises(ValueError, match="recurrent states holds"):
        io.copy_in([0], [b"\0" * (io.bytes_per_slot - 4)])


def test_the_layout_names_every_states_shape():
    assert RecurrentStateIO(states()).layout() == (
        "[8, 2] torch.float32;[12, 3] torch.float32;[2, 4, 4] torch.float32")


def test_a_model_without_recurrent_layers_has_no_states_to_copy():
    with pytest.raises(ValueError, match="no states"):
        RecurrentStateIO([None, None])
