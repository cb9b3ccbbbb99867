"""The keeper of a session lease: a detached process that ``gpuattach request`` starts.

    python -m virtualize._keeper --lease-server URL --lease-id LEASE --interval S --ttl S

It heartbeats the lease until the lease ends or the server stays unreachable for three TTLs. The token
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
            client.heartbeat(server, args.lease_id)
            last_ok = time.monotonic()
        except ApiError as exc:
            print(f"{time.ctime()}: lease {args.lease_id} ended: {exc.message}", flush=True)
            return 0
        except PoolClientError as exc:
            if time.monotonic() - last_ok > args.ttl * 3:
                print(f"{time.ctime()}: giving up on {args.lease_id}: {exc.title}", flush=True)
                return 1
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
