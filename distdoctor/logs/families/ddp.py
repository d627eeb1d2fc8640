"""DistributedDataParallel's own errors: parameters that got no gradient (with the indices and
names DDP lists for them), and a model that differs across ranks."""

from __future__ import annotations

import re

from distdoctor.findings import Finding
from distdoctor.logs import remedies as R
from distdoctor.logs.bounds import small_int
from distdoctor.logs.lines import LogLine
from distdoctor.logs.problems import Problem, clip, on, plural, ranks_text
from distdoctor.logs.signals import CAUSE, CONTEXT, Family, Signal

NAME = "ddp"

_UNUSED = re.compile(r"Expected to have finished reduction in the prior iteration")
_STATIC = re.compile(r"static_graph set to True")
# torch/csrc/distributed/c10d/reducer.cpp
_INDICES = re.compile(r"Parameter indices which did not receive grad for rank (?P<rank>\d+): "
                      r"(?P<indices>[\d ]+)")
_NAMES = re.compile(r"Parameters which did not receive grad for rank (?P<rank>\d+): "
                    r"(?P<names>.+)")
_MODEL = re.compile(r"DDP expects same model across all ranks, but Rank (?P<rank>\d+) has "
                    r"(?P<n>\d+) params, while rank (?P<other>\d+) has inconsistent "
                    r"(?P<m>\d+) params")
_SIZES = re.compile(r"params\[(?P<index>\d+)\] in this process with sizes (?P<sizes>\[[^\]]*\])"
                    r" appears not to match (?:sizes|strides) of the same param in process 0")


class DdpFamily(Family):
    name = NAME
    anchors = (b"finished reduction", b"did not receive grad", b"DDP expects",
               b"appears not to match")

    def feed(self, line: LogLine) -> list[Signal]:
        text = line.text
        if _UNUSED.search(text):
            f = {"static_graph": bool(_STATIC.search(text))}
            for rx in (_INDICES, _NAMES):  # one long line when not wrapped by the reader
                if m := rx.search(text):
                    f.update(m.groupdict())
            return [Signal("unused_parameters", NAME, CAUSE, line, _clean(f))]
        for rx in (_INDICES, _NAMES):
            if m := rx.search(text):
                return [Signal("unused_detail", NAME, CONTEXT, line, _clean(dict(m.groupdict())))]
        if (m := _MODEL.search(text)) and None not in (f := {
                k: small_int(v) for k, v in m.groupdict().items()}).values():
            return [Signal("model_mismatch", NAME, CAUSE, line, f)]
        if (m := _SIZES.search(text)) and (index := small_int(m["index"])) is not None:
            return [Signal("model_mismatch", NAME, CAUSE, line,
                           {"index": index, "sizes": m["sizes"][:200]})]
        return []


def _clean(f: dict) -> dict:
    if "rank" in f:
        f["rank"] = small_int(f["rank"])
        if f["rank"] is None:
            del f["rank"]
    if "indices" in f:
        f["indices"] = [i for i in map(small_int, f["indices"].split()[:50]) if i is not None]
    if "names" in f:
        f["names"] = f["names"].strip()[:500]
    return f


# --- what its problems mean ---------------------------------------------------------------
def describe(p: Problem, ctx) -> Finding:
    ranks = sorted(p.ranks)
    if p.rule == "model_mismatch":
        # the reporter compares every rank's count with its own: the rank it names as
        # inconsistent (and that reports nothing itself) is the one out of step
        odd = sorted({s.fields["other"] for s in p.signals if "other" in s.fields}
                     - p.ranks - {s.fields.get("rank") for s in p.signals})
        odd_text = f"; rank{plural(odd)} {ranks_text(odd)} out of step" if odd else ""
        return ctx.finding(p, "mismatch", "error", f"DDP model differs across ranks{on(ranks)}: "
                           f"{clip(p.first.line.text, 160)}{odd_text}", odd or ranks,
                           R.DDP_MODEL_MISMATCH)
    # which parameters: in the error itself, or in the INFO/DETAIL lines that follow it
    detail: dict = {}
    for fields in [s.fields for s in p.signals] + [ctx.context_of("unused_detail", r)
                                                  for r in ranks]:
        for k in ("indices", "names"):
            if k in fields:
                detail.setdefault(k, fields[k])
    which = ""
    if detail.get("names"):
        which = f": {clip(detail['names'], 160)}"
    elif detail.get("indices"):
        which = f": parameter indices {' '.join(map(str, detail['indices'][:20]))}"
    fnd = ctx.finding(p, "crash", "error", f"DDP: parameters did not receive gradients"
                      f"{on(ranks)} (Expected to have finished reduction in the prior "
                      f"iteration){which}; find_unused_parameters=True or use every parameter",
                      ranks, R.DDP_UNUSED)
    fnd.details.update(detail)
    return fnd
