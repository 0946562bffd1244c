"""Model conversion: convert_ swaps the class of each torch.nn.ConvTranspose2d in place
(Parameters, optimizer state, hooks and parametrizations survive), revert_ undoes it, warmup
runs one forward pass without side effects (CPU)."""

from __future__ import annotations

import warnings

import pytest
import torch

import cutlass_convt


@pytest.fixture(autouse=True)
def quiet_fallback():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # CPU tensors: PyTorch's route
        yield


class Decoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up1 = torch.nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.up2 = torch.nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1,
                                            bias=False)
        self.circular = torch.nn.ConvTranspose2d(2, 2, 3, padding=1)
        self.circular.padding_mode = "circular"  # (PyTorch refuses it in forward; skipped)

    def forward(self, x):
        return self.up2(torch.relu(self.bn(self.up1(x))))


class Subclass(torch.nn.ConvTranspose2d):
    def forward(self, x, output_size=None):
        return super().forward(x, output_size) * 2


def test_convert_keeps_the_objects_and_revert_undoes_it():
    torch.manual_seed(0)
    model = Decoder()
    x = torch.randn(2, 8, 5, 6)
    expected = model(x)
    params = {name: p for name, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(x).sum().backward()
    optimizer.step()
    state = {name: optimizer.state[p]["momentum_buffer"].clone() for name, p in params.items()
             if p in optimizer.state}
    assert "up1.weight" in state
    calls = []
    model.up1.register_forward_hook(lambda module, args, out: calls.append(out.shape))
    up1 = model.up1

    names = cutlass_convt.convert_(model, precision="fp32")
    assert names == ["up1", "up2"]  # not the circular one
    assert isinstance(model.up1, cutlass_convt.ConvTranspose2d) and model.up1 is up1
    assert type(model.circular) is torch.nn.ConvTranspose2d
    assert (model.up1.precision, model.up1.backend) == ("fp32", "auto")
    assert {name: p for name, p in model.named_parameters()} == params  # the same objects
    for name, buffer in state.items():
        assert optimizer.state[params[name]]["momentum_buffer"].equal(buffer)
    model.eval()
    with torch.no_grad():
        out = model(x)
    assert calls[-1] == out.shape[:1] + (4, 10, 12)  # the hook still runs
    model.train()
    optimizer.step()  # the optimizer still drives the converted model's parameters

    assert cutlass_convt.revert_(model) == ["up1", "up2"]
    assert type(model.up1) is torch.nn.ConvTranspose2d and model.up1 is up1
    assert not hasattr(model.up1, "precision")
    assert {name: p for name, p in model.named_parameters()} == params
    assert expected.shape == out.shape


def test_convert_filters_and_skips_subclasses():
    model = torch.nn.Sequential(torch.nn.ConvTranspose2d(4, 4, 3), Subclass(4, 4, 3),
                                torch.nn.ConvTranspose2d(4, 4, 3))
    names = cutlass_convt.convert_(model, filter_fn=lambda module, name: name != "2",
                                   backend="torch")
    assert names == ["0"]
    assert type(model[1]) is Subclass and type(model[2]) is torch.nn.ConvTranspose2d
    assert cutlass_convt.convert_(model) == ["2"]  # already converted ones are kept
    assert cutlass_convt.convert_(torch.nn.ConvTranspose2d(2, 2, 1)) == [""]
    with pytest.raises(ValueError, match="backend must be one of"):
        cutlass_convt.convert_(model, backend="cutlas")
    for function in (cutlass_convt.convert_, cutlass_convt.revert_, cutlass_convt.warmup):
        for wrong in ("model", torch.randn(2), [model]):  # AttributeError before
            with pytest.raises(TypeError, match=r"takes a torch\.nn\.Module, got "):
                function(wrong)


def test_convert_keeps_parametrizations():
    torch.manual_seed(0)
    layer = torch.nn.utils.parametrizations.weight_norm(torch.nn.ConvTranspose2d(4, 3, 3))
    x = torch.randn(1, 4, 5, 5)
    expected = layer(x)
    original = layer.parametrizations.weight.original0
    assert cutlass_convt.convert_(layer) == [""]
    assert isinstance(layer, cutlass_convt.ConvTranspose2d)
    assert torch.nn.utils.parametrize.is_parametrized(layer, "weight")
    assert layer.parametrizations.weight.original0 is original
    torch.testing.assert_close(layer(x), expected)
    cutlass_convt.revert_(layer)
    assert not isinstance(layer, cutlass_convt.ConvTranspose2d)
    torch.testing.assert_close(layer(x), expected)


@pytest.mark.parametrize("order", ["parametrize-convert", "convert-parametrize"])
def test_parametrizations_come_off_after_convert_and_after_revert(order):
    """remove_parametrizations lands on our class after convert_ and on torch's after
    revert_, whether the layer was parametrized before or after convert_."""
    torch.manual_seed(0)
    parametrize = torch.nn.utils.parametrizations.weight_norm
    layer = torch.nn.ConvTranspose2d(4, 3, 3)
    x = torch.randn(1, 4, 5, 5)
    if order == "parametrize-convert":
        layer = parametrize(layer)
        cutlass_convt.convert_(layer)
    else:
        cutlass_convt.convert_(layer)
        layer = parametrize(layer)
    expected = layer(x)
    torch.nn.utils.parametrize.remove_parametrizations(layer, "weight")
    assert type(layer) is cutlass_convt.ConvTranspose2d and layer.backend == "auto"
    torch.testing.assert_close(layer(x), expected)
    layer = parametrize(layer)
    assert cutlass_convt.revert_(layer) == [""]
    assert isinstance(layer, torch.nn.ConvTranspose2d)
    assert not isinstance(layer, cutlass_convt.ConvTranspose2d)
    torch.testing.assert_close(layer(x), expected)
    torch.nn.utils.parametrize.remove_parametrizations(layer, "weight")
    assert type(layer) is torch.nn.ConvTranspose2d
    torch.testing.assert_close(layer(x), expected)


def test_warmup_runs_without_side_effects():
    torch.manual_seed(0)
    model = Decoder()
    cutlass_convt.convert_(model)
    model.train()
    model.bn.eval()  # a submodule's own mode survives too
    mean = model.bn.running_mean.clone()
    cutlass_convt.warmup(model, torch.randn(2, 8, 5, 6))
    assert model.training and not model.bn.training and model.up1.training
    assert torch.equal(model.bn.running_mean, mean)
