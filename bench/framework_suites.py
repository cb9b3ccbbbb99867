"""The frameworks' own test suites, natively and through a lease: pass counts side by side.

    python bench/framework_suites.py --suites DIR [--part NAME=PATH[::EXPR] ...] [--out DIR]

Each part is a pytest run of a piece of a suite nobody here wrote (CuPy's, JAX's), made twice on this
GPU host: natively on GPU 0, and remotely through `tests/gpu/remote/remote_once.py` (a lease worker with
the CUDA executor, the shim compiled from this tree, a fresh worker per part). The counts come from
pytest's JUnit XML; a test that passes natively and not remotely is listed with the first line of its
failure, so each remaining difference has a cause to read. Results: a table on stdout, `suites.json`
and `suites.md` in --out (default $OUT or the working directory).

The suites are not in this repository: `bash bench/fetch_suites.sh DIR` downloads the versions that
match the GPU machine's CuPy and JAX (it needs the network; the GPU machine has none, so fetch them
where there is one and carry DIR there). Without --part, DEFAULT_PARTS runs: each fits the device
tool's ten-minute call with both runs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REMOTE_ONCE = ROOT / "tests" / "gpu" / "remote" / "remote_once.py"

# name -> path under the suites directory, optionally `::` and a pytest -k expression.
DEFAULT_PARTS = {
    "cupy-fft": "cupy/tests/cupy_tests/fft_tests/test_fft.py::not callback and not Plan",
    "cupy-sparse-csr": "cupy/tests/cupyx_tests/scipy_tests/sparse_tests/test_csr.py::TestCsrMatrixScipyComparison",
    "cupy-linalg-solve": "cupy/tests/cupy_tests/linalg_tests/test_solve.py",
    "cupy-random": "cupy/tests/cupy_tests/random_tests/test_generator.py::TestNormal or TestUniform",
    "cupy-sort": "cupy/tests/cupy_tests/sorting_tests/test_sort.py",
    "jax-fft": "jax/tests/fft_test.py",
    "jax-nn": "jax/tests/nn_test.py",
    "jax-control-flow": "jax/tests/lax_control_flow_test.py::Scan or Cond or While",
}


@dataclass
class Counts:
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    seconds: float = 0.0
    exit: int = 0
    outcomes: dict[str, str] = field(default_factory=dict)  # test id -> "passed" or the failure's first line


def junit_counts(path: Path) -> Counts:
    counts = Counts()
    if not path.exists():
        return counts
    for case in ET.parse(path).iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        problem = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
        if problem is None:
            counts.passed += 1
            counts.outcomes[test] = "passed"
        elif problem.tag == "skipped":
            counts.skipped += 1
        else:
            setattr(counts, "failed" if problem.tag == "failure" else "errors",
                    getattr(counts, "failed" if problem.tag == "failure" else "errors") + 1)  # fmt: skip
            first = (problem.get("message") or problem.text or problem.tag).strip().splitlines()
            counts.outcomes[test] = (first[0] if first else problem.tag)[:200]
    return counts


def run_part(
    name: str, target: str, suites: Path, out: Path, remote: bool, timeout: float, per_test: int
) -> Counts:
    path, _, expr = target.partition("::")
    xml = out / f"{name}.{'remote' if remote else 'native'}.xml"
    xml.unlink(missing_ok=True)
    pytest = [sys.executable, "-m", "pytest", str(suites / path), "-q", "-p", "no:cacheprovider", "-W", "ignore",
              f"--junitxml={xml}", f"--timeout={per_test}", "-o", "addopts="]  # fmt: skip
    if expr:
        pytest += ["-k", expr]
    cmd = [sys.executable, str(REMOTE_ONCE), "--mib", "16384", "--", *pytest] if remote else pytest
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env.setdefault("CUDA_VISIBLE_DEVICES", "0")
    started = time.monotonic()
    log = out / f"{name}.{'remote' if remote else 'native'}.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT, cwd=suites / path.split("/")[0],
                                start_new_session=True)  # fmt: skip
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            # An interrupted pytest still writes its report of the tests it ran; then nothing is left behind.
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            code = 124
    counts = junit_counts(xml)
    counts.seconds, counts.exit = time.monotonic() - started, code
    return counts


def differences(native: Counts, remote: Counts, limit: int = 15) -> list[str]:
    """Tests that pass natively and not remotely, each with the remote failure's first line."""
    lost = [t for t, o in native.outcomes.items() if o == "passed" and remote.outcomes.get(t) != "passed"]
    return [f"{t}: {remote.outcomes.get(t, 'not run remotely')}" for t in lost[:limit]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--suites", type=Path, required=True, help="where bench/fetch_suites.sh put the suites"
    )
    parser.add_argument("--part", action="append", default=[], metavar="NAME=PATH[::EXPR]",
                        help="a part to run (repeatable); default: every part of DEFAULT_PARTS")  # fmt: skip
    parser.add_argument("--only", nargs="*", help="run only these DEFAULT_PARTS by name")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--timeout", type=float, default=240, help="seconds per run of a part (default 240)")
    parser.add_argument("--per-test", type=int, default=60, help="seconds per test (default 60)")
    parser.add_argument("--native-only", action="store_true")
    args = parser.parse_args()
    if not args.suites.is_dir():
        parser.error(f"no suites at {args.suites}: run bash bench/fetch_suites.sh {args.suites} first")
    parts = dict(p.split("=", 1) for p in args.part) if args.part else dict(DEFAULT_PARTS)
    if args.only:
        parts = {k: v for k, v in parts.items() if k in args.only}
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, target in parts.items():
        native = run_part(name, target, args.suites.resolve(), args.out, False, args.timeout, args.per_test)
        print(f"{name}: native {native.passed} passed, {native.failed + native.errors} failed, "
              f"{native.skipped} skipped in {native.seconds:.0f} s (exit {native.exit})", flush=True)  # fmt: skip
        remote = (
            Counts()
            if args.native_only
            else run_part(name, target, args.suites.resolve(), args.out, True, args.timeout, args.per_test)
        )
        if not args.native_only:
            print(f"{name}: remote {remote.passed} passed, {remote.failed + remote.errors} failed, "
                  f"{remote.skipped} skipped in {remote.seconds:.0f} s (exit {remote.exit})", flush=True)  # fmt: skip
        lost = differences(native, remote) if not args.native_only else []
        for line in lost:
            print(f"  lost: {line}")
        rows.append({"part": name, "target": target, "native": {**asdict(native), "outcomes": None},
                     "remote": {**asdict(remote), "outcomes": None}, "lost": lost})  # fmt: skip
        (args.out / "suites.json").write_text(
            json.dumps(rows, indent=2)
        )  # after each part: a cut run keeps it
    table = [
        "| part | native passed / failed / skipped | remote passed / failed / skipped |",
        "| --- | --- | --- |",
    ]
    for r in rows:
        n, m = r["native"], r["remote"]
        table.append(f"| {r['part']} | {n['passed']} / {n['failed'] + n['errors']} / {n['skipped']} | "
                     f"{m['passed']} / {m['failed'] + m['errors']} / {m['skipped']} |")  # fmt: skip
    (args.out / "suites.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
