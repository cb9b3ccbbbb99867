"""PyTorch through the CUDA runtime: each section prints what it computed (hashes of the exact bytes for
deterministic kernels), so a native and a remote run of this program print the same lines.

Sections fail one at a time (`name FAIL: Error: message`) so one run shows every gap.
"""

from __future__ import annotations

import hashlib
import os
import sys
import traceback

import torch
from _common import loaded_libcuda

DEV = "cuda"


def digest(t: torch.Tensor) -> str:
    data = t.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def seeded(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def devices():
    p = torch.cuda.get_device_properties(0)
    print("device_count", torch.cuda.device_count())
    print("device", p.name, f"sm_{p.major}{p.minor}", "sms", p.multi_processor_count)
    print("is_available", torch.cuda.is_available(), "initialized", torch.cuda.is_initialized())


def copies():
    x = torch.arange(1 << 20, dtype=torch.float32)
    y = x.to(DEV)
    back = y.cpu()
    pinned = torch.empty_like(x).pin_memory()
    pinned.copy_(y, non_blocking=True)
    torch.cuda.synchronize()
    print("copies", torch.equal(back, x), torch.equal(pinned, x), digest(y))
    # Non-blocking copies to pinned memory return at once and are there once an event says so (issue 12).
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    outs = [torch.empty_like(x).pin_memory() for _ in range(4)]
    with torch.cuda.stream(side):
        for k, out in enumerate(outs):
            out.copy_(y * k, non_blocking=True)
        done = torch.cuda.Event()
        done.record(side)
        moved = y.to("cpu", non_blocking=True)
    done.synchronize()
    print("non_blocking_event", all(torch.equal(o, x * k) for k, o in enumerate(outs)))
    while not side.query():
        pass
    print("non_blocking_query", torch.equal(moved, x), moved.is_pinned())
    gen = torch.Generator(device=DEV).manual_seed(1234)
    print("curand", digest(torch.rand(4096, device=DEV, generator=gen)))


def elementwise_and_reductions():
    x = seeded(1 << 16).to(DEV)
    print("elementwise", digest(torch.sin(x) * torch.exp(-x.abs()) + 1))
    print("reductions", digest(torch.stack([x.sum(), x.mean(), x.max(), x.min(), x.norm()])))
    # A float scan's summation order depends on timing (CUB's decoupled look-back): compare it to a
    # float64 reference instead of bit for bit.
    ref = torch.cumsum(x.cpu().double(), 0)
    close = torch.allclose(torch.cumsum(x, 0).cpu().double(), ref, rtol=1e-4, atol=1e-2)
    print("cumsum_sort", close, digest(torch.sort(x).values))


def matmuls():
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        a = seeded(512, 768, dtype=dtype, seed=1).to(DEV)
        b = seeded(768, 256, dtype=dtype, seed=2).to(DEV)
        print("matmul", str(dtype).removeprefix("torch."), digest(a @ b))
    a = seeded(8, 64, 32, seed=3).to(DEV)
    print("bmm", digest(torch.bmm(a, a.transpose(1, 2))))


def cudnn():
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 16, 3, padding=1).to(DEV)
    bn = torch.nn.BatchNorm2d(16).to(DEV)
    x = seeded(4, 3, 32, 32, seed=4).to(DEV).requires_grad_()
    y = bn(conv(x))
    y.square().mean().backward()
    print("cudnn_forward", digest(y))
    print("cudnn_backward", digest(x.grad), digest(conv.weight.grad))
    print("bn_running", digest(bn.running_mean), digest(bn.running_var))


def training_steps():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 10)).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, target = seeded(256, 64, seed=5).to(DEV), torch.arange(256, device=DEV) % 10
    losses = []
    for _ in range(5):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), target)
        loss.backward()
        opt.step()
        losses.append(f"{loss.item():.6f}")
    print("train_losses", " ".join(losses))
    print("train_weights", digest(model[0].weight))


def streams_and_events():
    s = torch.cuda.Stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    x = seeded(1 << 20, seed=6).to(DEV)
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        start.record()
        y = (x * 2).sum()
        end.record()
    end.synchronize()
    s.synchronize()
    torch.cuda.current_stream().wait_stream(s)
    print("streams", digest(y), "elapsed_positive", start.elapsed_time(end) >= 0, "query", s.query())


def memory_stats():
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    x = torch.empty(64 << 20, dtype=torch.uint8, device=DEV)
    grew = torch.cuda.memory_allocated() - before
    del x
    print("memory_allocated_grew", grew, "reserved_ge", torch.cuda.memory_reserved() >= grew)
    stats = torch.cuda.memory_stats()
    print("memory_stats_keys", "allocation.all.current" in stats, "num_ooms" in stats)


def compiled():
    def f(x, y):
        return torch.nn.functional.gelu(x @ y).softmax(-1) * 3 + x.sum()

    x, y = seeded(128, 128, seed=7).to(DEV), seeded(128, 128, seed=8).to(DEV)
    fc = torch.compile(f)
    got = fc(x, y)
    print("compile_close", torch.allclose(got, f(x, y), rtol=1e-4, atol=1e-5), digest(got))


def cuda_graphs():
    x = seeded(1 << 16, seed=9).to(DEV)
    static_out = torch.empty_like(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            static_out.copy_(torch.relu(x) * 2)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out.copy_(torch.relu(x) * 2 + 1)
    x.copy_(seeded(1 << 16, seed=10).to(DEV))
    graph.replay()
    torch.cuda.synchronize()
    print("graph_replay", digest(static_out), torch.equal(static_out, torch.relu(x) * 2 + 1))


def graphed_pinned_copies():
    """Pinned copies inside torch.cuda.graph, with cudaHostAlloc'd pinned memory and with registered
    memory (`pinned_use_cuda_host_register`, as test_cuda.py's pinned-memory tests switch on): each
    replay reads the input pages and writes the output pages as they are then."""
    n = 1 << 14
    for register in (False, True):
        torch.cuda.memory._set_allocator_settings(f"pinned_use_cuda_host_register:{register}")
        source = torch.zeros(n).pin_memory()
        result = torch.zeros(n).pin_memory()
        on_gpu = torch.zeros(n, device=DEV)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            on_gpu.copy_(source, non_blocking=True)
            on_gpu.add_(1)
            result.copy_(on_gpu, non_blocking=True)
        replays = []
        for start in (0, 100):
            source.copy_(torch.arange(start, start + n, dtype=torch.float32))
            graph.replay()
            torch.cuda.synchronize()
            replays.append([result[0].item(), result[-1].item()])
        print("graphed_pinned_copies", "registered" if register else "allocated", replays)
    torch.cuda.memory._set_allocator_settings("pinned_use_cuda_host_register:False")


SECTIONS = [devices, copies, elementwise_and_reductions, matmuls, cudnn, training_steps, streams_and_events,
            memory_stats, compiled, cuda_graphs, graphed_pinned_copies]  # fmt: skip


def main() -> int:
    only = set(os.environ.get("PROG_TORCH_ONLY", "").split(",")) - {""}
    failed = 0
    for section in SECTIONS:
        if only and section.__name__ not in only:
            continue
        try:
            section()
        except Exception as exc:  # one section's failure must not hide the others'
            failed += 1
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            print(f"{section.__name__} FAIL: {type(exc).__name__}: {first[:300]}")
            traceback.print_exc(file=sys.stderr)
    print("libcuda", loaded_libcuda(), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
