"""CPU tests: output sizes, argument validation and the module's PyTorch compatibility."""

from __future__ import annotations

import contextlib
import dataclasses
import threading

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings, strategies as st

import cutlass_convt
from cutlass_convt import choose, cuda, env, ops, problems
from cutlass_convt.families import strip as strip_family
from cutlass_convt.benchmark import phase_decomposition
from cutlass_convt.args import problem_spec

import test_gpu  # the GPU tests' shape lists, checked here without a GPU
from cutlass_convt.families import direct as direct_family
from cutlass_convt.families import fprop_sm90 as fprop_family
from cutlass_convt.families import dgrad as dgrad_family
from cutlass_convt.spec import (PRECISIONS, SHARED_MEMORY_LIMIT, ProblemSpec,
                                conv_transpose_output_size)

pairs = st.tuples(st.integers(1, 3), st.integers(1, 3))



def test_strip_family_limits():
    """The strip family takes problem 71 in both layouts in TF32 on sm_90 and is then the
    kernel choice's first family; its configurations fit in shared memory up to S = 6, and
    every other case names its cause."""

    for channels_last, layout in [(True, "nhwc"), (False, "nchw")]:
        spec = _spec(channels_last=channels_last)
        assert strip_family.FAMILY.unsupported_reasons(spec) == []
        configs = strip_family.strip_configs(spec)
        # channels_last N = 104, NCHW N = 112, without a preparing warpgroup and with 16 (NCHW
        # 18) steps' A fragments in registers; the same tile with a preparing warpgroup (and
        # none) second
        tile_n, register_a = (104, 16) if channels_last else (112, 18)
        assert configs[:2] == [strip_family.StripConfig((3, 3), channels_last, tile_n, register_a=register_a),
                               strip_family.StripConfig((3, 3), channels_last, tile_n, prep_groups=1)]
        assert all(c.register_a == 0 and c.prep_groups == channels_last
                   for c in configs[2:] if c.mma == "ss")
        assert (configs[0].threads, configs[1].threads) == (384, 512)
        # NCHW: ring rows of 120 pixels, stage lines of a TMA store's body, 104 floats
        assert configs[0].shared_bytes == (221376 if channels_last else 229568)
        assert all(c.shared_bytes <= SHARED_MEMORY_LIMIT for c in configs)
        assert configs[0].name == (f"strip_tf32_{layout}_c32x32_k3x3_n{tile_n}_r8_o2_p0"
                                   f"_a{register_a}_sm90")
        assert configs[1].name == f"strip_tf32_{layout}_c32x32_k3x3_n{tile_n}_r8_o2_p1_sm90"
        assert (f"constexpr int kRegisterA = {register_a};"
                in strip_family.config_h(configs[0]))
        assert choose.candidates(spec)[:len(configs)] == configs
        prep = 1 if channels_last else 0
        assert strip_family.StripConfig((3, 3), channels_last, 104, 10, 1, prep) in configs  # a row per store
        wide = _spec(channels_last=channels_last, kernel_size=(3, 6))
        assert [c.tile_n for c in strip_family.strip_configs(wide)] == [64]
    # NCHW strips of the ss form are a TMA store body apart (whole sectors, 8 or 24 mod 32
    # floats wide: tile_n - 8, or tile_n - 16), all others tile_n
    assert [strip_family.StripConfig((3, 3), False, n).strip_step for n in (64, 96, 104, 112, 128)] == [
        56, 88, 88, 104, 120]
    assert strip_family.StripConfig((3, 3), True).strip_step == 104
    assert strip_family.StripConfig((3, 3), False, 128, 6, 1, mma="rs").strip_step == 128
    assert [strip_family.StripConfig((3, 3), False).strips(q) for q in (1, 104, 105, 192, 193, 1026)] == [
        1, 1, 2, 2, 3, 12]
    assert strip_family.StripConfig((3, 3), False, 112).strips(1026) == 10
    # NCHW rows: 3 more columns for 16-byte aligned TMA boxes, rounded up to 8
    assert strip_family.StripConfig((3, 1), False).pixels == 112 and strip_family.StripConfig((3, 1), True).pixels == 104
    for kwargs, word in [(dict(channels_last=False, in_size=(512, 1022)), "width % 4"),
                         (dict(channels_last=False, in_size=(511, 1024)), "P x Q % 4"),
                         (dict(precision="fp32", kernel_size=(3, 2)), "3 x 3 filters"),
                         (dict(precision="fp32", channels_last=False, kernel_size=(3, 4)),
                          "3 x 3 filters"),
                         (dict(arch=80), "sm_90"), (dict(stride=(2, 2)), "stride"),
                         (dict(in_channels=64), "32 -> 32"), (dict(kernel_size=(5, 3)), "3 filter"),
                         (dict(kernel_size=(3, 7)), "shared memory")]:
        (reason,) = strip_family.FAMILY.unsupported_reasons(_spec(**{"channels_last": True, **kwargs}))
        assert word in reason, (kwargs, reason)


def test_strip_rs_form():
    """The strip family's rs form (strip_rs.cu: x as wgmma's A from registers) is the only
    fp32 (3xTF32) strip kernel, in both layouts with 3 filter columns, and the last TF32
    candidate there; NCHW, it stores y by the threads, so an fp32 output plane need not be a
    multiple of 4 floats."""

    rs = dict(tile_n=128, ring=6, stage_rows=1, prep_groups=0, mma="rs")
    for channels_last, layout in [(False, "nchw"), (True, "nhwc")]:
        spec = _spec(channels_last=channels_last, precision="fp32")
        assert strip_family.FAMILY.unsupported_reasons(spec) == []
        # both walks, NCHW's default splitting all strips' units, channels_last's each strip's
        config, other = strip_family.strip_configs(spec)
        assert config == strip_family.StripConfig((3, 3), channels_last, precision="fp32", **rs,
                                     split_all=not channels_last)
        assert other == dataclasses.replace(config, split_all=channels_last)
        all_ = "" if channels_last else "_all"
        assert config.name == f"strip_fp32_{layout}_c32x32_k3x3_n128_r6_o1_p0_rs{all_}_sm90"
        assert choose.choose_config(spec) == config
        assert f"constexpr bool kSplitAll = {str(not channels_last).lower()};" in (
            strip_family.config_h(config))
        # 3xTF32: the filter twice (2 x 9 x 32 x 32 floats), 6 rows of 136 x 32, 4 stages of
        # 32 x 68 (NHWC: 32 x 64), 20 mbarriers, the bias
        stage = 32 * (64 if channels_last else 68)
        assert config.shared_bytes == 4 * (18432 + 6 * 136 * 32 + 4 * stage) + 8 * 20 + 4 * 32
        tf32 = strip_family.strip_configs(_spec(channels_last=channels_last))
        assert tf32[-1] == strip_family.StripConfig((3, 3), channels_last, **rs)  # each strip's units
        assert not any(c.split_all for c in tf32)
        assert tf32[-1].shared_bytes == config.shared_bytes - 4 * 9216
        assert all(c.mma == "ss" for c in tf32[:-1])
        assert all(c.mma == "ss" for c in strip_family.strip_configs(_spec(channels_last=channels_last,
                                                               kernel_size=(3, 4))))
    odd_planes = _spec(channels_last=False, precision="fp32", in_size=(511, 1024))
    assert strip_family.FAMILY.unsupported_reasons(odd_planes) == []
    sources = strip_family.FAMILY.sources(config)
    assert sources.templates == ("strip_rs.cu", "strip_common.cuh", "common.cuh")
    assert "constexpr bool kThreePass = true;" in sources.emit()
    assert "constexpr bool kThreePass = false;" in strip_family.config_h(tf32[0])
    assert strip_family.FAMILY.sources(tf32[0]).device == "strip.cu"
    for bad in [dict(precision="fp32"), dict(mma="rs"), dict(mma="sr"), dict(split_all=True),
                dict(precision="fp16", **rs), dict(**{**rs, "ring": 8}),
                dict(**{**rs, "tile_n": 104}), dict(register_a=16, **rs),
                dict(register_a=16, prep_groups=1), dict(register_a=49), dict(register_a=-1)]:
        with pytest.raises(ValueError):
            strip_family.StripConfig((3, 3), False, **bad)
    assert strip_family.StripConfig((3, 3), False, register_a=48).register_a == 48  # all 16 S steps
    with pytest.raises(ValueError, match="16 S"):
        strip_family.StripConfig((3, 1), False, register_a=17)
    with pytest.raises(ValueError):
        strip_family.StripConfig((3, 4), True, **rs)
    with pytest.raises(ValueError, match="R = 3"):
        strip_family.StripConfig((5, 3), False, **rs)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 2), c_in=st.integers(1, 5), c_out=st.integers(1, 5),
       h=st.integers(1, 7), w=st.integers(1, 7), kernel=pairs, stride=pairs, dilation=pairs,
       padding=st.tuples(st.integers(0, 3), st.integers(0, 3)), data=st.data())
def test_output_shape_matches_torch(n, c_in, c_out, h, w, kernel, stride, dilation, padding, data):
    output_padding = tuple(data.draw(st.integers(0, max(s, d) - 1)) for s, d in zip(stride, dilation))
    spec = ProblemSpec(batch=n, in_channels=c_in, out_channels=c_out, in_size=(h, w),
                       kernel_size=kernel, stride=stride, padding=padding,
                       output_padding=output_padding, dilation=dilation, groups=1, bias=False,
                       channels_last=False, precision="tf32", arch=90)
    x, wt = torch.rand(n, c_in, h, w), torch.rand(c_in, c_out, *kernel)
    try:
        expected = F.conv_transpose2d(x, wt, None, stride, padding, output_padding, 1, dilation).shape
    except RuntimeError:  # torch refuses (output too small): so must we
        assert min(spec.out_size) < 1
        return
    assert spec.out_shape == tuple(expected)


def _call(input=None, weight=None, **kwargs):
    input = torch.rand(2, 4, 5, 6) if input is None else input
    weight = torch.rand(4, 3, 3, 3) if weight is None else weight
    return cutlass_convt.conv_transpose2d(input, weight, **kwargs)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(input=[1.0]), TypeError, "input must be a torch.Tensor"),
    (dict(input=torch.rand(2, 4, 5, 6, dtype=torch.float64)), TypeError, "float32"),
    (dict(weight=torch.rand(4, 3, 3, 3).half()), TypeError, "weight must be float32"),
    (dict(bias=torch.rand(3, dtype=torch.float64)), TypeError, "bias must be float32"),
    (dict(input=torch.rand(2, 4, 5, 6).to_sparse()), TypeError, "dense .* torch.sparse_coo"),
    (dict(weight=torch.rand(4, 3, 3, 3).to_sparse()), TypeError, "weight must be a dense"),
    (dict(input=torch.rand(4, 5)), ValueError, "3-D .* or 4-D"),
    (dict(input=torch.rand(1, 2, 4, 5, 6)), ValueError, "3-D .* or 4-D"),
    (dict(weight=torch.rand(4, 3, 3)), ValueError, "4-D weight"),
    (dict(weight=torch.rand(5, 3, 3, 3)), ValueError, "expects input with 5 channels"),
    (dict(bias=torch.rand(4)), ValueError, r"bias must have shape \(3,\)"),
    (dict(stride=0), ValueError, "stride and dilation must be positive"),
    (dict(dilation=(1, 0)), ValueError, "stride and dilation must be positive"),
    (dict(padding=-1), ValueError, "non-negative"),
    (dict(output_padding=1), ValueError, "smaller than either stride or dilation"),
    (dict(padding=(2, 0), input=torch.rand(2, 4, 1, 6)), ValueError, "too small"),
    (dict(groups=0), ValueError, "groups must be a positive int"),
    (dict(groups=True), TypeError, "groups must be an int"),
    (dict(groups=2.0), TypeError, "groups must be an int"),
    (dict(groups=3), ValueError, "divisible by groups"),
    (dict(stride=1.5), TypeError, "stride must be an int or a pair"),
    (dict(padding=(1, 2, 3)), TypeError, "padding must be an int or a pair"),
    (dict(precision="bf16"), ValueError, "precision must be one of"),
    (dict(precision="TF32"), ValueError, "precision must be one of"),
    (dict(backend="triton"), ValueError, "backend must be one of"),
    (dict(), ValueError, "must be a CUDA tensor"),  # everything valid but on the CPU
])
def test_bad_arguments_raise(kwargs, error, match):
    with pytest.raises(error, match=match):
        _call(**kwargs)


def test_int_like_arguments_are_accepted_as_torch_does():
    np = pytest.importorskip("numpy")
    x, w = torch.rand(2, 4, 5, 6), torch.rand(4, 3, 3, 3)
    for kwargs in (dict(stride=(2,)), dict(stride=np.int64(2)), dict(padding=[1]),
                   dict(groups=np.int32(1)), dict(dilation=(np.int64(2), 1))):
        F.conv_transpose2d(x, w, **kwargs)  # torch accepts them...
        with pytest.raises(ValueError, match="must be a CUDA tensor"):  # ...and so do we
            _call(x, w, **kwargs)


def test_module_checks_precision_and_backend_at_construction():
    with pytest.raises(ValueError, match="precision must be one of"):
        cutlass_convt.ConvTranspose2d(4, 4, 3, precision="TF32")
    with pytest.raises(ValueError, match="backend must be one of"):
        cutlass_convt.ConvTranspose2d(4, 4, 3, backend="cutlas")


@pytest.mark.parametrize("kwargs", [
    dict(output_padding=1), dict(stride=0), dict(padding=-1), dict(dilation=(1, 0)),
    dict(weight=torch.rand(5, 3, 3, 3)), dict(bias=torch.rand(4)), dict(input=torch.rand(4, 5)),
    dict(input=torch.rand(1, 2, 4, 5, 6)), dict(weight=torch.rand(4, 3, 3)),
    dict(padding=(2, 0), input=torch.rand(2, 4, 1, 6)),
])
def test_value_errors_are_runtime_errors_as_torch_s(kwargs):
    """PyTorch refuses these values with RuntimeError; ours raise InvalidArgument, a ValueError
    and a RuntimeError, so that code written for PyTorch's errors catches ours."""
    args = {"input": torch.rand(2, 4, 5, 6), "weight": torch.rand(4, 3, 3, 3), **kwargs}
    with pytest.raises(RuntimeError):
        F.conv_transpose2d(args.pop("input"), args.pop("weight"), **args)
    with pytest.raises(cutlass_convt.InvalidArgument) as caught:
        _call(**kwargs)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, RuntimeError)


@pytest.mark.parametrize("layout", ["csr", "nested"])
def test_compressed_and_nested_tensors_are_type_errors(layout):
    x = torch.rand(2, 4, 5, 6)
    bad = (x.flatten(0, 2).to_sparse_csr() if layout == "csr"
           else torch.nested.nested_tensor([x[0], x[1]]))
    for kwargs in (dict(input=bad), dict(weight=bad)):
        with pytest.raises(TypeError, match="must be a dense"):
            _call(**kwargs)


@pytest.fixture
def fake_cuda(monkeypatch):
    """Fake CUDA tensors (no GPU, no kernels run) on an SM90 device, with an empty call cache."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    monkeypatch.setattr(env, "device_arch", lambda index: 90)
    cutlass_convt.clear_caches()
    with FakeTensorMode():
        yield
    cutlass_convt.clear_caches()


def test_a_cached_call_still_refuses_a_sparse_bias(fake_cuda):
    x, w = torch.empty(2, 4, 5, 5, device="cuda"), torch.empty(4, 8, 3, 3, device="cuda")
    dense = torch.empty(8, device="cuda")
    sparse = torch.sparse_coo_tensor(torch.zeros(1, 1, dtype=torch.long, device="cuda"),
                                     torch.ones(1, device="cuda"), (8,))
    cutlass_convt.conv_transpose2d(x, w, dense, backend="torch")  # the arguments are cached
    with pytest.raises(TypeError, match="bias must be a dense"):
        cutlass_convt.conv_transpose2d(x, w, sparse, backend="torch")


def test_precision_follows_cudnn_allow_tf32(monkeypatch):
    from cutlass_convt.args import resolve_precision

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    assert resolve_precision(None) == "tf32"
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    assert resolve_precision(None) == "fp32"
    assert resolve_precision("tf32") == "tf32"


def test_problem71_spec_maps_to_dgrad():
    case = problems.find("kernelbench-71")
    spec = case.spec("tf32", 90)
    assert spec.out_shape == (8, 32, 514, 1026)
    d = dgrad_family.dgrad_problem(spec)
    assert (d.N, d.H, d.W, d.C, d.K, d.R, d.S, d.P, d.Q) == (8, 514, 1026, 32, 32, 3, 3, 512, 1024)
    assert dgrad_family.default_dgrad_config(spec).alignment_a == 4 and dgrad_family.default_dgrad_config(spec).alignment_c == 4
    assert dgrad_family.default_dgrad_config(spec).threadblock_shape == (128, 32, 32)  # N = C_out = 32
    wide = problems.find("kernelbench-57").spec("tf32", 90)
    assert dgrad_family.default_dgrad_config(wide).threadblock_shape == (128, 64, 32)
    assert dgrad_family.default_dgrad_config(case.spec("fp32", 90)).precision == "fp32"


def test_alignment_follows_channel_counts():
    base = problems.find("kernelbench-71")
    spec = ProblemSpec(**{**base.spec("tf32", 90).__dict__, "in_channels": 6, "out_channels": 7})
    config = dgrad_family.default_dgrad_config(spec)
    assert (config.alignment_a, config.alignment_c) == (2, 1)


def test_module_traces_with_torch_fx_as_one_call():
    """torch.fx.symbolic_trace records our function as one node (as torch's module's
    F.conv_transpose2d), with the module's precision and backend; the traced module refuses
    CPU tensors as the module does."""
    module = cutlass_convt.ConvTranspose2d(4, 8, 3, precision="fp32", backend="direct")
    traced = torch.fx.symbolic_trace(torch.nn.Sequential(module, torch.nn.ReLU()))
    (call,) = [n for n in traced.graph.nodes if n.op == "call_function"]
    assert call.target is ops.conv_transpose2d
    assert call.kwargs == {"precision": "fp32", "backend": "direct"}
    with pytest.raises(cutlass_convt.InvalidArgument, match="must be a CUDA tensor"):
        traced(torch.rand(1, 4, 5, 5))


def test_module_matches_torch_constructor_and_state_dict():
    torch.manual_seed(0)
    ref = torch.nn.ConvTranspose2d(6, 4, (3, 5), stride=1, padding=(1, 2), bias=True)
    ours = cutlass_convt.ConvTranspose2d(6, 4, (3, 5), stride=1, padding=(1, 2), bias=True,
                                         precision="fp32")
    assert isinstance(ours, torch.nn.ConvTranspose2d)
    assert {k: v.shape for k, v in ours.state_dict().items()} == \
        {k: v.shape for k, v in ref.state_dict().items()}
    ours.load_state_dict(ref.state_dict())
    assert torch.equal(ours.weight, ref.weight) and torch.equal(ours.bias, ref.bias)
    assert "precision='fp32', backend='auto'" in repr(ours)
    with pytest.raises(ValueError, match="CUDA tensor"):
        ours(torch.rand(1, 6, 4, 4))


def test_problem_spec_of_unbatched_input_is_rejected_on_cpu_only_for_device():
    with pytest.raises(ValueError, match="CUDA tensor"):
        problem_spec(torch.rand(4, 5, 6), torch.rand(4, 3, 3, 3))


def test_cases_resolve_by_number():
    assert problems.find("71") == problems.find("kernelbench-l1-71")
    assert problems.find("kernelbench-71") == problems.find("71")
    assert problems.find("upsample-k4s2").id == "upsample-k4s2"
    # other levels, prefixes and suffixes name no case (level 2's problem 71 is another one)
    for name in ("kernelbench-999", "kernelbench-l2-71", "l2-71", "foo-71", "k4s2", "l1-71"):
        with pytest.raises(KeyError, match="known"):
            problems.find(name)


# Error parity with PyTorch: over random arguments, ours refuses exactly what torch refuses.
# Batches are non-empty: for an empty batch PyTorch skips its dilation and output_padding
# checks (it returns an empty tensor for dilation=0); we validate empty batches like others.
# Dilation stays positive here: PyTorch's CPU paths accept dilation=0 for some shapes and
# refuse it for others ("dilation should be greater than zero"); we always refuse it (tested
# in test_bad_arguments_raise).
small = st.integers(-1, 3)


@settings(max_examples=400, deadline=None)
@given(n=st.integers(1, 2), c_in=st.integers(1, 6), c_out_g=st.integers(1, 3),
       h=st.integers(1, 6), w=st.integers(1, 6), r=st.integers(1, 4), s=st.integers(1, 4),
       stride=st.tuples(small, small), padding=st.tuples(small, small),
       output_padding=st.tuples(small, small),
       dilation=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       groups=st.integers(1, 4), bias=st.sampled_from([None, "right", "wrong"]),
       unbatched=st.booleans())
def test_errors_match_torch(n, c_in, c_out_g, h, w, r, s, stride, padding, output_padding,
                            dilation, groups, bias, unbatched):
    # Output size 0: PyTorch's CPU paths disagree (see test_output_size_matches_torch).
    assume(0 not in [conv_transpose_output_size(*a) for a in zip(
        (h, w), (r, s), stride, padding, output_padding, dilation)])
    x = torch.rand(c_in, h, w) if unbatched else torch.rand(n, c_in, h, w)
    wt = torch.rand(c_in, c_out_g, r, s)
    b = None if bias is None else torch.rand(c_out_g * groups + (bias == "wrong"))
    args = (x, wt, b, stride, padding, output_padding, groups, dilation)
    try:
        expected = F.conv_transpose2d(*args)
    except RuntimeError:
        expected = None
    try:
        problem_spec(*args)
    except (TypeError, ValueError) as e:
        ours = str(e)
    else:
        raise AssertionError("problem_spec accepted CPU tensors")
    if expected is None:
        assert "CUDA tensor" not in ours, f"torch refuses {args[3:]}, we accepted: {ours}"
    else:
        assert "CUDA tensor" in ours, f"torch accepts {args[3:]}, we refused: {ours}"


def _spec(**changes) -> ProblemSpec:
    return ProblemSpec(**{**problems.find("kernelbench-71").spec("tf32", 90).__dict__, **changes})


@pytest.fixture
def fresh_plans(tmp_path, monkeypatch):
    """Empty per-process choice and plan caches before and after (fake plans never reach other
    tests), and an empty kernel cache (no tuning record picks the configuration)."""
    monkeypatch.setenv("CUTLASS_CONVT_CACHE_DIR", str(tmp_path))
    cutlass_convt.clear_caches()
    yield
    cutlass_convt.clear_caches()


def test_each_device_gets_its_own_plan(monkeypatch, fresh_plans, fake_cuda):
    """A persistent kernel's grid is sized for its device's SMs, so one problem on two devices
    is planned once on each, each device's later calls reuse that device's plan, and a plan is
    refused on another device's tensors before any GPU work."""

    planned = []

    class Kernel:
        def plan(self, spec, device):
            planned.append(device)
            return f"plan on {device}"

    monkeypatch.setattr(strip_family, "load", lambda family, config, factory: Kernel())
    monkeypatch.setattr(cuda, "OnDevice", lambda device: contextlib.nullcontext())
    spec = _spec()
    config = choose.choose(spec, ("strip",))
    plans = [ops.prepare_config(spec, config, device).plan for device in (0, 1, 0, 1)]
    assert plans == ["plan on 0", "plan on 1"] * 2 and planned == [0, 1]
    prepared = ops.prepare(spec, ("strip",), 1)
    assert prepared.plan == "plan on 1" and prepared.device == 1 and planned == [0, 1]
    x = torch.empty(8, 32, 512, 1024, device="cuda")  # (fake: on cuda:0)
    with pytest.raises(cutlass_convt.InvalidArgument, match="planned for cuda:1 run on cuda:0"):
        ops.run_prepared(prepared, x, torch.empty(32, 32, 3, 3, device="cuda"), None)


def test_device_guard_switches_and_restores(monkeypatch):
    """The guard around our CUDA work: on the current device it only checks the thread's
    context; on another device it switches with PyTorch's device guard (which restores the
    previous device without creating a context there), makes that device's context current, and
    on leaving (normally, on an exception, or when the context cannot be made current) switches
    back and has the next context check look again (switching back changes the thread's
    context)."""
    from cutlass_convt import cuda

    events = []
    current = [0]
    fail = [False]

    class DeviceGuard:  # torch.cuda.device
        def __init__(self, device):
            self.device = device

        def __enter__(self):
            events.append(("switch", self.device))
            self.previous, current[0] = current[0], self.device

        def __exit__(self, *exc):
            events.append(("restore", self.previous))
            current[0] = self.previous
            return False

    def make_current(device):
        events.append(("context", device))
        if fail[0]:
            raise cuda.CudaError("no context")

    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    monkeypatch.setattr(torch.cuda, "device", DeviceGuard)
    monkeypatch.setattr(cuda, "make_primary_context_current", make_current)
    monkeypatch.setattr(cuda, "forget_current_context", lambda: events.append(("forget",)))
    with cuda.OnDevice(0):
        events.append(("work", current[0]))
    assert events == [("context", 0), ("work", 0)]
    for error in (None, RuntimeError("failed launch")):
        events.clear()
        with pytest.raises(RuntimeError) if error else contextlib.nullcontext():
            with cuda.OnDevice(1):
                events.append(("work", current[0]))
                if error:
                    raise error
        assert events == [("switch", 1), ("context", 1), ("work", 1), ("forget",),
                          ("restore", 0)] and current[0] == 0
    events.clear()
    fail[0] = True
    with pytest.raises(cuda.CudaError):
        with cuda.OnDevice(1):
            events.append(("work", current[0]))
    assert events == [("switch", 1), ("context", 1), ("forget",), ("restore", 0)]
    assert current[0] == 0


def test_forget_current_context_has_the_next_check_look_again(monkeypatch):
    """make_primary_context_current asks the driver for the thread's context once per device,
    and again after forget_current_context."""
    from cutlass_convt import cuda

    asked = []
    ok = cuda._SUCCESS
    monkeypatch.setattr(cuda, "_THREAD", threading.local())
    monkeypatch.setattr(cuda.driver, "cuInit", lambda flags: (ok,))
    monkeypatch.setattr(cuda.driver, "cuCtxGetCurrent", lambda: asked.append(1) or (ok, 1))
    monkeypatch.setattr(cuda.driver, "cuCtxGetDevice", lambda: (ok, 0))
    cuda.make_primary_context_current(0)
    cuda.make_primary_context_current(0)
    assert len(asked) == 1
    cuda.forget_current_context()
    cuda.make_primary_context_current(0)
    assert len(asked) == 2


def test_groups_become_one_launch_per_group_on_channel_views():
    spec = _spec(in_channels=32, out_channels=48, groups=4, batch=2, in_size=(5, 7),
                 padding=(1, 1))
    launches = dgrad_family.dgrad_launches(spec)
    assert len(launches) == 4
    h, w = spec.out_size
    for g, item in enumerate(launches):
        assert (item.problem.K, item.problem.C, item.problem.N) == (8, 12, 2)
        assert item.x_strides == (32, 7 * 32, 5 * 7 * 32)
        assert item.y_strides == (48, w * 48, h * w * 48)
        assert item.offsets == (8 * g, 8 * 9 * 12 * g, 12 * g, 12 * g)
    config = dgrad_family.default_dgrad_config(spec)
    assert (config.alignment_a, config.alignment_c) == (4, 4)
    depthwise = dgrad_family.default_dgrad_config(_spec(in_channels=32, out_channels=32, groups=32))
    assert (depthwise.alignment_a, depthwise.alignment_c) == (1, 1)


def test_large_batches_are_chunked_under_2_gib():
    spec = problems.find("kernelbench-57").spec("tf32", 90)  # 2.2 GB per tensor
    launches = dgrad_family.dgrad_launches(spec)
    assert sum(item.problem.N for item in launches) == spec.batch == 8
    per_sample = dgrad_family.sample_bytes(spec)
    for item in launches:
        assert item.problem.N * per_sample < 2**31
    starts = [item.offsets[0] // item.x_strides[2] for item in launches]
    assert starts == sorted(set(starts)) and starts[0] == 0
    assert dgrad_family.FAMILY.unsupported_reasons(spec) == []


def test_stride_picks_the_strided_dgrad_kernel():
    config = dgrad_family.default_dgrad_config(_spec(stride=(2, 2)))
    assert config.stride_support == "strided" and config.swizzle == "StridedDgradIdentity1"
    assert dgrad_family.default_dgrad_config(_spec()).stride_support == "unity"


def test_unsupported_reasons_name_the_cause():
    assert dgrad_family.FAMILY.unsupported_reasons(_spec()) == []
    (reason,) = dgrad_family.FAMILY.unsupported_reasons(_spec(stride=(5, 5), dilation=(2, 2)))
    assert "dilation" in reason and "strided dgrad" in reason
    (reason,) = dgrad_family.FAMILY.unsupported_reasons(_spec(kernel_size=(33, 3)))
    assert "32x32" in reason
    (reason,) = dgrad_family.FAMILY.unsupported_reasons(_spec(in_channels=4096, out_channels=4096))
    assert "2 GiB" in reason


def test_tuning_candidates_and_records(tmp_path, monkeypatch):
    import json


    monkeypatch.setenv("CUTLASS_CONVT_CACHE_DIR", str(tmp_path))
    spec = problems.find("kernelbench-71").spec("tf32", 90)
    found = choose.candidates(spec)
    strip = [c for c in found if isinstance(c, strip_family.StripConfig)]
    direct = [c for c in found if isinstance(c, direct_family.DirectConfig)]
    sm90 = [c for c in found if isinstance(c, fprop_family.FpropSm90Config)]
    dgrad = [c for c in found if isinstance(c, dgrad_family.DgradConfig)]
    assert found == strip + direct + sm90 + dgrad and len(found) == len(set(found))
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
    path = choose.record_path(spec)
    path.parent.mkdir(parents=True)
    winner = dgrad[3]
    path.write_text(json.dumps({"winner_family": "dgrad", "winner": dataclasses.asdict(winner)}))
    assert choose.choose_config(spec) == winner
    assert choose.choose_config(spec, ("direct",)) == direct_family.direct_config(spec)  # family not allowed
    # the memory format changes the direct family's kernel: records are per layout
    assert choose.record_path(ProblemSpec(**{**spec.__dict__, "channels_last": True})) != path
    assert choose.record_path(ProblemSpec(**{**spec.__dict__, "batch": 4})) != path
    path.write_text("{damaged")
    assert choose.choose_config(spec) == strip[0]
    for malformed in ({"winner_family": "dgrad", "winner": None}, {"winner_family": "dgrad",
                      "winner": [1, 2]}, {"winner_family": "nope", "winner": {}}, [], 5):
        path.write_text(json.dumps(malformed))
        cutlass_convt.clear_caches()  # records are cached by modification time
        assert choose.choose_config(spec) == strip[0], malformed
    record = {"winner_family": "fprop_sm90", "winner": dataclasses.asdict(sm90[1])}
    path.write_text(json.dumps(record))
    assert choose.choose_config(spec) == sm90[1]


def test_fprop_sm90_family_limits():
    """TF32 only, stride 1, C_in % 4 == 0, C_out % 32 == 0, padding <= R - 1, no bias; the N
    tile is the widest of 32, 64, 128 that divides C_out."""
    assert fprop_family.FAMILY.unsupported_reasons(_spec()) == []
    assert fprop_family.fprop_sm90_configs(_spec(out_channels=64))[0].tile == (128, 64, 32)
    assert fprop_family.fprop_sm90_configs(_spec(out_channels=96))[0].tile == (128, 32, 32)
    assert fprop_family.fprop_sm90_configs(_spec(out_channels=256))[0].tile == (128, 128, 32)
    for kwargs, word in [(dict(precision="fp32"), "TF32"), (dict(stride=(2, 2)), "stride"),
                         (dict(in_channels=6), "C_in % 4"), (dict(out_channels=48), "C_out % 32"),
                         (dict(padding=(3, 0)), "negative padding"), (dict(bias=True), "bias")]:
        (reason,) = fprop_family.FAMILY.unsupported_reasons(_spec(**kwargs))
        assert word in reason, (kwargs, reason)


def test_sizes_beyond_32_bit_ints_take_the_pytorch_route():
    """Every kernel takes sizes and arguments as C ints: a stride of 2**32 would reach CUTLASS's
    host code as 0 (a division by zero that killed the process). Such problems are refused by
    every family, so "auto" runs PyTorch's own and "cutlass" raises, before any build."""
    from cutlass_convt import ops

    for kwargs in (dict(stride=(2**32, 1)), dict(stride=(2**31, 2)), dict(dilation=(1, 2**32)),
                   dict(padding=(2**31, 0), stride=(2**32, 1))):
        spec = _spec(in_size=(2, 8), kernel_size=(3, 1), **kwargs)
        assert min(spec.out_size) >= 1
        for family in choose.FAMILIES:
            assert "32-bit ints" in family.unsupported_reasons(spec)[0], (kwargs, family.name)
        with pytest.warns(RuntimeWarning, match="32-bit ints"):
            assert isinstance(ops.route(spec, "auto"), ops.TorchRoute)
        with pytest.raises(cutlass_convt.UnsupportedProblem, match="32-bit ints"):
            ops.route(spec, "cutlass")
    assert _spec(stride=(2**31 - 1, 1), in_size=(1, 8)).int32_reasons() == []


def test_tuning_records_that_do_not_fit_the_problem_are_ignored(tmp_path, monkeypatch):
    """A record (edited, or from another version) whose winner is not one of its family's
    candidates for the problem, or whose family cannot compute it, gives the default."""
    import json


    monkeypatch.setenv("CUTLASS_CONVT_CACHE_DIR", str(tmp_path))
    spec = problems.find("kernelbench-71").spec("tf32", 90)
    strided = dataclasses.replace(spec, stride=(2, 2))
    for problem, winner in ((strided, direct_family.direct_config(spec)),
                            (spec, dataclasses.replace(direct_family.direct_config(spec), tile=(4, 40))),
                            (spec, dataclasses.replace(dgrad_family.default_dgrad_config(spec), stages=9))):
        default = choose.choose_config(problem)
        path = choose.record_path(problem)
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"winner_family": choose.family_of(winner).name, "winner": dataclasses.asdict(winner)}
        path.write_text(json.dumps(record))
        assert choose.choose_config(problem) == default != winner, winner
        path.unlink()


def test_gpus_before_sm80_take_the_pytorch_route():
    for family in ("strip", "direct", "fprop_sm90", "dgrad"):
    
        reasons = choose.family(family).unsupported_reasons(_spec(arch=75))
        assert reasons and ("sm_80" in reasons[0] or "sm_90" in reasons[0]), (family, reasons)


def test_direct_family_limits():
    """The direct family takes stride-1, ungrouped problems with channels in multiples of 8
    (at most 32 out, or multiples of 32 on sm_90) whose filter block and input tile fit in
    shared memory; its default configuration fits, holds all output channels in one CTA where
    the filter fits (blocks of 16 or 8 where not, of 32 beyond 32), and NCHW inputs with
    W_in % 4 != 0 use 4-byte loads."""

    spec = problems.find("kernelbench-71").spec("tf32", 90)
    assert direct_family.FAMILY.unsupported_reasons(spec) == []
    config = direct_family.direct_config(spec)
    assert config.shared_bytes <= SHARED_MEMORY_LIMIT and config.vector == 4
    assert config.math == "wgmma" and config.tile == (4, 64) and config.warp_tiles_m == 4
    assert (config.consumers, config.producer_warps, config.threads) == (2, 4, 32 * 12)
    assert config.out_block == 32
    assert direct_family.direct_config(_spec(in_channels=32, out_channels=32, in_size=(9, 13))).vector == 1
    assert direct_family.direct_config(_spec(in_channels=32, out_channels=32, in_size=(9, 13),
                               channels_last=True)).vector == 4
    for kwargs, word in [(dict(stride=(2, 2)), "stride"), (dict(groups=2), "groups"),
                         (dict(in_channels=12, out_channels=16), "multiples of 8"),
                         (dict(in_channels=32, out_channels=40), "at most 32"),
                         (dict(in_channels=32, out_channels=64, arch=80), "at most 32"),
                         (dict(in_channels=64, out_channels=32, kernel_size=(7, 7)),
                          "shared memory"),
                         (dict(in_channels=8, out_channels=8, kernel_size=(40, 3)),
                          "32 input rows")]:
        (reason,) = direct_family.FAMILY.unsupported_reasons(_spec(**kwargs))
        assert word in reason, (kwargs, reason)
    small = direct_family.direct_config(_spec(in_channels=16, out_channels=16, kernel_size=(7, 7)))
    assert small is not None and small.shared_bytes <= SHARED_MEMORY_LIMIT
    assert small.out_block == 16
    # filters that do not fit whole: the output channels in blocks, the filter split among CTAs
    for kernel, precision, block in [((3, 3), "tf32", 32), ((7, 7), "tf32", 16),
                                     ((5, 5), "fp32", 16), ((7, 7), "fp32", 8),
                                     ((3, 7), "fp32", 32)]:
        spec = _spec(kernel_size=kernel, precision=precision)
        config = direct_family.direct_config(spec)
        assert (config.math, config.out_block) == ("wgmma", block), (kernel, precision)
        assert config.shared_bytes <= SHARED_MEMORY_LIMIT
        assert ("b" in config.name.split("_")[3]) == (block < 32)
        # a split default (measured slower than the stock kernels) puts them first
        assert (choose.family_order(spec)[-1].name == "direct") == (block < 32)
    assert isinstance(choose.choose_config(_spec(kernel_size=(7, 7))), fprop_family.FpropSm90Config)
    assert isinstance(choose.choose_config(_spec(kernel_size=(7, 7), bias=True)), dgrad_family.DgradConfig)
    assert choose.choose_config(_spec(kernel_size=(7, 7)), ("direct",)).out_block == 16
    # fp32 on one stage and 8 output channels: the direct family up to 16 taps, dgrad first
    # beyond
    for c_in, kernel, family in [(64, (4, 4), direct_family.DirectConfig), (64, (5, 5), dgrad_family.DgradConfig),
                                 (64, (3, 7), dgrad_family.DgradConfig), (32, (7, 7), dgrad_family.DgradConfig)]:
        spec = _spec(in_channels=c_in, out_channels=8, precision="fp32", kernel_size=kernel)
        assert direct_family.direct_config(spec).stages == 1
        assert isinstance(choose.choose_config(spec), family), (c_in, kernel)
    # C_out > 32: blocks of 32 on wgmma; the default choice in fp32 on the 4-row tile with
    # C_in <= 64 (measured faster than dgrad), else the stock families first
    for c_in, c_out, kernel, precision, family in [
            (32, 64, (3, 3), "fp32", direct_family.DirectConfig), (16, 128, (4, 4), "fp32", direct_family.DirectConfig),
            (64, 64, (3, 3), "fp32", dgrad_family.DgradConfig), (128, 64, (1, 1), "fp32", dgrad_family.DgradConfig),
            (32, 64, (3, 3), "tf32", fprop_family.FpropSm90Config)]:
        spec = _spec(in_channels=c_in, out_channels=c_out, kernel_size=kernel,
                     precision=precision)
        configs = direct_family.direct_configs(spec)
        assert configs and {(c.math, c.out_block) for c in configs} == {("wgmma", 32)}
        assert isinstance(choose.choose_config(spec), family), (c_in, c_out, kernel, precision)
    # fp32 beyond 64 input channels: the 3xTF32 error passes the 1e-6 bound (TF32 runs)
    wide_in = _spec(in_channels=128, kernel_size=(1, 1), precision="fp32")
    (reason,) = direct_family.FAMILY.unsupported_reasons(wide_in)
    assert "1e-6" in reason
    assert isinstance(choose.choose_config(wide_in), dgrad_family.DgradConfig)
    assert direct_family.FAMILY.unsupported_reasons(_spec(in_channels=128, kernel_size=(1, 1))) == []
    # C_out = 24: whole on mma.sync before blocks of 8 on wgmma
    assert direct_family.direct_config(_spec(out_channels=24)).math == "mma_sync"
    # fp32 on mma.sync: 8-row tiles with 2 stages only (4-row ones measured twice as slow as
    # the dgrad family)
    on_sm80 = _spec(kernel_size=(3, 7), precision="fp32", arch=80)
    config = direct_family.direct_config(on_sm80)
    assert config.math == "mma_sync" and config.tile[0] == 8 and config.stages == 2
    assert isinstance(choose.choose_config(on_sm80), dgrad_family.DgradConfig)  # a split: dgrad first
    assert direct_family.direct_config(dataclasses.replace(on_sm80, precision="tf32")).tile == (4, 64)
    (reason,) = direct_family.FAMILY.unsupported_reasons(_spec(kernel_size=(5, 5), precision="fp32", arch=80))
    assert "8-row tile with 2 stages" in reason


@settings(max_examples=150, deadline=None)
@given(h=st.integers(1, 6), w=st.integers(1, 6), k=st.integers(1, 4), stride=st.integers(1, 3),
       padding=st.integers(0, 2), dilation=st.integers(1, 2),
       extra=st.tuples(st.integers(-2, 3), st.integers(-2, 3)), with_batch=st.booleans(),
       unbatched=st.booleans())
def test_output_size_matches_torch(h, w, k, stride, padding, dilation, extra, with_batch,
                                   unbatched):
    """``forward(input, output_size=...)`` accepts exactly the sizes torch accepts."""
    kwargs = dict(stride=stride, padding=padding, dilation=dilation)
    ref = torch.nn.ConvTranspose2d(3, 2, k, **kwargs)
    ours = cutlass_convt.ConvTranspose2d(3, 2, k, **kwargs)
    x = torch.rand(3, h, w) if unbatched else torch.rand(2, 3, h, w)
    base = [(i - 1) * stride - 2 * padding + dilation * (k - 1) + 1 for i in (h, w)]
    size = [b + e for b, e in zip(base, extra)]
    # Output sizes below 1 are refused here; PyTorch's CPU paths disagree among themselves
    # about 0 (oneDNN returns an empty tensor, the slow path raises "Output size is too small").
    assume(min(size) >= 1)
    if with_batch:
        size = list(x.shape[:-2]) + size
    try:
        expected = ref(x, output_size=size).shape
    except (ValueError, RuntimeError):
        expected = None
    with pytest.raises(ValueError) as e:  # on the CPU ours always raises: the question is which
        ours(x, output_size=size)
    assert ("CUDA tensor" in str(e.value)) == (expected is not None), (size, str(e.value))


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


def test_direct_family_runs_the_fixed_shapes():
    """The GPU tests' direct shapes (``test_gpu.DIRECT_SHAPES``): the direct family runs every
    one in both precisions, among them output channels split in blocks of 16 and of 8 (the
    filter does not fit whole) in both layouts."""
    shapes, spec_of = test_gpu.DIRECT_SHAPES, test_gpu._spec_of
    configs = [direct_family.direct_configs(spec_of(shape, p, cl))[0] for shape in shapes
               for p in PRECISIONS for cl in (False, True)]
    assert not [(shape, p) for shape in shapes for p in PRECISIONS
                if direct_family.FAMILY.unsupported_reasons(spec_of(shape, p))]
    split = {(c.precision, c.channels_last, c.out_block) for c in configs
             if c.out_block < c.out_channels}
    assert split >= {(p, cl, b) for p in PRECISIONS for cl in (False, True) for b in (32, 16, 8)
                     if (p, b) != ("tf32", 8)}  # 32: C_out > 32


def test_direct_family_blocks_cover_both_maths():
    """The GPU tests' block cases (``test_gpu.BLOCK_CASES``) take every math and block size
    that fits."""
    assert {(s.precision, c.math, c.out_block) for s, c in test_gpu.BLOCK_CASES} >= {
        ("tf32", "wgmma", 16), ("tf32", "wgmma", 8), ("tf32", "mma_sync", 16),
        ("tf32", "mma_sync", 8), ("fp32", "wgmma", 8)}


def test_strip_nchw_writes_every_column_once_or_twice():
    """A model of ``strip.cu``'s NCHW output columns (``strip_common.cuh``'s ``strip_q0``, its
    ``nchw_head``, the epilogue's checked and unchecked column blocks and its end-column rule)
    on :meth:`strip_family.StripConfig.strips` strips and :meth:`strip_family.StripConfig.store_body` wide bodies: every
    value staged for a TMA body lands inside it, each body position exactly once; bodies stay
    inside the strip and the row; every column of every row is written, by a body or by the
    threads, at most twice (where the last strip overlaps the one before it), for every tile
    width, Q from 1 to 700 and each offset of the row modulo 8 floats (the even and the odd
    channels' planes may be 4 apart)."""
    for tile_n in (64, 96, 104, 112, 128):
        config = strip_family.StripConfig((3, 3), False, tile_n)
        step = config.strip_step
        assert step % 8 == 0 and step % 32 in (8, 24) and step <= tile_n - 7
        for q in range(1, 701):
            body = config.store_body(q)
            assert body % 8 == 0 and body <= step
            for row_start in range(8):  # (plane offset + pp x Q) mod 8
                written = [0] * q
                for strip in range(config.strips(q)):
                    q0 = max(0, min(strip * step, q - tile_n))
                    head = (8 - (row_start + q0)) & 7
                    lo = 0 if q0 == 0 else head
                    cols = min(tile_n, q - q0) if q0 + tile_n >= q else head + body
                    if body:  # no y map otherwise
                        assert head + body <= min(tile_n, q - q0), (tile_n, q, strip)
                    staged = [0] * body
                    for col in range(tile_n):  # the strip's computed columns
                        j = col // 8  # unchecked blocks only with a full body
                        check = body != step or j == 0 or 8 * j + 7 >= step
                        if not check or head <= col < head + body:
                            assert 0 <= col - head < body and q0 + col < q, (tile_n, q, col)
                            staged[col - head] += 1
                        elif lo <= col < cols:
                            assert q0 + col < q
                            written[q0 + col] += 1
                    assert all(n == 1 for n in staged), (tile_n, q, strip, row_start)
                    for col in range(head, head + body):  # the TMA body
                        written[q0 + col] += 1
                assert all(1 <= n <= 2 for n in written), (tile_n, q, row_start)


def test_strip_nchw_stage_writes_are_conflict_free():
    """A model of ``strip.cu``'s NCHW stage writes (its ``channel_of_row``, the wgmma
    accumulator layout: thread ``lane`` of warp ``w`` holds rows m = 16 w + lane / 4 + 8 h of
    M, columns 8 j + 2 (lane % 4) + e; a box row per channel, (co & 1) 16 + co / 2, of
    :attr:`strip_family.StripConfig.strip_step` floats): each output row's 32 channels once, a thread's two
    channels of one parity 16 apart, and, where the row's head is even, every 64-bit write
    8-byte aligned and each half-warp's 16 writes on 32 distinct banks (docs/perf-notes.md
    v0.29), for every tile width."""
    def channel_of_row(m):
        return 2 * (m % 16) + m // 16

    for tile_n in (64, 96, 104, 112, 128):
        pitch = strip_family.StripConfig((3, 3), False, tile_n).strip_step  # kBodyMax: a box row's floats
        for prow in range(2):  # the pair's output rows: warps 2 prow and 2 prow + 1
            seen = []
            for w in (2 * prow, 2 * prow + 1):
                for lane in range(32):
                    m0 = (16 * w + lane // 4) % 32
                    co0, co1 = channel_of_row(m0), channel_of_row(m0 + 8)
                    assert co0 % 2 == co1 % 2 and co1 - co0 == 16
                    assert (co0 % 2) * 16 + co0 // 2 == m0  # the box row is the accumulator row
                    seen += [co0, co1]
            assert sorted(seen) == [c for c in range(32) for _ in range(4)]  # 4 lanes a channel
        for head in range(0, 8, 2):
            for w in range(4):
                for j in range(1, tile_n // 8):  # unchecked blocks
                    for h in range(2):
                        for half in range(2):  # the half-warps' wavefronts
                            banks = []
                            for lane in range(16 * half, 16 * half + 16):
                                m = (16 * w + lane // 4) % 32 + 8 * h
                                co = channel_of_row(m)
                                box_row = (co % 2) * 16 + co // 2
                                word = box_row * pitch + 8 * j + 2 * (lane % 4) - head
                                assert word % 2 == 0  # 8-byte aligned (the stage is)
                                banks += [word % 32, (word + 1) % 32]
                            assert len(set(banks)) == 32, (tile_n, head, w, j, h)
