"""Remote execution, client side: the environment that sends a program's CUDA calls to its lease.

`gpuattach run` (without --local) starts the command with `remote_env(lease_answer)` added to its
environment: gpupool's own `libcuda.so.1` first on LD_LIBRARY_PATH, and the worker's address and
secret for it to connect to. See docs/remote.md.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

from virtualize import _wire

SHIM_MODULE = "virtualize._libcuda_shim"


class ShimNotBuilt(RuntimeError):
    """gpupool's libcuda.so.1 was not compiled with this installation."""

    def __init__(self) -> None:
        super().__init__(
            "gpupool's libcuda.so.1 is not built: reinstall with a C compiler present "
            "(pip install -e . or pip install .; on Debian/Ubuntu: apt-get install gcc)"
        )


def shim_library_path() -> Path:
    """The compiled shim (an extension module file; it is a plain shared library)."""
    spec = importlib.util.find_spec(SHIM_MODULE)
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        raise ShimNotBuilt()
    return Path(spec.origin)


SHIM_SOURCES = Path(__file__).parent / "shim"
# setup.py lists the same
SHIM_C_SOURCES = (
    "shim.c",
    "shim_calls.c",
    "shim_exports.c",
    "shim_memo.c",
    "shim_auth.c",
    "shim_managed.c",
    "shim_pools.c",
)
COMPILE_FLAGS = [
    "-O2",
    "-shared",
    "-fPIC",
    "-fvisibility=hidden",
    "-pthread",
    "-std=gnu11",
    "-Wl,-soname,libcuda.so.1",
]
LINK_LIBRARIES = ["-ldl"]  # libcrypto is loaded at the first connection (shim_auth.c)


def compile_shim(dest_dir: Path, *, compiler: str | None = None, extra_flags: tuple[str, ...] = ()) -> Path:
    """Compile the shim from its C sources into `dest_dir/libcuda.so.1` without pip (GPU hosts, tests)."""
    cc = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise ShimNotBuilt()
    dest_dir.mkdir(parents=True, exist_ok=True)
    out = dest_dir / "libcuda.so.1"
    sources = [str(SHIM_SOURCES / name) for name in SHIM_C_SOURCES]
    subprocess.run(
        [cc, *COMPILE_FLAGS, *extra_flags, "-o", str(out), *sources, *LINK_LIBRARIES], check=True, timeout=300
    )
    link = dest_dir / "libcuda.so"
    if not link.is_symlink():
        link.symlink_to("libcuda.so.1")
    return out


def fresh_shim(dest_dir: Path) -> Path:
    """The shim for test and benchmark runs: compiled from this tree's sources when a compiler is
    here, else the installed build, else any `_libcuda_shim*.so` beside the sources (carried in)."""
    try:
        return compile_shim(dest_dir)
    except (ShimNotBuilt, subprocess.CalledProcessError, OSError):
        pass
    try:
        return shim_library_path()
    except ShimNotBuilt:
        built = sorted(Path(__file__).parent.glob("_libcuda_shim*.so"))
        if built:
            return built[0]
        raise


def shim_dir(cache_root: Path | None = None, *, library: Path | None = None) -> Path:
    """A per-user directory holding `libcuda.so.1` -> the shim (what LD_LIBRARY_PATH names first)."""
    library = library or shim_library_path()
    root = cache_root or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    tag = hashlib.sha256(str(library).encode()).hexdigest()[:12]
    directory = root / "gpupool" / f"shim-{tag}"
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("libcuda.so.1", "libcuda.so"):
        link = directory / name
        if link.is_symlink() and os.readlink(link) == str(library):
            continue
        tmp = directory / f".{name}.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(library)
        tmp.replace(link)  # atomic: a program starting meanwhile sees the old link or the new one
    return directory


def remote_env(
    lease_answer: dict, *, cache_root: Path | None = None, library: Path | None = None
) -> dict[str, str]:
    """Environment variables that make a child process's CUDA calls run on the lease's worker.

    `lease_answer` is the pool server's answer for a lease created with remote=true; its "worker"
    holds host, port, secret, the fingerprint of the worker's certificate and its local socket's name. `library` overrides the installed shim (e.g. from `compile_shim`).
    """
    worker = lease_answer.get("worker")
    if not worker:
        raise ValueError("the lease has no worker: it was not created for remote execution (remote=true)")
    directory = shim_dir(cache_root, library=library)
    host = str(worker["host"])
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    old = os.environ.get("LD_LIBRARY_PATH", "")
    env = {
        "LD_LIBRARY_PATH": f"{directory}:{old}" if old else str(directory),
        _wire.ENV_WORKER: f"{host}:{int(worker['port'])}",
        _wire.ENV_SECRET: str(worker["secret"]),
        # numba-cuda's ctypes binding opens the driver by path when told to.
        "NUMBA_CUDA_DRIVER": str(directory / "libcuda.so.1"),
    }
    if worker.get("tls_sha256"):
        env[_wire.ENV_TLS] = str(worker["tls_sha256"])
    if worker.get("local"):
        env[_wire.ENV_LOCAL] = str(worker["local"])
    lease_id = lease_answer.get("id") or lease_answer.get("lease_id")
    if lease_id:
        env[_wire.ENV_LEASE] = str(lease_id)
    return env


def spread_env(
    lease_answers: list[dict], *, cache_root: Path | None = None, library: Path | None = None
) -> dict[str, str]:
    """The environment of a run spread over several one-GPU leases (`gpuattach run --spread`): each
    lease's variables with the suffix `_r` for rank r, lease 0's also without one (for processes that are
    no rank, such as a launcher), and how many there are. The shim picks by the process's LOCAL_RANK."""
    env = remote_env(lease_answers[0], cache_root=cache_root, library=library)
    for rank, answer in enumerate(lease_answers):
        own = remote_env(answer, cache_root=cache_root, library=library)
        env.update({f"{name}_{rank}": own[name] for name in _wire.LEASE_ENV if name in own})
    env[_wire.ENV_RANKS] = str(len(lease_answers))
    return env
