"""Remote execution, client side: the environment that sends a program's CUDA calls to its lease.

`gpuattach run` (without --local) starts the command with `remote_env(lease_answer)` added to its
environment: gpupool's own `libcuda.so.1` first on LD_LIBRARY_PATH, and the worker's address and
secret for it to connect to. Remote and --local runs alike get `nvml_env(view)`: gpupool's own
`libnvidia-ml.so.1`, which answers NVML from the lease's view (virtualize.client._nvml_view). See docs/remote.md.
"""

from __future__ import annotations

import hashlib
import importlib.util
import mmap
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from virtualize.client._nvml_view import VIEW_ENV
from virtualize.common import _wire
from virtualize.common.errors import VirtualizeError

if TYPE_CHECKING:
    from server.api import Lease

SHIM_MODULE = "virtualize.client._libcuda_shim"
NVML_MODULE = "virtualize.client._libnvml_shim"
LOCAL_CUDA_MODULE = "virtualize.client._liblocalcuda"
NCCL_MODULE = "virtualize.client._libgpupool_nccl"  # NCCL at its API (virtualize/client/nccl/nccl_forward.c)
# Whether a run's NCCL calls go to the lease's worker (libgpupool_nccl.so preloaded): "forward" or "off";
# unset: forwarded in `gpuattach run --spread` runs only.
ENV_NCCL = "GPUPOOL_NCCL"
NCCL_CHOICES = ("forward", "off")
# What the --local interposer reads (virtualize/client/localcuda/local_cuda.c)
ENV_REAL_LIBCUDA = "GPUPOOL_REAL_LIBCUDA"
ENV_PARTITION_BYTES = "GPUPOOL_PARTITION_BYTES"


class ShimNotBuilt(VirtualizeError):
    """gpupool's libcuda.so.1 was not compiled with this installation."""

    def __init__(self) -> None:
        super().__init__(
            "gpupool's libcuda.so.1 is not built",
            "reinstall with a C compiler present (pip install -e . or pip install .; on Debian/Ubuntu: "
            "apt-get install gcc)",
        )


def shim_library_path(module: str = SHIM_MODULE) -> Path:
    """The compiled shim (an extension module file; it is a plain shared library)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        raise ShimNotBuilt()
    return Path(spec.origin)


SHIM_SOURCES = Path(__file__).parent / "shim"  # every C file there is the shim's (setup.py builds the same)
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
    sources = sorted(str(path) for path in SHIM_SOURCES.glob("*.c"))
    subprocess.run(
        [cc, *COMPILE_FLAGS, *extra_flags, "-o", str(out), *sources, *LINK_LIBRARIES], check=True, timeout=300
    )
    link = dest_dir / "libcuda.so"
    if not link.is_symlink():
        link.symlink_to("libcuda.so.1")
    return out


NVML_SOURCE = Path(__file__).parent / "nvml" / "nvml_shim.c"  # setup.py builds the same
LOCAL_CUDA_SOURCE = Path(__file__).parent / "localcuda" / "local_cuda.c"  # setup.py builds the same
NCCL_SOURCE = Path(__file__).parent / "nccl" / "nccl_forward.c"  # setup.py builds the same


def _compile_one(dest_dir: Path, source: Path, soname: str, compiler: str | None) -> Path:
    cc = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise ShimNotBuilt()
    dest_dir.mkdir(parents=True, exist_ok=True)
    out = dest_dir / soname
    flags = [f for f in COMPILE_FLAGS if not f.startswith("-Wl,-soname")] + [f"-Wl,-soname,{soname}"]
    subprocess.run([cc, *flags, "-o", str(out), str(source), *LINK_LIBRARIES], check=True, timeout=300)
    return out


def compile_nvml(dest_dir: Path, *, compiler: str | None = None) -> Path:
    """Compile the NVML shim into `dest_dir/libnvidia-ml.so.1` without pip (GPU hosts, tests)."""
    return _compile_one(dest_dir, NVML_SOURCE, "libnvidia-ml.so.1", compiler)


def compile_local_cuda(dest_dir: Path, *, compiler: str | None = None) -> Path:
    """Compile the --local interposer into `dest_dir/libcuda.so.1` without pip (GPU hosts, tests)."""
    return _compile_one(dest_dir, LOCAL_CUDA_SOURCE, "libcuda.so.1", compiler)


def compile_nccl_forward(dest_dir: Path, *, compiler: str | None = None) -> Path:
    """Compile libgpupool_nccl.so (NCCL forwarded at its API) into `dest_dir` without pip (GPU hosts, tests)."""
    return _compile_one(dest_dir, NCCL_SOURCE, "libgpupool_nccl.so", compiler)


def fresh_nccl_forward(dest_dir: Path) -> Path:
    """libgpupool_nccl.so for test runs: compiled from this tree when a compiler is here, else the installed build."""
    try:
        return compile_nccl_forward(dest_dir)
    except (ShimNotBuilt, subprocess.CalledProcessError, OSError):
        return shim_library_path(NCCL_MODULE)


def nccl_env(base_env: dict[str, str], *, spread: bool, library: Path | None = None) -> dict[str, str]:
    """What makes the command's NCCL run on its lease's worker: libgpupool_nccl.so first on LD_PRELOAD (it
    defines every NCCL name, so it wins over any libnccl the program loads). On for --spread runs
    (`spread`), or where GPUPOOL_NCCL=forward; GPUPOOL_NCCL=off keeps the program's own NCCL. Raises
    ValueError for another GPUPOOL_NCCL, ShimNotBuilt where the library is not built."""
    choice = base_env.get(ENV_NCCL, "").strip().lower()
    if choice and choice not in NCCL_CHOICES:
        raise ValueError(f"{ENV_NCCL}={base_env[ENV_NCCL]!r} is not one of {', '.join(NCCL_CHOICES)}")
    if choice == "off" or (not spread and choice != "forward"):
        return {}
    library = library or shim_library_path(NCCL_MODULE)
    old = base_env.get("LD_PRELOAD", "")
    kept = " ".join(p for p in old.replace(":", " ").split() if Path(p).name != library.name)
    return {"LD_PRELOAD": f"{library} {kept}".strip(), ENV_NCCL: "forward"}


def fresh_nvml(dest_dir: Path) -> Path:
    """The NVML shim for test runs: compiled from this tree when a compiler is here, else the installed build."""
    try:
        return compile_nvml(dest_dir)
    except (ShimNotBuilt, subprocess.CalledProcessError, OSError):
        return shim_library_path(NVML_MODULE)


def _built_from_sources(cc: str) -> Path:
    """The shim compiled from this tree's sources, kept per user under a digest of the sources, the
    headers and the compiler: a suites run or a benchmark starts a worker and a shim many times (each
    compile is about 14 s of CPU), and a changed source file builds anew."""
    digest = hashlib.sha256("\0".join([cc, *COMPILE_FLAGS, *LINK_LIBRARIES]).encode())
    headers = SHIM_SOURCES.parent.parent / "common" / "include"
    for path in sorted([*SHIM_SOURCES.glob("*.[ch]"), *headers.glob("*.h")]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpupool"
    built = root / f"built-shim-{digest.hexdigest()[:16]}" / "libcuda.so.1"
    if not built.exists():
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".built-shim-", dir=root))
        try:
            compile_shim(tmp, compiler=cc)
            try:
                tmp.rename(built.parent)  # atomic: another run building the same meanwhile keeps its own
            except OSError:
                if not built.exists():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return built


def fresh_shim(dest_dir: Path) -> Path:
    """The shim for test and benchmark runs: compiled from this tree's sources when a compiler is
    here (once per change of the sources), else the installed build, else any `_libcuda_shim*.so`
    beside the sources (carried in)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    try:
        if not cc:
            raise ShimNotBuilt()
        try:
            built = _built_from_sources(cc)
        except OSError:  # no cache to keep it in (a read-only home): compiled for this run alone
            return compile_shim(dest_dir, compiler=cc)
        dest_dir.mkdir(parents=True, exist_ok=True)
        out = dest_dir / "libcuda.so.1"
        shutil.copyfile(built, out)
        link = dest_dir / "libcuda.so"
        if not link.is_symlink():
            link.symlink_to("libcuda.so.1")
        return out
    except (ShimNotBuilt, subprocess.CalledProcessError, OSError):
        pass
    try:
        return shim_library_path()
    except ShimNotBuilt:
        built = sorted(Path(__file__).parent.glob("_libcuda_shim*.so"))
        if built:
            return built[0]
        raise


def shim_dir(
    cache_root: Path | None = None,
    *,
    library: Path | None = None,
    kind: str = "shim",
    names: tuple[str, ...] = ("libcuda.so.1", "libcuda.so"),
) -> Path:
    """A per-user directory holding `libcuda.so.1` -> the shim (what LD_LIBRARY_PATH names first);
    with kind="nvml" and the NVML shim's names, one holding only `libnvidia-ml.so.1` (--local runs
    keep the real driver and take only gpupool's NVML)."""
    library = library or shim_library_path()
    root = cache_root or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    tag = hashlib.sha256(str(library).encode()).hexdigest()[:12]
    directory = root / "gpupool" / f"{kind}-{tag}"
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        link = directory / name
        if link.is_symlink() and os.readlink(link) == str(library):
            continue
        tmp = directory / f".{name}.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(library)
        tmp.replace(link)  # atomic: a program starting meanwhile sees the old link or the new one
    return directory


def remote_env(
    lease_answer: Lease | dict, *, cache_root: Path | None = None, library: Path | None = None
) -> dict[str, str]:
    """Environment variables that make a child process's CUDA calls run on the lease's worker.

    `lease_answer` is the pool server's answer for a lease created with remote=true (a ``server.api.Lease``,
    or its JSON as a dict); its "worker" holds host, port, secret, the fingerprint of the worker's
    certificate and its local socket's name. `library` overrides the installed shim (e.g. from `compile_shim`).
    """
    import msgspec

    from server.api import Lease, Worker

    if isinstance(lease_answer, Lease):
        worker, lease_id = lease_answer.worker, lease_answer.id
    else:
        found = lease_answer.get("worker")
        worker = msgspec.convert(found, Worker) if found else None
        lease_id = lease_answer.get("id") or lease_answer.get("lease_id")
    if not worker:
        raise ValueError("the lease has no worker: it was not created for remote execution (remote=true)")
    directory = shim_dir(cache_root, library=library)
    host = worker.host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    old = os.environ.get("LD_LIBRARY_PATH", "")
    env = {
        "LD_LIBRARY_PATH": f"{directory}:{old}" if old else str(directory),
        _wire.ENV_WORKER: f"{host}:{worker.port}",
        _wire.ENV_SECRET: worker.secret,
        # numba-cuda's ctypes binding opens the driver by path when told to.
        "NUMBA_CUDA_DRIVER": str(directory / "libcuda.so.1"),
    }
    if worker.tls_sha256:
        env[_wire.ENV_TLS] = worker.tls_sha256
    if worker.local:
        env[_wire.ENV_LOCAL] = worker.local
    if worker.lacks:
        env[_wire.ENV_LACKS] = ",".join(worker.lacks)
    if lease_id:
        env[_wire.ENV_LEASE] = str(lease_id)
    return env


def nvml_env(
    view: Path, base_env: dict[str, str], *, cache_root: Path | None = None, library: Path | None = None
) -> dict[str, str]:
    """Environment variables that make a child process's NVML (nvidia-smi, pynvml, nvitop, gpustat)
    answer from the lease's view file `view`: gpupool's libnvidia-ml.so.1 first on the library path
    given in `base_env`. Raises ShimNotBuilt where the NVML shim was not compiled."""
    library = library or shim_library_path(NVML_MODULE)
    directory = shim_dir(
        cache_root, library=library, kind="nvml", names=("libnvidia-ml.so.1", "libnvidia-ml.so")
    )
    old = base_env.get("LD_LIBRARY_PATH", "")
    return {
        "LD_LIBRARY_PATH": f"{directory}:{old}" if old else str(directory),
        VIEW_ENV: str(view),
    }


def local_cuda_env(
    lease_answer: Lease,
    base_env: dict[str, str],
    *,
    real: Path,
    cache_root: Path | None = None,
    library: Path | None = None,
) -> dict[str, str]:
    """Environment variables that make a --local run's CUDA see the lease's memory size: gpupool's
    interposer (virtualize/client/localcuda/local_cuda.c) first on the library path given in `base_env`,
    forwarding every driver call to this host's real driver `real` and answering cuMemGetInfo /
    cuDeviceTotalMem with each partition's size (device ordinals in partition order, as the lease's
    CUDA_VISIBLE_DEVICES numbers them). Raises ShimNotBuilt where the interposer was not compiled."""
    library = library or shim_library_path(LOCAL_CUDA_MODULE)
    directory = shim_dir(cache_root, library=library, kind="localcuda")
    old = base_env.get("LD_LIBRARY_PATH", "")
    return {
        "LD_LIBRARY_PATH": f"{directory}:{old}" if old else str(directory),
        ENV_REAL_LIBCUDA: str(real),
        ENV_PARTITION_BYTES: ",".join(str(int(p.mem_bytes)) for p in lease_answer.partitions),
        "NUMBA_CUDA_DRIVER": str(directory / "libcuda.so.1"),
    }


# Where drivers put libnvidia-ml.so.1 and libcuda.so.1 when ldconfig does not say (containers often
# have no cache).
HOST_DRIVER_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/usr/local/nvidia/lib",
)


def host_nvml(env: dict[str, str]) -> Path | None:
    """This GPU host's own libnvidia-ml.so.1 (the driver's), for --local runs: gpupool's NVML answers
    the lease's numbers and hands every other query to it. None where there is none."""
    return _host_library(env, "libnvidia-ml.so.1", b"gpupoolNvmlLease")


def host_libcuda(env: dict[str, str]) -> Path | None:
    """This GPU host's own libcuda.so.1 (the driver's, never gpupool's shim or interposer), for the
    --local interposer to forward to. None where there is none."""
    for path in _host_candidates(env, "libcuda.so.1"):
        if not _exports_marker(path, b"gpupoolLocalCuda") and not _exports_marker(
            path, _wire.ENV_WORKER.encode()
        ):
            return path
    return None


def _host_library(env: dict[str, str], name: str, marker: bytes) -> Path | None:
    return next((p for p in _host_candidates(env, name) if not _exports_marker(p, marker)), None)


def _host_candidates(env: dict[str, str], name: str) -> list[Path]:
    candidates = []
    try:
        listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
        candidates += [line.rsplit("=> ", 1)[1] for line in listing.splitlines() if f"{name} (" in line]
    except (OSError, subprocess.SubprocessError):
        pass
    dirs = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d] + list(HOST_DRIVER_DIRS)
    candidates += [os.path.join(d, name) for d in dirs]
    return [Path(c.strip()) for c in candidates if Path(c.strip()).is_file()]


def _exports_marker(path: Path, marker: bytes) -> bool:
    """gpupool's own libraries carry a marker the driver's do not: gpupoolNvmlLease in its NVML,
    gpupoolLocalCuda in the --local interposer, the worker's address variable in the remote shim."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return data.find(marker) >= 0
    except (OSError, ValueError):  # unreadable, or empty
        return False


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
