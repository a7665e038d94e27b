"""Own CPU kernels; importing this package registers them. Ops without one use onnx.reference."""

from epctx.providers.cpu.kernels import (  # noqa: F401
    cast,
    control_flow,
    conv,
    elementwise,
    linalg,
    normalization,
    pool,
    quant,
    reduce,
    resize,
    rnn,
    tensor,
)
