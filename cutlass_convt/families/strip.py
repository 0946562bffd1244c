"""The strip family: our own TMA + ``wgmma`` kernels for stride 1, 32 -> 32 channels and 3
filter rows on sm_90 (KernelBench 71's class), on the caller's layout (NCHW or channels_last).

Two forms (``StripConfig.mma``): ``"ss"`` (``templates/strip.cu``, TF32, both operands from
shared memory) and ``"rs"`` (``templates/strip_rs.cu``, S = 3, TF32 or 3xTF32, x from registers);
``strip_common.cuh`` holds what they share. ``docs/design/strip.md``.
"""

from __future__ import annotations

import functools

from .. import emit
from ..build import Sources
from ..launch import STRIP_EDGE_SYMBOL, STRIP_SYMBOL, StripKernel
from ..spec import StripConfig, strip_configs
from .base import Family, Prepared, load, run_on_caller_layout


def config_h(config: StripConfig) -> str:
    """``config.h`` of a strip-family kernel: its template constants."""
    constants = {"kS": config.kernel_size[1], "kTileN": config.tile_n,
                 "kStripStep": config.strip_step, "kRing": config.ring,
                 "kStageRows": config.stage_rows, "kPrepGroups": config.prep_groups,
                 "kRegisterA": config.register_a, "kSharedBytes": config.shared_bytes}
    return emit.config_header(config.name, constants, {"kNhwc": config.channels_last,
                                                       "kThreePass": config.precision == "fp32",
                                                       "kSplitAll": config.split_all})


class StripFamily(Family):
    name = "strip"
    config_class = StripConfig
    summary = ("stride 1, dilation 1, groups 1, 32 -> 32 channels, kernel (3, S) with S <= 6 in "
               "TF32, (3, 3) in fp32; channels_last, or NCHW with W and (TF32) P x Q multiples "
               "of 4; sm_90",
               "our TMA + wgmma strip kernels (`strip.cu`, `strip_rs.cu`) on the caller's layout")

    def unsupported_reasons(self, spec):
        return spec.int32_reasons() + spec.strip_unsupported_reasons()

    def candidates(self, spec):
        return strip_configs(spec)

    def sources(self, config: StripConfig) -> Sources:
        device = "strip_rs.cu" if config.mma == "rs" else "strip.cu"
        symbols = (STRIP_SYMBOL, STRIP_EDGE_SYMBOL) if config.mma == "rs" else (STRIP_SYMBOL,)
        return Sources(device, symbols, includes=("strip_common.cuh", "common.cuh"),
                       header="config.h", emit=functools.partial(config_h, config),
                       emitters=(config_h, emit.config_header), arch=f"{config.arch}a")

    def prepare(self, spec, config, device):
        kernel = load(self, config, StripKernel)
        return Prepared(spec, config, self, kernel, kernel.plan(spec, device), device)

    def run(self, prepared, input, weight, bias, stream):
        return run_on_caller_layout(prepared, input, weight, bias, stream)


FAMILY = StripFamily()
