"""Multimodal RoPE's positions as transformers' get_rope_index lays them out: text counts on,
an image's tokens share its first position's time and lie on its grid from there, and the text
after it continues from one past its largest position, in whatever chunks the prompt comes."""

import torch

from pagoda.engine.core.image_spans import ImageSpan
from pagoda.engine.worker.mrope_positions import chunk_positions, position_offset

# Three tokens of text, an image of 2 rows x 3 columns (tokens 3..8), two tokens of text, an
# image of 1 x 2 (tokens 11..12), one token of text.
SPANS = (ImageSpan(3, 6, "a", None, (2, 3), whole=False),
         ImageSpan(11, 2, "b", None, (1, 2), whole=False))
WHOLE = torch.tensor([[0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7, 8, 8, 10],
                      [0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7, 8, 8, 10],
                      [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 8, 9, 10]])


def test_a_prompt_with_images_has_transformers_positions():
    torch.testing.assert_close(chunk_positions(SPANS, 0, 14), WHOLE)


def test_chunks_give_the_positions_of_the_whole_prompt():
    for size in (1, 2, 4, 5):
        parts = []
        for start in range(0, 14, size):
            end = min(start + size, 14)
            rows = chunk_positions(SPANS, start, end)
            if rows is None:  # text alone: its indices, offset by the images before it
                offset = position_offset(SPANS, start)
                rows = torch.arange(start + offset, end + offset).repeat(3, 1)
            parts.append(rows)
        torch.testing.assert_close(torch.cat(parts, dim=1), WHOLE)


def test_decoding_runs_behind_the_index_by_what_the_grids_save():
    # The first image spans 6 tokens and 3 positions, the second 2 tokens and 2 positions.
    assert position_offset(SPANS, 14) == -3
    assert position_offset(SPANS, 3) == 0
    assert chunk_positions(SPANS, 13, 15) is None
