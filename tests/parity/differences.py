"""Where epctx deliberately differs from onnxruntime in the parity scripts: one place, each with its reason.

Keyed by (script, printed key); the value is (what onnxruntime prints, what epctx prints, why). The parity
test checks both sides, so a difference that goes away (or changes) fails until this table is updated.
Differences outside the scripts' printed values are listed in ``NOT_COMPARED``."""

from __future__ import annotations

DIFFERENCES: dict[tuple[str, str], tuple[str, str, str]] = {
    ("providers.py", "unknown provider"): (
        "ran",
        "InvalidArgument",
        "A provider name that neither onnxruntime nor epctx knows is an error in epctx; onnxruntime prints an "
        "'EP Error' and retries on the CPU EP, so a misspelt name runs on the wrong EP unnoticed. onnxruntime's "
        "own EP names that epctx lacks (CUDA, TensorRT, ...) are skipped with a warning, as onnxruntime does.",
    ),
    ("providers.py", "unavailable as error"): (
        "ran",
        "InvalidArgument",
        "session.unavailable_ep_is_error=1 is epctx's own config entry (it turns the warning for an "
        "onnxruntime EP that epctx lacks into an error); onnxruntime accepts and ignores unknown config keys.",
    ),
    ("options.py", "custom ops"): (
        "Fail",
        "NotImplemented",
        "register_custom_ops_library: onnxruntime loads a shared library built against its C API (Fail: not "
        "found here); epctx never loads such libraries and says to write the ops as an execution provider.",
    ),
}

# Behaviour that differs but that the scripts do not print (documented here and in the README).
NOT_COMPARED: dict[str, str] = {
    "feeds": "epctx also converts tuples and Python / numpy scalars in feeds (as it converts lists: to the "
    "input's element type); onnxruntime raises RuntimeError for them.",
    "add_initializer": "epctx takes a numpy array as well as an OrtValue (onnxruntime: OrtValue only) and keeps "
    "a reference to it (onnxruntime crashes if the OrtValue is freed first); an unknown name is "
    "ignored with a warning (onnxruntime: silently).",
    "ORT_PARALLEL": "execution_mode=ORT_PARALLEL / inter_op_num_threads > 1: epctx runs plan steps "
    "sequentially and warns (logging + warnings); results are the same.",
    "devices": "OrtValue / IOBinding take device_type 'cpu' only (NotImplemented otherwise): epctx keeps inputs "
    "and outputs in host memory and each EP moves them to its device.",
    "profile contents": "the trace has onnxruntime's event schema (cat, pid, tid, dur, ts, ph, name, args) and "
    "names; epctx adds one '<partition>_compile' or '<node>_context_load' event per partition and one "
    "'node_placement' event (every node's EP and why the EPs ahead declined it), and has no "
    "'SequentialExecutor::Execute' event nor memory / thread-pool statistics in args.",
    "logging": "log severities map onto the 'epctx' logger (0 DEBUG .. 4 CRITICAL); epctx prints nothing "
    "itself, a handler (logging.basicConfig) shows INFO / DEBUG. Verbosity levels are checked and kept.",
    "get_device": "always 'CPU' (each EP's devices: get_ep_devices()).",
    "unknown dimension sizes": "after add_free_dimension_override_by_name, outputs get the size of a dimension "
    "of the same name; onnxruntime re-infers every shape.",
}
