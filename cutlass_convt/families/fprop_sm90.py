"""The fprop_sm90 family: CUTLASS 3.x's SM90 TMA + ``wgmma`` convolution, emitted by
``cutlass_library``'s 3.x conv emitter and run as a forward convolution equal to the transposed
one (:func:`forward_problem`): at stride 1 the correlation of x with the flipped, transposed
filter; at kernel_size == stride (padding 0) one launch whose output is y itself, in TF32,
float16 or bfloat16, bias in the epilogue, NHWC (NCHW through the layout passes).
``docs/design/fprop_sm90.md``.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from .. import cuda
from ..build import Sources
from ..spec import ELEMENT_BYTES, ProblemSpec, math_name
from . import layout
from .base import (
    Family,
    Prepared,
    UnsupportedProblem,
    cutlass_status,
    element_type,
    load,
)

FPROP_SM90_SYMBOL = "cutlass_convt_fprop_sm90_kernel"
ABI_VERSION = 4  # fprop_sm90_host.cu's cutlass_convt_abi_version()
# fprop_sm90_host.cu's return codes besides cutlass::Status: kDriverMissing, kEncodeFailed + r
DRIVER_MISSING, ENCODE_FAILED = 100, 1000


@dataclass(frozen=True)
class FpropSm90Config:
    """Template configuration of one CUTLASS 3.x SM90 convolution kernel (TMA im2col loads,
    warp-specialized ``wgmma`` main loop, TMA epilogue), emitted by ``cutlass_library``'s 3.x
    conv emitter as a forward convolution (:func:`forward_problem`). NHWC tensors.

    - ``precision``: ``"tf32"`` (float32's math; 16-bit elements carry it without meaning).
    - ``tile``: CTA tile (M pixels, N output channels, K input channels: 128 bytes of them);
      ``cluster``: CTAs per cluster (only 1x1x1 is launched); ``stages``: main-loop stages
      (0: as many as fit).
    - ``dtype``: the tensors' element type, ``"float32"``, ``"float16"`` or ``"bfloat16"``
      (float32 sums); ``bias``: a per-output-channel bias in the epilogue.
    """

    precision: str
    tile: tuple[int, int, int]
    cluster: tuple[int, int, int] = (1, 1, 1)
    stages: int = 0
    arch: int = 90
    dtype: str = "float32"
    bias: bool = False

    def __post_init__(self):
        if self.precision != "tf32" or self.dtype not in ELEMENT_BYTES:
            raise ValueError(f"{self}: precision is 'tf32', dtype one of {tuple(ELEMENT_BYTES)}")

    @property
    def name(self) -> str:
        """E.g. ``fprop_sm90_bf16_bias_128x64x64_c1x1x1_sauto_sm90``."""
        return (f"fprop_sm90_{math_name(self.dtype, self.precision)}"
                f"{'_bias' if self.bias else ''}_{'x'.join(map(str, self.tile))}"
                f"_c{'x'.join(map(str, self.cluster))}_s{self.stages or 'auto'}_sm{self.arch}")


def k_is_s(spec: ProblemSpec) -> bool:
    """Whether ``spec`` is a stride > 1 problem with kernel_size == stride, padding 0 and
    output_padding 0: each output pixel then has exactly one tap."""
    return (spec.stride != (1, 1) and spec.kernel_size == spec.stride
            and spec.padding == (0, 0) and spec.output_padding == (0, 0))


def forward_problem(spec: ProblemSpec) -> tuple[int, ...]:
    """The forward convolution (cross-correlation, stride 1, dilation 1) that computes ``spec``,
    as (N, H, W, C, K, R, S, P, Q, pad_h, pad_w) in CUTLASS's fprop notation; its activation
    is packed NHWC x, its output packed NHWC y (same bytes), its filter
    :func:`forward_filter`:

    - stride 1: x as it is (K = C_out); the lower padding is R - 1 - padding.
    - kernel_size == stride (s_h, s_w), padding 0: every input row is an image of one row
      (N x H_in of them) whose output is its s_h rows of y, and the s_w output pixels of one
      input pixel are one pixel of s_w x C_out channels: y (N, s_h H_in, s_w W_in, C_out) is
      (N H_in, s_h, W_in, s_w C_out). Output row r of an image reads the input row through
      tap s_h - 1 - r of s_h and padding s_h - 1 on both sides; its other taps read padding
      (zeros: the main loop computes s_h times the useful products).
    """
    n, (h, w), c, k = spec.batch, spec.in_size, spec.in_channels, spec.out_channels
    if k_is_s(spec):
        s_h, s_w = spec.stride
        return (n * h, 1, w, c, s_w * k, s_h, 1, s_h, w, s_h - 1, 0)
    (r, s), (p, q) = spec.kernel_size, spec.out_size
    return (n, h, w, c, k, r, s, p, q, r - 1 - spec.padding[0], s - 1 - spec.padding[1])


def forward_filter(ex, spec: ProblemSpec, weight: torch.Tensor) -> torch.Tensor:
    """PyTorch's filter (C_in, C_out, R, S) as the packed KRSC filter of
    :func:`forward_problem`, through the executor ``ex``: at stride 1 flipped and transposed,
    ``W.flip(2, 3).permute(1, 2, 3, 0)``; at kernel_size == stride filter (s_w C_out, s_h, 1,
    C_in) with row ``j C_out + k`` = ``W[:, k, s_h - 1 - u, j]`` at tap u (packed: a reshape
    of a channels_last weight's permutation is a view)."""
    c, k_out, r, s = spec.weight_shape
    if k_is_s(spec):
        return ex.transform(weight, (2,), (3, 1, 2, 0), (s * k_out, spec.stride[0], 1, c))
    return ex.transform(weight, (2, 3), (1, 2, 3, 0), (k_out, r, s, c))


def forward_bias(ex, spec: ProblemSpec, bias: torch.Tensor) -> torch.Tensor:
    """The per-output-channel bias of :func:`forward_problem`: ``bias`` (C_out,), repeated s_w
    times at kernel_size == stride (through the executor ``ex``)."""
    return ex.repeat(bias, spec.stride[1]) if k_is_s(spec) else bias


def fprop_sm90_configs(spec: ProblemSpec) -> list[FpropSm90Config]:
    """The candidates for ``spec``, default first: the widest N tile (32, 64 or 128) that
    divides the forward problem's K, 128 bytes of input channels a K tile, M = 128 with 4
    stages (measured faster than as many as fit), then with as many as fit, then M = 256.
    Empty where no N tile divides K (a problem the family does not take)."""
    k = forward_problem(spec)[4]
    n = max((t for t in (32, 64, 128) if k % t == 0), default=0)
    if not n:
        return []
    depth = 128 // ELEMENT_BYTES[spec.dtype]
    return [FpropSm90Config("tf32", (m, n, depth), (1, 1, 1), stages, spec.arch, spec.dtype,
                            spec.bias)
            for m, stages in ((128, 4), (128, 0), (256, 0))]


K_IS_S_MAX_CHANNELS = 256  # input channels above which the s_h-fold MMA waste loses
K_IS_S_MIN_TILES = 1024   # default tiles below which per-tile latency loses (~8 waves)


def k_is_s_wins(spec: ProblemSpec) -> bool:
    """Whether the default configuration is the default choice at kernel_size == stride: at
    most :data:`K_IS_S_MAX_CHANNELS` input channels (the forward problem's reduction is
    s_h x C_in deep, s_h - 1 of s_h taps padding) and at least :data:`K_IS_S_MIN_TILES`
    output tiles (one 167-register CTA an SM, one tile each: short grids leave its load and
    epilogue latency exposed). Measured on the H200 in TF32, bf16 and fp16, both layouts:
    1.15-1.73x PyTorch's route with both (Mask R-CNN, SAM, YOLO), 0.44-1.08x without
    (U-Net 512 ->, ViTDet 768 ->, DPT's 344 tiles); ``docs/design/fprop_sm90.md``."""
    n, _, _, _, k, _, _, p, q = forward_problem(spec)[:9]
    tile_m, tile_n, _ = fprop_sm90_configs(spec)[0].tile
    tiles = -(-n * p * q // tile_m) * -(-k // tile_n)
    return spec.in_channels <= K_IS_S_MAX_CHANNELS and tiles >= K_IS_S_MIN_TILES


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
        """:func:`forward_problem` of ``spec`` as the host library's int32 array, checked with
        ``can_implement`` (on stand-in addresses). Raises :class:`UnsupportedProblem`."""
        plan = (ctypes.c_int32 * 11)(*forward_problem(spec))
        self._params(plan, 256, 256, 256, 256)
        return plan

    def _params(self, plan, x: int, filter: int, y: int, bias: int):
        params = ctypes.create_string_buffer(self.params_bytes)
        grid = (ctypes.c_int32 * 3)()
        status = self._host.cutlass_convt_sm90_params(plan, ctypes.c_void_p(x),
                                                      ctypes.c_void_p(filter),
                                                      ctypes.c_void_p(y), ctypes.c_void_p(bias),
                                                      params, grid)
        if status != 0:
            raise self._refused(status)
        return bytearray(params.raw), tuple(grid)

    def _refused(self, status: int) -> UnsupportedProblem:
        """The error of a nonzero status of ``cutlass_convt_sm90_params``."""
        name = (cutlass_status(status) if status < DRIVER_MISSING
                else "no CUDA driver (libcuda.so.1) for the TMA descriptors"
                if status == DRIVER_MISSING
                else f"TMA descriptor error {status - ENCODE_FAILED}")
        return UnsupportedProblem(f"CUTLASS kernel {self.artifact.manifest['kernel']} "
                                  f"refused the problem: {name}")

    def run(self, plan, device: int, ex, x: int, filter: int, y: int, bias: int) -> None:
        """Build ``Params`` for packed NHWC ``x``, KRSC ``filter`` (:func:`forward_filter`),
        NHWC ``y`` and ``bias`` (:func:`forward_bias`; any 16-byte aligned address for a
        configuration without bias) and launch through ``ex`` on ``device``."""
        kernel = self._library.kernel(FPROP_SM90_SYMBOL, device, self.shared_bytes)
        status, params, grid = ex.host_params(self._host.cutlass_convt_sm90_params, plan,
                                              self.params_bytes, (x, filter, y, bias))
        if status != 0:
            raise self._refused(status)
        ex.launch(kernel, grid, self.threads, self.shared_bytes, params)


def cutlass_operation(config: FpropSm90Config):
    """The ``cutlass_library`` ``ConvOperation3x`` of ``config``: fprop with TF32 math on
    float32, or float16 / bfloat16 operands, float32 accumulation; NHWC activation, KRSC
    filter and NHWC output of the dtype, 16-byte (TMA) alignment, warp-specialized TMA main
    loop and epilogue. The 3.x emitter hands only the tile, cluster and stage count to
    CUTLASS's collective builders, which pick the wgmma instruction themselves."""
    import cutlass_library as cl
    from cutlass_library.generator import ConvOperation3x

    element = {"float32": cl.DataType.f32, "float16": cl.DataType.f16,
               "bfloat16": cl.DataType.bf16}[config.dtype]
    operand = cl.DataType.tf32 if config.dtype == "float32" else element
    math = cl.MathInstruction([64, config.tile[1], 32 // ELEMENT_BYTES[config.dtype]], operand,
                              operand, cl.DataType.f32, cl.OpcodeClass.TensorOp,
                              cl.MathOperation.multiply_add)
    tile = cl.TileDescription(list(config.tile), config.stages, [4, 1, 1], math, config.arch,
                              config.arch, list(config.cluster))
    nhwc = cl.TensorDescription(element, cl.LayoutType.TensorNHWC,
                                16 // ELEMENT_BYTES[config.dtype])
    return ConvOperation3x(cl.ConvKind.Fprop, tile, nhwc, nhwc, nhwc, cl.DataType.f32,
                           kernel_schedule=cl.KernelScheduleType.ImplicitTmaWarpSpecializedSm90,
                           epilogue_schedule=cl.EpilogueScheduleType.TmaWarpSpecialized)


# the 3.x emitter's epilogue builder leaves its fusion argument as this comment (the default,
# a linear combination); a configuration with bias puts a per-column bias there
FUSION_MARKER = "    // , class FusionOpOrCallbacks"


def operation_h(config: FpropSm90Config) -> str:
    """``operation.h`` of an SM90 fprop kernel: the 3.x emitter's includes (in its order: the
    conv headers are not self-contained; less ``conv_operation_3x.hpp``, which belongs to
    CUTLASS's profiler library), the instance (with bias: its epilogue's fusion
    ``LinCombPerColBias``, D = acc + bias[k]), ``using ConvtKernel = ...;`` and
    ``CUTLASS_CONVT_BIAS`` (0 or 1) for the host library. Raises RuntimeError when the
    emitter's epilogue no longer has the fusion marker."""
    import cutlass_library as cl
    from cutlass_library.conv3x_emitter import EmitConv3xIncludes, EmitConv3xInstance

    operation = cutlass_operation(config)
    name = operation.procedural_name()
    instance = EmitConv3xInstance().emit(operation)
    if config.bias:
        lines = instance.split("\n")
        marked = [i for i, line in enumerate(lines) if line.startswith(FUSION_MARKER)]
        if len(marked) != 1:
            raise RuntimeError("cutlass_library's conv 3.x epilogue has no single fusion "
                               f"marker {FUSION_MARKER.strip()!r}: cannot add the bias")
        element = cl.DataTypeTag[operation.D.element]
        lines[marked[0]] = (f"    , cutlass::epilogue::fusion::LinCombPerColBias<{element}, "
                            "float>")
        instance = "\n".join(lines)
    return "\n".join([
        f"// cutlass_convt kernel {config.name}",
        f"// emitted by cutlass_library {name}",
        "#pragma once",
        *(f'#include "{include}"' for include in EmitConv3xIncludes().includes
          if include != "conv_operation_3x.hpp"),
        instance,
        f"using ConvtKernel = {name}_base;",
        f"#define CUTLASS_CONVT_BIAS {int(config.bias)}",
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
    summary = ("stride-1 problems, and kernel_size == stride with padding 0, in TF32, float16 "
               "or bfloat16 with dilation 1, groups 1, 16-byte channel rows, padding <= "
               "kernel_size - 1, the forward convolution's output channels a multiple of 32 "
               "(C_out, or s_w x C_out); sm_90 (KernelBench 57, 65, 69 in TF32; the k = s "
               "upsampling layers)",
               "CUTLASS 3.x TMA + wgmma fprop on the flipped filter, bias in the epilogue "
               "(NHWC; layout passes for NCHW)")

    def supports_arch(self, arch: int) -> bool:
        return arch == 90

    def unsupported_reasons(self, spec: ProblemSpec) -> list[str]:
        reasons = spec.element_reasons("fprop_sm90")
        if spec.arch != 90 or (spec.dtype == "float32" and spec.precision != "tf32"):
            reasons.append(f"precision={spec.precision!r} on sm_{spec.arch}: the SM90 kernels "
                           "are TF32 on sm_90 (CUTLASS has 3xTF32 only for SM80-style kernels)")
        if spec.stride != (1, 1) and not k_is_s(spec):
            reasons.append(f"stride={spec.stride} with kernel_size={spec.kernel_size}, padding="
                           f"{spec.padding}, output_padding={spec.output_padding}: the SM90 "
                           "fprop route takes stride 1, or kernel_size == stride with padding 0")
        if spec.dilation != (1, 1) or spec.groups != 1:
            reasons.append(f"dilation={spec.dilation}, groups={spec.groups}: the SM90 fprop "
                           "route needs 1 and 1")
        multiple = 16 // ELEMENT_BYTES.get(spec.dtype, 4)
        forward_k = forward_problem(spec)[4]
        if spec.in_channels % multiple or spec.out_channels % multiple or forward_k % 32:
            reasons.append(f"{spec.in_channels} -> {spec.out_channels} channels: the SM90 "
                           f"kernels need C_in and C_out multiples of {multiple} (16-byte TMA "
                           "rows) and the forward convolution's output channels (C_out, or "
                           "s_w x C_out at kernel_size == stride) a multiple of 32")
        if any(p > k - 1 for p, k in zip(spec.padding, spec.kernel_size)):
            reasons.append(f"padding={spec.padding} > kernel_size - 1: the forward convolution "
                           "would need negative padding")
        return spec.int32_reasons() + reasons

    def demoted(self, spec: ProblemSpec) -> bool:
        """kernel_size == stride problems where the default lost to PyTorch's route: the
        other families (phase) decide first, see :func:`k_is_s_wins`."""
        return k_is_s(spec) and not k_is_s_wins(spec)

    def torch_preferred(self, spec: ProblemSpec) -> bool:
        """At stride 1, and at kernel_size == stride outside :func:`k_is_s_wins`: its default
        configuration measured no faster than PyTorch's route (``docs/design/fprop_sm90.md``,
        "Against PyTorch"). A tuning record can still pick it."""
        return not (k_is_s(spec) and k_is_s_wins(spec))

    def candidates(self, spec: ProblemSpec) -> list[FpropSm90Config]:
        return fprop_sm90_configs(spec)

    def bound_fields(self, spec: ProblemSpec) -> dict[str, object]:
        return {"arch": spec.arch, "dtype": spec.dtype, "bias": spec.bias}

    def config_reasons(self, spec: ProblemSpec, config: FpropSm90Config) -> list[str]:
        """Also: an N tile that does not divide the forward convolution's output channels, a
        K tile of other than 128 bytes of input channels."""
        reasons = super().config_reasons(spec, config)
        forward_k = forward_problem(spec)[4]
        if forward_k % config.tile[1] or config.tile[2] * ELEMENT_BYTES[config.dtype] != 128:
            reasons.append(f"{config.name}: tile {config.tile} for {forward_k} forward output "
                           "channels (N must divide them, K be 128 bytes)")
        return reasons

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

    def run(self, prepared, ex, input, weight, bias):
        """NHWC x and y (layout passes for NCHW), the filter as :func:`forward_filter`, the
        bias as :func:`forward_bias` (the kernel's epilogue adds it); every address 16-byte
        aligned (TMA)."""
        spec, plan, device = prepared.spec, prepared.plan, prepared.device
        dtype = element_type(spec)
        x = layout.to_nhwc(ex, input, 16, plan.passes, device)
        filter_krsc = ex.packed(forward_filter(ex, spec, weight), 16, torch.contiguous_format)
        y = ex.new_packed(x, spec.out_shape, True)
        n, h, w, c, k, r, s = forward_problem(spec)[:7]
        y_address = ex.address("y", y, spec.out_shape, dtype, 16, True)
        b = (ex.address("bias", ex.packed(forward_bias(ex, spec, bias), 16,
                                          torch.contiguous_format), (k,), dtype, 16)
             if spec.bias else y_address)
        prepared.kernel.run(plan.problem, device, ex,
                            ex.address("x", x, spec.in_shape, dtype, 16, True),
                            ex.address("filter", filter_krsc, (k, r, s, c), dtype, 16),
                            y_address, b)
        return layout.from_nhwc(ex, y, spec.channels_last, plan.passes, device)


FAMILY = FpropSm90Family()
