"""What the importer reads through ONNX's own definitions, before anything is mapped:
models older than opset 7, model-local functions, and standard ops that ONNX defines as
a function of other ops.

* **Opsets 1 to 6** (the ONNX model zoo's oldest files): ``onnx.version_converter``
  brings the model to opset 7, which rewrites what changed meaning there (the
  ``broadcast``/``axis`` attributes of Add, Mul, Gemm ...; Reshape's ``shape``
  attribute; BatchNormalization's ``consumed_inputs``). A model it cannot convert is
  an error naming the converter's complaint.
* **Removed experimental ops** (:data:`REMOVED_OPS`: ImageScaler, Scale, Affine ...,
  which ONNX no longer defines) are written as the standard ops they stand for.
* **Model-local functions** (``ModelProto.functions``: what
  ``torch.onnx.export(export_modules_as_functions=...)`` and onnxscript write) are
  inlined by ``onnx.inliner``.
* **Function ops**: a node of a standard op that wia-hw does not map, but that ONNX
  defines by a function body at the model's opset (MeanVarianceNormalization,
  RotaryEmbedding, SwiGLU, CenterCropPad ...; context-dependent bodies, which depend
  on the input types, too), is replaced by that body, inlined the same way, so its
  ops are mapped one by one. Nested function ops are expanded in turn (up to
  :data:`_DEPTH` levels).
"""

from __future__ import annotations

from typing import Any

from ..emulator.errors import WorkloadError

#: the private domain the expanded function bodies pass through
_DOMAIN = "wia_hw.expanded"
#: how many levels of function ops inside function bodies are expanded
_DEPTH = 4


def _default_opset(proto: Any) -> int | None:
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)


def upgrade_old_opset(onnx: Any, proto: Any, source: str) -> Any:
    """``proto`` at opset 7 when it is older (a new ModelProto), else itself."""
    opset = _default_opset(proto)
    if opset is None or opset >= 7:
        return proto
    import onnx.version_converter

    _legacy_broadcast(onnx, proto)
    try:
        return onnx.version_converter.convert_version(proto, 7)
    except Exception as e:  # noqa: BLE001 - the converter raises its own C++ errors
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise WorkloadError(
            f"{source}: an opset {opset} model; onnx's version converter could not bring "
            f"it to opset 7, the oldest wia-hw reads: {first}"
        ) from None


#: ops whose ``broadcast``/``axis`` attributes opset 7 replaced by numpy broadcasting
_LEGACY_BROADCAST = (
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "And",
    "Or",
    "Xor",
    "Equal",
    "Greater",
    "Less",
)


def _legacy_broadcast(onnx: Any, proto: Any) -> None:
    """Before opset 7, ``broadcast=1`` with ``axis`` aligned B's dims with A's from
    ``axis`` on (B ``[3]`` into A ``[1, 3, 8, 8]`` at axis 1 is ``[3, 1, 1]``), and
    PRelu's slope of C values was one per channel; the version converter unsqueezes B
    to A's rank instead and leaves the slope. Write those alignments out (an Unsqueeze
    of trailing ones) and drop the attributes, in place, so the converter sees numpy
    broadcasting."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False)
    except Exception:  # noqa: BLE001 - then the ranks that the model declares
        inferred = proto
    g = inferred.graph
    dims = {
        vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
        for vi in [*g.input, *g.value_info, *g.output]
        if vi.type.tensor_type.HasField("shape")
    }
    dims.update({t.name: list(t.dims) for t in g.initializer})
    rank = {k: len(v) for k, v in dims.items()}
    nodes = []
    for n in proto.graph.node:
        attrs = {a.name: a for a in n.attribute}
        if (  # PRelu's slope of C values: one per channel (axis 1), not numpy's
            n.op_type == "PRelu"
            and n.domain in ("", "ai.onnx")
            and rank.get(n.input[0], 0) >= 3
            and len(dims.get(n.input[1], [])) == 1
            and dims[n.input[1]][0] > 1
        ):
            slope = f"{n.input[1]}.per_channel_{len(nodes)}"
            nodes.append(
                onnx.helper.make_node(
                    "Unsqueeze", [n.input[1]], [slope], axes=list(range(1, rank[n.input[0]] - 1))
                )
            )
            n.input[1] = slope
        if (
            n.op_type in _LEGACY_BROADCAST
            and n.domain in ("", "ai.onnx")
            and len(n.input) == 2
            and "axis" in attrs
            and attrs.get("broadcast") is not None
            and attrs["broadcast"].i == 1
            and n.input[0] in rank
            and n.input[1] in rank
        ):
            ra, rb, axis = (
                rank[n.input[0]],
                rank[n.input[1]],
                attrs["axis"].i % max(rank[n.input[0]], 1),
            )
            trailing = ra - axis - rb
            if trailing > 0:
                b = f"{n.input[1]}.aligned_{len(nodes)}"
                nodes.append(
                    onnx.helper.make_node(
                        "Unsqueeze", [n.input[1]], [b], axes=list(range(rb, rb + trailing))
                    )
                )
                n.input[1] = b
            kept = [a for a in n.attribute if a.name not in ("axis", "broadcast")]
            kept.append(onnx.helper.make_attribute("broadcast", 1))
            del n.attribute[:]
            n.attribute.extend(kept)
        nodes.append(n)
    if len(nodes) != len(proto.graph.node):
        _set_nodes(onnx, proto.graph, nodes)


#: experimental ops of opsets 1 to 9 that ONNX has since removed (no schema left), and
#: the standard ops each stands for (tiny-YOLOv2 in the ONNX model zoo opens with an
#: ImageScaler)
REMOVED_OPS = ("ImageScaler", "Scale", "Affine", "ScaledTanh", "ParametricSoftplus")


def replace_removed_ops(onnx: Any, proto: Any) -> None:
    """Write each node of :data:`REMOVED_OPS` as standard ops, in place:
    ImageScaler ``x * scale + bias[c]``, Scale ``x * scale``, Affine
    ``alpha * x + beta``, ScaledTanh ``alpha * tanh(beta * x)``, ParametricSoftplus
    ``alpha * softplus(beta * x)``."""
    import numpy as np

    g = proto.graph
    if not any(n.op_type in REMOVED_OPS and n.domain in ("", "ai.onnx") for n in g.node):
        return
    h = onnx.helper
    nodes, inits = [], []

    def const(base: str, value: Any) -> str:
        name = f"{base}.{len(inits)}"
        inits.append(onnx.numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    for n in g.node:
        if n.op_type not in REMOVED_OPS or n.domain not in ("", "ai.onnx"):
            nodes.append(n)
            continue
        a = {x.name: h.get_attribute_value(x) for x in n.attribute}
        x, y, base = n.input[0], n.output[0], n.name or n.output[0]

        def step(
            op: str, src: str, *consts: str, last: bool = False, base: str = base, y: str = y
        ) -> str:
            out = y if last else f"{y}.{op.lower()}{len(nodes)}"
            nodes.append(h.make_node(op, [src, *consts], [out], name=f"{base}/{op}{len(nodes)}"))
            return out

        if n.op_type == "ImageScaler":
            bias = a.get("bias")
            t = step("Mul", x, const(base, a.get("scale", 1.0)), last=not bias)
            if bias:
                step("Add", t, const(base, np.reshape(bias, (-1, 1, 1))), last=True)
        elif n.op_type == "Scale":
            step("Mul", x, const(base, a.get("scale", 1.0)), last=True)
        elif n.op_type == "Affine":
            t = step("Mul", x, const(base, a.get("alpha", 1.0)))
            step("Add", t, const(base, a.get("beta", 0.0)), last=True)
        else:  # ScaledTanh, ParametricSoftplus: alpha * f(beta * x)
            t = step("Mul", x, const(base, a.get("beta", 1.0)))
            t = step("Tanh" if n.op_type == "ScaledTanh" else "Softplus", t)
            step("Mul", t, const(base, a.get("alpha", 1.0)), last=True)
    _set_nodes(onnx, g, nodes)
    g.initializer.extend(inits)


def _set_nodes(onnx: Any, graph: Any, nodes: list[Any]) -> None:
    """Make ``nodes`` (some of them ``graph``'s own) the graph's nodes, in order:
    copied first, as clearing the field releases the ones it held."""
    copies = [onnx.NodeProto() for _ in nodes]
    for c, n in zip(copies, nodes, strict=True):
        c.CopyFrom(n)
    del graph.node[:]
    graph.node.extend(copies)


def _input_types(onnx: Any, proto: Any) -> dict[str, Any]:
    """Every value's TypeProto that shape inference knows (inputs, initializers,
    value_info), for context-dependent function bodies."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False)
    except Exception:  # noqa: BLE001 - then only what the model declares
        inferred = proto
    g = inferred.graph
    types = {vi.name: vi.type for vi in [*g.input, *g.value_info, *g.output]}
    for t in g.initializer:
        if t.name not in types:
            types[t.name] = onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims))
    return types


def _body(onnx: Any, node: Any, opset: int, types: dict[str, Any] | None) -> bytes | None:
    """The serialised FunctionProto that defines ``node``'s op at ``opset``, or None."""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, "")
    except onnx.defs.SchemaError:
        return None
    plain = [v for v in schema.function_opset_versions if v <= opset]
    if plain:
        return schema.get_function_with_opset_version(max(plain)) or None
    ctx = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    if not ctx or types is None or any(i and i not in types for i in node.input):
        return None
    empty = onnx.TypeProto()
    return (
        schema.get_context_dependent_function_with_opset_version(
            max(ctx),
            node.SerializeToString(),
            [(types[i] if i else empty).SerializeToString() for i in node.input],
        )
        or None
    )


def expand_functions(onnx: Any, proto: Any, mapped: set[str]) -> Any:
    """``proto`` with its local functions inlined and its nodes of standard ops outside
    ``mapped`` that ONNX defines by a function replaced by their bodies (a new
    ModelProto when anything changed, else ``proto``)."""
    import onnx.inliner

    if proto.functions:
        proto = onnx.inliner.inline_local_functions(proto)
    opset = _default_opset(proto)
    if opset is None:
        return proto
    for _ in range(_DEPTH):
        todo = [
            n for n in proto.graph.node if n.domain in ("", "ai.onnx") and n.op_type not in mapped
        ]
        if not todo:
            break
        types = None
        funcs = []
        for n in todo:
            try:
                schema = onnx.defs.get_schema(n.op_type, opset, "")
            except onnx.defs.SchemaError:
                continue
            if schema.context_dependent_function_opset_versions and types is None:
                types = _input_types(onnx, proto)
            body = _body(onnx, n, opset, types)
            if body is None:
                continue
            f = onnx.FunctionProto()
            f.ParseFromString(body)
            if not f.node:
                continue
            given = {a.name for a in n.attribute}
            for name, attr in schema.attributes.items():  # the body reads the defaults
                if name not in given and attr.default_value.name:
                    n.attribute.append(attr.default_value)
            f.domain, f.name = _DOMAIN, f"{n.op_type}_{len(funcs)}"
            del f.opset_import[:]
            f.opset_import.extend(o for o in proto.opset_import if o.domain != _DOMAIN)
            n.domain, n.op_type = _DOMAIN, f.name
            funcs.append(f)
        if not funcs:
            break
        proto.functions.extend(funcs)
        proto.opset_import.append(onnx.helper.make_opsetid(_DOMAIN, 1))
        proto = onnx.inliner.inline_local_functions(proto)
        kept = [o for o in proto.opset_import if o.domain != _DOMAIN]
        del proto.opset_import[:]
        proto.opset_import.extend(kept)
    return proto
