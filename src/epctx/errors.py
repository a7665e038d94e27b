"""One exception family, one class per status (codes follow onnxruntime's OrtErrorCode)."""

from __future__ import annotations

__all__ = [
    "EPCtxError",
    "EPFail",
    "EngineError",
    "Fail",
    "IncompatibleEPApi",
    "InvalidArgument",
    "InvalidGraph",
    "InvalidProtobuf",
    "ModelLoadCanceled",
    "ModelLoaded",
    "ModelRequiresCompilation",
    "NoModel",
    "NoSuchFile",
    "NotFound",
    "NotImplemented",
    "RuntimeException",
    "Untrusted",
]


class EPCtxError(RuntimeError):
    """Base of every error epctx raises on purpose. ``code`` mirrors onnxruntime's status code."""

    code: int = 1
    status: str = "FAIL"

    def __str__(self) -> str:
        return f"[{self.status}] {super().__str__()}"


class Fail(EPCtxError):
    code = 1
    status = "FAIL"


class Untrusted(Fail):
    """The trust policy (``epctx.trust.policy``) refused a file: unsigned, tampered, or signed by a key the
    session does not trust. onnxruntime has no such status: it is a FAIL."""


class InvalidArgument(EPCtxError, ValueError):
    code = 2
    status = "INVALID_ARGUMENT"


class IncompatibleEPApi(InvalidArgument):
    """A plugin EP library's factory was written for an EP API version this epctx does not serve
    (``epctx.ep.EP_API_VERSION`` and its compatibility rule), or declares none."""


class NoSuchFile(EPCtxError, FileNotFoundError):
    code = 3
    status = "NO_SUCHFILE"


class InvalidGraph(EPCtxError):
    code = 10
    status = "INVALID_GRAPH"


class EPFail(EPCtxError):
    code = 11
    status = "EP_FAIL"


class ModelRequiresCompilation(EPCtxError):
    code = 13
    status = "MODEL_REQUIRES_COMPILATION"


class NotImplemented(EPCtxError, NotImplementedError):
    code = 9
    status = "NOT_IMPLEMENTED"


# The rest of onnxruntime's status codes (its users catch them from onnxruntime.capi.onnxruntime_pybind11_state).
class NoModel(EPCtxError):
    code = 4
    status = "NO_MODEL"


class EngineError(EPCtxError):
    code = 5
    status = "ENGINE_ERROR"


class RuntimeException(EPCtxError):
    code = 6
    status = "RUNTIME_EXCEPTION"


class InvalidProtobuf(EPCtxError):
    code = 7
    status = "INVALID_PROTOBUF"


class ModelLoaded(EPCtxError):
    code = 8
    status = "MODEL_LOADED"


class ModelLoadCanceled(EPCtxError):
    code = 12
    status = "MODEL_LOAD_CANCELED"


class NotFound(EPCtxError):
    code = 14
    status = "NOT_FOUND"
