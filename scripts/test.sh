#!/usr/bin/env bash
# Install everything the test suite needs on a fresh machine (Python 3.11, no GPU) and run it all:
# lint, format, import layering, unit and integration tests. CI runs this through .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

# System programs the tests drive for real: Chromium (report), tmux (console), etcd (cluster mode),
# a C compiler (the remote-execution shim), Slurm with munge and spank.h (the Slurm integration).
need=()
command -v chromium >/dev/null || need+=(chromium)
command -v tmux >/dev/null || need+=(tmux)
command -v etcd >/dev/null || need+=(etcd-server)
command -v cc >/dev/null || need+=(gcc)  # builds the remote-execution shim (libcuda.so.1)
# tests/slurm_cluster.py starts its own munged, slurmctld and slurmd (own config, ports, directory)
command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null || need+=(slurm-wlm)
command -v munged >/dev/null || need+=(munge)
[ -e /usr/include/slurm/spank.h ] || need+=(libslurm-dev)  # builds deploy/slurm's SPANK plugin
if ((${#need[@]})); then
  if [ "$(id -u)" = 0 ]; then
    echo "installing system packages: ${need[*]}"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}") >/dev/null \
      || echo "warning: could not install ${need[*]}; tests that need them will be skipped" >&2
  else
    echo "warning: not root, cannot install ${need[*]}; tests that need them will be skipped" >&2
  fi
fi

python3 -m venv .venv
source scripts/_quiet.sh
echo "installing gpupool and its test tools into .venv ..."
quiet .venv/bin/python -m pip install -q --upgrade pip
quiet .venv/bin/python -m pip install -q -e '.[test]'
exec .venv/bin/python -m pytest "$@"
