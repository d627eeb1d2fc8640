"""The live path's optional parts, each None where its package is not installed: the
node's probe sampler, a viewer's reader of the owner's probe files, the reader of the
ranks' progress (/proc), the throttle detector and the job-output scanner."""

from __future__ import annotations


def start_sampler(run_dir, rank_pids):
    """The node's probe sampler (host, rank processes, GPUs) at 1 Hz, if the probes are
    installed; None otherwise. Its samples go to RUN_DIR/probes/."""
    try:
        from distdoctor.probes.sampler import Sampler

        return Sampler(run_dir, rank_pids).start()
    except Exception:
        return None


def progress_reader():
    try:
        from distdoctor.probes.progress import ProgressReader
    except ImportError:
        return None
    return ProgressReader()


def sample_tail(run_dir):
    try:
        from distdoctor.probes.sampler import SampleTail
    except ImportError:
        return None
    return SampleTail(run_dir)


def gpu_findings_fn():
    """throttle findings from probe samples, joined to the stragglers (throttle.py: it
    reads the probes' GPU readings)."""
    try:
        from distdoctor.diagnosis.stragglers.throttle import join_with_straggler, throttle_findings
    except ImportError:
        return None

    def gpu_findings(samples, stragglers):
        return join_with_straggler(throttle_findings(samples), stragglers)

    return gpu_findings


def log_scanner():
    try:
        from distdoctor.logs.scanner import LogScanner
    except ImportError:
        return None
    return LogScanner()
