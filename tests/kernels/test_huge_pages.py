from huge_pages_smaps import THP_ENABLED, needs_huge_pages, smaps_field

from pagoda.kernels.cpu.huge_pages import HUGE_PAGE, huge_page_buffer, huge_page_empty


def test_huge_page_buffer_starts_at_a_huge_page_and_keeps_its_bytes():
    size = 2 * HUGE_PAGE + 12345
    buffer = huge_page_buffer(size)
    assert buffer.numel() == size and buffer.is_contiguous()
    assert buffer.data_ptr() % HUGE_PAGE == 0
    buffer.copy_(buffer.new_ones(size).cumsum(0) % 251)
    view = buffer[-7:]
    del buffer
    assert view.tolist() == [(size - 6 + i) % 251 for i in range(7)]


def test_a_buffer_under_one_huge_page_is_a_plain_tensor():
    buffer = huge_page_buffer(HUGE_PAGE - 1)
    buffer.fill_(3)
    assert buffer.numel() == HUGE_PAGE - 1 and int(buffer.sum()) == 3 * (HUGE_PAGE - 1)


def test_huge_page_empty_is_a_tensor_of_the_shape_and_dtype_asked():
    import torch

    t = huge_page_empty((3, HUGE_PAGE // 4 + 5), torch.float32)
    assert t.shape == (3, HUGE_PAGE // 4 + 5) and t.dtype == torch.float32 and t.is_contiguous()
    t.fill_(0.5)
    assert float(t.sum()) == 0.5 * t.numel()


@needs_huge_pages
def test_whole_huge_pages_are_eligible_for_huge_pages_and_the_partial_last_one_is_not():
    buffer = huge_page_buffer(2 * HUGE_PAGE + 4096)
    buffer.fill_(1)
    assert smaps_field(buffer.data_ptr(), "THPeligible") == 1
    if "[madvise]" in THP_ENABLED.read_text():  # "always" gives every page huge ones anyway
        assert smaps_field(buffer.data_ptr() + 2 * HUGE_PAGE, "THPeligible") == 0
