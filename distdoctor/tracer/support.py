"""Which torch the tracer supports, and which ops it traces on the running one; and the
tracer's one way to complain (warn_once).

The floor is torch 2.4 (mid-2024: FSDP2 and DTensor in their early, private homes, the
"single" ops bound under their old names). Above it nothing is assumed: each op is
interposed under the name this torch binds it by (tracer/ops.py), and an op the running
torch lacks altogether is simply not there to trace. What is lost is an op that
`torch.distributed` offers but whose ProcessGroup method cannot be found: said once, by
rank 0, and written in each rank's metadata with the ops that are traced.
"""

from __future__ import annotations

import sys

FLOOR = (2, 4)
_warned: set = set()


def warn_once(key: str, message: str) -> None:
    """The tracer's only way to complain: one line on stderr per kind of problem."""
    if key in _warned:
        return
    _warned.add(key)
    try:
        print(f"distdoctor: {message} (tracing continues without it)", file=sys.stderr)
    except Exception:
        pass


def parse_version(version: str) -> tuple[int, int] | None:
    """(major, minor) of a torch version string ("2.6.0+cu124", "2.15.0a0+git..."), or None."""
    try:
        major, minor = version.split("+")[0].split(".")[:2]
        return int(major), int("".join(ch for ch in minor if ch.isdigit()) or "x")
    except ValueError:
        return None


def below_floor(version: str) -> str | None:
    """One line when `version` is older than the floor, else None (an unreadable version is
    given the benefit of the doubt: nothing is assumed, each op is still looked up)."""
    parsed = parse_version(version)
    if parsed is None or parsed >= FLOOR:
        return None
    return (f"torch {version} is older than the oldest torch distdoctor supports "
            f"({FLOOR[0]}.{FLOOR[1]})")


def traced_ops() -> dict[str, str]:
    """op name -> the ProcessGroup method it is traced at, on this torch."""
    from distdoctor.tracer.ops import TRACED_OPS

    return dict(TRACED_OPS)


def untraceable_ops() -> list[str]:
    """Ops torch.distributed offers on this torch that no ProcessGroup method carries."""
    import torch.distributed as dist

    from distdoctor.tracer.ops import ABSENT_OPS

    return [op for op in ABSENT_OPS if callable(getattr(dist, op, None))]
