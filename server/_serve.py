"""Start-up and shutdown of ``gpupool-server serve``: inventory, store, MPS, recovery, HTTP, loops."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import ssl
import sys
import threading
import time

from aiohttp import web

from collector.argtypes import listen_hint
from collector.words import plural
from server._activity import NvmlActivity, SimulatedActivity
from server._app import ServerState, make_app, reap_loop, stop_worker
from server._config import ServerConfig
from server._errors import PoolError
from server._events import EventLog
from server._inventory import GIB, Inventory, default_addr, nvml_inventory, simulated_inventory
from server._lock import StateDirLock
from server._pool import Pool
from server._store import open_store

log = logging.getLogger("gpupool.server")


def _inventory(cfg: ServerConfig):
    hostname = socket.gethostname()
    addr = cfg.advertise_addr or default_addr(cfg.host)
    if cfg.simulate_gpus:
        return simulated_inventory(cfg.simulate_gpus, hostname, addr)
    from collector import CollectorError

    try:
        return nvml_inventory(hostname, addr)
    except CollectorError as exc:
        raise PoolError(
            f"no GPUs to serve: {exc.title}",
            "run on a GPU host, or try the control plane with --simulate-gpus 4xH100-80GB",
        ) from None


LIVE_FIELDS = (
    "state",
    "util_gpu_mean",
    "mem_used_bytes",
    "power_w",
    "temperature_c",
    "sm_activity",
    "sm_clock_hz",
)


def _sampler(
    cfg: ServerConfig, events: EventLog, live: dict, live_procs: dict, stop: threading.Event
) -> None:
    """This host's GPU samples through the collector's sampling loop: the newest per GPU for /v1/gpus
    (what `gpuattach smi` shows) and the newest process rows per GPU (a lease's NVML view), and all of
    them into the telemetry directory when one is configured, as gpustat-collect writes them."""
    from collector import NvmlSource, RollupKeeper, RollupOptions, RunOptions, run

    try:
        source = NvmlSource(interval_s=cfg.sample_interval_s)
    except Exception as exc:
        log.warning("GPU samples disabled: %s", exc)
        return
    keeper = None
    # Rollups where the server writes to a directory (a bucket's are built from a copy of it).
    if (
        cfg.telemetry_dir is not None
        and not str(cfg.telemetry_dir).startswith("s3://")
        and cfg.rollup_every_s > 0
    ):
        keeper = RollupKeeper(
            cfg.telemetry_dir, events.host, RollupOptions(cfg.rollup_every_s, cfg.keep_raw_s), report=log.info
        ).start()

    def show(tick) -> None:
        for row in tick.gpu_rows:
            live[row["gpu_index"]] = {k: row.get(k) for k in LIVE_FIELDS} | {"ts": row["ts"].isoformat()}
        # The newest process rows per GPU: a lease's own memory and busy share (its NVML view).
        procs: dict[int, dict] = {row["gpu_index"]: {} for row in tick.gpu_rows}
        for row in tick.process_rows:
            procs.setdefault(row["gpu_index"], {})[row["pid"]] = (row["mem_used_bytes"], row["sm_util"])
        live_procs.update(procs)

    try:
        run(
            source,
            events.writer,
            RunOptions(interval_s=cfg.sample_interval_s),
            stop=stop,
            on_tick=show,
            on_error=lambda exc: log.error("GPU sample failed: %s", exc, exc_info=exc),
        )
    except Exception:  # the last samples at shutdown; the pool goes on stopping
        log.exception("GPU samples stopped")
    finally:
        if keeper is not None:
            keeper.stop()


async def serve(cfg: ServerConfig) -> int:
    # What can be refused from the arguments alone is, before the state directory is touched.
    inv = _inventory(cfg)
    if cfg.mps and inv.simulated:
        raise PoolError("--mps needs real GPUs", "drop --mps with --simulate-gpus")
    if bool(cfg.tls_cert) != bool(cfg.tls_key):
        raise PoolError("TLS needs both --tls-cert and --tls-key", "give both, or neither for plain HTTP")
    lock = StateDirLock(cfg.state_dir).acquire()  # then: a second server on this state stops here
    try:
        return await _serve(cfg, inv)
    finally:
        lock.release()


async def _serve(cfg: ServerConfig, inv: Inventory) -> int:
    store = open_store(cfg.state_dir, report=log.warning)
    # One small real write tells a full disk now, not at the first grant: then the server starts
    # read-only (running leases served, nothing new granted) and says so.
    read_only = not store.retry_writes(probe=True)
    from collector import CollectorError

    try:
        events = EventLog(
            cfg.telemetry_dir, inv.hostname, simulated=inv.simulated, flush_interval_s=cfg.telemetry_flush_s
        )
    except CollectorError as exc:  # the telemetry directory or bucket cannot be written
        bucket = str(cfg.telemetry_dir).startswith("s3://")
        raise PoolError(
            f"--telemetry: {exc.title}", exc.hint if bucket else "pick a writable directory"
        ) from None
    mps = None
    if cfg.mps:
        from server._mps import MpsDaemon

        mps = MpsDaemon(cfg.state_dir, [g.uuid for g in inv.gpus], cfg.mps_pipe_dir)
        await asyncio.to_thread(mps.start)
    cluster = None
    if cfg.cluster:
        from server._cluster import open_cluster

        cluster = open_cluster(cfg.cluster, cfg.cluster_name or "pending", cfg.cluster_ttl_s)
        cluster.serving = True
    pool = Pool(store, inv, cfg, events, mps, cluster)
    for problem in pool.stored_problems():  # never applied; the config's value (or the default) holds
        log.warning("stored %s (set it again through the admin API or gpupool-server client set)", problem)
    for note in pool.recover(time.time()):
        log.info("recovered lease %s", note)
    if cluster is None and not any(r["admin"] for r in store.tokens()):
        log.warning("no admin token yet: create one with `gpupool-server token create admin --admin`")
    probe = SimulatedActivity() if inv.simulated else NvmlActivity(cfg.activity_window_s)
    st = ServerState(pool, probe, cfg.host or "0.0.0.0", cfg.reap_interval_s)  # workers bind where we do

    ssl_ctx = None
    if cfg.tls_cert:
        ssl_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ssl_ctx.load_cert_chain(cfg.tls_cert, cfg.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise PoolError(
                f"cannot load TLS certificate/key: {exc}", "check --tls-cert and --tls-key (PEM files)"
            ) from None

    runner = web.AppRunner(make_app(st), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port, ssl_context=ssl_ctx, reuse_address=True, backlog=1024)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        if mps is not None:
            await asyncio.to_thread(mps.stop)
        raise PoolError(
            f"cannot listen on {cfg.host}:{cfg.port}: {exc.strerror}", listen_hint(exc, "--host", "--port")
        ) from None
    pool.port = site._server.sockets[0].getsockname()[1]  # the real one when --port 0
    scheme = "https" if ssl_ctx else "http"
    gpus = ", ".join(f"{g.index}:{g.name} {g.mem_total_bytes / GIB:.0f}GiB" for g in inv.gpus)
    label = " [SIMULATED GPUs: control plane only]" if inv.simulated else ""
    if read_only:
        label += f" [READ-ONLY: the disk of {cfg.state_dir} is full; new leases once it has room]"
    shown = cfg.host if cfg.host not in ("", "0.0.0.0", "::") else inv.addr
    print(f"gpupool-server listening on {scheme}://{shown}:{pool.port} (advertised address {inv.addr}) with "
          f"{plural(len(inv.gpus), 'GPU')}{label}{' [MPS]' if mps else ''}: {gpus}", flush=True)  # fmt: skip

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    reaper = asyncio.create_task(reap_loop(st))
    if cluster is not None:
        from server._cluster import cluster_loop, member_name

        if not cfg.cluster_name:
            cluster.name = member_name(inv.hostname, pool.port)

        def member_info() -> dict:
            return {"name": cluster.name, "url": f"{scheme}://{inv.addr}:{pool.port}", "hostname": inv.hostname,
                    "addr": inv.addr, "simulated": inv.simulated, "started_at": pool.server_info()["started_at"],
                    "gpus": [{"index": g.index, "name": g.name, "mem_total_bytes": g.mem_total_bytes}
                             for g in inv.gpus], "draining": pool.server_draining}  # fmt: skip

        st.member_info = member_info  # put again when the server's drain changes (_lease_migrate)

        looper = asyncio.create_task(cluster_loop(st, cluster, member_info))
        print(
            f"gpupool-server: cluster mode: member {cluster.name} of {cfg.cluster}",
            file=sys.stderr,
            flush=True,
        )
    sampler_stop = threading.Event()
    sampler = threading.Thread(
        target=_sampler,
        args=(cfg, events, pool.live, pool.live_procs, sampler_stop),
        daemon=True,
        name="gpu-samples",
    )
    if not inv.simulated:  # live numbers for /v1/gpus; telemetry too when configured
        sampler.start()
    await stop.wait()

    log.info("shutting down: leases stay stored and are recovered at the next start")
    st.stopping.set()
    sampler_stop.set()
    reaper.cancel()
    if cluster is not None:
        looper.cancel()
        await asyncio.to_thread(cluster.leave)
    await runner.cleanup()
    for lease_id in list(st.workers):
        await stop_worker(st, lease_id)
    if mps is not None and pool.active_count() == 0:
        await asyncio.to_thread(mps.stop)
    if sampler.is_alive():  # its last samples go in before the writer closes
        await asyncio.to_thread(sampler.join, 5.0)
    events.close()
    st.db_thread.shutdown(wait=True)
    store.retry_writes()  # a last try for what waits in memory
    if unsaved := store.condition()["unsaved_leases"]:
        log.error(
            "state disk still full: changes of %s not written and lost with this process (%s); at the "
            "next start a lease whose release was lost ends when its processes or worker are found "
            "gone, or one TTL later, as its client no longer heartbeats",
            plural(len(unsaved), "lease"),
            ", ".join(unsaved),
        )
    store.close()
    print("gpupool-server stopped", file=sys.stderr, flush=True)
    return 0
