"""InferenceSession: load -> partition -> compile -> plan; run() executes the plan."""

from epctx.session.inference import InferenceSession
from epctx.session.iobinding import SessionIOBinding
from epctx.session.ortvalue import OrtValue

__all__ = ["InferenceSession", "OrtValue", "SessionIOBinding"]
