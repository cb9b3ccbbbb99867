#!/usr/bin/env bash
# Install the audit tools and run an audit end to end: sample this host's GPUs through NVML, or, on a
# machine without an NVIDIA driver, a simulated fleet (every row and every report page says so), then
# build the self-contained HTML report. Pass --duration SECONDS to sample longer (default 60).
set -euo pipefail
cd "$(dirname "$0")/.."
duration=60
[ "${1:-}" = "--duration" ] && duration="$2"
out=${GPUPOOL_AUDIT_DIR:-telemetry}

python3 -m venv .venv
source scripts/_quiet.sh
echo "installing gpupool's audit tools into .venv ..."
quiet .venv/bin/python -m pip install -q --upgrade pip
quiet .venv/bin/python -m pip install -q -e '.[report]'
# Without NVML, --fallback-simulate writes a week of labelled simulated history first, so the report
# has days and hours to show; with NVML it samples the real GPUs for the duration.
.venv/bin/gpustat-collect --out "$out" --duration "$duration" --fallback-simulate 8 --backfill 7d
.venv/bin/gpustat-report build "$out" -o audit.html
echo "audit written to $(pwd)/audit.html"
