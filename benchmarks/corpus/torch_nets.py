"""Vision nets written here in PyTorch, with seeded random weights, exported by torch's TorchScript exporter.

Nothing is downloaded: the layer shapes follow the published architectures (MobileNetV3-Small, ResNet-18's
basic blocks, a YOLOv8-style C2f backbone and detect head), the weights come from ``torch.manual_seed`` and the
BatchNorm statistics are randomised too, so that folding them is not a no-op. Every model has a dynamic batch.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["NETS", "export"]

OPSET = 17


def _layers() -> dict[str, Any]:
    """The torch modules, built on first use (torch is imported only when a net is exported)."""
    import torch
    from torch import nn

    def conv_bn(
        c_in: int, c_out: int, k: int, s: int = 1, g: int = 1, act: type | None = nn.ReLU
    ) -> nn.Module:
        layers: list[nn.Module] = [
            nn.Conv2d(c_in, c_out, k, s, k // 2, groups=g, bias=False),
            nn.BatchNorm2d(c_out),
        ]
        if act is not None:
            layers.append(act())
        return nn.Sequential(*layers)

    class SqueezeExcite(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Conv2d(c, c // 4, 1), nn.Conv2d(c // 4, c, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            s = nn.functional.adaptive_avg_pool2d(x, 1)
            return x * nn.functional.hardsigmoid(self.fc2(nn.functional.relu(self.fc1(s))))

    class InvertedResidual(nn.Module):
        def __init__(self, c_in: int, k: int, exp: int, c_out: int, se: bool, act: type, s: int) -> None:
            super().__init__()
            layers = [] if exp == c_in else [conv_bn(c_in, exp, 1, act=act)]
            layers.append(conv_bn(exp, exp, k, s, g=exp, act=act))  # depthwise
            if se:
                layers.append(SqueezeExcite(exp))
            layers.append(conv_bn(exp, c_out, 1, act=None))
            self.body = nn.Sequential(*layers)
            self.residual = s == 1 and c_in == c_out

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.body(x)
            return x + y if self.residual else y

    class MobileNetV3Small(nn.Module):
        # (kernel, expansion, out, squeeze-excite, activation, stride): MobileNetV3-Small's table
        CONFIG = [
            (3, 16, 16, True, nn.ReLU, 2), (3, 72, 24, False, nn.ReLU, 2), (3, 88, 24, False, nn.ReLU, 1),
            (5, 96, 40, True, nn.Hardswish, 2), (5, 240, 40, True, nn.Hardswish, 1),
            (5, 240, 40, True, nn.Hardswish, 1), (5, 120, 48, True, nn.Hardswish, 1),
            (5, 144, 48, True, nn.Hardswish, 1), (5, 288, 96, True, nn.Hardswish, 2),
            (5, 576, 96, True, nn.Hardswish, 1), (5, 576, 96, True, nn.Hardswish, 1),
        ]  # fmt: skip

        def __init__(self, classes: int = 1000) -> None:
            super().__init__()
            layers = [conv_bn(3, 16, 3, 2, act=nn.Hardswish)]
            c = 16
            for k, exp, out, se, act, s in self.CONFIG:
                layers.append(InvertedResidual(c, k, exp, out, se, act, s))
                c = out
            layers.append(conv_bn(c, 576, 1, act=nn.Hardswish))
            self.features = nn.Sequential(*layers)
            self.head = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(), nn.Linear(1024, classes))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = nn.functional.adaptive_avg_pool2d(self.features(x), 1).flatten(1)
            return self.head(y)

    class BasicBlock(nn.Module):
        def __init__(self, c_in: int, c_out: int, s: int) -> None:
            super().__init__()
            self.a, self.b = conv_bn(c_in, c_out, 3, s), conv_bn(c_out, c_out, 3, act=None)
            self.down = conv_bn(c_in, c_out, 1, s, act=None) if s != 1 or c_in != c_out else nn.Identity()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return nn.functional.relu(self.b(self.a(x)) + self.down(x))

    class ResNet18(nn.Module):
        def __init__(self, classes: int = 1000) -> None:
            super().__init__()
            layers: list[nn.Module] = [conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1)]
            c = 64
            for out, s in ((64, 1), (128, 2), (256, 2), (512, 2)):
                layers += [BasicBlock(c, out, s), BasicBlock(out, out, 1)]
                c = out
            self.features = nn.Sequential(*layers)
            self.fc = nn.Linear(512, classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(nn.functional.adaptive_avg_pool2d(self.features(x), 1).flatten(1))

    def cbs(c_in: int, c_out: int, k: int = 3, s: int = 1) -> nn.Module:
        return conv_bn(c_in, c_out, k, s, act=nn.SiLU)  # SiLU exports as Sigmoid * Mul

    class C2f(nn.Module):
        def __init__(self, c_in: int, c_out: int, n: int = 1) -> None:
            super().__init__()
            self.c = c_out // 2
            self.cv1, self.cv2 = cbs(c_in, 2 * self.c, 1), cbs((2 + n) * self.c, c_out, 1)
            self.m = nn.ModuleList(nn.Sequential(cbs(self.c, self.c), cbs(self.c, self.c)) for _ in range(n))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = list(self.cv1(x).split((self.c, self.c), 1))
            for m in self.m:
                y.append(y[-1] + m(y[-1]))
            return self.cv2(torch.cat(y, 1))

    class YoloStyle(nn.Module):
        """A YOLOv8-n-like detector: C2f backbone, an upsampling neck, and a decoupled detect head whose three
        scales are reshaped, concatenated and decoded (sigmoid scores, box offsets times the stride)."""

        def __init__(self, classes: int = 20, reg: int = 16) -> None:
            super().__init__()
            self.classes, self.reg = classes, reg
            self.stem = nn.Sequential(cbs(3, 16, 3, 2), cbs(16, 32, 3, 2), C2f(32, 32))
            self.p3 = nn.Sequential(cbs(32, 64, 3, 2), C2f(64, 64, 2))
            self.p4 = nn.Sequential(cbs(64, 128, 3, 2), C2f(128, 128, 2))
            self.p5 = nn.Sequential(cbs(128, 256, 3, 2), C2f(256, 256))
            self.up4, self.up3 = C2f(256 + 128, 128), C2f(128 + 64, 64)
            self.box = nn.ModuleList(
                nn.Sequential(cbs(c, 64), nn.Conv2d(64, 4 * reg, 1)) for c in (64, 128, 256)
            )
            self.cls = nn.ModuleList(
                nn.Sequential(cbs(c, 64), nn.Conv2d(64, classes, 1)) for c in (64, 128, 256)
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            p3 = self.p3(self.stem(x))
            p4 = self.p4(p3)
            p5 = self.p5(p4)
            n4 = self.up4(torch.cat([nn.functional.interpolate(p5, scale_factor=2.0), p4], 1))
            n3 = self.up3(torch.cat([nn.functional.interpolate(n4, scale_factor=2.0), p3], 1))
            outs = []
            for i, (f, stride) in enumerate(((n3, 8), (n4, 16), (p5, 32))):
                b, _, h, w = f.shape
                box = self.box[i](f).reshape(b, 4, self.reg, h * w).softmax(2)
                box = (box * torch.arange(self.reg, dtype=box.dtype).reshape(1, 1, -1, 1)).sum(2) * stride
                outs.append(torch.cat([box, self.cls[i](f).reshape(b, self.classes, h * w).sigmoid()], 1))
            return torch.cat(outs, 2)

    return {"mobilenetv3": MobileNetV3Small, "resnet18": ResNet18, "yolo": YoloStyle}


def _randomise(model: Any, seed: int) -> None:
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) + 0.5)
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)


# name -> (module class key, input size (C, H, W))
NETS: dict[str, tuple[str, tuple[int, int, int]]] = {
    "mobilenetv3": ("mobilenetv3", (3, 224, 224)),
    "resnet18": ("resnet18", (3, 224, 224)),
    "yolo": ("yolo", (3, 320, 320)),
}


def export(name: str, path: Path, *, seed: int = 0) -> Path:
    """Export net ``name`` with a dynamic batch (input ``images``, output ``output``) to ``path``."""
    import torch

    key, chw = NETS[name]
    torch.manual_seed(seed)
    build: Callable[[], Any] = _layers()[key]
    model = build().eval()
    _randomise(model, seed)
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation warnings
        torch.onnx.export(
            model, (torch.zeros(1, *chw),), buffer, dynamo=False, opset_version=OPSET, input_names=["images"],
            output_names=["output"], dynamic_axes={"images": {0: "batch"}, "output": {0: "batch"}},
        )  # fmt: skip
    path.write_bytes(buffer.getvalue())
    return path
