"""Converted public models against PyTorch (GPU): torchvision's Mask R-CNN mask head and a
DCGAN generator, in eval and over a few training steps, each against a float64 copy trained
alongside: ours stays within twice PyTorch's own TF32 error of it."""

from __future__ import annotations

import copy

import pytest
import torch

import cutlass_convt
from cutlass_convt.benchmark import errors

pytestmark = pytest.mark.gpu


def _mask_head():
    torchvision = pytest.importorskip("torchvision")
    from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor

    return torch.nn.Sequential(MaskRCNNHeads(256, (256, 256, 256, 256), 1),
                               MaskRCNNPredictor(256, 256, 91)), (64, 256, 14, 14), torchvision


def _dcgan():
    def up(c_in, c_out, stride=2, padding=1):
        return [torch.nn.ConvTranspose2d(c_in, c_out, 4, stride, padding, bias=False),
                torch.nn.BatchNorm2d(c_out), torch.nn.ReLU(True)]

    layers = [*up(100, 512, 1, 0), *up(512, 256), *up(256, 128), *up(128, 64),
              torch.nn.ConvTranspose2d(64, 3, 4, 2, 1, bias=False), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers), (32, 100, 1, 1), None


@pytest.mark.parametrize("make", [_mask_head, _dcgan], ids=["maskrcnn_mask_head", "dcgan"])
def test_converted_model_matches_pytorch_in_eval_and_training(make):
    torch.manual_seed(0)
    model, shape, _ = make()
    model = model.cuda()
    reference = copy.deepcopy(model).double()  # the float64 truth
    theirs = copy.deepcopy(model)              # PyTorch, TF32 (its default for convolutions)
    assert len(cutlass_convt.convert_(model)) >= 1
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
                  for m in (model, theirs, reference)]
    for step in range(4):
        x = torch.randn(shape, device="cuda")
        outs = []
        for m, opt in zip((model, theirs, reference), optimizers):
            out = m(x.double() if m is reference else x)
            out.square().mean().backward()
            opt.step()
            opt.zero_grad()
            outs.append(out.detach())
        ours_err, theirs_err = errors(outs[0], outs[2]), errors(outs[1], outs[2])
        assert ours_err["rel"] <= max(2 * theirs_err["rel"], 1e-5), (step, ours_err, theirs_err)
    for (name, p), q, r in zip(model.named_parameters(), theirs.parameters(),
                               reference.parameters()):
        ours_err, theirs_err = errors(p, r), errors(q, r)
        assert ours_err["rel"] <= max(2 * theirs_err["rel"], 1e-5), (name, ours_err, theirs_err)
    model.eval(), theirs.eval(), reference.eval()
    with torch.no_grad():
        x = torch.randn(shape, device="cuda")
        ours_err = errors(model(x), reference(x.double()))
        theirs_err = errors(theirs(x), reference(x.double()))
    assert ours_err["rel"] <= max(2 * theirs_err["rel"], 1e-5), (ours_err, theirs_err)
