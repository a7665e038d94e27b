"""``epctx run``'s saved outputs: ``-o/--output FILE.npz`` (one array per output, keyed by the output's name, as
``np.load(FILE)[name]`` reads it back) and ``--output-dir DIR`` (one ``<name>.npy`` per output).

Names that are not safe file names (``/``, ``:``, spaces, a leading dot...) have every other character replaced
by ``_``; two outputs that would share a file get ``_2``, ``_3``... (compared ignoring case, for the file systems
that do). Where everything goes is checked before the model runs: the folder must exist and a file that exists
is replaced only with ``--force``. The command says which file holds which output."""

from __future__ import annotations

import argparse
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from epctx.cli.failures import UsageError
from epctx.cli.outputs import check_folder, check_outputs
from epctx.errors import Fail

__all__ = ["add_arguments", "check_arguments", "planned_files", "safe_file_names", "save"]

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", metavar="FILE.npz", help="save the outputs in FILE.npz (keyed by name)")
    p.add_argument("--output-dir", metavar="DIR", help="save each output as DIR/<name>.npy (DIR must exist)")
    p.add_argument("--force", action="store_true", help="overwrite existing output files")


def safe_file_names(names: Sequence[str]) -> list[str]:
    """A file stem per output name, of portable characters only, distinct (ignoring case)."""
    taken: set[str] = set()
    stems = []
    for name in names:
        base = _UNSAFE.sub("_", name).lstrip(".") or "output"
        stem, k = base, 1
        while stem.lower() in taken:
            k += 1
            stem = f"{base}_{k}"
        taken.add(stem.lower())
        stems.append(stem)
    return stems


def check_arguments(args: argparse.Namespace) -> None:
    """What can be checked before the session is made: the flags, the .npz file, the folder."""
    if args.output and args.output_dir:
        raise UsageError("-o/--output and --output-dir both save the outputs; give one", "epctx run")
    if args.output:
        path = Path(args.output)
        if path.suffix != ".npz":
            raise UsageError(f"-o/--output saves an .npz file; got {args.output!r}", "epctx run")
        check_outputs([path], force=args.force, flag="-o/--output")
    elif args.output_dir:
        check_folder(Path(args.output_dir), flag="--output-dir")


def planned_files(args: argparse.Namespace, names: Sequence[str]) -> dict[str, Path]:
    """Where each output goes (``{}`` without -o / --output-dir), checked (after ``check_arguments``); nothing is
    written yet."""
    if args.output:
        return {name: Path(args.output) for name in names}
    if args.output_dir:
        folder = Path(args.output_dir)
        files = {name: folder / f"{stem}.npy" for name, stem in zip(names, safe_file_names(names))}
        check_outputs(files.values(), force=args.force, flag="--output-dir")
        return files
    return {}


def save(files: dict[str, Path], names: Sequence[str], values: Sequence[Any]) -> None:
    """Write ``values`` (the outputs ``names``) where ``planned_files`` said: one .npz, or one .npy each."""
    if not files:
        return
    arrays = {}
    for name, value in zip(names, values):
        array = np.asarray(value)
        if array.dtype == object and all(isinstance(item, str) for item in array.flat):
            array = array.astype(str)  # a string tensor: saved as numpy strings (no pickle)
        if array.dtype == object:
            raise Fail(
                f"output {name!r} is not a tensor ({type(value).__name__}); it cannot be saved as .npy"
            )
        arrays[name] = array
    npz = {path for path in files.values() if path.suffix == ".npz"}
    if npz:  # np.savez's way, without its keyword arguments (an output may be named "file")
        with zipfile.ZipFile(npz.pop(), "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for name, array in arrays.items():
                with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, array, allow_pickle=False)
        return
    for name, array in arrays.items():
        np.save(files[name], array, allow_pickle=False)
