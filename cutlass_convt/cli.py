"""The command line, ``cutlass-convt`` (installed) and ``python -m cutlass_convt``: build,
tune and benchmark the kernels, and manage the kernel cache.

- ``info``: versions (torch, CUDA and the driver, cuda-bindings, CUTLASS, nvcc), each GPU with
  its compute capability and the families that run there, the kernel cache and its size.
- ``generate``: build (emit + nvcc + cache) the kernels problems need, on any machine with
  nvcc, no GPU needed, for tensors of ``--dtype`` (float32, float16 or bfloat16);
  ``--candidates`` every tuning candidate too; ``--tune`` (GPU) times them and stores the
  winners as tuning records.
- ``tune``: ``generate --tune``.
- ``bench``: the benchmark suite (``cutlass_convt.benchmark``) and, with ``--problem e2e``,
  the end-to-end benchmark (``cutlass_convt.e2e``).
- ``cache list | clear | export FILE | import FILE``: the kernel cache's entries, emptying it,
  and a pre-built cache as a ``.tar.gz`` for machines without nvcc.

``scripts/generate.py`` and ``scripts/bench.py`` are these commands under their old names.
Progress bars and log lines live here; the library logs only its warnings.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

from . import env

# The options that describe a --shape problem (a --problem case has its own), and their defaults.
SHAPE_OPTIONS = {"stride": 1, "padding": 0, "output_padding": 0, "dilation": 1, "groups": 1,
                 "bias": False}


def plain(docstring: str) -> str:
    """``docstring`` without its reStructuredText markup, for a parser's description:
    ````x```` as x, ``:role:`~a.b.x``` as x, ``:role:`a.b.x``` as a.b.x (as Sphinx shows
    them)."""
    text = re.sub(r":\w+:`~(?:[\w.]*\.)?([^`]+)`", r"\1", docstring)
    return re.sub(r":\w+:`([^`]+)`", r"\1", text).replace("``", "")


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


def _specs(args):
    """The problems to build for. Raises ValueError or TypeError for invalid --shape
    arguments, with the messages of ``conv_transpose2d``'s checks."""
    from .args import check_arguments, check_groups, check_output_size
    from .spec import PRECISIONS, ProblemSpec

    # 16-bit kernels have no precision: their specs carry PyTorch's default, as calls do
    default = list(PRECISIONS) if args.dtype == "float32" else [PRECISIONS[0]]
    precisions = [args.precision] if args.precision else default
    layouts = {"nchw": [False], "channels_last": [True], "both": [False, True]}[args.layout]
    if args.problem:
        return [dataclasses.replace(args.problem.spec(p, args.arch), channels_last=cl,
                                    dtype=args.dtype)
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
                        bias=args.bias, channels_last=cl, precision=p, arch=args.arch,
                        dtype=args.dtype)
            for p in precisions for cl in layouts]


def _label(spec) -> str:
    """A spec's math and layout in generate's lines: ``"tf32 nchw"``, ``"bf16 channels_last"``."""
    from .spec import math_name

    return (f"{math_name(spec.dtype, spec.precision)} "
            f"{'channels_last' if spec.channels_last else 'nchw'}")


def _terminated(signum, frame) -> None:
    """SIGTERM or SIGHUP: exit through Python (status 143 or 129), so the build being run kills
    its nvcc processes and removes its temporary folder on the way out; further signals are
    ignored while that runs."""
    for other in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(other, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def _add_generate_options(parser: argparse.ArgumentParser, tune: bool) -> None:
    from . import problems
    from .spec import ELEMENT_BYTES

    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--problem", type=problems.argument,
                      help="a case id (e.g. centernet-deconv, kernelbench-l1-71) or a "
                           "KernelBench level-1 number (71 or kernelbench-71 name "
                           "kernelbench-l1-71)")
    what.add_argument("--shape", type=int, nargs=7,
                      metavar=("N", "C_IN", "C_OUT", "H", "W", "R", "S"),
                      help="a layer: batch, input and output channels, input height and width, "
                           "kernel height and width")
    for option in ("stride", "padding", "output_padding", "dilation", "groups"):
        parser.add_argument("--" + option.replace("_", "-"), type=int,
                            help=f"with --shape (default {SHAPE_OPTIONS[option]})")
    parser.add_argument("--bias", action="store_const", const=True,
                        help="with --shape: the module has a bias (nn.ConvTranspose2d's default)")
    parser.add_argument("--dtype", choices=tuple(ELEMENT_BYTES),
                        default="float32", help="the tensors' dtype (default float32)")
    parser.add_argument("--precision", choices=("tf32", "fp32"),
                        help="float32's math (default: both); with a 16-bit --dtype only the "
                             "tuning record's key (default tf32, PyTorch's default)")
    parser.add_argument("--layout", choices=("nchw", "channels_last", "both"), default="both",
                        help="memory format of the tensors (the strip and direct families' "
                             "kernels and the tuning records depend on it)")
    parser.add_argument("--arch", type=_arch,
                        help="target SM, 80 to 199 (90 for an H100/H200); default: this "
                             "machine's GPU with --tune, else 90")
    if not tune:
        parser.add_argument("--candidates", action="store_true",
                            help="build all tuning candidates")
        parser.add_argument("--tune", action="store_true",
                            help="time the candidates on this machine's GPU and store the "
                                 "winners")


def generate(args, parser) -> int:
    """Build the kernels of the problem of ``--problem`` or ``--shape`` (and with ``--tune``
    time its candidates on this machine's GPU and store the winners as tuning records)."""
    import torch
    from tqdm import tqdm

    from . import autotune, build, choose, extension, measure
    from .benchmark import require_gpu
    from .build import BuildError

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _terminated)
    given = [option for option in SHAPE_OPTIONS if getattr(args, option) is not None]
    if args.problem and given:
        parser.error(f"--{given[0].replace('_', '-')} applies to --shape only (a --problem case "
                     "has its own)")
    for option, default in SHAPE_OPTIONS.items():
        if getattr(args, option) is None:
            setattr(args, option, default)
    if args.tune:
        require_gpu("tuning")  # before any build: it times kernels on this machine's GPU
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
            print(f"{_label(spec)}: no kernel family can run it (runs on PyTorch): "
                  + "; ".join(f"{f}: {', '.join(r)}" for f, r in reasons.items()))
        else:
            specs.append(spec)
    builds = {}  # every build the chosen (or candidate) configurations need, in order
    if env.extension_mode() != "off":  # the op's per-call path, built ahead with the kernels
        wanted = extension.config()
        builds[wanted] = extension.sources(wanted)
    for spec in specs:
        for config in (choose.candidates(spec) if args.candidates or args.tune
                       else choose.measured_candidates(spec, measure.mode() == "exhaustive")
                       if measure.mode() != "off"
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
                artifact = build.build(config, sources, progress=False)
            except BuildError as e:  # nvcc's error, without a Python traceback
                bar.close()
                raise SystemExit(f"{parser.prog}: {e}") from None
            finally:
                done.set()
            bar.update()
            bar.write(f"{config.name}: {artifact.path} ("
                      + (f"built in {artifact.manifest['build_seconds']} s" if artifact.compiled
                         else "cache hit") + ")")
    for spec in specs if args.tune else []:
        with tqdm(total=len(choose.candidates(spec)), unit="config", disable=None,
                  desc=f"tune {_label(spec)}") as bar:
            record = autotune.tune(spec, progress=lambda name: bar.update())
        for row in record["results"]:
            print(f"  {row['config']:72} " + (f"{row['median_ms']:8.3f} ms" if "median_ms" in row
                                              else f"skipped: {row['skipped']}"))
        print(f"{_label(spec)} winner: {record['winner_name']} -> "
              f"{choose.record_path(spec, measure.machine(torch.cuda.current_device()))}")
    return 0


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class CommandError(Exception):
    """A command that cannot do its work: one line on stderr, exit status 1."""


def _not_a_folder(root: Path) -> str:
    """Why no build can use ``root`` as the cache folder (it, or the nearest of its parents
    that exists, is not a folder, or a link to nothing lies on the way); empty where one
    can."""
    for path in (root, *root.parents):
        if path.is_symlink() and not path.exists():
            return f"cannot be made: {path} is a link to nothing"
        if path.exists():
            if path.is_dir():
                return ""
            return "is not a folder" if path == root else f"cannot be made: {path} is not a folder"
    return ""


def _folder(root: Path) -> Path:
    """``root``, the cache folder; :class:`CommandError` where no build can use it
    (:func:`_not_a_folder`)."""
    if why := _not_a_folder(root):
        raise CommandError(f"the kernel cache {root} {why}")
    return root


def _entries(root: Path, skipped: list[str] | None = None,
             owner: int | None = None) -> list[tuple[Path, dict]]:
    """The cache's entries that serve (whole, and written by no one but ``owner``, default
    this user, or root: :func:`cutlass_convt.build.inspect_entry`) with their manifests, by
    name; each entry that someone else could have written goes to ``skipped`` (its name and
    why). An empty list where someone else could have written the cache folder or a folder
    above it (:func:`cutlass_convt.build.path_refusal`; to ``skipped``: the folder and why),
    as a build reads none there."""
    from .build import MANIFEST, inspect_entry

    found = []
    if why := _refused(root, owner):
        if skipped is not None:
            skipped.append(f"{root}: not served: {why}")
        return found
    for folder in sorted(_folder(root).glob("*-*")) if root.is_dir() else []:
        if not os.path.lexists(folder / MANIFEST):
            continue
        artifact, why = inspect_entry(folder, owner)
        if artifact is not None:
            found.append((folder, artifact.manifest))
        elif why and skipped is not None:
            skipped.append(f"{folder.name}: not served: {why}")
    return found


def _refused(root: Path, owner: int | None = None) -> str:
    """Why a build reads nothing in the cache folder ``root`` (someone other than ``owner``,
    default this user, or root could have written it or a folder above it:
    :func:`cutlass_convt.build.path_refusal`); empty where it may, is missing or no folder."""
    from .build import path_refusal

    if not root.is_dir():
        return ""
    return path_refusal(root, os.geteuid() if owner is None else owner)[1]


_OURS = re.compile(r"[^.].*-[0-9a-f]{16}|\.tmp-.+-[0-9a-f]{16}-[0-9a-f]{8}|\.tmp-import-.+"
                   r"|\.locks")


def _ours(path: Path, tuning: bool) -> bool:
    """Whether ``cache clear`` removes folder ``path`` of the cache: a kernel entry
    (``<kernel>-<16 hex>`` with a manifest, damaged or not), a build's or an import's staging
    folder, the lock folder, and the tuning records only if ``tuning``; nothing else that
    shares the folder."""
    from .build import MANIFEST

    if not path.is_dir() or path.is_symlink():
        return False
    if path.name == "tuning":
        return tuning
    if not _OURS.fullmatch(path.name):
        return False
    return path.name.startswith(".") or (path / MANIFEST).is_file()


def _cache_lines() -> list[str]:
    """``info``'s lines on the kernel cache and the read-only caches searched after it.
    Raises :class:`cutlass_convt.env.ConfigError` for a bad cache variable."""
    from . import build

    lines = []
    root = env.cache_dir()
    if why := _not_a_folder(root):
        lines.append(f"kernel cache: {root} {why}: nothing is cached or built")
    else:
        entries = _entries(root)
        size = _size(root) if root.is_dir() else 0
        refused = f"; not served: {why}" if (why := _refused(root)) else ""
        lines.append(f"kernel cache: {root} ({_count(len(entries), 'entry', 'entries')}, "
                     f"{size / 2**20:.1f} MiB{refused})")
    searched = dict(build.caches(root))
    for folder in env.cache_path():
        if folder == root:
            continue
        if folder in searched:
            served = _entries(folder, owner=searched[folder])
            lines.append(f"read-only cache: {folder} (owner {build.user_name(searched[folder])}, "
                         f"{_count(len(served), 'entry', 'entries')})")
        elif not folder.is_dir():  # (one others could write: the warning above says why)
            lines.append(f"read-only cache: {folder} (missing or not a folder: not searched)")
    return lines


def info(args, parser) -> int:
    """Print what runs here: versions, GPUs and their families, the kernel cache."""
    import torch

    from . import choose, cuda

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    lines = [f"cutlass_convt {__import__('cutlass_convt').__version__}",
             f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}, cuDNN "
             f"{cudnn or 'none'})"]
    try:
        from cuda.bindings import driver

        version = cuda.check(driver.cuDriverGetVersion())
        lines.append(f"CUDA driver API {version // 1000}.{version % 1000 // 10}")
    except Exception as e:  # no driver on this machine
        lines.append(f"CUDA driver: none ({e.__class__.__name__}: {e})")
    lines.append(f"cuda-bindings {_version('cuda-bindings') or _version('cuda-python')}")
    lines.append(f"CUTLASS (nvidia-cutlass) {env.cutlass_version()}")
    version, why = env.working_nvcc()
    lines.append(f"nvcc {version} at {env.nvcc_path()}" if version else f"nvcc: {why}")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for index in range(count):
        arch = env.device_arch(index)
        runs = [f.name for f in choose.FAMILIES if f.supports_arch(arch)]
        lines.append(f"GPU {index}: {torch.cuda.get_device_name(index)}, sm_{arch}; families: "
                     f"{', '.join(runs) or 'none (PyTorch runs everything)'}")
    if not count:
        lines.append("GPU: none visible (PyTorch's implementation runs every call)")
    try:
        lines += _cache_lines()
    except env.ConfigError as e:  # the versions above are still worth seeing
        print("\n".join(lines))
        raise CommandError(str(e)) from None
    print("\n".join(lines))
    return 0


def _count(n: int, one: str, many: str) -> str:
    """``n`` and the noun in its number: ``1 entry``, ``3 entries``."""
    return f"{n} {one if n == 1 else many}"


def _version(distribution: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def cache(args, parser) -> int:
    """``cache list | clear | export FILE | import FILE [--into FOLDER]``. Returns 1 where
    ``clear`` left a folder or ``import`` imported nothing from a non-empty archive (one line
    on stderr per folder or refused entry, with why). ``clear`` and ``export`` refuse a cache
    folder that a build would refuse (:func:`_refused`)."""
    from . import archive

    root = _folder(env.cache_dir())
    env.cache_path()  # its folders are read by builds: a bad value is an error of every command
    if args.action == "list":
        from .build import caches, user_name

        # the read-only caches a build searches (each refused one: the warning says why)
        read_only = [(folder, owner) for folder, owner in caches(root)
                     if folder != root] if env.cache_path() else []
        for folder, owner in [(root, None), *read_only]:
            skipped = []
            entries = _entries(folder, skipped, owner)
            for entry, manifest in entries:
                built = time.strftime("%Y-%m-%d %H:%M",
                                      time.localtime(manifest.get("built_at", 0)))
                print(f"{entry.name}  {_size(entry) / 2**20:6.2f} MiB  "
                      f"nvcc {manifest.get('nvcc_version')}  built {built}")
            for line in skipped:
                print(line, file=sys.stderr)
            whose = "" if owner is None else f" (read-only, owner {user_name(owner)})"
            print(f"{_count(len(entries), 'entry', 'entries')} in {folder}{whose}")
    elif args.action == "clear":
        from .build import os_error, owner_of

        if why := _refused(root):  # (another user's link there may lead to one's own cache)
            raise CommandError(f"{root} is not cleared: {why}")
        found = sorted(root.iterdir()) if root.is_dir() else []
        removed, kept, records = 0, 0, ""
        for path in (path for path in found if _ours(path, args.tuning)):
            try:
                shutil.rmtree(path)
                if path.name == "tuning":
                    records = " and the tuning records"
                elif not path.name.startswith("."):  # (staging and lock folders: not entries)
                    removed += 1
            except OSError as e:
                kept += 1
                print(f"cannot remove {path} (owned by {owner_of(path)}): {os_error(e)}",
                      file=sys.stderr)
        print(f"removed {_count(removed, 'entry', 'entries')}{records} from {root}")
        return 1 if kept else 0
    elif args.action == "export":
        if why := _refused(root):
            raise CommandError(f"{root} is not exported: {why}")
        if archive.write_mode(Path(args.file)) is None:
            raise CommandError(f"{args.file}: name the archive "
                               f"{', '.join(archive.WRITE_MODES)} (its compression)")
        entries = _entries(root)
        records = archive.export([folder for folder, _ in entries], root, Path(args.file))
        print(f"exported {_count(len(entries), 'entry', 'entries')} and "
              f"{_count(records, 'tuning record', 'tuning records')} of {root} to {args.file}")
    else:  # import
        dest = Path(args.into).resolve() if args.into else root
        imported, refused, tops = archive.import_archive(Path(args.file), dest)
        for line in refused:
            print(f"skipped {line}", file=sys.stderr)
        entries = sum(1 for name in imported if not name.startswith(archive.TUNING + "/"))
        print(f"imported {_count(entries, 'entry', 'entries')} and "
              f"{_count(len(imported) - entries, 'tuning record', 'tuning records')} into {dest}")
        if tops and not imported:
            return 1
    return 0


def bench(argv, prog) -> int:
    bench_main(argv, prog=prog)
    return 0


def _write(out: Path, stem: str, table: str, result: dict, chart=None) -> None:
    """Print ``table`` and write ``<out>/<stem>.md``, ``.json`` (``result``) and, with
    ``chart(result, path)``, ``.png`` (skipped with a note where matplotlib is missing)."""
    import json

    print(table, flush=True)
    (out / f"{stem}.md").write_text(table)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    if chart is None:
        return
    try:
        chart(result, out / f"{stem}.png")
    except ImportError:
        print("matplotlib is not installed: no chart (pip install matplotlib)")


def bench_main(argv=None, prog=None) -> None:
    """``cutlass-convt bench`` / ``scripts/bench.py``: run the suite for named problems and
    write ``<out>/<problem>.md``, ``.json`` and ``.png``; ``--problem models``: the benchmark
    set's summary (``models.md``, ``.json``); ``--problem e2e``: the end-to-end benchmark of
    :mod:`cutlass_convt.e2e` (``e2e.md``, ``.json``, ``.png``). ``prog``: the command's name in
    usage and error lines (default: the script's file name). Usage errors exit with status 2
    before any work; a missing GPU or an unwritable ``--out`` exits with one line."""
    import tempfile

    from . import benchmark, decoders, e2e, problems

    parser = argparse.ArgumentParser(
        prog=prog, description="Run the benchmark suite for named problems and write "
        "<out>/<problem>.md, .json and .png.")
    parser.add_argument("--problem", nargs="+",
                        type=lambda name: name if name in ("all", "models", "e2e") else
                        problems.argument(name),
                        help="case ids or numbers; 'all' for every case; 'models' for the "
                             "benchmark set's summary (every case, one table); 'e2e' for the "
                             "end-to-end benchmark of five public decoders, eager against "
                             "converted (default: kernelbench-71)")
    parser.add_argument("--trials", type=benchmark.trials_argument,
                        help="timed calls per route (default 100; models: at most 30; e2e: "
                             "timed steps per route and mode, default 20)")
    parser.add_argument("--compile", action="store_true",
                        help="also time torch.compile (e2e: add the compile mode, both models "
                             "compiled: about a minute of compilation per model)")
    parser.add_argument("--models", nargs="+", choices=tuple(decoders.DECODERS),
                        help="e2e: the models (default: all)")
    parser.add_argument("--modes", nargs="+", choices=tuple(e2e.MODES),
                        help=f"e2e: the modes (default: {' '.join(e2e.DEFAULT_MODES)})")
    parser.add_argument("--out", default="results", help="folder for .md, .json, .png")
    args = parser.parse_args(argv)
    chosen = args.problem or [problems.find("kernelbench-71")]
    if "e2e" in chosen and len(chosen) > 1:
        parser.error("--problem e2e runs alone")
    if "e2e" not in chosen and (args.models or args.modes):
        parser.error("--models and --modes apply to --problem e2e only")
    out = Path(args.out)
    try:  # before the runs: a folder that cannot be written is an error now, not after them
        out.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out).close()
    except OSError as e:
        raise SystemExit(f"{parser.prog}: --out {out} is not a writable folder ({e})") from None
    benchmark.require_gpu()
    if chosen == ["e2e"]:
        modes = list(args.modes or e2e.DEFAULT_MODES)
        modes += ["compile"] if args.compile and "compile" not in modes else []
        result = e2e.run(args.models or list(decoders.DECODERS), modes, trials=args.trials or 20)
        _write(out, "e2e", e2e.markdown(result), result, e2e.chart)
        return
    if chosen == ["models"]:
        result = benchmark.run_set(list(problems.cases().values()),
                                   trials=min(args.trials or 30, 30))
        _write(out, "models", benchmark.set_markdown(result), result)
        return
    cases = [case for item in chosen for case in (
        problems.cases().values() if item == "all" else [item])]
    for case in cases:
        result = benchmark.run_suite(case, trials=args.trials or 100, compile_torch=args.compile)
        _write(out, case.id, benchmark.markdown(result), result, benchmark.chart)


def parser(prog: str = "cutlass-convt") -> argparse.ArgumentParser:
    """The command line's parser."""
    top = argparse.ArgumentParser(prog=prog, description=plain(__doc__.split("\n\n")[0]),
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = top.add_subparsers(dest="command", metavar="command", required=True)
    commands.add_parser("info", help="versions, GPUs and their families, the kernel cache")
    _add_generate_options(commands.add_parser(
        "generate", help="build the kernels of problems ahead (nvcc; no GPU needed)"), tune=False)
    _add_generate_options(commands.add_parser(
        "tune", help="time every candidate of problems on this GPU, keep the winners"),
        tune=True)
    commands.add_parser("bench", help="the benchmark suite (bench --help for its options)",
                        add_help=False)
    store = commands.add_parser("cache", help="list, clear, export or import the kernel cache")
    actions = store.add_subparsers(dest="action", metavar="action", required=True)
    actions.add_parser("list", help="the entries of the cache and of the read-only caches "
                                         f"of {env.CACHE_PATH_VARIABLE}")
    clear = actions.add_parser("clear", help="remove the built kernels")
    clear.add_argument("--tuning", action="store_true", help="the tuning records too")
    actions.add_parser("export", help="write the entries and tuning records to FILE "
                                                  "(.tar.gz, .tar.xz, .tar.bz2 or .tar: "
                                                  "compressed as named)").add_argument(
        "file", metavar="FILE", help="the archive to write (replaced when whole)")
    load = actions.add_parser("import", help="add FILE's valid entries and tuning records whose "
                              "kernels the cache lacks; an archive's kernels run as your code: "
                              "import only archives you trust")
    load.add_argument("file", metavar="FILE", help="an archive written by cache export")
    load.add_argument("--into", metavar="FOLDER",
                      help="the cache to fill (default: the kernel cache), for example a "
                           f"read-only cache of {env.CACHE_PATH_VARIABLE} filled by its owner")
    return top


def main(argv=None, prog: str = "cutlass-convt") -> int:
    """Run one command (``argv`` defaults to ``sys.argv[1:]``); returns the exit status. Usage
    errors exit with status 2, as argparse's."""
    argv = sys.argv[1:] if argv is None else list(argv)
    logging.basicConfig(format="%(message)s", level=logging.WARNING)
    if argv[:1] == ["bench"]:  # the suite parses its own options
        return bench(argv[1:], f"{prog} bench")
    if argv[:1] in (["generate"], ["tune"]):
        return generate_main(argv[1:], f"{prog} {argv[0]}", tune=argv[0] == "tune")
    args = parser(prog).parse_args(argv)
    from . import archive, build

    try:
        return {"info": info, "cache": cache}[args.command](args, None)
    except (CommandError, archive.ArchiveError, build.BuildError, env.ConfigError,
            OSError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1


TUNE_DESCRIPTION = ("Build every tuning candidate of the problem of --problem or --shape, time "
                    "each and PyTorch's route on this machine's GPU, and store the winner as "
                    "the problem's tuning record for this machine.")


def generate_main(argv, prog: str, tune: bool = False) -> int:
    """``generate`` (or ``tune``) with its own parser named ``prog`` (``scripts/generate.py``
    is this under its own name)."""
    logging.basicConfig(format="%(message)s", level=logging.WARNING)
    command = argparse.ArgumentParser(prog=prog, description=TUNE_DESCRIPTION if tune
                                      else plain(generate.__doc__))
    _add_generate_options(command, tune)
    args = command.parse_args(argv)
    if tune:
        args.tune, args.candidates = True, True
    try:
        return generate(args, command)
    except env.ConfigError as e:  # a variable's bad value: its message, no traceback
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
