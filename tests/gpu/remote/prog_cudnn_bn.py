"""cuDNN paths PyTorch's defaults never hit: batch norm in fp16, channels-last (a cooperative launch
inside cuDNN), in a torchvision ResNet-18 trained for a few steps with autocast and deterministic cuDNN.

With deterministic algorithms and the same seed a native and a remote run compute the same bytes, so the
losses and a hash of the final weights are printed exactly.
"""

from __future__ import annotations

import hashlib
import sys

import torch
from _common import loaded_libcuda


def main() -> int:
    import torchvision

    torch.manual_seed(0)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    dev = torch.device("cuda")
    bn = torch.nn.BatchNorm2d(64).to(dev).to(memory_format=torch.channels_last)
    x = torch.randn(32, 64, 28, 28, device=dev).to(memory_format=torch.channels_last)
    with torch.autocast("cuda", dtype=torch.float16):
        y = bn(x.half())
    torch.cuda.synchronize()
    ref = torch.nn.functional.batch_norm(x.double(), None, None, training=True, eps=bn.eps)
    print("batch_norm_fp16_channels_last", bool(torch.allclose(y.double(), ref, atol=2e-2, rtol=2e-2)))

    model = torchvision.models.resnet18(num_classes=10).to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")
    data = torch.randn(16, 3, 64, 64, device=dev).to(memory_format=torch.channels_last)
    labels = torch.randint(0, 10, (16,), device=dev)
    losses = []
    for _ in range(5):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(data), labels)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    print("resnet18_losses", " ".join(f"{v:.6f}" for v in losses))
    weights = torch.cat([p.detach().float().flatten() for p in model.parameters()]).cpu().numpy().tobytes()
    print("resnet18_weights", hashlib.sha256(weights).hexdigest()[:16])
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
