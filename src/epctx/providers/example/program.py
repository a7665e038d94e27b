"""The example EP's compiled program: a list of lowered instructions over numbered value slots.

A program is plain data, serialized as JSON (UTF-8, sorted keys, no whitespace: the same program always gives
the same bytes); its weights travel beside it as raw little-endian entries of the context binary. Slots are
numbered in a fixed layout, so a program never stores a slot table:

    0 .. I-1          the partition's inputs, in order (``inputs`` holds their names)
    I .. I+W-1        the weights, in order (weight ``j`` is the binary entry ``weights/<j>``)
    I+W+k             the value instruction ``k`` produces (one output per instruction)

An instruction reads only slots numbered below its own, so a parsed program is valid by construction once
:meth:`Program.from_json` has checked the numbers. Nothing in it is code: ops are names the interpreter knows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from epctx.ep import dump_document, load_document
from epctx.errors import InvalidGraph

__all__ = ["FORMAT", "PROGRAM_VERSION", "WEIGHT_DTYPES", "Instruction", "Program", "WeightSpec"]

FORMAT = "epctx.example.program"
PROGRAM_VERSION = 1
# dtype names a program may use for weights -> the numpy dtype they are stored as (always little-endian)
WEIGHT_DTYPES: Mapping[str, str] = {"float32": "<f4"}


@dataclasses.dataclass(frozen=True, slots=True)
class WeightSpec:
    dtype: str  # a key of WEIGHT_DTYPES
    shape: tuple[int, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Instruction:
    op: str
    inputs: tuple[int, ...]  # slots
    output: int  # slot
    attrs: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # JSON values only


@dataclasses.dataclass(frozen=True, slots=True)
class Program:
    inputs: tuple[str, ...]  # names of the partition inputs (slots 0 .. I-1)
    weights: tuple[WeightSpec, ...]
    instructions: tuple[Instruction, ...]
    outputs: tuple[tuple[str, int], ...]  # (name, slot) per partition output

    @property
    def num_slots(self) -> int:
        return len(self.inputs) + len(self.weights) + len(self.instructions)

    def to_json(self) -> bytes:
        doc = {
            "inputs": list(self.inputs),
            "weights": [{"dtype": w.dtype, "shape": list(w.shape)} for w in self.weights],
            "instructions": [
                {"op": i.op, "inputs": list(i.inputs), "output": i.output, "attrs": dict(i.attrs)}
                for i in self.instructions
            ],
            "outputs": [{"name": name, "slot": slot} for name, slot in self.outputs],
        }
        return dump_document(doc, format=FORMAT, version=PROGRAM_VERSION)

    @classmethod
    def from_json(cls, data: bytes | memoryview, *, where: str = "program") -> Program:
        """Parse and check a serialized program; anything malformed is InvalidGraph naming ``where``."""
        doc = load_document(data, format=FORMAT, version=PROGRAM_VERSION, where=where)
        try:
            inputs = tuple(_str(n) for n in _list(doc["inputs"]))
            weights = tuple(_weight(w) for w in _list(doc["weights"]))
            instructions = tuple(_instruction(i) for i in _list(doc["instructions"]))
            outputs = tuple((_str(o["name"]), _int(o["slot"])) for o in _list(doc["outputs"]))
        except (KeyError, TypeError) as exc:
            raise InvalidGraph(f"{where}: malformed program: {exc!r}") from exc
        program = cls(inputs, weights, instructions, outputs)
        program._check_slots(where)
        return program

    def _check_slots(self, where: str) -> None:
        first = len(self.inputs) + len(self.weights)
        for k, ins in enumerate(self.instructions):
            if ins.output != first + k:
                raise InvalidGraph(
                    f"{where}: instruction {k} ({ins.op}) writes slot {ins.output}, not {first + k}"
                )
            bad = [s for s in ins.inputs if not 0 <= s < ins.output]
            if bad:
                raise InvalidGraph(f"{where}: instruction {k} ({ins.op}) reads undefined slots {bad}")
        bad = [s for _, s in self.outputs if not 0 <= s < self.num_slots]
        if bad:
            raise InvalidGraph(f"{where}: outputs read undefined slots {bad}")


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, found {value!r}")
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, found {value!r}")
    return value


def _int(value: Any) -> int:
    if type(value) is not int:
        raise TypeError(f"expected an integer, found {value!r}")
    return value


def _weight(doc: Any) -> WeightSpec:
    dtype = _str(doc["dtype"])
    if dtype not in WEIGHT_DTYPES:
        raise TypeError(f"weight dtype {dtype!r} is not one of {sorted(WEIGHT_DTYPES)}")
    shape = tuple(_int(d) for d in _list(doc["shape"]))
    if any(d < 0 for d in shape):
        raise TypeError(f"weight shape {list(shape)} has a negative dimension")
    return WeightSpec(dtype, shape)


def _instruction(doc: Any) -> Instruction:
    attrs = doc["attrs"]
    if not isinstance(attrs, dict):
        raise TypeError(f"instruction attrs must be an object, found {attrs!r}")
    return Instruction(
        _str(doc["op"]), tuple(_int(s) for s in _list(doc["inputs"])), _int(doc["output"]), attrs
    )
