"""The direct family: our own stride-1 kernel (``templates/direct.cu``, on CuTe's SM80/SM90
atoms) for up to 32 output channels (more in blocks of 32 on sm_90), on the caller's layout
and PyTorch's filter as it is: input tiles with their halo in shared memory, the filter (or a
block of its output channels) resident, ``wgmma`` or ``mma.sync``, a persistent grid.
``docs/design/direct.md``.
"""

from __future__ import annotations

import functools

from .. import emit
from ..build import Sources
from ..launch import DIRECT_SYMBOL, DirectKernel
from ..spec import DirectConfig, direct_config, direct_configs
from .base import Family, Prepared, load, run_on_caller_layout


def config_h(config: DirectConfig) -> str:
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
    return emit.config_header(config.name, constants, flags)


class DirectFamily(Family):
    name = "direct"
    config_class = DirectConfig
    summary = ("other stride-1 problems with dilation 1, groups 1, channels in multiples of 8, "
               "C_out <= 32 (multiples of 32 beyond, sm_90), whose filter block fits in shared "
               "memory beside an input tile; fp32 with C_in <= 64",
               "our kernel (`direct.cu`) on the caller's layout: wgmma on sm_90, else mma.sync")

    def unsupported_reasons(self, spec):
        return spec.int32_reasons() + spec.direct_unsupported_reasons()

    def candidates(self, spec):
        return direct_configs(spec)

    def demoted(self, spec):
        """After CUTLASS's stock families where the default configuration splits the output
        channels among CTAs (the filter does not fit whole), and in fp32 on one stage with
        blocks of 8 output channels and more than 16 taps; except fp32 with C_out > 32 on the
        4-row tile. ``docs/design/direct.md`` gives the measurements behind the rule."""
        config = direct_config(spec)
        if config is None:
            return False
        wide_fp32 = (config.precision == "fp32" and config.out_channels > 32
                     and config.tile[0] >= 4)
        return not wide_fp32 and (
            config.out_block < config.out_channels
            or (config.precision == "fp32" and config.out_block == 8 and config.stages == 1
                and config.kernel_size[0] * config.kernel_size[1] > 16))

    def sources(self, config: DirectConfig) -> Sources:
        arch = f"{config.arch}a" if config.math == "wgmma" else str(config.arch)
        return Sources("direct.cu", (DIRECT_SYMBOL,), includes=("common.cuh",),
                       header="config.h", emit=functools.partial(config_h, config),
                       emitters=(config_h, emit.config_header), arch=arch)

    def prepare(self, spec, config, device):
        kernel = load(self, config, DirectKernel)
        return Prepared(spec, config, self, kernel, kernel.plan(spec, device), device)

    def run(self, prepared, input, weight, bias, stream):
        return run_on_caller_layout(prepared, input, weight, bias, stream)


FAMILY = DirectFamily()
