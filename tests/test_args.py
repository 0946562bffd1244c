"""Arguments: PyTorch's rules for conv_transpose2d's arguments, the errors raised and the
output shapes (CPU), and that cached calls are still checked (GPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import cutlass_convt
from cutlass_convt.args import check_call, problem_spec, resolve_precision
from cutlass_convt.spec import ProblemSpec, conv_transpose_output_size

from helpers import pairs, small


def _call(input=None, weight=None, **kwargs):
    input = torch.rand(2, 4, 5, 6) if input is None else input
    weight = torch.rand(4, 3, 3, 3) if weight is None else weight
    return cutlass_convt.conv_transpose2d(input, weight, **kwargs)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 2), c_in=st.integers(1, 5), c_out=st.integers(1, 5),
       h=st.integers(1, 7), w=st.integers(1, 7), kernel=pairs, stride=pairs, dilation=pairs,
       padding=st.tuples(st.integers(0, 3), st.integers(0, 3)), data=st.data())
def test_output_shape_matches_torch(n, c_in, c_out, h, w, kernel, stride, dilation, padding, data):
    output_padding = tuple(data.draw(st.integers(0, max(s, d) - 1))
                           for s, d in zip(stride, dilation))
    spec = ProblemSpec(batch=n, in_channels=c_in, out_channels=c_out, in_size=(h, w),
                       kernel_size=kernel, stride=stride, padding=padding,
                       output_padding=output_padding, dilation=dilation, groups=1, bias=False,
                       channels_last=False, precision="tf32", arch=90)
    x, wt = torch.rand(n, c_in, h, w), torch.rand(c_in, c_out, *kernel)
    try:
        expected = F.conv_transpose2d(x, wt, None, stride, padding, output_padding, 1,
                                      dilation).shape
    except RuntimeError:  # torch refuses (output too small): so must we
        assert min(spec.out_size) < 1
        return
    assert spec.out_shape == tuple(expected)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(input=[1.0]), TypeError, "input must be a torch.Tensor"),
    (dict(input=torch.rand(2, 4, 5, 6, dtype=torch.float64)), ValueError, "one dtype"),
    (dict(weight=torch.rand(4, 3, 3, 3).half()), ValueError, "weight is torch.float16 but"),
    (dict(bias=torch.rand(3, dtype=torch.float64)), ValueError, "bias is torch.float64 but"),
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
    (dict(padding=(1, 2, 3)), ValueError, "expected padding to be a single int or a list of 2"),
    (dict(precision="bf16"), ValueError, "precision must be one of"),
    (dict(precision="TF32"), ValueError, "precision must be one of"),
    (dict(backend="triton"), ValueError, "backend must be one of"),
])
def test_bad_arguments_raise(kwargs, error, match):
    with pytest.raises(error, match=match):
        _call(**kwargs)


def _raised(function) -> Exception | None:
    try:
        function()
    except Exception as e:  # the test compares what was raised
        return e
    return None


@pytest.mark.parametrize("name", ["stride", "padding", "output_padding", "dilation"])
@pytest.mark.parametrize("value", [
    (1, 2, 3), [1, 2, 3], (1, 1, 1, 1), (), [], torch.Size([1, 1, 1]), (torch.tensor(1), 1, 1),
    (1,), [1], torch.Size([1]), (1.0, 2), (1, 2, 3.0), (True, 1), 1.5, 2.0, "2", None, True,
    ((1, 2),), range(1, 3), torch.tensor([1, 2]),
], ids=repr)
def test_size_argument_forms_raise_what_torch_raises(name, value):
    """A size argument of the wrong length (a tuple or list of 3, 4 or 0 ints) is a
    RuntimeError in PyTorch and InvalidArgument (a RuntimeError) here; a value of the wrong
    type (floats, bools, strings, None, nested tuples, tensors) a TypeError in both; what
    PyTorch accepts computes PyTorch's values. The function is compared with
    ``F.conv_transpose2d``, the module with ``nn.ConvTranspose2d`` (whose constructor turns
    any iterable, a range or a tensor, into a tuple)."""
    x, w = torch.rand(2, 4, 5, 6), torch.rand(4, 3, 3, 3)
    kwargs = {name: value, **({"stride": 3} if name == "output_padding" else {})}

    def modules(cls):
        torch.manual_seed(0)
        return cls(4, 3, 3, **kwargs)(x)

    for reference, ours in ((lambda: F.conv_transpose2d(x, w, **kwargs),
                             lambda: _call(x, w, **kwargs)),
                            (lambda: modules(torch.nn.ConvTranspose2d),
                             lambda: modules(cutlass_convt.ConvTranspose2d))):
        expected, raised = _raised(reference), _raised(ours)
        if expected is None:
            assert raised is None, f"torch accepts {kwargs}, we raised {raised!r}"
            torch.testing.assert_close(ours(), reference())
        elif isinstance(expected, RuntimeError):
            assert isinstance(raised, cutlass_convt.InvalidArgument), f"{kwargs}: {raised!r}"
            assert f"expected {name} to be a single int or a list of 2 ints" in str(raised)
        else:
            assert isinstance(raised, TypeError) and not isinstance(raised, RuntimeError), \
                f"{kwargs}: torch {expected!r}, we {raised!r}"


def test_int_like_arguments_are_accepted_as_torch_does():
    np = pytest.importorskip("numpy")
    x, w = torch.rand(2, 4, 5, 6), torch.rand(4, 3, 3, 3)
    for kwargs in (dict(stride=(2,)), dict(stride=np.int64(2)), dict(padding=[1]),
                   dict(groups=np.int32(1)), dict(dilation=(np.int64(2), 1))):
        expected = F.conv_transpose2d(x, w, **kwargs)  # torch accepts them, and so do we
        assert torch.equal(_call(x, w, backend="torch", **kwargs), expected)


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


def test_a_cached_call_still_refuses_a_sparse_bias(fake_cuda):
    x, w = torch.empty(2, 4, 5, 5, device="cuda"), torch.empty(4, 8, 3, 3, device="cuda")
    dense = torch.empty(8, device="cuda")
    sparse = torch.sparse_coo_tensor(torch.zeros(1, 1, dtype=torch.long, device="cuda"),
                                     torch.ones(1, device="cuda"), (8,))
    cutlass_convt.conv_transpose2d(x, w, dense, backend="torch")  # the arguments are cached
    with pytest.raises(TypeError, match="bias must be a dense"):
        cutlass_convt.conv_transpose2d(x, w, sparse, backend="torch")


def test_precision_follows_cudnn_allow_tf32(monkeypatch):

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    assert resolve_precision(None) == "tf32"
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    assert resolve_precision(None) == "fp32"
    assert resolve_precision("tf32") == "tf32"


def test_problem_specs_describe_cuda_tensors_only():
    with pytest.raises(ValueError, match="describes CUDA tensors"):
        problem_spec(torch.rand(4, 5, 6), torch.rand(4, 3, 3, 3))


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
        check_call(*args)
    except (TypeError, ValueError) as e:
        assert expected is None, f"torch accepts {args[3:]}, we refused: {e}"
    else:
        assert expected is not None, f"torch refuses {args[3:]}, we accepted them"


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
    if expected is None:
        with pytest.raises(ValueError):
            ours(x, output_size=size)
    else:
        assert ours(x, output_size=size).shape == expected


@pytest.mark.gpu
def test_seen_arguments_are_still_checked():
    """The per-signature fast path must not let through what the slow path refuses."""
    x = torch.randn(1, 4, 6, 6, device="cuda")
    w = torch.randn(4, 4, 3, 3, device="cuda")
    cutlass_convt.conv_transpose2d(x, w, stride=1, precision="fp32")
    with pytest.raises(TypeError, match="stride must be an int"):
        cutlass_convt.conv_transpose2d(x, w, stride=1.0, precision="fp32")
    with pytest.raises(ValueError, match="one dtype"):
        cutlass_convt.conv_transpose2d(x.double(), w, precision="fp32")


@pytest.mark.gpu
def test_mixed_devices_raise_before_gpu_work():
    x = torch.randn(1, 4, 5, 5, device="cuda")
    with pytest.raises(ValueError, match="weight is on cpu but input is on cuda"):
        cutlass_convt.conv_transpose2d(x, torch.randn(4, 4, 3, 3))
    with pytest.raises(ValueError, match="bias is on cpu but input is on cuda"):
        cutlass_convt.conv_transpose2d(x, torch.randn(4, 4, 3, 3, device="cuda"), torch.randn(4))


def test_seen_arguments_are_still_checked_on_the_cpu():
    """The per-signature fast path keeps equal values of other types apart: after a valid
    call, the same values as floats, bools, a string or numpy arrays are refused as on a
    first call, and a numpy integer runs as the int does."""
    np = pytest.importorskip("numpy")
    x, w = torch.rand(1, 4, 5, 6), torch.rand(4, 3, 3, 3)
    expected = F.conv_transpose2d(x, w, stride=(2, 2), groups=1)
    torch.testing.assert_close(_call(x, w, stride=(2, 2), groups=1), expected)
    for kwargs in (dict(stride=(2.0, 2)), dict(stride=(2, 2.0)), dict(groups=True),
                   dict(groups=1.0), dict(stride=np.array([2])), dict(stride=np.float64(2)),
                   dict(stride=b"\x02\0\0\0\0\0\0\0"), dict(stride="2")):
        with pytest.raises(TypeError):
            _call(x, w, **{"stride": (2, 2), "groups": 1, **kwargs})
    torch.testing.assert_close(_call(x, w, stride=np.int64(2), groups=np.int64(1)), expected)
    torch.testing.assert_close(_call(x, w, stride=[2, 2], groups=1), expected)
