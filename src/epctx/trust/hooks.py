"""EPContext data read / write callbacks: onnxruntime's named-buffer hooks for encryption at rest
(``ModelCompilationOptions_SetEpContextDataWriteFunc`` / ``SessionOptionsSetEpContextDataReadFunc``,
``docs/design/Compiled_Model_Encryption.md`` in microsoft/onnxruntime), in Python.

- Compile side, ``ModelCompiler.set_ep_context_data_write_func(write)``: ``write(name, data)`` receives each
  context binary (``name`` its logical name, the ``ep_cache_context`` the model records; ``data`` its bytes)
  and stores it as it likes (encrypted, elsewhere); no binary is written to disk.
- Session side, ``SessionOptions.set_ep_context_data_read_func(read)``: ``read(name)`` returns the bytes
  (bytes, bytearray, memoryview, numpy uint8 array) of the binary the model names; they are used without a
  copy. Names are opaque keys of the application's store, not paths: they are not resolved in the model folder.

epctx never sees a key. A callback's failure is ``Fail`` naming the binary, with the callback's exception as
its cause; what it returns is checked as any context binary is (header, checksums, identity)."""

from __future__ import annotations

from collections.abc import Callable

from epctx.errors import EPCtxError, Fail

__all__ = ["ReadFunc", "WriteFunc", "read_named_buffer", "write_named_buffer"]

ReadFunc = Callable[[str], object]
WriteFunc = Callable[[str, bytes], object]


def write_named_buffer(write: WriteFunc, name: str, data: bytes) -> None:
    try:
        write(name, data)
    except EPCtxError:
        raise
    except Exception as exc:
        raise Fail(
            f"the EPContext data write callback failed for the context binary {name!r}: {exc!r}"
        ) from exc


def read_named_buffer(read: ReadFunc, name: str) -> object:
    try:
        data = read(name)
    except EPCtxError:
        raise
    except Exception as exc:
        raise Fail(
            f"the EPContext data read callback failed for the context binary {name!r}: {exc!r}"
        ) from exc
    if data is None:
        raise Fail(f"the EPContext data read callback returned nothing for the context binary {name!r}")
    return data
