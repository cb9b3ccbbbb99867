"""The keeper of a session lease: a detached process that ``gpuattach request`` starts.

    python -m virtualize._keeper --lease-server URL --lease-id LEASE --interval S --ttl S [--pids-file F]

It heartbeats the lease until the lease ends or the server stays unreachable for three TTLs. The token
comes from ``$GPUPOOL_TOKEN`` (never the command line). With ``--pids-file`` (a local lease whose
processes start after it, as a Slurm job's tasks) each heartbeat registers the live pids listed there,
so idle detection and restart clean-up see the lease's processes. Not a ``gpuattach`` subcommand, so it is
listed nowhere a user looks.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m virtualize._keeper")
    ap.add_argument("--lease-server", required=True)
    ap.add_argument("--lease-id", required=True)
    ap.add_argument("--interval", type=float, required=True)
    ap.add_argument("--ttl", type=float, required=True)
    ap.add_argument("--pids-file", help="register the live processes listed here (one pid a line)")
    args = ap.parse_args(argv)

    from server.client import ApiError, PoolClient, PoolClientError
    from server.client_config import ClientConfig, ServerRef

    server = ServerRef(args.lease_server, os.environ.get("GPUPOOL_TOKEN"))
    client = PoolClient(
        ClientConfig(servers=[server], token=server.token, ca_cert=os.environ.get("GPUPOOL_KEEPER_CA_CERT"))
    )
    last_ok = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        try:
            client.heartbeat(server, args.lease_id, _live_pids(args.pids_file) if args.pids_file else None)
            last_ok = time.monotonic()
        except ApiError as exc:
            print(f"{time.ctime()}: lease {args.lease_id} ended: {exc.message}", flush=True)
            return 0
        except PoolClientError as exc:
            if time.monotonic() - last_ok > args.ttl * 3:
                print(f"{time.ctime()}: giving up on {args.lease_id}: {exc.title}", flush=True)
                return 1
        time.sleep(args.interval)


def _live_pids(path: str) -> list[int]:
    try:
        with open(path) as f:
            words = f.read().split()
    except OSError:
        return []
    pids = []
    for word in words:
        if word.isdigit() and 0 < int(word) < 1 << 31:
            try:
                os.kill(int(word), 0)
            except ProcessLookupError:
                continue
            except PermissionError:  # alive, another user's
                pass
            pids.append(int(word))
    return pids


if __name__ == "__main__":
    sys.exit(main())
