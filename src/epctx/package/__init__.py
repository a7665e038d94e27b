"""Model packages in onnxruntime's format (``manifest.json``, components, variants per EP / device /
compatibility string, content-addressed shared assets) and the catalogue build that fills them.

- ``layout``: the format (read, write, path confinement, ``sha256:`` directory hashes as onnxruntime computes them);
- ``share``: variants that differ only in target share one binary (their weights stored once);
- ``select``: per component, every variant ranked by its compatibility verdict on this machine's EPs and devices;
- ``context``: onnxruntime's API names (``ModelPackageContext``, ``ModelPackageComponentContext``) and the
  session's entry for a package folder;
- ``build``: ``epctx package build`` (jobs, content keys, the local pool and the Ray executor, the atomic commit).

Nothing is imported here: ``import epctx`` stays light, and Ray is imported only by a build that asks for it.
"""
