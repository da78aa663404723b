"""Which layout each weight is kept in: the one table the loader (gguf.py, on_load.py) and the
memory estimate (model_info.py) both read, so the estimate cannot drift from what loads.

Layouts are the engine's own (engine/quantization/tensors.py): "int4" (Int4Weight, groups of
32), "int8" (Int8Weight, groups of 32; Q6_K blocks are kept as the file stores them and read in
place by the CPU kernel, counted here as int8, which they become where that kernel does not run),
"float".
"""

from __future__ import annotations

from typing import Literal

Layout = Literal["float", "int4", "int8"]

# GGUF block types by the layout "auto" keeps them in. 5 and 6 bits go to int8: its groups of 32
# are finer than their own steps.
GGUF_INT4_TYPES = frozenset({"Q4_0", "Q4_1", "Q4_K"})
GGUF_INT8_TYPES = frozenset({"Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0"})
GGUF_FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})

# The token table and the vocabulary projection, under the names of a Hugging Face folder and of
# a GGUF file. Under "int4" they stay int8, as llama.cpp's Q4_K_M keeps its output layer at 6
# bits: 4-bit logits cost more quality than 4-bit layers. Every logit and every token's embedding
# reads them.
VOCABULARY_MATRICES = frozenset({"model.embed_tokens.weight", "lm_head.weight",
                                 "token_embd.weight", "output.weight"})


def gguf_layout(type_name: str) -> Layout:
    """The layout "auto" keeps a GGUF matrix of this block type in ("Q4_K" -> "int4")."""
    if type_name in GGUF_INT4_TYPES:
        return "int4"
    if type_name in GGUF_FLOAT_TYPES:
        return "float"
    return "int8"
