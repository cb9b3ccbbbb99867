"""Command-line values checked before anything starts: one argparse type for every bounded number.

Every gpupool command refuses an out-of-range or malformed number in one line that names the value
and the range (`--port 99999` -> "99999 is out of range: a port number is 0-65535").
"""

from __future__ import annotations

import argparse
import errno
import math
import socket

__all__ = ["listen_hint", "ranged"]


def ranged(kind, lo: float | None = None, hi: float | None = None, noun: str = ""):
    """An argparse type: ``kind`` (int or float) within [lo, hi]; ``noun`` names the value in messages."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            default = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"not {noun or default}: {text!r}") from None
        if (lo is not None and value < lo) or (hi is not None and value > hi) or math.isnan(value):
            span = f"{lo:g}-{hi:g}" if hi is not None else f"at least {lo:g}"
            raise argparse.ArgumentTypeError(
                f"{text} is out of range: {f'{noun} is' if noun else 'give'} {span}"
            )
        return value

    return parse


def listen_hint(exc: OSError, address_option: str, port_option: str) -> str:
    """What to change when a socket cannot be bound: the address when it does not resolve or is not
    this machine's, else the port (taken, or privileged)."""
    if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
        return f"{address_option} must be an address or host name of this machine, e.g. 0.0.0.0 or 127.0.0.1"
    return f"pick another {port_option}, or stop what listens there"
