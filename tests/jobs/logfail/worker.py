"""Small distributed jobs that fail the ways real jobs fail, on CPU/gloo, in a few seconds.

One scenario per function; `record.py` runs each under torchrun and keeps what torch printed
as a fixture in tests/fixtures/logs/real/. Run one by hand:

    torchrun --nproc-per-node 4 tests/jobs/logfail/worker.py sigkill --victim 2

Every collective and store wait uses a 3 s timeout (the process group's), so a rank that
never arrives turns into an error quickly; a scenario that waits on purpose sleeps at most a
few seconds. Nothing here writes to disk except torchrun's own error files.
"""

import argparse
import datetime
import os
import signal
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

TIMEOUT = datetime.timedelta(seconds=3)


def init() -> int:
    dist.init_process_group("gloo", timeout=TIMEOUT)
    return dist.get_rank()


def steps(n: int, rank: int, fail_at: int, fail) -> None:
    """`n` steps of one all_reduce each; `fail()` runs on `rank` at step `fail_at`."""
    for step in range(n):
        if dist.get_rank() == rank and step == fail_at:
            fail()
        t = torch.ones(1000)
        dist.all_reduce(t)
        if dist.get_rank() == 0:
            print(f"step {step} sum {t[0].item():.0f}", flush=True)
        time.sleep(0.2)


def sigkill(args) -> None:
    init()
    steps(6, args.victim, 2, lambda: os.kill(os.getpid(), signal.SIGKILL))


def raise_then_kill(args) -> None:
    """Rank `raiser` raises at step 1; rank `victim` is SIGKILLed a second later, while
    torchrun (a long --monitor-interval) has not yet noticed the first failure."""
    rank = init()
    dist.all_reduce(torch.ones(4))
    if rank == args.raiser:
        raise RuntimeError(f"rank {rank}: checkpoint shard is corrupt (simulated)")
    if rank == args.victim:
        time.sleep(1.5)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(8)  # the others are busy elsewhere, then stopped by torchrun


def oom_kill(args) -> None:
    """Rank `victim` grows its memory until something outside it sends SIGKILL, as the
    kernel's OOM killer does: no traceback, no message from the process itself."""
    rank = init()
    dist.all_reduce(torch.ones(4))
    if rank == args.victim:
        # the "OOM killer": a sibling process that kills this rank from outside
        subprocess.Popen(["sh", "-c", f"sleep 1.5; kill -9 {os.getpid()}"])
        hoard = []
        for _ in range(60):  # at most 60 x 4 MiB
            hoard.append(torch.ones(1 << 20))
            time.sleep(0.05)
        time.sleep(10)
    dist.all_reduce(torch.ones(4))  # the others wait here for the rank that was killed


class Net(torch.nn.Module):
    def __init__(self, with_unused: bool = False):
        super().__init__()
        self.encoder = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 2)
        self.aux_head = torch.nn.Linear(8, 2) if with_unused else None
        self.raise_on_rank = -1

    def forward(self, x):
        if dist.get_rank() == self.raise_on_rank:
            raise ValueError(f"input batch has {x.shape[1]} features, the model expects 9")
        return self.head(torch.relu(self.encoder(x)))


def train(model, n_steps: int) -> None:
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(n_steps):
        loss = ddp(torch.randn(16, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if dist.get_rank() == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        if step == 1:
            model.raise_on_rank = args_global.victim


def ddp_raise(args) -> None:
    init()
    torch.manual_seed(0)
    train(Net(), 4)


def ddp_unused(args) -> None:
    init()
    torch.manual_seed(0)
    args.victim = -1
    train(Net(with_unused=True), 3)


def ddp_model_mismatch(args) -> None:
    """Rank `victim` builds its model with one more layer: DDP's start-up check fails."""
    rank = init()
    torch.manual_seed(0)
    model = Net(with_unused=rank == args.victim)
    torch.nn.parallel.DistributedDataParallel(model)


def healthy(args) -> None:
    rank = init()
    torch.manual_seed(rank)
    args.victim = -1
    train(Net(), 5)
    dist.barrier()
    if rank == 0:
        print("training done", flush=True)
    dist.destroy_process_group()


def mismatch_op(args) -> None:
    rank = init()
    dist.all_reduce(torch.ones(4))
    t = torch.ones(4)
    if rank == args.victim:
        dist.broadcast(t, src=0)
    else:
        dist.all_reduce(t)


def mismatch_shape(args) -> None:
    rank = init()
    dist.all_reduce(torch.ones(4))
    dist.all_reduce(torch.ones(5 if rank == args.victim else 4))


def monitored_barrier(args) -> None:
    rank = init()
    dist.all_reduce(torch.ones(4))
    if rank == args.victim:
        time.sleep(6)  # "loading a checkpoint": never reaches the barrier in time
        return
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=2))


def gloo_skip(args) -> None:
    """Rank `victim` skips one all_reduce (an uneven last batch) and moves on to the next."""
    rank = init()
    dist.all_reduce(torch.ones(4))
    if rank != args.victim:
        dist.all_reduce(torch.ones(4))
    time.sleep(5)
    dist.all_reduce(torch.ones(4))


def peer_exits(args) -> None:
    """Rank `victim` leaves cleanly (destroy_process_group, exit code 0) a second after the
    others entered an all_reduce. With --early it leaves at once, without destroying the
    group, while the others are still busy before that all_reduce."""
    rank = init()
    dist.all_reduce(torch.ones(4))
    if rank == args.victim:
        time.sleep(0 if args.early else 1)
        print(f"rank {rank}: no more data, leaving", flush=True)
        if not args.early:
            dist.destroy_process_group()
        return
    time.sleep(0.5 if args.early else 0)
    dist.all_reduce(torch.ones(4))


def recv_peer_exits(args) -> None:
    """Rank 0 feeds ranks 1 and 2 with point-to-point sends, then leaves (exit 0, "no more
    data") while they wait in `dist.recv(buf, 0)`; rank 3 works on alone until torchrun stops
    it. The victims' own frames name the peer they lost."""
    rank = init()
    buf = torch.zeros(4)
    for step in range(3):
        if rank == 0:
            if step == 2:
                print("rank 0: no more data, leaving", flush=True)
                os._exit(0)
            dist.send(torch.full((4,), float(step)), 1)
            dist.send(torch.full((4,), float(step)), 2)
        elif rank in (1, 2):
            dist.recv(buf, 0)
        else:
            time.sleep(1)
    time.sleep(6)


def c_assert(args) -> None:
    """Rank `victim` fails a C-level assert in native code (glibc's __assert_fail, as an
    extension's assert() does): "Assertion `...' failed." and SIGABRT, no traceback."""
    import ctypes

    rank = init()
    dist.all_reduce(torch.ones(4))
    if rank == args.victim:
        libc = ctypes.CDLL(None)
        libc.__assert_fail(b"buf->size <= buf->cap", b"ringbuf.c", 88, b"ring_push")
    dist.all_reduce(torch.ones(4))


def cpu_target_out_of_range(args) -> None:
    """Rank `victim`'s batch holds a class label equal to the number of classes: on CPU the
    loss raises at once (on a GPU the same bug is a device-side assert)."""
    rank = init()
    logits = torch.randn(8, 5)
    target = torch.randint(0, 5, (8,))
    if rank == args.victim:
        target[3] = 5
    loss = torch.nn.functional.cross_entropy(logits, target)
    dist.all_reduce(loss.detach())


def init_only(args) -> None:
    """Only init_process_group: what the environment does to it (GLOO_SOCKET_IFNAME)."""
    init()
    dist.destroy_process_group()


def store_port_in_use(args) -> None:
    """MASTER_PORT is taken by another process (record.py holds it)."""
    init()


def store_no_server(args) -> None:
    """Rank 1 of 2 alone: the store at MASTER_ADDR:MASTER_PORT has no server."""
    init()


def store_new_group(args) -> None:
    """Rank `victim` never calls new_group: the others wait in the store for its key."""
    rank = init()
    dist.all_reduce(torch.ones(4))
    if rank == args.victim:
        time.sleep(6)
        return
    group = dist.new_group([0, 1, 2, 3], timeout=TIMEOUT)
    dist.all_reduce(torch.ones(4), group=group)


def store_get(args) -> None:
    """Rank 0 waits for a key that rank 1 was to publish (its address) and never did."""
    rank = init()
    store = dist.distributed_c10d._get_default_store()
    store.set_timeout(datetime.timedelta(seconds=3))
    dist.all_reduce(torch.ones(4))
    if rank == 0:
        addr = store.get("rank1/inference_server_addr")
        print(addr, flush=True)
    else:
        time.sleep(6)


def serial_work(args) -> None:
    """Rank 0 tokenizes a dataset alone (a tqdm-style bar on stderr, `\\r` between updates)
    for longer than the process group's timeout; the others wait in an early all_reduce."""
    rank = init()
    dist.all_reduce(torch.ones(4))
    if rank == 0:
        total = 1000
        start = time.time()
        for done in range(0, total + 1, 25):
            pct = done * 100 // total
            bar = "#" * (pct // 10) + " " * (10 - pct // 10)
            el = time.time() - start
            rate = done / el if el > 0 else 0.0
            sys.stderr.write(
                f"\rRunning tokenizer on dataset: {pct:3d}%|{bar}| {done}/{total}"
                f" [00:{int(el):02d}<00:{int((total - done) / rate) if rate else 0:02d},"
                f" {rate:6.2f} examples/s]"
            )
            sys.stderr.flush()
            time.sleep(0.25)
        sys.stderr.write("\n")
    dist.all_reduce(torch.ones(4))


SCENARIOS = {
    f.__name__: f
    for f in [
        sigkill,
        raise_then_kill,
        oom_kill,
        ddp_raise,
        ddp_unused,
        ddp_model_mismatch,
        healthy,
        mismatch_op,
        mismatch_shape,
        monitored_barrier,
        gloo_skip,
        peer_exits,
        store_port_in_use,
        store_no_server,
        store_new_group,
        store_get,
        serial_work,
        recv_peer_exits,
        c_assert,
        cpu_target_out_of_range,
        init_only,
    ]
}


def main() -> None:
    global args_global
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--victim", type=int, default=1)
    parser.add_argument("--raiser", type=int, default=3)
    parser.add_argument("--early", action="store_true")
    args_global = parser.parse_args()
    SCENARIOS[args_global.scenario](args_global)


args_global = None

if __name__ == "__main__":
    # LOGFAIL_RECORD=1: main under torchelastic's @record, so a failing rank writes an error
    # file and torchrun's failure table carries its traceback and timestamp
    (record(main) if os.environ.get("LOGFAIL_RECORD") == "1" else main)()
