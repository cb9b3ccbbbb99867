"""A real one-node Slurm for tests: munged + slurmctld + slurmd (Debian's slurm-wlm) in a temporary directory.

Everything is private to the directory: its own munge key and socket, its own slurm.conf (SLURM_CONF),
ports picked free on 127.0.0.1, spool and state folders, logs. Every wait is bounded; ``stop()`` ends
the three daemons (and whatever job they left) and is safe to call twice.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from etcd_cluster import free_ports  # the one free-port helper of the test harnesses

DAEMONS = ("munged", "slurmctld", "slurmd")
NODE = "gp1"  # the node's name in slurm.conf (its address is 127.0.0.1)


def missing_tools() -> list[str]:
    """What this harness needs and does not find: Slurm's programs (scripts/test.sh installs them), and
    root (slurmd starts each job's processes as the job's user)."""
    tools = (*DAEMONS, "sbatch", "srun", "scancel", "squeue", "scontrol")
    missing = [t for t in tools if not shutil.which(t) and not Path("/usr/sbin", t).exists()]
    return missing + (["root"] if os.geteuid() != 0 else [])


def _exe(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


@dataclass
class SlurmCluster:
    """``root``: an empty directory. ``conf_extra``: lines added to slurm.conf (Prolog=, Licenses=, ...)."""

    root: Path
    conf_extra: list[str] = field(default_factory=list)
    plugstack: list[str] = field(default_factory=list)  # lines of plugstack.conf (SPANK plugins)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def __post_init__(self):
        self.root = Path(self.root)
        for d in ("state", "spool", "log", "munge", "jobs"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "jobs", 0o1777)  # job output, written by the job's user
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"

    @property
    def env(self) -> dict[str, str]:
        """The environment for sbatch/srun/squeue of this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _write_conf(self) -> None:
        ctld_port, slurmd_port = free_ports(2)
        host = socket.gethostname().split(".")[0]  # slurmctld matches its short host name
        r = self.root
        lines = [
            "ClusterName=gpupooltest",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # No cgroups: a container or CI runner may not delegate them; processes are tracked by parentage.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/builtin",
            "MpiDefault=none",
            "ReturnToService=2",
            # Short timings so a cancelled or timed-out job ends within seconds.
            "KillWait=2",
            "MinJobAge=300",
            "InactiveLimit=0",
            "MessageTimeout=10",
            "OverTimeLimit=0",
            "SchedulerParameters=sched_interval=1",
            f"NodeName={NODE} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN",
            f"PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
            *self.conf_extra,
        ]
        if self.plugstack:
            stack = r / "plugstack.conf"
            stack.write_text("\n".join(self.plugstack) + "\n")
            lines.append(f"PlugStackConfig={stack}")
        self.conf.write_text("\n".join(lines) + "\n")

    def start(self, timeout: float = 30.0) -> SlurmCluster:
        self._write_conf()
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        m = self.root / "munge"
        os.chmod(m, 0o700)
        self._spawn("munged", [_exe("munged"), "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--pid-file={m / 'munged.pid'}",
                               f"--log-file={m / 'munged.log'}", f"--seed-file={m / 'seed'}"])  # fmt: skip
        self._wait(lambda: self.munge_socket.exists(), timeout, "munged did not create its socket")
        self._spawn("slurmctld", [_exe("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._spawn("slurmd", [_exe("slurmd"), "-D", "-N", NODE, "-f", str(self.conf)])
        self._wait(self._node_idle, timeout, "the node did not come up idle")
        return self

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")  # noqa: SIM115 (handed to the child)
        self.procs[name] = subprocess.Popen(
            args, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=self.env, start_new_session=True
        )
        log.close()

    def _node_idle(self) -> bool:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.logs()}")
        out = self.run("sinfo", "-h", "-N", "-o", "%t", check=False)
        return out.returncode == 0 and out.stdout.strip() == "idle"

    def _wait(self, cond, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            time.sleep(0.2)
        raise TimeoutError(f"{what} within {timeout:g}s\n{self.logs()}")

    def logs(self) -> str:
        """The daemons' logs, last lines, for a failing test's message."""
        out = []
        for f in [*sorted((self.root / "log").glob("*")), self.root / "munge" / "munged.log"]:
            if f.exists():
                out.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-25:]))
        return "\n".join(out)

    def run(self, *args: str, check: bool = True, timeout: float = 20.0) -> subprocess.CompletedProcess:
        """A Slurm command against this cluster."""
        proc = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def sbatch(self, script: str, *options: str, env: dict[str, str] | None = None) -> str:
        """Submit ``script`` (its text); returns the job id. Output goes to jobs/<id>.out."""
        path = self.root / "jobs" / f"job-{time.monotonic_ns()}.sh"
        path.write_text(script)
        proc = subprocess.run(
            ["sbatch", "--parsable", f"--output={self.root / 'jobs' / '%j.out'}", *options, str(path)],
            env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=20,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"sbatch exited {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout.strip().split(";")[0]

    def output(self, job_id: str) -> str:
        f = self.root / "jobs" / f"{job_id}.out"
        return f.read_text(errors="replace") if f.exists() else ""

    def state(self, job_id: str) -> str:
        """The job's state (PENDING, RUNNING, COMPLETED, CANCELLED, TIMEOUT, FAILED ...)."""
        out = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        for word in out.stdout.split():
            if word.startswith("JobState="):
                return word.split("=", 1)[1]
        return "UNKNOWN"

    def wait_state(self, job_id: str, states: set[str], timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state(job_id)
            if state in states:
                return state
            time.sleep(0.25)
        raise TimeoutError(
            f"job {job_id} is {self.state(job_id)}, not {sorted(states)}, after {timeout:g}s\n"
            f"output:\n{self.output(job_id)}\n{self.logs()}"
        )

    def stop(self) -> None:
        if not self.procs:
            return
        for name in ("slurmd", "slurmctld", "munged"):  # the node first: it ends the jobs it runs
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        self.procs.clear()


def job_by_hand(
    hook: Path,
    job_id: str,
    spec: str,
    cmd: list[str],
    *,
    account: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 600.0,
) -> tuple[subprocess.CompletedProcess, str]:
    """One job's life driven by hand, where Slurm cannot run (the GPU host): ``hook`` as slurmd runs it
    (Prolog, then TaskProlog, whose ``export``/``print`` lines make the command's environment and
    output), the command, then the Epilog, which runs however the command ended. Returns the command's
    result and the TaskProlog's printed lines. ``env``: the settings the hook reads (GPUPOOL_SLURM_ENV)."""
    job = {"SLURM_JOB_ID": job_id, "SPANK_GPUPOOL": spec, "SLURM_JOB_USER": "root", "SLURM_JOB_UID": str(os.getuid()),
           "SLURM_CLUSTER_NAME": "by-hand", **({"SLURM_JOB_ACCOUNT": account} if account else {})}  # fmt: skip
    base = {**os.environ, **(env or {}), **job}

    def hook_step(context: str, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([str(hook)], env={**base, **(extra or {}), "SLURM_SCRIPT_CONTEXT": context},
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip

    hook_step("prolog_slurmd")
    try:
        task_env = {**base}
        task = hook_step("prolog_task", task_env)
        printed = []
        for line in task.stdout.splitlines():
            if line.startswith("export ") and "=" in line:
                name, _, value = line.removeprefix("export ").partition("=")
                task_env[name] = value
            elif line.startswith("print "):
                printed.append(line.removeprefix("print "))
        if task.returncode != 0:  # slurmstepd ends the task here; its output holds the printed lines
            return subprocess.CompletedProcess(cmd, task.returncode, "", "\n".join(printed)), "\n".join(
                printed
            )
        result = subprocess.run(cmd, env=task_env, capture_output=True, text=True, timeout=timeout)
        return result, "\n".join(printed)
    finally:
        hook_step("epilog_slurmd")
