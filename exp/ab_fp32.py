"""A/B: fp32 (3xTF32) direct configs on problem 71 (not part of the repo)."""
import sys
from cutlass_convt.spec import DirectConfig
from cutlass_convt import build
V = [("mma_sync", (8, 64), 4, 2, 1, 0), ("wgmma", (4, 64), 2, 2, 1, 4), ("wgmma", (2, 64), 2, 3, 2, 4)]
def configs():
    return [DirectConfig("fp32", cl, 32, 32, (3, 3), t, m, s, 4, 90, math, g, p)
            for cl in (False, True) for math, t, m, s, g, p in V]
if sys.argv[1] == "build":
    for c in configs():
        a = build.build(c)
        print(c.name, c.shared_bytes, a.path.name, *[l.strip() for l in open(a.path / "build.log") if "registers" in l or "spill" in l])
    sys.exit()
import torch
from cutlass_convt import ops, benchmark
torch.manual_seed(0)
x = torch.rand(8, 32, 512, 1024, device="cuda")
w = torch.randn(32, 32, 3, 3, device="cuda") / 17
ref = torch.nn.functional.conv_transpose2d(x.double(), w.double())
for cl in (False, True):
    xi = x.contiguous(memory_format=torch.channels_last) if cl else x
    spec = ops.problem_spec(xi, w, None, precision="fp32") if "precision" in ops.problem_spec.__code__.co_varnames else None
    for c in configs():
        if c.channels_last != cl: continue
        import dataclasses
        sp = dataclasses.replace(ops.problem_spec(xi, w, None), precision="fp32")
        p = ops.prepare_config(sp, c)
        out = ops.run_prepared(p, xi, w, None)
        e = benchmark.errors(out, ref)
        t = benchmark.cuda_time_ms(lambda: ops.run_prepared(p, xi, w, None))["median"]
        print(f"{c.name:66s} {t:.4f} ms rel {e['rel']:.3e} max {e['max_abs']:.3e}", flush=True)
