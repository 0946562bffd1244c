"""Torch integration: the module as a drop-in for torch.nn.ConvTranspose2d, torch.fx,
autograd, streams, CUDA graphs, threads, the device guard and per-device plans."""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch
import torch.nn.functional as F
from cuda.bindings import driver

import cutlass_convt
from cutlass_convt import choose, cuda, ops
from cutlass_convt.benchmark import errors
from cutlass_convt.families import base

from helpers import (
    GRAD_REL,
    check,
    fresh_generator,
    poison_allocator,
    problem71,
    random_problem,
)


def test_module_traces_with_torch_fx_as_one_call():
    """torch.fx.symbolic_trace records our function as one node (as torch's module's
    F.conv_transpose2d), with the module's precision and backend; the traced module refuses
    CPU tensors as the module does."""
    module = cutlass_convt.ConvTranspose2d(4, 8, 3, precision="fp32", backend="direct")
    traced = torch.fx.symbolic_trace(torch.nn.Sequential(module, torch.nn.ReLU()))
    (call,) = [n for n in traced.graph.nodes if n.op == "call_function"]
    assert call.target is ops.conv_transpose2d
    assert call.kwargs == {"precision": "fp32", "backend": "direct"}
    # on the CPU a forced family refuses, naming the reason, as the module does
    with pytest.raises(cutlass_convt.UnsupportedProblem, match="tensors on cpu"):
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
    x = torch.rand(1, 6, 4, 4)  # on the CPU: PyTorch's route
    assert torch.equal(ours(x), ref(x))


def test_each_device_gets_its_own_plan(monkeypatch, fresh_plans, fake_cuda):
    """A persistent kernel's grid is sized for its device's SMs, so one problem on two devices
    is planned once on each, each device's later calls reuse that device's plan, and a plan is
    refused on another device's tensors before any GPU work."""

    planned = []

    class Kernel:
        def plan(self, spec, device):
            planned.append(device)
            return f"plan on {device}"

    monkeypatch.setattr(base, "load", lambda family, config, factory: Kernel())
    monkeypatch.setattr(cuda, "OnDevice", lambda device: contextlib.nullcontext())
    spec = problem71()
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


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["tf32", "fp32"])
def test_channels_last_gives_same_values_and_layout(precision):
    gen, seed = fresh_generator()
    x = torch.randn(4, 32, 33, 45, device="cuda", generator=gen)
    w = torch.randn(32, 16, 3, 3, device="cuda", generator=gen)
    b = torch.randn(16, device="cuda", generator=gen)
    nchw = cutlass_convt.conv_transpose2d(x, w, b, padding=1, precision=precision)
    poison_allocator(64 * 2**20)
    x_cl = x.contiguous(memory_format=torch.channels_last)
    nhwc = cutlass_convt.conv_transpose2d(x_cl, w, b, padding=1, precision=precision)
    torch_nhwc = F.conv_transpose2d(x_cl, w, b, padding=1)
    assert nhwc.is_contiguous(memory_format=torch.channels_last) and not nhwc.is_contiguous()
    assert torch_nhwc.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(nhwc, nchw), f"seed={seed}"
    check(nhwc, x, w, b, precision, seed, padding=1)
    # a channels_last weight makes the output channels_last too (PyTorch's rule on CUDA)
    w_cl = w.contiguous(memory_format=torch.channels_last)
    out = cutlass_convt.conv_transpose2d(x, w_cl, b, padding=1, precision=precision)
    assert out.is_contiguous(memory_format=torch.channels_last) == \
        F.conv_transpose2d(x, w_cl, b, padding=1).is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(out, nchw)


@pytest.mark.gpu
def test_non_default_stream_is_honoured():
    """The kernel must run on the current stream, after work queued there before it."""
    gen, seed = fresh_generator()
    x = torch.randn(8, 32, 128, 128, device="cuda", generator=gen)
    w = torch.randn(32, 32, 3, 3, device="cuda", generator=gen)
    cutlass_convt.conv_transpose2d(x, w, precision="fp32")  # build and load outside the timing
    x_new = torch.randn(x.shape, device="cuda", generator=gen)
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(200_000_000)  # ~0.1 s: a kernel on another stream would run first
        x.copy_(x_new)
        out = cutlass_convt.conv_transpose2d(x, w, precision="fp32")
    stream.synchronize()
    check(out, x_new, w, None, "fp32", seed)


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay():
    gen, seed = fresh_generator()
    x = torch.randn(2, 16, 40, 50, device="cuda", generator=gen)
    w = torch.randn(16, 8, 3, 3, device="cuda", generator=gen)
    b = torch.randn(8, device="cuda", generator=gen)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: build, load, plan
        cutlass_convt.conv_transpose2d(x, w, b, precision="fp32")
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = cutlass_convt.conv_transpose2d(x, w, b, precision="fp32")
    x.copy_(torch.randn(x.shape, device="cuda", generator=gen))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check(out, x, w, b, "fp32", seed)


@pytest.mark.gpu
def test_first_call_in_a_fresh_thread():
    """A call from a thread whose first CUDA work is ours, where PyTorch's runtime has not made
    its context current (before, both calls failed with CUDA_ERROR_INVALID_CONTEXT): a problem
    new to the process (kernel choice and planning in that thread; the strip family's NCHW
    kernel of STRIP_NCHW_SHAPES[1] with another padding and batch), then the same problem
    cached, from a second fresh thread (launch only); poisoned outputs against float64."""
    x, w, b, seed = random_problem((2, 32, 32, 20, 68, (3, 4), 1, (1, 0), 1, 0, 1, True), False)
    results = {}

    def call(tag):
        try:
            assert not int(driver.cuCtxGetCurrent()[1]), "a context is current: nothing tested"
            results[tag] = cutlass_convt.conv_transpose2d(x, w, b, padding=(1, 0),
                                                          precision="tf32", backend="strip")
            torch.cuda.synchronize()
        except Exception as error:  # reported below, in the test's thread
            results[tag] = error

    for tag in ("new problem", "cached problem"):
        poison_allocator(64 * 2**20)
        thread = threading.Thread(target=call, args=(tag,))
        thread.start()
        thread.join()
        y = results[tag]
        assert isinstance(y, torch.Tensor), f"{tag}: {y!r}"
        check(y, x, w, b, "tf32", seed, padding=(1, 0))


@pytest.mark.gpu
def test_unbatched_and_empty_batch():
    gen, seed = fresh_generator()
    w = torch.randn(8, 4, 3, 3, device="cuda", generator=gen)
    x = torch.randn(8, 10, 12, device="cuda", generator=gen)
    out = cutlass_convt.conv_transpose2d(x, w, precision="fp32")
    assert out.shape == (4, 12, 14)
    check(out, x, w, None, "fp32", seed)
    empty = cutlass_convt.conv_transpose2d(torch.randn(0, 8, 10, 12, device="cuda"), w)
    assert empty.shape == F.conv_transpose2d(torch.randn(0, 8, 10, 12, device="cuda"), w).shape
    # an empty batch that needs gradients keeps autograd's graph, as PyTorch's does: the
    # filter's and the bias's gradients are zeros
    x0 = torch.randn(0, 8, 10, 12, device="cuda", requires_grad=True)
    w0, b0 = w.clone().requires_grad_(), torch.randn(4, device="cuda", requires_grad=True)
    y0 = cutlass_convt.conv_transpose2d(x0, w0, b0)
    assert y0.shape == (0, 4, 12, 14) and y0.grad_fn is not None
    y0.sum().backward()
    assert x0.grad.shape == x0.shape and not w0.grad.any() and not b0.grad.any()


# (family, shape as in run_shape, precision, channels_last, unbatched)
GRAD_CASES = [
    ("strip", (2, 32, 32, 9, 40, (3, 3), 1, 1, 1, 0, 1, True), "tf32", True, False),
    ("direct", (2, 16, 8, 7, 9, (3, 3), 1, 1, 1, 0, 1, True), "fp32", False, False),
    ("dgrad", (1, 8, 12, 5, 6, (3, 3), 2, 1, 1, 1, 1, True), "fp32", False, True),
]


@pytest.mark.gpu
@pytest.mark.parametrize("family, shape, precision, channels_last, unbatched", GRAD_CASES,
                         ids=lambda v: v if isinstance(v, str) else None)
def test_gradients_match_float64(family, shape, precision, channels_last, unbatched):
    """With grad enabled, our forward feeds PyTorch's backward: the gradients of x, the filter
    and the bias match float64 autograd (TF32 on or off as the precision says). Under no_grad
    nothing is recorded."""
    n, c_in, c_out, h, w, kernel, stride, padding, dilation, output_padding, groups, bias = shape
    gen, seed = fresh_generator()
    x = torch.randn(n, c_in, h, w, device="cuda", generator=gen)
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    x = x[0] if unbatched else x
    wt = torch.randn(c_in, c_out // groups, *kernel, device="cuda", generator=gen)
    b = torch.randn(c_out, device="cuda", generator=gen)
    kwargs = dict(stride=stride, padding=padding, dilation=dilation,
                  output_padding=output_padding, groups=groups)
    leaves = [t.clone().requires_grad_() for t in (x, wt, b)]
    poison_allocator(64 * 2**20)
    out = cutlass_convt.conv_transpose2d(*leaves, precision=precision, backend=family, **kwargs)
    assert out.grad_fn is not None
    check(out.detach(), x, wt, b, precision, seed, **kwargs)
    grad = torch.randn(out.shape, device="cuda", generator=gen)
    out.backward(grad)
    refs = [t.detach().double().requires_grad_() for t in (x, wt, b)]
    F.conv_transpose2d(*refs, **kwargs).backward(grad.double())
    bound = GRAD_REL[precision]
    for name, ours, ref in zip(("input", "weight", "bias"), leaves, refs):
        err = errors(ours.grad, ref.grad)
        assert ours.grad.shape == ref.grad.shape and err["rel"] <= bound, (
            f"seed={seed} {family} {precision} grad of {name}: {err}")
    with torch.no_grad():
        assert cutlass_convt.conv_transpose2d(*leaves, precision=precision, backend=family,
                                              **kwargs).grad_fn is None


@pytest.mark.gpu
def test_module_loads_torch_state_dict_and_honours_output_size():
    gen, seed = fresh_generator()
    torch.manual_seed(seed)
    ref = torch.nn.ConvTranspose2d(16, 8, 3, padding=1, dilation=2, bias=True).cuda()
    ours = cutlass_convt.ConvTranspose2d(16, 8, 3, padding=1, dilation=2, bias=True,
                                         precision="fp32").cuda()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 16, 21, 22, device="cuda", generator=gen)
    size = [x.shape[2] + 2, x.shape[3] + 2]  # the only size stride 1 allows
    out = ours(x, output_size=size)
    assert out.shape == ref(x, output_size=size).shape == (2, 8, *size)
    check(out, x, ref.weight, ref.bias, "fp32", seed, padding=1, dilation=2)
    too_big = [size[0] + 1, size[1]]
    with pytest.raises(ValueError, match="requested an output size"):
        ref(x, output_size=too_big)
    with pytest.raises(ValueError, match="requested an output size"):
        ours(x, output_size=too_big)


@pytest.mark.gpu
def test_module_traced_by_torch_fx_computes_the_same():
    gen, seed = fresh_generator()
    torch.manual_seed(seed)
    ours = cutlass_convt.ConvTranspose2d(16, 8, 3, padding=1, precision="fp32").cuda()
    # inside a model, as a layer (a root's optional output_size would be traced as an input,
    # which torch's own module does not take either)
    traced = torch.fx.symbolic_trace(torch.nn.Sequential(ours))
    x = torch.randn(2, 16, 21, 22, device="cuda", generator=gen)
    with torch.no_grad():
        out = traced(x)
        assert torch.equal(out, ours(x))
    check(out, x, ours.weight, ours.bias, "fp32", seed, padding=1)
