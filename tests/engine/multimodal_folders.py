"""A tiny text model saved as its family is released: a multimodal folder with a small vision
encoder beside the text model's own weights (the tests of the families whose text model Pagoda
runs from such a folder)."""

from __future__ import annotations

from pathlib import Path

import transformers

from tests.engine.hf_reference import load_hf_model

# A vision encoder as small as Qwen3.5's configs allow.
_VISION = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
           "patch_size": 4, "num_position_embeddings": 16}


def save_as_multimodal(text_folder: Path, folder: Path, config_class: type,
                       model_class: type) -> Path:
    """text_folder's model inside model_class (a ConditionalGeneration class of config_class),
    saved with its tokenizer into folder."""
    text = transformers.AutoConfig.from_pretrained(text_folder)
    config = config_class(text_config=text.to_dict(),
                          vision_config=_VISION | {"out_hidden_size": text.hidden_size},
                          tie_word_embeddings=False)
    model = model_class(config)
    text_model = load_hf_model(text_folder)
    missing, _ = model.model.language_model.load_state_dict(text_model.model.state_dict(),
                                                            strict=False)
    assert not missing
    model.lm_head.load_state_dict(text_model.lm_head.state_dict())
    model.save_pretrained(folder)
    transformers.AutoTokenizer.from_pretrained(text_folder).save_pretrained(folder)
    return folder
