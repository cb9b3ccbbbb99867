"""Remote execution on a real GPU, in one command: python tests/gpu/remote/run.py

For each program here (raw cuda.bindings, cuda.core, numba-cuda, kernel printf, the CUDA runtime,
CuPy, PyTorch, and what issue 11 lists: several processes, contexts, the linker, IPC memory, pools and
events, allocations of every size in the process's address window and under expandable segments,
host callbacks, managed memory; issue 25: cooperative launches, cache configuration, enumeration,
tensor maps, cuDNN's cooperative batch norm, CUDA arrays with textures and surfaces) it runs the
program natively, then remotely — gpupool's libcuda.so.1 first on LD_LIBRARY_PATH, talking to a
lease worker started with start_worker with the real CUDA executor — and diffs the two outputs.
Then, remotely: the quota refusal, PyTorch's OOM at the partition, the ResNet-50 and GPT-2-style
trainings (losses step by step, throughput), the isolation check (a guessed address and another lease's live address), a worker killed mid-run, a two-GPU lease where
the host has two GPUs, and, when gpupool-server and gpuattach are installed, the same programs and
trainings as a user runs them: a real pool server and `gpuattach run -n 1 -p 0.5`. Every step says what it
does; the summary lists PASS/FAIL/SKIP; the exit status is 1 if anything failed. Results also go
to $OUT/remote_gpu_results.json when $OUT is set. The whole run takes about 8 minutes on an H100;
`--only KEY ...` runs a part (keys: the programs' names without `prog_`, and quota torch_oom
training resnet50 gpt2 isolation isolate isolate_ipc kill two_gpus pool). `--link` runs the trainings as a client on another
host gets them: the worker in one network namespace, the program in another, across a shaped veth
(tests/netem_link.py: 25 Gbit/s, 20 µs each way, TLS on; needs root and iproute2, else SKIP with why).
`--ring` runs every remote program with its connection over the command ring (GPUPOOL_SHIM_RING=1).

Needs: Python 3.12 with cuda-bindings, cuda-core (and NVRTC), numba-cuda, numpy; a C compiler to
build the shim here (else a prebuilt virtualize/client/_libcuda_shim*.so from the tree is used).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))

from _pool import installed, nvml_view_env, pool_server  # noqa: E402

from server.workers import WorkerDevice, start_worker  # noqa: E402
from virtualize.client.remote import fresh_shim, remote_env  # noqa: E402
from virtualize.common import _wire  # noqa: E402

PROGRAMS = [
    "prog_bindings.py",
    "prog_core.py",
    "prog_numba.py",
    "prog_numba_small.py",  # one-element results and small host arrays copied back
    "prog_printf.py",  # kernel output at the synchronise, in order with the program's own prints
    "prog_launch_errors.py",  # launches the GPU refuses: refused by the launch call, the context unspoiled
    "prog_processes.py",  # several processes of one lease share its memory, each freed at exit
    "prog_contexts.py",  # cuCtxCreate / cuCtxDestroy
    "prog_link.py",  # the driver's linker: relocatable PTX from NVRTC, linked on the worker
    # Through the CUDA runtime (libcudart and the copies of it inside cuBLAS, cuDNN ...).
    "prog_runtime.py",
    "prog_cupy.py",
    "prog_torch.py",
    "prog_torch_ipc.py",  # CUDA tensors between processes: IPC memory and event handles
    "prog_big_copies.py",  # copies of tens of MiB both ways (with --encrypt: in pieces across connections)
    "prog_window.py",  # allocations of many sizes churned: contents kept, addresses reserved here
    "prog_pool_ipc.py",  # a pool and its pointer exported to a child process (file descriptor, 64 bytes)
    "prog_callbacks.py",  # host functions and stream callbacks run in the program, in stream order
    "prog_managed.py",  # managed memory written and read by the host and by kernels (numba, CuPy)
    "prog_mapped.py",  # mapped page-locked memory: DEVICEMAP, registered arrays, a kernel given the host address
    "prog_graph_nodes.py",  # a graph built node by node: kernel, memset, empty nodes, dependencies
    "prog_graph_updates.py",  # an instantiated graph set anew in place, as XLA's command buffers do
    "prog_graph_node_params.py",  # a graph's own nodes read back, set anew, attributes and ids (PyTorch, XLA)
    "prog_graph_core.py",  # cuda.core graph builder: while and if/else conditionals, embed, callback, update
    # Frameworks and libraries beyond PyTorch's defaults (issue 25).
    "prog_jax.py",  # XLA with its autotuner: jit, grad, lax.scan, FFT, an optax training loop
    "prog_cupy_libs.py",  # cuFFT, cuSOLVER, cuSPARSE, cuRAND, CUB/Thrust, pinned and async copies
    "prog_cudnn_bn.py",  # cuDNN batch norm fp16 channels-last (a cooperative launch), ResNet-18 with AMP
    "prog_pinned_kernels.py",  # kernels given pinned host addresses: Graph.update, a cluster launch (DSMEM)
    "prog_batched_copies.py",  # cuMemcpyBatchAsync (cuda.core's copy_batch) and cuMemcpy3DBatchAsync
    "prog_host_pools.py",  # cuda.core's PinnedMemoryResource and ManagedMemoryResource pools
    "prog_driver_calls.py",  # cooperative launches, cache config, enumeration, a retained handle, tensor maps
    "prog_torch_batchnorm.py",  # cuDNN batch norm, fp16 channels-last, deterministic: cooperative kernels
    "prog_arrays.py",  # CUDA arrays sampled through a texture, painted through a surface; 2D/3D copies
    "prog_native_calls.py",  # what the worker serves in C: page-locked copies chained by events, graphs, elapsed
    "prog_green_contexts.py",  # issue 25: SM resources split, a green context with a stream, event, launch
    "prog_memory_calls.py",  # issue 25: range attributes of managed memory, current pool, batched stream memory ops
    "prog_legacy.py",  # issue 25: the legacy launch API (cuParamSet*, cuLaunchGrid), cuCtxAttach/cuCtxDetach
    "prog_graph_memory.py",  # issue 25: graph memory nodes (allocation, free), read back, attributes, trim
    "prog_graph_recapture.py",  # issue 25: a recapture (13.3; not found on a 13.0 driver), graph memory's life
    "prog_multicast.py",  # issue 25: a multicast object bound, mapped and written through (NOT_SUPPORTED w/o NVLS)
    "prog_proc_addresses.py",  # issue 25: cuGetProcAddress per (name, version) as the server's driver answers
    "prog_ipc_raw.py",  # IPC memory (3 MiB, 4 KiB) and an interprocess event, parent to child
    "prog_zero_sized.py",  # issue 25: copies and memsets of zero bytes at any address (XLA's), as the driver answers
    "prog_pinned_pieces.py",  # issue 31: large copies into pinned tensors, in pieces over TLS, right and in order
]
results: list[dict] = []


def step(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def record(name: str, status: str, detail: str = "") -> None:
    results.append({"check": name, "status": status, "detail": detail})
    print(f"--> {status}: {name}" + (f" ({detail})" if detail else ""), flush=True)


def gpus() -> list[tuple[int, str, int]]:
    """(index, uuid, total MiB) of each GPU, from nvidia-smi."""
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    rows = [line.split(", ") for line in out.strip().splitlines()]
    return [(int(i), u.strip(), int(m)) for i, u, m in rows]


def find_shim(work: Path) -> Path:
    path = fresh_shim(work / "shim")
    how = (
        "compiled from this tree's sources" if path.is_relative_to(work) else "prebuilt (no C compiler here)"
    )
    print(f"shim {how}: {path}")
    return path


def base_env(extra_pythonpath: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_") and k != "NUMBA_CUDA_DRIVER"}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(extra_pythonpath), str(HERE), str(ROOT), env.get("PYTHONPATH", "")]
    )
    env["PYTHONUNBUFFERED"] = "1"
    return env


WORKER_ENV: dict[str, str] = {}  # --profile: each lease worker's cProfile (GPUPOOL_WORKER_PROFILE) under $OUT
ENCRYPT: dict[
    str, str
] = {}  # --encrypt: GPUPOOL_DATA_ENCRYPTION=always, --ring: GPUPOOL_SHIM_RING=1, every remote run


def lease_worker(name: str, devices: list) -> object:
    """A worker with the CUDA executor for a lease of `devices` (kept on the handle for lease_env)."""
    handle = start_worker(name, devices, bind_host="127.0.0.1", env=dict(WORKER_ENV), executor="cuda")
    handle.devices = devices
    return handle


def lease_env(handle, shim: Path, work: Path, env: dict[str, str]) -> dict[str, str]:
    """The environment gpuattach gives a program of this lease: the shim, and NVML showing the lease."""
    answer = {"id": "gpu-test", "worker": handle.answer()}
    shim_env = remote_env(answer, cache_root=work / "cache", library=shim)
    view = nvml_view_env(f"lease-{handle.pid}", handle.devices, shim_env, work)
    return {**env, **shim_env, **view, **ENCRYPT}


def run(cmd: list[str], env: dict[str, str], timeout: float = 600, stdin=None):
    started = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=HERE, input=stdin
        )
    except subprocess.TimeoutExpired as exc:
        text = [
            x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
            for x in (exc.stdout, exc.stderr)
        ]
        return 124, text[0], text[1] + "\n(timed out)", time.monotonic() - started
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started


def readline_within(proc: subprocess.Popen, seconds: float) -> str:
    """One line of a child's stdout, or "" if none comes in time (never hang the runner)."""
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(seconds):
            return ""
    return proc.stdout.readline().strip()


def libcuda_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("libcuda ")]
    return lines[-1].split(" ", 1)[1] if lines else "(not reported)"


def show(label: str, rc: int, out: str, err: str, seconds: float) -> None:
    print(f"[{label}] exit {rc} in {seconds:.1f} s; libcuda loaded: {libcuda_line(err)}")
    for line in out.splitlines():
        print(f"[{label}]   {line}")
    noise = [line for line in err.splitlines() if not line.startswith("libcuda ")]
    if rc != 0 or any("gpupool:" in line for line in noise):
        for line in noise[-25:]:
            print(f"[{label} stderr]   {line}")


# Native runs, kept for the same programs' runs through a real pool server (via_pool_server).
NATIVE: dict[str, tuple[int, str, str, float]] = {}
NATIVE_TRAINING: dict[str, tuple[int, list[float], dict]] = {}


def native_vs_remote(
    name: str, cmd: list[str], native_env, remote_env_, shim: Path, timeout: float = 600
) -> None:
    step(f"{name}: native run")
    n = NATIVE[name] = run(cmd, native_env, timeout)
    show("native", *n)
    if n[0] != 0 and "ModuleNotFoundError" in n[2]:
        missing = [line for line in n[2].splitlines() if "ModuleNotFoundError" in line][-1]
        record(name, "SKIP", f"not installed here: {missing.strip()}")
        return
    step(f"{name}: remote run (gpupool libcuda.so.1 -> worker)")
    r = run(cmd, remote_env_, timeout)
    show("remote", *r)
    remote_lib = libcuda_line(r[2])
    problems = []
    if n[0] != 0:
        problems.append(f"native exit {n[0]}")
    if r[0] != 0:
        problems.append(f"remote exit {r[0]}")
    if n[1] != r[1]:
        problems.append("outputs differ")
    if Path(remote_lib).resolve() != shim.resolve():
        problems.append(f"remote run loaded {remote_lib}, not the shim")
    native_lib = libcuda_line(n[2])
    if "_libcuda_shim" in native_lib or Path(native_lib).resolve() == shim.resolve():
        problems.append("native run loaded the shim")
    detail = f"native {n[3]:.1f} s, remote {r[3]:.1f} s"
    record(name, "FAIL" if problems else "PASS", "; ".join(problems) or detail)


def expect(name: str, out: str, wanted: dict[str, str]) -> None:
    got = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        got[key] = value
    bad = {k: got.get(k) for k, v in wanted.items() if not (got.get(k) or "").startswith(v)}
    record(name, "FAIL" if bad else "PASS", f"unexpected {bad}" if bad else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--partition-mib", type=int, default=4096, help="memory of the test lease (default 4096)"
    )
    parser.add_argument(
        "--gpu", type=int, default=0, help="the GPU to run on (default 0); another runs beside it"
    )
    parser.add_argument("--only", nargs="*", help="run only these checks (bindings core numba quota ...)")
    parser.add_argument("--encrypt", action="store_true",
                        help="every remote run over TLS 1.3, as across hosts, though on loopback")  # fmt: skip
    parser.add_argument("--ring", action="store_true",
                        help="every remote run's connection over the command ring (GPUPOOL_SHIM_RING=1: frames "
                        "and answers through memory the program and the worker map)")  # fmt: skip
    parser.add_argument("--link", action="store_true",
                        help="the trainings across a shaped link between two network namespaces (25 Gbit/s, "
                        "20 µs each way, TLS on), as a client on another host gets them (root)")  # fmt: skip
    parser.add_argument("--link-rate", default="25gbit", help="--link: the link's rate each way (tc units)")
    parser.add_argument("--link-delay", default="20us", help="--link: the link's one-way delay (tc units)")
    parser.add_argument("--profile", action="store_true",
                        help="every remote run with GPUPOOL_SHIM_PROFILE=1: the trainings print where the shim's "
                        "time went (calls, round trips, bytes) after their results; with $OUT set, each worker "
                        "writes a cProfile of each connection to $OUT/worker-profiles")  # fmt: skip
    parser.add_argument("--train-args", default="",
                        help="more arguments for bench/train_models.py, native and remote alike "
                        "(e.g. '--input uint8')")  # fmt: skip
    args = parser.parse_args()
    TRAIN_ARGS.extend(args.train_args.split())
    if args.encrypt:
        ENCRYPT.update({_wire.ENV_ENCRYPT: "always"})
    if args.profile:
        ENCRYPT.update({"GPUPOOL_SHIM_PROFILE": "1"})
        if os.environ.get("OUT"):  # and each worker's cProfile of each connection, beside the logs
            WORKER_ENV["GPUPOOL_WORKER_PROFILE"] = str(Path(os.environ["OUT"], "worker-profiles"))
            Path(WORKER_ENV["GPUPOOL_WORKER_PROFILE"]).mkdir(parents=True, exist_ok=True)
    if args.ring:  # (a local connection only: with --encrypt the ring is not asked for)
        ENCRYPT.update({"GPUPOOL_SHIM_RING": "1"})
    want = set(args.only or [])

    def selected(key: str) -> bool:
        return not want or key in want

    work = Path(tempfile.mkdtemp(prefix="gpupool-remote-"))
    step("environment")
    print("python", sys.version.split()[0], "at", sys.executable)
    for mod in ("cuda.bindings", "cuda.core", "numba_cuda", "numba", "numpy", "torch", "cupy"):
        try:
            m = __import__(mod, fromlist=["__version__"])
            print(mod, getattr(m, "__version__", "?"))
        except Exception as exc:
            print(mod, "not importable:", exc)
    devices = gpus()
    devices = devices[args.gpu :] + devices[: args.gpu]  # --gpu N: that GPU first
    for index, uuid, mib in devices:
        print(f"GPU {index}: {uuid}, {mib} MiB")
    shim = find_shim(work)
    print("shim exports:", subprocess.run(["sh", "-c", f"nm -D --defined-only {shim} | grep -c ' T cu'"],
                                          capture_output=True, text=True).stdout.strip(), "cu* symbols")  # fmt: skip

    # numba-cuda 0.30 imports numpy.row_stack, removed in numpy 2.5.
    site = work / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import numpy\nif not hasattr(numpy, 'row_stack'):\n    numpy.row_stack = numpy.vstack\n"
    )
    env = base_env(site)
    os.environ["PYTHONPATH"] = env["PYTHONPATH"]  # the worker process imports server/ from this tree

    partition = args.partition_mib << 20
    step(f"start a worker: 1 GPU ({devices[0][1]}), partition {args.partition_mib} MiB, CUDA executor")
    worker = lease_worker("gpu-test", [WorkerDevice(devices[0][0], devices[0][1], partition)])
    print(f"worker pid {worker.pid} listening on {worker.host}:{worker.port}")
    remote = lease_env(worker, shim, work, env)
    native_one = {**env, "CUDA_VISIBLE_DEVICES": devices[0][1]}  # natively, the same single GPU
    try:
        for program in PROGRAMS:
            key = program.removeprefix("prog_").removesuffix(".py")
            if selected(key):
                native_vs_remote(key, [sys.executable, program], native_one, remote, shim)
                if not worker.alive():  # a crash at the client's exit shows in no program's output
                    record(f"{key}: the worker outlives the program", "FAIL",
                           f"the worker exited ({worker.proc.returncode}) at or after the program's end")  # fmt: skip
                    worker = lease_worker("gpu-test", [WorkerDevice(devices[0][0], devices[0][1], partition)])
                    remote = lease_env(worker, shim, work, env)

        if selected("quota"):
            step("quota: the program sees the partition, allocations beyond it fail")
            rc, out, err, s = run([sys.executable, "prog_limits.py", "quota"], remote)
            show("remote", rc, out, err, s)
            expect("quota", out, {
                "total_mem_bytes": str(partition), "mem_info_total_bytes": str(partition),
                "alloc_beyond_partition": "CUDA_ERROR_OUT_OF_MEMORY",
                "second_alloc_past_partition": "CUDA_ERROR_OUT_OF_MEMORY", "alloc_after_free": "CUDA_SUCCESS",
            })  # fmt: skip

        if selected("torch_oom"):
            step("PyTorch past the partition: torch.OutOfMemoryError, then work goes on")
            rc, out, err, s = run([sys.executable, "prog_torch_oom.py"], remote)
            show("remote", rc, out, err, s)
            expect("torch OOM at the partition", out, {
                "total_bytes": str(partition), "oom_raised": "OutOfMemoryError",
                "filled_blocks_within_total": "True True", "after_oom_works": "1048576.0",
            })  # fmt: skip

        if selected("isolate"):
            step(
                "isolate: a child process's device-side assert leaves its parent working (gpuattach run --isolate)"
            )
            rc, out, err, s = run([sys.executable, "prog_isolate.py"], native_one)
            show("native", rc, out, err, s)
            rc, out, err, s = run([sys.executable, "prog_isolate.py"], {**remote, "GPUPOOL_ISOLATE": "1"})
            show("remote", rc, out, err, s)
            expect("isolate", out, {"child_error": "device-side assert", "parent_after_child": "True",
                                    "parent_matmul": "True"})  # fmt: skip

        if selected("isolate_ipc"):  # CUDA IPC memory and event handles between two processes' own workers
            one_gpu = {"VMM_CHILD_DEVICE": "0"}  # prog_vmm_share.py: both processes on the lease's one GPU
            for prog in (
                "prog_ipc_raw.py",
                "prog_torch_ipc.py",
                "prog_processes.py",
                "prog_pool_ipc.py",
                "../multi/prog_vmm_share.py",
            ):
                native_vs_remote(f"isolate_ipc {prog}", [sys.executable, prog], {**native_one, **one_gpu},
                                 {**remote, "GPUPOOL_ISOLATE": "1", **one_gpu}, shim, timeout=120)  # fmt: skip

        models = [m for m in ("resnet50", "gpt2") if selected("training") or selected(m)]
        if models:
            # Training needs more than the test lease: half the GPU, what `gpuattach run -p 0.5` gets.
            half = (devices[0][2] << 20) // 2
            half_gpu = [WorkerDevice(devices[0][0], devices[0][1], half)]
            if args.link:
                across_link(models, half_gpu, shim, work, env, native_one, args.link_rate, args.link_delay)
            else:
                trainer = lease_worker("gpu-train", half_gpu)
                try:
                    for model in models:
                        training(model, native_one, lease_env(trainer, shim, work, env))
                finally:
                    trainer.stop()

        if selected("isolation"):
            step("isolation: a guessed address and another lease's live address are refused")
            other = lease_worker("gpu-test-other", [WorkerDevice(devices[0][0], devices[0][1], 256 << 20)])
            holder = subprocess.Popen(
                [sys.executable, "-c", HOLDER], env=lease_env(other, shim, work, env), cwd=HERE,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            foreign = readline_within(holder, 120)
            print("the other lease holds", foreign)
            for label, address in (("guessed", ""), ("other lease", foreign)):
                rc, out, err, s = run(
                    [sys.executable, "prog_limits.py", "isolation"], {**remote, "GUESSED_ADDRESS": address}
                )
                show("remote", rc, out, err, s)
                expect(f"isolation ({label} address)", out, {
                    "memset_foreign_returns": "CUDA_SUCCESS", "next_sync": "CUDA_ERROR_INVALID_VALUE",
                    "copy_from_foreign": "CUDA_ERROR_INVALID_VALUE", "copy_past_own_end": "CUDA_ERROR_INVALID_VALUE",
                    "own_memory_still_fine": "CUDA_SUCCESS CUDA_SUCCESS",
                })  # fmt: skip
            try:
                holder.communicate("\n", timeout=60)
            except subprocess.TimeoutExpired:
                holder.kill()
            other.stop()

        if selected("kill"):
            step("a worker killed mid-run: the next call fails, the shim says why, the program ends")
            victim = lease_worker("gpu-test-victim", [WorkerDevice(devices[0][0], devices[0][1], partition)])
            proc = subprocess.Popen([sys.executable, "prog_limits.py", "kill"], env=lease_env(victim, shim, work, env),
                                    cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
            first = readline_within(proc, 180)
            print("program:", first, "- killing worker pid", victim.pid)
            os.kill(victim.pid, signal.SIGKILL)
            try:
                out, err = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
                out += "\n(the program did not end within 120 s of the kill)"
            show("remote", proc.returncode, first + "\n" + out, err, 0)
            ok = (first == "running" and proc.returncode == 1 and "CUDA_ERROR_DEVICE_UNAVAILABLE" in out
                  and "lost the connection to the lease's worker" in err)  # fmt: skip
            record(
                "worker killed mid-run", "PASS" if ok else "FAIL", out.strip().splitlines()[-1] if out else ""
            )
            victim.stop()

        if selected("two_gpus"):
            if len(devices) < 2:
                record("two-GPU lease", "SKIP", "this host has one GPU")
            else:
                step("two-GPU lease: two devices, memory on each, a peer copy")
                pair = [WorkerDevice(i, u, partition) for i, u, _ in devices[:2]]
                two = lease_worker("gpu-test-two", pair)
                native = {**env, "CUDA_VISIBLE_DEVICES": ",".join(u for _, u, _ in devices[:2])}
                native_vs_remote("two-GPU lease", [sys.executable, "prog_limits.py", "two_gpus"], native,
                                 lease_env(two, shim, work, env), shim)  # fmt: skip
                two.stop()
    finally:
        worker.stop()

    if selected("pool"):
        # Through the product's own path: every program selected above, and the trainings.
        chosen = [p for p in PROGRAMS if p == "prog_bindings.py" or selected(p.removeprefix("prog_")[:-3])]
        via_pool_server(work, env, native_one, shim, chosen, models)

    step("summary")
    for r in results:
        print(f"{r['status']:5} {r['check']}" + (f"  -- {r['detail']}" if r["detail"] else ""))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "remote_gpu_results.json").write_text(json.dumps(results, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    return 1 if any(r["status"] == "FAIL" for r in results) else 0


def across_link(models, devices, shim: Path, work: Path, env, native_env, rate: str, delay: str) -> None:
    """The trainings as a client on another host runs them: the lease's worker in one network namespace,
    the program in another, across a veth shaped to `rate` and `delay` each way, TLS on. SKIP, saying
    why, where the namespaces cannot be made."""
    sys.path.insert(0, str(ROOT / "tests"))
    from netem_link import LinkOptions, NetemLink, unavailable

    why = unavailable()
    if why:
        for model in models:
            record(f"training {model} across a shaped link", "SKIP", f"no network namespaces here: {why}")
        return
    with NetemLink(LinkOptions(rate=rate, delay=delay)) as link:
        step(f"a shaped link between two network namespaces: {link.shaping}")
        worker = start_worker("gpu-train-link", devices, bind_host="0.0.0.0", env=dict(WORKER_ENV), executor="cuda",
                              prefix=link.prefix(link.worker_ns))  # fmt: skip
        worker.devices = devices
        try:
            host, port = link.reach(worker.port)  # with the link's delay (a relay where netem is missing)
            print(
                f"worker pid {worker.pid} in {link.worker_ns}, reached from {link.client_ns} at {host}:{port}"
            )
            remote = lease_env(worker, shim, work, env)
            remote[_wire.ENV_WORKER] = f"{host}:{port}"
            remote[_wire.ENV_ENCRYPT] = "always"  # as between two hosts
            remote.pop(_wire.ENV_LOCAL, None)  # another namespace: the worker's local socket is not there
            for model in models:
                training(
                    model, native_env, remote, via=link.prefix(link.client_ns), where="across a shaped link"
                )
        finally:
            worker.stop()


TRAIN_ARGS: list[str] = []  # --train-args


def training(
    model: str, native_env: dict[str, str], remote_env_: dict[str, str], via: list[str] = (), where: str = ""
) -> None:
    """A real training run natively and remotely: losses step by step, throughput remote / native.
    `via`: the command that runs the remote one (gpuattach run ... --), else the lease's environment does;
    `where`: what the check's name says of it (default: through gpuattach, where `via` is given)."""
    name = f"training {model}" + (f" {where}" if where else " through gpuattach" if via else "")
    step(f"{name}: native, then remote (bench/train_models.py)")
    script = str(ROOT / "bench" / "train_models.py")
    runs = {}
    for label, env in (("native", native_env), ("remote", remote_env_)):
        if label == "native" and model in NATIVE_TRAINING:
            runs[label] = NATIVE_TRAINING[model]
            print(f"[native] as measured above: {runs[label][2]}")
            continue
        command = [sys.executable, script, model, *TRAIN_ARGS]
        rc, out, err, seconds = run([*via, *command] if label == "remote" else command, env, timeout=900)
        losses = [float(line.split()[3]) for line in out.splitlines() if line.startswith("step ")]
        summary = next((json.loads(line) for line in out.splitlines() if line.startswith("{")), {})
        runs[label] = (rc, losses, summary)
        if label == "native":
            NATIVE_TRAINING[model] = runs[label]
        print(f"[{label}] exit {rc} in {seconds:.1f} s: {summary}")
        if rc != 0:
            print("\n".join(f"[{label} stderr]   {line}" for line in err.splitlines()[-25:]))
        if (
            label == "remote" and remote_env_.get("GPUPOOL_SHIM_PROFILE") == "1"
        ):  # --profile: the shim's table
            print("\n".join(f"[profile] {line}" for line in err.splitlines() if line.startswith("gpupool:")))
    (n_rc, n_loss, n_sum), (r_rc, r_loss, r_sum) = runs["native"], runs["remote"]
    print(f"{'step':>5} {'native loss':>12} {'remote loss':>12}")
    for i, (a, b) in enumerate(zip(n_loss, r_loss, strict=False)):
        if i < 5 or i % 10 == 0 or i == len(n_loss) - 1:
            print(f"{i:5d} {a:12.5f} {b:12.5f}")
    worst = max((abs(a - b) / max(abs(a), 1e-6) for a, b in zip(n_loss, r_loss, strict=False)), default=1.0)
    ratio = r_sum.get("throughput", 0) / n_sum["throughput"] if n_sum.get("throughput") else 0.0
    detail = (f"{n_sum.get('throughput')} vs {r_sum.get('throughput')} {n_sum.get('unit', '')}: remote "
              f"{100 * ratio:.1f} % of native; worst step loss difference {100 * worst:.3f} %")  # fmt: skip
    ok = n_rc == 0 and r_rc == 0 and len(n_loss) == len(r_loss) > 0 and worst <= 0.02
    record(name, "PASS" if ok else "FAIL", detail)


HOLDER = """
from cuda.bindings import driver as cu
cu.cuInit(0)
ctx = cu.cuDevicePrimaryCtxRetain(0)[1]
cu.cuCtxSetCurrent(ctx)
# Four 16 MiB buffers; report an address inside the last, far from where the tested program's
# single 1 MiB buffer will be (separate processes may hand out the same virtual addresses).
buffers = [cu.cuMemAlloc(16 << 20)[1] for _ in range(4)]
print(hex(int(buffers[-1]) + (8 << 20)), flush=True)
input()
"""


def via_pool_server(work: Path, env: dict[str, str], native_env: dict[str, str], shim: Path, programs: list[str],
                    models: list[str]) -> None:  # fmt: skip
    """gpupool-server on this GPU and `gpuattach run -n 1 -p F -- python PROGRAM`, as a user runs it:
    each program's output against its native run, the trainings' losses and throughput."""
    if not all(installed()):
        record("through gpupool-server + gpuattach", "SKIP", "gpupool-server / gpuattach not installed")
        return
    step("through a real pool server: gpupool-server on 127.0.0.1 + gpuattach run -n 1 -p F")
    try:
        with pool_server(work, env) as attach:
            for program in programs:
                key = program.removeprefix("prog_").removesuffix(".py")
                step(f"{key} through gpuattach run -n 1 -p 0.5")
                native = NATIVE.get(key) or run([sys.executable, program], native_env)
                pooled = run(
                    [*attach("0.5"), sys.executable, program], env
                )  # the shim the installation built
                show("gpuattach", *pooled)
                problems = [f"native exit {native[0]}"] if native[0] else []
                problems += [f"exit {pooled[0]}"] if pooled[0] else []
                problems += ["outputs differ"] if native[1] != pooled[1] else []
                problems += (
                    []
                    if "_libcuda_shim" in libcuda_line(pooled[2])
                    else [f"loaded {libcuda_line(pooled[2])}"]
                )
                record(f"{key} through gpupool-server + gpuattach", "FAIL" if problems else "PASS",
                       "; ".join(problems) or f"same output as native, {pooled[3]:.1f} s")  # fmt: skip
            for model in models:
                training(model, native_env, env, via=attach("0.5"))
    except RuntimeError as exc:
        record("gpupool-server", "FAIL", str(exc))


if __name__ == "__main__":
    sys.exit(main())
