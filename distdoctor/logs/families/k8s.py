"""Kubernetes and Kubeflow: what a pod's status and a training job's conditions say, as users
paste them beside the logs (`kubectl describe pod`, `kubectl get pytorchjob -o yaml`).

- a container OOMKilled (its memory limit, exit code 137): the cgroup's OOM killer, which
  the ranks' own output never shows;
- a pod Evicted because its node ran low on a resource;
- a PyTorchJob / TrainJob / MPIJob marked failed "because N Worker replica(s) failed": the
  operator's summary of a failure elsewhere (a consequence, never the cause).

(`kubectl logs --prefix`'s `[pod/NAME/CONTAINER] ` heads are peeled in lines.py: the pod is
the line's host.)

Formats: kubernetes 1.30 `kubectl describe pod` (State: Terminated / Reason: OOMKilled / Exit
Code: 137, "The node was low on resource: memory."), kubeflow/training-operator 1.8
pkg/controller.v1/common/job.go ("%s %s/%s is failed because %d %s replica(s) failed.").
"""

from __future__ import annotations

from distdoctor.findings import Finding
from distdoctor.logs.problems import Problem, on
from distdoctor.logs.signals import CAUSE, VICTIM, Family, rule

NAME = "k8s"

RULES = (
    rule("oom_killed", NAME, CAUSE, r"(?:^|\s|[\"'=:])OOMKilled\b"),
    rule("evicted", NAME, CAUSE, r"The node was low on resource: (?P<resource>[\w-]+)"),
    rule("job_failed", NAME, VICTIM,
         r"(?P<kind>PyTorchJob|TrainJob|MPIJob|JobSet|TFJob|XGBoostJob) (?P<job>\S+) is failed "
         r"because (?P<n>\d+) (?P<role>\w+) replica\(s\) failed", ints=("n",)),
)


class K8sFamily(Family):
    name = NAME
    orchestrator = True
    anchors = (b"OOMKilled", b"low on resource", b"replica(s) failed")
    rules = RULES


_OOM_REMEDY = ("The container passed its memory limit and the kernel killed it (exit code "
               "137): raise `resources.limits.memory` for the pod, or lower host memory use "
               "(DataLoader workers, pinned memory, a dataset held in RAM per rank); give "
               "/dev/shm its own memory-backed emptyDir if NCCL or DataLoader workers use it.")
_EVICTED_REMEDY = ("The kubelet evicted the pod to save its node: set requests equal to limits "
                   "(Guaranteed QoS) and check what else runs on that node.")
VICTIMS = {"job_failed": "the training operator marked the job failed"}


def describe(p: Problem, ctx) -> Finding:
    ranks = sorted(p.ranks)
    hosts = sorted(p.hosts)
    pod = f" (pod {', '.join(hosts)})" if hosts else ""
    if p.rule == "oom_killed":
        fnd = ctx.finding(p, "crash", "error", f"Kubernetes killed a container{on(ranks)}{pod} "
                          f"for passing its memory limit (OOMKilled, exit code 137)", ranks,
                          _OOM_REMEDY)
        fnd.details["family"] = "oom"
        return fnd
    res = p.first.fields.get("resource", "a resource")
    return ctx.finding(p, "crash", "error", f"Kubernetes evicted a pod{pod}: its node was low on "
                       f"{res}", ranks, _EVICTED_REMEDY)


def victim_culprit(p: Problem, ctx) -> Finding | None:
    """The operator's summary alone: say it, and where the cause is."""
    f = p.first.fields
    return ctx.finding(p, "crash", "error", f"{f.get('kind')} {f.get('job')} failed because "
                       f"{f.get('n')} {f.get('role')} replica(s) failed; the cause is in that "
                       f"replica's own log (`kubectl logs --previous`) or its pod's status", [],
                       "Read the failed replica's log and `kubectl describe pod` (Reason, Exit "
                       "Code) for the first failure.")
