"""The transposed-convolution parts of five public models, rebuilt from their public definitions
for the end-to-end benchmark (:mod:`cutlass_convt.e2e`): the same layers, in the same order, with
the same initialisation, at the sizes their authors run them. Each class names its source
(repository and file). Skip connections and backbone features come in as inputs (random tensors
of the right shapes, :func:`example_inputs`), so that only the decoder runs.

Every constructor takes ``shrink`` (default 1, the public model): every hidden channel count is
divided by it (at least 1; inputs such as DCGAN's ``nz`` and outputs such as class counts stay),
so that tests can run the same graphs on a CPU in milliseconds.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


def _narrow(channels: int, shrink: int) -> int:
    """``channels // shrink``, at least 1."""
    return max(1, channels // shrink)


def _kaiming_fan_out(module: nn.Module) -> None:
    """torchvision's initialisation of its detection heads: Kaiming-normal weights (fan out,
    ReLU), zero biases, for every convolution of ``module``."""
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)


class DCGANGenerator(nn.Module):
    """DCGAN's generator, from pytorch/examples ``dcgan/main.py`` (``Generator``, with its
    ``weights_init``): five ConvTranspose2d (k4; s1 p0, then s2 p1; no bias), BatchNorm and ReLU
    between them, Tanh at the end. Input: noise (N, nz, 1, 1); output: images (N, nc, 64, 64)."""

    def __init__(self, nz: int = 100, ngf: int = 64, nc: int = 3, shrink: int = 1):
        super().__init__()
        ngf = _narrow(ngf, shrink)
        self.nz = nz
        widths = [nz, ngf * 8, ngf * 4, ngf * 2, ngf]
        layers = []
        for i, (c_in, c_out) in enumerate(zip(widths, widths[1:])):
            layers += [nn.ConvTranspose2d(c_in, c_out, 4, 1 if i == 0 else 2, 0 if i == 0 else 1,
                                          bias=False), nn.BatchNorm2d(c_out), nn.ReLU(True)]
        self.main = nn.Sequential(*layers, nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),
                                  nn.Tanh())
        for m in self.modules():  # weights_init
            if isinstance(m, nn.ConvTranspose2d):
                nn.init.normal_(m.weight, 0.0, 0.02)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.normal_(m.weight, 1.0, 0.02)
                nn.init.zeros_(m.bias)

    def input_shapes(self, batch: int) -> list[tuple[int, ...]]:
        return [(batch, self.nz, 1, 1)]

    def forward(self, noise: torch.Tensor) -> torch.Tensor:
        return self.main(noise)


class Pix2PixUnetDecoder(nn.Module):
    """The up path of pix2pix's ``unet_256`` generator, from junyanz/pytorch-CycleGAN-and-pix2pix
    ``models/networks.py`` (``UnetGenerator`` of ``UnetSkipConnectionBlock``; BatchNorm, so no
    bias but in the outermost layer; dropout off, so that two copies of the model compute the
    same thing): from the innermost block out, each block's up path is ReLU, ConvTranspose2d(k4,
    s2, p1) and BatchNorm, then the block's input (the skip) is concatenated in front; the
    outermost block ends in ReLU, ConvTranspose2d(2 ngf -> 3, k4 s2 p1, bias) and Tanh.

    Inputs (:meth:`input_shapes`): the innermost down convolution's output (N, 8 ngf, 1, 1) and
    the seven skips from the deepest, (N, 8 ngf, 2, 2) ... (N, ngf, 128, 128); output
    (N, 3, 256, 256)."""

    def __init__(self, ngf: int = 64, output_nc: int = 3, shrink: int = 1):
        super().__init__()
        ngf = _narrow(ngf, shrink)
        # (outer_nc, inner_nc) of the blocks from the innermost out, as UnetGenerator stacks them
        blocks = [(ngf * 8, ngf * 8)] * 4 + [(ngf * 4, ngf * 8), (ngf * 2, ngf * 4), (ngf, ngf * 2)]
        self.ups = nn.ModuleList()
        for i, (outer, inner) in enumerate(blocks):
            c_in = inner if i == 0 else inner * 2  # the innermost takes no concatenation
            # (in place but on the innermost, whose input is the caller's tensor)
            self.ups.append(nn.Sequential(
                nn.ReLU(i > 0), nn.ConvTranspose2d(c_in, outer, 4, 2, 1, bias=False),
                nn.BatchNorm2d(outer)))
        self.outermost = nn.Sequential(nn.ReLU(True),
                                       nn.ConvTranspose2d(ngf * 2, output_nc, 4, 2, 1),
                                       nn.Tanh())
        self.skip_channels = [outer for outer, _ in blocks]
        self.bottom_channels = ngf * 8

    def input_shapes(self, batch: int) -> list[tuple[int, ...]]:
        skips = [(batch, c, 2 ** (i + 1), 2 ** (i + 1)) for i, c in enumerate(self.skip_channels)]
        return [(batch, self.bottom_channels, 1, 1), *skips]

    def forward(self, bottom: torch.Tensor, *skips: torch.Tensor) -> torch.Tensor:
        x = bottom
        for up, skip in zip(self.ups, skips):
            x = torch.cat([skip, up(x)], 1)  # UnetSkipConnectionBlock: cat([x, model(x)], 1)
        return self.outermost(x)


class CenterNetHead(nn.Module):
    """CenterNet's ResNet deconvolution head and its output heads, from xingyizhou/CenterNet
    ``src/lib/models/networks/msra_resnet.py`` (``_make_deconv_layer`` with three 4x4 layers of
    256 filters, no bias, BatchNorm momentum 0.1, ReLU; then one head per output: Conv2d 3x3 to
    ``head_conv`` (64 for ResNets) with bias, ReLU, Conv2d 1x1; ``hm`` 80 classes, ``wh`` 2,
    ``reg`` 2). Input: ResNet-50's last feature map (N, 2048, 16, 16) of a 512 x 512 image;
    output: ``{"hm": (N, 80, 128, 128), "wh": (N, 2, ...), "reg": (N, 2, ...)}``."""

    def __init__(self, inplanes: int = 2048, filters: int = 256, head_conv: int = 64,
                 heads: dict[str, int] | None = None, feature: int = 16, shrink: int = 1):
        super().__init__()
        inplanes, filters = _narrow(inplanes, shrink), _narrow(filters, shrink)
        head_conv = _narrow(head_conv, shrink)
        self.inplanes, self.feature = inplanes, feature
        layers = []
        for c_in in (inplanes, filters, filters):
            layers += [nn.ConvTranspose2d(c_in, filters, 4, 2, 1, 0, bias=False),
                       nn.BatchNorm2d(filters, momentum=0.1), nn.ReLU(True)]
        self.deconv_layers = nn.Sequential(*layers)
        self.heads = nn.ModuleDict({
            name: nn.Sequential(nn.Conv2d(filters, head_conv, 3, padding=1), nn.ReLU(True),
                                nn.Conv2d(head_conv, outputs, 1))
            for name, outputs in sorted((heads or {"hm": 80, "wh": 2, "reg": 2}).items())})

    def input_shapes(self, batch: int) -> list[tuple[int, ...]]:
        return [(batch, self.inplanes, self.feature, self.feature)]

    def forward(self, features: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.deconv_layers(features)
        return {name: head(x) for name, head in self.heads.items()}


class MaskRCNNMaskHead(nn.Module):
    """Mask R-CNN's mask branch after RoIAlign, from pytorch/vision
    ``torchvision/models/detection/mask_rcnn.py`` (``MaskRCNNHeads``: four Conv2d 3x3 of 256
    with bias and ReLU; ``MaskRCNNPredictor``: ConvTranspose2d(256, 256, 2, 2), ReLU, Conv2d 1x1
    to 91 classes; torchvision's Kaiming initialisation). Input: the RoIs' features
    (R, 256, 14, 14), R RoIs as the batch; output: mask logits (R, 91, 28, 28)."""

    def __init__(self, channels: int = 256, num_classes: int = 91, roi: int = 14,
                 shrink: int = 1):
        super().__init__()
        channels = _narrow(channels, shrink)
        self.channels, self.roi = channels, roi
        convs = []
        for _ in range(4):
            convs += [nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(True)]
        self.mask_head = nn.Sequential(*convs)
        self.mask_predictor = nn.Sequential(nn.ConvTranspose2d(channels, channels, 2, 2),
                                            nn.ReLU(True), nn.Conv2d(channels, num_classes, 1))
        _kaiming_fan_out(self)

    def input_shapes(self, batch: int) -> list[tuple[int, ...]]:
        return [(batch, self.channels, self.roi, self.roi)]

    def forward(self, rois: torch.Tensor) -> torch.Tensor:
        return self.mask_predictor(self.mask_head(rois))


def _double_conv(c_in: int, c_out: int) -> nn.Sequential:
    """milesial/Pytorch-UNet ``unet/unet_parts.py`` ``DoubleConv``: twice Conv2d 3x3 (no bias),
    BatchNorm, ReLU."""
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out),
                         nn.ReLU(True), nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
                         nn.BatchNorm2d(c_out), nn.ReLU(True))


class UNetUp(nn.Module):
    """``Up`` of milesial/Pytorch-UNet ``unet/unet_parts.py`` with ``bilinear=False``:
    ConvTranspose2d(c_in, c_in // 2, 2, 2), padding to the skip's size, the skip concatenated in
    front, ``DoubleConv(c_in, c_out)``."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.up = nn.ConvTranspose2d(c_in, c_in // 2, 2, 2)
        self.conv = _double_conv(c_in, c_out)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        x = self.up(x)
        dy, dx = skip.shape[2] - x.shape[2], skip.shape[3] - x.shape[3]
        x = F.pad(x, [dx // 2, dx - dx // 2, dy // 2, dy - dy // 2])
        return self.conv(torch.cat([skip, x], dim=1))


class UNetUpPath(nn.Module):
    """The up path of milesial/Pytorch-UNet ``unet/unet_model.py`` (``UNet`` with
    ``bilinear=False``): ``up1``..``up4`` (1024 -> 512 -> 256 -> 128 -> 64 channels) and
    ``OutConv`` (Conv2d 1x1) to ``n_classes``. Inputs: the bottom feature (N, 1024, image/16,
    image/16) and the skips from the deepest, (N, 512, image/8, image/8) ... (N, 64, image,
    image); output (N, n_classes, image, image)."""

    def __init__(self, n_classes: int = 2, image: int = 256, shrink: int = 1):
        super().__init__()
        widths = [_narrow(c, shrink) for c in (1024, 512, 256, 128, 64)]
        self.widths, self.image = widths, image
        self.ups = nn.ModuleList(UNetUp(c_in, c_out) for c_in, c_out in zip(widths, widths[1:]))
        self.outc = nn.Conv2d(widths[-1], n_classes, 1)

    def input_shapes(self, batch: int) -> list[tuple[int, ...]]:
        return [(batch, c, self.image >> (4 - i), self.image >> (4 - i))
                for i, c in enumerate(self.widths)]

    def forward(self, bottom: torch.Tensor, *skips: torch.Tensor) -> torch.Tensor:
        x = bottom
        for up, skip in zip(self.ups, skips):
            x = up(x, skip)
        return self.outc(x)


@dataclasses.dataclass(frozen=True)
class Decoder:
    """One benchmark model: its name, how to build it (``build(shrink=...)``, keyword
    arguments as the class takes them) and the batch its users run."""

    name: str
    build: Callable[..., nn.Module]
    batch: int


# Batches as the models are run: DCGAN's training batch; pix2pix trains at batch 1, 8 makes a
# step long enough to time; CenterNet's ResNet recipes use 16 per GPU at 512 x 512; Mask R-CNN
# keeps 100 detections for the mask head at inference; Pytorch-UNet's default batch is 1, 4 is
# its users' common choice on one GPU.
DECODERS = {d.name: d for d in (
    Decoder("dcgan", DCGANGenerator, 128),
    Decoder("pix2pix", Pix2PixUnetDecoder, 8),
    Decoder("centernet", CenterNetHead, 16),
    Decoder("maskrcnn", MaskRCNNMaskHead, 100),
    Decoder("unet", UNetUpPath, 4),
)}


def example_inputs(model: nn.Module, batch: int, device="cpu",
                   generator: torch.Generator | None = None) -> tuple[torch.Tensor, ...]:
    """Random float32 inputs (standard normal) of ``model``'s input shapes at ``batch``, on
    ``device``; ``generator`` (on that device) makes them repeatable."""
    return tuple(torch.randn(shape, device=device, generator=generator)
                 for shape in model.input_shapes(batch))
