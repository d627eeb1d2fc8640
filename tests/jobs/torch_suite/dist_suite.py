"""PyTorch's own distributed test suite (the base class shipped in the wheel), on gloo.

Composed the way torch's test/distributed/test_distributed_spawn.py does it: every test
spawns WORLD_SIZE fresh rank processes, each of which calls init_process_group (file://
init method), runs the test, and destroys the group. Nothing here knows about
distdoctor: tests/test_torch_suite.py and benchmarks/torch_suite.py run it bare and under
`distdoctor run`.

    python -m pytest tests/jobs/torch_suite/dist_suite.py::TestGloo::test_all_reduce_sum
    python tests/jobs/torch_suite/dist_suite.py            # the CI subset (harness.py)
    python tests/jobs/torch_suite/dist_suite.py test_barrier test_send_recv

The class holds the whole suite (about 300 tests, many of them CUDA/NCCL only); callers
select tests by name. The file is not named test_*.py, so the project's own pytest run
does not collect it.
"""

import collections
import json
import os
import sys
import unittest

# Read by distributed_test at import time (BACKEND) and by its tests (WORLD_SIZE). TEMP_DIR
# (with its barrier/ folder) is made afresh for each test by TestDistBackend.setUp, before
# the ranks start, and the ranks inherit it.
os.environ.setdefault("BACKEND", "gloo")
os.environ.setdefault("WORLD_SIZE", "2")

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

# c10d dispatcher ops -> the names torch.distributed (and distdoctor) give them
C10D_OPS = {
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce_coalesced",
    "broadcast_": "broadcast", "reduce_": "reduce", "allgather_": "all_gather",
    "allgather_coalesced_": "all_gather_coalesced",
    "_allgather_base_": "all_gather_into_tensor",
    "allgather_into_tensor_coalesced_": "all_gather_into_tensor_coalesced",
    "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter_tensor_coalesced",
    "alltoall_": "all_to_all", "alltoall_base_": "all_to_all_single", "gather_": "gather",
    "scatter_": "scatter", "barrier": "barrier", "monitored_barrier_": "monitored_barrier",
    "send": "send", "recv_": "recv", "recv_any_source_": "recv_anysource",
}


class CountC10dOps(TorchDispatchMode):
    """Counts the process-group ops a rank issues, as torch's dispatcher sees them: every
    ProcessGroup method (Python API, DDP's C++ reducer) goes through a c10d op. Under
    distdoctor the group calls its backend directly, so this counts only in bare runs."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d":
            self.counts[C10D_OPS.get(func._opname, func._opname)] += 1
        return func(*args, **(kwargs or {}))


class TestGloo(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def run_test(self, test_name, parent_pipe):
        """In each rank. With DIST_SUITE_RECORD=DIR, writes DIR/TEST.rankR.json: the
        rank's pid (to find its trace) and, with DIST_SUITE_COUNT=1, its op counts."""
        out = os.environ.get("DIST_SUITE_RECORD")
        if not out:
            return super().run_test(test_name, parent_pipe)
        counter = CountC10dOps() if os.environ.get("DIST_SUITE_COUNT") == "1" else None
        try:
            if counter is None:
                super().run_test(test_name, parent_pipe)
            else:
                with counter:
                    super().run_test(test_name, parent_pipe)
        finally:  # also when the test exits (failure, skip)
            record = {"test": test_name, "rank": self.rank, "pid": os.getpid(),
                      "counts": None if counter is None else dict(counter.counts)}
            with open(os.path.join(out, f"{test_name}.rank{self.rank}.json"), "w") as fh:
                json.dump(record, fh)


if __name__ == "__main__":
    from harness import CI_COUNTS  # beside this file

    names = sys.argv[1:] or list(CI_COUNTS)
    suite = unittest.TestSuite(TestGloo(name) for name in names)
    sys.exit(0 if unittest.TextTestRunner(verbosity=2).run(suite).wasSuccessful() else 1)
