"""Gated DeltaNet on this CPU at Qwen3.5-0.8B's widths (hidden 1,024; 16 key and 16 value
heads of 128): one layer's chunked prefill of a prompt and one decode step, the delta rule
alone and the whole mixer (fp32 projections included), next to transformers' torch chunked
rule on the same inputs. Random weights: the time does not depend on them.

Not a test: run it on a quiet machine. Figures compare only within one run.

    PYTHONPATH=. .venv/bin/python bench/gated_delta_net.py [--tokens 2000] [--threads 2]
"""

from __future__ import annotations

import argparse

import torch
from cpu_info import cpu_name
from layer_timing import report, timed
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import (
    Qwen3_5GatedDeltaNet,
    torch_chunk_gated_delta_rule,
)

from pagoda.engine.layers.gated_delta_net import DeltaNetShape
from pagoda.engine.layers.gated_delta_net_weights import qwen3_5_gated_delta_net
from pagoda.engine.layers.gated_delta_rule import chunked_gated_delta_rule
from pagoda.engine.layers.linear import Placement
from pagoda.kernels.kernel_ops import TORCH_OPS
from pagoda.kernels.recurrent_metadata import RecurrentMetadata, RecurrentSegment
from pagoda.kernels.recurrent_steps import gdn_step

HIDDEN, HEADS, DIM, KERNEL = 1024, 16, 128, 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    n = args.tokens
    print(f"{cpu_name()}, torch {torch.__version__}, {args.threads} threads, fp32, {n} tokens")

    q = torch.nn.functional.normalize(torch.randn(n, HEADS, DIM), dim=-1) * DIM ** -0.5
    k = torch.nn.functional.normalize(torch.randn(n, HEADS, DIM), dim=-1)
    v, g, beta = torch.randn(n, HEADS, DIM), -torch.rand(n, HEADS), torch.rand(n, HEADS)
    report("delta rule, chunked prefill (ours)",
           timed(lambda: chunked_gated_delta_rule(q, k, v, g, beta), args.rounds))
    hf_args = [t.unsqueeze(0) for t in (q * DIM ** 0.5, k, v, g, beta)]  # it scales q itself
    report("delta rule, chunked prefill (transformers)",
           timed(lambda: torch_chunk_gated_delta_rule(*hf_args), args.rounds))
    states, slots = torch.zeros(4, HEADS, DIM, DIM), torch.tensor([1])
    one = [t[:1] for t in (q, k, v, g, beta)]
    report("delta rule, one decode step",
           timed(lambda: gdn_step(states, slots, *one), args.rounds * 20))

    config = Qwen3_5TextConfig(hidden_size=HIDDEN, linear_num_key_heads=HEADS,
                               linear_num_value_heads=HEADS, linear_key_head_dim=DIM,
                               linear_value_head_dim=DIM, linear_conv_kernel_dim=KERNEL,
                               num_hidden_layers=1, layer_types=["linear_attention"])
    reference = Qwen3_5GatedDeltaNet(config, layer_idx=0)
    tensors = {name: t.detach() for name, t in reference.state_dict().items()}
    mixer = qwen3_5_gated_delta_net(tensors, DeltaNetShape(HEADS, HEADS, DIM, DIM, KERNEL), 1e-6,
                                    Placement(torch.device("cpu"), torch.float32, TORCH_OPS))
    layer_states = tuple(torch.zeros(4, *shape) for shape in mixer.state_shapes())
    x = torch.randn(n, HIDDEN)
    prompt_meta = RecurrentMetadata(0, torch.empty(0, dtype=torch.long),
                                    [RecurrentSegment(0, n, 1, True)])
    with torch.no_grad():
        report("mixer, prefill (projections included)",
               timed(lambda: mixer.forward(x, prompt_meta, layer_states), args.rounds))
        decode_meta = RecurrentMetadata(1, torch.tensor([1]))
        report("mixer, one decode step (projections included)",
               timed(lambda: mixer.forward(x[:1], decode_meta, layer_states),
                     args.rounds * 20))


if __name__ == "__main__":
    main()
