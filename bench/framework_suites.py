"""The frameworks' own test suites, natively and through a lease: pass counts side by side.

    python bench/framework_suites.py --suites DIR [--only PART ...] [--part NAME=PATH[::EXPR][@I/N] ...]
                                     [--out DIR] [--native-only] [--trace [PART ...]] [--profile [PART ...]]

Each part is a pytest run of a piece of a suite nobody here wrote (PyTorch's, CuPy's, JAX's), made twice on
this GPU host: natively on GPU 0, and remotely through `tests/gpu/remote/remote_once.py` (a lease worker
with the CUDA executor, the shim compiled from this tree, a fresh worker per run). A part is a test file,
optionally `::` a pytest -k expression, optionally `@I/N`: every N-th of those tests from the I-th, so a
long file splits into parts that each fit a call. A test that passes natively and not remotely is listed
with the first line of its failure, so each remaining difference has a cause to read; and where the remote
run spends its time beyond the native one (`time:` lines: the tests both ran, then the groups of tests,
a test less its parameters, that take 1.5 times as long and 1 s more; with --profile, `calls:` lines: the
driver calls the remote run spent most time in). Results: a table
on stdout, `suites.json` and `suites.md` in --out (default $OUT or the working directory).

Counts come from bench/_suite_progress.py, a pytest plugin that writes each test's outcome as it happens
(JUnit's categories; pytest's JUnit XML is still written per run). A run that dies in a test (an abort,
a segfault) does not lose the part: that test counts as failed, "crashed", and the tests not yet run
run in a fresh process (with a fresh worker remotely), until the part is done or its time is up. For
each crash, `PART.MODE.crash-K.txt` in --out keeps the run's last lines of output: the program's
stderr, the worker's log (it logs at DEBUG in remote runs, also kept whole in `PART.remote.worker.log`)
and, for the parts named by --trace, the shim's trace of every driver call (GPUPOOL_SHIM_TRACE, kept
only there, not in the log).

A part's native run is limited to --timeout seconds; if it stops there, the remote run runs the tests the
native run got through, and no others, within --remote-timeout. A suite's `site/` folder (DIR/torch/site:
expecttest, psutil), when there, is put on the runs' PYTHONPATH; parts under `torch/` load
bench/_torch_suite_compat.py, which lets a test file of a neighbouring PyTorch release collect on the installed one. The suites are not in this repository:
`bash bench/fetch_suites.sh DIR` downloads the versions that match the GPU machine's PyTorch, CuPy and
JAX (it needs the network; the GPU machine has none, so fetch them where there is one and carry DIR
there). Without --part, DEFAULT_PARTS runs (those whose files were fetched); --native-only sizes parts cheaply.
`--remote-env NAME=VALUE` sets a variable in the remote runs only (the shim's and the worker's settings,
e.g. GPUPOOL_SHIM_RING=1 or GPUPOOL_SHIM_COALESCE_US=0), to compare a setting on the same tests.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
REMOTE_ONCE = ROOT / "tests" / "gpu" / "remote" / "remote_once.py"
TAIL_LINES = 3000  # output lines kept for a crash's file: the trace of the last calls before it
TRACE_LINE = "gpupool: call "  # how the shim's trace (GPUPOOL_SHIM_TRACE) starts each call's line
INTERRUPT_GRACE_S = 10  # for pytest to write its report after the time limit's SIGINT, then SIGKILL
LEAST_RUN_S = 15  # a resumed run with less time left than this is not started

# name -> path under the suites directory, optionally `::` a pytest -k expression, optionally `@I/N`.
DEFAULT_PARTS = {
    "torch-cuda-1": "torch/test/test_cuda.py@1/4",
    "torch-cuda-2": "torch/test/test_cuda.py@2/4",
    "torch-cuda-3": "torch/test/test_cuda.py@3/4",
    "torch-cuda-4": "torch/test/test_cuda.py@4/4",
    "torch-cuda-multigpu": "torch/test/test_cuda_multigpu.py",
    "torch-nn-1": "torch/test/test_nn.py::cuda@1/3",
    "torch-nn-2": "torch/test/test_nn.py::cuda@2/3",
    "torch-nn-3": "torch/test/test_nn.py::cuda@3/3",
    "torch-modules-1": "torch/test/test_modules.py::cuda@1/4",  # every nn module of module_db, on CUDA
    "torch-modules-2": "torch/test/test_modules.py::cuda@2/4",
    "torch-modules-3": "torch/test/test_modules.py::cuda@3/4",
    "torch-modules-4": "torch/test/test_modules.py::cuda@4/4",
    "cupy-fft": "cupy/tests/cupy_tests/fft_tests/test_fft.py::not callback and not Plan",
    "cupy-sparse-csr": "cupy/tests/cupyx_tests/scipy_tests/sparse_tests/test_csr.py::TestCsrMatrixScipyComparison",
    "cupy-linalg-solve": "cupy/tests/cupy_tests/linalg_tests/test_solve.py",
    "cupy-random": "cupy/tests/cupy_tests/random_tests/test_generator.py::TestNormal or TestUniform",
    "cupy-sort": "cupy/tests/cupy_tests/sorting_tests/test_sort.py",
    # the driver and runtime as CuPy's own tests use them: devices, streams, events, graphs, memory pools,
    # pinned memory, textures, NVRTC and the libraries' handles
    "cupy-cuda-1": "cupy/tests/cupy_tests/cuda_tests::not nccl and not cutensor@1/2",
    "cupy-cuda-2": "cupy/tests/cupy_tests/cuda_tests::not nccl and not cutensor@2/2",
    "cupy-raw": "cupy/tests/cupy_tests/core_tests/test_raw.py",  # RawKernel, RawModule: modules loaded by the program
    "cupy-cub": "cupy/tests/cupy_tests/core_tests/test_cub_reduction.py",
    "cupy-linalg-decomposition": "cupy/tests/cupy_tests/linalg_tests/test_decomposition.py",  # cuSOLVER
    "cupy-jit": "cupy/tests/cupyx_tests/jit_tests",  # cupyx.jit: cooperative groups, CUB and Thrust in kernels
    "cupy-pinned-array": "cupy/tests/cupyx_tests/test_pinned_array.py",
    # cuSPARSE's SpMV/SpMM and triangular solves, cuSOLVER's sparse solvers, the iterative solvers over them:
    # 5245 tests, about 370 s natively on an H200, so four parts that each fit one call both ways
    **{
        f"cupy-sparse-linalg-{i}": f"cupy/tests/cupyx_tests/scipy_tests/sparse_tests/test_linalg.py@{i}/4"
        for i in range(1, 5)
    },
    "cupy-linalg-eigen": "cupy/tests/cupy_tests/linalg_tests/test_eigenvalue.py",  # cuSOLVER's syevd, syevj
    "jax-fft": "jax/tests/fft_test.py",
    "jax-nn": "jax/tests/nn_test.py",
    "jax-control-flow": "jax/tests/lax_control_flow_test.py::Scan or Cond or While",
    "jax-linalg-1": "jax/tests/linalg_test.py@1/3",
    "jax-linalg-2": "jax/tests/linalg_test.py@2/3",
    "jax-linalg-3": "jax/tests/linalg_test.py@3/3",
    "jax-random": "jax/tests/random_lax_test.py",
}


@dataclass(frozen=True)
class Part:
    """What one part runs: a test file under the suites directory, a -k expression, a shard."""

    path: str
    expr: str = ""
    shard: str = ""  # "I/N": every N-th test of the selection from the I-th

    @classmethod
    def parse(cls, target: str) -> Part:
        shard = re.search(r"@(\d+)/(\d+)$", target)
        if shard:
            target = target[: shard.start()]
            if not 1 <= int(shard[1]) <= int(shard[2]):
                raise ValueError(f"shard @{shard[1]}/{shard[2]}: I must be between 1 and N")
        path, _, expr = target.partition("::")
        return cls(path, expr, f"{shard[1]}/{shard[2]}" if shard else "")


@dataclass
class Counts:
    passed: int = 0
    failed: int = 0  # crashed tests included
    errors: int = 0
    skipped: int = 0
    crashes: int = 0
    seconds: float = 0.0
    exit: int = 0  # the last run's exit status; 124: the part's time ran out
    ran: list[str] = field(default_factory=list)  # test ids in the order they finished
    outcomes: dict[str, str] = field(default_factory=dict)  # test id -> "passed" or the failure's first line
    durations: dict[str, float] = field(default_factory=dict)  # test id -> seconds (setup, call, teardown)

    def add(self, test: str, outcome: str, message: str, seconds: float = 0.0) -> None:
        self.ran.append(test)
        self.durations[test] = seconds
        if outcome == "skipped":
            self.skipped += 1
            return
        if outcome == "passed":
            self.passed += 1
            self.outcomes[test] = "passed"
            return
        if outcome == "error":
            self.errors += 1
        else:
            self.failed += 1
        self.outcomes[test] = message or outcome


@dataclass
class Progress:
    """What one pytest process wrote through bench/_suite_progress.py before it ended."""

    collected: list[str] = field(default_factory=list)
    ended: list[tuple[str, str, str, float]] = field(
        default_factory=list
    )  # (test, outcome, message, seconds)
    running: str | None = None  # started and never ended: the test the process died in
    finished: bool = False

    @classmethod
    def read(cls, path: Path) -> Progress:
        progress = cls()
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines() if path.exists() else []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:  # a line cut short by the crash
                continue
            if "collected" in record:
                progress.collected = record["collected"]
            elif "start" in record:
                progress.running = record["start"]
            elif "end" in record:
                progress.ended.append(
                    (record["end"], record["outcome"], record.get("message", ""), record.get("seconds", 0.0))
                )
                progress.running = None
            elif "finished" in record:
                progress.finished = True
        return progress


class OutputTail:
    """A run's output, read from its pipe: to the log (less the shim's trace), the worker's lines also
    to their own file, and the last TAIL_LINES lines of everything kept for a crash's file."""

    def __init__(self, pipe, log: Path, worker_log: Path | None) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._pipe, self._log, self._worker_log = pipe, log, worker_log
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        worker = self._worker_log.open("a") if self._worker_log else None
        with self._log.open("a") as log:
            for raw in self._pipe:
                line = raw.decode("utf-8", "replace")
                self.lines.append(line)
                traced = line.find(TRACE_LINE)
                if traced >= 0:  # the trace: only in the tail (after pytest's progress dots, if any)
                    line = line[:traced]
                log.write(line)
                if worker and "gpupool-worker[" in line:
                    worker.write(line)
        if worker:
            worker.close()

    def join(self) -> None:
        self._thread.join(30)


def _pytest_command(part: Part, suites: Path, xml: Path, per_test: int) -> list[str]:
    # -s: what a test writes (a library's last message, the shim's trace) reaches the pipe, not a capture
    # file that dies with the process.
    cmd = [sys.executable, "-m", "pytest", str(suites / part.path), "-q", "-s", "-p", "no:cacheprovider",
           "-W", "ignore", "-p", "_suite_progress", f"--junitxml={xml}", f"--timeout={per_test}", "-o", "addopts="]  # fmt: skip
    if part.path.startswith("torch/"):  # a test file from a neighbouring PyTorch release
        cmd += ["-p", "_torch_suite_compat"]
    return [*cmd, "-k", part.expr] if part.expr else cmd


def _run_once(cmd: list[str], env: dict, cwd: Path, timeout: float, log: Path, worker_log: Path | None):
    """One pytest process (under remote_once.py for a remote run): its exit status and its output's tail."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd,
                            start_new_session=True)  # fmt: skip
    tail = OutputTail(proc.stdout, log, worker_log)
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        # An interrupted pytest still reports the tests it ran; then nothing is left behind.
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(INTERRUPT_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        code = 124
    tail.join()
    return code, tail


def _exit_text(code: int) -> str:
    if code < 0 or code > 128:  # killed by a signal, directly or through remote_once.py's exit status
        number = -code if code < 0 else (code - 128 if code < 192 else 256 - code)
        try:
            return f"killed by {signal.Signals(number).name}"
        except ValueError:
            pass
    return f"exit status {code}"


def env_setting(text: str) -> tuple[str, str]:
    """--remote-env's NAME=VALUE."""
    name, eq, value = text.partition("=")
    if not eq or not name or not name.replace("_", "").isalnum():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name, value


def run_part(name: str, part: Part, suites: Path, out: Path, remote: bool, timeout: float, per_test: int,
             only: list[str] | None = None, trace: bool = False, executor: str = "cuda", gpu: int = 0,
             partition_mib: int = 0, isolate: bool = False, profile: bool = False,
             remote_env: dict[str, str] | None = None) -> Counts:  # fmt: skip
    """Run one part (natively or remotely) to its end or its time limit, resuming after each crash.

    `only`: run just these test ids (the ones the native run got through)."""
    mode = "remote" if remote else "native"
    for old in out.glob(f"{name}.{mode}.*"):
        old.unlink()
    log, worker_log = out / f"{name}.{mode}.log", (out / f"{name}.{mode}.worker.log" if remote else None)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    # Natively the part sees GPU `gpu` alone; remotely the worker finds it by UUID among all of them.
    env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    if remote:
        del env["CUDA_VISIBLE_DEVICES"]
    site = suites / part.path.split("/")[0] / "site"  # what the suite imports that the GPU host may lack
    paths = [str(BENCH), str(site) if site.is_dir() else "", env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    env.pop("SUITE_SHARD", None)
    if part.shard:
        env["SUITE_SHARD"] = part.shard
    if remote:
        env["GPUPOOL_WORKER_LOG"] = "DEBUG"  # every refused call, for the crash files
        if trace:
            env["GPUPOOL_SHIM_TRACE"] = "1"
        if profile:  # where each test process's time went (at its exit, in the log), and the worker's loop
            env["GPUPOOL_SHIM_PROFILE"] = env["GPUPOOL_WORKER_NATIVE_STATS"] = "1"
        if isolate:
            env["GPUPOOL_ISOLATE"] = "1"  # as gpuattach run --isolate: a worker process per test process
        env.update(remote_env or {})  # --remote-env: a setting of the shim's or the worker's, to compare
    counts, pending = Counts(), only
    started = time.monotonic()
    for attempt in range(1, 1000):
        left = timeout - (time.monotonic() - started)
        if attempt > 1 and left < LEAST_RUN_S:
            counts.exit = 124
            break
        progress_file = out / f"{name}.{mode}.{attempt}.progress"
        env["SUITE_PROGRESS"] = str(progress_file)
        env.pop("SUITE_SELECT", None)
        if pending is not None:
            select = out / f"{name}.{mode}.{attempt}.select"
            select.write_text("\n".join(pending) + "\n")
            env["SUITE_SELECT"] = str(select)
            env.pop("SUITE_SHARD", None)  # the ids are already the shard's
        pytest = _pytest_command(part, suites, out / f"{name}.{mode}.{attempt}.xml", per_test)
        remote_once = [sys.executable, str(REMOTE_ONCE), "--mib", str(partition_mib), "--executor", executor,
                       "--gpu", str(gpu), "--"]  # fmt: skip
        cmd = [*remote_once, *pytest] if remote else pytest
        with log.open("a") as sink:
            sink.write(f"=== run {attempt}: {len(pending) if pending is not None else 'all'} tests ===\n")
        code, tail = _run_once(cmd, env, suites / part.path.split("/")[0], left, log, worker_log)
        progress = Progress.read(progress_file)
        for test, outcome, message, seconds in progress.ended:
            counts.add(test, outcome, message, seconds)
        counts.exit = code
        if progress.finished or code == 124 or progress.running is None:
            break  # done, out of time, or died outside a test (collection): nothing to resume
        counts.crashes += 1
        counts.add(progress.running, "failed", f"crashed: {_exit_text(code)}")
        crash = out / f"{name}.{mode}.crash-{counts.crashes}.txt"
        crash.write_text(f"{progress.running}: the {mode} run died in this test ({_exit_text(code)}), "
                         f"after {len(progress.ended)} tests of run {attempt}.\n"
                         f"Its last {len(tail.lines)} lines of output, oldest first:\n\n" + "".join(tail.lines))  # fmt: skip
        done = set(counts.ran)
        pending = [t for t in progress.collected if t not in done]
        if not pending:
            break
    counts.seconds = time.monotonic() - started
    return counts


def differences(native: Counts, remote: Counts, limit: int = 15) -> list[str]:
    """Tests that pass natively and not remotely, each with the remote failure's first line."""
    lost = [t for t, o in native.outcomes.items() if o == "passed" and remote.outcomes.get(t) != "passed"]
    return [f"{t}: {remote.outcomes.get(t, 'not run remotely')}" for t in lost[:limit]]


# A test's group: its id less its parameters (pytest's `[...]`, CuPy's `_param_N_{...}` classes).
_PARAMETERS = re.compile(r"\[.*\]$|_param_\d+_\{.*?\}")


def profiled_calls(log: Path, limit: int = 6) -> list[str]:
    """With --profile: the driver calls the part's test processes spent most time in, summed over all of
    them from each one's GPUPOOL_SHIM_PROFILE table in the remote log (how a slow group's cause is found)."""
    calls: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0, 0.0])
    for line in log.read_text(errors="replace").splitlines() if log.is_file() else ():
        # gpupool: NAME calls waited total-ms mean-us sent recv kept slow slow-ms others'-mean "us"
        words = line.split()
        if len(words) == 13 and words[0] == "gpupool:" and words[-1] == "us" and words[2].isdigit():
            row = calls[words[1]]
            row[0] += int(words[2])
            row[1] += int(words[3])
            row[2] += float(words[4])
    top = sorted(calls.items(), key=lambda item: -item[1][2])[:limit]
    return [f"{name}: {int(n):,} calls ({int(w):,} waited for the worker), {ms / 1000:.2f} s, "
            f"{1000 * ms / max(n, 1):.1f} µs each" for name, (n, w, ms) in top]  # fmt: skip


def slower(native: Counts, remote: Counts, limit: int = 8) -> list[str]:
    """Where the remote run spends its time beyond the native one, on the tests both ran: the whole, then the
    groups of tests (a test less its parameters) that take at least 1.5 times and 1 s more, most time
    lost first."""
    both = [t for t in remote.durations if t in native.durations]
    if not both:
        return []
    groups: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for test in both:
        group = groups[_PARAMETERS.sub("", test)]
        group[0] += 1
        group[1] += native.durations[test]
        group[2] += remote.durations[test]
    total_native, total_remote = (sum(d[t] for t in both) for d in (native.durations, remote.durations))
    lines = [f"the {len(both)} tests both ran: native {total_native:.1f} s, remote {total_remote:.1f} s"
             f" ({total_remote / max(total_native, 1e-9):.1f}x)"]  # fmt: skip
    lost = [(r - n, g, k, n, r) for g, (k, n, r) in groups.items() if r - n >= 1 and r >= 1.5 * n]
    for _, group, count, n, r in sorted(lost, reverse=True)[:limit]:
        lines.append(f"{group}: {count} tests, native {n:.1f} s, remote {r:.1f} s ({r / max(n, 1e-9):.1f}x)")
    return lines


def _summary(name: str, mode: str, c: Counts) -> str:
    crashes = f", {c.crashes} crashed and resumed" if c.crashes else ""
    return (f"{name}: {mode} {c.passed} passed, {c.failed + c.errors} failed, {c.skipped} skipped{crashes} "
            f"in {c.seconds:.0f} s ({'time limit' if c.exit == 124 else _exit_text(c.exit)})")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--suites", type=Path, required=True, help="where bench/fetch_suites.sh put the suites"
    )
    parser.add_argument("--part", action="append", default=[], metavar="NAME=PATH[::EXPR][@I/N]",
                        help="a part to run (repeatable); default: every part of DEFAULT_PARTS")  # fmt: skip
    parser.add_argument("--only", nargs="*", help="run only these DEFAULT_PARTS by name")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--timeout", type=float, default=240,
                        help="seconds for a part's native run, resumed runs included (default 240)")  # fmt: skip
    parser.add_argument("--remote-timeout", type=float,
                        help="seconds for a part's remote run (default: twice --timeout, so that a part a "
                             "lease runs more slowly still reaches the tests the native run did)")  # fmt: skip
    parser.add_argument("--per-test", type=int, default=60, help="seconds per test (default 60)")
    parser.add_argument("--native-only", action="store_true", help="only the native runs: to size parts")
    parser.add_argument("--gpu", type=int, default=0,
                        help="the GPU to run on, as nvidia-smi numbers it (default 0): two runs side by side")  # fmt: skip
    parser.add_argument("--partition-mib", type=int, default=0,
                        help="the remote lease's memory, MiB (default: the whole GPU, as `gpuattach run -n 1` "
                        "gets it; a smaller partition skips a suite's large-tensor tests, as it should)")  # fmt: skip
    parser.add_argument("--executor", default="cuda", choices=["cuda", "host"],
                        help="the remote worker's executor (host: no GPU, for testing this script)")  # fmt: skip
    parser.add_argument("--trace", nargs="*", metavar="PART",
                        help="trace the shim's calls in these parts' remote runs (none named: all), "
                        "kept in the crash files")  # fmt: skip
    parser.add_argument("--profile", nargs="*", metavar="PART",
                        help="profile these parts' remote runs (none named: all): each test process's calls "
                        "and their time at its exit (GPUPOOL_SHIM_PROFILE) in PART.remote.log, the worker's "
                        "native loop (GPUPOOL_WORKER_NATIVE_STATS) in PART.remote.worker.log")  # fmt: skip
    parser.add_argument("--isolate", action="store_true",
                        help="remote runs as under `gpuattach run --isolate`: each process of a part gets a "
                        "worker process of its own (a subprocess's device-side assert ends its context only)")  # fmt: skip
    parser.add_argument("--remote-env", action="append", default=[], type=env_setting, metavar="NAME=VALUE",
                        help="set this in the remote runs' environment (the program's and its worker's; "
                        "repeatable), e.g. GPUPOOL_SHIM_RING=1 to compare a setting on the same tests")  # fmt: skip
    args = parser.parse_args()
    if not args.suites.is_dir():
        parser.error(f"no suites at {args.suites}: run bash bench/fetch_suites.sh {args.suites} first")
    try:
        targets = dict(p.split("=", 1) for p in args.part) if args.part else dict(DEFAULT_PARTS)
        parts = {name: Part.parse(target) for name, target in targets.items()}
    except ValueError as e:
        parser.error(f"bad --part: {e} (expected NAME=PATH[::EXPR][@I/N])")
    if args.only:
        unknown = sorted(set(args.only) - set(parts))
        if unknown:
            parser.error(f"no part named {', '.join(unknown)}; parts: {', '.join(parts)}")
        parts = {k: v for k, v in parts.items() if k in args.only}
    missing = {name for name, p in parts.items() if not (args.suites / p.path).exists()}
    if missing and (args.part or args.only):
        files = sorted({parts[name].path for name in missing})
        parser.error(
            f"not in {args.suites}: {', '.join(files)}; run bash bench/fetch_suites.sh {args.suites}"
        )
    for name in sorted(missing):  # of the default set: run what was fetched
        print(f"{name}: skipped, {parts[name].path} is not in {args.suites} (bash bench/fetch_suites.sh)")
        del parts[name]
    if not parts:
        parser.error(
            f"none of the parts' files is in {args.suites}: run bash bench/fetch_suites.sh {args.suites}"
        )
    traced = set(parts) if args.trace == [] else set(args.trace or ())
    profiled = set(parts) if args.profile == [] else set(args.profile or ())
    suites = args.suites.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, part in parts.items():
        native = run_part(name, part, suites, args.out, False, args.timeout, args.per_test, gpu=args.gpu)
        print(_summary(name, "native", native), flush=True)
        remote, lost = Counts(), []
        if not args.native_only:
            # A native run cut by its time limit defines the part: the remote run runs those tests only.
            only = native.ran if native.exit == 124 else None
            remote = run_part(name, part, suites, args.out, True, args.remote_timeout or 2 * args.timeout,
                              args.per_test, only, name in traced, args.executor, args.gpu,
                              args.partition_mib, args.isolate, name in profiled,
                              dict(args.remote_env))  # fmt: skip
            print(_summary(name, "remote", remote), flush=True)
            lost = differences(native, remote)
        for line in lost:
            print(f"  lost: {line}")
        slow = slower(native, remote) if not args.native_only else []
        for line in slow:
            print(f"  time: {line}")
        spent = (
            profiled_calls(args.out / f"{name}.remote.log")
            if name in profiled and not args.native_only
            else []
        )
        for line in spent:
            print(f"  calls: {line}")
        rows.append({"part": name, "target": targets[name],
                     "native": {**asdict(native), "outcomes": None, "durations": None, "ran": len(native.ran)},
                     "remote": {**asdict(remote), "outcomes": None, "durations": None, "ran": len(remote.ran)},
                     "lost": lost, "slower": slow, "calls": spent})  # fmt: skip
        (args.out / "suites.json").write_text(
            json.dumps(rows, indent=2)
        )  # after each part: a cut run keeps it
    table = [
        "| part | native passed / failed / skipped | remote passed / failed / skipped | crashes native / remote |",
        "| --- | --- | --- | --- |",
    ]
    for r in rows:
        n, m = r["native"], r["remote"]
        table.append(f"| {r['part']} | {n['passed']} / {n['failed'] + n['errors']} / {n['skipped']} | "
                     f"{m['passed']} / {m['failed'] + m['errors']} / {m['skipped']} | "
                     f"{n['crashes']} / {m['crashes']} |")  # fmt: skip
    (args.out / "suites.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
