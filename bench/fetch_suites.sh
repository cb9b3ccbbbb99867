#!/usr/bin/env bash
# Download the frameworks' own test suites that bench/framework_suites.py runs, at the versions the GPU
# machine has (CuPy 14.2.0, JAX 0.11.x): only their tests, into DIR (default .suites). Needs the network;
# the GPU machine has none, so run this where there is one and carry DIR there (it is about 5 MB).
set -euo pipefail
dir=${1:-.suites}
cupy=${CUPY_TAG:-v14.2.0}
jax=${JAX_TAG:-jax-v0.11.0}
mkdir -p "$dir/cupy" "$dir/jax/tests"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "CuPy $cupy: tests/ ..."
git clone -q --depth 1 --branch "$cupy" --filter=blob:none --sparse https://github.com/cupy/cupy "$tmp/cupy"
git -C "$tmp/cupy" sparse-checkout set tests
cp -r "$tmp/cupy/tests" "$dir/cupy/"
echo "JAX $jax: the test files bench/framework_suites.py runs ..."
git clone -q --depth 1 --branch "$jax" --filter=blob:none --sparse https://github.com/jax-ml/jax "$tmp/jax"
git -C "$tmp/jax" sparse-checkout set tests
cp "$tmp/jax/conftest.py" "$dir/jax/"
for f in fft_test nn_test lax_control_flow_test linalg_test random_lax_test; do
  cp "$tmp/jax/tests/$f.py" "$dir/jax/tests/"
done
du -sh "$dir"
