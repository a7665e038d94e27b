"""``epctx.testing``: tools for testing epctx and the EPs built on it.

- :func:`no_compile`: inside the block any EP compile raises ModelRequiresCompilation naming the EP (loading a
  context model must never compile). ``EPCTX_NO_COMPILE=1`` in the environment does the same for a whole
  process (read when something is about to compile, never on ``run()``).
- :mod:`epctx.testing.conformance`: the EP conformance suite (``run_conformance``, and
  ``epctx conformance -p NAME``).

The top layer beside ``cli``: it may import anything, and nothing in epctx imports it.
"""

from epctx.session.compile_guard import NO_COMPILE_ENV, no_compile

__all__ = ["NO_COMPILE_ENV", "no_compile"]
