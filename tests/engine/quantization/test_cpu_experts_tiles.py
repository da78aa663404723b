"""The CPU experts' method runs moe_tiles for calls of many rows an expert and moe_forward for
the others (pagoda/engine/quantization/cpu_experts.py), from the row count the load-time calibration
measured moe_tiles faster; it calibrates once per layer shape."""

import sys

import pytest
import torch
from expert_blocks import expert_blocks

from pagoda.engine.layers.moe import ExpertWeights
from pagoda.engine.quantization import cpu_experts, cpu_paths
from pagoda.engine.quantization.cpu_experts import CpuExpertsMethod, ManyRows, in_place_experts
from pagoda.engine.quantization.expert_weights import expert_weight
from pagoda.engine.quantization.native_kernels import load_native

HIDDEN, WIDTH, EXPERTS, TOP_K = 256, 96, 4, 2


@pytest.fixture(scope="module", autouse=True)
def kernels():
    if load_native("moe_experts") is None or cpu_experts._tiles_kernel() is None:
        pytest.skip("pagoda/kernels/cpu/moe_experts.c or moe_tiles.c does not build here")


def _experts(kind: str = "MXFP4") -> list[ExpertWeights]:
    return [ExpertWeights(*(expert_weight(expert_blocks(kind, n, k, seed=3 * e + p), kind)
                            for p, (n, k) in enumerate(((WIDTH, HIDDEN), (WIDTH, HIDDEN),
                                                        (HIDDEN, WIDTH)))))
            for e in range(EXPERTS)]


def _step(m: int):
    g = torch.Generator().manual_seed(m)
    ids = torch.stack([torch.randperm(EXPERTS, generator=g)[:TOP_K] for _ in range(m)])
    weights = torch.softmax(torch.randn(m, TOP_K, generator=g), -1)
    return torch.randn(m, HIDDEN, generator=g), weights, ids


@pytest.fixture
def calibrations(monkeypatch):
    """The calibration's answers by layer shape, each call counted, timing nothing."""
    made = []

    def calibrate(kernel, tiles, layer):
        made.append(layer.struct.hidden)
        return 3

    monkeypatch.setattr(cpu_experts, "calibrate_tiles", calibrate)
    monkeypatch.setattr(cpu_experts, "_calibrated", {})
    return made


def test_calls_of_many_rows_an_expert_run_moe_tiles_and_the_others_moe_forward(calibrations):
    """From 3 rows an expert: 6 rows x 2 slots over 4 experts run moe_tiles, 5 do not."""
    method = in_place_experts(_experts(), "silu")
    many = method._many
    assert many is not None and many.from_rows == 3
    layer, kernel = method._layer, method._kernel
    for m, tiles in ((5, False), (6, True), (9, True)):
        x, weights, ids = _step(m)
        assert method.runs_tiles(m, TOP_K) is tiles
        run = many.kernel.forward if tiles else kernel.forward
        want = run(layer, x, ids, weights, threads=torch.get_num_threads())
        assert torch.equal(method.apply(x, weights, ids), want), m


def test_a_long_step_goes_in_slices_each_row_as_in_a_call_of_its_slice(calibrations,
                                                                       monkeypatch):
    monkeypatch.setattr(cpu_experts, "TILES_ROWS_A_CALL", 8)
    method = in_place_experts(_experts(), "silu")
    x, weights, ids = _step(16)
    got = method.apply(x, weights, ids)
    for start in (0, 8):
        part = slice(start, start + 8)
        want = method._many.kernel.forward(
            method._layer, x[part].contiguous(), ids[part].contiguous(),
            weights[part].contiguous(), threads=torch.get_num_threads())
        assert torch.equal(got[part], want)


def test_calibrates_once_for_layers_of_one_shape(calibrations):
    for _ in range(3):
        in_place_experts(_experts(), "silu")
    assert calibrations == [HIDDEN]


def test_types_moe_tiles_does_not_read_keep_moe_forward_uncalibrated(calibrations):
    method = in_place_experts(_experts("Q8_0"), "silu")
    assert isinstance(method, CpuExpertsMethod) and method._many is None
    assert not method.runs_tiles(1000, TOP_K)
    assert calibrations == []


def test_where_moe_tiles_never_wins_it_never_runs(monkeypatch):
    monkeypatch.setattr(cpu_experts, "calibrate_tiles", lambda kernel, tiles, layer: sys.maxsize)
    monkeypatch.setattr(cpu_experts, "_calibrated", {})
    method = in_place_experts(_experts(), "silu")
    assert method._many is None and not method.runs_tiles(1000, TOP_K)


def test_calibration_finds_the_rows_from_which_the_second_call_is_faster(monkeypatch):
    """A clock each call advances by its own cost: the second way costs less from 16 rows,
    and not at 4 rows after winning at 2 (the first size it wins from for good is taken)."""
    now = [0.0]
    monkeypatch.setattr(cpu_paths.time, "perf_counter", lambda: now[0])

    def costs(seconds):
        return lambda: now.__setitem__(0, now[0] + seconds)

    costs_by_rows = {2: (1.0, 0.5), 4: (1.0, 2.0), 8: (1.0, 1.5), 16: (2.0, 1.0), 32: (4.0, 1.0)}
    calls = {r: (costs(a), costs(b)) for r, (a, b) in costs_by_rows.items()}
    from_rows, timings = cpu_paths.second_wins_from(calls)
    assert from_rows == 16
    assert timings == costs_by_rows


def test_the_calibration_times_both_kernels_on_the_layer_and_answers_a_row_count(monkeypatch):
    timed = []
    monkeypatch.setattr(cpu_experts, "second_wins_from",
                        lambda calls: (timed.append(calls), cpu_paths.second_wins_from(calls))[1])
    monkeypatch.setattr(cpu_experts, "_calibrated", {})
    method = in_place_experts(_experts(), "silu")
    assert list(timed[0]) == list(cpu_experts.CALIBRATION_ROWS)
    many = method._many
    assert many is None or (isinstance(many, ManyRows)
                            and many.from_rows in cpu_experts.CALIBRATION_ROWS)
