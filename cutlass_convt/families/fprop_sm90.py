"""The fprop_sm90 family: CUTLASS 3.x's SM90 TMA + ``wgmma`` convolution, emitted by
``cutlass_library``'s 3.x conv emitter and run as the forward convolution of x with the flipped,
transposed filter (stride 1, TF32, NHWC: NCHW tensors pass through the layout passes).
``docs/design/fprop_sm90.md``.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

from .. import cuda
from ..build import Sources
from ..spec import ProblemSpec
from . import layout
from .base import Family, Prepared, UnsupportedProblem, cutlass_status, load, new_packed

FPROP_SM90_SYMBOL = "cutlass_convt_fprop_sm90_kernel"
ABI_VERSION = 3  # fprop_sm90_host.cu's cutlass_convt_abi_version()
# fprop_sm90_host.cu's return codes besides cutlass::Status: kDriverMissing, kEncodeFailed + r
DRIVER_MISSING, ENCODE_FAILED = 100, 1000


@dataclass(frozen=True)
class FpropSm90Config:
    """Template configuration of one CUTLASS 3.x SM90 convolution kernel (TMA im2col loads,
    warp-specialized ``wgmma`` TF32 main loop, TMA epilogue), emitted by ``cutlass_library``'s
    3.x conv emitter as a forward convolution: a stride-1 transposed convolution is the
    forward convolution of x with the filter flipped and transposed (``W.flip(2, 3).permute(1,
    2, 3, 0)``, KRSC with K = C_out, C = C_in) and padding ``R - 1 - padding``. NHWC tensors.

    - ``tile``: CTA tile (M pixels, N output channels, K input channels); ``cluster``: CTAs per
      cluster (only 1x1x1 is launched); ``stages``: main-loop stages (0: as many as fit).
    """

    precision: str
    tile: tuple[int, int, int]
    cluster: tuple[int, int, int] = (1, 1, 1)
    stages: int = 0
    arch: int = 90

    @property
    def name(self) -> str:
        """E.g. ``fprop_sm90_tf32_128x64x32_c1x1x1_sauto_sm90``."""
        return (f"fprop_sm90_{self.precision}_{'x'.join(map(str, self.tile))}"
                f"_c{'x'.join(map(str, self.cluster))}_s{self.stages or 'auto'}_sm{self.arch}")


def fprop_sm90_configs(spec: ProblemSpec) -> list[FpropSm90Config]:
    """The candidates for ``spec``, default first: the widest N tile (32, 64 or 128) that
    divides C_out, M = 128 with 4 stages (measured faster than as many as fit), then with as
    many as fit, then M = 256."""
    n = max(t for t in (32, 64, 128) if spec.out_channels % t == 0)
    return [FpropSm90Config(spec.precision, (m, n, 32), (1, 1, 1), stages, spec.arch)
            for m, stages in ((128, 4), (128, 0), (256, 0))]


class FpropSm90Kernel:
    """One built SM90 fprop kernel in this process. Its tensor addresses live inside TMA
    descriptors in ``Params``, so the host library builds ``Params`` for every launch
    (``cutlass_convt_sm90_params``)."""

    def __init__(self, artifact):
        self.artifact = artifact
        self._host = cuda.host_library(artifact.host_lib, ABI_VERSION)
        info = (ctypes.c_int64 * 11)()
        self._host.cutlass_convt_sm90_describe(info)
        self.threads, self.shared_bytes, self.params_bytes = info[0], info[1], info[2]
        if tuple(info[3:6]) != (1, 1, 1):
            raise RuntimeError(f"{artifact.manifest['kernel']}: clusters > 1 are not launched")
        self._library = cuda.Library(artifact.cubin.read_bytes())

    def plan(self, spec: ProblemSpec):
        """The forward problem (N, H, W, C, K, R, S, P, Q, pad_h, pad_w) of a stride-1
        transposed convolution, as the host library's int32 array, checked with
        ``can_implement`` (on stand-in addresses). Raises :class:`UnsupportedProblem`."""
        (h, w), (r, s), (p, q) = spec.in_size, spec.kernel_size, spec.out_size
        pad = [k - 1 - x for k, x in zip(spec.kernel_size, spec.padding)]
        plan = (ctypes.c_int32 * 11)(spec.batch, h, w, spec.in_channels, spec.out_channels,
                                     r, s, p, q, *pad)
        self._params(plan, 256, 256, 256)
        return plan

    def _params(self, plan, x: int, filter: int, y: int):
        params = ctypes.create_string_buffer(self.params_bytes)
        grid = (ctypes.c_int32 * 3)()
        status = self._host.cutlass_convt_sm90_params(plan, ctypes.c_void_p(x),
                                                      ctypes.c_void_p(filter),
                                                      ctypes.c_void_p(y), params, grid)
        if status != 0:
            name = (cutlass_status(status) if status < DRIVER_MISSING
                    else "no CUDA driver (libcuda.so.1) for the TMA descriptors"
                    if status == DRIVER_MISSING
                    else f"TMA descriptor error {status - ENCODE_FAILED}")
            raise UnsupportedProblem(f"CUTLASS kernel {self.artifact.manifest['kernel']} "
                                     f"refused the problem: {name}")
        return bytearray(params.raw), tuple(grid)

    def run(self, plan, device: int, stream: int, x: int, filter: int, y: int) -> None:
        """Build ``Params`` for packed NHWC ``x``, KRSC ``filter`` (the flipped, transposed
        PyTorch weight) and NHWC ``y`` and launch on ``stream`` of ``device``."""
        kernel = self._library.kernel(FPROP_SM90_SYMBOL, device, self.shared_bytes)
        params, grid = self._params(plan, x, filter, y)
        cuda.launch(kernel, grid, self.threads, self.shared_bytes, stream, params)


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
               "C_out % 32 == 0, padding <= kernel_size - 1, no bias; sm_90 (KernelBench 57, "
               "65, 69)",
               "CUTLASS 3.x TMA + wgmma fprop on the flipped filter (NHWC; layout passes "
               "for NCHW)")

    def supports_arch(self, arch: int) -> bool:
        return arch == 90

    def unsupported_reasons(self, spec: ProblemSpec) -> list[str]:
        reasons = spec.float32_reasons("fprop_sm90")
        if spec.precision != "tf32" or spec.arch != 90:
            reasons.append(f"precision={spec.precision!r} on sm_{spec.arch}: the SM90 kernels "
                           "are TF32 on sm_90 (CUTLASS has 3xTF32 only for SM80-style kernels)")
        if spec.stride != (1, 1) or spec.dilation != (1, 1) or spec.groups != 1:
            reasons.append(f"stride={spec.stride}, dilation={spec.dilation}, groups="
                           f"{spec.groups}: the SM90 fprop route needs 1, 1 and 1")
        if spec.in_channels % 4 or spec.out_channels % 32:
            reasons.append(f"{spec.in_channels} -> {spec.out_channels} channels: the SM90 "
                           "kernels need C_in % 4 == 0 (16-byte TMA strides) and C_out % 32 == 0")
        if any(p > k - 1 for p, k in zip(spec.padding, spec.kernel_size)):
            reasons.append(f"padding={spec.padding} > kernel_size - 1: the forward convolution "
                           "would need negative padding")
        if spec.bias:
            reasons.append("bias: the SM90 kernels are built without a bias epilogue")
        return spec.int32_reasons() + reasons

    def torch_preferred(self, spec: ProblemSpec) -> bool:
        """Always: its default configuration measured no faster than PyTorch's route
        (``docs/design/fprop_sm90.md``, "Against PyTorch"). A tuning record can still pick it."""
        return True

    def candidates(self, spec: ProblemSpec) -> list[FpropSm90Config]:
        return fprop_sm90_configs(spec)

    def sources(self, config: FpropSm90Config) -> Sources:
        # host code only; libcuda is opened at run time (dlopen), see fprop_sm90_host.cu
        return Sources("fprop_sm90_kernel.cu", (FPROP_SM90_SYMBOL,),
                       host=("fprop_sm90_host.cu",), header="operation.h",
                       emit=functools.partial(operation_h, config),
                       emitters=(operation_h, cutlass_operation), arch=f"{config.arch}a",
                       host_flags=("-Xlinker", "--no-undefined"), host_libs=("-ldl",))

    def builds(self, config):
        return ((config, self.sources(config)), layout.build_of(config.arch))

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
        y = new_packed(x, prepared.spec.out_shape, True)
        prepared.kernel.run(plan.problem, device, stream, x.data_ptr(), filter_krsc.data_ptr(),
                            y.data_ptr())
        return layout.from_nhwc(y, prepared.spec.channels_last, plan.passes, device, stream)


FAMILY = FpropSm90Family()
