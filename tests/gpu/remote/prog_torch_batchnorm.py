"""cuDNN's batch norm in fp16, channels-last, deterministic: the path where cuDNN launches cooperative
kernels (cuLaunchCooperativeKernel; issue 25 saw CUDNN_STATUS_EXECUTION_FAILED_CUDART before it was
forwarded). A small convolutional network trains five steps under autocast; each step prints its loss
and a hash of the batch-norm layer's running statistics, so a native and a remote run print the same.
"""

from __future__ import annotations

import hashlib
import sys

import torch
from _common import loaded_libcuda
from torch import nn


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().float().cpu().numpy().tobytes()).hexdigest()[:16]


def main() -> int:
    torch.manual_seed(0)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    model = nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    ).cuda()
    model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(32, 3, 56, 56, generator=generator).cuda().to(memory_format=torch.channels_last)
    labels = torch.randint(0, 10, (32,), generator=generator).cuda()
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    for step in range(5):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = nn.functional.cross_entropy(model(images), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        torch.cuda.synchronize()
        norm = model[1]
        print(
            f"step {step} loss {loss.item():.6f} running stats {digest(norm.running_mean)} {digest(norm.running_var)}"
        )
    model.eval()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
        print("eval", digest(model(images)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
