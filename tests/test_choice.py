"""The kernel choice: candidates, family order, tuning records, the PyTorch route, and the
choice's results on fixed, random and KernelBench problems (GPU)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import cutlass_convt
from cutlass_convt import autotune, choose, env, measure, ops, problems
from cutlass_convt.benchmark import bound_failure, errors
from cutlass_convt.families import dgrad as dgrad_family
from cutlass_convt.families import direct as direct_family
from cutlass_convt.families import fprop_sm90 as fprop_family
from cutlass_convt.families import phase as phase_family
from cutlass_convt.families import strip as strip_family
from cutlass_convt.spec import PRECISIONS, SHARED_MEMORY_LIMIT, ProblemSpec, UnsupportedProblem

from helpers import (
    MACHINE,
    check,
    fresh_generator,
    poison_allocator,
    problem71,
    random_shapes,
    run_shape,
    spec_of,
)


def test_tuning_candidates_and_records(tmp_path, monkeypatch):


    monkeypatch.setenv("CUTLASS_CONVT_CACHE_DIR", str(tmp_path))
    spec = problems.find("kernelbench-71").spec("tf32", 90)
    found = choose.candidates(spec)
    strip = [c for c in found if isinstance(c, strip_family.StripConfig)]
    direct = [c for c in found if isinstance(c, direct_family.DirectConfig)]
    sm90 = [c for c in found if isinstance(c, fprop_family.FpropSm90Config)]
    dgrad = [c for c in found if isinstance(c, dgrad_family.DgradConfig)]
    phase = [c for c in found if isinstance(c, phase_family.PhaseConfig)]
    assert found == strip + direct + sm90 + phase + dgrad and len(found) == len(set(found))
    assert phase == phase_family.phase_configs(spec) and phase
    assert strip == strip_family.strip_configs(spec)
    assert sm90 == fprop_family.fprop_sm90_configs(spec) and all(c.tile[1] == 32 for c in sm90)
    assert {c.math for c in direct} == {"wgmma", "mma_sync"}
    assert choose.candidates(dataclasses.replace(spec, precision="fp32"), ("fprop_sm90",)) == []
    assert direct[0] == direct_family.direct_config(spec) and len(direct) > 1
    assert dgrad[0] == dgrad_family.default_dgrad_config(spec) and len(dgrad) > 4
    assert choose.candidates(spec, ("dgrad",)) == dgrad
    assert any(c.threadblock_shape[1] == 32 for c in dgrad)
    for c in dgrad:
        m, n, k = c.threadblock_shape
        assert c.stages * (m * k + k * n) * 4 <= SHARED_MEMORY_LIMIT
    assert all(c.shared_bytes <= SHARED_MEMORY_LIMIT for c in direct)
    # no record yet: the first family's default
    assert choose.choose_config(spec) == strip[0]
    assert choose.choose_config(spec, ("direct", "dgrad")) == direct_family.direct_config(spec)
    assert choose.choose_config(spec, ("dgrad",)) == dgrad_family.default_dgrad_config(spec)
    path = choose.record_path(spec, MACHINE)
    path.parent.mkdir(parents=True)
    winner = dgrad[3]
    path.write_text(json.dumps({"winner_family": "dgrad", "winner": dataclasses.asdict(winner)}))
    assert choose.choose_config(spec, machine=MACHINE) == winner
    # the record's family not allowed
    assert (choose.choose_config(spec, ("direct",), machine=MACHINE)
            == direct_family.direct_config(spec))
    # the memory format changes the direct family's kernel: records are per layout
    for other in ({"channels_last": True}, {"batch": 4}):
        assert choose.record_path(ProblemSpec(**{**spec.__dict__, **other}), MACHINE) != path
    path.write_text("{damaged")
    assert choose.choose_config(spec, machine=MACHINE) == strip[0]
    for malformed in ({"winner_family": "dgrad", "winner": None}, {"winner_family": "dgrad",
                      "winner": [1, 2]}, {"winner_family": "nope", "winner": {}}, [], 5):
        path.write_text(json.dumps(malformed))
        cutlass_convt.clear_caches()  # records are cached by modification time
        assert choose.choose_config(spec, machine=MACHINE) == strip[0], malformed
    record = {"winner_family": "fprop_sm90", "winner": dataclasses.asdict(sm90[1])}
    path.write_text(json.dumps(record))
    assert choose.choose_config(spec, machine=MACHINE) == sm90[1]


def test_sizes_beyond_32_bit_ints_take_the_pytorch_route():
    """Every kernel takes sizes and arguments as C ints: a stride of 2**32 would reach CUTLASS's
    host code as 0 (a division by zero that killed the process). Such problems are refused by
    every family, so "auto" runs PyTorch's own and "cutlass" raises, before any build."""
    from cutlass_convt import ops

    for kwargs in (dict(stride=(2**32, 1)), dict(stride=(2**31, 2)), dict(dilation=(1, 2**32)),
                   dict(padding=(2**31, 0), stride=(2**32, 1))):
        spec = problem71(in_size=(2, 8), kernel_size=(3, 1), **kwargs)
        assert min(spec.out_size) >= 1
        for family in choose.FAMILIES:
            assert "32-bit ints" in family.unsupported_reasons(spec)[0], (kwargs, family.name)
        with pytest.warns(RuntimeWarning, match="32-bit ints"):
            assert isinstance(ops.route(spec, "auto"), ops.TorchRoute)
        with pytest.raises(cutlass_convt.UnsupportedProblem, match="32-bit ints"):
            ops.route(spec, "cutlass")
    assert problem71(stride=(2**31 - 1, 1), in_size=(1, 8)).int32_reasons() == []


def test_tuning_records_that_do_not_fit_the_problem_are_ignored(tmp_path, monkeypatch):
    """A record (edited, or from another version) whose winner is not one of its family's
    candidates for the problem, or whose family cannot compute it, gives the default."""


    monkeypatch.setenv("CUTLASS_CONVT_CACHE_DIR", str(tmp_path))
    spec = problems.find("kernelbench-71").spec("tf32", 90)
    strided = dataclasses.replace(spec, stride=(2, 2))
    direct, dgrad = direct_family.direct_config(spec), dgrad_family.default_dgrad_config(spec)
    for problem, winner in ((strided, direct),
                            (spec, dataclasses.replace(direct, tile=(4, 40))),
                            (spec, dataclasses.replace(dgrad, stages=9))):
        default = choose.choose_config(problem)
        path = choose.record_path(problem, MACHINE)
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"winner_family": choose.family_of(winner).name,
                  "winner": dataclasses.asdict(winner)}
        path.write_text(json.dumps(record))
        assert choose.choose_config(problem, machine=MACHINE) == default != winner, winner
        path.unlink()


def test_gpus_before_sm80_take_the_pytorch_route():
    for family in ("strip", "direct", "fprop_sm90", "dgrad"):

        reasons = choose.family(family).unsupported_reasons(problem71(arch=75))
        assert reasons and ("sm_80" in reasons[0] or "sm_90" in reasons[0]), (family, reasons)


SHAPES = [
    # N, C_in, C_out, H, W, (R, S), stride, padding, dilation, output_padding, groups, bias
    (2, 32, 32, 37, 53, (3, 3), 1, 0, 1, 0, 1, False),
    (3, 16, 8, 20, 17, (1, 1), 1, 0, 1, 0, 1, True),
    (1, 8, 24, 9, 31, (7, 7), 1, 3, 1, 0, 1, True),
    (2, 12, 20, 15, 11, (5, 3), 1, (2, 1), 1, 0, 1, False),
    (2, 6, 10, 13, 14, (3, 3), 1, 1, 2, 1, 1, True),          # alignment 2, op < dilation
    (1, 3, 5, 19, 23, (3, 5), 1, 0, (2, 1), (1, 0), 1, True),  # alignment 1
    (5, 64, 32, 7, 9, (2, 2), 1, 0, 1, 0, 1, True),
    (2, 32, 16, 12, 10, (4, 4), 2, 1, 1, 0, 1, True),         # DCGAN-style 2x upsampling
    (2, 16, 16, 9, 11, (3, 3), 2, 1, 1, 1, 1, False),         # output_padding < stride
    (1, 8, 12, 7, 6, (3, 5), (3, 2), (1, 2), 1, (2, 1), 1, True),
    (2, 8, 8, 6, 7, (2, 2), 5, 0, 1, 0, 1, True),             # stride > kernel: untouched pixels
    (2, 32, 48, 11, 13, (3, 3), 1, 1, 1, 0, 4, True),         # groups
    (2, 32, 32, 11, 13, (3, 3), 2, 1, 1, 1, 32, True),        # depthwise, strided
    (1, 24, 24, 8, 9, (5, 5), 1, 2, 1, 0, 24, False),         # depthwise
    (1, 256, 32, 9, 20, (1, 1), 1, 0, 1, 0, 1, False),        # wide input: fp32 not direct
]


# Every family on every fixed shape and precision it can compute (the choice may prefer another).
FAMILY_SHAPES = [(family, shape, precision) for shape in SHAPES for precision in PRECISIONS
                 for family in choose.NAMES
                 if not choose.family(family).unsupported_reasons(spec_of(shape, precision))]


@pytest.mark.gpu
@pytest.mark.parametrize("family, shape, precision", FAMILY_SHAPES,
                         ids=lambda v: v if isinstance(v, str) else "x".join(map(str, v[:5])))
def test_shapes_on_each_family(family, shape, precision):
    run_shape(shape, precision, backend=family)


@pytest.mark.gpu
def test_every_fixed_shape_has_a_family():
    assert {(shape, precision) for _, shape, precision in FAMILY_SHAPES} == {
        (shape, precision) for shape in SHAPES for precision in PRECISIONS}


SWEEP = random_shapes(24)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["tf32", "fp32"])
@pytest.mark.parametrize("shape", SWEEP, ids=lambda s: "x".join(map(str, s[:5])))
def test_random_sweep(shape, precision):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the PyTorch route, tested below
        run_shape(shape, precision)


_KB_CACHE: dict = {}


def _kernelbench_case(case_id):
    """Input, module and float64 reference of a KernelBench case, kept for the next test."""
    if case_id not in _KB_CACHE:
        _KB_CACHE.clear()
        torch.cuda.empty_cache()
        case = problems.find(case_id)
        gen, seed = fresh_generator()
        torch.manual_seed(seed)
        module = torch.nn.ConvTranspose2d(**case.module_kwargs()).cuda()
        x = case.make_input(generator=gen)
        with torch.no_grad():
            ref = F.conv_transpose2d(x.double(), module.weight.double(), None, case.stride,
                                     case.padding, case.output_padding, case.groups, case.dilation)
            torch_tf32 = errors(module(x), ref)["max_abs"]  # eager, TF32 on by default
        _KB_CACHE[case_id] = (case, module, x, ref, torch_tf32, seed)
    return _KB_CACHE[case_id]


@pytest.mark.gpu
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("precision", ["tf32", "fp32"])
@pytest.mark.parametrize("case_id", [*problems.cases("kernelbench"), *problems.cases("upsampling")])
def test_kernelbench_cases(case_id, precision, channels_last, monkeypatch):
    cutlass_convt.clear_caches()  # the PyTorch route warns once per reason and process
    case, module, x, ref, torch_tf32, seed = _kernelbench_case(case_id)
    ours = cutlass_convt.ConvTranspose2d(**case.module_kwargs(), precision=precision).cuda()
    ours.load_state_dict(module.state_dict())
    inp = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    spec = case.spec(precision, 90, channels_last)
    poison_allocator(2 * 4 * (x.numel() + ref.numel()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            out = ours(inp)
    routed = [w for w in caught if "instead of a CUTLASS kernel" in str(w.message)]
    refused = all(family.unsupported_reasons(spec) for family in choose.FAMILIES)
    assert bool(routed) == refused, [str(w.message) for w in caught]
    assert out.is_contiguous(memory_format=torch.channels_last if channels_last
                             else torch.contiguous_format)
    err = errors(out, ref)
    failure = bound_failure(err, precision, torch_tf32)
    where = f"{case_id} seed={seed} {precision} channels_last={channels_last}"
    assert failure is None, f"{where}: {failure}"


@pytest.mark.gpu
def test_backend_choice_for_what_cutlass_cannot_run():
    """Stride 5 with dilation 2 (KernelBench 81's class) and 6 input channels: refused by
    CUTLASS's strided dgrad (dilation) and by the phase family (channels not a multiple of
    4)."""
    x = torch.randn(2, 6, 6, 7, device="cuda")
    w = torch.randn(6, 4, 3, 3, device="cuda")
    kwargs = dict(stride=5, dilation=2, padding=1, precision="fp32")
    with pytest.raises(NotImplementedError, match="dilation"):
        cutlass_convt.conv_transpose2d(x, w, backend="cutlass", **kwargs)
    with pytest.warns(RuntimeWarning, match="dilation"):
        auto = cutlass_convt.conv_transpose2d(x, w, backend="auto", stride=5, dilation=2,
                                              padding=1, output_padding=1, precision="fp32")
    check(auto, x, w, None, "fp32", 0, stride=5, dilation=2, padding=1, output_padding=1)
    via_torch = cutlass_convt.conv_transpose2d(x, w, backend="torch", **kwargs)
    check(via_torch, x, w, None, "fp32", 0, stride=5, dilation=2, padding=1)


@pytest.mark.gpu
def test_tune_writes_a_record_that_the_next_call_uses(tmp_path, monkeypatch):
    """Tuning times the candidates on the real sizes and persists the fastest; the next call
    (in this process, without clearing anything by hand: writing a record clears the caches)
    runs it and gives values within the bounds."""
    spec = ProblemSpec(batch=2, in_channels=32, out_channels=32, in_size=(40, 60),
                       kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), output_padding=(0, 0),
                       dilation=(1, 1), groups=1, bias=True, channels_last=False,
                       precision="fp32", arch=90)
    cache = tmp_path / "cache"
    shutil.copytree(env.cache_dir(), cache,  # (staging folders: other workers' builds)
                    ignore=shutil.ignore_patterns("tuning", ".locks", ".tmp-*"))
    monkeypatch.setenv("CUTLASS_CONVT_CACHE_DIR", str(cache))
    monkeypatch.setenv(env.MEASURE_VARIABLE, "on")  # records are read (the first call measures)
    cutlass_convt.clear_caches()
    gen, seed = fresh_generator()
    x = torch.randn(2, 32, 40, 60, device="cuda", generator=gen)
    w = torch.randn(32, 32, 3, 3, device="cuda", generator=gen)
    b = torch.randn(32, device="cuda", generator=gen)
    cutlass_convt.conv_transpose2d(x, w, b, padding=1, precision="fp32")  # the default, cached
    default = ops.route(spec, "auto").config.name
    record = autotune.tune(spec, trials=5)
    timed = [r for r in record["results"] if "median_ms" in r]
    assert len(timed) == len(choose.candidates(spec)) + 1  # and PyTorch's route
    assert timed[-1]["family"] == "torch"
    assert record["winner_name"] == min(timed, key=lambda r: r["median_ms"])["config"]
    assert choose.choose_config(spec, machine=measure.machine(0)).name == record["winner_name"]
    out = cutlass_convt.conv_transpose2d(x, w, b, padding=1, precision="fp32")
    check(out, x, w, b, "fp32", seed, padding=1)
    assert ops.route(spec, "auto").config.name == record["winner_name"], default
    cutlass_convt.clear_caches()


def test_pytorch_is_a_candidate_of_the_default_choice(tmp_path, monkeypatch):
    """Where the chosen family measured slower than PyTorch on the problem's class (the phase
    family's TF32 rules, the SM90 fprop family, 4 output channels or fewer on the dgrad
    family), the default choice takes PyTorch's route, silently; 'cutlass' and forced families
    do not; a tuning record naming PyTorch is followed, and one naming a family overrides the
    rule."""
    monkeypatch.setenv("CUTLASS_CONVT_CACHE_DIR", str(tmp_path))
    cutlass_convt.clear_caches()
    nchw = problem71(stride=(2, 2), padding=(1, 1), kernel_size=(4, 4))  # phase: faster there
    strided = dataclasses.replace(nchw, channels_last=True)  # k4 s2 NHWC 32 -> 32: cuDNN's
    for spec, torch_first in ((strided, True), (dataclasses.replace(strided, precision="fp32"),
                                                False), (nchw, False),
                              (problem71(out_channels=3), True), (problem71(), False),
                              (problems.find("kernelbench-57").spec("tf32", 90), True),
                              (problems.find("kernelbench-78").spec("tf32", 90), False)):
        chosen = choose.choose_config(spec, choose.NAMES, torch_ok=True)
        assert (chosen is choose.TORCH) == torch_first, spec
        assert choose.choose_config(spec) is not choose.TORCH
    assert isinstance(choose.choose_config(nchw, choose.NAMES, True), phase_family.PhaseConfig)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a speed choice: no warning
        route = ops.route(strided, "auto", device=0)
    assert isinstance(route, ops.TorchRoute) and route.reason == ""
    machine = MACHINE
    path = choose.record_path(strided, machine)
    path.parent.mkdir(parents=True, exist_ok=True)
    dgrad = dgrad_family.default_dgrad_config(strided)
    path.write_text(json.dumps({"winner_family": "dgrad", "winner": dataclasses.asdict(dgrad)}))
    cutlass_convt.clear_caches()
    assert choose.choose_config(strided, choose.NAMES, torch_ok=True, machine=machine) == dgrad
    spec = problem71()
    path = choose.record_path(spec, machine)
    path.write_text(json.dumps({"winner_family": "torch", "winner": {}}))
    cutlass_convt.clear_caches()
    assert choose.choose_config(spec, choose.NAMES, torch_ok=True, machine=machine) is choose.TORCH
    assert choose.choose_config(spec, machine=machine) == choose.family("strip").candidates(spec)[0]


def test_phase_leaves_layers_under_a_wave_of_tiles_to_pytorch_in_tf32(tmp_path, monkeypatch):
    """Fewer than WAVE_TILES tiles (DCGAN's 512 -> 256 k4 s2 on 1 x 4 x 4, a batch-1 keypoint
    head): the default takes PyTorch's route in TF32, either layout; not in fp32, nor on a
    benchmark row of the same layer at its batch, nor with 'cutlass'."""
    monkeypatch.setenv("CUTLASS_CONVT_CACHE_DIR", str(tmp_path))  # no tuning records
    cutlass_convt.clear_caches()
    def spec(batch, size, precision="tf32", channels_last=False, c_in=512, c_out=256):
        return ProblemSpec(batch, c_in, c_out, (size, size), (4, 4), (2, 2), (1, 1), (0, 0),
                           (1, 1), 1, True, channels_last, precision, 90)
    for small in (spec(1, 4), spec(1, 4, channels_last=True), spec(1, 14, c_out=17)):
        config = phase_family.phase_configs(small)[0]
        assert phase_family.tile_count(small, config) < phase_family.WAVE_TILES
        assert choose.choose_config(small, choose.NAMES, torch_ok=True) is choose.TORCH
        assert isinstance(choose.choose_config(small), phase_family.PhaseConfig)
    assert isinstance(choose.choose_config(spec(1, 4, "fp32"), choose.NAMES, torch_ok=True),
                      phase_family.PhaseConfig)
    row = problems.find("centernet-deconv").spec("tf32", 90)
    config = phase_family.phase_configs(row)[0]
    assert phase_family.tile_count(row, config) >= phase_family.WAVE_TILES
    assert isinstance(choose.choose_config(row, choose.NAMES, torch_ok=True),
                      phase_family.PhaseConfig)


@st.composite
def valid_problems(draw) -> ProblemSpec:
    """Any problem PyTorch's conv_transpose2d accepts (its argument rules; output >= 1): 1 to
    1100 channels, groups (depthwise too), kernels up to 40, strides up to 6, dilation,
    padding, output_padding (a third each: any, kernel_size == stride with padding 0,
    kernel_size == 2 stride); float32 in TF32 or fp32, float16, bfloat16 (and float64, which
    no family takes); either layout; sm_80, sm_86, sm_90 or sm_100."""
    groups = draw(st.sampled_from([1, 1, 1, 2, 3, 4, 8, 32]))
    depthwise = draw(st.booleans()) and groups > 1
    c_in = groups * (1 if depthwise else draw(st.integers(1, 1100 // groups)))
    c_out = groups * (1 if depthwise else draw(st.integers(1, 1100 // groups)))
    kernel = (draw(st.sampled_from([1, 2, 3, 4, 5, 7, 8, 16, 33, 40])),
              draw(st.sampled_from([1, 2, 3, 4, 5, 7, 8, 16, 33, 40])))
    stride = (draw(st.integers(1, 6)), draw(st.integers(1, 6)))
    dilation = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    padding = (draw(st.integers(0, 8)), draw(st.integers(0, 8)))
    output_padding = tuple(draw(st.integers(0, max(s, d) - 1))
                           for s, d in zip(stride, dilation))
    form = draw(st.sampled_from(["any", "kernel_size == stride", "kernel_size == 2 stride"]))
    if form != "any":  # the upsampling classes, rare among arbitrary arguments
        kernel = tuple((1 if form == "kernel_size == stride" else 2) * s for s in stride)
        dilation = (1, 1)
        if form == "kernel_size == stride":
            padding, output_padding = (0, 0), (0, 0)
    in_size = (draw(st.integers(1, 96)), draw(st.integers(1, 96)))
    precision, dtype = draw(st.sampled_from([("tf32", "float32"), ("fp32", "float32"),
                                             ("tf32", "float16"), ("tf32", "bfloat16"),
                                             ("tf32", "float64")]))
    spec = ProblemSpec(draw(st.integers(1, 64)), c_in, c_out, in_size, kernel, stride,
                       padding, output_padding, dilation, groups, draw(st.booleans()),
                       draw(st.booleans()), precision, draw(st.sampled_from([80, 86, 90, 100])),
                       dtype)
    assume(min(spec.out_size) >= 1)
    return spec


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=valid_problems())
def test_the_choice_never_raises_for_a_valid_problem(spec):
    """For any valid problem, the choice among all families, among each family alone and with
    or without PyTorch's route returns a configuration with no reason against it, PyTorch's
    route, or raises UnsupportedProblem; every family that takes the problem yields
    candidates, each with no reason against it, and answers whether it is demoted or
    prefers PyTorch. (Before, kernel_size == stride with s_w x C_out not a multiple of 32,
    e.g. ConvTranspose2d(32, 12, 2, 2), raised ValueError from the fprop_sm90 family's
    routing rule in every choice.)"""
    for f in choose.FAMILIES:
        if f.unsupported_reasons(spec):
            continue
        found = f.candidates(spec)
        assert found, (f.name, spec)
        for config in found:
            assert f.config_reasons(spec, config) == [], (f.name, config, spec)
        assert isinstance(f.demoted(spec), bool) and isinstance(f.torch_preferred(spec), bool)
    for names in (choose.NAMES, *((name,) for name in choose.NAMES)):
        for torch_ok in (False, True):
            try:
                chosen = choose.choose(spec, names, torch_ok)
            except UnsupportedProblem:
                assert all(choose.family(n).unsupported_reasons(spec) for n in names), spec
                continue
            if chosen is choose.TORCH:
                assert torch_ok
            else:
                owner = choose.family_of(chosen)
                assert owner.name in names and owner.config_reasons(spec, chosen) == []
