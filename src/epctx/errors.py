"""One exception family, one class per status (codes follow onnxruntime's OrtErrorCode)."""

from __future__ import annotations

__all__ = [
    "EPCtxError",
    "EPFail",
    "Fail",
    "InvalidArgument",
    "InvalidGraph",
    "ModelRequiresCompilation",
    "NoSuchFile",
    "NotImplemented",
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


class InvalidArgument(EPCtxError, ValueError):
    code = 2
    status = "INVALID_ARGUMENT"


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
    code = 12
    status = "MODEL_REQUIRES_COMPILATION"


class NotImplemented(EPCtxError, NotImplementedError):
    code = 9
    status = "NOT_IMPLEMENTED"
