"""The scripts and the benchmark's helpers: generate.py, run_kernelbench.py and bench.py
refuse bad arguments before any work, SIGTERM kills nvcc, named problems, timing."""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cutlass_convt import build, cli, env, problems
from cutlass_convt.benchmark import phase_decomposition

from helpers import TF32, TF32_SOURCES, all_gone, compile_only_a_cubin, sleeping_nvcc, wait_for_pids

ROOT = Path(__file__).parents[1]


def _checkout_env() -> dict:
    """This process's environment with the checkout first on PYTHONPATH, for the scripts."""
    path = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    return {**os.environ, "PYTHONPATH": path}


def test_generate_checks_shape_arguments_before_building():
    """``generate.py --shape`` refuses what ``conv_transpose2d`` refuses, and the script refuses
    options that do not fit the problem's form and SM numbers it cannot target, with a usage
    error (exit status 2) and no build; so does ``python -m cutlass_convt`` without its
    subcommand."""
    root = Path(__file__).parents[1]
    script = root / "scripts" / "generate.py"
    shape = ["--shape", "1", "8", "8", "10", "12", "3", "3"]
    path = os.pathsep.join(filter(None, (str(root), os.environ.get("PYTHONPATH"))))
    for args, message in (
            (shape + ["--stride", "2", "--output-padding", "2"],
             "output_padding must be smaller than either stride or dilation"),
            (shape + ["--dilation", "0"], "stride and dilation must be positive"),
            (shape + ["--groups", "3"], "in_channels (8) must be divisible by groups (3)"),
            (shape + ["--padding", "7"], "too small"),
            (["--shape", "1", "-8", "8", "10", "12", "3", "3"], "must be positive"),
            (["--shape", "1", "8", "8", "-10", "12", "3", "3"], "must be positive"),
            (["--problem", "71", "--stride", "2"], "--stride applies to --shape only"),
            (["--problem", "71", "--bias"], "--bias applies to --shape only"),
            (["--problem", "71", "--arch", "0"], "an SM number from 80 to 199"),
            (["--problem", "71", "--arch", "abc"], "(90 for an H100/H200), got abc")):
        out = subprocess.run([sys.executable, str(script), *args], capture_output=True,
                             text=True, env={**os.environ, "PYTHONPATH": path})
        assert out.returncode == 2 and message in out.stderr, (args, out.stderr)
    for args, message in (([], "the following arguments are required: command"),
                          (["benchmark"], "invalid choice: 'benchmark'"),
                          (["cache"], "required: action"),
                          (["generate", "--problem", "71", "--arch", "0"], "an SM number")):
        out = subprocess.run([sys.executable, "-m", "cutlass_convt", *args], capture_output=True,
                             text=True, env={**os.environ, "PYTHONPATH": path})
        assert out.returncode == 2 and "usage: python -m cutlass_convt" in out.stderr, args
        assert message in out.stderr, (args, out.stderr)


@pytest.mark.nvcc
def test_generate_refuses_sm_numbers_that_nvcc_does_not_compile_for():
    root = Path(__file__).parents[1]
    path = os.pathsep.join(filter(None, (str(root), os.environ.get("PYTHONPATH"))))
    assert 90 in env.nvcc_archs() and 81 not in env.nvcc_archs()
    out = subprocess.run([sys.executable, str(root / "scripts" / "generate.py"), "--problem", "71",
                          "--arch", "81"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": path})
    assert out.returncode == 2, out.stderr
    assert "does not compile for sm_81; it takes 80," in out.stderr, out.stderr


@pytest.mark.nvcc
def test_generate_killed_by_sigterm_kills_nvcc(tmp_path):
    """SIGTERM to generate.py (to its pid only): exit status 143, its nvcc processes and the
    programs they run killed, nothing left in the cache but the lock folder."""
    root = Path(__file__).parents[1]
    path = os.pathsep.join(filter(None, (str(root), os.environ.get("PYTHONPATH"))))
    cache = tmp_path / "cache"
    proc = subprocess.Popen([sys.executable, str(root / "scripts" / "generate.py"), "--problem",
                             "71", "--precision", "tf32", "--layout", "nchw"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": path,
                                 env.CACHE_DIR_VARIABLE: str(cache),
                                 env.NVCC_VARIABLE: str(sleeping_nvcc(tmp_path))})
    pids = wait_for_pids(tmp_path, 1)
    proc.terminate()
    assert proc.wait(timeout=30) == 143, proc.stderr.read()
    assert all_gone(pids)
    assert [p.name for p in cache.iterdir()] == [".locks"]


def _generate(monkeypatch, capsys, *argv) -> list[str]:
    """The names of the kernels ``cutlass-convt generate argv`` builds, run in this process
    with the builds stubbed out (cache hits), its signal handlers restored after."""
    monkeypatch.setattr(build, "build", lambda config, sources, progress: build.Artifact(
        Path("stub"), {}))
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        assert cli.main(["generate", *argv]) == 0
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    return [line.split(":")[0] for line in capsys.readouterr().out.splitlines()
            if line.endswith(": stub (cache hit)")]


@pytest.mark.parametrize("dtype, math", [("bfloat16", "bf16"), ("float16", "fp16")])
def test_generate_builds_16_bit_kernels(monkeypatch, capsys, tmp_path, dtype, math):
    """``generate --dtype`` builds the 16-bit kernels that calls of that dtype run: the phase
    family's (and the layout passes of its NCHW input) on a stride-2 layer with 16 output
    channels, the strip, fprop_sm90 and phase families' candidates on the strip family's
    32 -> 32 k3 class, in both layouts; none of float32's. Without it, float32's."""
    monkeypatch.setenv(env.CACHE_DIR_VARIABLE, str(tmp_path))
    phase = ["--shape", "8", "64", "16", "32", "32", "4", "4", "--stride", "2", "--padding", "1",
             "--layout", "nchw"]
    chosen = f"phase_{math}_nchw_t2x2_m4x4x8_n64_a2_b8_c1_sm90"
    assert _generate(monkeypatch, capsys, *phase, "--dtype", dtype) == [chosen, "layout_sm90"]
    candidates = _generate(monkeypatch, capsys, *phase, "--dtype", dtype, "--candidates")
    assert candidates[:2] == [chosen, "layout_sm90"] and len(candidates) == 10, candidates
    assert all(name.startswith(f"phase_{math}_nchw_t2x2_") for name in candidates[2:])
    strip = _generate(monkeypatch, capsys, "--shape", "8", "32", "32", "64", "64", "3", "3",
                      "--padding", "1", "--dtype", dtype, "--candidates")
    kernels = [name for name in strip if name != "layout_sm90"]
    assert all(f"_{math}_" in name for name in kernels), strip
    assert {name.split(f"_{math}_")[0] for name in kernels} == {"strip", "fprop_sm90", "phase"}
    for layout in ("nchw", "nhwc"):
        assert f"strip_{math}_{layout}_c32x32_k3x3_n128_r6_o1_p0_rs_sm90" in strip, strip
    # float32 (3xTF32 in either precision at 16 output channels: phase.kernel_precision)
    assert _generate(monkeypatch, capsys, *phase) == [
        "phase_fp32_nchw_t2x2_m4x4x8_n64_a2_b8_c1_sm90", "layout_sm90"]


def test_generate_refuses_other_dtypes(capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(["generate", "--problem", "71", "--dtype", "float64"])
    assert exit.value.code == 2
    assert "--dtype: invalid choice: 'float64'" in capsys.readouterr().err


def test_generate_reports_a_bad_variable_in_one_line(capsys, monkeypatch):
    """A relative cache folder or an unknown measuring mode: ``generate`` prints the variable's
    message and exits 1, no traceback."""
    for variable, value in ((env.CACHE_DIR_VARIABLE, "relative/cache"),
                            (env.MEASURE_VARIABLE, "sometimes")):
        with monkeypatch.context() as m:
            m.setenv(variable, value)
            assert cli.main(["generate", "--problem", "71"]) == 1
            err = capsys.readouterr().err
            assert err.startswith("cutlass-convt generate: ") and variable in err, err
            assert "Traceback" not in err


def _commands(parser, path=()) -> list[tuple[str, ...]]:
    """Every command line of ``parser``: its own and each subcommand's, depth first."""
    found = [path]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _commands(sub, (*path, name))
    return found


def _parsers(parser, path=()) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """``parser`` and each subcommand's parser, with their command lines, depth first."""
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _parsers(sub, (*path, name))
    return found


def test_every_argument_has_a_help_text():
    """Every option and positional argument of every ``cutlass-convt`` command says what it
    takes in ``--help`` (``cache export``'s and ``cache import``'s FILE had none)."""
    for command, parser in _parsers(cli.parser()):
        for action in parser._actions:
            if not isinstance(action, argparse._SubParsersAction):
                assert action.help, (command, action.dest)


def test_help_texts_have_no_docstring_markup(capsys):
    """``--help`` of ``cutlass-convt``, of each of its commands and of every script prints
    plain text: no reStructuredText markup from the docstrings it shows."""
    commands = _commands(cli.parser())
    assert {("generate",), ("tune",), ("bench",), ("cache", "list")} <= set(commands)
    for command in commands:
        with pytest.raises(SystemExit) as exit:
            cli.main([*command, "--help"])
        text = capsys.readouterr().out
        assert exit.value.code == 0 and "usage:" in text, command
        assert "``" not in text and ":func:`" not in text, (command, text)
    scripts = sorted((ROOT / "scripts").glob("*.py"))
    runs = [subprocess.Popen([sys.executable, str(script), "--help"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=_checkout_env())
            for script in scripts]
    for script, run in zip(scripts, runs):
        text = run.communicate(timeout=120)[0]
        assert run.returncode == 0 and "usage:" in text, (script.name, text)
        assert "``" not in text and ":func:`" not in text, (script.name, text)


def test_scripts_refuse_unknown_problems():
    """``generate.py``, ``run_kernelbench.py`` and ``bench.py`` name the known ids for an unknown
    ``--problem``, with a usage error (exit status 2, the script named in it) before any build
    or GPU check."""
    root = Path(__file__).parents[1]
    path = os.pathsep.join(filter(None, (str(root), os.environ.get("PYTHONPATH"))))
    for script, names in (("generate.py", ["99"]), ("run_kernelbench.py", ["99"]),
                          ("bench.py", ["71", "99"])):
        out = subprocess.run([sys.executable, str(root / "scripts" / script), "--problem", *names],
                             capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path})
        assert out.returncode == 2, (script, out.stderr)
        assert "unknown problem '99'; known: kernelbench-l1-57" in out.stderr, (script, out.stderr)
        assert f"{script}: error:" in out.stderr, (script, out.stderr)
    # trial counts below 1 and a --json path without its folder: usage errors before the run
    for script, args, message in (
            ("bench.py", ["--trials", "0"], "trials must be a positive int, got '0'"),
            ("run_kernelbench.py", ["--trials", "-5"], "trials must be a positive int"),
            ("run_kernelbench.py", ["--json", str(root / "no-such-folder" / "x.json")],
             "--json: no folder")):
        out = subprocess.run([sys.executable, str(root / "scripts" / script), *args],
                             capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path})
        assert out.returncode == 2 and message in out.stderr, (script, args, out.stderr)


def test_run_kernelbench_lists_its_problems():
    """``run_kernelbench.py --list`` prints every case, one line each with its input shape and
    module, without a GPU; ``--help`` says what ``--problem`` takes."""
    script = [sys.executable, str(ROOT / "scripts" / "run_kernelbench.py")]
    out = subprocess.run([*script, "--list"], capture_output=True, text=True, env=_checkout_env())
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(problems.cases())
    assert ("kernelbench-l1-71              input 8 x 32 x 512 x 1024, ConvTranspose2d(32, 32, "
            "(3, 3), stride=(1, 1), padding=(0, 0), output_padding=(0, 0), groups=1, "
            "bias=False, dilation=(1, 1))") in lines
    text = " ".join(subprocess.run([*script, "--help"], capture_output=True, text=True,
                                   env=_checkout_env()).stdout.split())
    assert "--problem PROBLEM a case id (--list names them) or KernelBench level-1" in text
    assert "--list print every case's id, input shape and module, and exit" in text


def test_cases_resolve_by_number():
    assert problems.find("71") == problems.find("kernelbench-l1-71")
    assert problems.find("kernelbench-71") == problems.find("71")
    assert problems.find("upsample-k4s2").id == "upsample-k4s2"
    # other levels, prefixes and suffixes name no case (level 2's problem 71 is another one)
    for name in ("kernelbench-999", "kernelbench-l2-71", "l2-71", "foo-71", "k4s2", "l1-71"):
        with pytest.raises(KeyError, match="known"):
            problems.find(name)


@settings(max_examples=150, deadline=None)
@given(h=st.integers(1, 7), w=st.integers(1, 7),
       kernel=st.tuples(st.integers(1, 6), st.integers(1, 6)),
       stride=st.tuples(st.integers(1, 4), st.integers(1, 4)), channels_last=st.booleans(),
       bias=st.booleans(), data=st.data())
def test_phase_decomposition_matches_torch(h, w, kernel, stride, channels_last, bias, data):
    """The stride > 1 measurement route (``benchmark.phase_decomposition``, stride-1 pieces
    interleaved) gives PyTorch's strided transposed convolution: values and memory format."""
    padding = tuple(data.draw(st.integers(0, k - 1)) for k in kernel)
    output_padding = tuple(data.draw(st.integers(0, s - 1)) for s in stride)
    x = torch.randn(2, 3, h, w, dtype=torch.float64)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    wt = torch.randn(3, 4, *kernel, dtype=torch.float64)
    b = torch.randn(4, dtype=torch.float64) if bias else None
    try:
        ref = F.conv_transpose2d(x, wt, b, stride, padding, output_padding)
    except RuntimeError:  # output smaller than 1
        assume(False)
    out = phase_decomposition(x, wt, b, stride, padding, output_padding, conv=F.conv_transpose2d)
    assert out.shape == ref.shape and out.stride() == ref.stride()
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)


@pytest.mark.gpu
def test_interleaved_timing_measures_each_route():
    """``benchmark.cuda_times_ms``: every trial calls each function once, in orders that vary,
    and each function's median is its own work (GPU sleeps of 1 and 3 units)."""
    from cutlass_convt.benchmark import cuda_times_ms

    unit = 200_000  # clock cycles: about 0.1 ms
    calls = []
    def work(name, units):
        calls.append(name)
        torch.cuda._sleep(units * unit)

    fns = {name: functools.partial(work, name, units)
           for name, units in (("short", 1), ("long", 3), ("none", 0))}
    times = cuda_times_ms(fns, warmup=2, trials=20)
    assert set(times) == set(fns) and all(t["trials"] == 20 for t in times.values())
    trials = [calls[i:i + 3] for i in range(6, len(calls), 3)]
    assert len(trials) == 20 and all(sorted(order) == sorted(fns) for order in trials)
    assert len({tuple(order) for order in trials}) > 1
    ratio = (times["long"]["median"] - times["none"]["median"]) / (
        times["short"]["median"] - times["none"]["median"])
    assert 2.7 < ratio < 3.3, times


def test_cli_info_reports_the_machine(capsys):
    assert cli.main(["info"]) == 0
    text = capsys.readouterr().out
    for expected in ("cutlass_convt ", "torch ", "cuda-bindings ", "CUTLASS (nvidia-cutlass) ",
                     "nvcc", "kernel cache: "):
        assert expected in text, text
    assert ("GPU 0:" in text) == torch.cuda.is_available()


@pytest.mark.nvcc
def test_cache_export_compresses_as_named_and_writes_whole_or_nothing(tmp_path, monkeypatch,
                                                                      capsys):
    """``cache export FILE`` compresses as FILE's suffix says (each archive imports back), an
    unknown suffix is a one-line error that writes nothing, and an export that fails midway
    leaves the archive already there as it was and no staging file."""
    source = tmp_path / "source"
    monkeypatch.setenv(env.CACHE_DIR_VARIABLE, str(source))
    monkeypatch.setattr(build, "_compile", compile_only_a_cubin)
    entry = build.build(TF32, TF32_SOURCES).path
    magic = {"a.tar.gz": b"\x1f\x8b", "a.TGZ": b"\x1f\x8b", "a.tar.xz": b"\xfd7zXZ",
             "a.tar.bz2": b"BZh", "a.tar": None}
    for name, start in magic.items():
        path = tmp_path / name
        assert cli.main(["cache", "export", str(path)]) == 0, capsys.readouterr().err
        data = path.read_bytes()
        assert data.startswith(start) if start else data[257:262] == b"ustar", name
        monkeypatch.setenv(env.CACHE_DIR_VARIABLE, str(tmp_path / f"into-{name}"))
        capsys.readouterr()
        assert cli.main(["cache", "import", str(path)]) == 0, capsys.readouterr().err
        assert build.read_entry(tmp_path / f"into-{name}" / entry.name) is not None, name
        monkeypatch.setenv(env.CACHE_DIR_VARIABLE, str(source))
    capsys.readouterr()
    for name in ("a.zip", "a.gz", ".tar.gz"):
        assert cli.main(["cache", "export", str(tmp_path / name)]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "name the archive .tar," in err, err
        assert not (tmp_path / name).exists()
    before = (tmp_path / "a.tar.gz").read_bytes()

    def fails(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tarfile.TarFile, "add", fails)
    assert cli.main(["cache", "export", str(tmp_path / "a.tar.gz")]) == 1
    assert "No space left on device" in capsys.readouterr().err
    assert (tmp_path / "a.tar.gz").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


@pytest.mark.nvcc
def test_cli_cache_list_clear_export_import(tmp_path, monkeypatch, capsys):
    """A cache with one entry (a stand-in cubin, manifest hashed), exported to a tarball,
    cleared, imported back (the entry valid again); importing it again, or an archive with a
    damaged entry, imports nothing: a line saying why, exit status 1."""
    source = tmp_path / "source"
    monkeypatch.setenv(env.CACHE_DIR_VARIABLE, str(source))
    monkeypatch.setattr(build, "_compile", compile_only_a_cubin)
    entry = build.build(TF32, TF32_SOURCES).path
    assert cli.main(["cache", "list"]) == 0 and f"{entry.name}" in capsys.readouterr().out
    archive = tmp_path / "cache.tar.gz"
    assert cli.main(["cache", "export", str(archive)]) == 0
    assert cli.main(["cache", "clear"]) == 0 and not entry.exists()
    capsys.readouterr()
    assert cli.main(["cache", "import", str(archive)]) == 0
    assert "imported 1 entry" in capsys.readouterr().out
    assert build.read_entry(entry) is not None
    assert cli.main(["cache", "import", str(archive)]) == 1  # present already: kept
    out, err = capsys.readouterr()
    assert "imported 0 entries" in out
    assert err == f"skipped {entry.name}: the cache has kernel {TF32.name} already " \
                  f"({entry.name}); an import never replaces or shadows a kernel\n"
    (entry / build.CUBIN).write_bytes(b"damaged")
    damaged = tmp_path / "damaged.tar.gz"
    cli.main(["cache", "export", str(damaged)])  # exports valid entries only: none
    other = tmp_path / "other"
    monkeypatch.setenv(env.CACHE_DIR_VARIABLE, str(other))
    with tarfile.open(damaged, "w:gz") as tar:
        tar.add(entry, arcname=entry.name)
    capsys.readouterr()
    assert cli.main(["cache", "import", str(damaged)]) == 1
    out, err = capsys.readouterr()
    assert "imported 0 entries" in out and not (other / entry.name).exists()
    assert err.startswith(f"skipped {entry.name}: not a whole entry") and err.count("\n") == 1


def test_cli_cache_clear_removes_only_the_cache_s_folders(tmp_path, monkeypatch, capsys):
    """``cache clear`` removes kernel entries (damaged ones too), staging folders and the
    locks; it keeps what else shares the folder, and the tuning records unless ``--tuning``."""
    monkeypatch.setenv(env.CACHE_DIR_VARIABLE, str(tmp_path))
    ours = ["dgrad_k3-0123456789abcdef", ".tmp-dgrad_k3-0123456789abcdef-89abcdef",
            ".tmp-import-strip-0123456789abcdef", ".locks"]
    kept = ["my-notes", "dgrad_k3-0123456789abcdeg", "no-manifest-0123456789abcdef", ".git"]
    for name in ours + kept + ["tuning"]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "file").write_text("x")
    for name in ("dgrad_k3-0123456789abcdef", "dgrad_k3-0123456789abcdeg"):
        (tmp_path / name / build.MANIFEST).write_text("{}")
    (tmp_path / "README.md").write_text("kept")
    assert cli.main(["cache", "clear"]) == 0
    assert capsys.readouterr().out == f"removed 1 entry from {tmp_path}\n"  # (one of ours)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept + ["tuning", "README.md"])
    assert cli.main(["cache", "clear", "--tuning"]) == 0
    assert capsys.readouterr().out == f"removed 0 entries and the tuning records from {tmp_path}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept + ["README.md"])


def _stress_module():
    import importlib.util

    path = Path(__file__).parents[1] / "scripts" / "stress.py"
    spec = importlib.util.spec_from_file_location("stress_script", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def test_stress_check_finds_wrong_outputs():
    """The stress run's check passes PyTorch's float64 result rounded to float32 and refuses
    one element off by far more than TF32 rounds (though the relative error of the whole
    stays within TF32's bound), a NaN, the wrong memory format and the wrong shape."""
    stress = _stress_module()
    c = stress.ProblemClass(8, 6, (3, 3), (2, 2), (1, 1), (1, 0), (1, 1), 2, True, False,
                            "tf32", "auto")
    x, w, b = torch.randn(2, 8, 20, 20), torch.randn(8, 3, 3, 3), torch.randn(6)
    args = (c.stride, c.padding, c.output_padding, c.groups, c.dilation)
    y = F.conv_transpose2d(x.double(), w.double(), b.double(), *args).float()
    assert stress.check(y, x, w, b, c) is None
    off = y.clone()
    off[1, 4, 3, 2] += 0.15
    assert "element" in stress.check(off, x, w, b, c)
    off[1, 4, 3, 2] = float("nan")
    assert "rel inf" in stress.check(off, x, w, b, c)
    assert "strides" in stress.check(y.contiguous(memory_format=torch.channels_last), x, w, b, c)
    assert "shape" in stress.check(y[:, :, 1:], x, w, b, c)
    assert "rel" in stress.check(y * 1.01, x, w, b, stress.replace(c, precision="fp32"))


def test_stress_and_soak_dry_runs_on_the_cpu(tmp_path):
    """The harness runs end to end on the CPU (PyTorch's route): every call checked, the
    report written, no growth of open files over the soak."""
    root = Path(__file__).parents[1]
    path = os.pathsep.join(filter(None, (str(root), os.environ.get("PYTHONPATH"))))
    for run, extra in (("stress", ["--processes", "2", "--calls", "15"]),
                       ("soak", ["--calls", "200", "--sizes", "2", "--samples", "5"])):
        report = tmp_path / f"{run}.json"
        out = subprocess.run([sys.executable, str(root / "scripts" / "stress.py"), run,
                              "--device", "cpu", "--classes", "6", "--cache",
                              str(tmp_path / run), "--json", str(report), *extra],
                             capture_output=True, text=True, env={**os.environ,
                                                                   "PYTHONPATH": path})
        assert out.returncode == 0, out.stdout + out.stderr
        result = json.loads(report.read_text())
        assert result["ok"] and result["errors"] == 0 and result["calls"] in (30, 200), result
