"""ONNX's own node tests (``onnx.backend.test.case``, shipped in the onnx package) run
through the importer and functional mode: a helper for the op-family test files."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import numpy as np

import wia_hw
from wia_hw import from_onnx
from wia_hw._functional import FunctionalExecutor


def node_cases(op_types: Iterable[str]) -> list:
    """The one-node test cases of ``op_types``, each once."""
    from onnx.backend.test.case.node import collect_testcases

    wanted = set(op_types)
    seen, out = set(), []
    for c in collect_testcases():
        m = c.model
        if m is None or len(m.graph.node) != 1 or c.name in seen:
            continue
        if m.graph.node[0].op_type in wanted:
            seen.add(c.name)
            out.append(c)
    return out


def run_node_cases(
    op_types: Iterable[str], runtime_inputs: Mapping[str, tuple[int, ...]] = {}
) -> tuple[list[str], list[str]]:
    """Run every case of ``op_types``: the inputs not in ``runtime_inputs[op]`` (default:
    the first) become initializers (weights, scales: the importer wants constants).
    Each case either gives ONNX's expected outputs (to float32 rounding; codes compared
    as the real values they stand for) or is refused with one line saying what is not
    modelled. Returns (matched, refused) case names."""
    import onnx
    from onnx import numpy_helper

    matched, refused = [], []
    for c in node_cases(op_types):
        m = onnx.ModelProto.FromString(c.model.SerializeToString())
        op = m.graph.node[0].op_type
        inputs, outputs = c.data_sets[0]
        names = [i.name for i in m.graph.input]
        runtime = {names[i] for i in runtime_inputs.get(op, (0,))}
        for name, v in zip(names, inputs, strict=True):
            if name in runtime:
                continue
            if isinstance(v, onnx.TensorProto):  # float8, int4...: kept as a proto
                t = onnx.TensorProto()
                t.CopyFrom(v)
                t.name = name
            else:
                t = numpy_helper.from_array(np.asarray(v), name)
            m.graph.initializer.append(t)
        kept = [i for i in m.graph.input if i.name in runtime]
        del m.graph.input[:]
        m.graph.input.extend(kept)
        try:
            g = from_onnx(m)
        except wia_hw.WorkloadError as e:
            assert "\n" not in str(e)
            assert re.search(r"model", str(e)), (c.name, str(e))  # says what is modelled
            refused.append(c.name)
            continue
        feeds = {n: v for n, v in zip(names, inputs, strict=True) if n in runtime}
        fx = FunctionalExecutor(g, 0, feeds)
        for o in g.ops:
            fx.step(o)
        for out, want in zip([o.name for o in m.graph.output], outputs, strict=True):
            got = fx._dequantised(out)
            if out in g.quant:
                want = g.quant[out].real(want)
            half = g.tensors[out].dtype in ("fp16", "bf16")
            np.testing.assert_allclose(  # 16-bit float data: to its own rounding
                got.astype(np.float64),
                want.astype(np.float64),
                rtol=2e-2 if half else 1e-5,
                atol=2e-3 if half else 1e-6,
                err_msg=c.name,
            )
        matched.append(c.name)
    return matched, refused
