"""``epctx cache list|prune|clear FOLDER``: the transparent cache's folder (``epctx.context_cache``).

- ``list``: one line per key: its size, when it was last used, its current generation, what it was compiled from;
- ``prune [--max-mb N]``: remove generations no key serves (replaced ones, killed writers'), then the least
  recently used keys until the folder holds at most N MB;
- ``clear``: remove every key.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("cache", help="list, prune or clear a transparent cache folder (epctx.context_cache)")
    p.add_argument("action", choices=["list", "prune", "clear"])
    p.add_argument("folder")
    p.add_argument("--max-mb", type=float, help="prune: remove least recently used keys beyond this size")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cache)


def cache(args: argparse.Namespace) -> int:
    from epctx.cache.store import ContextCache
    from epctx.errors import InvalidArgument, NoSuchFile

    store = ContextCache(args.folder)
    if not store.folder.is_dir():
        raise NoSuchFile(f"cache folder {args.folder!r} not found")
    if args.max_mb is not None and (args.action != "prune" or args.max_mb < 0):
        raise InvalidArgument("--max-mb goes with prune, and is a size in MB (0 or more)")
    if args.action == "list":
        infos = [e.info() for e in store.entries()]
        if args.json:
            print(json.dumps([_row(i) for i in infos], indent=2))
        else:
            for i in infos:
                used = (
                    time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(i.last_used))
                    if i.last_used
                    else "never"
                )
                print(f"{i.key}  {i.size / 1e6:8.1f} MB  last used {used}  {i.current or '-'}  {i.model}")
            print(f"{len(infos)} key(s), {sum(i.size for i in infos) / 1e6:.1f} MB")
        return 0
    max_bytes = None if args.max_mb is None else int(args.max_mb * 1e6)
    removed = store.prune(max_bytes) if args.action == "prune" else store.clear()
    if args.json:
        print(json.dumps({"removed": removed}))
    else:
        print("\n".join([*(f"removed {r}" for r in removed), f"{len(removed)} removed"]))
    return 0


def _row(info: Any) -> dict[str, Any]:
    return {
        "key": info.key,
        "bytes": info.size,
        "last_used": info.last_used,
        "current": info.current,
        "generations": list(info.generations),
        "model": info.model,
    }
