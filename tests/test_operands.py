"""The operand contract at the kernel boundary: every family prepares x, the filter, bias and y
from any tensor PyTorch accepts (NCHW, channels_last, slices with storage offsets, views,
strided biases) and hands a kernel only operands packed as it reads them
(:func:`cutlass_convt.families.base.address`). CPU: the contract check and the filter
transforms on every weight layout; GPU: every family x dtype x operand layout, forced and
``auto``, against float64 with poisoned outputs."""

from __future__ import annotations

import dataclasses
import os
import types

import pytest
import torch
import torch.nn.functional as F

import cutlass_convt
from cutlass_convt import choose, ops, program
from cutlass_convt.args import output_channels_last
from cutlass_convt.benchmark import SIXTEEN_TORCH_FACTOR, errors, sixteen_bound_failure
from cutlass_convt.families.base import Prepared
from cutlass_convt.program import OperandError, address

from helpers import (
    BIAS_FORMS,
    INPUT_FORMS,
    WEIGHT_FORMS,
    check,
    fresh_generator,
    make_bias,
    make_input,
    make_weight,
    poison_allocator,
    spec_of,
)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


# ----------------------------------------------------------------------------------------------
# CPU


def test_address_accepts_only_the_packed_operand():
    """A packed, aligned operand of the right shape and dtype gives its address; every other
    one raises OperandError before any launch: another shape, dtype, layout, a non-packed
    view, a misaligned address."""
    x = torch.randn(2, 8, 5, 6)
    assert address("x", x, (2, 8, 5, 6), torch.float32, 4) == x.data_ptr()
    cl = x.contiguous(memory_format=torch.channels_last)
    assert address("x", cl, (2, 8, 5, 6), torch.float32, 4, True) == cl.data_ptr()
    misaligned = torch.randn(2 * 8 * 5 * 6 + 1)[1:].view(2, 8, 5, 6)
    bad = [(x, (2, 8, 5, 7), torch.float32, 4, False), (x, (2, 8, 5, 6), torch.float16, 4,
                                                        False),
           (x, (2, 8, 5, 6), torch.float32, 4, True), (cl, (2, 8, 5, 6), torch.float32, 4,
                                                       False),
           (x[:, :, :, :5], (2, 8, 5, 5), torch.float32, 4, False),
           (torch.randn(1).expand(8), (8,), torch.float32, 4, False),
           (misaligned, (2, 8, 5, 6), torch.float32, 16, False)]
    for t, shape, dtype, alignment, channels_last in bad:
        with pytest.raises(OperandError, match="operand x"):
            address("x", t, shape, dtype, alignment, channels_last)
    assert issubclass(OperandError, RuntimeError)


# (shape as helpers.spec_of takes it, without bias) of one small problem class each family
# takes, by the backend that forces it
CLASSES = {
    "strip": (2, 32, 32, 12, 16, (3, 3), 1, 1, 1, 0, 1),
    "direct": (2, 16, 24, 10, 12, (3, 5), 1, (1, 2), 1, 0, 1),
    "fprop_sm90": (2, 32, 32, 9, 12, (3, 3), 1, 1, 1, 0, 1),
    "fprop_sm90 k=s": (3, 32, 16, 7, 6, (2, 2), 2, 0, 1, 0, 1),
    "phase": (2, 16, 24, 9, 10, (4, 4), 2, 1, 1, 0, 2),
    "dgrad": (2, 8, 12, 7, 9, (3, 3), 2, 1, 1, 1, 2),
}
# the math of a run: precision ("tf32": TF32, "fp32": 3xTF32) and dtype
MATHS = {"tf32": ("tf32", "float32"), "fp32": ("fp32", "float32"),
         "bf16": ("tf32", "bfloat16"), "fp16": ("tf32", "float16")}


def class_spec(cls: str, math: str, bias: bool = False, channels_last: bool = False):
    precision, dtype = MATHS[math]
    return dataclasses.replace(spec_of((*CLASSES[cls], bias), precision, channels_last),
                               dtype=dtype)


def backend_of(cls: str) -> str:
    return cls.split()[0]


MATRIX = [(cls, math) for cls in CLASSES for math in MATHS
          if not choose.family(backend_of(cls)).unsupported_reasons(class_spec(cls, math))]


def test_matrix_covers_every_family_and_dtype():
    """Each family with every dtype and precision it takes: strip and phase all four,
    fprop_sm90 TF32 and 16-bit in both forms, direct and dgrad TF32 and 3xTF32."""
    taken: dict[str, set] = {}
    for cls, math in MATRIX:
        taken.setdefault(cls, set()).add(math)
    assert taken == {"strip": set(MATHS), "phase": set(MATHS),
                     "fprop_sm90": {"tf32", "bf16", "fp16"},
                     "fprop_sm90 k=s": {"tf32", "bf16", "fp16"},
                     "direct": {"tf32", "fp32"}, "dgrad": {"tf32", "fp32"}}
    assert {backend_of(cls) for cls in CLASSES} == set(choose.NAMES)


class _Recorder:
    """A stand-in for a loaded kernel (and the layout passes): records the addresses each
    launch would get."""

    def __init__(self):
        self.launches = []

    def run(self, *arguments):
        self.launches.append(arguments)

    def transpose(self, *arguments):
        self.launches.append(arguments)


@pytest.mark.parametrize("bias", BIAS_FORMS)
@pytest.mark.parametrize("weight_form", WEIGHT_FORMS)
@pytest.mark.parametrize("input_form", INPUT_FORMS)
@pytest.mark.parametrize("cls, math", MATRIX, ids=[f"{c}-{m}" for c, m in MATRIX])
def test_family_prepares_every_operand_layout(cls, math, input_form, weight_form, bias):
    """On the CPU, each family's run on operands in every layout PyTorch allows hands its
    kernels (recorders here) only operands that pass the contract (:func:`address`): a
    packed filter of any weight, a packed bias of a strided view, x packed and aligned for
    TMA. Before the contract, fprop_sm90 handed a channels_last weight's strided view to the
    kernel at kernel_size == stride."""
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    dtype = DTYPES[MATHS[math][1]]
    x = make_input(class_spec(cls, math).in_shape, input_form, dtype, gen)
    wt = make_weight(class_spec(cls, math).weight_shape, weight_form, dtype, gen)
    b = make_bias(class_spec(cls, math).out_channels, bias, dtype, gen)
    spec = class_spec(cls, math, b is not None, output_channels_last(x, wt))
    family = choose.family(backend_of(cls))
    config = family.candidates(spec)[0]
    assert family.config_reasons(spec, config) == []
    kernel, passes = _Recorder(), _Recorder()
    plan = types.SimpleNamespace(passes=passes, filter_elements=4096, problem=None,
                                 launches=())
    recorder = program.Recorder(0, x, wt, b)
    y = family.run(Prepared(spec, config, family, kernel, plan, 0), recorder, x, wt, b)
    assert len(kernel.launches) == 1
    # every address handed to the kernel is a recorded tensor's (a replay can find it), but
    # a configuration without bias may get 0 for it
    addresses = [a for a in kernel.launches[0] if isinstance(a, int) and a > 4096]
    assert addresses and all(isinstance(a, program.Address) for a in addresses), addresses
    assert y.shape == spec.out_shape and y.dtype == dtype
    assert y.is_contiguous(memory_format=torch.channels_last if spec.channels_last
                           else torch.contiguous_format)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["forced", "auto"])
@pytest.mark.parametrize("bias", BIAS_FORMS)
@pytest.mark.parametrize("weight_form", WEIGHT_FORMS)
@pytest.mark.parametrize("input_form", INPUT_FORMS)
@pytest.mark.parametrize("cls, math", MATRIX, ids=[f"{c}-{m}" for c, m in MATRIX])
def test_every_operand_layout(cls, math, input_form, weight_form, bias, backend):
    """Fresh random operands in the given layouts, poisoned output memory, the family forced
    or the default choice: the result has PyTorch's dtype, shape and strides and is within
    the precision's bounds against float64 (16-bit: twice PyTorch's own error and the
    rounding model)."""
    spec = class_spec(cls, math)
    precision, dtype = MATHS[math][0], DTYPES[MATHS[math][1]]
    gen, seed = fresh_generator()
    x = make_input(spec.in_shape, input_form, dtype, gen)
    wt = make_weight(spec.weight_shape, weight_form, dtype, gen)
    b = make_bias(spec.out_channels, bias, dtype, gen)
    kwargs = dict(stride=spec.stride, padding=spec.padding,
                  output_padding=spec.output_padding, groups=spec.groups,
                  dilation=spec.dilation)
    theirs = F.conv_transpose2d(x, wt, b, **kwargs)
    chosen = backend_of(cls) if backend == "forced" else "auto"
    route = ops.route_call(x, wt, b, *kwargs.values(), precision, chosen)
    poison_allocator(64 * 2**20)
    ours = cutlass_convt.conv_transpose2d(x, wt, b, precision=precision, backend=chosen,
                                          **kwargs)
    assert ours.dtype == dtype and ours.shape == theirs.shape
    assert ours.stride() == theirs.stride(), (ours.stride(), theirs.stride())
    assert backend == "auto" or not isinstance(route, ops.TorchRoute)  # forced: ours ran
    if dtype == torch.float32:
        check(ours, x, wt, b, precision, seed, **kwargs)
        return
    ref = F.conv_transpose2d(x.double(), wt.double(), None if b is None else b.double(),
                             **kwargs)
    err, torch_rel = errors(ours, ref), errors(theirs, ref)["rel"]
    if isinstance(route, ops.TorchRoute):
        # PyTorch's own kernel: with a bias its bf16 error measured up to 2.4e-3 on these
        # classes (H100), above the rounding model that bounds our kernels; bound by its own
        assert err["rel"] <= SIXTEEN_TORCH_FACTOR * torch_rel, (seed, err, torch_rel)
    else:
        failure = sixteen_bound_failure(err, MATHS[math][1], torch_rel)
        assert failure is None, (seed, failure)


def test_a_configuration_built_for_another_problem_is_refused():
    """``prepare_config`` refuses, before any build or GPU work, a configuration whose bound
    fields differ from the problem's: another dtype, layout or SM, direct's 16-byte NCHW loads
    on rows whose width is not a multiple of 4, dgrad's unity-stride kernel at stride 2."""
    strip = class_spec("strip", "tf32")
    direct = class_spec("direct", "tf32")
    dgrad = class_spec("dgrad", "tf32")
    cases = [("strip", strip, dataclasses.replace(strip, channels_last=True)),
             ("strip", strip, dataclasses.replace(strip, dtype="bfloat16")),
             ("phase", class_spec("phase", "bf16"), class_spec("phase", "fp16")),
             ("fprop_sm90", class_spec("fprop_sm90 k=s", "tf32"),
              class_spec("fprop_sm90 k=s", "tf32", True)),
             ("direct", direct, dataclasses.replace(direct, in_size=(10, 13))),
             ("dgrad", dgrad, dataclasses.replace(dgrad, stride=(1, 1), output_padding=(0, 0)))]
    for name, built_for, problem in cases:
        family = choose.family(name)
        config = family.candidates(built_for)[0]
        assert family.config_reasons(built_for, config) == []
        assert family.config_reasons(problem, config), (config.name, problem)
        with pytest.raises(cutlass_convt.UnsupportedProblem, match="cannot compute"):
            ops.prepare_config(problem, config, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not ops.NATIVE, reason="the C++ per-call path is not loaded")
@pytest.mark.parametrize("bias", BIAS_FORMS)
@pytest.mark.parametrize("weight_form", WEIGHT_FORMS)
@pytest.mark.parametrize("input_form", INPUT_FORMS)
@pytest.mark.parametrize("cls, math", MATRIX, ids=[f"{c}-{m}" for c, m in MATRIX])
def test_replayed_programs_match(cls, math, input_form, weight_form, bias):
    """The op through the dispatcher, the family forced: the first call of a signature runs
    in Python and records its steps, the second (fresh operands of the same layouts, poisoned
    output memory) replays them in C++ without entering Python, within the precision's bounds
    against float64."""
    from test_extension import _python_calls

    ops.clear_caches()  # (the C++ table too: the first call records)
    spec = class_spec(cls, math)
    precision, dtype = MATHS[math][0], DTYPES[MATHS[math][1]]
    sizes = ([*spec.stride], [*spec.padding], [*spec.output_padding], spec.groups,
             [*spec.dilation])
    for call in ("records", "replays"):
        gen, seed = fresh_generator()
        x = make_input(spec.in_shape, input_form, dtype, gen)
        wt = make_weight(spec.weight_shape, weight_form, dtype, gen)
        b = make_bias(spec.out_channels, bias, dtype, gen)
        poison_allocator(64 * 2**20)
        found = []
        entered = _python_calls(lambda: found.append(
            ops.OP(x, wt, b, *sizes, precision, backend_of(cls))))
        ours = found[0]
        assert (entered == []) == (call == "replays"), (call, entered[:5])
        kwargs = dict(zip(("stride", "padding", "output_padding", "groups", "dilation"), sizes))
        assert_within_bounds(ours, x, wt, b, math, (call, seed), **kwargs)


def assert_within_bounds(ours, x, wt, b, math: str, where, **kwargs) -> None:
    """``ours`` against float64 of ``conv_transpose2d(x, wt, b, **kwargs)`` within the bounds
    of ``math`` (float32: :func:`helpers.check`; 16-bit: twice PyTorch's own error and the
    rounding model); ``where`` names the case in a failure."""
    assert ours.dtype == x.dtype, (where, ours.dtype, x.dtype)
    if ours.dtype == torch.float32:
        check(ours, x, wt, b, MATHS[math][0], where, **kwargs)
        return
    ref = F.conv_transpose2d(x.double(), wt.double(), None if b is None else b.double(),
                             **kwargs)
    theirs = F.conv_transpose2d(x, wt, b, **kwargs)
    failure = sixteen_bound_failure(errors(ours, ref), MATHS[math][1],
                                    errors(theirs, ref)["rel"])
    assert failure is None, (where, failure)


@pytest.mark.gpu
@pytest.mark.parametrize("cls, math", MATRIX, ids=[f"{c}-{m}" for c, m in MATRIX])
def test_a_weight_written_in_place_is_read_on_the_next_call(cls, math):
    """No prepared filter outlives the weight's values: a module's weight written in place
    between calls through ``weight.data`` (which leaves ``weight._version`` unchanged) and
    under ``torch.no_grad`` is what the next call computes with, on the Python path, on the C++
    replay of the call's signature and in a CUDA graph captured before the write (the family
    forced, against float64)."""
    spec = class_spec(cls, math, bias=True)
    dtype = DTYPES[MATHS[math][1]]
    gen, seed = fresh_generator()
    layer = cutlass_convt.ConvTranspose2d(
        spec.in_channels, spec.out_channels, spec.kernel_size, spec.stride, spec.padding,
        spec.output_padding, spec.groups, True, spec.dilation, precision=MATHS[math][0],
        backend=backend_of(cls), device="cuda", dtype=dtype)
    x = make_input(spec.in_shape, "nchw", dtype, gen)
    kwargs = dict(stride=spec.stride, padding=spec.padding, output_padding=spec.output_padding,
                  groups=spec.groups, dilation=spec.dilation)

    def judged(out, step):
        assert_within_bounds(out, x, layer.weight.detach(), layer.bias.detach(), math,
                             (step, seed), **kwargs)

    with torch.no_grad():
        for step in ("records", "replays"):
            judged(layer(x), step)
        version = layer.weight._version
        layer.weight.data.copy_(make_weight(spec.weight_shape, "contiguous", dtype, gen))
        judged(layer(x), "after a write through .data")
        assert layer.weight._version == version  # the write PyTorch does not count
        layer.weight.mul_(-0.5)
        judged(layer(x), "after an in-place write")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            layer(x)  # warm-up on the capture's stream
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = layer(x)
        layer.weight.data.copy_(make_weight(spec.weight_shape, "contiguous", dtype, gen))
        graph.replay()
        judged(captured, "a graph replayed after a write through .data")
