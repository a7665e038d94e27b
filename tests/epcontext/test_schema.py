"""The EPContext node view: defaults, validation errors, and a proto round trip that keeps binary payloads."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import pytest
from onnx import helper

import epctx
from epctx.ep._context_node import DOMAIN, OP_TYPE, EPContextNode


def _node(**attrs: object) -> ir.Node:
    proto = helper.make_node(OP_TYPE, ["x"], ["y"], domain=DOMAIN, name="ctx0", **attrs)
    graph = helper.make_graph(
        [proto],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]
    )
    return next(iter(ir.serde.deserialize_model(model).graph))


def test_defaults_and_binary_payload_round_trip():
    payload = bytes(range(256)) * 4  # not UTF-8
    view = EPContextNode.from_node(_node(ep_cache_context=payload, source="ExampleExecutionProvider"))
    assert (view.main_context, view.embed_mode, view.max_size) == (1, 1, 0)
    assert view.ep_cache_context == payload
    x = ir.Value(name="x")
    y = ir.Value(name="y")
    node = view.to_ir([x], [y])
    proto = ir.serde.serialize_node(node)
    attrs = {a.name: a for a in proto.attribute}
    assert attrs["ep_cache_context"].s == payload
    assert [a.name for a in proto.attribute] == ["main_context", "ep_cache_context", "embed_mode", "source"]
    assert EPContextNode.from_node(node).ep_cache_context == payload


def test_extra_attributes_are_kept():
    view = EPContextNode.from_node(
        _node(ep_cache_context=b"a.bin", embed_mode=0, source="QNN", is_multi_soc_ep_context=1)
    )
    assert view.extra == {"is_multi_soc_ep_context": 1}
    assert view.cache_path == "a.bin"


@pytest.mark.parametrize(
    ("attrs", "match"),
    [
        ({"ep_cache_context": b"x", "source": "A", "main_context": 2}, "main_context must be 0 or 1"),
        ({"ep_cache_context": b"x", "source": "A", "embed_mode": 3}, "embed_mode must be 0 or 1"),
        ({"source": "A"}, "requires a non-empty ep_cache_context"),
        ({"main_context": 0, "source": "A"}, "requires partition_name"),
        ({"ep_cache_context": b"x"}, "'source'"),
        ({"ep_cache_context": b"x", "source": "A", "embed_mode": "1"}, "'embed_mode' must be INT"),
    ],
)
def test_invalid_nodes_name_node_and_attribute(attrs, match):
    with pytest.raises(epctx.InvalidGraph, match=match) as info:
        EPContextNode.from_node(_node(**attrs))
    assert "ctx0" in str(info.value)
