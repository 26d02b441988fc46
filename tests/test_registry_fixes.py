"""Extension registry fixes: a direct call (``pim_execute``, ``multi_head_attention``,
``photonic_matmul``) registers its unit without graph claims and a later registration
replaces it; non-finite parameters are refused; ``wia-hw ext register`` does not
overwrite another installed extension's module; a Python operation's bad result or
exception is one error naming the extension, operation and graph op; user manifests are
found by their ``extension_id`` (a duplicate id is an error naming both files); an
unquoted float ``version`` is refused."""

from __future__ import annotations

import math
import textwrap

import numpy as np
import pytest
from click.testing import CliRunner

import wia_hw
from wia_hw import SpecError, WorkloadError, load_extension, register_device_extension, registry
from wia_hw.cli import cli
from wia_hw.graph import GraphBuilder
from wia_hw.registry import ensure_extension


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


# -- 1. a direct call registers its unit without graph claims ---------------------------
def test_direct_pim_execute_leaves_graph_runs_unchanged_and_registration_upgrades():
    from wia_hw.extensions.pim import PIMConfig, PIMOperation, pim_execute

    ctx = wia_hw.open_device("wia-npu")
    before = ctx.run("resnet50", batch=32)
    pim_execute(ctx, PIMConfig(), PIMOperation(operation="relu"), np.zeros(1024, np.int16))
    assert ctx.extensions["pim"].direct and not ctx.providers
    after = ctx.run("resnet50", batch=32)
    assert after.cycles == before.cycles
    assert after.latency_ms == before.latency_ms
    assert {k.provider for k in after.kernels} == {"builtin"}
    # nor is it in the run's provenance: a replay would register it with its claims
    assert after.provenance["extensions"] == []
    # registering afterwards replaces the claim-less registration, with its parameters
    ext = register_device_extension(ctx, "pim", parameters={"banks": 64})
    assert ctx.extensions["pim"] is ext and not ext.direct and ext.param("banks") == 64
    routed = ctx.run("resnet50", batch=32)
    fresh = wia_hw.open_device("wia-npu")
    register_device_extension(fresh, "pim", parameters={"banks": 64})
    clean = fresh.run("resnet50", batch=32)
    assert "pim" in {k.provider for k in routed.kernels}
    assert routed.cycles == clean.cycles < before.cycles
    # a direct call on a context with the full registration keeps it
    pim_execute(ctx, PIMConfig(), PIMOperation(operation="relu"), np.zeros(64, np.int16))
    assert ctx.extensions["pim"] is ext


def test_direct_multi_head_attention_leaves_graph_runs_unchanged():
    from wia_hw.extensions.transformer_engine import AttentionConfig, multi_head_attention

    ctx = wia_hw.open_device("wia-npu")
    before = ctx.run("bert-base", batch=8, seq=128)
    q = np.zeros((1, 2, 64, 32), np.float32)
    cfg = AttentionConfig(num_heads=2, head_dim=32, sequence_length=64)
    multi_head_attention(ctx, q, q, q, cfg=cfg, functional=False)
    after = ctx.run("bert-base", batch=8, seq=128)
    assert after.cycles == before.cycles
    assert {k.provider for k in after.kernels} == {"builtin"}
    ext = register_device_extension(ctx, "transformer_engine", parameters={"block_q": 64})
    assert ext.param("block_q") == 64 and not ext.direct
    routed = ctx.run("bert-base", batch=8, seq=128)
    assert "transformer_engine" in {k.provider for k in routed.kernels}
    assert routed.cycles != before.cycles


@pytest.mark.filterwarnings("ignore:photonic core configured")
def test_direct_photonic_call_then_registration_with_a_policy():
    from wia_hw.extensions.photonic import PhotonicMatmul

    from wia_hw import PhotonicConfig, photonic_matmul

    ctx = wia_hw.open_device("wia-npu")
    a = np.random.default_rng(3).standard_normal((16, 16))
    photonic_matmul(ctx, PhotonicConfig(), PhotonicMatmul(), a, a, functional=False)
    assert ctx.extensions["photonic"].direct and not ctx.providers
    ext = register_device_extension(ctx, "photonic", parameters={"policy": "all"})
    assert ext.param("policy") == "all" and ctx.providers["linear"][0] == "photonic"


def test_ensure_extension_with_claims_registers_or_upgrades_the_full_manifest():
    full = wia_hw.open_device("wia-npu")
    ensure_extension(full, "transformer_engine", claims=True)
    assert full.providers["bmm"][0] == "transformer_engine"
    ctx = wia_hw.open_device("wia-npu")
    ensure_extension(ctx, "transformer_engine")
    assert not ctx.providers and ctx.extensions["transformer_engine"].direct
    ext = ensure_extension(ctx, "transformer_engine", claims=True)
    assert not ext.direct and ctx.providers["bmm"][0] == "transformer_engine"
    # a claim clash leaves the claim-less registration in place
    other = wia_hw.open_device("wia-npu")
    ensure_extension(other, "photonic")
    register_device_extension(other, "analog")
    with pytest.raises(SpecError, match=r"already claimed by extension 'analog'"):
        register_device_extension(other, "photonic")
    assert other.extensions["photonic"].direct


# -- 2. non-finite parameters -----------------------------------------------------------
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("name", ["act_energy_pj", "op_energy_pj"])
def test_a_non_finite_parameter_is_refused_naming_extension_and_parameter(bad, name):
    with pytest.raises(SpecError) as ei:
        load_extension("pim", parameters={name: bad})
    err = ei.value
    assert err.field == f"parameters.{name}" and err.file.endswith("pim.yaml")
    assert f"must be a finite number, got {bad!r}" in err.message
    assert "\n" not in str(err)


@pytest.mark.parametrize(
    "decl, field",
    [
        ("{type: float, default: .nan, min: 1, max: 10}", "parameters.f.default"),
        ("{type: float, default: 1.0, min: .nan, max: 10}", "parameters.f.min"),
        ("{type: float, default: 1.0, min: 0, max: .inf}", "parameters.f.max"),
    ],
)
def test_a_non_finite_default_or_bound_in_a_manifest_is_refused(tmp_path, decl, field):
    p = _write(
        tmp_path / "nanp.yaml",
        f"""\
        schema_version: 1
        extension_id: nanp
        version: "1.0"
        parameters:
          f: {decl}
        """,
    )
    with pytest.raises(SpecError, match="finite number") as ei:
        load_extension(p)
    assert ei.value.field == field and ei.value.line == 5


# -- 3. ext register does not overwrite another extension's module ----------------------
def _unit(tmp_path, sub, ext_id, claim, body):
    _write(tmp_path / sub / "impl.py", body)
    return _write(
        tmp_path / sub / f"{ext_id}.yaml",
        f"""\
        schema_version: 1
        extension_id: {ext_id}
        version: "1.0"
        module: impl
        operations:
          - name: {ext_id}_op
            claims: [{claim}]
            impl: lower
        """,
    )


def test_register_refuses_to_overwrite_another_extensions_module(tmp_path, monkeypatch):
    inst = tmp_path / "inst"
    monkeypatch.setenv(registry.PATH_ENV, str(inst))
    body_a = "def lower(op, graph, spec, storage, ext):\n    return None  # a\n"
    body_b = "def lower(op, graph, spec, storage, ext):\n    return None  # b\n"
    a = _unit(tmp_path, "a", "unit_a", "linear", body_a)
    b = _unit(tmp_path, "b", "unit_b", "gelu", body_b)
    runner = CliRunner()
    assert runner.invoke(cli, ["ext", "register", str(a)]).exit_code == 0
    res = runner.invoke(cli, ["ext", "register", str(b)])
    assert res.exit_code == 2
    line = res.output.strip().splitlines()[-1]
    assert "'unit_a'" in line and "'unit_b'" in line and str(inst / "impl.py") in line
    assert "--force" in line
    assert (inst / "impl.py").read_text() == body_a and not (inst / "unit_b.yaml").exists()
    assert (
        load_extension("unit_a").implementation("unit_a_op")(None, None, None, None, None) is None
    )
    # an identical module is no conflict; --force overwrites
    c = _unit(tmp_path, "c", "unit_c", "tanh", body_a)
    assert runner.invoke(cli, ["ext", "register", str(c)]).exit_code == 0
    assert runner.invoke(cli, ["ext", "register", str(b), "--force"]).exit_code == 0
    assert (inst / "impl.py").read_text() == body_b


# -- 4. a Python operation's bad result or exception ------------------------------------
def _gelu_graph():
    g = GraphBuilder("g", "fp16")
    x = g.input("x", (64, 256))
    g.op("gelu", "act", [x])
    return g.graph()


@pytest.mark.parametrize(
    "body, what",
    [
        ("return 'not kernels'", "returned 'not kernels' (str)"),
        ("return [42]", "returned a list holding 42 (int)"),
        ("return 7", "returned 7 (int)"),
        ("raise ZeroDivisionError('oops in my extension')", "raised ZeroDivisionError: oops"),
    ],
)
def test_a_bad_python_operation_is_one_error_naming_extension_operation_and_op(
    tmp_path, body, what
):
    p = _unit(
        tmp_path, "bad", "badx", "gelu", f"def lower(op, graph, spec, storage, ext):\n    {body}\n"
    )
    ctx = wia_hw.open_device("wia-npu")
    register_device_extension(ctx, p)
    with pytest.raises(SpecError) as ei:
        ctx.run(_gelu_graph())
    err = ei.value
    assert err.file == str(p) and err.field == "operations.0.impl" and err.line == 8
    assert (
        "extension 'badx' operation 'badx_op', lowering graph op 'act' (gelu): " + what
    ) in err.message
    assert "\n" not in str(err)
    if body.startswith("raise"):
        assert isinstance(err.__cause__, ZeroDivisionError)
    # the CLI prints it as one line, exit status 2
    res = CliRunner().invoke(cli, ["run", "bert-base", "-b", "1", "-s", "16", "--ext", str(p)])
    assert res.exit_code == 2 and "operation 'badx_op'" in res.output
    assert "Traceback" not in res.output


def test_a_wia_error_of_an_operation_passes_unchanged(tmp_path):
    p = _unit(
        tmp_path,
        "w",
        "wx",
        "gelu",
        "from wia_hw import WorkloadError\n"
        "def lower(op, graph, spec, storage, ext):\n"
        "    raise WorkloadError(f'wx: cannot take {op.name}')\n",
    )
    ctx = wia_hw.open_device("wia-npu")
    register_device_extension(ctx, p)
    with pytest.raises(WorkloadError, match=r"^wx: cannot take act$"):
        ctx.run(_gelu_graph())


# -- 5. ids and versions ----------------------------------------------------------------
MANIFEST = """\
schema_version: 1
extension_id: {id}
version: {version}
capabilities: [structured_sparsity]
"""


def test_user_manifests_are_found_by_extension_id(tmp_path, monkeypatch):
    monkeypatch.setenv(registry.PATH_ENV, str(tmp_path))
    one = _write(tmp_path / "one.yaml", MANIFEST.format(id="samething", version='"1.0"'))
    _write(tmp_path / "pim.yaml", MANIFEST.format(id="notpim", version='"9.9"'))
    ids = wia_hw.list_extensions()
    assert "samething" in ids and "notpim" in ids and "one" not in ids
    assert load_extension("samething").source == one
    assert load_extension("pim").version == "1.0"  # the built-in one
    res = CliRunner().invoke(cli, ["ext", "list"])
    assert res.exit_code == 0 and "samething" in res.output and "│ one " not in res.output
    res = CliRunner().invoke(cli, ["ext", "show", "samething"])
    assert res.exit_code == 0 and "extension_id: samething" in res.output


def test_a_duplicate_extension_id_is_an_error_naming_both_files(tmp_path, monkeypatch):
    monkeypatch.setenv(registry.PATH_ENV, str(tmp_path))
    one = _write(tmp_path / "one.yaml", MANIFEST.format(id="samething", version='"1.0"'))
    two = _write(tmp_path / "two.yaml", MANIFEST.format(id="samething", version='"1.0"'))
    with pytest.raises(SpecError) as ei:
        load_extension("samething")
    msg = str(ei.value)
    assert str(one) in msg and str(two) in msg and "\n" not in msg
    assert registry.duplicate_extensions() == {"samething": [one, two]}
    res = CliRunner().invoke(cli, ["ext", "show", "samething"])
    assert res.exit_code == 2 and str(one) in res.output and str(two) in res.output
    res = CliRunner().invoke(cli, ["ext", "list"])
    assert res.exit_code == 0 and "invalid" in res.output and "samething" in res.output


def test_register_replaces_the_installed_manifest_of_its_id(tmp_path, monkeypatch):
    inst = tmp_path / "inst"
    monkeypatch.setenv(registry.PATH_ENV, str(inst))
    _write(inst / "other.yaml", MANIFEST.format(id="samething", version='"1.0"'))
    src = _write(tmp_path / "src.yaml", MANIFEST.format(id="samething", version='"2.0"'))
    res = CliRunner().invoke(cli, ["ext", "register", str(src)])
    assert res.exit_code == 2 and "other.yaml exists" in res.output
    res = CliRunner().invoke(cli, ["ext", "register", str(src), "--force"])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in inst.iterdir()) == ["other.yaml"]
    assert load_extension("samething").version == "2.0"


@pytest.mark.parametrize("written, value", [("1.10", 1.1), ("1.0", 1.0), ("2.5", 2.5)])
def test_an_unquoted_float_version_is_refused(tmp_path, written, value):
    p = _write(tmp_path / "v.yaml", MANIFEST.format(id="v", version=written))
    with pytest.raises(SpecError) as ei:
        load_extension(p)
    err = ei.value
    assert err.field == "version" and err.line == 3
    assert f'write version: "{written}"' in err.message and "quoted" in err.message
    ok = _write(tmp_path / "q.yaml", MANIFEST.format(id="v", version=f'"{written}"'))
    assert load_extension(ok).version == written
    assert (
        load_extension(_write(tmp_path / "i.yaml", MANIFEST.format(id="v", version="2"))).version
        == "2"
    )
