"""The dgrad family: CUTLASS 2.x implicit-GEMM dgrad kernels (``mma.sync``, SM80 style),
emitted by ``cutlass_library``: every stride, padding, dilation (stride 1), groups (one launch
per group), bias in the epilogue, any channel count (narrower accesses where they do not divide
by 4), batches of 2 GiB or more in chunks. NHWC: NCHW tensors pass through the layout passes.
``docs/design/dgrad.md``.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

from .. import build
from ..build import Sources
from ..launch import KERNEL_SYMBOL, Kernel
from ..spec import SHARED_MEMORY_LIMIT, KernelConfig, default_config
from . import layout
from .base import Family, Prepared, load, packed

# (threadblock M, N, K), warps (M, N, K), stages. Threadblock N = 32 matches narrow outputs
# (C_out = 32: no half-empty MMA tiles); N = 64 rows are CUTLASS's stock tiles.
CANDIDATE_TILES = {
    "tf32": [((256, 64, 16), (4, 2, 1), 4), ((128, 32, 16), (4, 1, 1), 4),
             ((128, 32, 16), (4, 1, 1), 6), ((128, 32, 32), (4, 1, 1), 3),
             ((256, 32, 16), (4, 1, 1), 4), ((256, 32, 32), (4, 1, 1), 3),
             ((64, 32, 32), (2, 1, 1), 4), ((128, 64, 16), (2, 2, 1), 4),
             ((128, 64, 32), (2, 2, 1), 3)],
    "fp32": [((128, 64, 16), (2, 2, 1), 4), ((128, 32, 16), (4, 1, 1), 4),
             ((128, 32, 32), (4, 1, 1), 3), ((256, 32, 16), (4, 1, 1), 3),
             ((64, 32, 32), (2, 1, 1), 4), ((256, 64, 16), (4, 2, 1), 3)],
}


def cutlass_operation(config: KernelConfig):
    """The ``cutlass_library.Conv2dOperation`` that describes ``config``."""
    import cutlass_library as cl  # imported lazily: only a build needs it

    math_operation = {
        "tf32": cl.MathOperation.multiply_add,  # float operands, TF32 tensor cores
        "fp32": cl.MathOperation.multiply_add_fast_f32,  # 3xTF32
    }[config.precision]
    math = cl.MathInstruction([16, 8, 8], cl.DataType.f32, cl.DataType.f32, cl.DataType.f32,
                              cl.OpcodeClass.TensorOp, math_operation)
    tile = cl.TileDescription(list(config.threadblock_shape), config.stages,
                              list(config.warp_count), math, 80, 1024)
    nhwc = cl.LayoutType.TensorNHWC
    a = cl.TensorDescription(cl.DataType.f32, nhwc, config.alignment_a)
    b = cl.TensorDescription(cl.DataType.f32, nhwc, config.alignment_c)
    c = cl.TensorDescription(cl.DataType.f32, nhwc, config.alignment_c)
    stride = {"unity": cl.StrideSupport.Unity, "strided": cl.StrideSupport.Strided}
    iterator = {"optimized": cl.IteratorAlgorithm.Optimized,
                "analytic": cl.IteratorAlgorithm.Analytic}
    swizzle = getattr(cl.SwizzlingFunctor, config.swizzle)
    return cl.conv2d_operation.Conv2dOperation(
        cl.ConvKind.Dgrad, iterator[config.iterator_algorithm], 80, tile, a, b, c,
        cl.DataType.f32, stride[config.stride_support], swizzling_functor=swizzle)


def operation_h(config: KernelConfig) -> str:
    """``operation.h``: the CUTLASS includes and ``using ConvtKernel = <emitted kernel>;``."""
    import cutlass_library as cl

    operation = cutlass_operation(config)
    instance = cl.conv2d_operation.EmitConv2dInstance().emit(operation)
    return "\n".join([
        f"// cutlass_convt kernel {config.name}",
        f"// emitted by cutlass_library {operation.procedural_name()}",
        "#pragma once",
        '#include "cutlass/cutlass.h"',
        '#include "cutlass/conv/kernel/default_conv2d_dgrad.h"',
        instance,
        f"using ConvtKernel = {operation.procedural_name()}_base;",
        "",
    ])



@dataclass(frozen=True)
class DgradPlan:
    """Per launch (a group and a chunk of the batch) its ``LaunchPlan`` and the element offsets
    of its views of x, the KRSC filter, the bias and y; the layout passes for NCHW tensors."""

    launches: tuple
    passes: layout.LayoutKernels


class DgradFamily(Family):
    name = "dgrad"
    config_class = KernelConfig
    summary = ("everything else with dilation 1 at stride > 1, kernels up to 32 x 32 and samples "
               "under 2 GiB; sm_80",
               "CUTLASS 2.x implicit-GEMM dgrad (unity-stride or strided kernel; NHWC, layout "
               "passes for NCHW; one launch per group)")

    def unsupported_reasons(self, spec):
        return spec.int32_reasons() + spec.cutlass_unsupported_reasons()

    def candidates(self, spec):
        """The default first, then every candidate tile whose main-loop shared memory
        (stages x (M x K + K x N) floats) fits."""
        base = default_config(spec)
        found = [base]
        for tile, warps, stages in CANDIDATE_TILES[spec.precision]:
            m, n, k = tile
            if stages * (m * k + k * n) * 4 > SHARED_MEMORY_LIMIT:
                continue
            config = dataclasses.replace(base, threadblock_shape=tile, warp_count=warps,
                                         stages=stages)
            if config not in found:
                found.append(config)
        return found

    def sources(self, config: KernelConfig) -> Sources:
        return Sources("kernel.cu", (KERNEL_SYMBOL,), host=("host.cu",), header="operation.h",
                       emit=functools.partial(operation_h, config),
                       emitters=(operation_h, cutlass_operation), arch=str(config.arch),
                       host_flags=(build.gencode(str(config.arch)),))

    def builds(self, config):
        passes = layout.LayoutConfig(config.arch)
        return ((config, self.sources(config)), (passes, layout.LAYOUT.sources(passes)))

    def prepare(self, spec, config, device):
        passes = layout.kernels(spec.arch)
        kernel = load(self, config, Kernel)
        plans: dict = {}
        launches = []
        for item in spec.dgrad_launches():
            key = (item.problem, item.x_strides, item.y_strides)
            if key not in plans:
                plans[key] = kernel.plan(item, spec.bias)
            launches.append((plans[key], item.offsets))
        return Prepared(spec, config, self, kernel, DgradPlan(tuple(launches), passes), device)

    def run(self, prepared, input, weight, bias, stream):
        """NHWC x, KRSC filter and NHWC y, through the layout passes for NCHW."""
        spec, config, plan, device = (prepared.spec, prepared.config, prepared.plan,
                                      prepared.device)
        x = layout.to_nhwc(input, 4 * config.alignment_a, plan.passes, device, stream)
        filter_krsc = layout.to_nhwc(weight, 4 * config.alignment_c, plan.passes, device,
                                     stream)
        y = torch.empty(spec.out_shape, dtype=x.dtype, device=x.device,
                        memory_format=torch.channels_last)
        # without bias the kernel reads no C operand (beta = 0): any address will do
        b = packed(bias, 4 * config.alignment_c, torch.contiguous_format) if spec.bias else y
        prepared.kernel.run(plan.launches, device, stream, x.data_ptr(), filter_krsc.data_ptr(),
                            b.data_ptr(), y.data_ptr())
        return layout.from_nhwc(y, spec.channels_last, plan.passes, device, stream)


FAMILY = DgradFamily()
