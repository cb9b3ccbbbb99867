"""The admission webhook's HTTP(S) server: ``POST /mutate`` answers AdmissionReview v1 (server._admission),
``GET /healthz`` answers ``ok`` (the Deployment's probes). Started by ``gpupool-server webhook``.

The API server only calls webhooks over HTTPS; plain HTTP is for a local try-out behind a proxy.
Every request is answered with a review (a denial for a body that is not one), one log line each.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import ssl
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from collector.argtypes import listen_hint
from server._admission import API_VERSION, WebhookOptions, review
from server._errors import PoolError

log = logging.getLogger("gpupool.webhook")

# A pod is at most what etcd stores (about 1.5 MiB); the review wraps it with oldObject and options.
MAX_BODY = 8 * 1024 * 1024


@dataclass
class ListenOptions:
    host: str = "0.0.0.0"
    port: int = 8443
    tls_cert: Path | None = None
    tls_key: Path | None = None


def make_app(options: WebhookOptions) -> web.Application:
    async def mutate(request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
        except ValueError:
            body = None  # review() denies it, naming what it expected
        answer = review(body, options)
        _log(body, answer)
        return web.json_response(answer)

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_post("/mutate", mutate)
    app.router.add_get("/healthz", healthz)
    return app


def _log(body: object, answer: dict) -> None:
    request = body.get("request") if isinstance(body, dict) else None
    pod = f"{request.get('namespace')}/{request.get('name') or '(generated name)'}" if isinstance(request, dict) else "?"  # fmt: skip
    response = answer["response"]
    if not response["allowed"]:
        log.info("denied %s: %s", pod, response["status"]["message"])
    elif "patch" in response:
        log.info("mutated %s: gpuattach run wraps its containers", pod)
    else:
        log.debug("passed %s unchanged", pod)


def tls_context(cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    if bool(cert) != bool(key):
        raise PoolError("TLS needs both --tls-cert and --tls-key", "give both, or neither for plain HTTP")
    if not cert:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise PoolError(
            f"cannot load TLS certificate/key: {exc}", "check --tls-cert and --tls-key (PEM files)"
        ) from None
    return ctx


async def serve_webhook(options: WebhookOptions, listen: ListenOptions) -> int:
    ssl_ctx = tls_context(listen.tls_cert, listen.tls_key)
    runner = web.AppRunner(make_app(options), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, listen.host, listen.port, ssl_context=ssl_ctx, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise PoolError(
            f"cannot listen on {listen.host}:{listen.port}: {exc.strerror}",
            listen_hint(exc, "--host", "--port"),
        ) from None
    port = site._server.sockets[0].getsockname()[1]  # the real one when --port 0
    pool = ",".join(options.servers) or options.cluster or "gpuattach's defaults"
    print(
        f"gpupool webhook listening on {'https' if ssl_ctx else 'http'}://{listen.host}:{port}/mutate "
        f"({API_VERSION} AdmissionReview; image {options.image}; pool {pool})",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    return 0
