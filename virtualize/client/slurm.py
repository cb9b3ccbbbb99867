"""gpupool-slurm: a Slurm job's pooled GPUs, leased for the job's lifetime (Prolog, TaskProlog, Epilog).

    gpupool-slurm prolog     on the job's node, as root, before any task starts: takes the lease
    gpupool-slurm epilog     on the job's node, as root, when the job ends however it ends: releases it

Slurm runs them through ``deploy/slurm/gpupool-slurm-hook``, named as Prolog, Epilog and TaskProlog in
slurm.conf; the job asks with ``--gpupool=N[xP][:local]`` (deploy/slurm/gpupool_spank.c), which Slurm
hands to the Prolog and Epilog as ``$SPANK_GPUPOOL``. Both read the job from Slurm's environment
(``SLURM_JOB_ID``, ``SLURM_JOB_ACCOUNT``, ``SLURM_JOB_USER``, ``SLURM_JOB_UID``, ``SLURM_CLUSTER_NAME``),
so they can be driven by hand where Slurm is not installed: set those variables and run them.

The Prolog never fails the node (a failing Prolog drains it in Slurm): when the pool refuses or cannot
be reached, it writes the pool's one-line message where the TaskProlog finds it, and the TaskProlog
prints it into the job's output and fails the job's tasks. What it writes, in ``$GPUPOOL_SLURM_DIR``
(default /run/gpupool-slurm):

    JOB.task    the TaskProlog's lines for the job's tasks (``export NAME=VALUE``, ``print ...``), owned
                by the job's user, mode 0600: remote leases carry the worker's secret
    JOB.failed  instead of JOB.task when there is no lease: ``print gpupool: error: ...``
    JOB.lease   (root only) the lease and its keeper, for the Epilog
    JOB.pids    (local leases) the tasks' pids, which the hook appends and the keeper registers with the
                lease: idle detection and the server's restart clean-up see the job's processes

See docs/schedulers.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from server import ranges
from virtualize.common.errors import VirtualizeError

DEFAULT_DIR = "/run/gpupool-slurm"
DEFAULT_CONFIG = "/etc/gpupool/client.toml"
if TYPE_CHECKING:
    from server.api import Lease

SPEC = re.compile(r"(?P<n>\d+)(?:x(?P<p>\d*\.?\d+))?(?P<local>:local)?")


class JobError(VirtualizeError):
    """Why the job gets no lease: one line for the job's output, and what to do."""


def parse_spec(text: str) -> tuple[int, float, bool]:
    """``N[xP][:local]`` as (n, fraction, local), checked against the pool's ranges."""
    m = SPEC.fullmatch(text.strip())
    if not m:
        raise JobError(f"--gpupool={text} is not N[xP][:local]", "e.g. --gpupool=1x0.5: one GPU, half of it")
    n, fraction = int(m["n"]), float(m["p"]) if m["p"] else 1.0
    for name, value in (("n", n), ("fraction", fraction)):
        if why := ranges.problem(ranges.REQUEST, name, value):
            raise JobError(f"--gpupool={text}: {why}", "see the ranges in docs/pool.md (Ranges)")
    return n, fraction, bool(m["local"])


def _job() -> dict[str, str]:
    env = os.environ
    if not env.get("SLURM_JOB_ID", "").isdigit():
        raise JobError("SLURM_JOB_ID is not set to a job id", "Slurm sets it for its Prolog and Epilog")
    cluster = env.get("SLURM_CLUSTER_NAME")
    job = {"scheduler": f"slurm/{cluster}" if cluster else "slurm", "id": env["SLURM_JOB_ID"],
           "account": env.get("SLURM_JOB_ACCOUNT"), "user": env.get("SLURM_JOB_USER")}  # fmt: skip
    return {k: v for k, v in job.items() if v}


def _folder() -> Path:
    folder = Path(os.environ.get("GPUPOOL_SLURM_DIR") or DEFAULT_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o711)  # the job's user reads its own JOB.task by name, lists nothing
    return folder


def _write(path: Path, text: str, *, owner: bool) -> None:
    """Written whole (a temporary name, then renamed), mode 0600, owned by the job's user if ``owner``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    uid, gid = os.environ.get("SLURM_JOB_UID"), os.environ.get("SLURM_JOB_GID")
    if owner and uid and uid.isdigit() and os.geteuid() == 0:
        os.chown(tmp, int(uid), int(gid) if gid and gid.isdigit() else -1)
    tmp.replace(path)


def _client():
    from server.client import PoolClient
    from server.client_config import load

    return PoolClient(load(os.environ.get("GPUPOOL_CONFIG") or DEFAULT_CONFIG))


def _log(msg: str) -> None:  # Slurm keeps a Prolog's and an Epilog's stderr in slurmd's log
    print(f"gpupool-slurm: {msg}", file=sys.stderr, flush=True)


def _task_lines(lease: Lease, env: dict[str, str], job_id: str, shim: str | None) -> str:
    """TaskProlog lines; ``prepend LD_LIBRARY_PATH=DIR`` is the hook's: DIR goes before the task's own
    LD_LIBRARY_PATH, which only the TaskProlog sees."""
    parts = ", ".join(f"GPU{p.gpu_index} {p.fraction:g}" for p in lease.partitions)
    kind = "local partition" if lease.local else "remote"
    sim = " (SIMULATED GPUs)" if lease.simulated else ""
    lines = [f"print gpupool: job {job_id}: {kind} lease {lease.id} on {lease.server.hostname}{sim}: {parts}"]
    lines += [f"export {k}={v}" for k, v in sorted(env.items())]
    if shim:
        lines.append(f"prepend LD_LIBRARY_PATH={shim}")
    return "\n".join(lines) + "\n"


def prolog() -> int:
    spec = os.environ.get("SPANK_GPUPOOL")
    if not spec:
        return 0  # the job did not ask for pooled GPUs
    try:
        job = _job()
    except JobError as exc:
        _log(f"error: {exc.title}")
        return 0
    folder = _folder()
    jid = job["id"]
    try:
        lease_line, lease_state = _take_lease(spec, job, folder)
    except Exception as exc:  # anything, a bug included: the job fails with it, the node is not drained
        if not isinstance(exc, JobError):
            exc = JobError(
                f"gpupool-slurm failed: {type(exc).__name__}: {exc}", "see slurmd's log; report it"
            )
        hint = f" (hint: {exc.hint})" if exc.hint else ""
        _log(f"job {jid}: no lease: {exc.title}{hint}")
        (folder / f"{jid}.task").unlink(missing_ok=True)
        _write(folder / f"{jid}.failed", f"print gpupool: error: {exc.title}{hint}\n", owner=True)
        return 0
    _write(folder / f"{jid}.lease", json.dumps(lease_state) + "\n", owner=False)
    (folder / f"{jid}.failed").unlink(missing_ok=True)
    _write(folder / f"{jid}.task", lease_line, owner=True)
    _log(f"job {jid}: lease {lease_state['lease_id']} on {lease_state['server']}")
    return 0


def _take_lease(spec: str, job: dict[str, str], folder: Path) -> tuple[str, dict]:
    from server.api import Job
    from server.client import LeaseRequest, PoolClientError
    from server.client_config import wait_setting
    from virtualize.client._session import on_this_host, start_keeper

    n, fraction, local = parse_spec(spec)
    try:
        client = _client()
        timeout = os.environ.get("GPUPOOL_SLURM_TIMEOUT")
        timeout_s = wait_setting(timeout, "GPUPOOL_SLURM_TIMEOUT") if timeout else client.cfg.timeout_s
        req = LeaseRequest(n=n, fraction=fraction, local=local, remote=not local,
                           label=f"slurm job {job['id']}", job=Job(**job))  # fmt: skip
        server, lease = client.acquire(
            req,
            timeout_s=timeout_s,
            accept=on_this_host if local else None,
            on_wait=lambda msg: _log(f"job {job['id']}: {msg}"),
        )
    except PoolClientError as exc:
        raise JobError(exc.title, exc.hint) from None
    shim = None
    try:
        if local:
            env = dict(lease.env or {})
        else:
            from virtualize.client.remote import remote_env

            library = os.environ.get("GPUPOOL_SHIM_LIBRARY")  # a shim built apart from this installation
            env = remote_env(lease, cache_root=folder, library=Path(library) if library else None)
            shim = env.pop("LD_LIBRARY_PATH").split(":")[0]
        pids = None
        if local:  # the tasks write their pids here (the hook), the keeper registers them with the lease
            pids = folder / f"{job['id']}.pids"
            _write(pids, "", owner=True)
        keeper = start_keeper(client, server, lease, log_dir=folder, pids_file=pids)
    except Exception as exc:  # the shim is not built, ...: the lease goes back, the job gets the reason
        with contextlib.suppress(Exception):
            client.release(server, lease.id)
        raise JobError(f"cannot set up lease {lease.id}: {exc}", "see docs/remote.md") from None
    state = {"lease_id": lease.id, "server": server.url, "keeper_pid": keeper}
    return _task_lines(lease, env, job["id"], shim), state


def epilog() -> int:
    try:
        jid = _job()["id"]
    except JobError as exc:
        _log(f"error: {exc.title}")
        return 0
    folder = Path(os.environ.get("GPUPOOL_SLURM_DIR") or DEFAULT_DIR)
    state_file = folder / f"{jid}.lease"
    for name in (f"{jid}.task", f"{jid}.failed", f"{jid}.pids"):
        (folder / name).unlink(missing_ok=True)
    try:
        state = json.loads(state_file.read_text())
    except FileNotFoundError:
        return 0  # no lease was taken for this job
    except (OSError, ValueError) as exc:
        _log(f"job {jid}: cannot read {state_file}: {exc}")
        return 0
    _stop_keeper(state)
    try:
        client = _client()
        server, _ = client.find_lease(state["lease_id"])
        lease = client.release(server, state["lease_id"])
        _log(f"job {jid}: lease {state['lease_id']} {lease.state}")
    except Exception as exc:  # its keeper is stopped: the lease expires one TTL later at most
        _log(f"job {jid}: could not release {state['lease_id']} ({getattr(exc, 'title', exc)}); it expires "
             "one TTL after its last heartbeat")  # fmt: skip
    state_file.unlink(missing_ok=True)
    return 0


def _stop_keeper(state: dict) -> None:
    """SIGTERM to the lease's keeper, if that pid still is it (a pid can be reused)."""
    pid = int(state.get("keeper_pid") or 0)
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return
    if state["lease_id"].encode() in cmdline:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="gpupool-slurm",
        description="Slurm's Prolog and Epilog for gpupool: a job's --gpupool=N[xP][:local] GPUs leased for its "
        "lifetime (see docs/schedulers.md). Reads the job from SLURM_JOB_ID, SPANK_GPUPOOL, SLURM_JOB_ACCOUNT, "
        "SLURM_JOB_USER, SLURM_JOB_UID; the pool from $GPUPOOL_CONFIG (default /etc/gpupool/client.toml); "
        "writes to $GPUPOOL_SLURM_DIR (default /run/gpupool-slurm). Always exits 0 for a job's own problems "
        "(a failing Prolog would drain the node): they reach the job's output through the TaskProlog.",
    )
    ap.add_argument("step", choices=("prolog", "epilog"), help="prolog: take the lease; epilog: release it")
    args = ap.parse_args(argv)
    try:
        return prolog() if args.step == "prolog" else epilog()
    except Exception as exc:  # e.g. GPUPOOL_SLURM_DIR cannot be made: a non-zero exit would drain the node
        _log(f"error: {args.step} of job {os.environ.get('SLURM_JOB_ID')}: {type(exc).__name__}: {exc}")
        return 0


if __name__ == "__main__":
    sys.exit(main())
