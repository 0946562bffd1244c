"""First-use measuring (cutlass_convt.measure): the records' keys, their invalidation by a
changed machine, the switch, the rule that capture and tracing never measure, the winner's
rule, and (GPU) a recorded choice followed and a stale one measured again."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest
import torch

import cutlass_convt
from cutlass_convt import choose, env, measure, ops, problems

from helpers import MACHINE, fresh_generator, problem71


@pytest.fixture
def measuring(tmp_path, monkeypatch):
    """An empty kernel cache, measuring on, no choice remembered before or after."""
    monkeypatch.setenv(env.CACHE_DIR_VARIABLE, str(tmp_path / "cache"))
    monkeypatch.setenv(env.MEASURE_VARIABLE, "on")
    cutlass_convt.clear_caches()
    yield
    measure.set_mode(None)
    cutlass_convt.clear_caches()


def other(field: str, value) -> choose.Machine:
    return tuple((k, value if k == field else v) for k, v in MACHINE)


def test_a_record_holds_for_its_problem_on_its_machine(measuring):
    """The record's name changes with every field of the problem and of the machine (GPU, SM
    count, memory clock, driver, PyTorch, cuDNN, CUTLASS); a record written on one machine is
    followed there and nowhere else (a changed GPU or version gets the rules' pick, and
    measures again)."""
    spec = problems.find("kernelbench-71").spec("tf32", 90)
    path = choose.record_path(spec, MACHINE)
    assert choose.record_path(spec, tuple(MACHINE)) == path
    changed = {field: other(field, value + 1 if type(value) is int else value + "x")
               for field, value in MACHINE}
    names = {choose.record_path(spec, m).name for m in changed.values()}
    assert len(names) == len(MACHINE) and path.name not in names
    assert choose.record_path(dataclasses.replace(spec, batch=spec.batch + 1), MACHINE) != path
    default = choose.choose_config(spec, torch_ok=True, machine=MACHINE)
    assert default is not choose.TORCH
    choose.save_record(spec, MACHINE, {"winner_family": "torch", "winner": {},
                                       "winner_name": "torch"})
    saved = json.loads(path.read_text())
    assert saved["machine"] == [list(p) for p in MACHINE]
    assert choose.machine_fields(saved["machine"]) == MACHINE
    assert choose.choose_config(spec, torch_ok=True, machine=MACHINE) is choose.TORCH
    assert choose.recorded(spec, MACHINE) is choose.TORCH
    for m in changed.values():
        assert choose.recorded(spec, m) is None
        assert choose.choose_config(spec, torch_ok=True, machine=m) == default
    assert choose.choose_config(spec, torch_ok=True, machine=None) == default  # rules only
    for bad in ([["gpu", 1.5]], [["gpu"]], {"gpu": "x"}, [[1, "x"]], [["gpu", None]]):
        with pytest.raises(TypeError):
            choose.machine_fields(bad)


def test_the_switch(monkeypatch, measuring):
    """``$CUTLASS_CONVT_MEASURE`` (on by default; a bad value names the variable) and
    :func:`cutlass_convt.set_measuring`, which takes precedence, forgets the choices made and
    refuses an unknown mode; off: the rules alone, no record read."""
    monkeypatch.delenv(env.MEASURE_VARIABLE)
    assert measure.mode() == "on"
    for mode in measure.MODES:
        monkeypatch.setenv(env.MEASURE_VARIABLE, mode)
        assert measure.mode() == mode
    monkeypatch.setenv(env.MEASURE_VARIABLE, "sometimes")
    with pytest.raises(env.ConfigError, match=env.MEASURE_VARIABLE):
        measure.mode()
    # a call that cannot measure (CPU tensors) never reads it: it raised ConfigError before
    x, w = torch.randn(1, 4, 5, 5), torch.randn(4, 2, 3, 3)
    with warnings.catch_warnings():  # (PyTorch's route: its warning comes once a process)
        warnings.simplefilter("ignore", RuntimeWarning)
        torch.testing.assert_close(cutlass_convt.conv_transpose2d(x, w, stride=2),
                                   torch.nn.functional.conv_transpose2d(x, w, stride=2))
    cutlass_convt.set_measuring("exhaustive")
    assert measure.mode() == "exhaustive"
    with pytest.raises(ValueError, match="one of on, exhaustive, off"):
        cutlass_convt.set_measuring("fast")
    assert measure.mode() == "exhaustive"
    cutlass_convt.set_measuring(None)
    monkeypatch.setenv(env.MEASURE_VARIABLE, "on")
    assert measure.mode() == "on"
    # off: no machine, so no record is read and none is measured
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(measure, "machine", lambda device: MACHINE)
    assert ops._machine(0) == MACHINE
    forgotten = []
    monkeypatch.setattr(choose, "clear_cache", lambda: forgotten.append(True))
    cutlass_convt.set_measuring("off")
    assert forgotten and ops._machine(0) is None


def test_capture_tracing_and_unreal_tensors_never_measure(measuring, monkeypatch):
    """No measuring while a CUDA graph is captured, while torch.compile traces, under a
    functorch transform, on fake, CPU or subclassed tensors, nor with measuring off."""
    capturing, compiling, on_cuda = [False], [False], [True]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    monkeypatch.setattr(measure, "_on_cuda", lambda t: on_cuda[0])
    plain = torch.empty(1)
    # (torch.compiler.is_compiling stood in for only here: a functorch or fake-tensor call
    # while it is replaced has Dynamo keep the stand-in, and later compiles break graphs)
    with monkeypatch.context() as compiler:
        compiler.setattr(torch.compiler, "is_compiling", lambda: compiling[0])
        assert measure.may_measure(plain, plain, None)
        capturing[0] = True
        assert not measure.may_measure(plain, plain, None)
        capturing[0], compiling[0] = False, True
        assert not measure.may_measure(plain, plain, None)
        compiling[0] = False
    seen = []
    torch.func.vmap(lambda t: seen.append(measure.may_measure(t)) or t)(torch.ones(2, 1))
    assert seen == [False]

    class Sub(torch.Tensor):
        pass

    assert not measure.may_measure(torch.ones(1).as_subclass(Sub))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        assert not measure.may_measure(torch.empty(1))
    on_cuda[0] = False
    assert not measure.may_measure(plain)  # a CPU tensor
    on_cuda[0] = True
    assert measure.may_measure(plain)
    measure.set_mode("off")
    assert not measure.may_measure(plain)


def test_a_route_chosen_while_capturing_is_not_remembered(measuring, monkeypatch):
    """A call first seen while a CUDA graph is captured takes the rules (no measuring there)
    but is not remembered for its signature with measuring on: the first call after the
    capture routes again (and measures). With measuring off, or a named backend, it is."""
    capturing, routed = [True], []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    monkeypatch.setattr(ops, "route_call", lambda *arguments: routed.append(arguments[-1]) or
                        ops.TorchRoute.__new__(ops.TorchRoute))
    x, w = torch.empty(1, 4, 5, 5), torch.empty(4, 4, 3, 3)

    def call(backend="auto"):
        ops._routed(x, w, None, 1, 0, 0, 1, 1, None, backend)

    for _ in range(2):
        call()
    assert routed == ["auto", "auto"]
    capturing[0] = False
    for _ in range(2):
        call()
    assert routed == ["auto"] * 3
    capturing[0] = True
    for _ in range(2):
        call("cutlass")
    assert routed == ["auto"] * 3 + ["cutlass"]
    monkeypatch.setenv(env.MEASURE_VARIABLE, "off")
    cutlass_convt.clear_caches()
    for _ in range(2):
        call()
    assert routed == ["auto"] * 3 + ["cutlass", "auto"]


def test_pytorch_wins_unless_ours_is_clearly_faster():
    """The fastest of ours where it takes at most OURS_BY of PyTorch's time, else PyTorch."""
    t = measure.TORCH
    assert measure.winner({"a": 0.5, "b": 0.4, t: 1.0}) == "b"
    assert measure.winner({"a": 0.99, t: 1.0}) == t
    assert measure.winner({"a": measure.OURS_BY, t: 1.0}) == "a"
    assert measure.winner({"a": float("nan"), t: 1.0}) == t
    assert measure.winner({t: 1.0}) == t
    assert measure.winner({"a": 2.0}) == "a"


def test_candidates_measured():
    """On: one configuration, the rules' family's default (also where the rules pass it over
    for PyTorch); exhaustive: every candidate; none where no family computes the problem."""
    spec = problem71()
    first = choose.family_order(spec)[0]
    assert choose.measured_candidates(spec) == [first.candidates(spec)[0]]
    assert choose.measured_candidates(spec, exhaustive=True) == choose.candidates(spec)
    passed_over = problems.find("kernelbench-57").spec("tf32", 90)  # the rules take PyTorch's
    assert choose.choose_config(passed_over, torch_ok=True) is choose.TORCH
    assert choose.measured_candidates(passed_over) == [
        choose.family_order(passed_over)[0].candidates(passed_over)[0]]
    assert choose.measured_candidates(problem71(arch=75)) == []


def test_a_first_call_measures_once_and_records_the_winner(measuring, monkeypatch):
    """The flow of :func:`cutlass_convt.ops.route` with the call's operands (stand-in kernels,
    times and machine on the CPU): the first call times the rules' pick against PyTorch's
    route and writes the record; later calls and a cleared process follow the record without
    measuring; a changed machine measures again; a forced family and 'cutlass' never measure;
    a record that cannot be written leaves a warning and the measured route."""
    spec = problem71()
    machine = [MACHINE]
    timings = []
    medians = {"ours": 0.5}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(measure, "machine", lambda device: machine[0])
    monkeypatch.setattr(measure, "may_measure", lambda *t: True)
    monkeypatch.setattr(ops, "_device_index", lambda device: 0)
    monkeypatch.setattr(ops, "prepare_config", lambda spec, config, device: Stand(config))

    def time_routes(routes):
        timings.append(sorted(routes))
        config_name = next(name for name in routes if name != measure.TORCH)
        return {config_name: medians["ours"], measure.TORCH: 1.0}

    monkeypatch.setattr(measure, "time_routes", time_routes)
    monkeypatch.setattr(torch.cuda, "device", lambda index: NoContext())
    operands = (torch.empty(1), torch.empty(1), None)
    rules = choose.choose_config(spec)
    chosen = ops.route(spec, "auto", 0, None, operands)
    assert isinstance(chosen, Stand) and chosen.config == rules
    assert timings == [sorted([rules.name, measure.TORCH])]
    record = json.loads(choose.record_path(spec, MACHINE).read_text())
    assert record["source"] == "first use" and record["winner_name"] == rules.name
    assert {r["config"] for r in record["results"]} == {rules.name, measure.TORCH}
    for _ in range(2):
        chosen = ops.route(spec, "auto", 0, None, operands)
        assert isinstance(chosen, Stand) and chosen.config == rules
        cutlass_convt.clear_caches()
    assert len(timings) == 1
    for backend in ("cutlass", choose.family_of(rules).name):
        ops.route(spec, backend, 0, None, operands)
    assert len(timings) == 1
    machine[0] = other("driver", 99999)
    medians["ours"] = 0.99  # not clearly faster: PyTorch's route, kept
    assert isinstance(ops.route(spec, "auto", 0, None, operands), ops.TorchRoute)
    assert len(timings) == 2
    assert choose.recorded(spec, machine[0]) is choose.TORCH
    assert choose.recorded(spec, MACHINE) == rules
    machine[0] = other("gpu", "another")
    monkeypatch.setattr(choose, "save_record", refuse)
    with pytest.warns(RuntimeWarning, match="kept for this call signature only"):
        assert isinstance(ops.route(spec, "auto", 0, None, operands), ops.TorchRoute)


class Stand:
    """A prepared stand-in: its configuration and family name."""

    def __init__(self, config):
        self.config, self.family = config, choose.family_of(config)


class NoContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def refuse(*args):
    raise OSError("read-only file system")


@pytest.mark.gpu
def test_a_recorded_choice_is_followed_and_a_stale_one_measured_again(measuring):
    """On the GPU: the first call of a problem measures (a record for this machine names the
    winner, within the bounds); a record naming a slower route (PyTorch's where ours won, or
    the other way round) under this machine is followed as it is; the same record under
    another PyTorch version is not: the call measures again and records the true winner."""
    from helpers import check

    device = torch.cuda.current_device()
    machine = measure.machine(device)
    properties = torch.cuda.get_device_properties(device)
    assert dict(machine)["sm_count"] == properties.multi_processor_count
    assert dict(machine)["gpu"] == torch.cuda.get_device_name(device)
    gen, seed = fresh_generator()
    spec = problem71(batch=2, in_size=(64, 64), precision="fp32")
    x = torch.randn(spec.in_shape, device="cuda", generator=gen)
    w = torch.randn(spec.weight_shape, device="cuda", generator=gen)
    y = cutlass_convt.conv_transpose2d(x, w, precision="fp32")
    check(y, x, w, None, "fp32", seed)
    record = json.loads(choose.record_path(spec, machine).read_text())
    assert record["source"] == "first use"
    measured = {r["config"]: r["median_ms"] for r in record["results"]}
    assert record["winner_name"] == measure.winner(measured)
    ours = next(name for name in measured if name != measure.TORCH)
    slower = ours if record["winner_name"] == measure.TORCH else measure.TORCH
    planted = {**record, "winner_name": slower,
               "winner_family": (choose.TORCH.name if slower == measure.TORCH
                                 else choose.family_of(choose.measured_candidates(spec)[0]).name),
               "winner": ({} if slower == measure.TORCH
                          else dataclasses.asdict(choose.measured_candidates(spec)[0]))}
    choose.save_record(spec, machine, planted)
    ops.clear_caches()
    cutlass_convt.conv_transpose2d(x, w, precision="fp32")
    route = ops.route(spec, "auto", device)
    assert isinstance(route, ops.TorchRoute) == (slower == measure.TORCH)
    stale = tuple((k, "0.0" if k == "torch" else v) for k, v in machine)
    choose.save_record(spec, stale, planted)
    choose.record_path(spec, machine).unlink()
    ops.clear_caches()
    y = cutlass_convt.conv_transpose2d(x, w, precision="fp32")
    check(y, x, w, None, "fp32", seed)
    again = json.loads(choose.record_path(spec, machine).read_text())
    assert again["source"] == "first use"
    assert again["winner_name"] == measure.winner(
        {r["config"]: r["median_ms"] for r in again["results"]})


class FakeEvent:
    """A CUDA event stand-in on a fake stream: recorded at the stream's clock, complete only
    once it or a later event was waited for (reading an unfinished one raises, as PyTorch's
    does)."""

    clock, done, log = [0.0], [0.0], []

    def __init__(self, enable_timing=True):
        self.at = None

    def record(self):
        self.at = FakeEvent.clock[0]

    def synchronize(self):
        FakeEvent.done[0] = max(FakeEvent.done[0], self.at)
        FakeEvent.log.append("sync")

    def elapsed_time(self, end):
        if max(self.at, end.at) > FakeEvent.done[0]:
            raise RuntimeError("Both events must be completed before calculating elapsed time")
        return end.at - self.at


def test_time_routes_reads_only_finished_events_and_keeps_the_budget(monkeypatch):
    """The real time_routes on stand-in events and routes of known cost: medians equal the
    costs, no unfinished event is read, two host synchronizations, and the rounds' total GPU
    time stays within BUDGET_MS where a round takes at most a third of it."""
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    for ours_ms, torch_ms in ((0.2, 0.3), (5.0, 8.0), (20.0, 25.0)):
        FakeEvent.clock[0] = FakeEvent.done[0] = 0.0
        FakeEvent.log.clear()

        def route(ms):
            def run():
                FakeEvent.clock[0] += ms
            return run

        medians = measure.time_routes({"ours": route(ours_ms), measure.TORCH: route(torch_ms)})
        assert medians == {"ours": pytest.approx(ours_ms), measure.TORCH: pytest.approx(torch_ms)}
        assert FakeEvent.log == ["sync", "sync"]
        if ours_ms + torch_ms <= measure.BUDGET_MS / 3:
            assert FakeEvent.clock[0] <= measure.BUDGET_MS + 1e-9


def test_a_failed_build_or_an_unwritable_record_never_changes_the_call(measuring, monkeypatch):
    """Ours cannot be built: nothing is timed or recorded and the rules decide (the build
    error reaches the usual fallback, with its warning); the record cannot be written (a
    misconfigured cache): the measured route, with a warning, and the call goes on."""
    from cutlass_convt.build import BuildError

    spec = problem71()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(measure, "machine", lambda device: MACHINE)
    monkeypatch.setattr(measure, "may_measure", lambda *t: True)
    monkeypatch.setattr(ops, "_device_index", lambda device: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda index: NoContext())
    timed = []
    monkeypatch.setattr(measure, "time_routes", lambda routes: timed.append(routes) or {
        name: 1.0 if name == measure.TORCH else 0.5 for name in routes})

    def no_build(spec, config, device):
        raise BuildError("nvcc: not found")

    monkeypatch.setattr(ops, "prepare_config", no_build)
    operands = (torch.empty(1), torch.empty(1), None)
    with pytest.warns(RuntimeWarning, match="could not be built"):
        assert isinstance(ops.route(spec, "auto", 0, None, operands), ops.TorchRoute)
    assert timed == [] and choose.recorded(spec, MACHINE) is None
    monkeypatch.setattr(ops, "prepare_config", lambda spec, config, device: Stand(config))

    def misconfigured(*args):
        raise env.ConfigError(f"{env.CACHE_DIR_VARIABLE}='relative': not an absolute path")

    monkeypatch.setattr(choose, "save_record", misconfigured)
    with pytest.warns(RuntimeWarning, match="not an absolute path"):
        chosen = ops.route(spec, "auto", 0, None, operands)
    assert isinstance(chosen, Stand) and len(timed) == 1


@pytest.mark.gpu
def test_a_call_first_seen_in_a_captured_graph_measures_after_it(measuring):
    """A problem's first call inside CUDA graph capture runs the rules' route there (replayed
    correctly, nothing recorded); the first plain call after it measures and records."""
    from helpers import check

    device = torch.cuda.current_device()
    machine = measure.machine(device)
    gen, seed = fresh_generator()
    spec = problem71(batch=2, in_size=(32, 32), precision="fp32")
    x = torch.randn(spec.in_shape, device="cuda", generator=gen)
    w = torch.randn(spec.weight_shape, device="cuda", generator=gen)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # builds and library initializations outside the capture
        torch.nn.functional.conv_transpose2d(x, w)
        cutlass_convt.conv_transpose2d(x, w, precision="fp32", backend="cutlass")
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = cutlass_convt.conv_transpose2d(x, w, precision="fp32")
    assert choose.recorded(spec, machine) is None
    y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check(y, x, w, None, "fp32", seed)
    check(cutlass_convt.conv_transpose2d(x, w, precision="fp32"), x, w, None, "fp32", seed)
    assert json.loads(choose.record_path(spec, machine).read_text())["source"] == "first use"
