"""``epctx package build``: a SPEC (components x targets) compiled job by job, then assembled into a package.

- ``spec``: the TOML SPEC;
- ``jobs``: one (component, target) compile, its content key, and the job cache that makes builds incremental;
- ``executors``: where jobs run (a local process pool, or Ray: imported only when asked for);
- ``assemble``: job results -> package folder (weights shared), committed atomically;
- ``run``: the build itself, with per-job progress and the summary.

It sits above the compiler (it compiles) and below the command line; Ray is imported only by a build that asks
for it.
"""
