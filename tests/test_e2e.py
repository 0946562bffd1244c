"""The end-to-end benchmark: the five decoders build and run at a tiny size with their public
models' output shapes and name their sources; ``bench --problem e2e`` refuses what it cannot
run with one line; on a GPU a two-trial run of one tiny model gives every mode's row."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cutlass_convt import decoders, e2e

ROOT = Path(__file__).parents[1]

# (output shapes at batch 2, the source each docstring names: repository and file)
EXPECTED = {
    "dcgan": ([(2, 3, 64, 64)], ("pytorch/examples", "dcgan/main.py")),
    "pix2pix": ([(2, 3, 256, 256)], ("junyanz/pytorch-CycleGAN-and-pix2pix",
                                     "models/networks.py")),
    "centernet": ([(2, 80, 128, 128), (2, 2, 128, 128), (2, 2, 128, 128)],
                  ("xingyizhou/CenterNet", "src/lib/models/networks/msra_resnet.py")),
    "maskrcnn": ([(2, 91, 28, 28)], ("pytorch/vision",
                                     "torchvision/models/detection/mask_rcnn.py")),
    "unet": ([(2, 2, 256, 256)], ("milesial/Pytorch-UNet", "unet/unet_model.py")),
}


def _env() -> dict:
    path = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    return {**os.environ, "PYTHONPATH": path}


@pytest.mark.parametrize("shrink", [16, 32])
@pytest.mark.parametrize("name", list(decoders.DECODERS))
def test_decoder_runs_on_cpu_with_its_output_shapes(name, shrink):
    """Each decoder, its hidden channels divided by ``shrink``, runs forward and backward on
    the CPU; its outputs have the public model's shapes (class counts and image sizes do not
    shrink) and every ConvTranspose2d gets a gradient."""
    model = decoders.DECODERS[name].build(shrink=shrink)
    inputs = decoders.example_inputs(model, 2, generator=torch.Generator().manual_seed(0))
    out = model(*inputs)
    outputs = list(out.values()) if isinstance(out, dict) else [out]
    assert [tuple(o.shape) for o in outputs] == EXPECTED[name][0]
    sum(o.square().mean() for o in outputs).backward()
    layers = [m for m in model.modules() if isinstance(m, torch.nn.ConvTranspose2d)]
    assert layers and all(m.weight.grad is not None and m.weight.grad.abs().sum() > 0
                          for m in layers), name


def test_public_widths():
    """At shrink 1 the layers have their public models' sizes."""
    def convts(name):
        model = decoders.DECODERS[name].build()
        return [(m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding)
                for m in model.modules() if isinstance(m, torch.nn.ConvTranspose2d)]

    k4 = ((4, 4), (2, 2), (1, 1))
    assert convts("dcgan") == [(100, 512, (4, 4), (1, 1), (0, 0)), (512, 256, *k4),
                               (256, 128, *k4), (128, 64, *k4), (64, 3, *k4)]
    assert convts("pix2pix") == [(512, 512, *k4), *[(1024, 512, *k4)] * 3, (1024, 256, *k4),
                                 (512, 128, *k4), (256, 64, *k4), (128, 3, *k4)]
    assert convts("centernet") == [(2048, 256, *k4), (256, 256, *k4), (256, 256, *k4)]
    k2 = ((2, 2), (2, 2), (0, 0))
    assert convts("maskrcnn") == [(256, 256, *k2)]
    assert convts("unet") == [(1024, 512, *k2), (512, 256, *k2), (256, 128, *k2), (128, 64, *k2)]
    unet = decoders.DECODERS["unet"].build()
    assert unet.input_shapes(4) == [(4, 1024, 16, 16), (4, 512, 32, 32), (4, 256, 64, 64),
                                    (4, 128, 128, 128), (4, 64, 256, 256)]


@pytest.mark.parametrize("name", list(decoders.DECODERS))
def test_decoder_names_its_source(name):
    """The class's docstring names the public repository and the file it follows."""
    model = decoders.DECODERS[name].build(shrink=64)
    doc = inspect.getdoc(type(model))
    for part in EXPECTED[name][1]:
        assert part in doc, (name, part)


def test_bench_e2e_without_a_gpu_exits_with_one_line(tmp_path):
    """Without a GPU, ``bench --problem e2e`` (and through ``scripts/bench.py``) exits 1 with
    the one-line message; bad --models or --modes, and --modes without e2e, are usage errors
    (status 2) before it."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    for command in ([sys.executable, "-m", "cutlass_convt", "bench"],
                    [sys.executable, str(ROOT / "scripts" / "bench.py")]):
        out = subprocess.run([*command, "--problem", "e2e", "--out", str(tmp_path)],
                             capture_output=True, text=True, env=_env())
        assert out.returncode == 1, out.stderr
        assert out.stderr == ("cutlass_convt: this benchmark needs a CUDA GPU, and none is "
                              "visible\n"), out.stderr
    command = [sys.executable, "-m", "cutlass_convt", "bench", "--out", str(tmp_path)]
    for args, message in ((["--problem", "e2e", "--models", "resnet"], "invalid choice"),
                          (["--problem", "e2e", "--modes", "fp64"], "invalid choice"),
                          (["--problem", "71", "--modes", "tf32"], "apply to --problem e2e"),
                          (["--problem", "e2e", "71"], "--problem e2e runs alone")):
        out = subprocess.run([*command, *args], capture_output=True, text=True, env=_env())
        assert out.returncode == 2 and message in out.stderr, (args, out.stderr)


def test_markdown_and_geometric_means():
    """The table has one line per row with its cells, and the geometric mean per mode over
    the models with the slowest one named."""
    rows = [{"model": "dcgan", "mode": "tf32", "eager_ms": 2.0, "converted_ms": 1.0,
             "ratio": 2.0, "out_rel": 1e-4, "eager_f64_rel": 2e-4, "converted_f64_rel": 3e-4},
            {"model": "unet", "mode": "tf32", "eager_ms": 1.0, "converted_ms": 2.0,
             "ratio": 0.5, "out_rel": 1e-4, "eager_f64_rel": 2e-4, "converted_f64_rel": 3e-4},
            {"model": "unet", "mode": "train-tf32", "eager_ms": 3.0, "converted_ms": 2.0,
             "ratio": 1.5, "out_rel": 5e-4, "grad_rel": 6e-4}]
    result = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0", "cudnn": 91900,
              "cutlass": "4.2.0.0", "conv_tf32": True, "matmul_precision": "highest",
              "trials": 20, "shrink": 1, "protocol": "p",
              "modes": {"tf32": e2e.MODES["tf32"].label,
                        "train-tf32": e2e.MODES["train-tf32"].label}, "rows": rows}
    assert e2e.geometric_means(result) == pytest.approx({"tf32": 1.0, "train-tf32": 1.5})
    text = e2e.markdown(result)
    assert text.startswith("End to end, eager against converted: NVIDIA H100 80GB HBM3, torch "
                           "2.11.0, cuDNN 91900")
    assert ("| unet | training step, TF32 | 3.000 | 2.000 | 1.50x | 5.0e-04 | 6.0e-04 |  |  |"
            in text.splitlines())
    assert ("| dcgan | inference, TF32, NCHW | 2.000 | 1.000 | 2.00x | 1.0e-04 |  | 2.0e-04 | "
            "3.0e-04 |" in text.splitlines())
    assert "| inference, TF32, NCHW | 1.00x | 0.50x (unet) |" in text.splitlines()


@pytest.mark.gpu
def test_e2e_smoke_on_the_gpu(tmp_path):
    """Two trials of the tiny Mask R-CNN head in every default mode through the command:
    one row per mode with positive times, small differences from eager, and the files."""
    out = subprocess.run([sys.executable, "-m", "cutlass_convt", "bench", "--problem", "e2e",
                          "--models", "maskrcnn", "--trials", "2", "--out", str(tmp_path)],
                         capture_output=True, text=True, env=_env(), timeout=900)
    assert out.returncode == 0, out.stderr
    import json

    result = json.loads((tmp_path / "e2e.json").read_text())
    assert [(r["model"], r["mode"]) for r in result["rows"]] == [
        ("maskrcnn", m) for m in e2e.DEFAULT_MODES]
    for row in result["rows"]:
        assert row["eager_ms"] > 0 and row["converted_ms"] > 0, row
        assert row["out_rel"] < 3e-2, row  # bf16 rows differ by bf16 rounding
        assert ("grad_rel" in row) == e2e.MODES[row["mode"]].train, row
    assert torch.cuda.get_device_name() in (tmp_path / "e2e.md").read_text()


@pytest.mark.gpu
def test_e2e_run_of_a_tiny_model():
    """:func:`cutlass_convt.e2e.run` with 2 trials on a tiny DCGAN in a TF32 mode: the row's
    converted output is within TF32 rounding of eager's, both near float64."""
    result = e2e.run(["dcgan"], ["tf32"], trials=2, shrink=16, batch=4, report=lambda line: None)
    (row,) = result["rows"]
    assert row["model"] == "dcgan" and row["mode"] == "tf32"
    assert row["out_rel"] < 1e-2 and row["converted_f64_rel"] < 1e-2, row
