"""One output row per workgroup for IREE's data-tiled convolutions over small images: a change to IREE's own
lowering configurations, made between ``iree-compile --compile-to=executable-configurations`` and
``--compile-from=executable-configurations`` (in the compile worker; text only).

IREE 3.13 gives a data-tiled convolution whose output is at most 7x7 (ResNet-18's last stage: 7x7 over 512 channels,
a 9.4 MB filter) workgroups of four output rows (``distribution = [0, 4, 1, ...]``); with one row each, the same code
runs 10-14 % faster here (one thread, each dispatch's fastest of 15 runs: 2.53-2.80 -> 2.28-2.44 ms for the three
7x7x512 convolutions, 1.22-1.29 -> 1.13-1.17 ms for the strided one; the whole module 28.3-30.5 -> 27.6-28.1 ms).
ResNet-18 in one process with and without it (bench_iree_ab, sizes stated, cpu ratio to onnxruntime): 1.53-1.54 ->
1.44-1.46. Other row counts ([0, 1, 2 / 7 / 32, ...] the same; [0, 7, 1, ...] no gain), and the 14x14 and 56x56
convolutions (1, 2 or 4 rows, 1 to 56 column tiles), measured no better. IREE's tuning specs cannot carry this:
in 3.13 they apply before the data-tiled convolutions exist (options.py). A configuration this does not recognise is
left as it is; a compile that fails with the change is tried again without it (``compile._run_one``)."""

from __future__ import annotations

import re

__all__ = ["MAX_ROWS", "one_row_small_convs"]

MAX_ROWS = 7  # the largest output height (and width) changed

_FUNC = re.compile(r"func\.func @[^\s(]*?_conv_(\d+)x(\d+)x[0-9a-z_]*\(")
_DISTRIBUTION = re.compile(r"distribution = \[(\d+), (\d+), ((?:\d+, ){6}\d+)\]")
_PIPELINE = "Mmt4dTilingExpert"


def one_row_small_convs(text: str) -> tuple[str, int]:
    """``text`` (an MLIR module at IREE's executable configurations) with each data-tiled convolution whose output
    is at most ``MAX_ROWS`` x ``MAX_ROWS`` distributed one output row per workgroup; and how many were changed."""
    matches = list(_FUNC.finditer(text))
    pieces, done, changed = [], 0, 0
    for match in matches:
        if int(match.group(1)) > MAX_ROWS or int(match.group(2)) > MAX_ROWS:
            continue
        start = match.start()
        following = text.find("func.func @", match.end())  # the next function begins past this one's body
        body = text[start : following if following >= 0 else len(text)]
        found = _DISTRIBUTION.search(body)
        header = body.split("\n", 1)[0]  # its attributes: the translation_info names the pipeline
        if _PIPELINE not in header or found is None or int(found.group(2)) <= 1:
            continue
        pieces += [
            text[done : start + found.start()],
            f"distribution = [{found.group(1)}, 1, {found.group(3)}]",
        ]
        done = start + found.end()
        changed += 1
    return "".join(pieces) + text[done:], changed
