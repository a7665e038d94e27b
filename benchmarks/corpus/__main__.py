"""Write the corpus models into a folder: ``python -m benchmarks.corpus OUT_DIR [--models a,b]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.corpus import CORPUS, Unavailable, materialise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--models", default=",".join(CORPUS), help=f"comma-separated, of {list(CORPUS)}")
    args = parser.parse_args(argv)
    missing = 0
    for name in filter(None, args.models.split(",")):
        try:
            path = materialise(name, args.out_dir)
        except Unavailable as exc:
            print(f"{name}: unavailable ({exc})")
            missing += 1
            continue
        print(f"{name}: {path} ({path.stat().st_size / 1e6:.1f} MB) - {CORPUS[name].origin}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
