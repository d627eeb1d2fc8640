"""Hostile log text, generated from the log reader's own regexes: every pattern of
distdoctor/logs (the families' rules and each module's compiled regexes), and for each the
lines most likely to make it backtrack: its literal pieces repeated, each piece followed by
a long run of one character (digits, blanks, word characters, punctuation), the whole
pattern's example text repeated.

Nothing here knows a particular pattern: the pieces are read from the regex's parse tree
(`re._parser`, the stdlib's own), so a rule added later is fuzzed the same way.

`python -m tests.security.hostile_logs [SIZE]` prints each pattern's worst line and its
time: the tool the test in test_log_hostile.py is built on.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys
import time
from itertools import islice, product
from pathlib import Path

try:  # the stdlib's own regex parser (re._parser since 3.11, sre_parse before)
    import re._constants as C  # noqa: N812
    import re._parser as P  # noqa: N812
except ImportError:  # Python 3.10
    import sre_constants as C  # noqa: N812
    import sre_parse as P  # noqa: N812

# (possessive repeats and atomic groups are 3.11's; None never is an op)
_REPEATS = (C.MAX_REPEAT, C.MIN_REPEAT, getattr(C, "POSSESSIVE_REPEAT", None))
_ATOMIC = getattr(C, "ATOMIC_GROUP", None)

# characters a long run is made of: each class a pattern repeats has one of them
RUNS = "7 a:.-/()[]=,'\"A_x\t#|<>"
# what follows a piece when it is repeated
GLUE = " 7a:"
MAX_EXAMPLES = 24  # renderings per pattern (one per branch taken)


def logs_patterns() -> dict[str, tuple[re.Pattern, str]]:
    """{name: (pattern, how it is called: "search" or "match")} for every regex of
    distdoctor.logs. A regex is called with `match` when its source names it only that way
    (anchored where a line starts: a line costs one pass); every other one, a family's rule
    above all (Family.feed searches), is searched: a pass from every position."""
    import distdoctor.logs as logs
    from distdoctor.logs.signals import Rule

    found: dict[tuple, str] = {}

    def visit(name: str, v, depth: int = 0) -> None:
        if isinstance(v, re.Pattern) and isinstance(v.pattern, str):
            found.setdefault((v.pattern, v.flags), name)
        elif isinstance(v, Rule):
            visit(f"{name}:{v.name}", v.pattern)
        elif isinstance(v, (tuple, list)) and depth < 3:
            for i, x in enumerate(v):
                visit(f"{name}[{i}]", x, depth + 1)
        elif isinstance(v, dict) and depth < 2:
            for k, x in v.items():
                visit(f"{name}[{k!r}]", x, depth + 1)
        elif isinstance(v, type) and depth == 0:
            for k, x in vars(v).items():
                visit(f"{name}.{k}", x, depth + 1)

    sources = {}
    for m in pkgutil.walk_packages(logs.__path__, logs.__name__ + "."):
        mod = importlib.import_module(m.name)
        sources[m.name] = Path(mod.__file__).read_text()
        for k, v in vars(mod).items():
            if isinstance(v, type) and v.__module__ != mod.__name__:
                continue  # an imported class is its own module's
            visit(f"{m.name.rsplit('.', 1)[-1]}.{k}", v)
    out = {}
    for (pattern, flags), name in found.items():
        var = name.split(".", 1)[1].split("[")[0].split(":")[0].split(".")[0]
        mod = name.split(".", 1)[0]
        text = next((s for n, s in sources.items() if n.rsplit(".", 1)[-1] == mod), "")
        calls = set(re.findall(rf"\b{re.escape(var)}\.(\w+)\(", text))
        how = "match" if calls and calls <= {"match", "fullmatch"} else "search"
        out[name] = (re.compile(pattern, flags), how)
    return out


def _in_class(items, c: str) -> bool:
    """Whether `c` is in a parsed character class."""
    neg = False
    hit = False
    for op, av in items:
        if op is C.NEGATE:
            neg = True
        elif op is C.LITERAL:
            hit |= ord(c) == av
        elif op is C.RANGE:
            hit |= av[0] <= ord(c) <= av[1]
        elif op is C.CATEGORY:
            hit |= bool(re.match(_CATEGORY.get(av, r"(?!)"), c))
    return hit != neg


_CATEGORY = {C.CATEGORY_DIGIT: r"\d", C.CATEGORY_NOT_DIGIT: r"\D", C.CATEGORY_SPACE: r"\s",
             C.CATEGORY_NOT_SPACE: r"\S", C.CATEGORY_WORD: r"\w", C.CATEGORY_NOT_WORD: r"\W"}
_SPLIT = "\0"  # where an unbounded repeat stood in a rendering


def _one_char(op, av) -> str:
    """A character one class item matches."""
    if op is C.LITERAL:
        return chr(av)
    if op is C.NOT_LITERAL:
        return "x" if av != ord("x") else "y"
    if op is C.ANY:
        return "x"
    if op is C.IN:
        return next((c for c in RUNS + "bcdefghijklmnopqrstuvwyzBCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                     if _in_class(av, c)), "x")
    if op is C.CATEGORY:
        return {C.CATEGORY_DIGIT: "7", C.CATEGORY_SPACE: " "}.get(av, "a")
    return ""


def _run_chars(seq, out: set) -> set:
    """Characters an unbounded repeat of the parsed sequence takes (a few per class)."""
    for op, av in seq:
        if op in _REPEATS:
            lo, hi, item = av
            if hi is C.MAXREPEAT or hi > 64:
                for iop, iav in item:
                    if iop is C.IN:
                        out.update([c for c in RUNS + "bz0" if _in_class(iav, c)][:4])
                    elif iop in (C.LITERAL, C.NOT_LITERAL, C.ANY, C.CATEGORY):
                        out.add(_one_char(iop, iav))
            _run_chars(item, out)
        elif op is C.SUBPATTERN:
            _run_chars(av[3], out)
        elif op is _ATOMIC:
            _run_chars(av, out)
        elif op is C.BRANCH:
            for b in av[1]:
                _run_chars(b, out)
        elif op in (C.ASSERT, C.ASSERT_NOT):
            _run_chars(av[1], out)
    return out


def _render(seq, once: bool) -> list[str]:
    """Example texts of a parsed sequence: one per branch taken (bounded). An unbounded
    repeat is rendered as its body once, followed by _SPLIT (where a run may go) unless
    `once`."""
    outs = [""]
    for op, av in seq:
        if op in (C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN, C.CATEGORY):
            parts = [_one_char(op, av)]
        elif op in _REPEATS:
            lo, hi, item = av
            body = _render(item, once)
            unbounded = hi is C.MAXREPEAT or hi > 64
            n = max(lo, 1) if lo < 8 else lo
            parts = [b * n + ("" if once or not unbounded else _SPLIT) for b in body]
            if lo == 0:
                parts.append("")
        elif op is C.SUBPATTERN:
            parts = _render(av[3], once)
        elif op is _ATOMIC:
            parts = _render(av, once)
        elif op is C.BRANCH:
            parts = [r for b in av[1] for r in _render(b, once)]
        elif op is C.ASSERT:  # what a lookaround wants is there (a lookbehind's too)
            parts = _render(av[1], once)
        else:  # anchors, negative lookarounds, back references: no text of their own
            parts = [""]
        outs = [a + b for a, b in islice(product(outs, dict.fromkeys(parts)), MAX_EXAMPLES)]
    return list(dict.fromkeys(outs))


def pieces(pattern: re.Pattern) -> tuple[list[str], list[str], str]:
    """(the pattern's pieces between unbounded repeats, its whole example texts, the
    characters its unbounded repeats take)."""
    tree = P.parse(pattern.pattern, pattern.flags)
    split = _render(tree, once=False)
    whole = _render(tree, once=True)
    parts = [p for r in split for p in r.split(_SPLIT) if p.strip()]
    runs = "".join(sorted(_run_chars(tree, set(" 7a") )))
    return list(dict.fromkeys(parts))[:40], [w for w in whole if w.strip()][:8], runs


def hostile_texts(pattern: re.Pattern, size: int) -> dict[str, str]:
    """{what it is: a text of `size` characters} likely to make `pattern` backtrack."""
    parts, whole, runs = pieces(pattern)
    out: dict[str, str] = {}

    def put(name: str, unit: str, head: str = "") -> None:
        if unit:
            n = max(1, (size - len(head)) // len(unit) + 1)
            out.setdefault(name, (head + unit * n)[:size])

    for c in runs:
        put(f"a run of {c!r}", c)
    for p in parts:
        put(f"{p!r} repeated", p)
        for g in GLUE:
            put(f"{p + g!r} repeated", p + g)
        for c in runs:
            put(f"{p!r} then a run of {c!r}", c, p)
    for i, (a, b) in enumerate(zip(parts, parts[1:], strict=False)):
        put(f"pieces {i}-{i + 1} repeated", a + b)
        put(f"pieces {i}-{i + 1} repeated, blank between", a + " " + b)
    for w in whole:
        put(f"{w[:40]!r} repeated", w)
        put(f"{w[:40]!r} repeated, blank between", w + " ")
        for c in runs:
            put(f"{w[:40]!r} then a run of {c!r}", c, w)
    return out


def seconds(pattern: re.Pattern, how: str, text: str, tries: int = 1) -> float:
    call = pattern.search if how == "search" else pattern.match
    best = float("inf")
    for _ in range(tries):
        t = time.perf_counter()
        call(text)
        best = min(best, time.perf_counter() - t)
    return best


def benign_text(size: int) -> str:
    """Ordinary log words of `size` characters: a linear regex's own pace on them."""
    words = ("rank 3 step 120 loss 2.413 lr 0.0003 took 12.5 ms on host node-7 (pid 4242): "
             "reading shard data/train-00017.bin, 1024 tokens, all good; ")
    return (words * (size // len(words) + 1))[:size]


GROWTH = 8  # the large texts are this many times the small ones
MAX_GROWTH = 24  # a linear regex's time grows ~8x with them, a quadratic one's ~64x
MEASURABLE_S = 0.002  # times below this at the large size are noise, never judged


def quadratic(pattern: re.Pattern, how: str, size: int = 4096, keep: int = 5
              ) -> tuple[float, float, str] | None:
    """(seconds at `size`, at GROWTH x `size`, what) for the first of the pattern's slowest
    hostile texts whose time grows like the square of its length, or None. Each time is the
    best of three: a busy machine slows a run, it never speeds one."""
    small = hostile_texts(pattern, size)
    ranked = sorted(small, key=lambda k: seconds(pattern, how, small[k]), reverse=True)
    big = hostile_texts(pattern, size * GROWTH)
    for what in ranked[:keep]:
        t_big = seconds(pattern, how, big[what], 3)
        if t_big < MEASURABLE_S:
            continue
        t_small = seconds(pattern, how, small[what], 3)
        if t_big > MAX_GROWTH * max(t_small, 1e-7):
            # timed again with more tries before it is said: a millisecond's measure on a
            # busy machine (a full suite beside it) can be a scheduler's slice
            t_big = seconds(pattern, how, big[what], 9)
            t_small = seconds(pattern, how, small[what], 9)
            if t_big > MAX_GROWTH * max(t_small, 1e-7):
                return t_small, t_big, what
    return None


def slowest(pattern: re.Pattern, how: str, n: int = 2, size: int = 1024,
            enough: float = 0.05) -> list[str]:
    """The names of the pattern's `n` slowest hostile texts at `size` characters (timed on
    the code at hand; a text slower than `enough` seconds ends the ranking: it is slow)."""
    times = []
    for name, text in hostile_texts(pattern, size).items():
        t = seconds(pattern, how, text)
        times.append((t, name))
        if t > enough:
            break
    return [name for _, name in sorted(times, reverse=True)[:n]]


def family_anchors() -> dict[str, str]:
    """{module name: its family's anchors joined by blanks}: put at the end of a line, they
    route it to that family (the scanner hands a family only lines holding its anchors)."""
    from distdoctor.logs.families import FAMILIES, exceptions, unknown

    out = {f.__module__.rsplit(".", 1)[-1]: " ".join(a.decode() for a in f.anchors)
           for f in FAMILIES}
    out["exceptions"] += " " + " ".join(a.decode() for a in exceptions.Tracebacks.anchors)
    out["unknown"] = " ".join(a.decode() for a in unknown.UnknownErrors.anchors)
    return out


def hostile_lines(line_size: int = 64 << 10, per_pattern: int = 2) -> list[str]:
    """Lines of `line_size` characters, each the slowest hostile texts of one regex of the
    families (`per_pattern` each), under a rank's prefix and followed by that family's
    anchors, so that the family reads it."""
    anchors = family_anchors()
    out = []
    for name, (p, how) in logs_patterns().items():
        module = name.split(".", 1)[0]
        if module not in anchors:
            continue
        tail = " " + anchors[module]
        for what in slowest(p, how, per_pattern):
            text = hostile_texts(p, line_size - len(tail) - 9)[what]
            out.append("[rank1]: " + text.replace("\n", " ") + tail)
    return out


def benign_lines(lines: list[str]) -> list[str]:
    """Lines as long as `lines`, with the same anchors at their end (the same families read
    them), of ordinary words."""
    anchors = family_anchors()
    by_tail = {" " + a: a for a in anchors.values()}
    out = []
    for line in lines:
        tail = next((t for t in by_tail if line.endswith(t)), "")
        out.append("[rank1]: " + benign_text(len(line) - len(tail) - 9) + tail)
    return out


def main() -> int:
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    pats = logs_patterns()
    print(f"{len(pats)} patterns, {size:,} and {size * GROWTH:,} characters", file=sys.stderr)
    bad = 0
    for name, (p, how) in pats.items():
        hit = quadratic(p, how, size)
        if hit is not None:
            bad += 1
            t_small, t_big, what = hit
            print(f"{name} ({how}): {t_small * 1e3:.1f} ms -> {t_big * 1e3:.1f} ms "
                  f"({t_big / t_small:.0f}x) on {what}", flush=True)
    print(f"{bad} of {len(pats)} quadratic", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
