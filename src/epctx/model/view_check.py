"""A static check, read by mypy and imported by nothing: both loaders' classes satisfy the model view
(``epctx.model.view``). A change that breaks one fails ``mypy`` here, naming the class and the attribute;
``tests/test_model_view.py`` shows the check fails on a class that lacks one."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx_ir as ir

    from epctx.model import lean, view

    def _lean(
        v: lean.LeanValue,
        n: lean.LeanNode,
        a: lean.LeanAttribute,
        g: lean.LeanGraph,
        m: lean.LeanModel,
        d: lean.LeanDim,
    ) -> tuple[view.ValueView, view.NodeView, view.AttrView, view.GraphView, view.ModelView, view.DimView]:
        return v, n, a, g, m, d

    def _onnx_ir(
        v: ir.Value, n: ir.Node, a: ir.Attr, g: ir.Graph, m: ir.Model, d: ir.SymbolicDim, s: ir.Shape
    ) -> tuple[
        view.ValueView,
        view.NodeView,
        view.AttrView,
        view.GraphView,
        view.ModelView,
        view.DimView,
        view.ShapeView,
    ]:
        return v, n, a, g, m, d, s
