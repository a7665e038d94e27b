"""Which variant of a component this machine should run: every variant ranked, over every EP and device here.

onnxruntime's selection looks at the first EP of the session only. Here each variant is judged by its EP's
compatibility verdict on the variant's ``compatibility_string`` (from the manifest alone: nothing of the
variant is read) for each device that EP offers here, the best device counting:

1. EP_SUPPORTED_OPTIMAL, then EP_SUPPORTED_PREFER_RECOMPILATION, then EP_NOT_APPLICABLE (a variant without a
   compatibility string, e.g. a plain model); EP_UNSUPPORTED never (nor an EP that is not here, nor a variant
   whose ``device`` none of its EP's devices is);
2. ties: the EP's place in the session's provider list (when it gives one, only its EPs are candidates), else in
   this machine's precedence order (``get_available_providers``);
3. then the device policy (``SessionOptions.set_provider_selection_policy``: PREFER_CPU / _GPU / _NPU);
4. then the manifest's order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from epctx.ep._compatibility import CompatibilityVerdict, OrtCompiledModelCompatibility
from epctx.errors import InvalidArgument

if TYPE_CHECKING:
    from epctx.ep._devices import EpDevice
    from epctx.package.layout import Component, Variant

__all__ = ["Ranked", "rank_variants", "select_variant"]

Compat = OrtCompiledModelCompatibility
_ORDER = {
    Compat.EP_SUPPORTED_OPTIMAL: 0,
    Compat.EP_SUPPORTED_PREFER_RECOMPILATION: 1,
    Compat.EP_NOT_APPLICABLE: 2,
}
_POLICY_DEVICE = {1: "cpu", 2: "npu", 3: "gpu"}


@dataclasses.dataclass(frozen=True)
class Ranked:
    variant: Variant
    verdict: CompatibilityVerdict
    device: str  # the device judged best ("-" when none)
    why: str  # why the variant stands where it does
    key: tuple[int, ...]

    @property
    def eligible(self) -> bool:
        return self.verdict.status != Compat.EP_UNSUPPORTED

    def to_dict(self) -> dict[str, object]:
        return {
            "variant": self.variant.name,
            "ep": self.variant.ep,
            "device": self.device,
            "status": self.verdict.status.name,
            "reasons": list(self.verdict.reasons),
            "eligible": self.eligible,
            "why": self.why,
        }


def _device_type(device: EpDevice) -> str:
    return device.device.type.name.lower()


def _judge(variant: Variant, devices: Sequence[EpDevice]) -> tuple[CompatibilityVerdict, str]:
    """The best verdict of the variant over the (real) devices of its EP, and that device."""
    from epctx.cache.compatibility import validate_for_ep
    from epctx.cache.verdicts import device_label

    usable = [d for d in devices if not d.device.is_virtual]
    if variant.device is not None:
        usable = [d for d in usable if _device_type(d) == variant.device]
        if not usable:
            return CompatibilityVerdict.unsupported(f"{variant.ep} has no {variant.device} device here"), "-"
    if variant.compatibility is None:
        label = device_label(usable[0].device) if usable else "this machine"
        return CompatibilityVerdict.not_applicable(
            "no compatibility string: nothing compiled to judge"
        ), label
    assert variant.ep is not None
    if not usable:
        return validate_for_ep(variant.ep, variant.compatibility, []), "this machine"
    judged = [(validate_for_ep(variant.ep, variant.compatibility, [d.device]), d) for d in usable]
    verdict, device = min(judged, key=lambda vd: (_ORDER.get(vd[0].status, 9), judged.index(vd)))
    return verdict, device_label(device.device)


def rank_variants(
    component: Component, providers: Sequence[str] | None = None, policy: int | None = None
) -> list[Ranked]:
    """Every variant of ``component``, best first; the ineligible ones (UNSUPPORTED) last, with why."""
    from epctx.providers.registry import available_providers, get_ep_devices

    available = available_providers()
    order = list(providers) if providers else available
    devices = get_ep_devices()
    preferred = _POLICY_DEVICE.get(int(policy)) if policy is not None else None
    ranked = []
    for index, variant in enumerate(component.variants):
        if not variant.ep:
            verdict, device = CompatibilityVerdict.unsupported("the variant names no execution provider"), "-"
        elif variant.ep not in available:
            verdict, device = CompatibilityVerdict.unsupported(f"{variant.ep} is not available here"), "-"
        elif variant.ep not in order:
            verdict = CompatibilityVerdict.unsupported(f"{variant.ep} is not among the session's providers")
            device = "-"
        else:
            verdict, device = _judge(variant, [d for d in devices if d.ep_name == variant.ep])
        eligible = verdict.status != Compat.EP_UNSUPPORTED
        place = order.index(variant.ep) if eligible and variant.ep in order else len(order)
        policy_miss = int(preferred is not None and variant.device not in (None, preferred))
        key = (int(not eligible), _ORDER.get(verdict.status, 3), place, policy_miss, index)
        order_name = "the session's providers" if providers else "this machine's provider order"
        why = f"{variant.ep} is #{place + 1} in {order_name}" if eligible else verdict.summary()
        ranked.append(Ranked(variant, verdict, device, why, key))
    return sorted(ranked, key=lambda r: r.key)


def select_variant(
    component: Component, providers: Sequence[str] | None = None, policy: int | None = None
) -> Ranked:
    """The best eligible variant, or InvalidArgument listing why each was refused."""
    ranked = rank_variants(component, providers, policy)
    if not ranked or not ranked[0].eligible:
        why = "; ".join(f"{r.variant.name}: {r.verdict.summary()}" for r in ranked) or "it has no variant"
        raise InvalidArgument(f"no variant of component {component.name!r} can run here ({why})")
    return ranked[0]
