"""Build (emit + nvcc + cache) the kernels a problem needs, on any machine with nvcc; no GPU.
With --candidates, build every tuning candidate too; with --tune (needs a GPU), time the
candidates on the problem and store the winner as a tuning record under the cache folder.

    python scripts/generate.py --problem kernelbench-71
    python scripts/generate.py --problem kernelbench-71 --candidates     # ahead of --tune
    python scripts/generate.py --problem kernelbench-71 --tune
    python scripts/generate.py --shape 8 32 32 512 1024 3 3 --stride 2 --padding 1 \\
        --output-padding 1 --precision tf32
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import threading
import time

import torch
from tqdm import tqdm

from cutlass_convt import autotune, build, choose, env, problems
from cutlass_convt.args import check_arguments, check_groups, check_output_size
from cutlass_convt.benchmark import require_gpu
from cutlass_convt.build import BuildError
from cutlass_convt.spec import PRECISIONS, ProblemSpec

# The options that describe a --shape problem (a --problem case has its own), and their defaults.
SHAPE_OPTIONS = {"stride": 1, "padding": 0, "output_padding": 0, "dilation": 1, "groups": 1,
                 "bias": False}


def _arch(text: str) -> int:
    """``--arch`` as an ``argparse`` type: an SM number from 80 (our kernels need sm_80 or later;
    older GPUs run on PyTorch) to 199 that nvcc compiles for (when there is a working nvcc)."""
    try:
        arch = int(text)
    except ValueError:
        arch = 0
    if not 80 <= arch < 200:
        raise argparse.ArgumentTypeError(f"an SM number from 80 to 199 (90 for an H100/H200), "
                                         f"got {text}")
    targets = env.nvcc_archs()
    if targets is not None and arch not in targets:
        raise argparse.ArgumentTypeError(
            f"nvcc {env.nvcc_version()} does not compile for sm_{arch}; it takes "
            f"{', '.join(str(a) for a in sorted(targets) if a >= 80)}")
    return arch


def _specs(args) -> list[ProblemSpec]:
    """The problems to build for. Raises ValueError or TypeError for invalid --shape
    arguments, with the messages of ``conv_transpose2d``'s checks."""
    precisions = [args.precision] if args.precision else list(PRECISIONS)
    layouts = {"nchw": [False], "channels_last": [True], "both": [False, True]}[args.layout]
    if args.problem:
        return [dataclasses.replace(args.problem.spec(p, args.arch), channels_last=cl)
                for p in precisions for cl in layouts]
    n, c_in, c_out, h, w, r, s = args.shape
    if min(args.shape) < 1:
        raise ValueError(f"N, C_IN, C_OUT, H, W, R and S must be positive, got {args.shape}")
    stride, padding, output_padding, groups, dilation = check_arguments(
        args.stride, args.padding, args.output_padding, args.groups, args.dilation)
    check_groups(c_in, c_out, groups)
    check_output_size((h, w), (r, s), stride, padding, output_padding, dilation)
    return [ProblemSpec(batch=n, in_channels=c_in, out_channels=c_out, in_size=(h, w),
                        kernel_size=(r, s), stride=stride, padding=padding,
                        output_padding=output_padding, dilation=dilation, groups=groups,
                        bias=args.bias, channels_last=cl, precision=p, arch=args.arch)
            for p in precisions for cl in layouts]


def _terminated(signum, frame) -> None:
    """SIGTERM or SIGHUP: exit through Python (status 143 or 129), so the build being run kills
    its nvcc processes and removes its temporary folder on the way out; further signals are
    ignored while that runs."""
    for other in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(other, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def main() -> None:
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _terminated)
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--problem", type=problems.argument,
                      help="a case id, e.g. kernelbench-71 (kernelbench-l1-71)")
    what.add_argument("--shape", type=int, nargs=7,
                      metavar=("N", "C_IN", "C_OUT", "H", "W", "R", "S"))
    for option in ("stride", "padding", "output_padding", "dilation", "groups"):
        parser.add_argument("--" + option.replace("_", "-"), type=int,
                            help=f"with --shape (default {SHAPE_OPTIONS[option]})")
    parser.add_argument("--bias", action="store_const", const=True,
                        help="with --shape: the module has a bias (nn.ConvTranspose2d's default)")
    parser.add_argument("--precision", choices=PRECISIONS, help="default: both")
    parser.add_argument("--layout", choices=("nchw", "channels_last", "both"), default="both",
                        help="memory format of the tensors (the strip and direct families' "
                             "kernels and the tuning records depend on it)")
    parser.add_argument("--arch", type=_arch,
                        help="target SM, 80 to 199 (90 for an H100/H200); default: this "
                             "machine's GPU with --tune, else 90")
    parser.add_argument("--candidates", action="store_true", help="build all tuning candidates")
    parser.add_argument("--tune", action="store_true",
                        help="time the candidates on this machine's GPU and store the winners")
    args = parser.parse_args()
    given = [option for option in SHAPE_OPTIONS if getattr(args, option) is not None]
    if args.problem and given:
        parser.error(f"--{given[0].replace('_', '-')} applies to --shape only (a --problem case "
                     "has its own)")
    for option, default in SHAPE_OPTIONS.items():
        if getattr(args, option) is None:
            setattr(args, option, default)
    if args.tune:
        require_gpu("--tune")  # before any build: it times kernels on this machine's GPU
        if args.arch is None:
            args.arch = env.device_arch(torch.cuda.current_device())
    if args.arch is None:
        args.arch = 90

    try:
        all_specs = _specs(args)
    except (TypeError, ValueError) as e:  # the argument checks of conv_transpose2d
        parser.error(str(e))
    specs = []
    for spec in all_specs:
        reasons = {f.name: f.unsupported_reasons(spec) for f in choose.FAMILIES}
        if all(reasons.values()):
            layout = "channels_last" if spec.channels_last else "nchw"
            print(f"{spec.precision} {layout}: no kernel family can run it (runs on PyTorch): "
                  + "; ".join(f"{f}: {', '.join(r)}" for f, r in reasons.items()))
        else:
            specs.append(spec)
    builds = {}  # every build the chosen (or candidate) configurations need, in order
    for spec in specs:
        for config in (choose.candidates(spec) if args.candidates or args.tune
                       else [choose.choose_config(spec)]):
            for built, sources in choose.family_of(config).builds(config):
                builds.setdefault(built, sources)
    version, why = env.working_nvcc()
    nvcc = version or f"{why} (cached kernels only)"
    print(f"cache: {env.cache_dir()}  nvcc: {nvcc}  CUTLASS: {env.cutlass_version()}")
    # disable=None: no progress bar when stderr is not a terminal (piped logs stay plain lines)
    with tqdm(total=len(builds), unit="kernel", disable=None,
              bar_format="{l_bar}{bar}| {n}/{total} [{elapsed}] {postfix}") as bar:
        for config, sources in builds.items():
            done = threading.Event()
            start = time.perf_counter()

            def tick():  # progress while nvcc runs
                while not done.wait(1.0):
                    bar.set_postfix_str(f"{config.name}: nvcc {time.perf_counter() - start:.0f} s")

            threading.Thread(target=tick, daemon=True).start()
            try:
                artifact = build.build(config, sources)
            except BuildError as e:  # nvcc's error, without a Python traceback
                bar.close()
                raise SystemExit(f"generate.py: {e}") from None
            finally:
                done.set()
            bar.update()
            bar.write(f"{config.name}: {artifact.path} ("
                      + (f"built in {artifact.manifest['build_seconds']} s" if artifact.compiled
                         else "cache hit") + ")")
    for spec in specs if args.tune else []:
        layout = "channels_last" if spec.channels_last else "nchw"
        with tqdm(total=len(choose.candidates(spec)), unit="config", disable=None,
                  desc=f"tune {spec.precision} {layout}") as bar:
            record = autotune.tune(spec, progress=lambda name: bar.update())
        for row in record["results"]:
            print(f"  {row['config']:72} " + (f"{row['median_ms']:8.3f} ms" if "median_ms" in row
                                              else f"skipped: {row['skipped']}"))
        print(f"{spec.precision} {layout} winner: {record['winner_name']} -> "
              f"{choose.record_path(spec)}")


if __name__ == "__main__":
    main()
