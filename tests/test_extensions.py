"""The extension registry: manifests, validation errors (file:line: field), registration,
claims and lowering, YAML-only operations, entry points, the ``wia-hw ext`` CLI."""

from __future__ import annotations

import sys
import textwrap
from importlib import metadata

import numpy as np
import pytest
from click.testing import CliRunner

import wia_hw
from wia_hw import (
    Capability,
    DeviceExtension,
    ExtensionId,
    SpecError,
    list_extensions,
    load_extension,
    register_device_extension,
    registry,
    unregister_device_extension,
)
from wia_hw.cli import cli
from wia_hw.graph import GraphBuilder
from wia_hw.registry import _modules
from wia_hw.workloads import gemm

BUILTINS = ("analog", "photonic", "pim", "transformer_engine")

SPARSE = """\
schema_version: 1
extension_id: sparse_unit
version: "1.0"
requires: {wia_hw: ">=0.1, <1.0"}
capabilities: [structured_sparsity]
parameters:
  keep: {type: int, default: 2, min: 1, max: 4}
  group: {type: int, default: 4, min: 1, max: 16}
operations:
  - name: sparse_linear
    claims: [linear, matmul]
    compose: [matmul]
    cost:
      cycles: "B * ceil(M / array_rows) * ceil(N / array_cols) * (ceil(K * keep / group / rate) + 2 * array_rows + array_cols - 2)"
      macs: "B * M * N * ceil(K * keep / group)"
"""


def write(tmp_path, name, text, module=None):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    if module is not None:
        (tmp_path / module[0]).write_text(textwrap.dedent(module[1]))
    return p


def mutate(text, old, new):
    assert old in text, old
    return text.replace(old, new, 1)


def line_of(path, needle):
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if needle in line:
            return i
    raise AssertionError(needle)


# -- the built-in manifests -------------------------------------------------------------
def test_builtin_extensions_load_and_list():
    assert set(BUILTINS) <= set(list_extensions())
    for name in BUILTINS:
        e = load_extension(name)
        assert e.extension_id == ExtensionId(name) and e.version == "1.0"
        assert e.capabilities and e.operations
        assert e.source.name == f"{name}.yaml"
        for o in e.operations:
            assert callable(e.implementation(o.name)) or o.yaml_only


def test_the_seed_transformer_engine_struct():
    e = load_extension(ExtensionId.TRANSFORMER_ENGINE)
    assert e.version == "1.0"
    assert list(e.capabilities) == [
        Capability.FUSED_ATTENTION,
        Capability.FAST_SOFTMAX,
        Capability.SPARSE_ATTENTION,
        Capability.FLASH_ATTENTION,
    ]
    assert [o.name for o in e.operations] == [
        "multi_head_attention_fused",
        "self_attention_sparse",
        "cross_attention_optimized",
    ]
    assert e.implementation("multi_head_attention_fused").__name__ == "multi_head_attention_impl"


def test_enums_accept_their_strings():
    assert ExtensionId("pim") is ExtensionId.PIM
    assert ExtensionId("TRANSFORMER_ENGINE") is ExtensionId.TRANSFORMER_ENGINE
    assert Capability("flash_attention") is Capability.FLASH_ATTENTION
    assert ExtensionId.PIM == "pim"


def test_a_python_built_extension_like_the_seed():
    def impl(op, graph, spec, storage, ext):
        return None

    e = DeviceExtension(
        extension_id="mine",
        version="0.3",
        capabilities=[Capability.FUSED_ATTENTION],
        operations=[("fused", impl)],
    )
    assert e.operations[0].impl is impl and e.file == "<python>"
    ctx = wia_hw.open_device("wia-edge")
    register_device_extension(ctx, e)
    assert ctx.extensions["mine"] is not None


# -- validation errors name file, line and field -----------------------------------------
def expect(path, field, message, line_needle=None, **kw):
    with pytest.raises(SpecError) as ei:
        load_extension(path, **kw)
    err = ei.value
    assert err.file == str(path), err
    assert err.field == field, err
    if line_needle is not None:
        assert err.line == line_of(path, line_needle), err
    assert message in err.message, err
    assert str(err).startswith(f"{path}:")
    assert "\n" not in str(err)
    return err


def test_unknown_capability(tmp_path):
    p = write(
        tmp_path,
        "x.yaml",
        mutate(SPARSE, "[structured_sparsity]", "[structured_sparsity, telepathy]"),
    )
    expect(p, "capabilities.1", "unknown capability 'telepathy'", "capabilities:")


def test_incompatible_version(tmp_path):
    p = write(tmp_path, "x.yaml", mutate(SPARSE, '">=0.1, <1.0"', '">=2.0"'))
    expect(
        p,
        "requires.wia_hw",
        "incompatible version: the extension needs wia_hw >=2.0, "
        f"this is wia_hw {wia_hw.__version__}",
        "requires:",
    )
    p = write(tmp_path, "y.yaml", mutate(SPARSE, '">=0.1, <1.0"', '"~=0.1"'))
    expect(p, "requires.wia_hw", "bad version clause '~=0.1'")
    p = write(tmp_path, "z.yaml", mutate(SPARSE, 'version: "1.0"', 'version: "one"'))
    expect(p, "version", "must be a version like '1.0'", 'version: "one"')


def test_parameter_out_of_range(tmp_path):
    p = write(tmp_path, "x.yaml", mutate(SPARSE, "default: 2, min: 1", "default: 9, min: 1"))
    expect(p, "parameters.keep.default", "value 9 is above the maximum 4", "keep:")
    p = write(tmp_path, "y.yaml", SPARSE)
    expect(
        p, "parameters.group", "value 0 is below the minimum 1", "group:", parameters={"group": 0}
    )
    expect(p, "parameters.group", "must be an integer, got 2.5", parameters={"group": 2.5})
    expect(p, "parameters.nope", "unknown parameter (known: keep, group)", parameters={"nope": 1})
    ext = load_extension(p)
    with pytest.raises(SpecError, match=r"y\.yaml:\d+: parameters\.keep: value 5 is above"):
        ext.with_parameters(keep=5)
    assert ext.with_parameters(keep=1).param("keep") == 1


def test_implementation_outside_the_module_is_refused(tmp_path):
    mod = (
        "evil_ext.py",
        """\
        from os import system
        import subprocess

        def good(op, graph, spec, storage, ext):
            return None

        helper = subprocess.run
    """,
    )
    base = textwrap.dedent("""\
    schema_version: 1
    extension_id: evil
    version: "1.0"
    module: evil_ext
    operations:
      - name: op
        impl: IMPL
        claims: [gelu]
    """)
    for impl, msg in [
        ("os.system", "implementation reference 'os.system' points outside the extension's module"),
        ("evil_ext.good", "points outside the extension's module"),
        ("../x:good", "points outside the extension's module"),
        (
            "system",
            "'system' in evil_ext.py is not a function defined there (it is imported from os)",
        ),
        (
            "subprocess",
            "'subprocess' in evil_ext.py is not a function defined there (it is "
            "imported from subprocess)",
        ),
        ("helper", "'helper' in evil_ext.py is not a function defined there (it is assigned)"),
        ("eval", "module evil_ext.py has no function 'eval'"),
    ]:
        p = write(tmp_path, "evil.yaml", base.replace("IMPL", repr(impl)[1:-1]), mod)
        expect(p, "operations.0.impl", msg, "impl:")
    p = write(tmp_path, "evil.yaml", base.replace("IMPL", "good"), mod)
    assert callable(load_extension(p).implementation("op"))
    p = write(
        tmp_path,
        "evil2.yaml",
        base.replace("IMPL", "good").replace("module: evil_ext", "module: ../evil_ext"),
        mod,
    )
    expect(p, "module", "must name a Python module beside the manifest", "module:")
    p = write(
        tmp_path,
        "evil3.yaml",
        base.replace("IMPL", "good").replace("module: evil_ext", "module: os"),
    )
    expect(p, "module", "no module os.py beside the manifest")
    p = write(
        tmp_path, "evil4.yaml", base.replace("IMPL", "good").replace("module: evil_ext\n", "")
    )
    expect(p, "operations.0.impl", "an impl needs the extension's module")


def test_two_extensions_claiming_one_op(tmp_path):
    a = write(tmp_path, "a.yaml", SPARSE)
    b = write(
        tmp_path,
        "b.yaml",
        mutate(
            mutate(SPARSE, "sparse_unit", "other_unit"), "name: sparse_linear", "name: other_linear"
        ),
    )
    ctx = wia_hw.open_device("wia-npu")
    register_device_extension(ctx, a)
    with pytest.raises(SpecError) as ei:
        register_device_extension(ctx, b)
    err = ei.value
    assert err.file == str(b) and err.field == "operations.0.claims.0"
    assert err.line == line_of(b, "claims:")
    assert (
        "op kind 'linear' is already claimed by extension 'sparse_unit' (operation "
        "'sparse_linear')" in err.message
    )
    assert "other_unit" not in ctx.extensions  # nothing half-registered
    # the same operation name twice
    c = write(
        tmp_path,
        "c.yaml",
        mutate(mutate(SPARSE, "sparse_unit", "third_unit"), "[linear, matmul]", "[conv2d]"),
    )
    with pytest.raises(
        SpecError,
        match=r"c\.yaml:\d+: operations\.0\.name: operation "
        r"'sparse_linear' is already registered by extension "
        r"'sparse_unit'",
    ):
        register_device_extension(ctx, c)
    with pytest.raises(
        SpecError,
        match=r"extensions\.0|extension 'sparse_unit' is already "
        r"registered",
    ):
        register_device_extension(ctx, a)
    unregister_device_extension(ctx, "sparse_unit")
    assert "linear" not in ctx.providers and "sparse_unit" not in ctx.extensions
    register_device_extension(ctx, b)
    assert ctx.providers["linear"][0] == "other_unit"


@pytest.mark.parametrize(
    ("old", "new", "field", "message"),
    [
        (
            "schema_version: 1",
            "schema_version: 7",
            "schema_version",
            "unsupported schema_version 7",
        ),
        (
            "extension_id: sparse_unit",
            "extension_id: 'sparse unit'",
            "extension_id",
            "must be an identifier",
        ),
        ('version: "1.0"\n', 'version: "1.0"\ncolour: blue\n', "colour", "unknown field"),
        (
            "claims: [linear, matmul]",
            "claims: [linear, frobnicate]",
            "operations.0.claims.1",
            "'frobnicate' is neither a graph op kind",
        ),
        (
            "compose: [matmul]",
            "compose: [teleport]",
            "operations.0.compose.0",
            "unknown primitive 'teleport'",
        ),
        (
            "compose: [matmul]",
            "compose: [softmax]",
            "operations.0.claims.0",
            "claims 'linear' but compose starts with 'softmax'",
        ),
        ('macs: "B', 'flops: "B', "operations.0.cost.flops", "unknown key 'flops'"),
        (
            'cycles: "B',
            "cycles: \"__import__('os') + B",
            "operations.0.cost.cycles",
            "call of '__import__' is not allowed",
        ),
        ('cycles: "B', 'cycles: "tile_m + B', "operations.0.cost.cycles", "unknown name 'tile_m'"),
        (
            "{type: int, default: 2, min: 1, max: 4}",
            "{type: complex, default: 2}",
            "parameters.keep.type",
            "must be one of int, float, bool, str",
        ),
        ("keep: {type", "M: {type", "parameters.M", "'M' is reserved"),
        ("    cost:\n", "    cost_model:\n", "operations.0.cost_model", "unknown key"),
    ],
)
def test_manifest_errors(tmp_path, old, new, field, message):
    p = write(tmp_path, "bad.yaml", mutate(SPARSE, old, new))
    err = expect(p, field, message)
    assert err.line is not None


def test_malformed_and_missing(tmp_path):
    p = write(tmp_path, "bad.yaml", "schema_version: 1\nextension_id: [unclosed\n")
    with pytest.raises(SpecError, match=r"bad\.yaml:\d+: malformed YAML"):
        load_extension(p)
    p = write(tmp_path, "list.yaml", "- 1\n- 2\n")
    with pytest.raises(SpecError, match=r"must be a YAML mapping"):
        load_extension(p)
    p = write(tmp_path, "noid.yaml", "schema_version: 1\nversion: '1.0'\n")
    expect(p, "extension_id", "missing required field")
    with pytest.raises(SpecError, match=r"no such extension manifest"):
        load_extension(tmp_path / "absent.yaml")
    with pytest.raises(SpecError, match=r"unknown extension 'warp_drive' \(known: .*pim"):
        load_extension("warp_drive")


# -- YAML-only operations lower and run ---------------------------------------------------
def test_yaml_only_operation_runs_a_workload(tmp_path):
    p = write(tmp_path, "sparse.yaml", SPARSE)
    g = gemm(2048, 2048, 2048)
    base = wia_hw.run(g)
    ctx = wia_hw.open_device("wia-npu")
    register_device_extension(ctx, p)
    r = ctx.run(g)
    (k,) = r.kernels
    assert k.provider == "sparse_unit" and k.kind == "gemm"
    assert r.counters.macs == 2048 * 2048 * 1024  # half the MACs are skipped
    assert k.record.extra["dense_macs"] == 2048**3
    # half the MACs, tiles costed one block each (no pipelined passes): 0.126 ms against
    # the pipelined dense array's 0.161
    assert r.latency_ms < 0.8 * base.latency_ms
    assert r.latency_ms >= r.roofline_floor_ms / 2  # no faster than its own roofline
    # the same bytes move: the cost model changes compute, not data
    assert r.counters.bytes["hbm"] == base.counters.bytes["hbm"]


def test_cost_model_is_evaluated_per_tile(tmp_path):
    text = mutate(SPARSE, 'cycles: "B * ceil', 'cycles: "100000 + 0 * B * ceil')
    p = write(tmp_path, "const.yaml", text)
    ctx = wia_hw.open_device("wia-npu")
    register_device_extension(ctx, p)
    r = ctx.run(gemm(1024, 1024, 1024), trace=True)
    computes = [e for e in r.trace if e.kind == "compute"]
    assert computes and all(e.end - e.start == 100000 for e in computes)
    assert r.kernels[0].tiles == len(computes)


def test_composed_chain_fuses_ops(tmp_path):
    text = """\
    schema_version: 1
    extension_id: fused_ffn
    version: "1.0"
    parameters:
      epilogue_cycles: {type: int, default: 8, min: 0, max: 1000}
    operations:
      - name: linear_gelu
        claims: [linear]
        compose: [matmul, gelu]
        cost:
          cycles: "B * ceil(M / array_rows) * ceil(N / array_cols) * (ceil(K / rate) + 2 * array_rows + array_cols - 2 + epilogue_cycles)"
    """
    p = write(tmp_path, "ffn.yaml", text)
    ctx = wia_hw.open_device("wia-npu")
    register_device_extension(ctx, p)
    r = ctx.run("bert-base", batch=1, seq=64, layers=1, mode="functional", seed=3)
    names = {k.name: k.provider for k in r.kernels}
    assert names["layer0.feed_forward_intermediate+gelu"] == "fused_ffn"
    assert "layer0.feed_forward_gelu" not in names  # fused away
    assert names["layer0.attention_qkv_projection"] == "builtin"  # no gelu after it
    base = wia_hw.run("bert-base", batch=1, seq=64, layers=1, mode="functional", seed=3)
    for name, val in base.outputs.items():
        np.testing.assert_array_equal(r.outputs[name], val)
    fused = next(k for k in r.kernels if k.provider == "fused_ffn")
    assert (
        fused.record.io[1] == ("layer0.feed_forward_gelu",) if hasattr(fused.record, "io") else True
    )


def test_provider_declining_falls_back_to_builtin():
    calls = []

    def picky(op, graph, spec, storage, ext):
        calls.append(op.name)
        return None

    e = DeviceExtension(
        extension_id="picky",
        version="1.0",
        operations=[registry.Operation(name="p", impl=picky, claims=("gelu",))],
    )
    ctx = wia_hw.open_device("wia-npu")
    register_device_extension(ctx, e)
    r = ctx.run("bert-base", batch=1, seq=32, layers=1)
    assert calls == ["layer0.feed_forward_gelu"]
    assert all(k.provider == "builtin" for k in r.kernels)


# -- entry points -----------------------------------------------------------------------
def test_entry_point_extension(tmp_path, monkeypatch):
    pkg = tmp_path / "thirdparty_npu"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        textwrap.dedent("""\
        WIA_HW_MANIFEST = "manifest.yaml"

        def gelu_impl(op, graph, spec, storage, ext):
            return None
    """)
    )
    (pkg / "manifest.yaml").write_text(
        textwrap.dedent("""\
        schema_version: 1
        extension_id: thirdparty
        version: "2.1"
        capabilities: [video_processing]
        operations:
          - name: tp_gelu
            impl: gelu_impl
            claims: [gelu]
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = metadata.EntryPoint("thirdparty", "thirdparty_npu", registry.ENTRY_POINT_GROUP)
    real = _modules.entry_points
    monkeypatch.setattr(
        _modules,
        "entry_points",
        lambda group: [ep] if group == registry.ENTRY_POINT_GROUP else real(group),
    )
    assert "thirdparty" in list_extensions()
    e = load_extension("thirdparty")
    assert e.version == "2.1" and e.module_obj is sys.modules["thirdparty_npu"]
    assert e.implementation("tp_gelu").__name__ == "gelu_impl"
    ctx = wia_hw.open_device("wia-npu")
    register_device_extension(ctx, "thirdparty")
    assert ctx.providers["gelu"][0] == "thirdparty"


def test_impl_from_an_operation_entry_point(tmp_path, monkeypatch):
    (tmp_path / "opsmod.py").write_text("def fn(op, graph, spec, storage, ext):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = metadata.EntryPoint("my_fn", "opsmod:fn", registry.OPERATION_ENTRY_POINT_GROUP)
    monkeypatch.setattr(
        _modules,
        "entry_points",
        lambda group: [ep] if group == registry.OPERATION_ENTRY_POINT_GROUP else [],
    )
    p = write(
        tmp_path,
        "e.yaml",
        """\
        schema_version: 1
        extension_id: epop
        version: "1.0"
        operations:
          - {name: o, impl: "entry-point:my_fn", claims: [relu]}
          - {name: o2, impl: "entry-point:absent", claims: [tanh]}
    """,
    )
    expect(p, "operations.1.impl", "no installed entry point 'absent'")


# -- the CLI ----------------------------------------------------------------------------
def test_cli_list_show_validate(tmp_path):
    runner = CliRunner()
    res = runner.invoke(cli, ["ext", "list"])
    assert res.exit_code == 0 and all(b in res.output for b in BUILTINS)
    res = runner.invoke(cli, ["ext", "show", "transformer_engine", "--set", "block_q=64"])
    assert res.exit_code == 0 and "extension_id: transformer_engine" in res.output
    assert "value: 64" in res.output
    good = write(tmp_path, "good.yaml", SPARSE)
    res = runner.invoke(cli, ["ext", "validate", str(good)])
    assert res.exit_code == 0 and "ok (extension 'sparse_unit' 1.0, 1 operation)" in res.output
    bad = write(tmp_path, "bad.yaml", mutate(SPARSE, "[structured_sparsity]", "[nope]"))
    res = runner.invoke(cli, ["ext", "validate", str(bad)])
    assert res.exit_code == 2
    assert (
        f"wia-hw: error: {bad}:" in res.output
        and "capabilities.0: unknown capability" in res.output
    )


def test_cli_register_installs_and_runs(tmp_path, monkeypatch):
    home = tmp_path / "exts"
    monkeypatch.setenv(registry.PATH_ENV, str(home))
    src = write(tmp_path, "sparse.yaml", SPARSE)
    runner = CliRunner()
    res = runner.invoke(
        cli, ["ext", "register", str(src), "--run", "bert-base", "-b", "1", "-s", "32"]
    )
    assert res.exit_code == 0, res.output
    assert (
        "extension 'sparse_unit' 1.0 registers on 'wia-npu' (claims linear, matmul)" in res.output
    )
    assert (home / "sparse_unit.yaml").is_file()
    assert "sparse_unit" in res.output and "Kernels by provider" in res.output
    assert "sparse_unit" in list_extensions()
    assert load_extension("sparse_unit").source == home / "sparse_unit.yaml"
    res = runner.invoke(cli, ["ext", "register", str(src)])
    assert res.exit_code == 2 and "exists" in res.output
    res = runner.invoke(cli, ["ext", "register", str(src), "--force"])
    assert res.exit_code == 0
    clash = write(
        tmp_path,
        "clash.yaml",
        mutate(mutate(SPARSE, "sparse_unit", "clash"), "name: sparse_linear", "name: c2"),
    )
    res = runner.invoke(cli, ["ext", "register", str(clash), "--with", "sparse_unit", "--dry-run"])
    assert res.exit_code == 2 and "already claimed by extension 'sparse_unit'" in res.output


def test_graph_builder_attention_with_engine_reports_provider():
    ctx = wia_hw.open_device("wia-npu")
    register_device_extension(ctx, "transformer_engine")
    b = GraphBuilder("attn", "fp16")
    q = b.input("q", (8, 256, 64))
    k = b.input("k", (8, 256, 64))
    v = b.input("v", (8, 256, 64))
    s = b.op("bmm", "scores", [q, k], transpose_b=True, scale=0.125)
    p = b.op("softmax", "probs", [s])
    b.op("bmm", "ctx", [p, v])
    r = ctx.run(b.graph())
    assert [(k.name, k.provider) for k in r.kernels] == [
        ("scores+softmax+context", "transformer_engine")
    ]
    d = r.to_dict()
    assert d["kernels"][0]["provider"] == "transformer_engine"


def test_cli_list_survives_a_broken_installed_manifest(tmp_path, monkeypatch):
    monkeypatch.setenv(registry.PATH_ENV, str(tmp_path))
    (tmp_path / "broken.yaml").write_text("schema_version: 1\nextension_id: broken\n")
    res = CliRunner().invoke(cli, ["ext", "list"])
    assert res.exit_code == 0 and "broken" in res.output and "invalid" in res.output
    assert "transformer_engine" in res.output


# -- extension kernels (the emulator side) -----------------------------------------------
def test_extension_kernel_constructors_check_their_arguments():
    from wia_hw.emulator.extension_kernels import MemoryKernel, Tile, TiledKernel

    t = Tile([], [], 10, 0, 0, 1, 0, 0)
    with pytest.raises(ValueError, match=r"TiledKernel 'bad' has no tiles"):
        TiledKernel(name="bad", op="o", group="g", op_kind="bmm")
    with pytest.raises(ValueError, match=r"TiledKernel.macs must be a non-negative integer"):
        TiledKernel(name="k", op="o", group="g", op_kind="bmm", tiles=(t,), macs=-1)
    with pytest.raises(ValueError, match=r"TiledKernel.groups must start at 0 and increase"):
        TiledKernel(name="k", op="o", group="g", op_kind="bmm", tiles=(t, t), groups=(1,))
    with pytest.raises(ValueError, match=r"MemoryKernel.cycles must be a non-negative"):
        MemoryKernel(name="m", op="o", group="g", op_kind="pim", cycles=-5)


def test_tile_groups_stay_on_one_core():
    from wia_hw.emulator.device import Device
    from wia_hw.emulator.kernels import Tile as T

    _partition = Device.partition

    tiles = [T([], [], i, 0, 0, 1, 0, 0) for i in range(10)]
    shares = _partition(tiles, (0, 3, 4, 8), 4)
    assert [len(s) for s in shares] == [3, 1, 4, 2]
    assert [t for s in shares for t in s] == tiles  # contiguous, in order
    shares = _partition(tiles, (0, 5), 4)  # fewer groups than cores
    assert sorted(len(s) for s in shares) == [0, 0, 5, 5]


# -- validation runs nothing -------------------------------------------------------------

_LOUD_MODULE = (
    "loud.py",
    """\
    import pathlib

    pathlib.Path(__file__).with_name("ran.txt").write_text("module code ran")
    raise RuntimeError("import-time side effect")

    def good(op, graph, spec, storage, ext):
        return None
""",
)
_LOUD_MANIFEST = """\
    schema_version: 1
    extension_id: loud
    version: "1.0"
    module: loud
    operations:
      - name: loud_gelu
        impl: good
        claims: [gelu]
"""


def test_validate_show_and_load_do_not_run_the_module(tmp_path):
    """The module writes a file and raises when imported: validating the manifest reads
    its source only, so neither happens; registering imports it, so both do."""
    p = write(tmp_path, "loud.yaml", _LOUD_MANIFEST, _LOUD_MODULE)
    ran = tmp_path / "ran.txt"
    runner = CliRunner()
    for args in (["ext", "validate", str(p)], ["ext", "show", str(p)]):
        res = runner.invoke(cli, args)
        assert res.exit_code == 0, res.output
    assert (
        "ok (extension 'loud' 1.0, 1 operation)"
        in runner.invoke(cli, ["ext", "validate", str(p)]).output
    )
    e = load_extension(p)
    assert e.operation("loud_gelu").impl == "good"
    assert not ran.exists()
    res = runner.invoke(cli, ["ext", "register", str(p), "--dry-run"])
    assert res.exit_code == 2
    assert res.output.strip() == (
        f"wia-hw: error: {p}:4: module: importing loud.py failed: "
        "RuntimeError: import-time side effect"
    )
    assert ran.read_text() == "module code ran"


def test_static_check_of_the_module(tmp_path):
    mod = (
        "m.py",
        """\
        import functools

        def deco(f):
            return functools.wraps(f)(lambda *a: f(*a))

        @deco
        def decorated(op, graph, spec, storage, ext):
            return None

        async def later(op, graph, spec, storage, ext):
            return None

        class Impl:
            pass

        def rebound(op, graph, spec, storage, ext):
            return None

        rebound = functools.partial(rebound)

        if True:
            def conditional(op, graph, spec, storage, ext):
                return None
    """,
    )
    base = textwrap.dedent("""\
    schema_version: 1
    extension_id: st
    version: "1.0"
    module: m
    operations:
      - name: op
        impl: IMPL
        claims: [gelu]
    """)
    for impl in ("decorated", "later"):
        p = write(tmp_path, "st.yaml", base.replace("IMPL", impl), mod)
        assert load_extension(p).operation("op").impl == impl
    for impl, msg in [
        ("Impl", "(it is a class)"),
        ("rebound", "(it is assigned)"),
        ("conditional", "module m.py has no function 'conditional'"),
    ]:
        p = write(tmp_path, "st.yaml", base.replace("IMPL", impl), mod)
        expect(p, "operations.0.impl", msg, "impl:")
    p = write(tmp_path, "st.yaml", base.replace("IMPL", "good"), ("m.py", "def good(:\n    pass\n"))
    expect(p, "module", "m.py:1: does not parse: ")
