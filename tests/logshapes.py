"""Re-shape a log the ways real jobs and users mangle it, so every failure fixture can be run
through every shape (issue 13). Each function is pure: text in, text (or files) out.

The input is a log whose lines say their rank with torch's "[rankN]:" prefix (lines without
one keep no rank). Shapes:

  add_prefix(text, style)  re-label each line's rank as a launcher would: "srun" ("3: "),
                           "mpirun" ("[1,3]<stderr>:"), "ray" ("(RayWorkerWrapper pid=.., ip=..) "),
                           "glog" (a torch C++ "[rank3]:[E1123 ...]" head), "default-N"
                           (torchrun's "[default3]:" local rank under srun's node label,
                           N ranks per node), "timestamp" (an ISO stamp in front)
  ansi(text)               colour codes around prefixes and error words
  glue_progress(text)      a tqdm bar redrawn with '\\r' glued before each line
  crlf(text)               Windows line endings
  invalid_utf8(text)       -> bytes with broken UTF-8 and a NUL on some lines
  wrap(text, width)        hard-wrapped at `width` columns (tokens cut mid-word)
  interleave(text)         pairs of lines from different ranks written onto one line
  quote(text, depth)       every line quoted with "> " (a reply, an e-mail), depth times
  cut_end(text, keep)      the last line cut short (no final newline)
  split_per_rank(text, d)  one file per rank, prefixes removed -> paths (rank in the name)
  gzip_to(path)            a .gz copy of a file -> its path
  ALL_TEXT_SHAPES          name -> text function, for parametrized tests
"""

from __future__ import annotations

import gzip
import re
import shutil
from pathlib import Path

_RANK = re.compile(r"^\[rank(\d+)\]:")


def _lines(text: str) -> list[str]:
    return text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")


def _join(lines: list[str], end: bool = True) -> str:
    return "\n".join(lines) + ("\n" if end else "")


def _rank_and_rest(line: str) -> tuple[int | None, str]:
    m = _RANK.match(line)
    return (int(m.group(1)), line[m.end():]) if m else (None, line)


def add_prefix(text: str, style: str) -> str:
    """Each "[rankN]:" line relabelled the way `style` prints it (unranked lines kept)."""
    per_node = 4
    if style.startswith("default-"):
        per_node = int(style.split("-", 1)[1])
        style = "default"
    out = []
    for line in _lines(text):
        r, rest = _rank_and_rest(line)
        if style == "timestamp":
            out.append(f"2024-05-01T10:00:00.{len(out) % 1000:03d}Z {line}")
            continue
        if r is None:
            out.append(line)
        elif style == "srun":
            out.append(f"{r}: {rest}")
        elif style == "mpirun":
            out.append(f"[1,{r}]<stderr>:{rest}")
        elif style == "ray":
            out.append(f"(RayWorkerWrapper pid={4000 + r}, ip=10.0.0.{r // per_node + 1}) "
                       f"[rank{r}]:{rest}")
        elif style == "glog":
            head = "" if rest.startswith("[") else "[E501 10:00:00.123456789 train.cpp:42] "
            out.append(f"[rank{r}]:{head}{rest}")
        elif style == "default":
            out.append(f"{r // per_node}: [default{r % per_node}]:[rank{r}]:{rest}")
        else:
            raise ValueError(f"unknown prefix style {style!r}")
    return _join(out, text.endswith("\n"))


def ansi(text: str) -> str:
    """Colour: the rank prefix dim, words like Error/Timeout red (codes never split words)."""
    out = []
    for line in _lines(text):
        line = _RANK.sub(lambda m: f"\x1b[2m{m.group(0)}\x1b[0m", line)
        line = re.sub(r"\b(\w*(?:Error|Exception|Timeout)\w*)", "\x1b[1;31m\\1\x1b[0m", line)
        out.append(line)
    return _join(out, text.endswith("\n"))


def glue_progress(text: str) -> str:
    """Each ranked line preceded, on the same physical line, by two '\\r' progress redraws."""
    out = []
    for line in _lines(text):
        r, _ = _rank_and_rest(line)
        if r is None:
            out.append(line)
            continue
        bar = f"[rank{r}]:Map:  40%|####      | 400/1000\r Map:  90%|######### | 900/1000\r"
        out.append(bar + line)
    return _join(out, text.endswith("\n"))


def crlf(text: str) -> str:
    return text.replace("\n", "\r\n")


def invalid_utf8(text: str) -> bytes:
    """Bytes: every third line gets a stray 0xff and a NUL at its end (after its words)."""
    out = []
    for i, line in enumerate(_lines(text)):
        b = line.encode("utf-8")
        out.append(b + b" \xff\xfe\x00" if i % 3 == 0 else b)
    return b"\n".join(out) + (b"\n" if text.endswith("\n") else b"")


def wrap(text: str, width: int = 80) -> str:
    """Hard-wrapped at `width` characters, a terminal's way: pieces of exactly `width`."""
    out = []
    for line in _lines(text):
        while len(line) > width:
            out.append(line[:width])
            line = line[width:]
        out.append(line)
    return _join(out, text.endswith("\n"))


def interleave(text: str) -> str:
    """Consecutive lines of different ranks written onto one physical line, pairwise."""
    lines = _lines(text)
    out, i = [], 0
    while i < len(lines):
        a = lines[i]
        b = lines[i + 1] if i + 1 < len(lines) else None
        ra, rb = _rank_and_rest(a)[0], _rank_and_rest(b)[0] if b is not None else None
        if ra is not None and rb is not None and ra != rb:
            out.append(a + b)
            i += 2
        else:
            out.append(a)
            i += 1
    return _join(out, text.endswith("\n"))


def quote(text: str, depth: int = 1) -> str:
    """Every line quoted as a reply or an e-mail quotes it ("> ", "> > "; empty lines ">")."""
    mark = "> " * depth
    return _join([(mark + line) if line else mark.rstrip() for line in _lines(text)],
                 text.endswith("\n"))


def cut_end(text: str, keep: float = 0.5) -> str:
    """The last line cut to `keep` of its length, with no final newline."""
    lines = _lines(text)
    last = lines[-1]
    lines[-1] = last[:max(1, int(len(last) * keep))]
    return _join(lines, end=False)


def split_per_rank(text: str, directory: str | Path, pattern: str = "rank{rank}.log") -> list[Path]:
    """One file per rank (prefix removed, as a per-rank redirect writes them); lines without
    a rank go to every file. `pattern` may be e.g. "slurm-4242-{rank}.out"."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    files: dict[int, list[str]] = {}
    shared: list[tuple[int, str]] = []
    for i, line in enumerate(_lines(text)):
        r, rest = _rank_and_rest(line)
        if r is None:
            shared.append((i, line))
        else:
            files.setdefault(r, []).append(rest)
    paths = []
    for r in sorted(files):
        p = d / pattern.format(rank=r)
        p.write_text(_join([s for _, s in shared] + files[r]), encoding="utf-8")
        paths.append(p)
    return paths


def gzip_to(path: str | Path) -> Path:
    """A gzip copy `path`.gz next to the file."""
    src = Path(path)
    dst = src.with_name(src.name + ".gz")
    with open(src, "rb") as fi, gzip.open(dst, "wb") as fo:
        shutil.copyfileobj(fi, fo)
    return dst


ALL_TEXT_SHAPES = {
    "plain": lambda t: t,
    "srun": lambda t: add_prefix(t, "srun"),
    "mpirun": lambda t: add_prefix(t, "mpirun"),
    "ray": lambda t: add_prefix(t, "ray"),
    "glog": lambda t: add_prefix(t, "glog"),
    "default-4": lambda t: add_prefix(t, "default-4"),
    "timestamp": lambda t: add_prefix(t, "timestamp"),
    "ansi": ansi,
    "progress": glue_progress,
    "crlf": crlf,
    "wrap80": lambda t: wrap(t, 80),
    "wrap120": lambda t: wrap(t, 120),
    "interleave": interleave,
    "quote": quote,
    "quote2": lambda t: quote(t, 2),
    "cut_end": cut_end,
}
