"""What one node may make the collector hold, and how many files the copy keeps open.

Everything a node sends is bounded here; past a bound that node is refused (WireError:
the server drops it with one line) and the other nodes go on.

Per node:
- numbers: every number a node sends is an int within 64 bits or a finite float, each
  field within its range, checked as its frame is read (peer_numbers.py; a digest's
  fields: digest_fields.py): a frame with one that is not is refused whole.
- ranks: MAX_RANKS_PER_NODE (its logs' copies, metadata, exits, digest positions, and
  the ranks of other nodes it sends, set aside); a rank belongs to the node (host) that
  sent it first while that node runs it (claims.py: it passes to another once its owner
  is gone for it, or to a newer launch of the job; a claim while the owner runs it is set
  aside, and two that both run it are a conflict, said), at most MAX_LOG_NUMBER logs a
  rank in the copy (a moved rank's numbered after its old owner's).
- exit entries: only for its own ranks, each checked (distdoctor.exits.exit_entry), at
  most MAX_EXITS_FRAMES EXITS frames a connection.
- findings: MAX_FINDINGS_PER_FRAME a frame, each one's text bounded and made printable
  (safetext), its details at most MAX_DETAILS_BYTES as JSON; at most MAX_NEW_FINDINGS
  distinct findings told (printed) per node; the ones it holds at most
  MAX_FINDINGS_BYTES_PER_NODE as JSON, and all nodes' together MAX_FINDINGS_BYTES.
- digests: at most MAX_RANKS_PER_NODE ranks, MAX_DIGEST_GROUPS new groups a frame,
  MAX_ARRIVED rank-arrivals a frame; the positions it leaves held come from at most
  MAX_HELD_DIGEST_BYTES of its frames (a rank's position is kept from the newest frame
  that had it; a frame's bytes count while any rank's position comes from it).

Over all nodes, MAX_RANKS ranks, MAX_FINDINGS_BYTES of findings and the fleet engine's
MAX_GROUPS groups, MAX_GROUP_MEMBERS members, MAX_SIGNATURES signatures and MAX_OPEN open
collectives are shared (shares.py): each node's holding is counted, and when one is
full the nodes that hold more than a newcomer would go (their holding freed, their
connection dropped with one line), so one peer that fills a cap never keeps the real
nodes out; a node that holds the most itself is refused (of the open collectives: its
own oldest go).
The nodes' connections (serving.MAX_NODES) are shared so by address.

Memory (the collector's Python objects, as measured with simulated nodes; a hostile
node's JSON, made of the smallest objects JSON can name, costs up to ~25x its bytes):
- per node: its held digest positions (<= MAX_HELD_DIGEST_BYTES of JSON: a node of 8
  ranks sends ~10 KB), its findings (<= MAX_FINDINGS_PER_FRAME x ~MAX_DETAILS_BYTES),
  its exits and rank records (~1 KB a rank, <= MAX_RANKS_PER_NODE): at most ~40 MiB for
  a hostile node, ~100 KB for an 8-rank one.
- in all: MAX_RANKS ranks (their exits, positions, owners: ~2-4 KB a rank as nodes send
  them), the fleet engine's own bounded tables (fleet.py: MAX_OPEN collectives,
  MAX_SIGNATURES, MAX_GROUP_MEMBERS group members), and one read buffer per connection
  (wire.MAX_PAYLOAD): ~1 GiB at 100,000 ranks, and the open copies below.

Descriptors: the copies of full logs keep at most `copy_fd_budget()` files open (the
least recently written closed first, reopened on demand: mirror.OpenCopies); a node's
probe samples are appended with a file opened per frame. So the copy's descriptors do
not grow with ranks: nodes (their connections) plus a constant.
"""

from __future__ import annotations

MAX_RANK = 1 << 24
MAX_RANKS = 1 << 18  # ranks in one copy, over all nodes (a job of 262,144 GPUs)
MAX_RANKS_PER_NODE = 1024  # a node runs a few GPUs' ranks (a simulator a thousand)
MAX_HOSTS = 1 << 16  # nodes that may send findings, with or without ranks
MAX_EXITS_FRAMES = 16  # a node sends its exit codes once a job (again after a reconnect)
MAX_FINDINGS_PER_FRAME = 100
MAX_NEW_FINDINGS = 1000  # distinct findings told per node, in the copy's life
# findings held (their JSON), per node and over all nodes: findings.json is written whole
# on every FINDINGS frame, on the loop (nodes cycling host names, each 2 MiB of findings:
# 30 of them made each frame take 10 s, every node deaf meanwhile)
MAX_FINDINGS_BYTES_PER_NODE = 1 << 20
MAX_FINDINGS_BYTES = 8 << 20
MAX_DETAILS_BYTES = 16 << 10
MAX_TEXT = 2000  # a finding's summary, remedy
MAX_SHORT_TEXT = 256  # a kind, severity, group, file, function, a group's description
MAX_CALLSITES = 64
MAX_STACKS = 64
MAX_STACK_TEXT = 8 << 10
MAX_DIGEST_GROUPS = 4096  # groups a digest names for the first time
MAX_ARRIVED = 1 << 18  # ranks entering collectives a digest reports (runs x count x ranks)
MAX_HELD_DIGEST_BYTES = 8 << 20
MAX_ISSUED_GROUPS = 1024  # groups a rank's position counts ops in

# a node has a few GPUs (each may start again); the caps bound one node's share of disk
MAX_LOGS_PER_NODE = 1024  # open at once (and set aside: claims.py)
MAX_LOG_NUMBER = 1 << 20  # a rank's log numbers in the copy, over its owners
MAX_COPIES_PER_NODE = 16 * MAX_RANKS_PER_NODE  # log copies, in the copy's life
MAX_FINISHED = 1 << 16
MAX_STRINGS_BYTES = 64 << 20
MAX_META_BYTES = 64 << 10  # a rank's metadata is about a kilobyte
MAX_HELD_META_BYTES = 16 * MAX_META_BYTES  # a node's META of others' ranks, till their OPEN
MAX_COMPLETED = 1 << 16  # completed collectives of a log awaiting its next STATE frame

COPY_FILES_CAP = 256  # descriptors the open copies hold at most (2 a writer, 1 a reader)


def copy_fd_budget() -> int:
    """Descriptors the copies may hold open: a quarter of the soft limit on open files
    (the rest for the nodes' connections, the viewer and the listener), at most
    COPY_FILES_CAP, at least 8."""
    import resource

    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (OSError, ValueError):
        soft = 1024
    if soft == resource.RLIM_INFINITY or soft <= 0:
        soft = 1 << 20
    return max(8, min(COPY_FILES_CAP, soft // 4))
