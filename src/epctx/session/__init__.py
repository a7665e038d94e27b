"""InferenceSession: load -> partition -> compile -> plan; run() executes the plan."""

from epctx.session.inference import InferenceSession

__all__ = ["InferenceSession"]
