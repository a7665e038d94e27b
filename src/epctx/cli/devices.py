"""``epctx devices [--json] [--ep-library NAME=PATH]...``: the EPs usable here and the devices they serve."""

from __future__ import annotations

import argparse
import json
from typing import Any

from epctx.cli.provider_args import register_libraries

__all__ = ["add_parser", "device_rows"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("devices", help="list execution providers and the devices they serve")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--ep-library",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="register a plugin EP library first (NAME ending in .virtual allows virtual devices)",
    )
    p.set_defaults(func=devices)


def device_rows() -> list[dict[str, Any]]:
    """One dict per EP device, in ``get_ep_devices()`` order."""
    import epctx

    rows = []
    for d in epctx.get_ep_devices():
        hw = d.device
        rows.append(
            {
                "ep_name": d.ep_name,
                "ep_vendor": d.ep_vendor,
                "ep_metadata": dict(d.ep_metadata),
                "ep_options": dict(d.ep_options),
                "device": {
                    "type": hw.type.name,
                    "vendor_id": hw.vendor_id,
                    "device_id": hw.device_id,
                    "vendor": hw.vendor,
                    "metadata": dict(hw.metadata),
                    "is_virtual": hw.is_virtual,
                },
            }
        )
    return rows


def devices(args: argparse.Namespace) -> int:
    register_libraries(args)
    rows = device_rows()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    header = ("EP", "EP vendor", "device", "vendor", "vendor id", "device id", "options", "name")
    table = [header]
    for r in rows:
        hw = r["device"]
        kind = hw["type"] + (" (virtual)" if hw["is_virtual"] else "")
        options = ",".join(f"{k}={v}" for k, v in r["ep_options"].items()) or "-"
        table.append(
            (
                r["ep_name"],
                r["ep_vendor"],
                kind,
                hw["vendor"],
                f"{hw['vendor_id']:#06x}",
                f"{hw['device_id']:#x}",
                options,
                hw["metadata"].get("model_name", ""),
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for k, row in enumerate(table):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if k == 0:
            print("  ".join("-" * w for w in widths))
    return 0
