"""int4 layers through our q4_gemv kernel: the products, the buffers a call reuses, the layouts
a layer keeps, the load-time choice between it and PyTorch's kernel, and the fallback."""

from __future__ import annotations

import ctypes
import sys

import pytest
import torch
import torch.nn.functional as F
from dequantized_self import greedy_tokens, logits_error
from tiny_gguf import write_tiny_gguf

from pagoda.engine import LLM, SamplingParams
from pagoda.engine.config import EngineConfig
from pagoda.engine.layers.linear import Placement, make_linear
from pagoda.engine.llm_engine import LLMEngine
from pagoda.engine.loading.loader import load_model
from pagoda.engine.quantization import cpu_paths
from pagoda.engine.quantization.cpu_int4 import CpuInt4Method
from pagoda.engine.quantization.cpu_paths import CpuPathPolicy, RowTimings
from pagoda.engine.quantization.cpu_q4 import Q4Context, load_q4_context
from pagoda.engine.quantization.dequantize_workspace import DequantWorkspace
from pagoda.engine.quantization.native_kernels import load_native
from pagoda.engine.quantization.tensors import Int4Weight, dequantize, quantize_int4, quantize_int8
from pagoda.engine.worker.evaluation import compare, prompt_logits
from pagoda.engine.worker.model_runner import ModelRunner
from pagoda.kernels.cpu import native
from pagoda.kernels.cpu.dequant import Dequantizer
from pagoda.kernels.cpu.native import find_compiler
from pagoda.kernels.cpu.q4_amx import Q4Amx
from pagoda.kernels.cpu.q4_gemv import KQ_RECORDS, Q4Gemv
from pagoda.kernels.kernel_ops import TORCH_OPS

Q4_EVERY_STEP = CpuPathPolicy(native_below_rows=sys.maxsize)


@pytest.fixture(scope="module")
def q4(kernel_build_dir) -> Q4Context:
    if find_compiler() is None:
        pytest.skip("no C compiler (gcc or $CC) to build pagoda/kernels/cpu/q4_gemv.c")
    lib = Q4Gemv.load(kernel_build_dir)
    if lib.best_isa() < 1:
        pytest.skip("this CPU lacks AVX2, so the engine keeps PyTorch's int4 kernel")
    return Q4Context(lib)


@pytest.fixture
def q4_chosen(monkeypatch, kernels_cache_dir, kernels_at_every_step):
    """The engine builds q4_gemv under the session's cache folder, and its calibration finds it
    the faster kernel at every step size (`kernels_at_every_step`)."""
    monkeypatch.setenv("PAGODA_CACHE_DIR", str(kernels_cache_dir))
    monkeypatch.setattr("pagoda.engine.quantization.native_kernels._unavailable", {})


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm()).item()


def _activations(rows: int, k: int) -> torch.Tensor:
    x = torch.randn(rows, k)
    x[:, :3] *= 20  # a few large channels, as real activations have
    return x


@pytest.mark.parametrize("rows", [1, 3, 16])
def test_q4_layer_is_the_exact_product_to_16_bits(q4, rows):
    torch.manual_seed(0)
    weight = quantize_int4(torch.randn(40, 96) * 0.05)  # 40 outputs: a partial tile of rows
    x, bias = _activations(rows, 96), torch.randn(40)
    layer = CpuInt4Method(weight, Q4_EVERY_STEP, q4=q4)
    got = layer.apply(x, bias)
    want = F.linear(x, dequantize(weight), bias)
    assert got.shape == (rows, 40) and _relative_error(got, want) < 1e-4


def _fp16_scaled(weight: Int4Weight) -> Int4Weight:
    """Q4_1's kind: scales and mins that are fp16 values (held as float32, as the loader does)."""
    return Int4Weight(weight.packed, weight.scales.half().float(), weight.mins.half().float(),
                      weight.group_size)


@pytest.mark.parametrize("precise", [True, False], ids=["int16", "int8"])
def test_q4_layer_of_fp16_scales_reads_compact_records_with_fp32_records_bits(q4, precise):
    torch.manual_seed(6)
    weight = _fp16_scaled(quantize_int4(torch.randn(40, 96) * 0.05))
    layer = CpuInt4Method(weight, Q4_EVERY_STEP, q4=q4, precise=precise)
    assert layer.native.repacked.compact
    fp32_records = q4.lib.repack(weight.packed, weight.scales, weight.mins)
    assert not fp32_records.compact
    x = _activations(3, 96)
    linear = q4.lib.linear16 if precise else q4.lib.linear
    assert torch.equal(layer.kernel(x), linear(fp32_records, x, threads=torch.get_num_threads()))
    assert layer.native.repacked.data.numel() == 80 * 10 * 3


def test_q4_layer_whose_scales_fp16_cannot_hold_keeps_fp32_records(q4):
    """Q4_K's d * sub-scale needs more bits than fp16 has: exact before speed."""
    torch.manual_seed(7)
    weight = quantize_int4(torch.randn(40, 96) * 0.05)
    layer = CpuInt4Method(weight, Q4_EVERY_STEP, q4=q4)
    assert not layer.native.repacked.compact
    x = _activations(2, 96)
    assert _relative_error(layer.kernel(x), F.linear(x, dequantize(weight))) < 1e-4


def test_q4_vocabulary_pass_is_int8_precise(q4):
    torch.manual_seed(1)
    weight = quantize_int4(torch.randn(64, 96) * 0.05)
    x = _activations(2, 96)
    got = CpuInt4Method(weight, Q4_EVERY_STEP, q4=q4, precise=False).kernel(x)
    error = _relative_error(got, F.linear(x, dequantize(weight)))
    assert 1e-4 < error < 2e-2  # one int8 pass: coarser than the layers', fine for candidates


@pytest.mark.parametrize("x", [torch.randn(1, 64), torch.randn(64), torch.randn(1, 96).half()],
                         ids=["narrower", "one-dimensional", "fp16"])
def test_q4_layer_refuses_an_input_it_would_read_past_or_misread(q4, x):
    """The C function reads rows x k floats: a narrower row would be read past its end."""
    torch.manual_seed(3)
    layer = CpuInt4Method(quantize_int4(torch.randn(40, 96) * 0.05), Q4_EVERY_STEP, q4=q4)
    with pytest.raises(ValueError, match=r"float32 \[rows, 96\] inputs"):
        layer.kernel(x)


def test_q4_layer_reuses_its_output_buffer_between_decode_steps(q4):
    torch.manual_seed(2)
    weight = quantize_int4(torch.randn(32, 64))
    layer = CpuInt4Method(weight, Q4_EVERY_STEP, q4=q4)
    first_x, second_x = torch.randn(1, 64), torch.randn(1, 64)
    first = layer.kernel(first_x)
    first_ptr, scratch_ptr = first.data_ptr(), q4.scratch.ptr
    second = layer.kernel(second_x)
    assert second.data_ptr() == first_ptr and q4.scratch.ptr == scratch_ptr
    assert _relative_error(second, F.linear(second_x, dequantize(weight))) < 1e-4


def test_vocabulary_logits_get_a_new_tensor_every_call(q4):
    """Callers keep logits across steps (prompt_logits concatenates them)."""
    weight = quantize_int4(torch.randn(32, 64))
    placement = Placement(torch.device("cpu"), torch.float32, TORCH_OPS, Q4_EVERY_STEP, q4)
    lm_head = make_linear(weight, None, placement, precise_int8=False)
    x = torch.randn(1, 64)
    assert lm_head(x).data_ptr() != lm_head(x).data_ptr()


def test_layer_that_runs_q4_at_every_step_keeps_no_int4pack_layout(q4):
    weight = quantize_int4(torch.randn(32, 64))
    assert CpuInt4Method(weight, Q4_EVERY_STEP, q4=q4).packed is None
    both = CpuInt4Method(weight, CpuPathPolicy(native_below_rows=16), q4=q4)
    assert both.packed is not None and both.native is not None
    x = torch.randn(20, 64)
    torch.testing.assert_close(both.kernel(x), both._multiply(x.bfloat16()).float())


def test_q4_layer_still_dequantizes_the_steps_its_policy_gives_a_gemm(q4):
    torch.manual_seed(4)
    weight = quantize_int4(torch.randn(48, 64))
    policy = CpuPathPolicy(dequantize_from_rows=4, native_below_rows=sys.maxsize)
    layer = CpuInt4Method(weight, policy, q4=q4)
    assert layer.packed is None and layer.source is not None
    x = torch.randn(5, 64)
    torch.testing.assert_close(layer.apply(x, None), F.linear(x, dequantize(weight)))


@pytest.mark.parametrize("fp16_scales", [False, True], ids=["fp32-records", "fp16-records"])
def test_q4_layer_widens_its_own_layout_for_a_gemm_and_keeps_no_source(q4, kernel_build_dir,
                                                                       fp16_scales):
    """Where our dequant kernel runs, the steps that run a GEMM widen q4_gemv's layout: one copy
    of the weight serves every step."""
    torch.manual_seed(5)
    weight = quantize_int4(torch.randn(48, 64))
    if fp16_scales:
        weight = _fp16_scaled(weight)
    workspace = DequantWorkspace(Dequantizer(native.load("dequant", kernel_build_dir)))
    policy = CpuPathPolicy(dequantize_from_rows=4, native_below_rows=sys.maxsize,
                           workspace=workspace)
    layer = CpuInt4Method(weight, policy, q4=q4)
    assert layer.packed is None and layer.source is None
    assert layer.native.repacked.compact == fp16_scales
    assert torch.equal(layer.dequantized(torch.float32), dequantize(weight))
    x = torch.randn(5, 64)
    torch.testing.assert_close(layer.apply(x, None), F.linear(x, dequantize(weight)))
    assert workspace.nbytes == 48 * 64 * 4


def test_calibration_frees_the_workspace_where_no_step_runs_a_gemm(q4, kernel_build_dir,
                                                                   monkeypatch):
    weight = quantize_int4(torch.randn(48, 64))
    workspace = DequantWorkspace(Dequantizer(native.load("dequant", kernel_build_dir)))
    probe = CpuInt4Method(weight, CpuPathPolicy(dequantize_from_rows=1, workspace=workspace))
    probe.dequantized(torch.float32)
    monkeypatch.setattr(cpu_paths, "_timings", lambda probe, native, rows: {
        m: RowTimings(2.0, 1.0, 100.0, 100.0) for m in rows})
    policy = cpu_paths.calibrate(probe, 256, None)
    assert policy.dequantize_from_rows is None and policy.workspace is workspace
    assert workspace.nbytes == 0


def test_grouped_int8_through_q4_is_the_exact_product_to_16_bits(q4):
    torch.manual_seed(3)
    weight = quantize_int8(torch.randn(40, 64), group_size=32, asymmetric=True)
    placement = Placement(torch.device("cpu"), torch.float32, TORCH_OPS, Q4_EVERY_STEP, q4)
    layer = make_linear(weight, None, placement)
    assert layer.method.halves.native is not None and layer.method.halves.packed is None
    x = _activations(3, 64)
    assert _relative_error(layer(x), F.linear(x, dequantize(weight))) < 1e-4


def _timings(**by_rows: tuple[float, float]) -> dict[int, RowTimings]:
    """rows_N=(int4pack, q4) seconds; fp32 and bf16 GEMMs far slower (never chosen)."""
    return {int(name[5:]): RowTimings(pack, q4, 100.0, 100.0)
            for name, (pack, q4) in by_rows.items()}


def test_policy_runs_q4_at_every_step_where_it_loses_little():
    policy = cpu_paths._policy_from_timings(
        _timings(rows_1=(14, 10), rows_4=(24, 27), rows_256=(900, 1000)))
    assert policy.native_below_rows == sys.maxsize and not policy.runs_int4pack


def test_policy_keeps_both_layouts_only_where_q4_loses_badly():
    policy = cpu_paths._policy_from_timings(
        _timings(rows_1=(14, 10), rows_4=(24, 20), rows_16=(90, 200), rows_256=(900, 2000)))
    assert policy.native_below_rows == 16 and policy.runs_int4pack


def test_policy_keeps_one_layout_where_q4_loses_batches_by_less_than_the_memory_it_saves():
    # A Zen 5 EPYC's shape at 1B: q4_gemv wins one row, loses 2-16 rows by 1.15-1.7x.
    policy = cpu_paths._policy_from_timings(
        _timings(rows_1=(16, 15), rows_2=(21, 24), rows_4=(29, 46), rows_16=(127, 215)))
    assert policy.native_below_rows == sys.maxsize and not policy.runs_int4pack


def test_policy_keeps_pytorchs_kernel_where_it_beats_q4_clearly_at_one_row():
    policy = cpu_paths._policy_from_timings(_timings(rows_1=(10, 16), rows_16=(90, 50)))
    assert policy.native_below_rows == 0


@pytest.mark.parametrize("q4_time", [11, 14], ids=["tie", "zen5-default-model"])
def test_policy_gives_one_row_steps_to_q4_for_the_one_call_decode_step(q4_time):
    # Per call PyTorch's kernel may win by a little; the one C call per step wins more.
    policy = cpu_paths._policy_from_timings(_timings(rows_1=(10, q4_time), rows_16=(90, 100)))
    assert policy.native_below_rows == sys.maxsize


def test_policy_runs_q4_amx_from_the_step_size_where_it_wins_for_good():
    timings = {1: RowTimings(14, 10), 4: RowTimings(24, 20, amx=19),
               16: RowTimings(90, 50, amx=60), 64: RowTimings(300, 200, amx=90),
               256: RowTimings(900, 800, amx=300)}
    policy = cpu_paths._policy_from_timings(timings)
    assert policy.amx_from_rows == 64 and "q4_amx from 64 rows" in policy.reason
    assert policy.int8_pass_amx_from_rows == sys.maxsize  # timed apart, on the vocabulary


def test_policy_keeps_q4_gemv_where_q4_amx_loses_the_largest_steps():
    timings = {1: RowTimings(14, 10), 16: RowTimings(90, 50, amx=30),
               64: RowTimings(300, 200, amx=210)}
    assert cpu_paths._policy_from_timings(timings).amx_from_rows == sys.maxsize


def test_policy_weighs_the_dequantized_gemm_against_q4_amx_where_it_runs():
    # q4_gemv alone would lose 64 rows to the fp32 GEMM (200 against 100); q4_amx does not.
    timings = {1: RowTimings(14, 10), 16: RowTimings(90, 50, 60, 200, amx=20),
               64: RowTimings(300, 200, 100, 400, amx=60)}
    policy = cpu_paths._policy_from_timings(timings)
    assert policy.amx_from_rows == 16 and policy.dequantize_from_rows is None


def test_policy_dequantizes_from_where_the_chosen_kernel_loses_to_fp32():
    timings = {1: RowTimings(14, 10), 16: RowTimings(90, 50, 60, 200),
               64: RowTimings(300, 200, 100, 400), 256: RowTimings(900, 800, 300, 1200)}
    policy = cpu_paths._policy_from_timings(timings)
    assert policy.dequantize_from_rows == 64 and policy.gemm_dtype == torch.float32
    assert policy.native_below_rows == sys.maxsize and not policy.runs_int4pack


@pytest.fixture(scope="module")
def tiny_q4_1(tmp_path_factory):
    """The tiny GGUF as Q4_1 layers and a Q8_0 tied vocabulary, the default model's mix."""
    from gguf import GGMLQuantizationType as QType

    path = tmp_path_factory.mktemp("tiny-q4") / "tiny.gguf"
    return write_tiny_gguf(path, matrix_type=QType.Q4_1).path


def _runs_q4(runner: ModelRunner) -> list[bool]:
    """Per linear (the layers' and the vocabulary's), whether q4_gemv multiplies it."""
    methods = [linear.method for linear in runner.model.linears()]
    return [getattr(m, "halves", m).native is not None for m in methods]


def test_engine_multiplies_int4_layers_through_q4_and_matches_dequantized(
        q4, q4_chosen, tiny_q4_1):
    error, runner = logits_error(tiny_q4_1)
    assert all(_runs_q4(runner))
    # PyTorch's bf16 kernel: 0.018 here (below). What is left is the vocabulary's one int8
    # pass outside its refined top 32 candidates.
    assert error < 0.01


def test_q4_1_files_layers_and_vocabulary_get_compact_records(q4, q4_chosen, tiny_q4_1):
    runner = ModelRunner(load_model(tiny_q4_1), EngineConfig(num_kv_blocks=32))
    methods = [getattr(linear.method, "halves", linear.method)
               for linear in runner.model.linears()]
    assert methods and all(m.native.repacked.compact for m in methods)


def test_q4_k_files_layers_get_q4_k_records_and_match_the_dequantized_model(q4, q4_chosen,
                                                                           tmp_path):
    """Q4_K's own six-bit sub-scales with fp16 d per 256 inputs: 0.578 bytes a weight where
    fp32 records take 0.75, and the same products."""
    from gguf import GGMLQuantizationType as QType

    path = write_tiny_gguf(tmp_path / "tiny.gguf", matrix_type=QType.Q4_K).path
    error, runner = logits_error(path)
    layers = [linear.method for linear in runner.model.linears()
              if isinstance(linear.method, CpuInt4Method)]
    assert layers and all(m.native.repacked.record_format == KQ_RECORDS for m in layers)
    assert error < 0.01


def test_engine_without_the_library_runs_pytorchs_int4_kernel(monkeypatch, tiny_q4_1):
    monkeypatch.setenv("PAGODA_NATIVE_KERNELS", "0")
    error, runner = logits_error(tiny_q4_1)
    assert runner.model.layers[0].qkv_proj.method.packed is not None
    assert not any(_runs_q4(runner))
    assert error < 0.03


def test_engine_greedy_tokens_through_q4_are_the_dequantized_models(
        q4, q4_chosen, tiny_q4_1):
    assert greedy_tokens(tiny_q4_1, "auto") == greedy_tokens(tiny_q4_1, "none")


@pytest.fixture
def amx_chosen(q4_chosen, monkeypatch):
    """As q4_chosen, and the calibration finds q4_amx faster than q4_gemv from 4 rows, and
    q8_amx faster than the vocabulary's int8 pass through q8_gemv from 4 rows (skipped where
    this CPU cannot run them)."""
    if load_native("q4_amx") is None or not Q4Amx(load_native("q4_amx")).available():
        pytest.skip("this CPU (or its OS) has no AMX with BF16: q4_amx never runs here")

    def timings(probe, native, rows):
        wide = native is not None and native.has_wide_call
        return {m: RowTimings(2.0, None if native is None else 1.0, 100.0, 100.0,
                              0.5 if wide and m >= 4 else None) for m in rows}

    monkeypatch.setattr(cpu_paths, "_timings", timings)
    monkeypatch.setattr(cpu_paths, "choose_amx_rows", lambda native, k, rows: (4, "chosen"))


def test_batched_steps_run_amx_where_chosen_and_reply_as_the_dequantized_model(
        q4, amx_chosen, tmp_path):
    """Q4_1 layers through q4_amx, the Q8_0 tied vocabulary's int8 pass through q8_amx."""
    from gguf import GGMLQuantizationType as QType

    path = write_tiny_gguf(tmp_path / "tiny.gguf", matrix_type=QType.Q4_1,
                           mixed={"token_embd": QType.Q8_0}).path
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = [list(range(100 + 7 * i, 120 + 9 * i)) for i in range(6)]

    def replies(quantization: str) -> tuple[LLM, list[list[int]]]:
        llm = LLM(str(path), num_kv_blocks=32, num_threads=1, quantization=quantization)
        return llm, [o.outputs[0].token_ids for o in llm.generate(prompts, params)]

    quantized, got = replies("auto")
    method = quantized.engine.runner.model.layers[0].qkv_proj.method
    assert method.policy.amx_from_rows == 4
    amx_address = ctypes.cast(load_native("q4_amx").q4a_linear, ctypes.c_void_p).value
    # The decode step's one C call runs q4_amx from 4 rows, q4_gemv below.
    assert method.c_kernel(6).c_linear(6).fn == amx_address
    assert method.c_kernel(3).c_linear(3).fn != amx_address
    # The vocabulary's int8 pass runs q8_amx from 4 rows too.
    vocabulary = quantized.engine.runner.model.lm_head.linear.method.native
    q8_amx = ctypes.cast(load_native("q8_amx").q8a_linear, ctypes.c_void_p).value
    assert vocabulary.c_linear(6).fn == q8_amx and vocabulary.c_linear(3).fn != q8_amx
    assert got == replies("none")[1]


@pytest.mark.slow
def test_default_model_through_amx_in_64_row_steps_predicts_like_dequantized(
        q4, amx_chosen, quality_reference):
    """Teacher-forced over the quality text in 64-row chunks, every layer's chunk through
    q4_amx and the vocabulary's int8 pass through q8_amx: the bars of the default model's own
    quantization (98% top-1, perplexity within 2%). Measured 100.00% and 1.0005 on a Xeon."""
    token_ids, want = quality_reference
    runner = ModelRunner(load_model(), EngineConfig(num_kv_blocks=200))
    method = runner.model.layers[0].gate_up_proj.method
    assert method.policy.amx_from_rows == 4 and method.policy.dequantize_from_rows is None
    report = compare(want, prompt_logits(runner, token_ids, chunk=64), token_ids)
    assert report.top1_agreement >= 0.98
    assert abs(report.perplexity_ratio - 1) < 0.02


def test_no_compiler_means_pytorchs_int4_kernel(monkeypatch, tmp_path):
    monkeypatch.setenv("PAGODA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setattr("pagoda.engine.quantization.native_kernels._unavailable", {})
    assert load_q4_context() is None


@pytest.mark.slow
def test_default_model_through_q4_replies_as_its_dequantized_self(q4, q4_chosen, make_llm):
    """Greedy, token for token (measured on four prompts of 96 tokens; PyTorch's bf16 kernel
    parted from the dequantized model on two of them)."""
    chats = [[{"role": "user", "content": "Write a short poem about the sea."}],
             [{"role": "user", "content": "Explain photosynthesis in two sentences."}]]
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    quantized = LLM.from_engine(LLMEngine(config=EngineConfig(num_kv_blocks=64),
                                          loaded=load_model()))
    assert all(_runs_q4(quantized.engine.runner))
    want = [o.outputs[0].token_ids for o in make_llm(num_kv_blocks=64).chat(chats, params)]
    assert [o.outputs[0].token_ids for o in quantized.chat(chats, params)] == want
