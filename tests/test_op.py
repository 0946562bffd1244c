"""The torch.library op: opcheck, fake shapes and strides, torch.compile (one graph), export,
jit.trace, torch.func, autocast, every dtype and device on the default route, PyTorch's TF32
switches in both APIs, and the fallback when a kernel cannot be built (CPU)."""

from __future__ import annotations

import copy
import threading
import time
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import cutlass_convt
from cutlass_convt import args, build, ops
from cutlass_convt.args import resolve_precision, torch_conv_precision, torch_conv_tf32
from cutlass_convt.benchmark import errors

from helpers import problem71


def _op_args(x, w, b=None, stride=(1, 1), padding=(0, 0), output_padding=(0, 0), groups=1,
             dilation=(1, 1), precision=None, backend="auto"):
    return (x, w, b, list(stride), list(padding), list(output_padding), groups, list(dilation),
            precision, backend)


@pytest.fixture(autouse=True)
def quiet_fallback():
    """The CPU calls here take PyTorch's route, which warns once per reason."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


@pytest.mark.parametrize("case", [
    dict(), dict(stride=(2, 2), padding=(1, 1), output_padding=(1, 1)),
    dict(groups=2, dilation=(2, 1)), dict(channels_last=True), dict(unbatched=True),
    dict(bias=True, stride=(3, 2)),
], ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()) or "plain")
def test_opcheck(case):
    """torch.library.opcheck: schema, fake kernel, autograd registration, aliasing, with and
    without gradients."""
    case = dict(case)
    channels_last, unbatched, bias = (case.pop(k, False) for k in (
        "channels_last", "unbatched", "bias"))
    groups = case.get("groups", 1)
    x = torch.randn(2, 4, 5, 6)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    x = x[0] if unbatched else x
    w, b = torch.randn(4, 3, 3, 2), torch.randn(3 * groups) if bias else None
    for grad in (False, True):
        tensors = [t if t is None else t.clone().requires_grad_(grad) for t in (x, w, b)]
        torch.library.opcheck(ops.OP, _op_args(*tensors, **case))


@settings(max_examples=120, deadline=None)
@given(n=st.integers(0, 2), c_in=st.integers(1, 4), c_out=st.integers(1, 3),
       h=st.integers(1, 6), w=st.integers(1, 6), k=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       stride=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       padding=st.tuples(st.integers(0, 2), st.integers(0, 2)),
       layout=st.sampled_from(["nchw", "channels_last", "weight_cl", "unbatched"]),
       dtype=st.sampled_from([torch.float32, torch.float64]), data=st.data())
def test_fake_shapes_and_strides_match_the_computed_result(n, c_in, c_out, h, w, k, stride,
                                                           padding, layout, dtype, data):
    """The fake kernel (meta tensors) gives the shape of PyTorch's own meta kernel and the
    strides PyTorch's CPU result has."""
    output_padding = tuple(data.draw(st.integers(0, s - 1)) for s in stride)
    assume(min(args.conv_transpose_output_size(i, kk, s, p, o, 1) for i, kk, s, p, o in
               zip((h, w), k, stride, padding, output_padding)) >= 1)
    x = torch.randn(max(n, 1) if layout == "unbatched" else n, c_in, h, w, dtype=dtype)
    weight = torch.randn(c_in, c_out, *k, dtype=dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    if layout == "weight_cl":
        weight = weight.contiguous(memory_format=torch.channels_last)
    if layout == "unbatched":
        x = x[0]
    kwargs = dict(stride=stride, padding=padding, output_padding=output_padding)
    try:
        real = F.conv_transpose2d(x, weight, **kwargs)
    except RuntimeError:
        assume(False)
    fake = ops.OP(*_op_args(x.to("meta"), weight.to("meta"), **kwargs))
    meta = F.conv_transpose2d(x.to("meta"), weight.to("meta"), **kwargs)
    assert fake.shape == meta.shape == real.shape and fake.dtype == dtype
    if real.numel():
        assert fake.stride() == real.stride(), (layout, fake.stride(), real.stride())


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        cutlass_convt.ConvTranspose2d(4, 6, 4, stride=2, padding=1), torch.nn.ReLU(),
        cutlass_convt.ConvTranspose2d(6, 3, 3, stride=2, padding=1, output_padding=1))


def test_compile_fullgraph_is_one_graph_equal_to_eager_and_trains():
    model, x = _model(), torch.randn(2, 4, 5, 6)
    explained = torch._dynamo.explain(model)(x)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(x), model(x))
    x_c, x_e = x.clone().requires_grad_(), x.clone().requires_grad_()
    compiled(x_c).square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x_e).square().sum().backward()
    torch.testing.assert_close(x_c.grad, x_e.grad)
    for ours, eager in zip(grads, (p.grad for p in model.parameters())):
        torch.testing.assert_close(ours, eager)


def test_compile_with_dynamic_shapes():
    model = _model()
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for shape in ((1, 4, 5, 6), (3, 4, 7, 9)):
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), model(x))


def test_export_gives_one_named_node_per_layer():
    model, x = _model(), torch.randn(2, 4, 5, 6)
    exported = torch.export.export(model, (x,))
    targets = [n.target for n in exported.graph.nodes if n.op == "call_function"]
    assert targets.count(ops.OP) == 2, targets
    torch.testing.assert_close(exported.module()(x), model(x))


def test_jit_trace_records_the_op():
    """jit.trace records the op, without TracerWarnings from the package's checks (24 before:
    the tracer's sizes are tensors, so every check's branch warned), and a replay on new values
    computes them; a replay's invalid input is refused by the op."""
    model, x = _model(), torch.randn(2, 4, 5, 6)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        traced = torch.jit.trace(model, (x,))
    assert not [w for w in seen if issubclass(w.category, torch.jit.TracerWarning)
                and "cutlass_convt" in w.filename], [str(w.message) for w in seen]
    assert "cutlass_convt::conv_transpose2d" in str(traced.inlined_graph)
    fresh = torch.randn(2, 4, 5, 6)  # a replay on new values computes them (no stale memory)
    torch.testing.assert_close(traced(fresh), model(fresh))
    with pytest.raises(RuntimeError, match="channels"):
        traced(torch.randn(2, 5, 5, 6))  # 5 input channels: the weight takes 4


def test_jit_script_calls_the_op_and_survives_save_and_load():
    """torch.jit.script of a model with our modules, made and converted (it raised
    NotSupportedError before; torch's module scripts): the scripted forward calls the op, with
    output_size, and a saved and loaded copy computes the same values as eager PyTorch."""
    import io

    model = torch.nn.Sequential(cutlass_convt.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1),
                                torch.nn.ReLU(), torch.nn.ConvTranspose2d(6, 2, 2, 2))
    reference = copy.deepcopy(model)
    cutlass_convt.revert_(reference)
    assert cutlass_convt.convert_(model) == ["2"]
    scripted = torch.jit.script(model)
    assert "cutlass_convt::conv_transpose2d" in str(scripted.inlined_graph)
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    x = torch.randn(2, 4, 5, 6)
    for run in (scripted, loaded):
        torch.testing.assert_close(run(x), reference(x))
    layer = torch.jit.script(model[0])
    assert layer(x, output_size=[10, 12]).shape == (2, 6, 10, 12)


def test_torch_func_grad_and_vjp():
    x, w = torch.randn(2, 4, 5, 6), torch.randn(4, 3, 3, 3)

    def ours(w):
        return cutlass_convt.conv_transpose2d(x, w, stride=2).square().sum()

    def theirs(w):
        return F.conv_transpose2d(x, w, stride=2).square().sum()

    torch.testing.assert_close(torch.func.grad(ours)(w), torch.func.grad(theirs)(w))


def test_torch_func_vmap_and_per_sample_gradients():
    """Under torch.func.vmap (over the input, over the weight, and per-sample gradients as
    vmap of grad), the call is PyTorch's own with its batching rules: the same values as
    F.conv_transpose2d under the same transforms; a forced family refuses batched tensors
    (it raised PyTorch's 'NYI: querying is_contiguous inside of vmap' before)."""
    x, w, b = torch.randn(3, 2, 4, 5, 5), torch.randn(4, 6, 3, 3), torch.randn(6)
    kwargs = dict(stride=2, padding=1, output_padding=1)

    def both(fn, *inputs, **options):
        ours = fn(lambda *a: cutlass_convt.conv_transpose2d(*a, **kwargs), **options)(*inputs)
        theirs = fn(lambda *a: F.conv_transpose2d(*a, **kwargs), **options)(*inputs)
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)

    both(torch.func.vmap, x, w, b, in_dims=(0, None, None))
    both(torch.func.vmap, x[0], torch.randn(3, 4, 6, 3, 3), b, in_dims=(None, 0, None))

    def per_sample(conv):
        loss = lambda w, x: conv(x.unsqueeze(0), w, b, **kwargs).square().sum()  # noqa: E731
        return torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(w, x[0])

    torch.testing.assert_close(per_sample(cutlass_convt.conv_transpose2d),
                               per_sample(F.conv_transpose2d))
    with pytest.raises(cutlass_convt.UnsupportedProblem, match="torch.func.vmap"):
        torch.func.vmap(lambda t: cutlass_convt.conv_transpose2d(t, w, backend="phase"))(x)
    with pytest.raises(ValueError, match="backend must be one of"):
        torch.func.vmap(lambda t: cutlass_convt.conv_transpose2d(t, w, backend="phas"))(x)


def test_forward_mode_ad_jvp_and_dual_tensors():
    x, w, b = torch.randn(2, 4, 5, 6), torch.randn(4, 3, 3, 3), torch.randn(3)
    tx, tw = torch.randn_like(x), torch.randn_like(w)
    kwargs = dict(stride=2, padding=1, output_padding=1)

    def ours(x, w):
        return cutlass_convt.conv_transpose2d(x, w, b, **kwargs)

    def theirs(x, w):
        return F.conv_transpose2d(x, w, b, **kwargs)

    ours_out, ours_tangent = torch.func.jvp(ours, (x, w), (tx, tw))
    theirs_out, theirs_tangent = torch.func.jvp(theirs, (x, w), (tx, tw))
    torch.testing.assert_close(ours_out, theirs_out)
    torch.testing.assert_close(ours_tangent, theirs_tangent)
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(x, tx)
        tangent = torch.autograd.forward_ad.unpack_dual(ours(dual, w)).tangent
    torch.testing.assert_close(tangent, F.conv_transpose2d(tx, w, None, **kwargs))
    # under autocast too (an eager call under autocast goes through the op: not with tangents)
    with torch.autograd.forward_ad.dual_level(), torch.autocast("cpu", dtype=torch.bfloat16):
        dual = torch.autograd.forward_ad.make_dual(x, tx)
        ours_tangent = torch.autograd.forward_ad.unpack_dual(ours(dual, w)).tangent
        theirs_tangent = torch.autograd.forward_ad.unpack_dual(theirs(dual, w)).tangent
    assert ours_tangent is not None and ours_tangent.dtype == theirs_tangent.dtype
    torch.testing.assert_close(ours_tangent, theirs_tangent)


def test_precision_blocks_in_threads_restore_the_switch():
    before, wrong = torch_conv_tf32(), []

    def work(precision):
        for _ in range(200):
            with torch_conv_precision(precision):
                time.sleep(0)  # let the other threads run inside the block
                if torch_conv_tf32() != (precision == "tf32"):
                    wrong.append(precision)

    threads = [threading.Thread(target=work, args=(p,)) for p in ("tf32", "fp32") * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong and torch_conv_tf32() == before


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_computes_in_the_autocast_dtype(dtype):
    model, x = _model(), torch.randn(2, 4, 5, 6)
    reference = torch.nn.Sequential(*(torch.nn.ConvTranspose2d(m.in_channels, m.out_channels,
                                                               m.kernel_size, m.stride,
                                                               m.padding, m.output_padding)
                                      if isinstance(m, torch.nn.ConvTranspose2d) else m
                                      for m in model))
    reference.load_state_dict(model.state_dict())
    with torch.autocast("cpu", dtype=dtype):
        ours, theirs = model(x), reference(x)
    assert ours.dtype == theirs.dtype == dtype
    torch.testing.assert_close(ours, theirs)


def test_autocast_calls_on_pytorch_s_route_call_it_directly(monkeypatch):
    """Under autocast, an eager call whose cast tensors run on PyTorch's route calls
    ``F.conv_transpose2d`` itself (PyTorch's casts, cast cache, kernel and autograd: eager's
    own call), not the op; what is remembered follows the autocast dtype; a forced family
    that cannot compute the cast call raises; meta tensors (no autocast there) are not cast."""
    calls, decided = [], []
    op, new = ops.OP, ops._autocast_new
    monkeypatch.setattr(ops, "OP", lambda *a: calls.append(a) or op(*a))
    monkeypatch.setattr(ops, "_autocast_new", lambda *a: decided.append(a) or new(*a))
    cutlass_convt.clear_caches()
    x = torch.randn(2, 4, 5, 6)
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    for dtype in (torch.bfloat16, torch.float16, torch.bfloat16):
        with torch.autocast("cpu", dtype=dtype):
            for _ in range(2):
                ours = cutlass_convt.conv_transpose2d(x, w, b, stride=2, padding=1)
                theirs = F.conv_transpose2d(x, w, b, stride=2, padding=1)
                assert ours.dtype == dtype and torch.equal(ours, theirs)
    assert calls == [] and len(decided) == 2  # bfloat16's, float16's (bfloat16's again: kept)
    (grad_w,) = torch.autograd.grad(ours.float().sum(), w)
    (want,) = torch.autograd.grad(theirs.float().sum(), w)
    assert torch.equal(grad_w, want)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(cutlass_convt.UnsupportedProblem, match="cpu"):
            cutlass_convt.conv_transpose2d(x, w, b, stride=2, padding=1, backend="phase")
        # tensors on a device autocast does not know (meta: shape inference) are not cast
        meta = cutlass_convt.conv_transpose2d(x.to("meta"), w.to("meta"), stride=2, padding=1)
        assert meta.shape == theirs.shape and meta.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("channels_last", [False, True])
def test_every_dtype_on_the_cpu_is_pytorch_s(dtype, channels_last):
    x = torch.randn(2, 4, 5, 6, dtype=dtype)
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    w, b = torch.randn(4, 6, 3, 3, dtype=dtype), torch.randn(12, dtype=dtype)
    kwargs = dict(stride=2, padding=1, groups=2)
    ours = cutlass_convt.conv_transpose2d(x, w, b, **kwargs)
    theirs = F.conv_transpose2d(x, w, b, **kwargs)
    assert ours.dtype == dtype and ours.stride() == theirs.stride()
    assert torch.equal(ours, theirs)


def test_cpu_and_meta_warn_once_per_reason_and_forced_families_refuse():
    x, w = torch.randn(1, 4, 5, 6), torch.randn(4, 3, 3, 3)
    cutlass_convt.clear_caches()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            cutlass_convt.conv_transpose2d(x, w)
            cutlass_convt.conv_transpose2d(x, w, stride=2)  # another call, the same reason
        assert cutlass_convt.conv_transpose2d(x.to("meta"), w.to("meta")).shape == (1, 3, 7, 8)
        cutlass_convt.conv_transpose2d(x, w, backend="torch")  # asked for: no warning
    reasons = [str(c.message) for c in caught if issubclass(c.category, RuntimeWarning)]
    assert len(reasons) == 2 and "tensors on cpu" in reasons[0] and "on meta" in reasons[1]
    assert {c.filename for c in caught} == {__file__}  # the user's line, not the package's
    cutlass_convt.clear_caches()
    layer = cutlass_convt.ConvTranspose2d(4, 3, 3)
    with pytest.warns(RuntimeWarning, match="tensors on cpu") as record:
        layer(x)
    assert [c.filename for c in record] == [__file__]
    for backend in ("cutlass", "strip", "dgrad"):
        with pytest.raises(NotImplementedError, match="tensors on cpu"):
            cutlass_convt.conv_transpose2d(x, w, backend=backend)


@pytest.fixture
def new_tf32_api():
    """PyTorch's new TF32 switches, restored after the test."""
    switches = args._conv_precision_switches()
    if switches is None:
        pytest.skip("this PyTorch has no fp32_precision switches")
    saved = [s.fp32_precision for s in switches]
    yield switches
    for s, value in zip(switches, saved):
        s.fp32_precision = value


def test_precision_follows_the_new_tf32_switches(new_tf32_api):
    conv, cudnn, everything = new_tf32_api
    for values, expected in (
            (("tf32", "none", "none"), "tf32"), (("ieee", "none", "none"), "fp32"),
            (("none", "tf32", "ieee"), "tf32"), (("none", "none", "tf32"), "tf32"),
            (("none", "ieee", "tf32"), "fp32"), (("none", "none", "none"), "fp32")):
        everything.fp32_precision = values[2]
        cudnn.fp32_precision = values[1]
        conv.fp32_precision = values[0]
        assert resolve_precision(None) == expected, values
    assert resolve_precision("tf32") == "tf32"


def test_a_mix_of_the_legacy_and_new_switches_does_not_raise(new_tf32_api):
    """With cudnn.conv set by the new API (so that cuDNN's legacy allow_tf32 getter raises a
    mixed-API error), the call, its backward and the precision context all run."""
    conv = new_tf32_api[0]
    conv.fp32_precision = "ieee"
    with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
        torch.backends.cudnn.allow_tf32
    assert not torch_conv_tf32()
    x, w = torch.randn(1, 4, 5, 6, requires_grad=True), torch.randn(4, 3, 3, 3, requires_grad=True)
    cutlass_convt.conv_transpose2d(x, w).sum().backward()
    ops.BACKWARD_OP(torch.ones(1, 3, 7, 8), x.detach(), w.detach(), False, [1, 1], [0, 0],
                    [0, 0], 1, [1, 1], "tf32", [True, True, False])
    with torch_conv_precision("tf32"):
        assert conv.fp32_precision == "tf32"
    assert conv.fp32_precision == "ieee"


def test_a_torch_route_sets_the_switch_only_where_pytorch_differs(new_tf32_api):
    """A route to PyTorch records whether PyTorch's TF32 switch must be set around the call;
    the remembered routes are keyed by the switch's value, so flipping it routes afresh."""
    conv = new_tf32_api[0]
    for setting, tf32_switch, fp32_switch in (("tf32", False, True), ("ieee", True, False)):
        conv.fp32_precision = setting
        assert ops.route(problem71(), "torch").switch is tf32_switch
        assert ops.route(problem71(precision="fp32"), "torch").switch is fp32_switch
        assert ops.route(problem71(dtype="float16"), "torch").switch is False
    x, w = torch.rand(1, 4, 5, 6), torch.rand(4, 3, 3, 3)
    keys = []
    for setting in ("tf32", "ieee"):
        conv.fp32_precision = setting
        keys.append(ops._signature(x, w, None, 1, 0, 0, 1, 1, "fp32", "auto"))
    assert keys[0] != keys[1]


def test_precision_follows_allow_tf32_without_the_new_switches(monkeypatch):
    monkeypatch.setattr(args, "_conv_precision_switches", lambda: None)
    monkeypatch.setattr(args, "_conv_precision_getters", lambda: None)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    assert resolve_precision(None) == "fp32"
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    assert resolve_precision(None) == "tf32"


def test_a_kernel_that_cannot_be_built_falls_back_on_auto(monkeypatch, fresh_plans, fake_cuda):
    """'auto' runs PyTorch's route with a warning naming the build error; a forced family
    raises the BuildError."""
    def no_build(*_, **__):
        raise build.BuildError("kernel x is not in the cache and nvcc was not found")

    monkeypatch.setattr(ops, "prepare_config", no_build)
    spec = problem71()
    with pytest.warns(RuntimeWarning, match="could not be built .*nvcc was not found"):
        assert isinstance(ops.route(spec, "auto"), ops.TorchRoute)
    with pytest.raises(build.BuildError, match="nvcc was not found"):
        ops.route(spec, "strip")


# ----------------------------------------------------------------------------------------------
# On the GPU: our kernels under compile, export and CUDA graphs; other dtypes and autocast.

def _gpu_model(backend="dgrad"):
    """A strip-family layer (32 -> 32, k3) and a stride-2 one (on the dgrad family: the
    default choice runs PyTorch's there), on the GPU."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        cutlass_convt.ConvTranspose2d(32, 32, 3, padding=1, bias=False), torch.nn.ReLU(),
        cutlass_convt.ConvTranspose2d(32, 16, 4, stride=2, padding=1, backend=backend)).cuda()


@pytest.mark.gpu
def test_compiled_exported_and_graph_captured_models_equal_eager_on_the_gpu():
    model = _gpu_model()
    x = torch.randn(2, 32, 40, 64, device="cuda")
    with torch.no_grad():
        eager = model(x)
        assert torch.equal(torch.compile(model, fullgraph=True)(x), eager)
        assert torch.equal(torch.export.export(model, (x,)).module()(x), eager)
        captured = torch.compile(model, mode="reduce-overhead", fullgraph=True)
        for _ in range(4):  # warm-up runs, then the captured graph's replays
            fresh = torch.randn(2, 32, 40, 64, device="cuda")
            assert torch.equal(captured(fresh).clone(), model(fresh))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_dtypes_on_the_gpu_are_pytorch_s(dtype):
    x = torch.randn(2, 8, 9, 11, device="cuda", dtype=dtype)
    w, b = (torch.randn(8, 4, 3, 3, device="cuda", dtype=dtype),
            torch.randn(4, device="cuda", dtype=dtype))
    for layout in (torch.contiguous_format, torch.channels_last):
        inp = x.contiguous(memory_format=layout)
        ours = cutlass_convt.conv_transpose2d(inp, w, b, stride=2, padding=1)
        theirs = F.conv_transpose2d(inp, w, b, stride=2, padding=1)
        assert ours.dtype == dtype and ours.stride() == theirs.stride()
        # PyTorch's own route: the same kernel, but cuDNN's float64 ones sum in varying order
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_on_the_gpu_against_pytorch_s(dtype):
    """Under autocast our layers compute in its dtype, as PyTorch's do: the strip-family layer
    on our 16-bit kernel (equal to calling it on the cast tensors), the stride-2 one on
    PyTorch's route; the model's output in that dtype, its error against float64 of the cast
    inputs (16-bit between the layers, as autocast rounds) at most twice PyTorch's."""
    model = _gpu_model("auto")
    reference = torch.nn.Sequential(*(torch.nn.ConvTranspose2d(
        m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding,
        bias=m.bias is not None) if isinstance(m, torch.nn.ConvTranspose2d) else m
        for m in model)).cuda()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 32, 20, 24, device="cuda")
    with torch.autocast("cuda", dtype=dtype):
        ours, theirs, first = model(x), reference(x), model[0](x)
    assert ours.dtype == theirs.dtype == first.dtype == dtype
    # the stride-2 layer (16 output channels, 4 tiles) on PyTorch's route
    up16 = args.problem_spec(torch.empty(2, 32, 20, 24, device="cuda", dtype=dtype),
                             model[2].weight.to(dtype), stride=2, padding=1)
    assert isinstance(ops.route(up16, "auto"), ops.TorchRoute)
    direct = cutlass_convt.conv_transpose2d(x.to(dtype), model[0].weight.to(dtype), padding=1,
                                            backend="strip")
    assert torch.equal(first, direct)
    up = model[2]
    hidden = F.relu(F.conv_transpose2d(x.to(dtype).double(), model[0].weight.to(dtype).double(),
                                       padding=1)).to(dtype).double()
    ref = F.conv_transpose2d(hidden, up.weight.to(dtype).double(), up.bias.to(dtype).double(),
                             stride=2, padding=1)
    assert errors(ours, ref)["rel"] <= 2 * errors(theirs, ref)["rel"]
