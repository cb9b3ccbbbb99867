"""The keeper of a session lease: a detached process that ``gpuattach request`` starts.

    python -m virtualize._keeper --lease-server URL --lease-id LEASE --interval S --ttl S

It heartbeats the lease (``server.client.Heartbeater``, the loop ``gpuattach run`` runs too) until the
lease ends or no heartbeat has been answered for three TTLs. The token
comes from ``$GPUPOOL_TOKEN`` (never the command line). Not a ``gpuattach`` subcommand, so it is
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
                        give_up_after_s=args.ttl * 3)  # fmt: skip
    if beats.run() == "gave up":
        print(
            f"{time.ctime()}: giving up on {args.lease_id}: no heartbeat answered for {args.ttl * 3:g}s",
            flush=True,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
