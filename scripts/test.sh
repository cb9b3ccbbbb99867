#!/usr/bin/env bash
# Install everything the test suite needs on a fresh machine (Python 3.11, no GPU) and run it all:
# lint, format, import layering, unit and integration tests. CI runs this through .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

# System programs the tests drive for real (Chromium, tmux, etcd, a C compiler, ...): one table,
# tests/required_tools.py, names each with its Debian package and the tests that need it. A test whose
# tool is missing fails, so a run that cannot install them stops here rather than pass untested;
# GPUPOOL_ALLOW_MISSING_TOOLS=1 (a developer's own machine) lets those tests skip instead.
mapfile -t need < <(python3 tests/required_tools.py --missing-packages)
if ((${#need[@]})); then
  installed=0
  if [ "$(id -u)" = 0 ]; then
    echo "installing system packages: ${need[*]}"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}") >/dev/null \
      && installed=1
  fi
  if ((!installed)); then
    if [ "${GPUPOOL_ALLOW_MISSING_TOOLS:-0}" != 0 ]; then
      echo "warning: ${need[*]} not installed; GPUPOOL_ALLOW_MISSING_TOOLS is set: the tests that need them will be skipped" >&2
    else
      echo "error: cannot install ${need[*]} (needs root and apt-get): the tests that drive them would fail." >&2
      echo "hint: install them, or on a developer's machine set GPUPOOL_ALLOW_MISSING_TOOLS=1 to skip those tests" >&2
      exit 1
    fi
  fi
fi

python3 -m venv .venv
source scripts/_quiet.sh
echo "installing gpupool and its test tools into .venv ..."
quiet .venv/bin/python -m pip install -q --upgrade pip
quiet .venv/bin/python -m pip install -q -e '.[test]'
exec .venv/bin/python -m pytest "$@"
