"""The inputs of ``epctx run``: ``--input NAME=FILE.npy`` for each model input, or ``--random`` for random data
(floats from a standard normal, integers in [0, 4), booleans; seeded by ``--seed``). Dynamic dimensions of
random inputs need a value: ``--dim NAME=N`` for a symbolic dimension (``batch``), ``--dim INPUT:AXIS=N`` for an
unnamed one, or ``--shape NAME[d0,d1,...]`` for an input's whole shape (anonymous dimensions too, as Paddle's ``?``;
its fixed dimensions must match the model's). Nothing is guessed: an input name the model lacks, a missing input, a
dynamic dimension without a value, a ``--dim`` that no random input uses and a ``--shape`` of an input that is not
random, of the wrong rank or against a fixed size are errors. (To compile for the shape too, add
``-C epctx.input_shapes=NAME[d0,...]``.)"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from epctx.cli.failures import UsageError
from epctx.errors import InvalidArgument

__all__ = ["build_feed", "parse_assignments"]

_FLOATS = {"float": np.float32, "double": np.float64, "float16": np.float16}


def parse_assignments(items: Sequence[str], flag: str, value_hint: str) -> dict[str, str]:
    """``NAME=VALUE`` arguments of ``flag`` as a dict; a malformed or repeated one is a usage error."""
    found: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise UsageError(f"{flag} expects NAME={value_hint}, got {item!r}", "epctx run")
        if name in found:
            raise UsageError(f"{flag} gives {name!r} twice", "epctx run")
        found[name] = value
    return found


def _sizes(dims: Mapping[str, str]) -> dict[str, int]:
    sizes = {}
    for name, text in dims.items():
        try:
            sizes[name] = int(text)
        except ValueError:
            sizes[name] = -1
        if sizes[name] < 0:
            raise UsageError(f"--dim {name}={text}: the size must be an integer >= 0", "epctx run")
    return sizes


def build_feed(
    model: str,
    inputs: Sequence[Any],
    files: Mapping[str, str],
    *,
    random: bool,
    dims: Mapping[str, str],
    seed: int = 0,
    shapes: Sequence[str] = (),
) -> dict[str, np.ndarray]:
    """The feed for ``inputs`` (the session's NodeArgs) from .npy ``files`` and, with ``random``, random data
    (sized by ``dims`` and the whole ``shapes``, ``--shape`` items)."""
    for flag, given in (("--dim", dims), ("--shape", shapes)):
        if given and not random:
            raise UsageError(f"{flag} gives sizes for --random data; add --random", "epctx run")
    whole = _whole_shapes(shapes)
    names = [arg.name for arg in inputs]
    unknown = [name for name in files if name not in names]
    if unknown:
        raise InvalidArgument(
            f"--input names {', '.join(map(repr, unknown))}, which {model!r} has no input of; its inputs: "
            f"{', '.join(names) or 'none'}"
        )
    missing = [arg for arg in inputs if arg.name not in files]
    if missing and not random:
        wanted = ", ".join(f"{a.name} ({a.type} {a.shape})" for a in missing)
        raise InvalidArgument(
            f"{model!r} needs input(s) {wanted}; give --input NAME=FILE.npy for each, or --random for random data"
        )
    sizes = _sizes(dims)
    used: set[str] = set()
    rng = np.random.default_rng(seed)
    feed = {name: np.load(path, allow_pickle=False) for name, path in files.items()}
    stray = [name for name in whole if name not in {arg.name for arg in missing}]
    if stray:
        raise InvalidArgument(
            f"--shape {', '.join(map(repr, stray))}: not an input made by --random; those are: "
            f"{', '.join(a.name for a in missing) or 'none'}"
        )
    for arg in missing:
        if arg.name in whole:
            shape = _stated(arg, whole[arg.name])
        else:
            shape = [_dim(arg, axis, d, sizes, used) for axis, d in enumerate(arg.shape or [])]
        feed[arg.name] = _random(arg, shape, rng)
    unused = sorted(set(sizes) - used)
    if unused:
        raise InvalidArgument(
            f"--dim {', '.join(unused)}: no dynamic dimension of the random inputs has that name; "
            f"their inputs and shapes: {', '.join(f'{a.name} {a.shape}' for a in missing) or 'none'}"
        )
    return feed


def _whole_shapes(items: Sequence[str]) -> dict[str, list[int]]:
    """``--shape NAME[d0,...]`` items (each may hold several, comma-separated) by input name."""
    from epctx.config import parse_shapes

    try:
        return {name: list(dims) for name, dims in parse_shapes(",".join(items), "--shape")}
    except InvalidArgument as exc:
        raise UsageError(str(exc.args[0]), "epctx run") from None


def _stated(arg: Any, shape: list[int]) -> list[int]:
    """A ``--shape`` for ``arg``: its rank, and its fixed dimensions, as the model's."""
    model = list(arg.shape or [])
    if len(shape) != len(model):
        raise InvalidArgument(
            f"--shape {arg.name}{shape}: input {arg.name!r} has rank {len(model)} {model}, not {len(shape)}"
        )
    for axis, (size, dim) in enumerate(zip(shape, model)):
        if isinstance(dim, int) and dim >= 0 and dim != size:
            raise InvalidArgument(
                f"--shape {arg.name}{shape}: axis {axis} of input {arg.name!r} is fixed at {dim} ({model})"
            )
    return shape


def _dim(arg: Any, axis: int, dim: Any, sizes: Mapping[str, int], used: set[str]) -> int:
    if isinstance(dim, int) and dim >= 0:
        return dim
    keys = ([dim] if isinstance(dim, str) and dim else []) + [f"{arg.name}:{axis}"]
    for key in keys:
        if key in sizes:
            used.add(key)
            return sizes[key]
    raise InvalidArgument(
        f"input {arg.name!r} {arg.shape} has a dynamic dimension {keys[0]!r} (axis {axis}) and --random needs its "
        f"size: add --dim {keys[0]}=<size>"
    )


def _random(arg: Any, shape: list[int], rng: np.random.Generator) -> np.ndarray:
    elem = arg.type[len("tensor(") : -1] if arg.type.startswith("tensor(") else ""
    if elem in _FLOATS:
        return rng.standard_normal(shape).astype(_FLOATS[elem])
    if elem == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if elem.startswith(("int", "uint")):
        return rng.integers(0, 4, shape).astype(np.dtype(elem))
    raise InvalidArgument(
        f"--random cannot make data of type {arg.type} for input {arg.name!r}; give --input {arg.name}=FILE.npy"
    )
