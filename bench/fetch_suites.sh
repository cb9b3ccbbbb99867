#!/usr/bin/env bash
# Download the frameworks' own test suites that bench/framework_suites.py runs, at the versions the GPU
# machine has (PyTorch 2.11.0, CuPy 14.2.0, JAX 0.11.x): only their tests, into DIR (default .suites).
#
#   bash bench/fetch_suites.sh [DIR [torch] [cupy] [jax]]     (no names: all three)
#
# Needs the network; the GPU machine has none, so run this where there is one and carry DIR there (it is
# about 8 MB). PyTorch's test files come with every module of test/ they import, found by following their
# imports (torch.testing._internal itself ships in the torch wheel); DIR/torch/COMMIT names the commit.
# TORCH_TAG, CUPY_TAG, JAX_TAG pick other versions; TORCH_GIT, CUPY_GIT, JAX_GIT other clones;
# TORCH_SITE_WHEELS (default "expecttest psutil", empty: none) what PyTorch's tests import beyond torch,
# downloaded for TORCH_PY (default 3.12) into DIR/torch/site.
set -euo pipefail
dir=${1:-.suites}
shift || true
wanted=${*:-torch cupy jax}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fetch_cupy() {
  local tag=${CUPY_TAG:-v14.2.0}
  echo "CuPy $tag: tests/ ..."
  mkdir -p "$dir/cupy"
  git clone -q --depth 1 --branch "$tag" --filter=blob:none --sparse "${CUPY_GIT:-https://github.com/cupy/cupy}" "$tmp/cupy"
  git -C "$tmp/cupy" sparse-checkout set tests
  cp -r "$tmp/cupy/tests" "$dir/cupy/"
}

fetch_jax() {
  local tag=${JAX_TAG:-jax-v0.11.0}
  echo "JAX $tag: the test files bench/framework_suites.py runs ..."
  mkdir -p "$dir/jax/tests"
  git clone -q --depth 1 --branch "$tag" --filter=blob:none --sparse "${JAX_GIT:-https://github.com/jax-ml/jax}" "$tmp/jax"
  git -C "$tmp/jax" sparse-checkout set tests
  cp "$tmp/jax/conftest.py" "$dir/jax/"
  for f in fft_test nn_test lax_control_flow_test linalg_test random_lax_test; do
    cp "$tmp/jax/tests/$f.py" "$dir/jax/tests/"
  done
}

fetch_torch() {
  local tag=${TORCH_TAG:-v2.11.0}
  echo "PyTorch $tag: test_cuda.py, test_cuda_multigpu.py, test_nn.py, test_modules.py and the modules of test/ they import ..."
  mkdir -p "$dir/torch"
  git clone -q --depth 1 --branch "$tag" --filter=blob:none --no-checkout \
    "${TORCH_GIT:-https://github.com/pytorch/pytorch}" "$tmp/torch"
  python3 - "$tmp/torch" "$dir/torch" test/test_cuda.py test/test_cuda_multigpu.py test/test_nn.py test/test_modules.py <<'PY'
"""Copy the named files of the clone and, transitively, each module of test/ they import (with the
__init__.py of each package on the way)."""
import re, subprocess, sys
from pathlib import Path

clone, into, wanted = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
git = ["git", "-C", clone]
tree = set(subprocess.check_output([*git, "ls-tree", "-r", "--name-only", "HEAD", "test/"], text=True).split())
absent = [path for path in wanted if path not in tree]
if absent:
    sys.exit(f"fetch_suites.sh: not in the clone: {' '.join(absent)}")
done = set()
while wanted:
    path = wanted.pop()
    if path in done:
        continue
    done.add(path)
    text = subprocess.check_output([*git, "show", f"HEAD:{path}"], text=True)  # fetches this one file
    (into / path).parent.mkdir(parents=True, exist_ok=True)
    (into / path).write_text(text)
    for module in re.findall(r"^\s*(?:from|import)\s+([A-Za-z_][\w.]*)", text, re.M):
        parts = module.split(".")
        for k in range(len(parts), 0, -1):  # the longest prefix that is a module or package of test/
            base = "test/" + "/".join(parts[:k])
            found = [p for p in (base + ".py", base + "/__init__.py") if p in tree]
            if found:
                packages = ("test/" + "/".join(parts[:j]) + "/__init__.py" for j in range(1, k))
                wanted.extend(found + [p for p in packages if p in tree])
                break
print(f"  {len(done)} files: " + " ".join(sorted(done)))
PY
  git -C "$tmp/torch" rev-parse HEAD > "$dir/torch/COMMIT"
  # What torch.testing._internal and these files import beyond torch, unpacked for the GPU host's Python
  # (bench/framework_suites.py puts DIR/torch/site on the path): the GPU machine has no network to install them.
  local wheels=${TORCH_SITE_WHEELS-expecttest psutil}
  if [[ -n "$wheels" ]]; then
    echo "  $wheels for Python ${TORCH_PY:-3.12} on x86_64 Linux, into $dir/torch/site ..."
    # shellcheck disable=SC2086 # the list is words
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "${TORCH_PY:-3.12}" \
      --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 -d "$tmp/wheels" $wheels
    for wheel in "$tmp"/wheels/*.whl; do python3 -m zipfile -e "$wheel" "$dir/torch/site"; done
  fi
}

for name in $wanted; do
  case $name in
    torch | cupy | jax) "fetch_$name" ;;
    *) echo "fetch_suites.sh: no suite named $name (torch, cupy, jax)" >&2; exit 2 ;;
  esac
done
du -sh "$dir"
