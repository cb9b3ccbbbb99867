"""Real training runs for remote-vs-native comparison: `python bench/train_models.py resnet50|gpt2`.

ResNet-50 (torchvision, random init) on synthetic images, bf16 autocast, batch 64; a GPT-2-style model
from a `transformers` config (random init, no download) on synthetic tokens, bf16 autocast. Both seeded
and deterministic where PyTorch allows, so a native and a remote run print comparable losses. Prints
one `step N loss` line per step and a final JSON line with throughput (steady state, after warm-up).

`--input uint8` gives ResNet-50 its images as a data loader of JPEGs does — 8-bit pixels in page-locked
memory, copied with non_blocking=True and scaled to [0, 1) on the GPU (a quarter of the bytes of float32
images, and a copy the host does not wait for); the default, float32 images in pageable memory, is the
worst case for a client across a network: every step waits for 38.5 MB to cross it.

`--prefetch` loads the next step's batch on a side stream while this step runs, in the order timm's
`PrefetchLoader` (and NVIDIA's Apex ImageNet example) use: the next batch's copy is issued before this step's
kernels, and the compute stream waits for it only when it takes that batch. Natively the copy then overlaps the
step; for a client across a network, the batch crosses it while the GPU trains on the one before.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch


def resnet50(batch: int, pixels: str = "float32"):
    import torchvision

    model = torchvision.models.resnet50(num_classes=1000)
    g = torch.Generator().manual_seed(0)
    if pixels == "uint8":
        images = torch.randint(0, 256, (batch, 3, 224, 224), generator=g, dtype=torch.uint8).pin_memory()
    else:
        images = torch.randn(batch, 3, 224, 224, generator=g)
    labels = torch.randint(0, 1000, (batch,), generator=g)

    def data(step):
        x = images.to("cuda", non_blocking=True)
        if pixels == "uint8":
            x = x.float().div_(255)
        return x, labels.to("cuda", non_blocking=True)

    def loss_fn(model, batch_data):
        x, y = batch_data
        return torch.nn.functional.cross_entropy(model(x), y)

    return model, data, loss_fn, batch, "images/s"


def gpt2(batch: int, seq: int = 512):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_positions=seq, n_embd=768, n_layer=12, n_head=12, vocab_size=50257)
    # The fused attention kernels' backward adds with atomics (not deterministic even when asked to
    # be), and this run amplifies the smallest difference within a hundred steps: eager attention.
    config._attn_implementation = "eager"
    model = GPT2LMHeadModel(config)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (16, batch, seq), generator=g)

    def data(step):
        return tokens[step % 16].to("cuda", non_blocking=True)

    def loss_fn(model, ids):
        return model(input_ids=ids, labels=ids).loss

    return model, data, loss_fn, batch * seq, "tokens/s"


def prefetched(data, steps: int):
    """Each step's batch, the next one's copy issued on a side stream before this one is handed out (timm's
    PrefetchLoader order); the compute stream waits for a batch's copy only when it takes the batch."""
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        ahead = data(0)
    for step in range(steps):
        torch.cuda.current_stream().wait_stream(side)
        current = ahead
        for tensor in current if isinstance(current, tuple) else (current,):
            tensor.record_stream(torch.cuda.current_stream())  # made on the side stream, used on this one
        if step + 1 < steps:
            with torch.cuda.stream(side):
                ahead = data(step + 1)
        yield current


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", choices=["resnet50", "gpt2"])
    parser.add_argument("--steps", type=int, default=None, help="default: 60 (resnet50), 200 (gpt2)")
    parser.add_argument("--warmup", type=int, default=10, help="steps left out of the throughput")
    parser.add_argument("--batch", type=int, default=None, help="default: 64 (resnet50), 8 (gpt2)")
    parser.add_argument("--prefetch", action="store_true",
                        help="load the next step's batch on a side stream while this step runs (timm's "
                        "PrefetchLoader order)")  # fmt: skip
    parser.add_argument("--input", choices=["float32", "uint8"], default="float32",
                        help="resnet50's images: float32 in pageable memory (default), or uint8 pixels in "
                        "page-locked memory scaled on the GPU, as a JPEG data loader gives them")  # fmt: skip
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    # GPT-2's embedding backward adds with atomics by default: two native runs then drift apart by
    # several per cent after a hundred steps, and a remote run could not be told from a wrong one.
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False  # not a launch per torch.empty
    if args.model == "resnet50":
        model, data, loss_fn, per_step, unit = resnet50(args.batch or 64, args.input)
        steps = args.steps or 60
    else:
        model, data, loss_fn, per_step, unit = gpt2(args.batch or 8)
        steps = args.steps or 200
    model = model.cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    started = None
    batches = prefetched(data, steps) if args.prefetch else (data(step) for step in range(steps))
    for step, batch_data in enumerate(batches):
        if step == args.warmup:
            torch.cuda.synchronize()
            started = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model, batch_data)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.5f}", flush=True)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    measured = steps - args.warmup
    print(json.dumps({"model": args.model, "steps": measured, "seconds": round(seconds, 3),
                      "throughput": round(measured * per_step / seconds, 1), "unit": unit}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
