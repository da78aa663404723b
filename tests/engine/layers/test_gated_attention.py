"""Gated attention (Qwen3-Next's and Qwen3.5's full-attention layers): q_proj's per-head gate
rows, split off and placed after the values, gate the output as transformers' layers do."""

import pytest
import torch
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5Attention
from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextAttention

from pagoda.engine.layers.attention import Attention, HeadShape, split_gated_queries
from pagoda.engine.layers.linear import Placement, make_fused_linear, make_linear
from pagoda.kernels.attention_metadata import AttentionMetadata, PrefillSegment
from pagoda.kernels.kernel_ops import TORCH_OPS

CPU = Placement(torch.device("cpu"), torch.float32, TORCH_OPS)
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, LENGTH, BLOCK = 32, 4, 2, 8, 10, 16
SIZES = {"hidden_size": HIDDEN, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
         "head_dim": HEAD_DIM, "num_hidden_layers": 1, "layer_types": ["full_attention"],
         "rms_norm_eps": 1e-6}
FAMILIES = {"qwen3_next": (Qwen3NextConfig, Qwen3NextAttention),
            "qwen3_5": (Qwen3_5TextConfig, Qwen3_5Attention)}


def ours_from(reference: torch.nn.Module) -> Attention:
    w = {name: t.detach().clone() for name, t in reference.state_dict().items()}
    queries, gates = split_gated_queries(w["q_proj.weight"], HEADS, HEAD_DIM)
    qkv = make_fused_linear([queries, w["k_proj.weight"], w["v_proj.weight"], gates], None, CPU)
    # These families' norms scale by 1 + weight.
    return Attention(qkv_proj=qkv, o_proj=make_linear(w["o_proj.weight"], None, CPU),
                     heads=HeadShape(HEADS, KV_HEADS, HEAD_DIM), window=0, rope=None,
                     scale=HEAD_DIM ** -0.5, eps=1e-6, q_norm=1 + w["q_norm.weight"],
                     k_norm=1 + w["k_norm.weight"], output_gate=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_gated_attention_equals_transformers_on_a_prompt(family):
    config_class, module_class = FAMILIES[family]
    torch.manual_seed(0)
    reference = module_class(config_class(**SIZES), layer_idx=0).eval()
    with torch.no_grad():
        reference.q_norm.weight.normal_(0, 0.5)
        reference.k_norm.weight.normal_(0, 0.5)
    x = torch.randn(LENGTH, HIDDEN)
    # No rotation on either side: cos 1, sin 0 for transformers, no table for ours.
    identity = (torch.ones(1, LENGTH, HEAD_DIM), torch.zeros(1, LENGTH, HEAD_DIM))
    causal = torch.full((LENGTH, LENGTH), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        want, _ = reference(x.unsqueeze(0), identity, causal)

    cache = torch.zeros(1, BLOCK, KV_HEADS, HEAD_DIM)
    meta = AttentionMetadata(torch.arange(LENGTH),
                             prefills=[PrefillSegment(0, LENGTH, LENGTH, torch.tensor([0]), None)])
    got, _ = ours_from(reference)(x, {}, cache, cache.clone(), meta, TORCH_OPS)
    torch.testing.assert_close(got, want[0], rtol=1e-5, atol=1e-6)

