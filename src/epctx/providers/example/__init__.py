"""The example execution provider: a small pure-numpy compiling EP (the template for EP authors)."""

from epctx.providers.example.provider import ExampleExecutionProvider

__all__ = ["ExampleExecutionProvider"]
