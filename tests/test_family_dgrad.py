"""The dgrad family: emission, the PyTorch -> CUTLASS dgrad mapping, launches per group and
chunk, alignment, limits (CPU) and its host library (nvcc)."""

from __future__ import annotations

import dataclasses

import pytest

import cutlass_convt
from cutlass_convt import emit, problems
from cutlass_convt.families.dgrad import (
    DGRAD_SYMBOL,
    DgradKernel,
    default_dgrad_config,
    dgrad_launches,
    dgrad_problem,
    operation_h,
    sample_bytes,
)
from cutlass_convt.families.dgrad import FAMILY as DGRAD
from cutlass_convt.spec import ProblemSpec

from helpers import CASE, FP32, TF32, TF32_SOURCES, problem71


def test_emitted_source_names_the_dgrad_kernel():
    header = operation_h(TF32)
    for expected in ("cutlass::conv::kernel::DefaultConv2dDgrad<",
                     "cutlass::gemm::GemmShape<128, 32, 32>",
                     "cutlass::gemm::GemmShape<32, 32, 32 >",
                     "cutlass::gemm::GemmShape<16, 8, 8>", "cutlass::arch::OpMultiplyAdd,",
                     "cutlass::conv::IteratorAlgorithm::kOptimized",
                     "cutlass::conv::StrideSupport::kUnity", "cutlass::arch::Sm80",
                     "using ConvtKernel = cutlass_tensorop_s1688dgrad_optimized_128x32_32x3_nhwc"
                     "_unity_stride_align4_base;"):
        assert expected in header, expected
    fp32 = operation_h(FP32)
    assert "cutlass::arch::OpMultiplyAddFastF32" in fp32 and "GemmShape<256, 32, 16>" in fp32
    assert TF32_SOURCES.templates == ("dgrad_kernel.cu", "dgrad_host.cu")
    assert TF32_SOURCES.header == "operation.h"
    kernel = emit.template("dgrad_kernel.cu")
    assert 'extern "C" __global__' in kernel and DGRAD_SYMBOL in kernel


@pytest.mark.nvcc
def test_host_library_plans_problem71_and_rejects_misaligned(artifact):
    kernel = DgradKernel(artifact)  # host library only: no GPU needed
    assert kernel.threads == 128 and kernel.shared_bytes > 48 * 1024
    (launch_71,) = dgrad_launches(CASE.spec("tf32", 90))
    plan = kernel.plan(launch_71, has_bias=False)
    assert plan.grid == (-(-8 * 514 * 1026 // 128), 1, 1)
    assert len(plan.params) == kernel.params_bytes and len(set(plan.offsets)) == 4
    misaligned = dataclasses.replace(
        launch_71, problem=dataclasses.replace(launch_71.problem, C=30))
    with pytest.raises(cutlass_convt.UnsupportedProblem,
                       match="kErrorInvalidProblem|kErrorMisalignedOperand"):
        kernel.plan(misaligned, has_bias=False)


def test_problem71_spec_maps_to_dgrad():
    case = problems.find("kernelbench-71")
    spec = case.spec("tf32", 90)
    assert spec.out_shape == (8, 32, 514, 1026)
    d = dgrad_problem(spec)
    assert (d.N, d.H, d.W, d.C, d.K, d.R, d.S, d.P, d.Q) == (8, 514, 1026, 32, 32, 3, 3, 512, 1024)
    default = default_dgrad_config(spec)
    assert default.alignment_a == 4 and default.alignment_c == 4
    assert default_dgrad_config(spec).threadblock_shape == (128, 32, 32)  # N = C_out = 32
    wide = problems.find("kernelbench-57").spec("tf32", 90)
    assert default_dgrad_config(wide).threadblock_shape == (128, 64, 32)
    assert default_dgrad_config(case.spec("fp32", 90)).precision == "fp32"


def test_alignment_follows_channel_counts():
    base = problems.find("kernelbench-71")
    spec = ProblemSpec(**{**base.spec("tf32", 90).__dict__, "in_channels": 6, "out_channels": 7})
    config = default_dgrad_config(spec)
    assert (config.alignment_a, config.alignment_c) == (2, 1)


def test_groups_become_one_launch_per_group_on_channel_views():
    spec = problem71(in_channels=32, out_channels=48, groups=4, batch=2, in_size=(5, 7),
                 padding=(1, 1))
    launches = dgrad_launches(spec)
    assert len(launches) == 4
    h, w = spec.out_size
    for g, item in enumerate(launches):
        assert (item.problem.K, item.problem.C, item.problem.N) == (8, 12, 2)
        assert item.x_strides == (32, 7 * 32, 5 * 7 * 32)
        assert item.y_strides == (48, w * 48, h * w * 48)
        assert item.offsets == (8 * g, 8 * 9 * 12 * g, 12 * g, 12 * g)
    config = default_dgrad_config(spec)
    assert (config.alignment_a, config.alignment_c) == (4, 4)
    depthwise = default_dgrad_config(problem71(in_channels=32, out_channels=32, groups=32))
    assert (depthwise.alignment_a, depthwise.alignment_c) == (1, 1)


def test_large_batches_are_chunked_under_2_gib():
    spec = problems.find("kernelbench-57").spec("tf32", 90)  # 2.2 GB per tensor
    launches = dgrad_launches(spec)
    assert sum(item.problem.N for item in launches) == spec.batch == 8
    per_sample = sample_bytes(spec)
    for item in launches:
        assert item.problem.N * per_sample < 2**31
    starts = [item.offsets[0] // item.x_strides[2] for item in launches]
    assert starts == sorted(set(starts)) and starts[0] == 0
    assert DGRAD.unsupported_reasons(spec) == []


def test_stride_picks_the_strided_dgrad_kernel():
    config = default_dgrad_config(problem71(stride=(2, 2)))
    assert config.stride_support == "strided" and config.swizzle == "StridedDgradIdentity1"
    assert default_dgrad_config(problem71()).stride_support == "unity"


def test_unsupported_reasons_name_the_cause():
    assert DGRAD.unsupported_reasons(problem71()) == []
    (reason,) = DGRAD.unsupported_reasons(problem71(stride=(5, 5), dilation=(2, 2)))
    assert "dilation" in reason and "strided dgrad" in reason
    (reason,) = DGRAD.unsupported_reasons(problem71(kernel_size=(33, 3)))
    assert "32x32" in reason
    (reason,) = DGRAD.unsupported_reasons(problem71(in_channels=4096, out_channels=4096))
    assert "2 GiB" in reason
