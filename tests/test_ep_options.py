"""epctx.ep.parse_options: one way for every EP to declare and check its provider options."""

from __future__ import annotations

import pytest

import epctx
from epctx.ep import Option, parse_options

SPEC = (
    Option("device", "str", default="CPU"),
    Option("precision", "choice", choices={"f32": "f32", "fp32": "f32", "f16": "f16"}),
    Option("streams", "int"),
    Option("fast", "bool", default=False),
    Option("ops", "list", default=frozenset(), choices=("Add", "Mul", "Relu")),
    Option("tags", "list", default=frozenset()),
)


def test_defaults_and_typed_values():
    assert parse_options("MyEP", {}, SPEC) == {
        "device": "CPU", "precision": None, "streams": None, "fast": False, "ops": frozenset(), "tags": frozenset(),
    }  # fmt: skip
    values = parse_options(
        "MyEP",
        {
            "device": " GPU ",
            "precision": "FP32",
            "streams": "4",
            "fast": "yes",
            "ops": "Add, Relu",
            "tags": "a,,b",
        },
        SPEC,
    )
    assert values == {
        "device": "GPU", "precision": "f32", "streams": 4, "fast": True,
        "ops": frozenset({"Add", "Relu"}), "tags": frozenset({"a", "b"}),
    }  # fmt: skip


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"colour": "red"}, r"MyEP: unknown provider option\(s\) \['colour'\]; valid options: \['device'"),
        ({"precision": "i8"}, r"MyEP option 'precision': expected one of \['f16', 'f32'\], got 'i8'"),
        ({"streams": "0"}, r"MyEP option 'streams': expected a positive integer, got '0'"),
        ({"streams": "two"}, "positive integer"),
        ({"fast": "maybe"}, r"MyEP option 'fast': expected 0 or 1, got 'maybe'"),
        ({"ops": "Add,Conv"}, r"MyEP option 'ops': unsupported value\(s\) \['Conv'\]"),
    ],
)
def test_bad_options_are_invalid_argument_naming_ep_option_and_value(options, message):
    with pytest.raises(epctx.InvalidArgument, match=message):
        parse_options("MyEP", options, SPEC)


def test_shipped_eps_declare_their_options():
    """The example and OpenVINO EPs parse through the same helper (same messages)."""
    with pytest.raises(epctx.InvalidArgument, match="ExampleExecutionProvider: unknown provider option"):
        epctx.InferenceSession(b"", providers=[("ExampleExecutionProvider", {"speed": "1"})])
    from epctx.providers.openvino.options import parse_options as openvino_options

    with pytest.raises(epctx.InvalidArgument, match="OpenVINOExecutionProvider option 'num_streams'"):
        openvino_options({"num_streams": "-1"})
    assert openvino_options({"device_type": "gpu"}).precision is None  # the device's own default off the CPU
    assert openvino_options({}).precision == "f32"


def test_values_are_read_only_or_a_frozen_dataclass():
    import dataclasses

    values = parse_options("MyEP", {"streams": "2"}, SPEC)
    with pytest.raises(TypeError):
        values["streams"] = 3  # type: ignore[index]

    @dataclasses.dataclass(frozen=True)
    class Config:
        device_name: str
        precision: str | None
        streams: int | None
        fast: bool
        ops: frozenset[str]
        tags: frozenset[str]

    spec = (Option("device", "str", default="CPU", field="device_name"), *SPEC[1:])
    config = parse_options("MyEP", {"device": "GPU", "fast": "1"}, spec, into=Config)
    assert config == Config("GPU", None, None, True, frozenset(), frozenset())
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.fast = False  # type: ignore[misc]
