"""The cache's lifecycle around the context format: compatibility verdicts (``compatibility``: onnxruntime's
API; ``verdicts``: per node and per device, what ``epctx check`` prints and a session enforces).

Nothing is imported here: ``import epctx`` stays light."""
