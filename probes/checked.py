"""A probe file's readings, checked as they are read.

A probe file is text: the node's sampler writes it, but anyone who can write the run dir
(or a node that sends its copy to a collector) can put any JSON in it, and its samples
reach the detectors, the dashboard and /metrics, which take each reading for what its
snapshot class declares. One sample whose time was a list stopped `watch --once` for the
whole run dir ("'<' not supported between 'float' and 'list'"). Here every field is what
its class says, field by field from the class's own annotations:

- a number is an int or a finite float (never a bool), an int within 64 bits;
- a text is a str of at most MAX_TEXT characters;
- a list reading is at most MAX_ITEMS items, each sound;
- an optional reading that is missing or unsound is None (or its default): the sample
  keeps its other readings; a required one (a time, a host, a rank) makes the line no
  sample (ValueError: its reader skips it, as it skips a torn line).
"""

from __future__ import annotations

import math
from dataclasses import MISSING, fields

MAX_TEXT = 1024  # characters of a text reading (a host, a GPU's name, a status)
MAX_ITEMS = 4096  # items of a list reading (busy programs, reasons, XIDs, pids)
_INT_BOUND = 1 << 63


class Unsound(ValueError):
    """A required reading that is missing or not of its type."""


def _int(v):
    return v if type(v) is int and -_INT_BOUND <= v < _INT_BOUND else MISSING


def _float(v):
    if type(v) is int:
        return float(v) if -_INT_BOUND <= v < _INT_BOUND else MISSING
    return v if type(v) is float and math.isfinite(v) else MISSING


def _str(v):
    return v if type(v) is str and len(v) <= MAX_TEXT else MISSING


def _bool(v):
    return v if type(v) is bool else MISSING


def _items(check):
    def items(v):
        if type(v) not in (list, tuple) or len(v) > MAX_ITEMS:
            return MISSING
        out = tuple(check(x) for x in v)
        return MISSING if MISSING in out else out
    return items


_ints = _items(_int)


def _counts(v):
    """violation_ns: {policy: ns}."""
    if type(v) is not dict or len(v) > MAX_ITEMS:
        return MISSING
    out = {k: _int(x) for k, x in v.items() if _str(k) is not MISSING}
    return MISSING if len(out) != len(v) or MISSING in out.values() else out


def _busy(v):
    """A program busy beside the job (host.py's _by_program): its name and CPU are
    required; its pids and cores as lists of ints."""
    if type(v) is not dict:
        return MISSING
    name, pct = _str(v.get("name")), _float(v.get("cpu_pct"))
    if name is MISSING or pct is MISSING:
        return MISSING
    pids = _ints(v.get("pids", ()))
    cpus = v.get("cpus")
    return {"name": name, "pid": _optional(_int, v.get("pid")),
            "pids": list(pids) if pids is not MISSING else [],
            "count": _optional(_int, v.get("count")) or 1, "cpu_pct": pct,
            "cpus": None if cpus is None or _ints(cpus) is MISSING else list(cpus)}


def _optional(check, v):
    if v is None:
        return None
    got = check(v)
    return None if got is MISSING else got


# the annotations the snapshot classes use, as text (from __future__ import annotations)
_CHECKS = {"int": _int, "float": _float, "str": _str, "bool": _bool,
           "tuple": _items(_busy), "tuple[str, ...]": _items(_str),
           "tuple[int, ...]": _ints, "MappingProxyType": _counts}


def checked_fields(cls, d: dict) -> dict:
    """`d`'s values for the fields of the snapshot dataclass `cls`, each of its declared
    type: a sound value kept; an unsound or missing one its default (None: no reading).
    Unsound: a required field (no default) missing or not of its type."""
    if type(d) is not dict:
        raise Unsound(f"a {cls.__name__} is not an object")
    out = {}
    for f in fields(cls):
        kind = f.type
        optional = kind.endswith(" | None")
        check = _CHECKS[kind.removesuffix(" | None")]
        v = d.get(f.name, MISSING)
        got = MISSING if v is MISSING or (v is None and optional) else check(v)
        if got is not MISSING:
            out[f.name] = got
        elif v is None and optional:
            out[f.name] = None
        elif f.default is not MISSING:
            out[f.name] = f.default
        elif f.default_factory is not MISSING:
            out[f.name] = f.default_factory()
        else:
            raise Unsound(f"{cls.__name__}.{f.name}: {type(v).__name__} is not a {kind}")
    return out


def snapshots(cls, items) -> tuple:
    """The sound ones of a list of `cls` snapshots' objects (MAX_ITEMS at most): an entry
    that is no snapshot is left out, the others kept."""
    out = []
    for d in items[:MAX_ITEMS] if type(items) is list else ():
        try:
            out.append(cls(**checked_fields(cls, d)))
        except Unsound:
            continue
    return tuple(out)


def required(kind: str, v):
    """`v` as a reading of `kind` ("float", "str", ...); Unsound where it is not one."""
    got = _CHECKS[kind](v)
    if got is MISSING:
        raise Unsound(f"{type(v).__name__} is not a {kind}")
    return got


def gpu_of_rank(v) -> dict[int, str]:
    """A sample's {"rank": GPU key}: the entries whose rank is a rank's number (7 digits
    at most) and whose key is a text."""
    if type(v) is not dict or len(v) > MAX_ITEMS:
        return {}
    return {int(r): g for r, g in v.items() if type(r) is str and r.isdigit()
            and len(r) <= 7 and _str(g) is not MISSING}
