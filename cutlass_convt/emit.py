"""Kernel configuration -> C++ source. Pure: data in, text out.

The layout passes (``templates/layout.cu``) and the direct family (``templates/direct.cu``,
configured by an emitted ``config.h``) are our own CUDA kernels, built and cached the same way.

``cutlass_library`` (from ``nvidia-cutlass``) describes and emits the CUTLASS 2.x dgrad kernel
(``Conv2dOperation`` + ``EmitConv2dInstance``); our own C++ in ``templates/`` adds only what it
does not describe: a kernel entry point with a stable name (``kernel.cu``) and an ``extern "C"``
host library that checks ``can_implement`` and fills the kernel's ``Params`` (``host.cu``).
"""

from __future__ import annotations

from importlib import resources

from .spec import DirectConfig, KernelConfig, LayoutConfig

TEMPLATE_FILES = ("kernel.cu", "host.cu", "layout.cu", "direct.cu")
KERNEL_SYMBOL = "cutlass_convt_dgrad_kernel"
NCHW_TO_NHWC_SYMBOL = "cutlass_convt_nchw_to_nhwc"
NHWC_TO_NCHW_SYMBOL = "cutlass_convt_nhwc_to_nchw"
DIRECT_SYMBOL = "cutlass_convt_direct_kernel"

Config = KernelConfig | LayoutConfig | DirectConfig


def template_sources() -> dict[str, str]:
    """Our fixed C++ files, by name (they ``#include "operation.h"``)."""
    folder = resources.files(__package__) / "templates"
    return {name: (folder / name).read_text() for name in TEMPLATE_FILES}


def _operation(config: KernelConfig):
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


def emit_operation_header(config: KernelConfig) -> str:
    """``operation.h``: the CUTLASS includes and ``using ConvtKernel = <emitted kernel>;``."""
    import cutlass_library as cl

    operation = _operation(config)
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


def emit_direct_config(config: DirectConfig) -> str:
    """``config.h`` of a direct-family kernel: its template constants."""
    (r, s), (th, tw) = config.kernel_size, config.tile
    constants = {
        "kCI": config.in_channels, "kCO": config.out_channels, "kR": r, "kS": s,
        "kTileH": th, "kTileW": tw, "kWarpTilesM": config.warp_tiles_m,
        "kStages": config.stages, "kVec": config.vector,
        "kConfigThreads": config.threads, "kSharedBytes": config.shared_bytes,
    }
    flags = {"kNhwc": config.channels_last, "kThreePass": config.precision == "fp32"}
    return "\n".join([
        f"// cutlass_convt kernel {config.name}",
        "#pragma once",
        *(f"constexpr int {k} = {v};" for k, v in constants.items()),
        *(f"constexpr bool {k} = {str(v).lower()};" for k, v in flags.items()),
        "",
    ])


def template_names(config: Config) -> tuple[str, ...]:
    """The templates a build of ``config`` uses."""
    if isinstance(config, LayoutConfig):
        return ("layout.cu",)
    if isinstance(config, DirectConfig):
        return ("direct.cu",)
    return ("kernel.cu", "host.cu")


def emit_sources(config: Config) -> dict[str, str]:
    """Every source file of one build, by file name: for a dgrad kernel ``operation.h``,
    ``kernel.cu`` and ``host.cu``; for the direct family ``config.h`` and ``direct.cu``; for
    the layout passes ``layout.cu``."""
    templates = template_sources()
    sources = {name: templates[name] for name in template_names(config)}
    if isinstance(config, KernelConfig):
        sources["operation.h"] = emit_operation_header(config)
    elif isinstance(config, DirectConfig):
        sources["config.h"] = emit_direct_config(config)
    return sources
