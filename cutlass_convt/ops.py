"""The functional API and the PyTorch op: routing (a kernel family or PyTorch), the per-call
fast path, autograd, autocast, and the fake implementation for tracing.

``cutlass_convt::conv_transpose2d`` is a ``torch.library`` op: its CUDA and CPU kernels route
the call (:func:`forward`), its fake kernel gives the result's shape and strides without
computing, its autograd formula is PyTorch's ``aten.convolution_backward`` (as the op
``cutlass_convt::conv_transpose2d_backward``, so that compiled graphs keep the precision), and
its autocast kernels follow PyTorch's policy for ``conv_transpose2d`` (compute in the autocast
dtype). :func:`conv_transpose2d` calls the op whenever PyTorch is tracing, transforming or
intercepting (``torch.compile``, ``torch.export``, ``torch.jit.trace``, ``torch.func``,
dispatch or function modes, tensor subclasses; under ``torch.func.vmap`` it calls
``F.conv_transpose2d``) and under autocast where the cast call runs on
our kernels (on PyTorch's route it calls ``F.conv_transpose2d`` under autocast); in plain
eager code it calls :func:`forward` itself, with the same autograd formula, to save the
dispatcher's cost of a Python kernel (``docs/design/overview.md``, "The op").
"""

from __future__ import annotations

import functools
import logging
import marshal
import operator
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch.autograd import forward_ad

from . import args as checks
from . import choose, cuda, env, extension, measure, program
from .args import Call, InvalidArgument, check_choice, torch_conv_precision
from .build import BuildError
from .families import Prepared, UnsupportedProblem
from .spec import PRECISIONS, ProblemSpec

_LOG = logging.getLogger(__name__)

# "cutlass": the best kernel family that can compute the problem; a family name: that one.
BACKENDS = ("auto", "cutlass", *choose.NAMES, "torch")


@dataclass(frozen=True)
class TorchRoute:
    """A call routed to PyTorch's own ``conv_transpose2d``: the validated call, the precision
    of float32 CUDA math, why (empty: no warning), whether PyTorch's TF32 switch must be set
    to that precision around the call (float32 CUDA tensors, and PyTorch's setting said
    otherwise when the route was made: a remembered route is keyed by that setting),
    ``conv(input, weight, bias)``: ``F.conv_transpose2d`` with the call's size arguments as
    it parses them fastest, and the result's memory format."""

    call: Call
    precision: str
    reason: str
    switch: bool
    conv: Callable
    form: torch.memory_format


def _torch_route(call: Call, precision: str, reason: str, cuda_float32: bool) -> TorchRoute:
    return TorchRoute(call, precision, reason,
                      cuda_float32 and checks.torch_conv_tf32() != (precision == "tf32"),
                      _conv_of(call),
                      torch.channels_last if call.channels_last else torch.contiguous_format)


def _conv_of(call: Call) -> Callable:
    """``F.conv_transpose2d`` of ``(input, weight, bias)`` with ``call``'s size arguments,
    passed positionally without the trailing ones at PyTorch's defaults and as one int where
    a pair is equal: PyTorch's argument parser costs about half a microsecond for each
    argument given, and a ``*args`` call twice that (a call's every microsecond counts on small
    layers)."""
    def compact(pair):
        return pair[0] if pair[0] == pair[1] else pair

    given = [compact(call.stride), compact(call.padding), compact(call.output_padding),
             call.groups, compact(call.dilation)]
    while given and given[-1] == (1, 0, 0, 1, 1)[len(given) - 1]:
        given.pop()
    conv = F.conv_transpose2d
    if not given:
        return lambda x, w, b: conv(x, w, b)
    if len(given) == 1:
        stride, = given
        return lambda x, w, b: conv(x, w, b, stride)
    if len(given) == 2:
        stride, padding = given
        return lambda x, w, b: conv(x, w, b, stride, padding)
    stride, padding, output_padding, groups, dilation = [*given, *(1, 0, 0, 1, 1)[len(given):]]
    return lambda x, w, b: conv(x, w, b, stride, padding, output_padding, groups, dilation)


def prepare_config(spec: ProblemSpec, config, device: int | None = None) -> Prepared:
    """Build (cached on disk), load and plan ``config`` for ``spec`` on CUDA device index
    ``device`` (default: the current one), once per process and device (a plan's grid is sized
    for its device's SMs). Raises :class:`~cutlass_convt.UnsupportedProblem` when ``config``'s
    family does not take the problem, ``config`` is built for another one
    (:meth:`~cutlass_convt.families.base.Family.config_reasons`) or the kernel
    cannot implement it (CUTLASS's ``can_implement``),
    :class:`~cutlass_convt.BuildError` when it is not cached and cannot be compiled."""
    return _prepare_config(spec, config, _device_index(device))


def _device_index(device: int | None) -> int:
    return torch.cuda.current_device() if device is None else operator.index(device)


@functools.lru_cache(maxsize=256)
def _prepare_config(spec: ProblemSpec, config, device: int) -> Prepared:
    family = choose.family_of(config)
    reasons = family.unsupported_reasons(spec) or family.config_reasons(spec, config)
    if reasons:  # (no kernel runs on a problem it was not built for)
        raise UnsupportedProblem(f"{config.name} cannot compute {spec}: {'; '.join(reasons)}")
    with cuda.OnDevice(device):  # (before the build: without CUDA, no nvcc run)
        return family.prepare(spec, config, device)


def prepare(spec: ProblemSpec, families: tuple[str, ...] = choose.NAMES,
            device: int | None = None) -> Prepared:
    """Kernel choice among the named ``families`` (:func:`cutlass_convt.choose.choose`) ->
    :func:`prepare_config` on CUDA device ``device`` (default: the current one).

    Raises :class:`~cutlass_convt.UnsupportedProblem` naming every family's reasons when none
    of ``families`` can compute ``spec``, and what :func:`prepare_config` raises.
    """
    return prepare_config(spec, choose.choose(spec, families), device)


_WARNED: set[str] = set()


def _fall_back(call: Call, precision: str, reason: str, backend: str,
               cuda_float32: bool) -> TorchRoute:
    """PyTorch's route for a call no family takes: with ``backend="auto"`` a
    ``RuntimeWarning`` once per reason, with a forced family or ``"cutlass"``
    :class:`UnsupportedProblem` naming the reason."""
    if backend != "auto":
        raise UnsupportedProblem(reason)
    if reason not in _WARNED:
        _WARNED.add(reason)
        warnings.warn(f"cutlass_convt: running PyTorch's conv_transpose2d instead of a CUTLASS "
                      f"kernel: {reason}", RuntimeWarning,
                      stacklevel=checks.user_stacklevel())
    return _torch_route(call, precision, reason, cuda_float32)


def route_call(input, weight, bias, stride, padding, output_padding, groups, dilation,
               precision, backend) -> Prepared | TorchRoute:
    """Validate a call (PyTorch's rules, :func:`cutlass_convt.args.check_call`) and decide
    where it runs: an empty batch and ``backend="torch"`` on PyTorch; tensors that are not on
    a CUDA device, and problems no family can compute or build, on PyTorch with ``"auto"``
    (a ``RuntimeWarning`` once per reason) or :class:`UnsupportedProblem` otherwise; the rest
    on the chosen family, prepared for the input's device."""
    check_choice(backend, "backend", BACKENDS)
    call = checks.check_call(input, weight, bias, stride, padding, output_padding, groups,
                             dilation)
    precision = checks.resolve_precision(precision)
    if call.in_shape[0] == 0 or backend == "torch":
        return _torch_route(call, precision, "", _cuda_float32(input))
    if input.device.type != "cuda":
        return _fall_back(call, precision, f"tensors on {input.device.type}: the kernels run "
                          "on CUDA devices", backend, False)
    spec = checks.spec_of_call(call, input, bias is not None, precision)
    return route(spec, backend, input.device.index, call, (input, weight, bias))


def route(spec: ProblemSpec, backend: str, device: int | None = None,
          call: Call | None = None, operands: tuple | None = None) -> Prepared | TorchRoute:
    """Where ``spec`` runs on CUDA device ``device`` (default: the current one): the best
    family that can compute it (``"cutlass"``; ``"auto"`` also takes PyTorch's route where the
    choice says PyTorch is faster, :func:`cutlass_convt.choose.choose_config`) or the named
    one, prepared; when
    none can, or its kernel cannot be built, PyTorch's route with ``"auto"`` (a
    ``RuntimeWarning`` once per reason) and :class:`UnsupportedProblem` or
    :class:`~cutlass_convt.BuildError` otherwise; ``"torch"``: PyTorch's. With ``"auto"``,
    the call's ``operands`` (input, weight, bias) and no tuning record of the problem on this
    machine, the choice is measured on them first (:func:`_measured`)."""
    if call is None:
        call = Call(spec.stride, spec.padding, spec.output_padding, spec.groups, spec.dilation,
                    spec.in_shape, spec.out_channels,
                    spec.kernel_size, spec.channels_last)
    cuda_float32 = spec.dtype == "float32"
    if backend == "torch":
        return _torch_route(call, spec.precision, "", cuda_float32)
    try:
        names = (backend,) if backend in choose.NAMES else choose.NAMES
        machine = _machine(device)
        chosen = choose.choose(spec, names, backend == "auto", machine)
        if (backend == "auto" and operands is not None and machine is not None
                and choose.recorded(spec, machine) is None):
            measured = _measured(spec, _device_index(device), call, operands, machine)
            if measured is not None:
                return measured
        if chosen is choose.TORCH:  # a speed choice: said at INFO, not warned
            _LOG.info("cutlass_convt: PyTorch's conv_transpose2d is faster for %s", spec)
            return _torch_route(call, spec.precision, "", cuda_float32)
        return prepare_config(spec, chosen, device)
    except UnsupportedProblem as e:
        return _fall_back(call, spec.precision, str(e), backend, cuda_float32)
    except BuildError as e:
        if backend != "auto":
            raise
        return _fall_back(call, spec.precision, f"the kernel could not be built ({e})", backend,
                          cuda_float32)


def _machine(device: int | None) -> choose.Machine | None:
    """:func:`cutlass_convt.measure.machine` of ``device`` (default: the current one), or None
    (the rules alone) where measuring is off, PyTorch has no CUDA device or the driver cannot
    describe it. Raises :class:`~cutlass_convt.env.ConfigError` for a bad
    ``$CUTLASS_CONVT_MEASURE``."""
    if measure.mode() == "off" or not torch.cuda.is_available():
        return None
    try:
        return measure.machine(_device_index(device))
    except cuda.CudaError as e:
        _LOG.info("cutlass_convt: the rules alone: this GPU cannot be described (%s)", e)
        return None


def _measured(spec: ProblemSpec, device: int, call: Call, operands: tuple,
              machine: choose.Machine) -> Prepared | TorchRoute | None:
    """The default choice for ``spec`` on CUDA device ``device``, measured on the call's own
    ``operands`` (input, weight, bias) where :func:`cutlass_convt.measure.may_measure` allows:
    each of :func:`cutlass_convt.choose.measured_candidates` that builds, and PyTorch's route,
    timed (:func:`cutlass_convt.measure.time_routes`); the winner
    (:func:`cutlass_convt.measure.winner`) is kept as the problem's tuning record on
    ``machine`` and returned. None (the rules decide, nothing recorded) where measuring is not
    allowed now or none of ours could be built (a later process tries again). Where the record
    cannot be written (a read-only or misconfigured cache), a warning says so once and the next
    new call signature of the problem measures again."""
    with torch.cuda.device(device):
        if not measure.may_measure(*operands):
            return None
        routes = {}
        for config in choose.measured_candidates(spec, measure.mode() == "exhaustive"):
            try:
                routes[config.name] = prepare_config(spec, config, device)
            except (UnsupportedProblem, BuildError) as e:  # timed without it
                _LOG.info("cutlass_convt: %s not measured: %s", config.name, e)
        if not routes:
            return None
        theirs = _torch_route(call, spec.precision, "", spec.dtype == "float32")
        x, w, b = operands
        timed = {name: functools.partial(run_prepared, p, x, w, b)
                 for name, p in routes.items()}
        timed[measure.TORCH] = functools.partial(run_torch, theirs, x, w, b)
        medians = measure.time_routes(timed)
    best = measure.winner(medians)
    record = {"source": "first use", "winner_name": best,
              **choose.winner_fields(choose.TORCH if best == measure.TORCH
                                     else routes[best].config),
              "results": [{"config": name, "median_ms": ms} for name, ms in medians.items()],
              "tuned_at": time.time()}
    try:
        choose.save_record(spec, machine, record)
    except (BuildError, OSError, env.ConfigError) as e:
        reason = f"its tuning record could not be written ({e})"
        if reason not in _WARNED:
            _WARNED.add(reason)
            warnings.warn(f"cutlass_convt: a measured choice is kept for this call signature "
                          f"only: {reason}", RuntimeWarning,
                          stacklevel=checks.user_stacklevel())
    _LOG.info("cutlass_convt: measured %s: %s", spec, medians)
    return theirs if best == measure.TORCH else routes[best]


def set_measuring(mode: str | None) -> None:
    """Set how the default choice measures new problems (:mod:`cutlass_convt.measure`):
    ``"on"``, ``"exhaustive"`` or ``"off"`` (the rules alone, no tuning record read or
    written); None: as ``$CUTLASS_CONVT_MEASURE`` says. Forgets the choices made so far
    (:func:`clear_caches`). Raises ValueError for another mode."""
    measure.set_mode(mode)
    clear_caches()


def clear_caches() -> None:
    """Forget what this process remembers of earlier calls: the arguments seen, the kernel
    choices, the tuning records read, the plans and the warnings given (not the loaded kernels,
    nor the kernel cache on disk), so that the next call of each problem chooses and plans
    again. Writing a tuning record calls it."""
    _SEEN.clear()
    _AUTOCAST.clear()
    if NATIVE:
        torch.ops.cutlass_convt._forget()
    _WARNED.clear()
    _prepare_config.cache_clear()
    choose.clear_cache()


# Calls seen before, by everything route_call reads: a hit skips validation and choice.
_SEEN: dict[tuple, Prepared | TorchRoute] = {}
_SEEN_MAX = 1024


def _signature(input, weight, bias, stride, padding, output_padding, groups, dilation,
               precision, backend):
    """Hashable summary of the arguments and of PyTorch's TF32 setting, or None when they are
    not all tensors with shapes and strides (then every call validates them). Layouts are part
    of it, so that a sparse tensor never hits a dense call's entry. The plain arguments enter
    by value and exact type: ``marshal``'s bytes (version 0: no references), which tag int,
    bool, float, str, None, tuple and list apart, so that ``1``, ``1.0`` and ``True`` stay
    apart; but it writes every bytes-like object (numpy scalars) with the code ``s``, untyped,
    so bytes holding an ``s`` fall back to ``repr`` (a str: never equal to the bytes), as do
    arguments it cannot write (an int subclass, a tensor). One function, no helpers: it runs
    on every call."""
    plain = (stride, padding, output_padding, groups, dilation)
    if (precision is None or type(precision) is str) and type(backend) is str:
        names = (precision, backend)  # as themselves: their letters would look like code s
    else:
        plain, names = (*plain, precision, backend), None
    try:
        exact = _dumps(plain, 0)
        if b"s" in exact:
            exact = repr(plain)
    except ValueError:
        exact = repr(plain)
    try:
        return (input.shape, input.stride(), input.dtype, input.device, input.layout,
                weight.shape, weight.stride(), weight.dtype, weight.device, weight.layout,
                None if bias is None else (bias.shape, bias.dtype, bias.device, bias.layout),
                exact, names, _tf32())
    except (AttributeError, TypeError, RuntimeError):  # RuntimeError: no strides (sparse CSR)
        return None


_dumps, _tf32 = marshal.dumps, checks.torch_conv_tf32


def _routed(input, weight, bias, stride, padding, output_padding, groups, dilation, precision,
            backend) -> Prepared | TorchRoute:
    """:func:`route_call`, remembered per argument signature."""
    key = _signature(input, weight, bias, stride, padding, output_padding, groups, dilation,
                     precision, backend)
    chosen = _SEEN.get(key) if key is not None else None
    if chosen is None:
        chosen = _route_new(key, input, weight, bias, stride, padding, output_padding, groups,
                            dilation, precision, backend)
    return chosen


def _route_new(key, *arguments) -> Prepared | TorchRoute:
    """:func:`route_call` of ``arguments``, remembered under ``key`` (None: not) where it is
    :func:`_settled`."""
    chosen = route_call(*arguments)
    if key is not None and _settled(arguments[-1]):
        _keep(_SEEN, key, chosen)
    return chosen


def _keep(table: dict, key, value) -> None:
    """``table[key] = value``, the table emptied first where it holds :data:`_SEEN_MAX`
    entries (a bound on what a process remembers of its calls)."""
    if len(table) >= _SEEN_MAX:
        table.clear()
    table[key] = value


def _settled(backend) -> bool:
    """Whether a call's route chosen now may be remembered for its signature (in this
    module's table and the C++ one): not with ``backend="auto"`` and measuring on while a CUDA
    graph is captured, where the choice takes the rules for want of a measurement
    (:func:`cutlass_convt.measure.may_measure`): the first call after the capture measures
    and is remembered. The cold path only; ``$CUTLASS_CONVT_MEASURE`` is read only while a
    graph is captured (a call that cannot measure never fails on its bad value)."""
    return not (backend == "auto" and _capturing() and measure.mode() != "off")


def run_torch(route: TorchRoute, input, weight, bias) -> torch.Tensor:
    """PyTorch's own transposed convolution (float32 on CUDA with TF32 on or off as the
    route's precision says: PyTorch's switch set for the call where it says otherwise), its
    result in :func:`~cutlass_convt.args.output_channels_last`'s
    memory format."""
    if route.switch:
        with torch_conv_precision(route.precision):
            y = route.conv(input, weight, bias)
    else:
        y = route.conv(input, weight, bias)
    if y.dim() == 4:
        return y if y.is_contiguous(memory_format=route.form) else y.contiguous(
            memory_format=route.form)
    batched = y.unsqueeze(0)
    if not batched.is_contiguous(memory_format=route.form):
        y = batched.contiguous(memory_format=route.form).squeeze(0)
    return y


def _cuda_float32(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" and t.dtype == torch.float32


def _differs(input: torch.Tensor, precision: str) -> bool:
    """Whether PyTorch's convolutions of ``input`` would now run in another precision than
    ``precision`` (float32 CUDA tensors only have one)."""
    return _cuda_float32(input) and checks.torch_conv_tf32() != (precision == "tf32")


def _in_precision(input: torch.Tensor, precision: str, fn):
    """``fn()``, PyTorch's TF32 switch set to ``precision`` around it where it differs."""
    if _differs(input, precision):
        with torch_conv_precision(precision):
            return fn()
    return fn()


def run_prepared(prepared: Prepared, input, weight, bias, record: bool = False):
    """Run a prepared kernel on tensors that match its problem (validated by the caller) on
    PyTorch's current stream; returns y in the problem's memory format (with ``record``: and
    the :class:`~cutlass_convt.program.Recorder` of its steps). Raises
    :class:`InvalidArgument` when the tensors are on another device than the one ``prepared``
    was planned for."""
    device = input.device.index
    if device != prepared.device:
        raise InvalidArgument(f"cutlass_convt: a problem planned for cuda:{prepared.device} "
                              f"run on cuda:{device}")
    stream = cuda.current_stream(device)
    batched = input if input.dim() == 4 else input.unsqueeze(0)
    ex = (program.Recorder(stream, batched, weight, bias) if record
          else program.Direct(stream))
    with cuda.OnDevice(device):
        y = prepared.family.run(prepared, ex, batched, weight, bias)
    if record:
        ex.result(y)
        return (y if input.dim() == 4 else y.squeeze(0)), ex
    return y if input.dim() == 4 else y.squeeze(0)


def forward(input, weight, bias, stride, padding, output_padding, groups, dilation, precision,
            backend) -> torch.Tensor:
    """The call without autograd: routed (remembered per signature) and run on the chosen
    family or on PyTorch. The op's CUDA and CPU kernel."""
    chosen = _routed(input, weight, bias, stride, padding, output_padding, groups, dilation,
                     precision, backend)
    remember = (_remember is not None and input.device.type == "cuda"
                and not torch._C._are_functorch_transforms_active() and _settled(backend))
    if isinstance(chosen, TorchRoute):
        if remember and not chosen.switch:
            # (the C++ table had no route for the call: it runs there from now on)
            _remember(input, weight, bias, stride, padding, output_padding, groups, dilation,
                      precision, backend, 0, chosen.form is torch.channels_last, [], None)
        return run_torch(chosen, input, weight, bias)
    if remember:
        # (the C++ table had no route for the call: it replays this one's steps from now on)
        y, recorded = run_prepared(chosen, input, weight, bias, record=True)
        _remember(input, weight, bias, stride, padding, output_padding, groups, dilation,
                  precision, backend, 1, False, recorded.steps,
                  torch.frombuffer(bytearray(recorded.blob), dtype=torch.uint8)
                  if recorded.blob else torch.empty(0, dtype=torch.uint8))
        return y
    return run_prepared(chosen, input, weight, bias)


# ----------------------------------------------------------------------------------------------
# The op: cutlass_convt::conv_transpose2d and its backward.

# The schemas, all defined here: the op and its backward; the same again as the Python cold
# path that the C++ kernels call (_route: a call the C++ table has no route for;
# _backward_switched: a backward that sets PyTorch's TF32 switch); the C++ table's
# _remember (a route for a call's signature, kind 0: PyTorch's, its result channels_last or
# not), _forget and _remembered.
_LIBRARY = torch.library.Library("cutlass_convt", "DEF")
_FORWARD_ARGUMENTS = ("Tensor input, Tensor weight, Tensor? bias, int[2] stride, int[2] padding, "
                      "int[2] output_padding, int groups, int[2] dilation, str? precision, "
                      "str backend")
_BACKWARD_SCHEMA = ("(Tensor grad_output, Tensor input, Tensor weight, bool bias, "
                    "int[2] stride, int[2] padding, int[2] output_padding, int groups, "
                    "int[2] dilation, str? precision, bool[3] output_mask) "
                    "-> (Tensor, Tensor, Tensor)")
for _name in ("conv_transpose2d", "_route"):
    _LIBRARY.define(f"{_name}({_FORWARD_ARGUMENTS}) -> Tensor")
for _name in ("conv_transpose2d_backward", "_backward_switched"):
    _LIBRARY.define(_name + _BACKWARD_SCHEMA)
_LIBRARY.define(f"_remember({_FORWARD_ARGUMENTS}, int kind, bool channels_last, int[] steps, "
                "Tensor? blob) -> ()")
_LIBRARY.define("_forget() -> ()")
_LIBRARY.define("_remembered() -> int")
OP = torch.ops.cutlass_convt.conv_transpose2d.default
BACKWARD_OP = torch.ops.cutlass_convt.conv_transpose2d_backward.default

# The C++ per-call path (extension.py), where it can be built and loaded: then it implements
# the op's CUDA, Autograd and autocast kernels and the backward's CUDA kernel, and the Python
# kernels below are registered for the other keys alone.
NATIVE = extension.load()
_remember = torch.ops.cutlass_convt._remember.default if NATIVE else None

_LIBRARY.impl("conv_transpose2d", forward, "CPU")
for _key in ("CUDA", "CPU"):
    _LIBRARY.impl("_route", forward, _key)
if not NATIVE:
    _LIBRARY.impl("conv_transpose2d", forward, "CUDA")


@torch.library.register_fake("cutlass_convt::conv_transpose2d")
def _fake(input, weight, bias, stride, padding, output_padding, groups, dilation, precision,
          backend):
    """The result's shape, dtype, device and strides (PyTorch's memory-format rule), for
    tracing and meta tensors."""
    batched = input.dim() == 4
    n, _, h, w = input.shape if batched else (1, *input.shape)
    size = [(i - 1) * s - 2 * p + d * (k - 1) + o + 1 for i, s, p, d, k, o in
            zip((h, w), stride, padding, dilation, weight.shape[2:], output_padding)]
    form = (torch.channels_last if checks.output_channels_last(input, weight)
            else torch.contiguous_format)
    y = torch.empty((n, weight.shape[1] * groups, *size), dtype=input.dtype,
                    device=input.device, memory_format=form)
    return y if batched else y.squeeze(0)


def _backward_impl(grad, input, weight, bias, stride, padding, output_padding, groups,
                   dilation, precision, output_mask):
    """PyTorch's ``aten.convolution_backward`` of the transposed convolution (float32 on CUDA
    in ``precision``; None: PyTorch's setting when it runs, as the forward op resolves it);
    gradients not asked for are empty tensors; grad_input in the input's memory format."""
    unbatched = input.dim() == 3
    x, g = (input.unsqueeze(0), grad.unsqueeze(0)) if unbatched else (input, grad)

    def backward():
        return torch.ops.aten.convolution_backward(
            g, x, weight, [weight.shape[1] * groups] if bias else None, stride, padding,
            dilation, True, output_padding, groups, list(output_mask))

    grad_x, grad_w, grad_b = _in_precision(input, checks.resolve_precision(precision), backward)
    empty = input.new_empty(0)
    if grad_x is not None:
        grad_x = grad_x.contiguous(memory_format=_memory_format_of(x))
        grad_x = grad_x.squeeze(0) if unbatched else grad_x
    return (empty if grad_x is None else grad_x, empty if grad_w is None else grad_w.contiguous(),
            empty if grad_b is None else grad_b)


def _memory_format_of(t: torch.Tensor) -> torch.memory_format:
    return torch.channels_last if checks._prefers_channels_last(t) else torch.contiguous_format


_LIBRARY.impl("conv_transpose2d_backward", _backward_impl, "CPU")
_LIBRARY.impl("_backward_switched", _backward_impl, "CUDA")
if not NATIVE:
    _LIBRARY.impl("conv_transpose2d_backward", _backward_impl, "CUDA")


@torch.library.register_fake("cutlass_convt::conv_transpose2d_backward")
def _backward_fake(grad, input, weight, bias, stride, padding, output_padding, groups,
                   dilation, precision, output_mask):
    empty = input.new_empty(0)
    x = input if input.dim() == 4 else input.unsqueeze(0)
    grad_x = torch.empty(x.shape, dtype=x.dtype, device=x.device,
                         memory_format=_memory_format_of(x))
    grad_x = grad_x if input.dim() == 4 else grad_x.squeeze(0)
    return (grad_x if output_mask[0] else empty,
            weight.new_empty(weight.shape) if output_mask[1] else empty,
            weight.new_empty(weight.shape[1] * groups) if output_mask[2] else empty)


def _setup_context(ctx, inputs, output):
    input, weight, bias, stride, padding, output_padding, groups, dilation, precision, _ = inputs
    ctx.save_for_backward(input, weight)
    ctx.arguments = (bias is not None, stride, padding, output_padding, groups, dilation,
                     precision)  # resolved when the backward runs, as the forward does


def _backward(ctx, grad):
    input, weight = ctx.saved_tensors
    mask = list(ctx.needs_input_grad[:3])
    grads = BACKWARD_OP(grad, input, weight, *ctx.arguments, mask)
    return (*(g if need else None for g, need in zip(grads, mask)),
            None, None, None, None, None, None, None)


if not NATIVE:
    torch.library.register_autograd("cutlass_convt::conv_transpose2d", _backward,
                                    setup_context=_setup_context, lib=_LIBRARY)


def _autocast(device_type: str):
    """An autocast kernel with PyTorch's policy for ``conv_transpose2d`` on ``device_type``:
    floating-point tensors but float64 computed in the autocast dtype."""
    key = torch._C.DispatchKey.AutocastCUDA if device_type == "cuda" else \
        torch._C.DispatchKey.AutocastCPU

    def kernel(input, weight, bias, *rest):
        cast = functools.partial(_autocast_cast, device_type,
                                 torch.get_autocast_dtype(device_type), False)
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(key)):
            return OP(cast(input), cast(weight), cast(bias), *rest)

    return kernel


def _autocast_cast(device_type: str, dtype: torch.dtype, stand_in: bool, t):
    """``t`` as PyTorch's autocast policy for ``conv_transpose2d`` on ``device_type`` hands it
    on (``lower_precision_fp``): a floating-point tensor but float64 on that device cast to
    ``dtype`` (``Tensor.to``: strides kept where dense), anything else as it is. With
    ``stand_in``, an uninitialised tensor of the cast's dtype and strides instead of the cast
    (no kernel: for a route decided while a CUDA graph is captured, which measures nothing)."""
    eligible = (t is not None and t.is_floating_point() and t.dtype != torch.float64
                and t.device.type == device_type)
    if not eligible:
        return t
    return torch.empty_like(t, dtype=dtype) if stand_in else t.to(dtype)


def _autocast_on(device_type: str) -> bool:
    """Whether autocast casts this call's tensors on ``device_type`` (one it covers, with
    autocast enabled there)."""
    return device_type in _AUTOCAST_DEVICES and torch.is_autocast_enabled(device_type)


def _capturing() -> bool:
    """Whether a CUDA graph is being captured on the current stream."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


if not NATIVE:
    _LIBRARY.impl("conv_transpose2d", _autocast("cuda"), "AutocastCUDA")
    _LIBRARY.impl("conv_transpose2d", _autocast("cpu"), "AutocastCPU")


def _eager(input, weight, bias) -> bool:
    """Whether PyTorch is neither tracing, transforming nor intercepting the call, so that
    :func:`forward` may run without the dispatcher: plain tensors (a Parameter weight and
    bias), no forward-mode AD level, no ``torch.compile``/``export``, ``jit.trace``,
    ``torch.func`` transform, dispatch or function mode (autocast may be on)."""
    return (type(input) is torch.Tensor and type(weight) in _PLAIN
            and (bias is None or type(bias) in _PLAIN) and forward_ad._current_level < 0
            and not _is_compiling() and not _is_tracing() and not _transforms_active()
            and not _dispatch_modes() and not _function_modes())


_PLAIN = (torch.Tensor, torch.nn.Parameter)
# (bound once: each attribute path costs the call's host time)
_is_compiling, _is_tracing = torch.compiler.is_compiling, torch._C._is_tracing
_transforms_active = torch._C._are_functorch_transforms_active
_dispatch_modes, _function_modes = (torch._C._len_torch_dispatch_stack,
                                    torch._C._len_torch_function_stack)
_AUTOCAST_DEVICES = ("cuda", "cpu")
# Whether autocast is on for any device (one C call; older PyTorch: CUDA's or the CPU's).
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None) or (
    lambda: any(torch.is_autocast_enabled(d) for d in _AUTOCAST_DEVICES))


def conv_transpose2d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                     stride=1, padding=0, output_padding=0, groups: int = 1, dilation=1, *,
                     precision: str | None = None, backend: str = "auto") -> torch.Tensor:
    """``torch.nn.functional.conv_transpose2d`` on kernels emitted, compiled and cached by
    cutlass_convt, as the op ``torch.ops.cutlass_convt.conv_transpose2d``.

    Args:
        input: (N, C_in, H_in, W_in) or unbatched (C_in, H_in, W_in), NCHW or channels_last,
            of any dtype and device ``F.conv_transpose2d`` takes: float32 CUDA tensors run on
            our kernels; float16 and bfloat16 CUDA tensors by default on the strip family's
            class and on the phase family with fewer than 32 output channels (else on
            PyTorch's faster kernels), on any family a backend names; every other dtype and
            device on PyTorch's implementation.
        weight: (C_in, C_out / groups, R, S), same dtype and device.
        bias: optional (C_out,), added in the kernel's epilogue.
        stride, padding, output_padding, dilation: int or (h, w) pair; groups: int. Same
            meaning, defaults and limits as PyTorch.
        precision: ``"tf32"`` (TF32 tensor cores, PyTorch's default for convolutions),
            ``"fp32"`` (3xTF32: fp32-accurate) or ``None`` (follow PyTorch's TF32 setting for
            convolutions, ``torch.backends.cudnn.conv.fp32_precision`` or the older
            ``torch.backends.cudnn.allow_tf32``). For float32 only: ignored for other dtypes
            (16-bit kernels sum in float32).
        backend: ``"auto"`` (the best kernel family that can compute the problem; otherwise
            PyTorch's own implementation, with a ``RuntimeWarning`` once per reason),
            ``"cutlass"`` (the best family or an error), a family's name (``"strip"``,
            ``"direct"``, ``"phase"``, ``"fprop_sm90"``, ``"dgrad"``: that family or an error), or
            ``"torch"``. The README lists what runs where.

    Returns:
        (N, C_out, H_out, W_out) of the input's dtype with ``H_out = (H_in - 1) * stride - 2 *
        padding + dilation * (R - 1) + output_padding + 1`` (likewise W_out), channels_last
        when the input or the weight is channels_last (PyTorch's rule), else NCHW.
        Differentiable in input, weight and bias: the backward is PyTorch's own
        (``aten.convolution_backward``, TF32 as ``precision`` says).

    Raises:
        TypeError where PyTorch raises TypeError (a value of the wrong type: ``stride=1.5``,
        ``padding=(1.0, 2)``), :class:`~cutlass_convt.InvalidArgument` (a ValueError and a
        RuntimeError) where PyTorch raises RuntimeError (a size argument of the wrong length,
        ``stride=(1, 2, 3)`` or ``padding=()``; invalid sizes; mismatched shapes, dtypes or
        devices): invalid arguments, before any GPU work.
        :class:`~cutlass_convt.UnsupportedProblem` (a NotImplementedError) when the requested
        family (for ``"cutlass"``: every family) cannot compute the problem, and
        :class:`~cutlass_convt.BuildError` when its kernel cannot be built (``"auto"`` runs
        PyTorch's implementation instead).

    The first call of a new kernel configuration compiles it with nvcc (2-30 s; a logged
    warning says so), unless it is in the kernel cache; later calls and processes reuse it.
    """
    if _eager(input, weight, bias):  # (_routed, inlined: each call layer costs host time)
        key = _signature(input, weight, bias, stride, padding, output_padding, groups,
                         dilation, precision, backend)
        if _any_autocast():  # validated and routed once per signature and autocast state
            device = input.device.type
            if key is not None and device in _AUTOCAST_DEVICES:  # (others: never cast)
                key = (key, _autocast_enabled(device), _autocast_dtype(device))
            found = _AUTOCAST.get(key) if key is not None else None
            if found is None:
                found = _autocast_new(key, input, weight, bias, stride, padding,
                                      output_padding, groups, dilation, precision, backend)
            if type(found) is TorchRoute:  # as eager: PyTorch's autocast casts, its autograd
                return run_torch(found, input, weight, bias)
            return OP(input, weight, bias, *found, backend)  # the op's autocast kernel casts
        chosen = _SEEN.get(key) if key is not None else None
        if chosen is None:
            chosen = _route_new(key, input, weight, bias, stride, padding, output_padding,
                                groups, dilation, precision, backend)
        if type(chosen) is TorchRoute:
            if not chosen.switch or not _needs_grad(input, weight, bias):
                return run_torch(chosen, input, weight, bias)  # PyTorch's autograd records it
        elif not NATIVE and not _needs_grad(input, weight, bias):
            return run_prepared(chosen, input, weight, bias)
        # (the backward keeps the call's precision)
        if NATIVE:  # the op in C++: its autograd (in the precision resolved now, as the
            # forward), its replay of the family's steps
            c = chosen.call if type(chosen) is TorchRoute else chosen.spec
            resolved = chosen.precision if type(chosen) is TorchRoute else c.precision
            return OP(input, weight, bias, list(c.stride), list(c.padding),
                      list(c.output_padding), c.groups, list(c.dilation), resolved, backend)
        return _Differentiable.apply(input, weight, bias, chosen, None)
    if _transforms_active() and _batched(input, weight, bias):  # torch.func.vmap
        return _vmapped(input, weight, bias, stride, padding, output_padding, groups, dilation,
                        precision, backend)
    if forward_ad._current_level >= 0:  # dual tensors: PyTorch's route carries the tangents
        return run_torch(route_call(input, weight, bias, stride, padding, output_padding,
                                    groups, dilation, precision, "torch"), input, weight, bias)
    call = _op_call(input, weight, bias, stride, padding, output_padding, groups, dilation,
                    precision, backend)
    if torch._C._are_functorch_transforms_active():  # (the op's autograd is not functorch's)
        return _Differentiable.apply(input, weight, bias, None, (
            stride, padding, output_padding, groups, dilation, precision, backend))
    return OP(input, weight, bias, list(call.stride), list(call.padding),
              list(call.output_padding), call.groups, list(call.dilation), precision, backend)


# Eager calls under autocast seen before, by _signature and the autocast state of the input's
# device: PyTorch's route of the cast tensors (one needing no switch of PyTorch's TF32 setting),
# else the op's size arguments, validated, and the precision resolved.
_AUTOCAST: dict[tuple, TorchRoute | tuple] = {}
_autocast_enabled, _autocast_dtype = torch.is_autocast_enabled, torch.get_autocast_dtype


def _autocast_new(key, input, weight, bias, stride, padding, output_padding, groups, dilation,
                  precision, backend) -> TorchRoute | tuple:
    """What an eager call under autocast runs, remembered under ``key`` (None: not): the route
    of its tensors as autocast casts them (:func:`_autocast_cast`), where that is PyTorch's
    and needs no switch (then PyTorch's own call under autocast computes exactly it: the same
    casts, cast cache and kernel); else the op's size arguments and resolved precision
    (PyTorch's rules, tensors of mixed floating-point dtypes allowed: the op's autocast kernel
    casts them). Raises what :func:`conv_transpose2d` raises for invalid arguments and
    unsupported forced families."""
    call = _op_call(input, weight, bias, stride, padding, output_padding, groups, dilation,
                    precision, backend)
    found = (list(call.stride), list(call.padding), list(call.output_padding), call.groups,
             list(call.dilation), checks.resolve_precision(precision))
    device = input.device.type
    cast = functools.partial(_autocast_cast, device, _autocast_dtype(device), _capturing()) if (
        _autocast_on(device)) else (lambda t: t)
    with torch.no_grad():
        chosen = _routed(cast(input), cast(weight), cast(bias), stride, padding,
                         output_padding, groups, dilation, precision, backend)
    if type(chosen) is TorchRoute and not chosen.switch:
        found = chosen
    if key is not None and _settled(backend):
        _keep(_AUTOCAST, key, found)
    return found


def _batched(*tensors) -> bool:
    """Whether a tensor is batched by ``torch.func.vmap`` at any level of its functorch
    wrappers (None entries allowed)."""
    functorch = torch._C._functorch
    for t in tensors:
        while t is not None and functorch.is_functorch_wrapped_tensor(t):
            if functorch.is_batchedtensor(t):
                return True
            t = functorch.get_unwrapped(t)
    return False


def _vmapped(input, weight, bias, stride, padding, output_padding, groups, dilation, precision,
             backend) -> torch.Tensor:
    """A call under ``torch.func.vmap``: PyTorch's own ``F.conv_transpose2d`` (its batching
    and autograd rules, its argument errors), in ``precision`` for float32 CUDA tensors. Raises
    ValueError for an unknown ``backend`` or ``precision``, :class:`UnsupportedProblem` for a
    backend other than ``"auto"`` or ``"torch"`` (the kernels take no batched tensors)."""
    check_choice(backend, "backend", BACKENDS)
    check_choice(precision, "precision", (*PRECISIONS, None))
    if backend not in ("auto", "torch"):
        raise UnsupportedProblem(f"backend={backend!r}: tensors batched by torch.func.vmap run "
                                 "on PyTorch's route only (backend 'auto' or 'torch')")
    return _in_precision(input, checks.resolve_precision(precision), lambda: F.conv_transpose2d(
        input, weight, bias, stride, padding, output_padding, groups, dilation))


def _op_call(input, weight, bias, stride, padding, output_padding, groups, dilation,
             precision, backend) -> Call:
    """A call to be made through the op, validated by PyTorch's rules before any dispatch
    (tensors of mixed floating-point dtypes allowed where autocast is on for the input's
    device: its kernel casts them); ``precision`` and ``backend`` checked here, not in the
    kernel. Raises what :func:`conv_transpose2d` raises for invalid arguments."""
    check_choice(backend, "backend", BACKENDS)
    autocast = isinstance(input, torch.Tensor) and _autocast_on(input.device.type)
    with warnings.catch_warnings():
        if not _is_compiling() and _is_tracing():  # (jit.trace's sizes are tensors: the
            # checks' branches are constants of the trace, and the op checks each replay's
            # tensors again; torch.compile traces no call of _is_tracing, a non-tensor op)
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
        call = checks.check_call(input, weight, bias, stride, padding, output_padding, groups,
                                 dilation, one_dtype=not autocast)
    check_choice(precision, "precision", (*PRECISIONS, None))
    return call


def _needs_grad(*tensors) -> bool:
    """Whether autograd records a call on ``tensors`` (None entries allowed)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


class _Differentiable(torch.autograd.Function):
    """The autograd of eager calls and of ``torch.func`` transforms: a forward on a prepared
    kernel or PyTorch's route (``chosen``; or routed from ``arguments``, the call's raw size
    arguments, precision and backend), and the op's backward
    (``cutlass_convt::conv_transpose2d_backward``: PyTorch's ``aten.convolution_backward`` with
    TF32 on or off as the precision says)."""

    @staticmethod
    def forward(input, weight, bias, chosen, arguments):
        if chosen is None:
            return forward(input, weight, bias, *arguments)
        if isinstance(chosen, TorchRoute):
            return run_torch(chosen, input, weight, bias)
        return run_prepared(chosen, input, weight, bias)

    @staticmethod
    def setup_context(ctx, inputs, output):
        input, weight, bias, chosen, arguments = inputs
        ctx.save_for_backward(input, weight)
        if isinstance(chosen, TorchRoute):
            c = chosen.call
            sizes = (c.stride, c.padding, c.output_padding, c.groups, c.dilation)
            precision = chosen.precision
        elif chosen is not None:
            s = chosen.spec
            sizes = (s.stride, s.padding, s.output_padding, s.groups, s.dilation)
            precision = s.precision
        else:
            sizes = checks.check_arguments(*arguments[:5])
            precision = checks.resolve_precision(arguments[5])
        stride, padding, output_padding, groups, dilation = sizes
        ctx.arguments = (bias is not None, list(stride), list(padding), list(output_padding),
                         groups, list(dilation), precision)

    @staticmethod
    def backward(ctx, grad):
        input, weight = ctx.saved_tensors
        mask = list(ctx.needs_input_grad[:3])  # input, weight, bias
        grads = BACKWARD_OP(grad, input, weight, *ctx.arguments, mask)
        return (*(g if need else None for g, need in zip(grads, mask)), None, None)
