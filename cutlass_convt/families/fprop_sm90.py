"""The fprop_sm90 family: CUTLASS 3.x's SM90 TMA + ``wgmma`` convolution, emitted by
``cutlass_library``'s 3.x conv emitter and run as the forward convolution of x with the flipped,
transposed filter (stride 1, TF32, NHWC: NCHW tensors pass through the layout passes).
``docs/design/fprop_sm90.md``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..build import Sources
from ..launch import FPROP_SM90_SYMBOL, FpropSm90Kernel
from ..spec import FpropSm90Config, fprop_sm90_configs
from . import layout
from .base import Family, Prepared, load


def cutlass_operation(config: FpropSm90Config):
    """The ``cutlass_library`` ``ConvOperation3x`` of ``config``: TF32 fprop, fp32 NHWC
    activation, KRSC filter and NHWC output, 16-byte (TMA) alignment, warp-specialized TMA
    main loop and epilogue. The 3.x emitter hands only the tile, cluster and stage count to
    CUTLASS's collective builders, which pick the wgmma instruction themselves."""
    import cutlass_library as cl
    from cutlass_library.generator import ConvOperation3x

    math = cl.MathInstruction([64, config.tile[1], 8], cl.DataType.tf32, cl.DataType.tf32,
                              cl.DataType.f32, cl.OpcodeClass.TensorOp,
                              cl.MathOperation.multiply_add)
    tile = cl.TileDescription(list(config.tile), config.stages, [4, 1, 1], math, config.arch,
                              config.arch, list(config.cluster))
    nhwc = cl.TensorDescription(cl.DataType.f32, cl.LayoutType.TensorNHWC, 4)
    return ConvOperation3x(cl.ConvKind.Fprop, tile, nhwc, nhwc, nhwc, cl.DataType.f32,
                           kernel_schedule=cl.KernelScheduleType.ImplicitTmaWarpSpecializedSm90,
                           epilogue_schedule=cl.EpilogueScheduleType.TmaWarpSpecialized)


def operation_h(config: FpropSm90Config) -> str:
    """``operation.h`` of an SM90 fprop kernel: the 3.x emitter's includes (in its order: the
    conv headers are not self-contained; less ``conv_operation_3x.hpp``, which belongs to
    CUTLASS's profiler library), the instance, ``using ConvtKernel = ...;``."""
    from cutlass_library.conv3x_emitter import EmitConv3xIncludes, EmitConv3xInstance

    operation = cutlass_operation(config)
    name = operation.procedural_name()
    return "\n".join([
        f"// cutlass_convt kernel {config.name}",
        f"// emitted by cutlass_library {name}",
        "#pragma once",
        *(f'#include "{include}"' for include in EmitConv3xIncludes().includes
          if include != "conv_operation_3x.hpp"),
        EmitConv3xInstance().emit(operation),
        f"using ConvtKernel = {name}_base;",
        "",
    ])



@dataclass(frozen=True)
class FpropSm90Plan:
    """The forward problem of one transposed convolution (the host library's int32 array),
    and the layout passes for NCHW tensors."""

    problem: object
    passes: layout.LayoutKernels


class FpropSm90Family(Family):
    name = "fprop_sm90"
    config_class = FpropSm90Config
    summary = ("other stride-1 problems in TF32 with dilation 1, groups 1, C_in % 4 == 0, "
               "C_out % 32 == 0, padding <= kernel_size - 1, no bias; sm_90",
               "CUTLASS 3.x TMA + wgmma fprop on the flipped filter (NHWC; layout passes "
               "for NCHW)")

    def unsupported_reasons(self, spec):
        return spec.int32_reasons() + spec.fprop_sm90_unsupported_reasons()

    def candidates(self, spec):
        return fprop_sm90_configs(spec)

    def sources(self, config: FpropSm90Config) -> Sources:
        # host code only; libcuda is opened at run time (dlopen), see fprop_sm90_host.cu
        return Sources("fprop_sm90_kernel.cu", (FPROP_SM90_SYMBOL,),
                       host=("fprop_sm90_host.cu",), header="operation.h",
                       emit=functools.partial(operation_h, config),
                       emitters=(operation_h, cutlass_operation), arch=f"{config.arch}a",
                       host_flags=("-Xlinker", "--no-undefined"), host_libs=("-ldl",))

    def builds(self, config):
        passes = layout.LayoutConfig(config.arch)
        return ((config, self.sources(config)), (passes, layout.LAYOUT.sources(passes)))

    def prepare(self, spec, config, device):
        passes = layout.kernels(spec.arch)
        kernel = load(self, config, FpropSm90Kernel)
        return Prepared(spec, config, self, kernel, FpropSm90Plan(kernel.plan(spec), passes),
                        device)

    def run(self, prepared, input, weight, bias, stream):
        """NHWC x and y (layout passes for NCHW), the filter flipped and transposed to the
        forward convolution's KRSC (K = C_out, C = C_in); no bias (refused by the limits)."""
        plan, device = prepared.plan, prepared.device
        x = layout.to_nhwc(input, 16, plan.passes, device, stream)
        filter_krsc = weight.flip(2, 3).permute(1, 2, 3, 0).contiguous()
        y = torch.empty(prepared.spec.out_shape, dtype=x.dtype, device=x.device,
                        memory_format=torch.channels_last)
        prepared.kernel.run(plan.problem, device, stream, x.data_ptr(), filter_krsc.data_ptr(),
                            y.data_ptr())
        return layout.from_nhwc(y, prepared.spec.channels_last, plan.passes, device, stream)


FAMILY = FpropSm90Family()
