"""Decodes are attended in a few groups of similar length so short ones do not pad to long ones."""

from itertools import pairwise

from pagoda.engine.worker.model_runner import group_by_length


def test_similar_lengths_share_one_group():
    assert group_by_length([100, 95, 90, 80]) == [(0, 4)]


def test_much_shorter_sequences_start_a_new_group():
    assert group_by_length([400, 390, 200, 190, 20]) == [(0, 2), (2, 4), (4, 5)]


def test_groups_are_capped_and_cover_every_sequence():
    lengths = [2 ** k for k in range(12, 0, -1)]
    groups = group_by_length(lengths)
    assert len(groups) <= 4
    assert groups[0][0] == 0 and groups[-1][1] == len(lengths)
    assert all(a[1] == b[0] for a, b in pairwise(groups))


def test_no_decodes_no_groups():
    assert group_by_length([]) == []
