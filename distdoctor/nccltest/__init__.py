"""`distdoctor nccl-test`: a collective bandwidth sweep that reads like nccl-tests.

Layout (each module small, torch imported only where tensors are made):

- `options`: validated settings, size parsing (K/M/G) and size stepping, dtype/redop names.
- `ops`: the op table: per-rank counts, in/out-of-place support, algbw and busbw.
- `verify`: deterministic per-rank inputs, expected results, wrong-element counting.
- `collectives`: buffers and the torch.distributed call of each op, per place.
- `bench`: the per-rank timing/check loop (warm-up, barrier, back-to-back, wait, combine).
- `pairwise`, `pairwise_report`: every pair's send/recv bandwidth and latency, and the
  slow-pair analysis.
- `split`: parallel groups per node, per rail or by an NCCL_TESTS_SPLIT-style rule.
- `report`: nccl-tests' table and footer, and the JSON, CSV and plot twins.
- `peak`: the NVLink peak of a GPU from NVML.
- `worker`: one rank's entry point; `launch`: `--nproc N` local ranks.

Layer: front ends (tests/test_layers.py). May import the launcher (`--nproc N`) and the
base modules; it shares nothing with the tracer or the detectors.
"""
