"""Which files a log spec names (paths, globs, .gz), and what their names say.

Ranks from file names (`--log 'slurm-123-*.out'`): a name saying `rank3` / `rank-3` gives the
rank; `node2` and `node_rank2` (torchrun's --node-rank) give the host "node2"; `local_rank1`
gives nothing. A name is a hint: a line's own prefix wins, and a launcher's lines (its
report names pids and ranks itself) never take a rank from it. Otherwise, when the files of a set differ by exactly
one number (slurm-4242-0.out, slurm-4242-1.out, ...), that number is the rank if the file's
lines carry no rank and no local rank, the node ("node N") if they carry local ranks only
(torchrun under srun), and nothing if they carry ranks. A line's own prefix always wins.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from distdoctor.errors import UserError
from distdoctor.safetext import printable


def _natural(path: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]


def expand(specs: list[str]) -> list[str]:
    """Paths and globs to readable files; anything wrong is one line for the user."""
    if not specs:
        raise UserError("diagnose: no log given", 2)
    out: list[str] = []
    for spec in specs:
        pattern = os.path.expanduser(spec)
        if not pattern.strip():
            raise UserError("diagnose: --log needs a file name (a path or a glob)", 2)
        if any(c in pattern for c in "*?["):
            import glob
            matches = sorted((p for p in glob.glob(pattern) if os.path.isfile(p)), key=_natural)
            if not matches:
                raise UserError(f"diagnose: no log file matches {spec!r}", 2)
        else:
            p = Path(pattern)
            if not p.exists():
                raise UserError(f"diagnose: log {printable(spec)} not found", 2)
            if p.is_dir():
                raise UserError(f"diagnose: log {printable(spec)!r} is a directory: give its "
                                f"files, e.g. --log '{printable(spec.rstrip('/'))}/*.log'", 2)
            if not p.is_file():  # a FIFO blocked the open with no writer; /dev/zero never ends
                raise UserError(f"diagnose: log {printable(spec)} is not a regular file (a "
                                "pipe or a device): save it to a file first", 2)
            matches = [pattern]
        for m in matches:
            try:
                with open(m, "rb") as fh:
                    fh.read(1)
            except OSError as exc:
                raise UserError(f"diagnose: cannot read log {m}: {exc.strerror or exc}",
                                2) from None
            if m not in out:
                out.append(m)
    return out


# "node_rank0" / "node-rank-1" / "noderank2" name a node (torchrun's --node-rank), not a rank;
# "local_rank3" names no global rank at all
_NAMED = re.compile(r"(?<![a-z])(node[-_ ]?rank|local[-_ ]?rank|rank|node)[-_ .]?(\d+)",
                    re.IGNORECASE)


def numbers_in_names(files: list[str]) -> dict[str, tuple[str, int]]:
    """What each file's name says: ("rank", n), ("node", n), or ("index", n) when the set's
    names differ by exactly one number (to be read as rank or node by what the lines carry)."""
    out: dict[str, tuple[str, int]] = {}
    for f in files:
        m = _NAMED.findall(os.path.basename(f))
        if m:
            word, n = m[-1]
            word = word.lower()
            if word.startswith("local"):
                continue
            out[f] = ("node" if word.startswith("node") else word, int(n))
    if len(files) < 2 or len(out) == len(files):
        return out
    parts = [re.split(r"(\d+)", os.path.basename(f).removesuffix(".gz")) for f in files]
    if len({len(p) for p in parts}) != 1 or len({tuple(p[0::2]) for p in parts}) != 1:
        return out
    varying = [i for i in range(1, len(parts[0]), 2) if len({p[i] for p in parts}) > 1]
    if len(varying) == 1:
        for f, p in zip(files, parts, strict=True):
            out.setdefault(f, ("index", int(p[varying[0]])))
    return out
