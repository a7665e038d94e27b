"""The placement as a picture: one self-contained HTML page (no external URL, no library) drawing the graph
with each node coloured by the EP that runs it, each fused partition boxed, and on hover the node's details
and why every EP ahead of its EP declined it.

The layout is computed here (a layered drawing: a node sits one row below its lowest producer; a node without
producers, e.g. a Constant, one row above its first consumer; nodes of one partition side by side in a row);
the page's script draws it as SVG from the JSON embedded in the page.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from epctx.partition.placement import NodePlacement, placement_summary

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = ["provider_colors", "render_placement_page"]

_KNOWN_COLORS = {
    "CPUExecutionProvider": "#9e9e9e",
    "OpenVINOExecutionProvider": "#8e24aa",
    "IREEExecutionProvider": "#1e88e5",
    "ExampleExecutionProvider": "#43a047",
}
_PALETTE = ("#fb8c00", "#e53935", "#00897b", "#6d4c41", "#3949ab", "#c0ca33", "#d81b60", "#5e35b1")


def provider_colors(providers: Sequence[str]) -> dict[str, str]:
    """A fixed colour per EP: the shipped EPs always get theirs, others take the palette in list order."""
    colors: dict[str, str] = {}
    spare = iter(_PALETTE)
    for name in providers:
        if name not in colors:
            colors[name] = _KNOWN_COLORS.get(name) or next(spare, "#607d8b")
    return colors


def _edges(graph: ir.Graph) -> list[tuple[int, int]]:
    index = {node: i for i, node in enumerate(graph)}
    edges = set()
    for j, node in enumerate(graph):
        for value in node.inputs:
            producer = value.producer() if value is not None else None
            i = index.get(producer) if producer is not None else None
            if i is not None and i != j:
                edges.add((i, j))
    return sorted(edges)


def _layers(count: int, edges: Sequence[tuple[int, int]]) -> list[int]:
    """Row of each node: one below its lowest producer (graph order is topological); a node without producers
    one row above its first consumer."""
    producers: list[list[int]] = [[] for _ in range(count)]
    consumers: list[list[int]] = [[] for _ in range(count)]
    for i, j in edges:
        producers[j].append(i)
        consumers[i].append(j)
    layer = [0] * count
    for j in range(count):
        if producers[j]:
            layer[j] = 1 + max(layer[i] for i in producers[j])
    for i in range(count):
        if not producers[i] and consumers[i]:
            layer[i] = max(0, min(layer[j] for j in consumers[i]) - 1)
    return layer


def _bodies(placement: Sequence[NodePlacement]) -> dict[int, dict[str, dict[str, int]]]:
    """For each main-graph node, the nodes of its control-flow bodies per body and EP (a body's nodes follow
    their control-flow node in the placement)."""
    found: dict[int, dict[str, dict[str, int]]] = {}
    owner = -1
    for p in placement:
        if not p.graph:
            owner = p.index
            continue
        counts = found.setdefault(owner, {}).setdefault(p.graph, {})
        counts[p.provider] = counts.get(p.provider, 0) + 1
    return found


def _columns(main: Sequence[NodePlacement], layer: Sequence[int]) -> tuple[dict[int, int], dict[int, int]]:
    """Each node's column in its row (a partition's nodes side by side), and each row's size."""
    first: dict[str, int] = {}  # a partition's place in a row: that of its first node
    for p in main:
        if p.partition is not None:
            first.setdefault(p.partition, p.index)
    rows: dict[int, list[NodePlacement]] = {}
    for p in main:
        rows.setdefault(layer[p.index], []).append(p)
    column: dict[int, int] = {}
    for members in rows.values():
        members.sort(key=lambda p: (first.get(p.partition or "", p.index), p.index))
        for k, p in enumerate(members):
            column[p.index] = k
    return column, {row: len(members) for row, members in rows.items()}


def page_data(graph: ir.Graph, placement: Sequence[NodePlacement], *, title: str) -> dict[str, Any]:
    """What the page draws, as plain data (the page embeds it as JSON): the main graph's nodes, each with the
    placement of its control-flow bodies' nodes in its details."""
    main = [p for p in placement if not p.graph]
    edges = _edges(graph)
    layer = _layers(len(main), edges)
    column, row_size = _columns(main, layer)
    bodies = _bodies(placement)
    providers = list(
        dict.fromkeys([*(ep for p in placement for ep, _ in p.declined), *(p.provider for p in placement)])
    )
    colors = provider_colors(providers)
    summary = placement_summary(placement)
    in_bodies = placement_summary([p for p in placement if p.graph])["nodes_per_provider"]
    partitions: dict[str, dict[str, Any]] = {}
    for p in main:
        if p.partition is not None:
            entry = partitions.setdefault(p.partition, {"name": p.partition, "ep": p.provider, "nodes": []})
            entry["nodes"].append(p.index)
    return {
        "title": title,
        "providers": [
            {
                "name": ep,
                "color": colors[ep],
                "nodes": summary["nodes_per_provider"].get(ep, 0),
                "in_bodies": in_bodies.get(ep, 0),
            }
            for ep in providers
        ],
        "nodes": [
            {
                **p.to_dict(),
                "layer": layer[p.index],
                "column": column[p.index],
                "row_size": row_size[layer[p.index]],
                "bodies": bodies.get(p.index, {}),
            }
            for p in main
        ],
        "edges": edges,
        "partitions": list(partitions.values()),
        "summary": summary,
    }


def render_placement_page(graph: ir.Graph, placement: Sequence[NodePlacement], *, title: str) -> str:
    """The page's HTML: ``placement`` is the session's (``get_node_placement()``) on ``graph``'s nodes."""
    data = json.dumps(page_data(graph, placement, title=title), sort_keys=True)
    data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return _PAGE.replace("{title}", html.escape(title)).replace("{data}", data)


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>epctx placement: {title}</title>
<style>
body { font: 13px sans-serif; margin: 0; display: flex; height: 100vh; }
#side { width: 360px; padding: 10px; overflow: auto; border-right: 1px solid #ccc; flex: none; }
#canvas { flex: 1; overflow: auto; }
.legend span.swatch { display: inline-block; width: 12px; height: 12px; margin-right: 6px; vertical-align: middle; }
.node rect { stroke: #333; stroke-width: 1; }
.node text { fill: #fff; font-size: 11px; pointer-events: none; }
.node.declined rect { stroke: #000; stroke-width: 2.5; stroke-dasharray: 4 2; }
.node:hover rect { stroke: #ff0; stroke-width: 3; }
.partition { fill: none; stroke-width: 2; stroke-dasharray: 6 3; }
.edge { stroke: #888; stroke-width: 1; fill: none; }
#details pre { white-space: pre-wrap; }
</style></head>
<body><div id="side"><h3 id="heading"></h3><div class="legend" id="legend"></div>
<h4>Largest reasons</h4><ol id="reasons"></ol><h4>Node</h4><div id="details">hover a node</div></div>
<div id="canvas"></div>
<script type="application/json" id="placement-data">{data}</script>
<script>
"use strict";
const data = JSON.parse(document.getElementById("placement-data").textContent);
const NS = "http://www.w3.org/2000/svg", W = 130, H = 26, GX = 14, GY = 34, PAD = 8;
const color = {};
data.providers.forEach(p => { color[p.name] = p.color; });
function el(tag, attrs, parent) {
  const e = document.createElementNS(NS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (parent) parent.appendChild(e);
  return e;
}
function describe(n) {
  const lines = [`${n.name || "(unnamed)"}  [${n.op_type}${n.domain ? " " + n.domain : ""}]`,
    `runs on ${n.provider}` + (n.partition ? ` in partition ${n.partition}` : "")];
  for (const ep in n.declined) lines.push(`${ep} declined it: ${n.declined[ep]}`);
  for (const body in n.bodies) {
    const counts = n.bodies[body], total = Object.values(counts).reduce((a, b) => a + b, 0);
    lines.push(`body ${body}: ${total} nodes (` + Object.entries(counts).map(([ep, k]) => `${ep} ${k}`).join(", ") + ")");
  }
  return lines.join("\\n");
}
document.getElementById("heading").textContent = "Placement of " + data.title;
const legend = document.getElementById("legend");
data.providers.forEach(p => {
  const row = document.createElement("div");
  row.className = "provider";
  row.dataset.ep = p.name;
  row.innerHTML = `<span class="swatch" style="background:${p.color}"></span>`;
  const inside = p.in_bodies ? ` (${p.in_bodies} in control-flow bodies)` : "";
  row.appendChild(document.createTextNode(`${p.name}: ${p.nodes} nodes${inside}`));
  legend.appendChild(row);
});
data.summary.top_reasons.forEach(r => {
  const li = document.createElement("li");
  li.textContent = `${r.provider} (${r.nodes} nodes, e.g. ${r.example || "(unnamed)"}): ${r.reason}`;
  document.getElementById("reasons").appendChild(li);
});
const widest = Math.max(1, ...data.nodes.map(n => n.row_size));
const rows = Math.max(0, ...data.nodes.map(n => n.layer)) + 1;
const width = widest * (W + GX) + 2 * PAD, height = rows * (H + GY) + 2 * PAD;
const svg = el("svg", {width: width, height: height, id: "graph"}, document.getElementById("canvas"));
const pos = {};
data.nodes.forEach(n => {
  const left = (width - n.row_size * (W + GX)) / 2;
  pos[n.index] = {x: left + n.column * (W + GX) + GX / 2, y: PAD + n.layer * (H + GY)};
});
const boxes = el("g", {id: "partitions"}, svg);
data.partitions.forEach(p => {
  const xs = p.nodes.map(i => pos[i].x), ys = p.nodes.map(i => pos[i].y);
  const x = Math.min(...xs) - 5, y = Math.min(...ys) - 5;
  const box = el("rect", {class: "partition", x: x, y: y, width: Math.max(...xs) + W + 5 - x,
    height: Math.max(...ys) + H + 5 - y, stroke: color[p.ep], "data-partition": p.name, "data-ep": p.ep}, boxes);
  el("title", {}, box).textContent = `partition ${p.name} on ${p.ep}: ${p.nodes.length} nodes`;
});
const edges = el("g", {id: "edges"}, svg);
data.edges.forEach(([a, b]) => {
  const s = pos[a], t = pos[b];
  el("path", {class: "edge", d: `M${s.x + W / 2},${s.y + H} C${s.x + W / 2},${s.y + H + GY / 2} ${t.x + W / 2},${t.y - GY / 2} ${t.x + W / 2},${t.y}`}, edges);
});
const nodes = el("g", {id: "nodes"}, svg);
const details = document.getElementById("details");
data.nodes.forEach(n => {
  const declined = Object.keys(n.declined).length > 0;
  const g = el("g", {class: "node" + (declined ? " declined" : ""), "data-index": n.index, "data-ep": n.provider,
    "data-name": n.name}, nodes);
  el("rect", {x: pos[n.index].x, y: pos[n.index].y, width: W, height: H, rx: 4, fill: color[n.provider]}, g);
  const label = el("text", {x: pos[n.index].x + 6, y: pos[n.index].y + 17}, g);
  const tail = (n.name || "").split("/").pop();
  label.textContent = (n.op_type + (tail && tail !== n.op_type ? " " + tail : "")).slice(0, 20);
  el("title", {}, g).textContent = describe(n);
  g.addEventListener("mouseover", () => {
    details.innerHTML = "";
    const pre = document.createElement("pre");
    pre.textContent = describe(n);
    details.appendChild(pre);
  });
});
document.body.dataset.rendered = String(data.nodes.length);
</script></body></html>
"""
