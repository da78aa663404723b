"""A multi-token-prediction (MTP) block: the extra layer Qwen3.5 and Qwen3-Next are released
with, which guesses the token after next from the model's own last hidden state, a draft for
speculative decoding (pagoda.engine.spec_decode.draft_sources).

At position t, with h_t the model's last hidden state after its final norm and x the token at
t + 1 (the one the model predicted there):

    y = fc([norm_e(embed(x)), norm_h(h_t)])          # 2 x hidden -> hidden
    y = one decoder layer (full attention, own KV cache, the main layers' MLP kind)
    draft for t + 2 = argmax(lm_head(norm(y)))       # the model's embedding and lm_head

Its norms scale by (1 + w) as the model's do. The layer attends over the block's keys at every
earlier position, so it runs over every token the model computes (prompt chunks too), not only
where a draft is wanted.

Further drafts chain the block on itself, as vLLM runs it for more than one speculative token:
at position t + 1 its own output norm(y) stands in for h_{t+1} (the model has not computed
it) and the draft for t + 2 for x, which drafts t + 3; and so on. Those keys are the block's
guesses: the next step's pass over the positions the model computes writes over them.

A folder keeps its tensors under mtp.* (`mtp_weight_shapes`); llama.cpp's converter writes them
as one more block, blk.N.* and blk.N.nextn.*.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from pagoda.engine.layers.linear import Linear
from pagoda.engine.models.architecture import DecoderArchitecture
from pagoda.engine.quantization.tensors import Weight

PREFIX = "mtp."
LAYER_PREFIX = "mtp.layers.0."
# The block's own tensors beside its decoder layer, by their folder names.
FC = "mtp.fc.weight"
EMBEDDING_NORM = "mtp.pre_fc_norm_embedding.weight"
HIDDEN_NORM = "mtp.pre_fc_norm_hidden.weight"
NORM = "mtp.norm.weight"


def mtp_weight_shapes(arch: DecoderArchitecture,
                      layer_shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The block's tensors by folder name and shape, given the shapes of the main layer it is
    built like (`arch.mtp_like`, under model.layers.N.)."""
    hidden = arch.shape.hidden_size
    own = f"model.layers.{arch.mtp_like}."
    shapes = {LAYER_PREFIX + name[len(own):]: shape for name, shape in layer_shapes.items()}
    return shapes | {FC: (hidden, 2 * hidden), EMBEDDING_NORM: (hidden,),
                     HIDDEN_NORM: (hidden,), NORM: (hidden,)}


# The block's own tensors as llama.cpp's converter names them, in the block after the model's
# layers (model.layers.N.<module>).
CONVERTER_MODULES = {FC: "eh_proj.weight", EMBEDDING_NORM: "enorm.weight",
                     HIDDEN_NORM: "hnorm.weight", NORM: "shared_head.norm.weight"}


def converter_name(name: str, num_layers: int) -> str:
    """A block tensor's name as the converter writes it before its GGUF naming: its layer's
    as layer num_layers' (the block after the model's), its own under that layer."""
    block = f"model.layers.{num_layers}."
    if name.startswith(LAYER_PREFIX):
        return block + name[len(LAYER_PREFIX):]
    return block + CONVERTER_MODULES[name]


def as_main_layer(weights: Mapping[str, Weight], index: int) -> dict[str, Weight]:
    """The block's layer tensors named as main layer `index`'s, so the decoder's layer loader
    builds it (each read by name: a lazy mapping converts what is read)."""
    names = [name for name in weights if name.startswith(LAYER_PREFIX)]
    return {f"model.layers.{index}.{name[len(LAYER_PREFIX):]}": weights[name] for name in names}


class _Model(Protocol):
    """What the block reads of the model it drafts for (pagoda.engine.models.decoder's
    DecoderForCausalLM): its kernels, shape, token table, rotary tables, final norm and
    vocabulary projection."""

    ops: Any
    shape: Any
    embed_tokens: Any
    rotary: dict
    lm_head: Any

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor: ...


@dataclass(slots=True)
class MultiTokenPredictor:
    fc: Linear
    embedding_norm: torch.Tensor
    hidden_norm: torch.Tensor
    norm: torch.Tensor
    layer: Any  # a full-attention DecoderLayer (pagoda.engine.models.decoder)

    def hidden_states(self, model: _Model, next_ids: torch.Tensor,
                      positions: torch.Tensor, hidden: torch.Tensor, meta,
                      kv_cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The block's normed output [tokens, hidden] over a step's flat batch: hidden is the
        model's last layer output there (before its final norm), next_ids each position's next
        token, meta the step's attention metadata (its full-attention group's): the block's
        keys land in kv_cache at the model's slots."""
        return self.chained(model, next_ids, positions, model.final_norm(hidden), meta,
                            kv_cache)

    def chained(self, model: _Model, next_ids: torch.Tensor, positions: torch.Tensor,
                carried: torch.Tensor, meta,
                kv_cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The block's normed output where `carried` is what the model's normed hidden state
        would be: that itself, or the block's own output at the position before (a chained
        draft's)."""
        ops, eps = model.ops, model.shape.rms_norm_eps
        embedded = ops.rms_norm(model.embed_tokens(next_ids), self.embedding_norm, eps)
        x = self.fc(torch.cat((embedded, ops.rms_norm(carried, self.hidden_norm, eps)), dim=-1))
        rotary = {key: tables.lookup(positions) for key, tables in model.rotary.items()}
        layer = self.layer
        attended, _ = layer.attention(ops.rms_norm(x, layer.input_norm, eps), rotary,
                                      kv_cache[0], kv_cache[1], meta, ops)
        h, residual = ops.add_rms_norm(attended, x, layer.mlp_norm, eps)
        return ops.rms_norm(layer.mlp(h, ops) + residual, self.norm, eps)

    def draft(self, model: _Model, normed: torch.Tensor) -> torch.Tensor:
        """The greedy draft of each row of `hidden_states`' (or `chained`'s) output."""
        return model.lm_head(normed).argmax(dim=-1)
