"""Many GPUs in one run, natively and remotely, on a host with two GPUs: python tests/gpu/multi/run.py

Steps (each bounded by a timeout, each PASS/FAIL/SKIP with why, LIMIT where a documented limitation is met;
the exit status is 1 if any failed):
  vmm        NCCL's cuMem transport by hand (prog_vmm_share.py, cuda.bindings): memory exported as a
             POSIX descriptor by a process on GPU 0, passed over a Unix socket, imported and written by
             a process on GPU 1; natively and against one lease of the two GPUs: the same output
  ddp        PyTorch DDP over NCCL, `torchrun --nproc-per-node 2`, natively and against one lease of
             the two GPUs (one worker, as `gpuattach run -n 2` gets): the same loss at every step
  allreduce  all_reduce bus bandwidth (nccl-tests' busbw) from 1 MiB to 1 GiB, native vs remote
  tp         a tensor-parallel MLP forward over the two ranks: equal to the native result
  isolate    `--isolate` (GPUPOOL_ISOLATE=1): each rank in a worker process of its own, NCCL in the ranks'
             processes sharing memory worker to worker (its P2P/CUMEM transport: descriptors exported by
             one worker, imported by the other); DDP losses and all_reduce busbw against native, then
             the same with NCCL forwarded to the two workers (GPUPOOL_NCCL=forward, through gpuattach)
  halves     `-n 2 -p 0.5`: DDP on halves of the two GPUs; and two processes, each with its own
             lease of half of GPU 0, training side by side (NCCL refuses two ranks on one GPU)
  servers    two leases of one GPU each, as two gpupool-servers each owning one GPU would start them;
             one rank per lease, DDP over gloo (through host memory), then over NCCL forced to its
             socket transport (P2P and SHM off; bounded at 150 s: its kernels poll mapped host memory)
  spread     two real gpupool-servers on this host, each owning one GPU (CUDA_VISIBLE_DEVICES), and
             `gpuattach run -n 2 --spread -- torchrun --nproc-per-node 2 prog_ddp.py`, gloo then NCCL
             forwarded at its API (NCCL in each rank's worker, the workers connected over NCCL's socket
             transport: the servers' environment), which side ran NCCL, and all_reduce busbw 1 MiB-1 GiB
             across the two servers vs native ranks on the same socket transport
  link       the spread run as two hosts would have it: each gpupool-server in its own network
             namespace, joined by a veth pair shaped to 25 Gbit/s (tests/netem_link.py: netem where the
             kernel has it, else tbf, rate only); the client beside server B, reaching server A across
             the link; DDP over NCCL (the workers' sockets across the link) and all_reduce busbw, against
             native ranks one in each namespace on the same link (needs root and iproute2)
  gpuattach  the DDP run as a user types it, through a real gpupool-server:
             `gpuattach run -n 2 -- python -m torch.distributed.run --nproc-per-node 2 prog_ddp.py`
NCCL's transport lines (`... via P2P/CUMEM`, `via NET/Socket`) are shown for each run: what crosses
which link. Results: a table on stdout, and $OUT/multi_results.md, $OUT/multi_results.json, $OUT/logs/
when $OUT is set. `--only KEY ...` runs a part. Needs: Python with torch (CUDA, NCCL); a C compiler
for the shim (else a prebuilt virtualize/client/_libcuda_shim*.so). About 10-15 minutes on two H100s.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE.parent / "remote"))
sys.path.insert(0, str(HERE.parents[1]))  # tests/: the shaped link between network namespaces

from _pool import installed, nvml_view_env, pool_server  # noqa: E402

from server.workers import WorkerDevice, start_worker  # noqa: E402
from virtualize.client.remote import fresh_shim, remote_env  # noqa: E402

DEFAULT_TIMEOUT = 240  # seconds for one run (--timeout); a hung NCCL run costs this much
STEP_TIMEOUT = DEFAULT_TIMEOUT
OUT = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
NCCL_ENV = {
    "NCCL_NVLS_ENABLE": "0",  # no NVLink multicast (the lent machines' setting)
    "NCCL_DEBUG": "INFO",
    "NCCL_DEBUG_SUBSYS": "INIT,P2P,NET,SHM",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",  # deterministic cuBLAS (torch.use_deterministic_algorithms)
    "PYTHONUNBUFFERED": "1",
}
SOCKETS_ONLY = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1",
                "NCCL_SOCKET_IFNAME": "lo", "NCCL_NET": "Socket"}  # fmt: skip
results: list[dict] = []


def say(text: str) -> None:
    print(text, flush=True)


def record(check: str, status: str, detail: str = "") -> None:
    results.append({"check": check, "status": status, "detail": detail})
    say(f"--> {status}: {check}" + (f" ({detail})" if detail else ""))


def gpus() -> list[tuple[int, str, int]]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
    return [
        (int(i), u.strip(), int(m)) for i, u, m in (line.split(", ") for line in out.strip().splitlines())
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(program: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
            str(free_port()), program]  # fmt: skip


def log(label: str, rc: int, out: str, err: str, seconds: float) -> None:
    """The run's exit and output here; NCCL's transport lines and, on failure, stderr's tail too."""
    say(f"[{label}] exit {rc} in {seconds:.1f} s")
    for line in out.splitlines()[:40]:
        say(f"[{label}]   {line}")
    links = sorted({line.split("NCCL INFO", 1)[1].strip() for line in err.splitlines()
                    if "NCCL INFO" in line and " via " in line})  # fmt: skip
    for line in links[:6]:
        say(f"[{label} nccl]   {line}")
    if rc != 0 or "gpupool:" in err:
        for line in [x for x in err.splitlines() if "NCCL INFO" not in x][-30:]:
            say(f"[{label} stderr]   {line}")
    if OUT:
        (OUT / "logs").mkdir(parents=True, exist_ok=True)
        (OUT / "logs" / f"{label}.txt").write_text(
            f"exit {rc} in {seconds:.1f} s\n--- stdout\n{out}\n--- stderr\n{err}"
        )


def run(label: str, cmd: list[str], env: dict[str, str], timeout: float | None = None):
    timeout = timeout or STEP_TIMEOUT
    started = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=HERE)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = 124, _text(exc.stdout), _text(exc.stderr) + f"\n(timed out after {timeout} s)"
    result = (rc, out, err, time.monotonic() - started)
    log(label, *result)
    return result


def run_together(label: str, cmds: list[tuple[list[str], dict[str, str]]], timeout: float | None = None):
    """Several processes at once (ranks started by hand, or side-by-side leases): each one's result."""
    timeout = timeout or STEP_TIMEOUT
    started = time.monotonic()
    procs = [subprocess.Popen(c, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=HERE)
             for c, e in cmds]  # fmt: skip
    done = []
    for i, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=max(1.0, timeout - (time.monotonic() - started)))
            rc = p.returncode
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, err = p.communicate()
            rc, err = 124, err + f"\n(timed out after {timeout} s)"
        result = (rc, out, err, time.monotonic() - started)
        log(f"{label}-{i}", *result)
        done.append(result)
    return done


def _text(b) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def values(out: str, key: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith(key + " ")]


def compare_losses(check: str, native, remote, *, runs: str = "remote", limit: str = "") -> None:
    """PASS when the remote run's losses equal the native run's step for step; `limit`: the documented
    limitation a failed remote run meets (recorded as LIMIT with it, not FAIL)."""
    if native[0] != 0:
        record(check, "FAIL", f"native exit {native[0]}")
        return
    if remote[0] != 0:
        why = f"{runs} exit {remote[0]}" + (" (timed out)" if remote[0] == 124 else "")
        record(check, "LIMIT" if limit else "FAIL", f"{why}; {limit}" if limit else why)
        return
    n, r = values(native[1], "loss"), values(remote[1], "loss")
    worst = max(
        (abs(float(a.split()[1]) - float(b.split()[1])) for a, b in zip(n, r, strict=False)), default=0
    )
    same = n == r and len(n) > 0
    detail = f"{len(r)} steps, losses {'identical' if same else f'differ (max {worst:.2e})'}; " \
             f"native {native[3]:.1f} s, {runs} {remote[3]:.1f} s"  # fmt: skip
    record(check, "PASS" if same else "FAIL", detail)


def busbw_table(native, remote, columns: tuple[str, str]) -> list[tuple[int, str, str, float]]:
    """prog_allreduce.py's busbw per size, native and remote runs side by side (printed): rows of (bytes,
    native GB/s, remote GB/s or "-" where the remote run did not get there, remote/native)."""
    nb = dict(v.split() for v in values(native[1], "busbw"))
    rb = dict(v.split() for v in values(remote[1], "busbw"))
    say(f"{'size':>10} {columns[0]:>20} {columns[1]:>20} {'ratio':>8}")
    table = []
    for size in nb:
        ratio = float(rb[size]) / float(nb[size]) if size in rb and float(nb[size]) else 0.0
        table.append((int(size), nb[size], rb.get(size, "-"), ratio))
        say(f"{int(size) >> 20:>7} MiB {nb[size]:>20} {rb.get(size, '-'):>20} {ratio:>8.0%}")
    return table


def nccl_path(debug_dir: Path, client_output: str) -> tuple[str, list[str]]:
    """Where NCCL ran in a --spread run: "workers" when the servers' NCCL wrote its debug files (only the
    servers' environment names NCCL_DEBUG_FILE), "client" when the ranks' own output has NCCL's init
    lines, and the transport lines it printed (`... via NET/Socket/0`)."""
    lines = [ln for f in sorted(debug_dir.glob("*.log")) for ln in f.read_text(errors="replace").splitlines()]
    in_workers = any("Init COMPLETE" in ln or " via " in ln for ln in lines)
    in_client = any(
        "NCCL INFO" in ln and ("Init COMPLETE" in ln or " via " in ln) for ln in client_output.splitlines()
    )
    transports = sorted({ln.split("NCCL INFO", 1)[-1].strip() for ln in lines if " via " in ln})[:6]
    where = (
        "workers"
        if in_workers and not in_client
        else "client"
        if in_client and not in_workers
        else "both"
        if in_workers
        else "none"
    )
    return where, transports


def isolate_step(
    work: Path, env: dict[str, str], native_two: dict[str, str], isolated: dict[str, str]
) -> None:
    """--isolate on one lease of two GPUs: each rank's process gets its own worker process, so whatever NCCL
    shares between the ranks (P2P/CUMEM: memory exported by one worker, imported by the other; IPC events)
    crosses worker processes. DDP must give the native losses and all_reduce must complete at every size."""
    say("\n=== isolate: --isolate, each rank in its own worker process, NCCL in the ranks' processes")
    compare_losses("ddp two ranks, --isolate (a worker process per rank)",
                   run("isolate-ddp-native", torchrun("prog_ddp.py"), native_two),
                   run("isolate-ddp-remote", torchrun("prog_ddp.py"), isolated))  # fmt: skip
    n = run("isolate-allreduce-native", torchrun("prog_allreduce.py"), native_two)
    r = run("isolate-allreduce-remote", torchrun("prog_allreduce.py"), isolated)
    table = busbw_table(n, r, ("native GB/s", "--isolate GB/s"))
    big = table[-1][3] if table else 0.0
    ok = n[0] == 0 and r[0] == 0 and bool(table) and all(row[2] != "-" for row in table)
    record("all_reduce 1 MiB-1 GiB completes with --isolate", "PASS" if ok else "FAIL",
           f"1 GiB: {big:.0%} of native busbw" if table else f"native exit {n[0]}, remote exit {r[0]}")  # fmt: skip
    if OUT and table:
        (OUT / "allreduce_isolate.json").write_text(json.dumps(table))
    if not all(installed()):
        record(
            "gpuattach run -n 2 --isolate, NCCL forwarded", "SKIP", "gpupool-server / gpuattach not installed"
        )
        return
    with pool_server(work / "pool-isolate", env) as attach:
        cmd = attach("1", "--isolate", n=2) + torchrun("prog_ddp.py")
        say("$ GPUPOOL_NCCL=forward " + " ".join(cmd))
        compare_losses("gpuattach run -n 2 --isolate, NCCL forwarded to the two workers",
                       run("isolate-forward-native", torchrun("prog_ddp.py"), native_two),
                       run("isolate-forward-remote", cmd, {**env, "GPUPOOL_NCCL": "forward"}), runs="gpuattach")  # fmt: skip


def spread_step(
    work: Path, env: dict[str, str], native_two: dict[str, str], two, gloo, nccl_bound: float
) -> None:
    """Two real servers, each owning one GPU; one rank on each through `gpuattach run -n 2 --spread`.
    NCCL is forwarded at its API there (libgpupool_nccl.so, preloaded by gpuattach): each rank's NCCL runs in
    its lease's worker, and the workers' NCCL connects server to server. The servers' environment holds NCCL's
    settings (sockets only over loopback, as two hosts would talk; debug lines to files, so the run can say
    which side ran NCCL). Native runs use the same socket transport, so the numbers compare like for like."""
    if importlib.util.find_spec("virtualize.client._libgpupool_nccl") is None:
        record("--spread: NCCL runs in the workers, connected server to server", "FAIL",
               "libgpupool_nccl.so is not built here: python setup.py build_ext --inplace (or pip install -e .)")  # fmt: skip
        return
    debug_dir = work / "nccl-spread"
    debug_dir.mkdir()
    server_env = {**env, **SOCKETS_ONLY, "NCCL_DEBUG_FILE": str(debug_dir / "%h.%p.log")}
    with (
        pool_server(work / "pool-a", {**server_env, "CUDA_VISIBLE_DEVICES": two[0][1]}) as a,
        pool_server(work / "pool-b", {**server_env, "CUDA_VISIBLE_DEVICES": two[1][1]}, token=a.token) as b,
    ):
        spread = [
            installed()[1],
            "run",
            "--server",
            f"{a.url},{b.url}",
            "--token",
            a.token,
            "-n",
            "2",
            "--spread",
            "--",
        ]
        for label, extra, bound in (("gloo", gloo, None), ("nccl-forwarded", SOCKETS_ONLY, nccl_bound)):
            cmd = [*spread, *torchrun("prog_ddp.py")]
            say("$ " + " ".join(cmd))
            n = run(f"spread-{label}-native", torchrun("prog_ddp.py"), {**native_two, **extra})
            r = run(f"spread-{label}-remote", cmd, {**env, **extra}, timeout=bound)
            compare_losses(f"gpuattach run -n 2 --spread (a GPU on each of two servers), DDP over {label}", n, r,
                           runs="gpuattach")  # fmt: skip
        where, transports = nccl_path(debug_dir, r[1] + r[2])
        say(f"NCCL ran in: {where}; transports: {transports}")
        record("--spread: NCCL runs in the workers, connected server to server", "PASS" if where == "workers" else "FAIL",
               f"ran in {where}; {'; '.join(transports) or 'no transport lines'}")  # fmt: skip
        # All-reduce bus bandwidth across the two servers, against native ranks on the same socket transport.
        n = run("spread-allreduce-native", torchrun("prog_allreduce.py"), {**native_two, **SOCKETS_ONLY})
        r = run("spread-allreduce-remote", [*spread, *torchrun("prog_allreduce.py")], {**env, **SOCKETS_ONLY})
        table = busbw_table(n, r, ("native sockets GB/s", "spread GB/s"))
        ok = n[0] == 0 and r[0] == 0 and bool(table) and all(row[2] != "-" for row in table)
        big = table[-1] if table else None
        record("--spread all_reduce busbw, NCCL sockets worker to worker (vs native sockets)", "PASS" if ok else "FAIL",
               f"1 GiB: {big[2]} vs {big[1]} GB/s ({big[3]:.0%})" if big and ok else f"native exit {n[0]}, remote exit {r[0]}")  # fmt: skip
        if OUT:
            (OUT / "allreduce_spread.json").write_text(json.dumps(table))
            shutil.copytree(
                debug_dir, OUT / "logs" / "nccl-spread", dirs_exist_ok=True
            )  # the workers' NCCL lines


def link_step(work: Path, env: dict[str, str], two, nccl_bound: float) -> None:
    """`spread` across a shaped link: server A (GPU 0) in one network namespace, server B (GPU 1) and the
    client in the other, the namespaces joined by a veth pair shaped to 25 Gbit/s each way. The servers
    listen on the link's loopback pair (127.77.0.x, routed over the veth: the data connections stay
    plaintext, as between two hosts of one machine), their workers' NCCL on the veth (NCCL_SOCKET_IFNAME),
    so the ranks' NCCL traffic crosses the link worker to worker. Native: one rank in each namespace on
    the same link and transport."""
    from netem_link import LinkOptions, NetemLink, unavailable

    check = "across a shaped link (two network namespaces), DDP over NCCL forwarded to the workers"
    why = unavailable()
    if why:
        record(check, "SKIP", why)
        return
    with NetemLink(LinkOptions(rate="25gbit", delay="20us")) as link:
        say(f"link: {link.shaping}")
        ns_a, ns_b = link.worker_ns, link.client_ns
        iface = {ns_a: "gpw", ns_b: "gpc"}  # the veth ends' name prefixes (netem_link.NetemLink._veth)
        nccl = {ns: {**SOCKETS_ONLY, "NCCL_SOCKET_IFNAME": iface[ns]} for ns in (ns_a, ns_b)}
        # Native: rank 0 in A's namespace on GPU 0, rank 1 in B's on GPU 1, rendezvous at A's address.
        native = {}
        for program in ("prog_ddp.py", "prog_allreduce.py"):
            port = free_port()
            ranks = [
                ([*link.prefix(ns), sys.executable, program],
                 {**env, **nccl[ns], "RANK": str(i), "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                  "MASTER_ADDR": link.worker_ip, "MASTER_PORT": str(port), "CUDA_VISIBLE_DEVICES": two[i][1]})
                for i, ns in enumerate((ns_a, ns_b))
            ]  # fmt: skip
            native[program] = run_together(f"link-{program[5:-3]}-native", ranks)[0]
        debug_dir = work / "nccl-link"
        debug_dir.mkdir()
        server_env = {
            ns: {**env, **nccl[ns], "NCCL_DEBUG_FILE": str(debug_dir / "%h.%p.log")} for ns in (ns_a, ns_b)
        }
        with (
            pool_server(work / "link-a", {**server_env[ns_a], "CUDA_VISIBLE_DEVICES": two[0][1]},
                        host=link.worker_loopback_ip, prefix=link.prefix(ns_a)) as a,
            pool_server(work / "link-b", {**server_env[ns_b], "CUDA_VISIBLE_DEVICES": two[1][1]}, token=a.token,
                        host=link.client_loopback_ip, prefix=link.prefix(ns_b)) as b,
        ):  # fmt: skip
            spread = [*link.prefix(ns_b), installed()[1], "run", "--server", f"{a.url},{b.url}", "--token", a.token,
                      "-n", "2", "--spread", "--"]  # fmt: skip
            say("$ " + " ".join(spread + torchrun("prog_ddp.py")))
            remote = run(
                "link-ddp-remote",
                spread + torchrun("prog_ddp.py"),
                {**env, **SOCKETS_ONLY},
                timeout=nccl_bound,
            )
            compare_losses(check, native["prog_ddp.py"], remote, runs="gpuattach")
            where, transports = nccl_path(debug_dir, remote[1] + remote[2])
            say(f"NCCL ran in: {where}; transports: {transports}")
            remote = run(
                "link-allreduce-remote", spread + torchrun("prog_allreduce.py"), {**env, **SOCKETS_ONLY}
            )
            n_ar = native["prog_allreduce.py"]
            table = busbw_table(n_ar, remote, ("native across link GB/s", "spread across link GB/s"))
            ok = n_ar[0] == 0 and remote[0] == 0 and bool(table) and all(row[2] != "-" for row in table)
            big = table[-1] if table else None
            record("all_reduce busbw across the shaped link, servers' NCCL worker to worker (vs native ranks)",
                   "PASS" if ok else "FAIL",
                   f"1 GiB: {big[2]} vs {big[1]} GB/s ({big[3]:.0%}); NCCL in {where}" if big and ok
                   else f"native exit {n_ar[0]}, remote exit {remote[0]}")  # fmt: skip
            say("link qdiscs: " + json.dumps(link.qdisc_stats()))
            if OUT:
                (OUT / "allreduce_link.json").write_text(json.dumps(table))
                shutil.copytree(debug_dir, OUT / "logs" / "nccl-link", dirs_exist_ok=True)


def main() -> int:
    global STEP_TIMEOUT
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only",
        nargs="*",
        help="run only these steps (vmm ddp allreduce tp isolate halves gpuattach servers spread link)",
    )
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds for one run (default 240)"
    )
    args = parser.parse_args()
    want = set(args.only or [])
    STEP_TIMEOUT = args.timeout

    def selected(key: str) -> bool:
        return not want or key in want

    if OUT:
        OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpupool-multi-"))
    say(f"python {sys.version.split()[0]}")
    try:
        import torch

        say(
            f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"
        )
    except Exception as exc:  # any reason torch cannot run here ends the run with it
        say(f"torch not usable: {exc}")
        return 1
    try:
        devices = gpus()
    except (OSError, subprocess.SubprocessError) as exc:
        say(f"no GPUs to run on (nvidia-smi: {exc})")
        return 1
    for index, uuid, mib in devices:
        say(f"GPU {index}: {uuid}, {mib} MiB")
    if len(devices) < 2:
        say("needs two GPUs")
        return 1
    shim = fresh_shim(work / "shim")
    say(f"shim: {shim}")
    keep = ("GPUPOOL_SHIM_TRACE", "GPUPOOL_SHIM_PROFILE")  # for looking into a run: the shim's own output
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_") or k in keep}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.update(NCCL_ENV)
    os.environ["PYTHONPATH"] = env["PYTHONPATH"]  # the workers import server/ from this tree
    two = [devices[0][:2], devices[1][:2]]
    whole = [WorkerDevice(i, u, m << 20) for i, u, m in devices[:2]]
    halves = [WorkerDevice(i, u, (m << 20) // 2) for i, u, m in devices[:2]]
    workers = []

    def lease(name: str, devs: list[WorkerDevice]) -> dict[str, str]:
        w = start_worker(name, devs, bind_host="127.0.0.1", env={}, executor="cuda")
        workers.append(w)
        say(
            f"lease {name}: worker pid {w.pid}, GPUs {[d.uuid for d in devs]}, partitions {[d.mem_limit_bytes >> 20 for d in devs]} MiB"
        )
        shim_env = remote_env({"id": name, "worker": w.answer()}, cache_root=work / "cache", library=shim)
        return {**env, **shim_env, **nvml_view_env(name, devs, shim_env, work)}

    native_two = {**env, "CUDA_VISIBLE_DEVICES": ",".join(u for _, u in two)}
    try:
        remote_two = lease("two-gpus", whole)
        if selected("vmm"):
            say("\n=== vmm: prog_vmm_share.py, two processes on two GPUs sharing memory through a descriptor")
            cmd = [sys.executable, "prog_vmm_share.py"]
            n, r = run("vmm-native", cmd, native_two), run("vmm-remote", cmd, remote_two)
            same = n[0] == r[0] == 0 and n[1] == r[1] and "False" not in n[1]
            record("virtual memory shared between two processes of a lease (NCCL's cuMem way)",
                   "PASS" if same else "FAIL", f"exits {n[0]}/{r[0]}" + ("" if n[1] == r[1] else ", outputs differ"))  # fmt: skip
        if selected("ddp"):
            say("\n=== ddp: torchrun --nproc-per-node 2 prog_ddp.py")
            compare_losses("ddp two ranks, one lease of two GPUs", run("ddp-native", torchrun("prog_ddp.py"), native_two),
                           run("ddp-remote", torchrun("prog_ddp.py"), remote_two))  # fmt: skip
        if selected("allreduce"):
            say("\n=== allreduce: bus bandwidth, 1 MiB to 1 GiB")
            n = run("allreduce-native", torchrun("prog_allreduce.py"), native_two)
            r = run("allreduce-remote", torchrun("prog_allreduce.py"), remote_two)
            table = busbw_table(n, r, ("native GB/s", "remote GB/s"))
            big = table[-1][3] if table else 0.0
            ok = n[0] == 0 and r[0] == 0 and all(row[2] != "-" for row in table) and big >= 0.9
            record("all_reduce busbw, 1 GiB remote >= 90 % of native", "PASS" if ok else "FAIL",
                   f"1 GiB: {big:.0%}" if table else f"native exit {n[0]}, remote exit {r[0]}")  # fmt: skip
            if OUT:
                (OUT / "allreduce.json").write_text(json.dumps(table))
        if selected("tp"):
            say("\n=== tp: tensor-parallel MLP forward over two ranks")
            n = run("tp-native", torchrun("prog_tp.py"), native_two)
            r = run("tp-remote", torchrun("prog_tp.py"), remote_two)
            same = n[0] == r[0] == 0 and values(n[1], "out") == values(r[1], "out") and values(n[1], "out")
            record("tensor-parallel forward equals native", "PASS" if same else "FAIL",
                   f"native tp_vs_full {values(n[1], 'tp_vs_full')}, remote {values(r[1], 'tp_vs_full')}; "
                   f"exits {n[0]}/{r[0]}")  # fmt: skip
        if selected("isolate"):
            isolate_step(work, env, native_two, {**remote_two, "GPUPOOL_ISOLATE": "1"})
        if selected("halves"):
            say("\n=== halves: -n 2 -p 0.5, and two leases of half of one GPU side by side")
            compare_losses("ddp on halves of two GPUs (-n 2 -p 0.5)", run("halves-native", torchrun("prog_ddp.py"), native_two),
                           run("halves-remote", torchrun("prog_ddp.py"), lease("halves", halves)))  # fmt: skip
            one = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
            native_one = run("half-native", [sys.executable, "prog_ddp.py"],
                             {**env, **one, "MASTER_PORT": str(free_port()), "CUDA_VISIBLE_DEVICES": two[0][1]})  # fmt: skip
            half = WorkerDevice(two[0][0], two[0][1], (devices[0][2] << 20) // 2)
            pair = run_together("half-remote", [
                ([sys.executable, "prog_ddp.py"], {**lease(f"half-{i}", [half]), **one, "MASTER_PORT": str(free_port())})
                for i in range(2)])  # fmt: skip
            for i, r in enumerate(pair):
                compare_losses(f"half of GPU 0, process {i} beside the other", native_one, r)
        if selected("gpuattach"):
            say("\n=== gpuattach: a real gpupool-server, gpuattach run -n 2 -- torchrun ...")
            if not all(installed()):
                record("gpuattach run -n 2 -- torchrun", "SKIP", "gpupool-server / gpuattach not installed")
            else:
                with pool_server(work / "pool", env) as attach:
                    cmd = attach("1", n=2) + torchrun("prog_ddp.py")
                    say("$ " + " ".join(cmd))
                    n = run("gpuattach-native", torchrun("prog_ddp.py"), native_two)
                    compare_losses("gpuattach run -n 2 -- torchrun (DDP)", n, run("gpuattach-remote", cmd, env),
                                   runs="gpuattach")  # fmt: skip
        # Across servers the ranks' GPUs are in two leases: NCCL cannot share memory between them and
        # falls back to its socket transport, whose kernels poll flags in mapped host memory (see
        # docs/remote.md); gloo goes through host memory instead. Each is tried, NCCL with a short bound.
        gloo = {"DDP_BACKEND": "gloo"}
        nccl_bound = min(STEP_TIMEOUT, 150)
        if selected("servers"):
            say("\n=== servers: one GPU per lease (as two servers each owning one GPU), one rank each")
            for label, extra, bound in (("gloo", gloo, None), ("nccl-sockets", SOCKETS_ONLY, nccl_bound)):
                port = free_port()
                ranks = [{"RANK": str(i), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                          "MASTER_PORT": str(port), **extra} for i in range(2)]  # fmt: skip
                native = run_together(f"servers-{label}-native", [([sys.executable, "prog_ddp.py"],
                                      {**env, **ranks[i], "CUDA_VISIBLE_DEVICES": two[i][1]}) for i in range(2)])  # fmt: skip
                port = free_port()
                remote = run_together(f"servers-{label}-remote", [
                    ([sys.executable, "prog_ddp.py"],
                     {**lease(f"server-{label}-{i}", [whole[i]]), **ranks[i], "MASTER_PORT": str(port)})
                    for i in range(2)], timeout=bound)  # fmt: skip
                # NCCL in the ranks' own processes across two leases: its socket transport polls mapped
                # host memory the worker brings up to date only at calls (docs/remote.md), so it may stop;
                # --spread forwards NCCL to the workers instead (the `spread` step).
                limit = (
                    "NCCL in the program's processes across leases, docs/remote.md" if label != "gloo" else ""
                )
                compare_losses(f"two one-GPU leases, one rank each, DDP over {label}", native[0], remote[0],
                               limit=limit)  # fmt: skip
        if selected("spread"):
            say(
                "\n=== spread: two gpupool-servers, each owning one GPU (CUDA_VISIBLE_DEVICES), gpuattach run -n 2 --spread"
            )
            if not all(installed()):
                record(
                    "gpuattach run -n 2 --spread -- torchrun",
                    "SKIP",
                    "gpupool-server / gpuattach not installed",
                )
            else:
                spread_step(work, env, native_two, two, gloo, nccl_bound)
        if selected("link"):
            say(
                "\n=== link: the spread run with each server in its own network namespace, a 25 Gbit/s link between"
            )
            if not all(installed()):
                record("across a shaped link", "SKIP", "gpupool-server / gpuattach not installed")
            else:
                link_step(work, env, two, nccl_bound)
    finally:
        for w in workers:
            w.stop()
    say("\n=== summary")
    width = max(len(r["check"]) for r in results) if results else 10
    lines = [f"| {'check':<{width}} | result | detail |", f"| {'-' * width} | --- | --- |"]
    lines += [f"| {r['check']:<{width}} | {r['status']} | {r['detail']} |" for r in results]
    say("\n".join(lines))
    if OUT:
        (OUT / "multi_results.md").write_text("\n".join(lines) + "\n")
        (OUT / "multi_results.json").write_text(json.dumps(results, indent=1))
    return 1 if any(r["status"] == "FAIL" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
