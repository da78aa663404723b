"""The bookkeeping's rules for a prompt's images: a chunk or a prefix hit never ends inside one,
and a block's hash holds the images behind its placeholders."""

import pytest

from pagoda.engine.core.block_pool import hash_block_tokens
from pagoda.engine.core.image_spans import ImageSpan, block_extra, chunk_end, hit_end

IMAGE = ImageSpan(offset=10, length=16, content_hash="a" * 64, pixels=None)  # tokens 10..25


@pytest.mark.parametrize(("start", "n", "taken"), [
    (0, 8, 8),     # ends before the image
    (0, 10, 10),   # ends where it starts
    (0, 12, 10),   # would end inside: cut before it
    (10, 4, 16),   # starts at it: takes it whole, past the budget
    (14, 2, 12),   # starts inside (after a preemption mid-image): the rest of it
    (0, 40, 40),   # takes it whole within the budget
    (26, 5, 5),    # after it
])
def test_a_chunk_never_ends_inside_an_image(start, n, taken):
    assert chunk_end([IMAGE], start, n) == taken


def test_a_prefix_hit_ending_inside_an_image_is_cut_to_a_block_before_it():
    assert hit_end([IMAGE], 16, block_size=8) == 8
    assert hit_end([IMAGE], 32, block_size=8) == 32
    assert hit_end([IMAGE], 8, block_size=8) == 8


def test_a_block_over_an_image_hashes_with_the_image():
    tokens = list(range(8))
    other = ImageSpan(10, 16, "b" * 64, None)
    assert block_extra([IMAGE], 0, 8) == b""
    assert block_extra([IMAGE], 8, 16) != block_extra([other], 8, 16)
    assert (hash_block_tokens(None, tokens, block_extra([IMAGE], 8, 16))
            != hash_block_tokens(None, tokens, block_extra([other], 8, 16))
            != hash_block_tokens(None, tokens))
