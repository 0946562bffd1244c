"""Kernel configuration -> C++ source. Pure: data in, text out.

``cutlass_library``'s 3.x conv emitter (``ConvOperation3x`` + ``EmitConv3xInstance``) describes
the SM90 fprop kernels; ``templates/fprop_sm90_kernel.cu`` and ``fprop_sm90_host.cu`` add the
entry point and the host library that builds their ``Params`` (TMA descriptors) per call.

The layout passes (``templates/layout.cu``), the direct family (``templates/direct.cu``) and the
strip family (``templates/strip.cu`` and ``strip_rs.cu``, with ``strip_common.cuh``), the last
two configured by an emitted ``config.h``, are our own CUDA kernels, built and cached the same
way.

``cutlass_library`` (from ``nvidia-cutlass``) describes and emits the CUTLASS 2.x dgrad kernel
(``Conv2dOperation`` + ``EmitConv2dInstance``); our own C++ in ``templates/`` adds only what it
does not describe: a kernel entry point with a stable name (``kernel.cu``) and an ``extern "C"``
host library that checks ``can_implement`` and fills the kernel's ``Params`` (``host.cu``).
"""

from __future__ import annotations

from importlib import resources

from .spec import DirectConfig, FpropSm90Config, KernelConfig, LayoutConfig, StripConfig

TEMPLATE_FILES = ("kernel.cu", "host.cu", "layout.cu", "direct.cu", "strip.cu", "strip_rs.cu",
                  "strip_common.cuh", "common.cuh", "fprop_sm90_kernel.cu", "fprop_sm90_host.cu")
KERNEL_SYMBOL = "cutlass_convt_dgrad_kernel"
NCHW_TO_NHWC_SYMBOL = "cutlass_convt_nchw_to_nhwc"
NHWC_TO_NCHW_SYMBOL = "cutlass_convt_nhwc_to_nchw"
DIRECT_SYMBOL = "cutlass_convt_direct_kernel"
STRIP_SYMBOL = "cutlass_convt_strip_kernel"
STRIP_EDGE_SYMBOL = "cutlass_convt_strip_edge_kernel"  # strip_rs.cu's columns beyond whole strips
FPROP_SM90_SYMBOL = "cutlass_convt_fprop_sm90_kernel"

Config = KernelConfig | LayoutConfig | DirectConfig | StripConfig | FpropSm90Config


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


def _operation_sm90(config: FpropSm90Config):
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


def emit_operation_header_sm90(config: FpropSm90Config) -> str:
    """``operation.h`` of an SM90 fprop kernel: the 3.x emitter's includes (in its order: the
    conv headers are not self-contained; less ``conv_operation_3x.hpp``, which belongs to
    CUTLASS's profiler library), the instance, ``using ConvtKernel = ...;``."""
    from cutlass_library.conv3x_emitter import EmitConv3xIncludes, EmitConv3xInstance

    operation = _operation_sm90(config)
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


def _config_header(name: str, constants: dict[str, int], flags: dict[str, bool]) -> str:
    """A ``config.h`` of our own kernels: ``constexpr`` ints and bools."""
    return "\n".join([
        f"// cutlass_convt kernel {name}",
        "#pragma once",
        *(f"constexpr int {k} = {v};" for k, v in constants.items()),
        *(f"constexpr bool {k} = {str(v).lower()};" for k, v in flags.items()),
        "",
    ])


def emit_direct_config(config: DirectConfig) -> str:
    """``config.h`` of a direct-family kernel: its template constants."""
    (r, s), (th, tw) = config.kernel_size, config.tile
    constants = {
        "kCI": config.in_channels, "kCO": config.out_channels, "kCOBlock": config.out_block,
        "kR": r, "kS": s,
        "kTileH": th, "kTileW": tw, "kWarpTilesM": config.warp_tiles_m,
        "kStages": config.stages, "kConsumers": config.consumers,
        "kProducerWarps": config.producer_warps, "kVec": config.vector,
        "kConfigThreads": config.threads, "kSharedBytes": config.shared_bytes,
    }
    flags = {"kNhwc": config.channels_last, "kThreePass": config.precision == "fp32",
             "kWgmma": config.math == "wgmma"}
    return _config_header(config.name, constants, flags)


def emit_strip_config(config: StripConfig) -> str:
    """``config.h`` of a strip-family kernel: its template constants."""
    constants = {"kS": config.kernel_size[1], "kTileN": config.tile_n,
                 "kStripStep": config.strip_step, "kRing": config.ring,
                 "kStageRows": config.stage_rows, "kPrepGroups": config.prep_groups,
                 "kRegisterA": config.register_a, "kSharedBytes": config.shared_bytes}
    return _config_header(config.name, constants, {"kNhwc": config.channels_last,
                                                    "kThreePass": config.precision == "fp32",
                                                    "kSplitAll": config.split_all})


# Per configuration class: the templates of a build (or the function of the configuration that
# names them), the header it emits, and the functions that emit it (the first one is called;
# all are hashed by the build cache).
_FAMILY = {
    LayoutConfig: (("layout.cu",), None, ()),
    DirectConfig: (("direct.cu", "common.cuh"), "config.h", (emit_direct_config, _config_header)),
    StripConfig: (lambda config: (f"strip{'_rs' if config.mma == 'rs' else ''}.cu",
                                  "strip_common.cuh", "common.cuh"),
                  "config.h", (emit_strip_config, _config_header)),
    FpropSm90Config: (("fprop_sm90_kernel.cu", "fprop_sm90_host.cu"), "operation.h",
                      (emit_operation_header_sm90, _operation_sm90)),
    KernelConfig: (("kernel.cu", "host.cu"), "operation.h", (emit_operation_header, _operation)),
}


def template_names(config: Config) -> tuple[str, ...]:
    """The templates a build of ``config`` uses (the first one is the device code; the others
    its host code or the headers it includes)."""
    names = _FAMILY[type(config)][0]
    return names(config) if callable(names) else names


def emitter_sources(config: Config) -> str:
    """The Python source of the functions that emit ``config``'s header: with the templates,
    what the build cache hashes of ours (so an edit elsewhere in this module keeps the cache)."""
    import inspect

    return "".join(inspect.getsource(f) for f in _FAMILY[type(config)][2])


def emit_sources(config: Config) -> dict[str, str]:
    """Every source file of one build, by file name: the templates plus the emitted header
    (``operation.h`` of a CUTLASS kernel, ``config.h`` of a direct-family kernel; none for the
    layout passes)."""
    templates = template_sources()
    sources = {name: templates[name] for name in template_names(config)}
    _, header, emitters = _FAMILY[type(config)]
    if header:
        sources[header] = emitters[0](config)
    return sources
