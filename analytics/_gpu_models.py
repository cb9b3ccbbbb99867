"""A GPU's memory size from its model name, for telemetry that lacks ``memory.total``.

Imported logs often leave ``memory.total`` out while every row names the model (``nvidia-smi``'s
``name``). The what-if needs one pool GPU's memory to cut it into partitions; this table gives the
size NVIDIA sells each model with, in GiB. A name that states its size ("A100-SXM4-40GB",
"Tesla V100-SXM2-32GB", "H100 80GB HBM3") is read as it says; the table covers the names that do
not. Matching is on the name in lower case with spaces, dashes and underscores dropped, the most
specific pattern first.
"""

from __future__ import annotations

import re

GIB = 1 << 30

# (pattern in the squeezed lower-case name, GiB); more specific patterns first.
MODELS: tuple[tuple[str, int], ...] = (
    ("h100nvl", 94),
    ("h200", 141),
    ("h100", 80),
    ("h800", 80),
    ("a100", 40),  # the 80 GB models say so in their name
    ("a800", 80),
    ("l40s", 48),
    ("l40", 48),
    ("a40", 48),
    ("a30", 24),
    ("a10g", 24),
    ("a10", 24),
    ("l4", 24),
    ("t4", 16),
    ("rtx6000ada", 48),
    ("rtxa6000", 48),
    ("rtxa5000", 24),
    ("rtxa4000", 16),
    ("quadrortx8000", 48),
    ("quadrortx6000", 24),
    ("rtx4090", 24),
    ("rtx3090", 24),
    ("titanrtx", 24),
    ("v100", 16),  # the 32 GB models say so in their name
    ("p100", 16),
    ("p40", 24),
    ("k80", 12),
)
_STATED = re.compile(r"(\d{1,4})\s*gb\b", re.IGNORECASE)


def memory_from_name(name: str | None) -> int | None:
    """The memory of a GPU of model ``name`` in bytes, or None for a model this table does not know."""
    if not name:
        return None
    stated = _STATED.search(name)
    if stated and 1 <= int(stated.group(1)) <= 1024:
        return int(stated.group(1)) * GIB
    squeezed = re.sub(r"[\s_\-]+", "", name.lower())
    for pattern, gib in MODELS:
        if pattern in squeezed:
            return gib * GIB
    return None
