"""The op table: how many elements each op moves per rank, and its algbw/busbw.

Counts follow nccl-tests (`*GetCollByteCount`): `-b/-e` give the size of the largest
buffer; ops that split it among ranks (all_gather, reduce_scatter, all_to_all, gather,
scatter) round each rank's chunk down to a multiple of 16 bytes. The "size" column is the
larger of the send and receive buffers in bytes and "count" the per-rank element count the
op is called with. algbw = bytes / time with GB = 1e9; busbw = algbw * factor(n), the
factors of nccl-tests' PERFORMANCE.md.
"""

from __future__ import annotations

from dataclasses import dataclass


def _allreduce_factor(n: int) -> float:
    return 2.0 * (n - 1) / n


def _split_factor(n: int) -> float:
    return (n - 1) / n


def _unit_factor(n: int) -> float:
    return 1.0


@dataclass(frozen=True)
class OpSpec:
    name: str
    busbw_factor: object  # Callable[[int], float]
    divided: bool  # the size is split into per-rank chunks
    gathers: bool  # the send buffer is one chunk, the receive buffer n chunks
    has_root: bool
    has_redop: bool
    out_of_place: bool  # torch.distributed has an out-of-place form
    in_place: bool  # the op has an in-place form
    min_ranks: int = 1


OPS: dict[str, OpSpec] = {spec.name: spec for spec in [
    # torch.distributed.all_reduce, broadcast and reduce exist only in place.
    OpSpec("all_reduce", _allreduce_factor, False, False, False, True, False, True),
    OpSpec("all_gather", _split_factor, True, True, False, False, True, True),
    OpSpec("reduce_scatter", _split_factor, True, False, False, True, True, True),
    OpSpec("broadcast", _unit_factor, False, False, True, False, False, True),
    OpSpec("reduce", _unit_factor, False, False, True, True, False, True),
    # nccl-tests runs these two "in place" on one buffer, which races; we report N/A.
    OpSpec("all_to_all", _split_factor, True, False, False, False, True, False),
    OpSpec("gather", _split_factor, True, True, True, False, True, True),
    OpSpec("scatter", _split_factor, True, False, True, False, True, True),
    OpSpec("sendrecv", _unit_factor, False, False, False, False, True, False, min_ranks=2),
]}
OP_NAMES = list(OPS)


@dataclass(frozen=True)
class Layout:
    """Element counts of one op at one size on n ranks."""

    count: int  # elements per rank the op is called with (nccl-tests' "count" column)
    send_count: int
    recv_count: int
    elsize: int
    nranks: int

    @property
    def size(self) -> int:
        """nccl-tests' "size" column: the larger buffer, in bytes."""
        return max(self.send_count, self.recv_count) * self.elsize


def layout(spec: OpSpec, size: int, elsize: int, nranks: int) -> Layout:
    count = size // elsize
    if not spec.divided:
        return Layout(count, count, count, elsize, nranks)
    align = max(1, 16 // elsize)
    chunk = (count // nranks) // align * align
    if spec.gathers:  # all_gather, gather: send one chunk, receive n
        return Layout(chunk, chunk, chunk * nranks, elsize, nranks)
    if spec.name == "all_to_all":
        return Layout(chunk, chunk * nranks, chunk * nranks, elsize, nranks)
    return Layout(chunk, chunk * nranks, chunk, elsize, nranks)  # reduce_scatter, scatter


def algbw_bytes(spec: OpSpec, lay: Layout) -> int:
    """The bytes nccl-tests divides by the time to get algbw."""
    if spec.divided:
        return lay.count * lay.nranks * lay.elsize
    return lay.count * lay.elsize


def bandwidths(spec: OpSpec, lay: Layout, seconds: float) -> tuple[float, float]:
    """(algbw, busbw) in GB/s, GB = 1e9, for one op taking `seconds`."""
    if seconds <= 0:
        return 0.0, 0.0
    algbw = algbw_bytes(spec, lay) / 1.0e9 / seconds
    return algbw, algbw * spec.busbw_factor(lay.nranks)
