"""SCALE-Sim's inputs as wia-hw's: topology CSVs (convolution and GEMM) as graphs,
``.cfg`` configurations as device specs, checked against SCALE-Sim's own formulas
(``topology_utils.topo_calc_hyperparams``: ofmap size and MACs) and its bad inputs."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
from wia_hw.emulator.errors import SpecError, WorkloadError

import wia_hw
from wia_hw.scalesim import config_mapping, fold_cycles, read_topology
from wia_hw.spec import load_spec

CONV = """Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, Channels, Num Filter, Strides,
Conv1,32,32,7,7,3,16,2,
Conv2,15,15,3,3,16,32,1,

Rect,20,12,3,1,8,12,2,1,
DP_conv,14,14,3,3,8,2,1,
Sparse,9,9,3,3,4,4,1,2:4,
"""
GEMM = """Layer,M,N,K,
QK,256,256,64,
FF,100,70,50
"""
CFG = """[general]
run_name = test_run

[architecture_presets]
ArrayHeight:    16
ArrayWidth:     8
IfmapSramSzkB:   64
FilterSramSzkB:  64
OfmapSramSzkB:   32
IfmapOffset:    0
FilterOffset:   10000000
OfmapOffset:    20000000
Bandwidth : 10
Dataflow : ws
MemoryBanks:   1

[run_presets]
InterfaceBandwidth: {mode}
"""


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def _scalesim_conv(h, w, fh, fw, c, nf, sh, sw):
    """SCALE-Sim's topo_calc_hyperparams: ofmap (h, w) and MACs of one layer."""
    oh, ow = math.ceil((h - fh + sh) / sh), math.ceil((w - fw + sw) / sw)
    return (oh, ow), oh * ow * fh * fw * c * nf


def test_conv_topology_shapes_and_macs_are_scalesim_s(tmp_path):
    g = read_topology(_write(tmp_path, "net.csv", CONV))
    assert [o.name for o in g.ops] == ["Conv1", "Conv2", "Rect", "DP_conv", "Sparse"]
    rows = {
        "Conv1": (32, 32, 7, 7, 3, 16, 2, 2),
        "Conv2": (15, 15, 3, 3, 16, 32, 1, 1),
        "Rect": (20, 12, 3, 1, 8, 12, 2, 1),
        "Sparse": (9, 9, 3, 3, 4, 4, 1, 1),  # v3's N:M column: metadata, run dense
    }
    for op in g.ops:
        ins, outs = g.shapes_of(op)
        if op.name in rows:
            hw, macs = _scalesim_conv(*rows[op.name])
        else:  # depthwise: SCALE-Sim runs each of the 8 channels as its own layer
            hw, one = _scalesim_conv(14, 14, 3, 3, 1, 2, 1, 1)
            macs = 8 * one
            assert op.attrs["groups"] == 8
        assert outs[0][2:] == hw
        assert g.flops(op) == 2 * macs
    assert g.params["format"] == "scalesim-conv"
    assert g.ops[-1].attrs["sparsity"] == "2:4"


def test_gemm_topology_is_linear_layers(tmp_path):
    g = read_topology(_write(tmp_path, "g.csv", GEMM))
    assert [(o.kind, o.name) for o in g.ops] == [("linear", "QK"), ("linear", "FF")]
    assert [g.flops(o) // 2 for o in g.ops] == [256 * 256 * 64, 100 * 70 * 50]
    assert g.tensors["QK.filter"].shape == (64, 256)  # K x N: the weight


@pytest.mark.parametrize(
    "text, match",
    [
        ("Name,a,b\nx,1,2,\n", r"header 'Name, a, b' is neither"),
        (GEMM.replace("FF,100,70,50", "FF,100,70"), r":3: layer 'FF': 3 fields, a GEMM row has 4"),
        (
            GEMM.replace("FF,100,70,50", "FF,100,seventy,50"),
            r":3: layer 'FF': N 'seventy' is not a positive integer",
        ),
        (
            CONV.replace("Conv2,15,15,3,3", "Conv2,15,15,30,3"),
            r":3: layer 'Conv2': Filter Height 30 is larger than IFMAP Height 15",
        ),
        (
            CONV.replace("Conv1,32,32,7,7,3,16,2,", "Conv1,32,32,7,7,3,0,2,"),
            r":2: layer 'Conv1': Num Filter '0' is not a positive integer",
        ),
        ("Layer,M,N,K,\n", r"has a header but no layer rows"),
        (CONV.replace("2:4", "2:x"), r":7: layer 'Sparse': sparsity '2:x' is not N:M"),
        ("", r"empty"),
        (
            "Layer,M,N,K,\n\x1b[31mRED\x1b]0;pwned\x07,8,8,8,\n",
            r":2: layer name .* has control characters",
        ),
    ],
)
def test_bad_topologies_name_file_line_and_column(tmp_path, text, match):
    p = _write(tmp_path, "bad.csv", text)
    with pytest.raises(WorkloadError, match=match):
        read_topology(p)


def test_a_comment_after_the_last_comma_is_ignored_as_scalesim_does(tmp_path):
    """SCALE-Sim reads a row up to its last comma; its own mobilnet_paper.csv marks
    depthwise rows '...,1,#dw' (the comment was read as a stride width and refused)."""
    text = (
        "Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, Channels, "
        "Num Filter, Strides,\n"
        "Conv1, 224, 224, 3, 3, 3, 32, 2,\n"
        "Conv2_dw, 112, 112, 3, 3, 1, 1, 1,#dw\n"
    )
    g = read_topology(_write(tmp_path, "mobilnet.csv", text))
    assert [op.name for op in g.ops] == ["Conv1", "Conv2_dw"]
    assert g.ops[1].attrs.get("stride") in (1, [1, 1], (1, 1))


@pytest.mark.parametrize(
    "args",
    [("os", 0, 4, 4, 4, 4), ("os", 4, 4, 0, 4, 4), ("ws", 4, 4, -5, 4, 4), ("is", 4, 4, 4, 4, 4)],
)
def test_fold_cycles_refuses_what_is_no_layer(args):
    from wia_hw.scalesim import fold_cycles

    with pytest.raises(ValueError, match=r"fold_cycles: (\w+ must be a positive integer|dataflow)"):
        fold_cycles(*args)


def test_missing_topology_names_the_path(tmp_path):
    with pytest.raises(WorkloadError, match=r"nope.csv: no such SCALE-Sim topology file"):
        wia_hw.run(str(tmp_path / "nope.csv"))


@pytest.mark.parametrize("mode", ["CALC", "USER"])
def test_config_maps_array_srams_and_bandwidth(tmp_path, mode):
    p = _write(tmp_path, "t.cfg", CFG.format(mode=mode))
    spec = load_spec(p)
    base = load_spec("wia-npu")
    a = spec.compute.array
    assert (spec.name, spec.compute.cores, a.rows, a.cols, a.dataflow, a.pipelined) == (
        "test_run",
        1,
        16,
        8,
        "ws",
        False,
    )
    assert spec.memory.l1.size_kib == 64 + 64 + 32
    assert spec.memory.block_bytes <= spec.memory.l1.size_bytes // 4
    want = 10 * 2 * base.clock_ghz if mode == "USER" else base.memory.hbm.bandwidth_gbs
    assert spec.memory.hbm.bandwidth_gbs == pytest.approx(want)
    assert ("CALC" in spec.description) == (mode == "CALC")


@pytest.mark.parametrize(
    "edit, field",
    [
        (("Dataflow : ws", "Dataflow : is"), "architecture_presets.Dataflow"),
        (("ArrayWidth:     8", "ArrayWidth:     -8"), "architecture_presets.ArrayWidth"),
        (("OfmapSramSzkB:   32\n", ""), "architecture_presets.OfmapSramSzkB"),
        (
            ("InterfaceBandwidth: USER", "InterfaceBandwidth: FAST"),
            "run_presets.InterfaceBandwidth",
        ),
        (("Bandwidth : 10", "Bandwidth : 10,20"), "architecture_presets.Bandwidth"),
    ],
)
def test_bad_configs_name_the_key(tmp_path, edit, field):
    p = _write(tmp_path, "bad.cfg", CFG.format(mode="USER").replace(*edit))
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert e.value.field == field and e.value.file == str(p)
    assert "\n" not in str(e.value)


def test_not_a_config_file(tmp_path):
    with pytest.raises(SpecError, match=r"not a SCALE-Sim configuration"):
        config_mapping(_write(tmp_path, "x.cfg", "ArrayHeight = 3\n"))


def test_cli_runs_a_topology_on_a_config(tmp_path):
    from click.testing import CliRunner

    from wia_hw.cli import cli

    topo = _write(tmp_path, "g.csv", GEMM)
    cfg = _write(tmp_path, "t.cfg", CFG.format(mode="USER"))
    res = CliRunner().invoke(cli, ["run", str(topo), "--device", str(cfg), "--json"])
    assert res.exit_code == 0, res.output
    out = wia_hw.run(str(topo), device=str(cfg))
    assert out.flops == 2 * (256 * 256 * 64 + 100 * 70 * 50)
    assert out.counters.macs == out.flops // 2
    assert np.isfinite(out.latency_ms) and out.latency_ms > 0


# -- SCALE-Sim's own numbers ------------------------------------------------------------

PEER = Path(__file__).parent / "data" / "scalesim"


def _peer_rows() -> dict[tuple[str, str], list[int]]:
    """(config, topology) -> SCALE-Sim's Total Cycles per layer, in order."""
    out: dict[tuple[str, str], list[int]] = {}
    with (PEER / "compute_report.csv").open() as f:
        rows = [r for r in csv.reader(f) if r and not r[0].startswith("#")][1:]
    for cfg, topo, _layer, _pre, cycles, stalls in rows:
        assert int(stalls) == 0  # CALC bandwidth: SCALE-Sim's compute alone
        out.setdefault((cfg, topo), []).append(int(cycles))
    return out


def test_layer_cycles_equal_scalesim_s_fold_by_fold():
    """Every layer SCALE-Sim 3.0.0 ran (tests/data/scalesim: GEMMs and convolutions,
    strided, depthwise, odd sizes; os and ws; 32x32, 16x16, 8x32, 32x8) takes exactly
    its folds times wia-hw's pass cycles, read through wia-hw's own import of the same
    topology and configuration: the two agree to the cycle but for the output drain."""
    from wia_hw.graph import gemm_dims

    peer = _peer_rows()
    assert len(peer) == 12 and sum(map(len, peer.values())) == 252
    checked = 0
    for (cfg, topo), cycles in sorted(peer.items()):
        spec = load_spec(PEER / f"{cfg}.cfg")
        a = spec.compute.array
        graph = read_topology(PEER / topo)
        ours = []
        for op in graph.ops:
            groups, m, n, k = gemm_dims(op, graph.shapes_of(op)[0])
            # a depthwise layer is one SCALE-Sim layer per channel
            ours += [fold_cycles(a.dataflow, a.rows, a.cols, m, n, k)] * groups
        assert ours == cycles, (cfg, topo)
        checked += len(ours)
    assert checked == sum(map(len, peer.values()))


def test_sizes_a_topology_fixes_are_refused():
    with pytest.raises(WorkloadError, match=r"gemm.csv: seq does not apply to a SCALE-Sim"):
        wia_hw.run(str(PEER / "gemm.csv"), seq=128)
    res = wia_hw.run(str(PEER / "conv.csv"), batch=2)  # batch: images per conv layer
    assert res.counters.macs == 2 * read_topology(PEER / "conv.csv").macs()
