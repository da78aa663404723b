"""One Mamba-2 layer at Granite 4's widths on this CPU: the chunked prefill of a prompt and one
decode step, the scan alone (at several chunk sizes: the outputs do not depend on it beyond
rounding) and the whole mixer (in_proj, conv, scan, gated norm, out_proj), fp32 with random
weights; transformers' own layer (its torch path, chunks of 256) on the same prompt for reference.

    PYTHONPATH=. python bench/mamba2_layer.py [--tokens 2000] [--threads 2] [--rounds 5]
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
from layer_timing import report, timed
from transformers import GraniteMoeHybridConfig
from transformers.models.granitemoehybrid.modeling_granitemoehybrid import (
    GraniteMoeHybridMambaLayer,
)

from pagoda.engine.layers.linear import Placement
from pagoda.engine.layers.mamba2 import Mamba2Config, Mamba2Mixer
from pagoda.engine.layers.ssd import ssd_prefill, ssd_step
from pagoda.kernels.kernel_ops import TORCH_OPS
from pagoda.kernels.recurrent_metadata import RecurrentMetadata, RecurrentSegment

# config.json of Granite-4.0-H-Micro and -Tiny: hidden, mamba heads x head_dim, d_state, groups.
WIDTHS = {"H-Micro": (2048, 64, 64, 128, 1), "H-Tiny": (1536, 48, 64, 128, 1)}


def bench(name: str, widths: tuple[int, ...], tokens: int, rounds: int,
          chunks: tuple[int, ...]) -> None:
    hidden, heads, head_dim, state, groups = widths
    hf_config = GraniteMoeHybridConfig(
        hidden_size=hidden, num_hidden_layers=1, layer_types=["mamba"], mamba_n_heads=heads,
        mamba_d_head=head_dim, mamba_d_state=state, mamba_n_groups=groups, mamba_chunk_size=256)
    layer = GraniteMoeHybridMambaLayer(hf_config, layer_idx=0).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * 0.02)
    config = Mamba2Config(heads, head_dim, state, groups, 4, chunks[0], 1e-5)
    mixer = Mamba2Mixer.from_hf(dict(layer.state_dict()),
                                config, Placement(torch.device("cpu"), torch.float32, TORCH_OPS))
    states = tuple(torch.zeros(4, *shape) for shape in mixer.state_shapes())
    x = torch.randn(tokens, hidden)
    prompt_meta = RecurrentMetadata(0, torch.zeros(0, dtype=torch.int64),
                                    [RecurrentSegment(0, tokens, 0, True)])
    step_meta = RecurrentMetadata(1, torch.tensor([0]))
    g = torch.Generator().manual_seed(0)
    sx = torch.randn(tokens, heads, head_dim, generator=g)
    sdt = torch.randn(tokens, heads, generator=g)
    sB, sC = (torch.randn(tokens, groups, state, generator=g) for _ in range(2))
    print(f"{name}: hidden {hidden}, {heads} heads x {head_dim}, state {state}, "
          f"{groups} group(s)")
    with torch.inference_mode():
        for chunk in chunks:
            ssm = dataclasses.replace(mixer.ssm, chunk_size=chunk)
            report(f"scan, prefill {tokens} tokens, chunk {chunk}",
                   timed(lambda: ssd_prefill(sx, sdt, sB, sC, ssm, None), rounds))
        report(f"mixer, prefill {tokens} tokens, chunk {chunks[0]}",
               timed(lambda: mixer.forward(x, prompt_meta, states), rounds))
        report(f"transformers layer, {tokens} tokens", timed(lambda: layer(x[None]), rounds))
        slot = torch.tensor([0])
        report("scan, one decode step",
               timed(lambda: ssd_step(sx[:1], sdt[:1], sB[:1], sC[:1], mixer.ssm, states[1],
                                      slot), rounds * 20))
        report("mixer, one decode step",
               timed(lambda: mixer.forward(x[:1], step_meta, states), rounds * 20))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chunks", type=int, nargs="+", default=[64, 256],
                        help="the scan's chunk sizes; the mixer runs the first")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32")
    for name, widths in WIDTHS.items():
        bench(name, widths, args.tokens, args.rounds, tuple(args.chunks))


if __name__ == "__main__":
    main()
