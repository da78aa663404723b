"""The short causal depthwise convolution that recurrent layers run before their state update
(Gated DeltaNet's and Mamba-2's conv1d, LFM2's short convolution), with the state a sequence
carries between steps: its last kernel-1 inputs, oldest first.

weight [channels, kernel] (Hugging Face's conv1d weight [channels, 1, kernel] squeezed); bias
[channels] or None; `silu` applies SiLU to the output (Gated DeltaNet, Mamba-2), LFM2 uses none.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv_prefill(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                        state: torch.Tensor | None, silu: bool
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's run of tokens x [T, channels] after `state` [channels, kernel-1] (None:
    the sequence starts here, zeros before it). Returns (y [T, channels], the new state)."""
    channels, kernel = weight.shape
    history = (x.new_zeros(channels, kernel - 1) if state is None else state.to(x.dtype))
    padded = torch.cat([history, x.t()], dim=1)  # [channels, kernel-1 + T]
    y = F.conv1d(padded.unsqueeze(0), weight.unsqueeze(1).to(x.dtype),
                 None if bias is None else bias.to(x.dtype), groups=channels)[0].t()
    new_state = padded[:, padded.shape[1] - (kernel - 1):]
    return (F.silu(y) if silu else y), new_state.contiguous()


def causal_conv_step(x: torch.Tensor, states: torch.Tensor, slots: torch.Tensor,
                     weight: torch.Tensor, bias: torch.Tensor | None, silu: bool) -> torch.Tensor:
    """One token for each of B sequences: x [B, channels]; states [num_slots, channels, kernel-1]
    holds every slot's window, and rows `slots` [B] are advanced in place. Returns y [B, channels]."""
    window = torch.cat([states[slots].to(x.dtype), x.unsqueeze(-1)], dim=-1)  # [B, C, kernel]
    y = (window * weight.to(x.dtype)).sum(-1)
    if bias is not None:
        y = y + bias.to(x.dtype)
    states[slots] = window[..., 1:].to(states.dtype)
    return F.silu(y) if silu else y


def conv_states_after_each(x: torch.Tensor, state: torch.Tensor | None,
                           kernel: int) -> torch.Tensor:
    """The window a run of tokens x [T, channels] leaves after each of its tokens, after
    `state` [channels, kernel-1] (None: zeros): [T, channels, kernel-1], row j the state after
    j + 1 tokens (a verifying run's, pagoda.kernels.recurrent_metadata.KeptStates)."""
    channels = x.shape[1]
    history = x.new_zeros(channels, kernel - 1) if state is None else state.to(x.dtype)
    padded = torch.cat([history, x.t()], dim=1)  # [channels, kernel-1 + T]
    return padded.unfold(1, kernel - 1, 1)[:, 1:].permute(1, 0, 2)
