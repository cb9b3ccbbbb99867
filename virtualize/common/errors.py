"""The root of every error the ``virtualize`` package raises for a person (``collector.errors`` tells the
tree): ``ShimNotBuilt`` (remote.py), ``CensusError`` (_census.py), ``TlsUnavailable`` (_data_tls.py),
``JobError`` (slurm.py), ``UncheckedArgument`` (_shimgen.py, the generator's), ``MigrationRefused``
(_migrate.py: the worker answers it to the pool server).

CUDA's own results travel as ``CUresult`` codes to the program that made the call, never as these.
"""

from __future__ import annotations

from collector.errors import GpupoolError


class VirtualizeError(GpupoolError):
    """Remote execution cannot be set up as asked (the shim, the worker's TLS, the driver census)."""
