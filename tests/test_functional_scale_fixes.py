"""Functional mode at scale: an ONNX model's external data file that does not hold its
weights (truncated, empty, unreadable, outside the model's folder) is one WorkloadError
naming the model, the file and the weight; an absent one draws the weights and says
so (WeightDataAbsentWarning); a run that cannot fit in memory is refused up front;
random weights are drawn without whole-weight temporaries; and with ``keep`` the
executor loads weights on first use and frees values after their last reader,
computing the same bits."""

from __future__ import annotations

import math
import tracemalloc
import warnings

import numpy as np
import pytest
from click.testing import CliRunner
from wia_hw.emulator.errors import WorkloadError
from wia_hw.emulator.functional import cast_to

import wia_hw
import wia_hw._functional as functional
from wia_hw._functional import FunctionalExecutor, WeightDataAbsentWarning, functional_bytes
from wia_hw.cli import cli
from wia_hw.workloads import bert_base, from_onnx, gemm

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402

F32 = onnx.TensorProto.FLOAT


def _save(tmp_path, location="model.onnx.data"):
    """A MatMul, a bias Add and a MatMul by a transposed weight large enough to be
    shape-folded (its values come through the folder), weights in ``location``."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    wt = rng.standard_normal((300, 8)).astype(np.float32)  # 2400 elements
    big = rng.standard_normal((260, 256)).astype(np.float32)  # > INIT_MAX_ELEMENTS
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Add", ["h", "b"], ["y"], name="bias"),
        helper.make_node("Transpose", ["wt"], ["wtT"], name="tr", perm=[1, 0]),
        helper.make_node("MatMul", ["y", "wtT"], ["z"], name="mm2"),
        helper.make_node("Transpose", ["big"], ["bigT"], name="tr2", perm=[1, 0]),
        helper.make_node("MatMul", ["u", "bigT"], ["v"], name="mm3"),
    ]
    inits = [numpy_helper.from_array(a, n) for a, n in ((w, "w"), (b, "b"), (wt, "wt"))]
    inits.append(numpy_helper.from_array(big, "big"))
    g = helper.make_graph(
        nodes,
        "ext",
        [
            helper.make_tensor_value_info("x", F32, [4, 16]),
            helper.make_tensor_value_info("u", F32, [2, 256]),
        ],
        [
            helper.make_tensor_value_info("z", F32, None),
            helper.make_tensor_value_info("v", F32, None),
        ],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "model.onnx"
    onnx.save_model(
        m, str(path), save_as_external_data=True, location="model.onnx.data", size_threshold=0
    )
    if location != "model.onnx.data":  # point the weights elsewhere
        proto = onnx.load(str(path), load_external_data=False)
        for t in proto.graph.initializer:
            for e in t.external_data:
                if e.key == "location":
                    e.value = location
        onnx.save_model(proto, str(path))
    rng = np.random.default_rng(1)
    feeds = {
        "x": rng.standard_normal((4, 16)).astype(np.float32),
        "u": rng.standard_normal((2, 256)).astype(np.float32),
    }
    return path, feeds


def _unreadable(monkeypatch):
    from onnx import external_data_helper

    def deny(*a, **k):
        raise PermissionError(13, "Permission denied", "model.onnx.data")

    monkeypatch.setattr(external_data_helper, "_open_external_data_fd", deny)


@pytest.mark.parametrize("case", ["truncated", "empty", "outside", "unreadable"])
def test_an_external_data_file_without_the_weights_is_one_workload_error(
    tmp_path, monkeypatch, case
):
    if case == "outside":
        (tmp_path / "m").mkdir()
        path, feeds = _save(tmp_path / "m", "../model.onnx.data")
        (tmp_path / "m" / "model.onnx.data").rename(tmp_path / "model.onnx.data")
        data = "../model.onnx.data"
    else:
        path, feeds = _save(tmp_path)
        data = "model.onnx.data"
        f = tmp_path / "model.onnx.data"
        if case == "truncated":
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
        elif case == "empty":
            f.write_bytes(b"")
        else:
            _unreadable(monkeypatch)
    g = from_onnx(path)  # import needs no weight: fine
    assert wia_hw.run(g).latency_ms > 0
    with pytest.raises(WorkloadError) as e:
        wia_hw.run(g, mode="functional", inputs=feeds)
    msg = str(e.value)
    assert str(path) in msg and repr(data) in msg and "\n" not in msg
    assert any(f"weight {n!r}" in msg for n in ("w", "b", "wt", "big"))
    if case in ("truncated", "empty"):
        assert "truncated" in msg
    if case == "outside":
        assert "outside the model's folder" in msg
    res = CliRunner().invoke(cli, ["run", str(path), "--mode", "functional"])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and repr(data) in res.output


def test_weights_read_from_a_whole_file_are_the_models(tmp_path):
    path, feeds = _save(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", WeightDataAbsentWarning)
        res = wia_hw.run(from_onnx(path), mode="functional", inputs=feeds)
    from onnx.reference import ReferenceEvaluator

    want = ReferenceEvaluator(onnx.load(str(path))).run(None, feeds)
    np.testing.assert_allclose(res.outputs["z"], want[0], rtol=2e-3, atol=1e-4)
    np.testing.assert_allclose(res.outputs["v"], want[1], rtol=2e-3, atol=1e-4)


def test_an_absent_external_data_file_draws_the_weights_and_says_so(tmp_path):
    path, feeds = _save(tmp_path)
    (tmp_path / "model.onnx.data").unlink()
    g = from_onnx(path)
    assert g.weight_values == {} and g.params["weight_data_absent"] == "model.onnx.data"
    with pytest.warns(WeightDataAbsentWarning) as rec:
        res = wia_hw.run(g, mode="functional", inputs=feeds)
    (w,) = [r for r in rec if r.category is WeightDataAbsentWarning]  # once
    msg = str(w.message)
    drawn = sum(1 for t in g.tensors.values() if t.kind == "weight")
    assert f"drew {drawn} weight(s)" in msg and str(path) in msg and "'model.onnx.data'" in msg
    assert set(res.outputs) == {"z", "v"}  # the documented drawing goes on
    # every weight given: nothing drawn, nothing to say
    given = {n: np.zeros(t.shape, np.float32) for n, t in g.tensors.items() if t.kind == "weight"}
    with warnings.catch_warnings():
        warnings.simplefilter("error", WeightDataAbsentWarning)
        wia_hw.run(g, mode="functional", inputs={**feeds, **given})


def test_a_run_that_cannot_fit_in_memory_is_refused_before_allocating(monkeypatch):
    monkeypatch.setattr(functional, "_available_memory", lambda: 1_000_000)
    g = gemm(M=1, N=1024, K=1024)
    need = functional_bytes(g)
    assert need >= 1024 * 1024 * 4  # the weight, held as float32
    with pytest.raises(WorkloadError, match=r"would hold about .* GB .* 0\.00 GB of memory"):
        wia_hw.run(g, mode="functional")
    monkeypatch.setattr(functional, "_available_memory", lambda: need)
    assert wia_hw.run(g, mode="functional").outputs
    monkeypatch.setattr(functional, "_available_memory", lambda: None)  # unknown: no check
    assert wia_hw.run(g, mode="functional").outputs


def test_available_memory_is_read_from_the_system():
    avail = functional._available_memory()
    assert avail is None or avail > 0


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_random_weights_are_drawn_without_whole_weight_temporaries(dtype):
    n, k = 2048, 4096
    g = gemm(M=1, N=n, K=k, precision=dtype)
    rng = np.random.default_rng(7)
    rng.standard_normal((1, k), dtype=np.float32)  # the input A, drawn first
    want = cast_to(rng.standard_normal((k, n), dtype=np.float32) / np.float32(math.sqrt(k)), dtype)
    tracemalloc.start()
    try:
        fx = FunctionalExecutor(g, 7)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(fx.values["B"], want)
    assert fx.values["B"].dtype == np.float32
    # the float32 weight and one chunk's rounding temporaries (bf16 rounds through
    # 64-bit integers); was 10 bytes an element (fp16), more for bf16
    assert peak < 4 * n * k + 40 * functional._CHUNK + (1 << 20)


def _small_bert():
    return bert_base(batch=1, seq=8, precision="fp16", layers=2)


def test_keep_frees_values_after_their_last_reader_and_computes_the_same_bits():
    g = _small_bert()
    full = FunctionalExecutor(g, 3)
    lean = FunctionalExecutor(g, 3, keep=())
    weights = [n for n, t in g.tensors.items() if t.kind == "weight"]
    assert not set(weights) & set(lean.values)  # loaded on first use
    most = 0
    for op in g.ops:
        full.step(op)
        lean.step(op)
        most = max(most, len(lean.values))
    assert len(full.values) == len(g.tensors)  # the default holds every tensor
    assert set(lean.values) == set(lean.outputs()) | {
        n
        for n, t in g.tensors.items()
        if t.kind == "input" and n not in {i for op in g.ops for i in op.inputs}
    }
    assert most < len(g.tensors) / 4
    a, b = full.outputs(), lean.outputs()
    assert a.keys() == b.keys()
    for n in a:
        assert a[n].dtype == b[n].dtype
        np.testing.assert_array_equal(a[n], b[n])
    # the embedding table dominates two layers; still held only while read
    assert functional_bytes(g, ()) < 0.8 * functional_bytes(g)


def test_keep_holds_the_names_asked_for():
    g = _small_bert()
    inner = g.ops[len(g.ops) // 2].outputs[0]
    fx = FunctionalExecutor(g, 0, keep=[inner])
    for op in g.ops:
        fx.step(op)
    ref = FunctionalExecutor(g, 0)
    for op in g.ops:
        ref.step(op)
    np.testing.assert_array_equal(fx.values[inner], ref.values[inner])


def test_keep_reads_an_imported_models_weights_on_first_use(tmp_path):
    path, feeds = _save(tmp_path)
    g = from_onnx(path)
    full, lean = FunctionalExecutor(g, 0, feeds), FunctionalExecutor(g, 0, feeds, keep=())
    for op in g.ops:
        full.step(op)
        lean.step(op)
    a, b = full.outputs(), lean.outputs()
    for n in a:
        np.testing.assert_array_equal(a[n], b[n])
