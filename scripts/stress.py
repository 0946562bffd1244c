"""The kernel cache and the launch path under load (GPU): a stress run of several processes
sharing one empty kernel cache, and a soak of one process.

    python scripts/stress.py stress [--processes 8] [--calls 300] [--classes 48] [--json F]
    python scripts/stress.py soak [--calls 20000] [--classes 48] [--sizes 6] [--json F]

``stress``: ``--processes`` processes, each making ``--calls`` calls of random problems, all
sharing one kernel cache that starts empty (a new folder, or ``--cache`` naming an empty one).
The problems come from ``--classes`` random problem classes (kernel size, channels, stride,
padding, output padding, dilation, groups, bias, layout, precision and backend: each family
of ``cutlass_convt.families`` forced, or ``"auto"``), each call with a fresh batch size,
input size and random tensors; the processes draw from the same classes, so that they build
different kernels at once and wait on each other's builds of the same one. Every output is
checked against float64 (shape, dtype, memory format as PyTorch's; the relative Frobenius
error within ``benchmark.REL_BOUND`` and every element within its precision's rounding model,
:func:`check`). The run fails on any error, and when a kernel was compiled more than once.

``soak``: one process, ``--calls`` calls over ``--classes`` x ``--sizes`` problems in random
order (the cache of a stress run reused: ``--cache``), every output checked, with the host's
resident memory, the GPU memory (PyTorch's allocated and reserved bytes, and the device's used
bytes), the loaded kernels, the shared libraries mapped and the open files sampled
``--samples`` times. It fails when any of them still grows over the second half of the run
(bounded caches, no per-call leak), beyond a small allowance for host memory.

``--device cpu`` runs the harness on the CPU (PyTorch's route, backend ``"auto"``): a dry run.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import multiprocessing
import os
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

# Backends a class may force: every family, and the default choice.
AUTO = "auto"


@dataclass(frozen=True)
class ProblemClass:
    """What a call's kernel depends on; the batch and input sizes are drawn per call."""

    in_channels: int
    out_channels: int
    kernel_size: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    output_padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    bias: bool
    channels_last: bool
    precision: str
    backend: str

    def spec(self, batch: int, in_size: tuple[int, int], arch: int):
        from cutlass_convt.spec import ProblemSpec

        return ProblemSpec(batch=batch, in_channels=self.in_channels,
                           out_channels=self.out_channels, in_size=in_size,
                           kernel_size=self.kernel_size, stride=self.stride,
                           padding=self.padding, output_padding=self.output_padding,
                           dilation=self.dilation, groups=self.groups, bias=self.bias,
                           channels_last=self.channels_last, precision=self.precision,
                           arch=arch)

    def out_size(self, in_size: tuple[int, int]) -> tuple[int, int]:
        return tuple((i - 1) * s - 2 * p + d * (k - 1) + o + 1 for i, s, p, d, k, o in zip(
            in_size, self.stride, self.padding, self.dilation, self.kernel_size,
            self.output_padding))


def _pair(rng: random.Random, values) -> tuple[int, int]:
    return (rng.choice(values), rng.choice(values))


def _random_class(rng: random.Random) -> ProblemClass:
    """Any valid problem class (sizes within PyTorch's rules), backend ``"auto"``."""
    groups = rng.choice((1, 1, 1, 1, 2, 4))
    kernel = (3, 3) if rng.random() < 0.3 else _pair(rng, (1, 2, 3, 4, 5))
    stride = _pair(rng, (1, 1, 2, 2, 3, 4))
    dilation = (1, 1) if rng.random() < 0.8 else _pair(rng, (1, 2, 3))
    padding = tuple(rng.randint(0, min(d * (k - 1), 3)) for d, k in zip(dilation, kernel))
    output_padding = tuple(0 if rng.random() < 0.5 else rng.randrange(max(s, d))
                           for s, d in zip(stride, dilation))
    return ProblemClass(
        in_channels=groups * rng.choice((1, 3, 4, 8, 16, 32, 64)),
        out_channels=groups * rng.choice((1, 3, 4, 8, 16, 17, 32, 64)),
        kernel_size=kernel, stride=stride, padding=padding, output_padding=output_padding,
        dilation=dilation, groups=groups, bias=rng.random() < 0.5,
        channels_last=rng.random() < 0.5, precision=rng.choice(("tf32", "fp32")), backend=AUTO)


def _aimed(rng: random.Random, base: ProblemClass, family: str) -> ProblemClass:
    """``base`` changed towards what ``family`` computes (the family checks the result)."""
    one = dict(stride=(1, 1), dilation=(1, 1), groups=1, output_padding=(0, 0))
    if family == "strip":
        width = rng.choice((3, 5)) if base.precision == "tf32" else 3
        return replace(base, **one, in_channels=32, out_channels=32, kernel_size=(3, width),
                       padding=(rng.randint(0, 2), rng.randint(0, min(width - 1, 2))))
    if family == "direct":
        return replace(base, **one, in_channels=rng.choice((8, 16, 32)),
                       out_channels=rng.choice((8, 16, 32, 64)))
    if family == "fprop_sm90":
        return replace(base, **one, in_channels=rng.choice((4, 16, 32)),
                       out_channels=rng.choice((32, 64)), bias=False, precision="tf32",
                       padding=tuple(min(p, k - 1) for p, k in zip(base.padding,
                                                                   base.kernel_size)))
    if family == "dgrad":
        return replace(base, dilation=(1, 1)) if base.stride != (1, 1) else base
    if family == "phase":
        stride = base.stride if base.stride != (1, 1) else (2, rng.choice((1, 2)))
        return replace(base, stride=stride, in_channels=base.groups * rng.choice((4, 8, 32)),
                       output_padding=tuple(min(o, max(s, d) - 1) for o, s, d in zip(
                           base.output_padding, stride, base.dilation)))
    return base


def draw_classes(count: int, seed: int, arch: int, device: str) -> list[ProblemClass]:
    """``count`` problem classes, the backends in turn (every family, then ``"auto"``), each
    class computable by its backend at the nominal size (2 x 16 x 16)."""
    from cutlass_convt import choose

    rng = random.Random(seed)
    backends = (*choose.NAMES, AUTO) if device == "cuda" else (AUTO,)
    classes = []
    while len(classes) < count:
        backend = backends[len(classes) % len(backends)]
        for _ in range(1000):
            c = replace(_aimed(rng, _random_class(rng), backend), backend=backend)
            if min(c.out_size((16, 16))) < 1:
                continue
            if backend == AUTO or not choose.family(backend).unsupported_reasons(
                    c.spec(2, (16, 16), arch)):
                classes.append(c)
                break
        else:
            raise RuntimeError(f"no class for {backend} in 1000 draws")
    return classes


def draw_size(rng: random.Random, c: ProblemClass, arch: int) -> tuple[int, tuple[int, int]]:
    """A batch size and input size for a call of ``c`` that its backend computes (at most 50
    draws; else the nominal 2 x 16 x 16)."""
    from cutlass_convt import choose

    for _ in range(50):
        batch = rng.choice((1, 1, 2, 3))
        in_size = (rng.choice((1, 2, 5, 8, 13, 16, 24, 31)),
                   rng.choice((1, 3, 4, 8, 12, 16, 20, 33)))
        if min(c.out_size(in_size)) < 1:
            continue
        if c.backend == AUTO or not choose.family(c.backend).unsupported_reasons(
                c.spec(batch, in_size, arch)):
            return batch, in_size
    return 2, (16, 16)


# Per-element error allowed against float64: (PRODUCT + n x 2^-22) x sum |x| |w| over the
# output's n terms. A TF32 product of truncated operands (10 mantissa bits each) is off by at
# most 2^-9 relative, a 3xTF32 one by about 2^-19; the tensor cores' float32 sums, rounded
# toward zero, add up to 2^-23 a term. Both hold 2x margin.
PRODUCT_ERROR = {"tf32": 2.0 ** -8, "fp32": 2.0 ** -17}


def check(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b, c: ProblemClass) -> str | None:
    """Why ``y`` is not ``c``'s transposed convolution of ``x``, ``w``, ``b`` (None if it is):
    shape or dtype other than PyTorch's, not packed in a memory format PyTorch's result is
    packed in, a relative Frobenius error against float64 above ``benchmark.REL_BOUND``, or
    an element off by more than its precision's rounding model allows
    (:data:`PRODUCT_ERROR`; NaN fails)."""
    from cutlass_convt.benchmark import REL_BOUND, errors

    args = (c.stride, c.padding, c.output_padding, c.groups, c.dilation)
    ref = F.conv_transpose2d(x.double(), w.double(), None if b is None else b.double(), *args)
    if y.shape != ref.shape or y.dtype != x.dtype:
        return f"shape {tuple(y.shape)} {y.dtype}, expected {tuple(ref.shape)} {x.dtype}"
    theirs = F.conv_transpose2d(x, w, b, *args)  # PyTorch's memory-format rule
    for form in (torch.contiguous_format, torch.channels_last):
        if theirs.is_contiguous(memory_format=form) and not y.is_contiguous(memory_format=form):
            return f"strides {y.stride()}, expected {form} as PyTorch's {theirs.stride()}"
    err = errors(y, ref)
    if not err["rel"] <= REL_BOUND[c.precision]:
        return f"rel {err['rel']:.2e} > {REL_BOUND[c.precision]:g}"
    terms = c.in_channels // c.groups * c.kernel_size[0] * c.kernel_size[1]
    allowed = (PRODUCT_ERROR[c.precision] + terms * 2.0 ** -22) * F.conv_transpose2d(
        x.double().abs(), w.double().abs(), None if b is None else b.double().abs(), *args)
    off = (y.double() - ref).abs()
    if not bool((off <= allowed).all()):
        worst = int((off - allowed).flatten().argmax())
        return (f"element {worst} of {y.numel()} off by {off.flatten()[worst]:.2e} (allowed "
                f"{allowed.flatten()[worst]:.2e})")
    return None


def one_call(c: ProblemClass, batch: int, in_size: tuple[int, int], device: str,
             gen: torch.Generator) -> str | None:
    """One call on fresh random tensors, its output memory poisoned (NaN) through PyTorch's
    allocator first; why it failed, or None."""
    import cutlass_convt

    x = torch.randn(batch, c.in_channels, *in_size, device=device, generator=gen)
    if c.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(c.in_channels, c.out_channels // c.groups, *c.kernel_size, device=device,
                    generator=gen)
    b = torch.randn(c.out_channels, device=device, generator=gen) if c.bias else None
    out = c.out_size(in_size)
    torch.full((batch * c.out_channels * out[0] * out[1],), math.nan, device=device)
    y = cutlass_convt.conv_transpose2d(x, w, b, c.stride, c.padding, c.output_padding,
                                       c.groups, c.dilation, precision=c.precision,
                                       backend=c.backend)
    return check(y, x, w, b, c)


class _Builds(logging.Handler):
    """Counts the kernels this process compiles (build's first-use warning)."""

    def __init__(self):
        super().__init__()
        self.kernels: Counter = Counter()

    def emit(self, record):
        if record.getMessage().startswith("cutlass_convt: compiling kernel "):
            self.kernels[record.args[0]] += 1


def _route_name(c: ProblemClass, batch, in_size, arch, device) -> str:
    from cutlass_convt.benchmark import ops_route_name

    if device != "cuda":
        return "torch"
    name = ops_route_name(c.spec(batch, in_size, arch), c.backend)
    return name.split("_")[0] if name != "torch" else name


def _arch(device: str) -> int:
    from cutlass_convt import env

    return env.device_arch(0) if device == "cuda" else 90


def worker(job: dict) -> dict:
    """One stress process: ``job["calls"]`` calls drawn with ``job["seed"]``."""
    import warnings

    import cutlass_convt

    warnings.simplefilter("ignore", RuntimeWarning)  # PyTorch's route on the CPU
    builds = _Builds()
    logging.getLogger("cutlass_convt").addHandler(builds)
    device, arch = job["device"], _arch(job["device"])
    classes = [ProblemClass(**{k: tuple(v) if isinstance(v, list) else v
                               for k, v in c.items()}) for c in job["classes"]]
    rng, gen = random.Random(job["seed"]), torch.Generator(device).manual_seed(job["seed"])
    routes, failures, problems, refused = Counter(), [], set(), 0
    start = time.perf_counter()
    for i in range(job["calls"]):
        c = rng.choice(classes)
        batch, in_size = draw_size(rng, c, arch)
        problems.add((c, batch, in_size))
        try:
            failure = one_call(c, batch, in_size, device, gen)
        except cutlass_convt.UnsupportedProblem as e:  # a size its family refuses: said so
            refused += 1
            failure = None if c.backend != AUTO else f"UnsupportedProblem: {e}"
        except Exception as e:  # noqa: BLE001 (every error is counted and reported)
            failure = f"{type(e).__name__}: {e}"
        routes[_route_name(c, batch, in_size, arch, device)] += 1
        if failure is not None:
            failures.append(f"call {i}: {c} batch {batch} in {in_size}: {failure}")
    if device == "cuda":
        torch.cuda.synchronize()
    return {"seed": job["seed"], "calls": job["calls"], "problems": len(problems),
            "refused": refused, "routes": dict(routes), "failures": failures,
            "builds": dict(builds.kernels), "seconds": time.perf_counter() - start}


def _cache(args) -> Path:
    """The kernel cache to use (``--cache``, else a new folder), set for this process and the
    ones it starts."""
    path = Path(args.cache) if args.cache else Path(tempfile.mkdtemp(prefix="cutlass-convt-"))
    path.mkdir(parents=True, exist_ok=True)
    from cutlass_convt import env

    os.environ[env.CACHE_DIR_VARIABLE] = str(path)
    return path


def stress(args) -> dict:
    cache = _cache(args)
    if any(cache.iterdir()):
        raise SystemExit(f"stress: the cache {cache} is not empty (the run starts from an "
                         "empty one)")
    classes = draw_classes(args.classes, args.seed, _arch(args.device), args.device)
    jobs = [{"seed": args.seed + 1 + i, "calls": args.calls, "device": args.device,
             "classes": [asdict(c) for c in classes]} for i in range(args.processes)]
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(args.processes) as pool:
        results = pool.map(worker, jobs)
    seconds = time.perf_counter() - start
    builds: Counter = Counter()
    for r in results:
        builds.update(r["builds"])
    twice = {k: n for k, n in builds.items() if n > 1}
    failures = [f for r in results for f in r["failures"]]
    report = {
        "run": "stress", "processes": args.processes, "calls": sum(r["calls"] for r in results),
        "classes": len(classes), "problems": sum(r["problems"] for r in results),
        "routes": dict(sum((Counter(r["routes"]) for r in results), Counter())),
        "refused": sum(r["refused"] for r in results), "kernels_built": len(builds),
        "built_more_than_once": twice, "errors": len(failures), "failures": failures[:50],
        "seconds": round(seconds, 1), "cache": str(cache),
        "entries": sum(1 for p in cache.iterdir() if (p / "manifest.json").exists()),
        "ok": not failures and not twice,
    }
    return report


def _sample(device: str) -> dict:
    """The process's resources now."""
    from cutlass_convt import cuda

    rss_kb = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text()
                  .splitlines() if line.startswith("VmRSS:"))
    libraries = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
                 if ".so" in line.rsplit("/", 1)[-1]}
    sample = {"rss_mb": rss_kb / 1024, "open_files": len(os.listdir("/proc/self/fd")),
              "libraries": len(libraries), "kernels_loaded": len(cuda._LOADED)}
    if device == "cuda":
        free, total = torch.cuda.mem_get_info()
        sample.update(allocated_mb=torch.cuda.memory_allocated() / 2**20,
                      reserved_mb=torch.cuda.memory_reserved() / 2**20,
                      device_used_mb=(total - free) / 2**20)
    return sample


# What the second half of a soak may add: host memory (the allocator's and Python's arenas
# settle slowly) and nothing else.
RSS_ALLOWANCE_MB = 32.0


def soak(args) -> dict:
    import warnings

    import cutlass_convt

    warnings.simplefilter("ignore", RuntimeWarning)
    _cache(args)
    device, arch = args.device, _arch(args.device)
    rng, gen = random.Random(args.seed), torch.Generator(device).manual_seed(args.seed)
    problems = [(c, *draw_size(rng, c, arch))
                for c in draw_classes(args.classes, args.seed, arch, device)
                for _ in range(args.sizes)]
    for c, batch, in_size in problems:  # builds and loads what the soak needs
        try:
            one_call(c, batch, in_size, device, gen)
        except cutlass_convt.UnsupportedProblem:
            pass
    samples, failures, refused, every = [], [], 0, max(1, args.calls // args.samples)
    start = time.perf_counter()
    for i in range(args.calls):
        if i % every == 0:
            samples.append({"call": i, **_sample(device)})
        c, batch, in_size = rng.choice(problems)
        try:
            failure = one_call(c, batch, in_size, device, gen)
        except cutlass_convt.UnsupportedProblem as e:
            refused += 1
            failure = None if c.backend != AUTO else f"UnsupportedProblem: {e}"
        except Exception as e:  # noqa: BLE001
            failure = f"{type(e).__name__}: {e}"
        if failure is not None:
            failures.append(f"call {i}: {c} batch {batch} in {in_size}: {failure}")
    if device == "cuda":
        torch.cuda.synchronize()
    samples.append({"call": args.calls, **_sample(device)})
    half = samples[len(samples) // 2]
    growth = {k: samples[-1][k] - half[k] for k in samples[-1] if k != "call"}
    leaks = {k: v for k, v in growth.items()
             if v > (RSS_ALLOWANCE_MB if k == "rss_mb" else 0)}
    return {"run": "soak", "calls": args.calls, "problems": len(problems),
            "classes": args.classes, "refused": refused, "errors": len(failures),
            "failures": failures[:50], "seconds": round(time.perf_counter() - start, 1),
            "start": samples[0], "half": half, "end": samples[-1],
            "growth_second_half": growth, "leaks": leaks, "samples": samples,
            "ok": not failures and not leaks}


def _markdown(report: dict) -> str:
    if report["run"] == "stress":
        routes = ", ".join(f"{k} {v}" for k, v in sorted(report["routes"].items()))
        return "\n".join([
            "| processes | calls | classes | problems | kernels built | built twice | "
            "refused | errors | seconds |", "|---|---|---|---|---|---|---|---|---|",
            f"| {report['processes']} | {report['calls']} | {report['classes']} | "
            f"{report['problems']} | {report['kernels_built']} | "
            f"{len(report['built_more_than_once'])} | {report['refused']} | {report['errors']} "
            f"| {report['seconds']} |", "", f"routes: {routes}"])
    keys = [k for k in report["end"] if k != "call"]
    lines = ["| sampled | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for name in ("start", "half", "end"):
        lines.append(f"| {name} (call {report[name]['call']}) | "
                     + " | ".join(f"{report[name][k]:.1f}" for k in keys) + " |")
    lines.append(f"\n{report['calls']} calls, {report['problems']} problems, "
                 f"{report['errors']} errors, {report['refused']} refused, "
                 f"{report['seconds']} s; growth over the second half: "
                 + ", ".join(f"{k} {v:+.1f}" for k, v in report["growth_second_half"].items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    from cutlass_convt.cli import plain

    parser = argparse.ArgumentParser(description=plain(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", choices=("stress", "soak"))
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--calls", type=int, help="per process (stress; default 300) or in "
                        "all (soak; default 20000)")
    parser.add_argument("--classes", type=int, default=48)
    parser.add_argument("--sizes", type=int, default=6, help="soak: input sizes per class")
    parser.add_argument("--samples", type=int, default=40, help="soak: resource samples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", help="the kernel cache folder (default: a new one)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)
    if args.device == "cuda":
        from cutlass_convt.benchmark import require_gpu

        require_gpu("the stress run")
    if args.calls is None:
        args.calls = 300 if args.run == "stress" else 20000
    report = stress(args) if args.run == "stress" else soak(args)
    print(_markdown(report))
    for failure in report["failures"]:
        print(failure, file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    print("ok" if report["ok"] else "FAILED")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
