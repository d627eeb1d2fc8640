"""CUDA errors that take a job down from one rank: a kernel's device-side assert (with the
`Assertion ... failed` lines the kernel printed), an illegal memory access, an unspecified
launch failure, cuBLAS/cuDNN status errors, a missing kernel image; and a C-level assert
that aborted a process. Raised in a Python traceback, or thrown out of a C++ thread (the
NCCL watchdog's "terminated with exception: CUDA error: ...", `terminate called ... what():`).

They are exceptions on a rank (family "exception"), named by the CUDA error they carry.

Formats: c10/cuda/CUDAException.cpp (2.0-2.13: "CUDA error: <cudaGetErrorString>" and its
hint lines), aten/src/ATen/cuda/CUDABlas.cpp ("CUBLAS_STATUS_* when calling `...`"), ATen's
device asserts ("file.cu:N: kernel: block: [x,y,z], thread: [x,y,z] Assertion `e` failed."),
glibc's assert ("prog: file:N: func: Assertion `e' failed.").
"""

from __future__ import annotations

import re

from distdoctor.findings import Finding
from distdoctor.logs.lines import LogLine
from distdoctor.logs.problems import Problem, clip, plural, ranks_text, short_path
from distdoctor.logs.signals import CAUSE, Family, Signal, then

NAME = "exception"
RULE = "cuda_error"

_KNOWN = (r"device-side assert triggered|an illegal memory access was encountered|unspecified "
          r"launch failure|misaligned address|an illegal instruction was encountered|"
          r"uncorrectable ECC error encountered|no kernel image is available for execution on "
          r"the device|invalid device ordinal|CUDA-capable device\(s\) is/are busy or "
          r"unavailable|operation not permitted when stream is capturing")
_ERROR = re.compile(rf"CUDA error: (?P<kind>{_KNOWN})|(?P<blas>CUBLAS_STATUS_[A-Z_]+|"
                    rf"CUDNN_STATUS_[A-Z_]+)")
# another CUDA error text only where an error is raised or thrown, not in a sentence
_OTHER = re.compile(r"(?:^|Error: |[Ee]xception: |what\(\):\s+|\] )CUDA error: "
                    r"(?P<kind>[a-z][^.`\n]{2,80}?)(?=\s*(?:\.|$|when |\(|CUDA kernel))")
# (the file starts where a path starts, and the expression stops at its closing quote: a
# line of dots, or of the head repeated, is read once)
_DEVICE_ASSERT = re.compile(
    r"(?<![\w./-])(?P<file>[\w./-]+\.cuh?):(?P<line>\d+): (?P<kernel>[^:\n]+?): block: "
    r"\[[\d,]+\], thread: \[[\d,]+\] Assertion `(?P<expr>[^`\n]+)` failed")
_C_ASSERT = re.compile(r"^(?P<prog>[\w./-]+): (?P<file>[\w./-]+):(?P<line>\d+): "
                       r"(?P<func>[^:\n]+): Assertion `(?P<expr>.+)' failed\.?\s*$")

# what a failed device assert usually means, by the expression ATen checks
_ASSERT_MEANS = (
    (re.compile(r"t >= 0 && t < n_classes|" + then("target") + r"(?:n_classes|"
                r"num_classes)|cur_target"),
     "a class label outside [0, num_classes) in the loss's targets"),
    (re.compile(r"srcIndex < srcSelectDimSize|index out of bounds|idx_dim|-sizes\[i\] <= "
                r"index && index < sizes\[i\]"),
     "an index out of range (often a token id >= the embedding's vocabulary size)"),
    (re.compile(r"input_val >= zero && input_val <= one|input >= 0\. && input <= 1\."),
     "a BCE input outside [0, 1] (pass logits to BCEWithLogitsLoss instead)"),
)

_REMEDY = {
    "device-side assert triggered": (
        "A kernel's own check failed (the `Assertion` line says which). Rerun with "
        "CUDA_LAUNCH_BLOCKING=1 to get the failing op's line, or the same batch on CPU for a "
        "plain Python error; check that labels are in [0, num_classes) and token ids below "
        "the vocabulary size (resize the embeddings after adding tokens)."),
    "an illegal memory access was encountered": (
        "A kernel read or wrote outside its memory: rerun with CUDA_LAUNCH_BLOCKING=1 (and "
        "`compute-sanitizer` on one rank) to find the op; usually a custom or fused kernel "
        "(flash-attn, apex, Triton, DeepSpeed ops) built for another torch/CUDA version, or "
        "an index out of range; if it follows one GPU or node, check `dmesg` for Xid errors."),
    "unspecified launch failure": (
        "Usually the GPU or its driver failed (look for Xid 13/31/43/79 in `dmesg -T` on "
        "that node; drain or reset the GPU), sometimes a kernel fault: rerun with "
        "CUDA_LAUNCH_BLOCKING=1."),
    "uncorrectable ECC error encountered": (
        "A GPU memory fault: drain that node, reset the GPU (`nvidia-smi -r`) and have it "
        "checked; `distdoctor check` reports ECC and remapping errors."),
    "no kernel image is available for execution on the device": (
        "This torch build has no kernels for this GPU's architecture: install a build for "
        "its compute capability (`torch.cuda.get_arch_list()` against "
        "`torch.cuda.get_device_capability()`)."),
    "invalid device ordinal": (
        "A rank asked for a GPU that is not visible: --nproc-per-node must not exceed the "
        "GPUs in CUDA_VISIBLE_DEVICES; call torch.cuda.set_device(LOCAL_RANK)."),
}
_BLAS_REMEDY = (
    "cuBLAS/cuDNN failed inside a kernel call: NOT_INITIALIZED or ALLOC_FAILED is almost "
    "always the GPU out of memory when the handle is made (lower the batch, check what else "
    "holds the GPU); EXECUTION_FAILED or INVALID_VALUE often follow an earlier asynchronous "
    "error (rerun with CUDA_LAUNCH_BLOCKING=1) or a shape/dtype the library cannot take, "
    "and sometimes a torch build for another CUDA version.")
_C_ASSERT_REMEDY = (
    "A C/C++ assert in the process failed and aborted it (SIGABRT): the expression and file "
    "say which library; a version mismatch between native extensions and torch is a "
    "common cause.")
_DEFAULT_REMEDY = ("A CUDA call failed on that rank: rerun with CUDA_LAUNCH_BLOCKING=1 to "
                   "find the op, and check `nvidia-smi` and `dmesg` for Xid errors.")


class CudaErrors(Family):
    name = "cuda"
    anchors = (b"CUDA error: ", b"CUBLAS_STATUS_", b"CUDNN_STATUS_", b"Assertion `")

    def feed(self, line: LogLine) -> list[Signal]:
        text = line.text
        if "Assertion `" in text:
            if m := _DEVICE_ASSERT.search(text):
                return [Signal(RULE, NAME, CAUSE, line, {
                    "cuda": "device-side assert triggered", "assert": m["expr"][:200],
                    "kernel": m["kernel"].strip()[:120],
                    "at": f"{short_path(m['file'])}:{m['line']}"})]
            if m := _C_ASSERT.match(text.strip()):
                return [Signal("c_assert", NAME, CAUSE, line, {
                    "assert": m["expr"][:200], "func": m["func"].strip()[:120],
                    "at": f"{short_path(m['file'])}:{m['line']}", "prog": m["prog"]})]
            return []
        if "out of memory" in text:
            return []
        m = _ERROR.search(text)
        if m is None and line.level not in ("W", "WARNING", "I", "INFO"):
            m = _OTHER.search(text)
        if m is None:
            return []
        kind = (m["kind"] or m.groupdict().get("blas") or "").strip()
        return [Signal(RULE, NAME, CAUSE, line, {"cuda": kind})]


def describe(p: Problem, ctx) -> Finding:
    """One rank's CUDA error (or the same one on several), with the assert that caused it."""
    from distdoctor.logs import remedies as R
    from distdoctor.logs.families.launcher import how_it_ended

    ranks = sorted(p.ranks)
    f = p.fields()
    where = f.get("where") or {}
    if p.rule == "c_assert":
        what = f"a C assert failed and aborted the process: `{f.get('assert')}` in " \
               f"{f.get('func')} ({f.get('at')})"
        remedy = _C_ASSERT_REMEDY
    else:
        kind = p.key[1] if len(p.key) > 1 else f.get("cuda", "?")
        what = f"CUDA error: {kind}"
        expr = f.get("assert")
        if expr:
            meaning = next((m for rx, m in _ASSERT_MEANS if rx.search(expr)), None)
            what += (f" (the kernel {f.get('kernel', '?')} at {f.get('at')} asserted "
                     f"`{clip(expr, 80)}`" + (f": {meaning})" if meaning else ")"))
        remedy = _REMEDY.get(kind, _BLAS_REMEDY if "_STATUS_" in kind else _DEFAULT_REMEDY)
    at = (f" at {short_path(where['file'])}:{where['line']} in {where['function']}"
          if where.get("file") else "")
    ended = [ctx.exits[r] for r in ranks if r in ctx.exits]
    how = f" and {how_it_ended(ended[0])}" if ended else ""
    who = f"rank{plural(ranks)} {ranks_text(ranks)}: " if ranks else ""
    fnd = ctx.finding(p, "crash", "error", f"{who}{what}{at}{how}", ranks,
                      remedy or R.EXCEPTION)
    fnd.details["family"] = NAME
    for k in ("cuda", "assert", "kernel", "at"):
        if f.get(k):
            fnd.details[k] = f[k]
    if where.get("file"):
        fnd.callsites = [{"rank": r, **where} for r in ranks[:8]]
    return fnd
