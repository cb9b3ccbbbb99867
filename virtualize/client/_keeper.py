"""The keeper of a session lease: a detached process that ``gpuattach request`` starts.

    python -m virtualize.client._keeper --lease-server URL --lease-id LEASE --interval S --ttl S [--pids-file F]

It heartbeats the lease (``server.client.Heartbeater``, the loop ``gpuattach run`` runs too) until the
lease ends or no heartbeat has been answered for three TTLs. The token comes from ``$GPUPOOL_TOKEN``
(never the command line). With ``--pids-file`` (a local lease whose processes start after it, as a Slurm
job's tasks) each heartbeat registers the live pids listed there, so idle detection and restart clean-up
see the lease's processes. Not a ``gpuattach`` subcommand, so it is
listed nowhere a user looks.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m virtualize.client._keeper")
    ap.add_argument("--lease-server", required=True)
    ap.add_argument("--lease-id", required=True)
    ap.add_argument("--interval", type=float, required=True)
    ap.add_argument("--ttl", type=float, required=True)
    ap.add_argument("--pids-file", help="register the live processes listed here (one pid a line)")
    args = ap.parse_args(argv)

    from server.client import Heartbeater, PoolClient
    from server.client_config import ClientConfig, ServerRef

    server = ServerRef(args.lease_server, os.environ.get("GPUPOOL_TOKEN"))
    client = PoolClient(
        ClientConfig(servers=[server], token=server.token, ca_cert=os.environ.get("GPUPOOL_KEEPER_CA_CERT"))
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    def ended(state: str, reason: str) -> None:
        print(f"{time.ctime()}: lease {args.lease_id} ended ({state}): {reason}", flush=True)

    def trouble(exc) -> None:
        print(f"{time.ctime()}: heartbeat of {args.lease_id} failed ({exc.title}); retrying", flush=True)

    # The one heartbeat loop of the pool's client, in this process's main thread.
    beats = Heartbeater(client, server, args.lease_id, args.interval, on_end=ended, on_trouble=trouble,
                        give_up_after_s=args.ttl * 3,
                        pids_from=(lambda: _live_pids(args.pids_file)) if args.pids_file else None)  # fmt: skip
    if beats.run() == "gave up":
        print(
            f"{time.ctime()}: giving up on {args.lease_id}: no heartbeat answered for {args.ttl * 3:g}s",
            flush=True,
        )
        return 1
    return 0


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
