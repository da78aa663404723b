"""Which layout each weight is kept in: the one table the loader (gguf.py, on_load.py) and the
memory estimate (model_info.py) both read, so the estimate cannot drift from what loads.

Layouts are the engine's own (pagoda/engine/quantization/tensors.py): "int4" (Int4Weight, groups of
32), "int8" (Int8Weight, groups of 32; Q6_K, IQ4_XS, Q5_K and Q3_K blocks are kept as the file
stores them and read in place by the CPU kernel, which they become where that kernel does not
run; the other widened types become it at load), "float".
"""

from __future__ import annotations

import re
from typing import Literal

Layout = Literal["float", "int4", "int8"]

# GGUF block types by the layout "auto" keeps them in. Q8_0 is int8 exactly and Q6_K blocks are
# read in place; the widened types have no kernel of their own yet and are decoded and
# requantized to int8 at load (pagoda/engine/loading/gguf_blocks.py): its groups of 32 are finer than
# any of their own steps.
GGUF_INT4_TYPES = frozenset({"Q4_0", "Q4_1", "Q4_K"})
GGUF_WIDENED_TYPES = frozenset({"Q2_K", "Q3_K", "Q5_0", "Q5_1", "Q5_K", "IQ4_NL", "IQ4_XS",
                                "MXFP4", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S",
                                "IQ3_XXS", "IQ3_S"})
GGUF_INT8_TYPES = frozenset({"Q6_K", "Q8_0"}) | GGUF_WIDENED_TYPES
# Kept as the file's blocks (`BlockWeight`) under "auto", with the bytes a weight they hold: one
# copy, which a vocabulary's embedding lookup and projection both read. IQ4_XS, Q5_K and Q3_K
# are decoded by the widening code too, for "none" and where our CPU kernel does not run.
GGUF_BLOCK_BYTES_PER_ELEMENT = {"Q6_K": 210 / 256, "IQ4_XS": 136 / 256, "Q5_K": 176 / 256,
                                "Q3_K": 110 / 256}
GGUF_FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})

# The token table and the vocabulary projection, under the names of a Hugging Face folder and of
# a GGUF file. Under "int4" they stay int8, as llama.cpp's Q4_K_M keeps its output layer at 6
# bits: 4-bit logits cost more quality than 4-bit layers. Every logit and every token's embedding
# reads them.
VOCABULARY_MATRICES = frozenset({"model.embed_tokens.weight", "lm_head.weight",
                                 "token_embd.weight", "output.weight"})

# A mixture of experts' routers and shared-expert gates stay float under "int8"/"int4", as
# llama.cpp's quantizer leaves them: a rounded score can send a token to another expert.
_FLOAT_MATRICES = re.compile(r".*\.mlp\.(?:gate|shared_expert_gate)\.weight")


def kept_float(name: str) -> bool:
    """Whether the matrix of this Hugging Face name stays float whatever the quantization."""
    return _FLOAT_MATRICES.fullmatch(name) is not None


def gguf_layout(type_name: str) -> Layout:
    """The layout "auto" keeps a GGUF matrix of this block type in ("Q4_K" -> "int4")."""
    if type_name in GGUF_INT4_TYPES:
        return "int4"
    if type_name in GGUF_FLOAT_TYPES:
        return "float"
    return "int8"
