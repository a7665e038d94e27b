"""Model packages in onnxruntime's format (``manifest.json``, components, variants per EP / device /
compatibility string, content-addressed shared assets) and the catalogue build that fills them.

- ``layout``: the format (read, write, path confinement, ``sha256:`` directory hashes as onnxruntime computes them);
- ``share``: variants that differ only in target share one binary (their weights stored once);
- ``select``: per component, every variant ranked by its compatibility verdict on this machine's EPs and devices;
- ``context``: the selected variant resolved (``executor_info["ort"]``), the session's entry for a package folder;
- ``tools``: ``epctx package inspect`` / ``validate``.

onnxruntime's API names (``epctx.ModelPackageContext`` ...) are in ``epctx.session.package`` (they make sessions);
the catalogue build is ``epctx.farm`` (it compiles). Nothing is imported here: ``import epctx`` stays light.
"""
