"""The dgrad family: CUTLASS 2.x implicit-GEMM dgrad kernels (``mma.sync``, SM80 style),
emitted by ``cutlass_library``: every stride (the unity-stride kernel for stride 1, the
strided-dgrad kernel otherwise), padding, dilation at stride 1, groups (one launch per group on
channel views), bias in the epilogue, any channel count (narrower accesses where 4 does not
divide it), batches of 2 GiB or more in chunks. The kernels read and write NHWC: NCHW tensors
pass through the layout passes. ``docs/design/dgrad.md``.

A transposed convolution is the dgrad of the forward convolution whose output gradient is x
(``spec.py`` gives the notation): dgrad's dy = x as NHWC (N, P, Q, K = C_in), its filter = W as
KRSC (K = C_in, R, S, C = C_out) and its dx = y as NHWC (N, H, W, C).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
from dataclasses import dataclass

import torch

from .. import build, cuda, program
from ..build import Sources
from ..spec import SHARED_MEMORY_LIMIT, ProblemSpec
from . import layout
from .base import (
    Family,
    Prepared,
    UnsupportedProblem,
    cutlass_status,
    load,
    sm80_reasons,
)

DGRAD_SYMBOL = "cutlass_convt_dgrad_kernel"
ABI_VERSION = 2  # dgrad_host.cu's cutlass_convt_abi_version()
# CUTLASS 2.x conv kernels refuse tensors of 2**31 bytes or more (32-bit offsets and strides,
# implicit_gemm_convolution.h's can_implement): larger batches run in chunks under this.
MAX_LAUNCH_BYTES = 2**31


@dataclass(frozen=True)
class DgradProblem:
    """A ``cutlass::conv::Conv2dProblemSize`` for dgrad (cross-correlation mode, one split, one
    group), in the order of its 15-integer constructor."""

    N: int
    H: int
    W: int
    C: int
    K: int
    R: int
    S: int
    P: int
    Q: int
    pad_h: int
    pad_w: int
    stride_h: int
    stride_w: int
    dilation_h: int
    dilation_w: int

    def as_tuple(self) -> tuple[int, ...]:
        return dataclasses.astuple(self)


@dataclass(frozen=True)
class DgradLaunch:
    """One kernel launch of a problem: a dgrad problem over one group of channels and one chunk
    of the batch. ``x_strides`` and ``y_strides`` are the (W, H, N) strides in elements of the
    NHWC views of x and y (``cutlass::layout::TensorNHWC``: channels are contiguous; the channel
    slice of one group keeps the full tensors' pixel pitch); the filter is a packed KRSC slice.
    ``offsets`` are the element offsets of the views' first elements in x, the KRSC filter,
    the bias and y."""

    problem: DgradProblem
    x_strides: tuple[int, int, int]
    y_strides: tuple[int, int, int]
    offsets: tuple[int, int, int, int]


def sample_bytes(spec: ProblemSpec) -> int:
    """Bytes of the larger of one input sample and one output sample (float32)."""
    (h_in, w_in), (h_out, w_out) = spec.in_size, spec.out_size
    return 4 * max(spec.in_channels * h_in * w_in, spec.out_channels * h_out * w_out)


def dgrad_problem(spec: ProblemSpec, batch: int | None = None) -> DgradProblem:
    """The CUTLASS dgrad problem of one group of ``spec`` over ``batch`` samples (default:
    all)."""
    (p, q), (r, s), (h, w) = spec.in_size, spec.kernel_size, spec.out_size
    k, c = spec.group_channels
    return DgradProblem(
        N=spec.batch if batch is None else batch, H=h, W=w, C=c, K=k, R=r, S=s, P=p, Q=q,
        pad_h=spec.padding[0], pad_w=spec.padding[1],
        stride_h=spec.stride[0], stride_w=spec.stride[1],
        dilation_h=spec.dilation[0], dilation_w=spec.dilation[1],
    )


def dgrad_launches(spec: ProblemSpec) -> tuple[DgradLaunch, ...]:
    """The launches that compute ``spec``: one per group and per chunk of the batch, each
    chunk under :data:`MAX_LAUNCH_BYTES`."""
    (h_in, w_in), (h_out, w_out) = spec.in_size, spec.out_size
    x_strides = (spec.in_channels, w_in * spec.in_channels, h_in * w_in * spec.in_channels)
    y_strides = (spec.out_channels, w_out * spec.out_channels,
                 h_out * w_out * spec.out_channels)
    k, c = spec.group_channels
    r, s = spec.kernel_size
    chunk = max(1, (MAX_LAUNCH_BYTES - 1) // sample_bytes(spec))
    return tuple(
        DgradLaunch(dgrad_problem(spec, min(chunk, spec.batch - n0)), x_strides, y_strides,
                    (n0 * x_strides[2] + g * k, g * k * r * s * c, g * c,
                     n0 * y_strides[2] + g * c))
        for n0 in range(0, spec.batch, chunk) for g in range(spec.groups))


@dataclass(frozen=True)
class DgradConfig:
    """Template configuration of one CUTLASS 2.x implicit-GEMM dgrad kernel: everything that
    changes the binary, and nothing else (the problem's sizes are runtime arguments).

    - ``precision``: ``"tf32"`` (``OpMultiplyAdd`` on float operands: TF32 tensor cores,
      instruction 16x8x8) or ``"fp32"`` (``OpMultiplyAddFastF32``: 3xTF32, fp32-accurate).
    - ``threadblock_shape`` (M, N, K) of the implicit GEMM; ``warp_count`` warps along each;
      ``stages`` of the multistage main loop.
    - ``alignment_a``: elements per access of the input x (divides C_in); ``alignment_c``:
      of the filter and the output (divides C_out).
    - ``stride_support``: ``"unity"`` (stride 1 only) or ``"strided"`` (any stride, with the
      strided-dgrad kernel); ``iterator_algorithm``: ``"optimized"`` or ``"analytic"``;
      ``swizzle``: a ``cutlass_library.SwizzlingFunctor`` name (``Identity1``: the GEMM
      identity swizzle; ``StridedDgradIdentity1``: the one strided dgrad needs).
    - ``arch``: the SM version the cubin is built for (``sm_<arch>``); the kernels are SM80-style
      (``mma.sync``) and run on later GPUs.
    """

    precision: str
    threadblock_shape: tuple[int, int, int]
    warp_count: tuple[int, int, int]
    stages: int
    alignment_a: int
    alignment_c: int
    arch: int
    stride_support: str = "unity"
    iterator_algorithm: str = "optimized"
    swizzle: str = "Identity1"

    @property
    def name(self) -> str:
        """Readable, unique name, e.g.
        ``dgrad_tf32_256x64x16_4x2x1_s4_a4x4_unity_optimized_identity1_sm90``."""
        m, n, k = self.threadblock_shape
        wm, wn, wk = self.warp_count
        return (f"dgrad_{self.precision}_{m}x{n}x{k}_{wm}x{wn}x{wk}_s{self.stages}"
                f"_a{self.alignment_a}x{self.alignment_c}_{self.stride_support}"
                f"_{self.iterator_algorithm}_{self.swizzle.lower()}_sm{self.arch}")


def _alignment(channels: int) -> int:
    """Widest access (4, 2 or 1 floats: at most 16 bytes) that divides a channel count."""
    return next(a for a in (4, 2, 1) if channels % a == 0)


# Threadblock (M, N, K), warps, stages per precision when no tuning record exists, for narrow
# (C_out per group <= 32) and wide outputs: the fastest candidates on KernelBench's problems 71
# and 78 (C_out = 32) and 57, 65, 69 (C_out = 64, 128).
_DEFAULT_TILES = {
    ("tf32", True): ((128, 32, 32), (4, 1, 1), 3),
    ("tf32", False): ((128, 64, 32), (2, 2, 1), 3),
    ("fp32", True): ((256, 32, 16), (4, 1, 1), 3),
    ("fp32", False): ((128, 64, 16), (2, 2, 1), 4),
}


def default_dgrad_config(spec: ProblemSpec) -> DgradConfig:
    """The untuned configuration for ``spec``: optimized dgrad (the unity-stride kernel for
    stride 1, the strided-dgrad kernel otherwise) with the default tile of its precision and
    output width, and the widest accesses one group's channel counts allow."""
    k, c = spec.group_channels
    tile, warps, stages = _DEFAULT_TILES[(spec.precision, c <= 32)]
    unity = spec.stride == (1, 1)
    return DgradConfig(
        precision=spec.precision, threadblock_shape=tile, warp_count=warps, stages=stages,
        alignment_a=_alignment(k), alignment_c=_alignment(c), arch=spec.arch,
        stride_support="unity" if unity else "strided",
        swizzle="Identity1" if unity else "StridedDgradIdentity1",
    )


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


def cutlass_operation(config: DgradConfig):
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


def operation_h(config: DgradConfig) -> str:
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
class DgradLaunchPlan:
    """Everything one launch needs: ``params`` (the kernel's ``Params`` bytes with null tensor
    addresses), the grid, and the byte offsets of the four addresses in ``params`` (x, filter,
    bias, y)."""

    params: bytes
    grid: tuple[int, int, int]
    offsets: tuple[int, int, int, int]


class DgradKernel:
    """One built dgrad kernel in this process. Its host library (``ctypes``) checks a problem
    with CUTLASS's ``can_implement`` and fills the kernel's ``Params`` once per problem
    (:meth:`plan`); a launch copies those bytes and writes the four tensor addresses into
    them."""

    def __init__(self, artifact):
        self.artifact = artifact
        self._host = cuda.host_library(artifact.host_lib, ABI_VERSION)
        info = (ctypes.c_int64 * 7)()
        self._host.cutlass_convt_describe(info)
        self.threads, self.shared_bytes, self.params_bytes = info[0], info[1], info[2]
        self._offsets = tuple(info[3:7])
        self._library = cuda.Library(artifact.cubin.read_bytes())

    def plan(self, launch: DgradLaunch, has_bias: bool) -> DgradLaunchPlan:
        """Check one launch's problem with ``can_implement`` and fill the kernel's ``Params``
        (host only). Raises :class:`UnsupportedProblem` naming the ``cutlass::Status`` when
        CUTLASS rejects it."""
        problem = (ctypes.c_int32 * 15)(*launch.problem.as_tuple())
        x_strides = (ctypes.c_int64 * 3)(*launch.x_strides)
        y_strides = (ctypes.c_int64 * 3)(*launch.y_strides)
        params = ctypes.create_string_buffer(self.params_bytes)
        grid = (ctypes.c_int32 * 3)()
        status = self._host.cutlass_convt_initialize(problem, x_strides, y_strides,
                                                     int(has_bias), params, grid)
        if status != 0:
            raise UnsupportedProblem(
                f"CUTLASS kernel {self.artifact.manifest['kernel']} cannot implement "
                f"{launch.problem}: can_implement returned {cutlass_status(status)}")
        return DgradLaunchPlan(params.raw, tuple(grid), self._offsets)

    def launch(self, plan: DgradLaunchPlan, device: int, ex,
               x: int, filter: int, bias: int, y: int) -> None:
        """Launch through ``ex`` on CUDA device ``device``, whose primary context must be
        current. ``x``, ``filter``, ``bias``, ``y`` are device addresses of packed NHWC x, KRSC
        filter, the bias vector (any address when the plan has no bias) and NHWC y."""
        kernel = self._library.kernel(DGRAD_SYMBOL, device, self.shared_bytes)
        ex.launch(kernel, plan.grid, self.threads, self.shared_bytes,
                  program.patched(plan.params, plan.offsets, (x, filter, bias, y)))

    def run(self, launches, device: int, ex, x: int, filter: int, bias: int,
            y: int) -> None:
        """Launch every ``(plan, offsets)`` of a problem (:func:`dgrad_launches`): ``x``,
        ``filter``, ``bias`` and ``y`` are the base addresses, and each launch adds its element
        offsets (float32)."""
        for plan, (xo, fo, bo, yo) in launches:
            self.launch(plan, device, ex, x + 4 * xo, filter + 4 * fo, bias + 4 * bo,
                        y + 4 * yo)


@dataclass(frozen=True)
class DgradPlan:
    """Per launch (a group and a chunk of the batch) its :class:`DgradLaunchPlan` and the offsets
    of its views of x, the KRSC filter, the bias and y; the layout passes for NCHW tensors."""

    launches: tuple
    passes: layout.LayoutKernels


class DgradFamily(Family):
    name = "dgrad"
    config_class = DgradConfig
    summary = ("every other problem but stride > 1 with dilation > 1: any stride, padding, "
               "groups (a launch per group), channel count, bias; kernels up to 32 x 32, "
               "samples under 2 GiB; sm_80",
               "CUTLASS 2.x implicit-GEMM dgrad, unity-stride or strided (NHWC; layout passes "
               "for NCHW)")

    def unsupported_reasons(self, spec: ProblemSpec) -> list[str]:
        reasons = spec.float32_reasons("dgrad") + sm80_reasons(spec)
        if spec.stride != (1, 1) and spec.dilation != (1, 1):
            reasons.append(f"dilation={spec.dilation} with stride={spec.stride}: CUTLASS 2.x "
                           "strided dgrad does not support dilation > 1 (can_implement)")
        if max(spec.kernel_size) > 32:
            reasons.append(f"kernel_size={spec.kernel_size}: CUTLASS dgrad iterators support "
                           "filters up to 32x32")
        if sample_bytes(spec) >= MAX_LAUNCH_BYTES:
            reasons.append(f"one sample of {sample_bytes(spec)} bytes: CUTLASS 2.x conv kernels "
                           "need each launch under 2 GiB (32-bit offsets)")
        return spec.int32_reasons() + reasons

    def torch_preferred(self, spec: ProblemSpec) -> bool:
        """TF32 at stride > 1, and every problem of at most 4 output channels per group (any
        precision): there the default configuration measured slower than PyTorch's route
        (``docs/design/dgrad.md``, "Against PyTorch"). A tuning record can still pick it."""
        return (spec.precision == "tf32" and spec.stride != (1, 1)) or spec.group_channels[1] <= 4

    def bound_fields(self, spec: ProblemSpec) -> dict[str, object]:
        """The default configuration's precision, SM, access widths, stride support and the
        swizzle that goes with it."""
        base = default_dgrad_config(spec)
        return {name: getattr(base, name) for name in ("precision", "arch", "alignment_a",
                                                       "alignment_c", "stride_support",
                                                       "swizzle")}

    def candidates(self, spec: ProblemSpec) -> list[DgradConfig]:
        """The default (:func:`default_dgrad_config`) first, then every candidate tile whose
        main-loop shared memory (stages x (M x K + K x N) floats) fits."""
        base = default_dgrad_config(spec)
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

    def sources(self, config: DgradConfig) -> Sources:
        return Sources("dgrad_kernel.cu", (DGRAD_SYMBOL,), host=("dgrad_host.cu",),
                       header="operation.h",
                       emit=functools.partial(operation_h, config),
                       emitters=(operation_h, cutlass_operation), arch=str(config.arch),
                       host_flags=(build.gencode(str(config.arch)),))

    def builds(self, config):
        return ((config, self.sources(config)), layout.build_of(config.arch))

    def prepare(self, spec, config, device):
        passes = layout.kernels(spec.arch)
        kernel = load(self, config, DgradKernel)
        plans: dict = {}
        launches = []
        for item in dgrad_launches(spec):
            key = (item.problem, item.x_strides, item.y_strides)
            if key not in plans:
                plans[key] = kernel.plan(item, spec.bias)
            launches.append((plans[key], item.offsets))
        return Prepared(spec, config, self, kernel, DgradPlan(tuple(launches), passes), device)

    def run(self, prepared, ex, input, weight, bias):
        """NHWC x, KRSC filter (PyTorch's filter in channels_last) and NHWC y, through the
        layout passes for NCHW; x at the configuration's A alignment, filter and bias at its
        C alignment."""
        spec, config, plan, device = (prepared.spec, prepared.config, prepared.plan,
                                      prepared.device)
        align_a, align_c = 4 * config.alignment_a, 4 * config.alignment_c
        x = layout.to_nhwc(ex, input, align_a, plan.passes, device)
        filter_krsc = layout.to_nhwc(ex, weight, align_c, plan.passes, device)
        y = ex.new_packed(x, spec.out_shape, True)
        y_address = ex.address("y", y, spec.out_shape, torch.float32, 16, True)
        # without bias the kernel reads no C operand (beta = 0): any address will do
        b = (ex.address("bias", ex.packed(bias, align_c, torch.contiguous_format),
                        (spec.out_channels,), torch.float32, align_c) if spec.bias
             else y_address)
        prepared.kernel.run(plan.launches, device, ex,
                            ex.address("x", x, spec.in_shape, torch.float32, align_a, True),
                            ex.address("filter", filter_krsc, spec.weight_shape, torch.float32,
                                       align_c, True), b, y_address)
        return layout.from_nhwc(ex, y, spec.channels_last, plan.passes, device)


FAMILY = DgradFamily()
