"""CUDA MPS for partition enforcement: start (or join) the host's MPS control daemon.

One daemon serves all GPUs of the server, not one per GPU: a CUDA process connects to exactly one
MPS pipe directory, so per-GPU daemons would make multi-GPU leases impossible. Each lease process
then gets ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (its partition's memory per device) and, when asked,
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (its SM share). The pipe and log directories live under the
server's state directory unless ``mps_pipe_dir`` names a running daemon to join.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

from server._errors import PoolError

log = logging.getLogger("gpupool.server")


class MpsError(PoolError):
    status, code = 500, "mps"


class MpsDaemon:
    def __init__(self, state_dir: Path, gpu_uuids: list[str], join_pipe_dir: Path | None = None):
        self.pipe_dir = Path(join_pipe_dir) if join_pipe_dir else state_dir / "mps" / "pipe"
        self.log_dir = state_dir / "mps" / "log"  # used only when we start the daemon ourselves
        self.gpu_uuids = gpu_uuids
        self.started_here = False

    def client_env(self) -> dict[str, str]:
        # Clients need only the pipe; the log directory matters to the daemon (set when we start it).
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir)}

    def _running(self) -> bool:
        return (self.pipe_dir / "control").exists() and self._control(
            "get_server_list", timeout=5
        ) is not None

    def _control(self, command: str, timeout: float = 10) -> str | None:
        try:
            out = subprocess.run(
                ["nvidia-cuda-mps-control"], input=command + "\n", capture_output=True, text=True,
                env={**os.environ, **self.client_env()}, timeout=timeout, check=False,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout if out.returncode == 0 else None

    def start(self) -> None:
        if shutil.which("nvidia-cuda-mps-control") is None:
            raise MpsError(
                "--mps: nvidia-cuda-mps-control not found",
                "install the NVIDIA driver utilities or drop --mps",
            )
        if self._running():
            log.info("MPS: joined the control daemon at %s", self.pipe_dir)
            return
        self.pipe_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.client_env(), "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir),
               "CUDA_VISIBLE_DEVICES": ",".join(self.gpu_uuids)}  # fmt: skip
        res = subprocess.run(
            ["nvidia-cuda-mps-control", "-d"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if res.returncode != 0:
            raise MpsError(
                f"--mps: the MPS control daemon did not start: {res.stderr.strip() or res.returncode}",
                f"see {self.log_dir}/control.log",
            )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if (self.pipe_dir / "control").exists():
                self.started_here = True
                log.info("MPS: started the control daemon (pipe %s, log %s)", self.pipe_dir, self.log_dir)
                return
            time.sleep(0.1)
        raise MpsError(
            "--mps: the MPS control daemon started but its pipe did not appear",
            f"see {self.log_dir}/control.log",
        )

    def stop(self) -> None:
        if self.started_here:
            self._control("quit")
            log.info("MPS: stopped the control daemon")
