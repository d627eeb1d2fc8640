"""Recorded scenarios (scenarios.py) that take a closer reading: long serial work on one rank
(a progress bar its only sign), the culprit named only in the victims' own frames, native
and CPU-side asserts, a network interface the node lacks."""

from scenario_spec import Scenario, crash, torchrun

SUBTLE = [
    # 10. long serial work on one rank
    Scenario(
        "serial_work_rank0",
        torchrun(4, "serial_work"),
        "Rank 0 tokenizes a dataset alone (a `\\r` progress bar on stderr) for 10 s; ranks 1, "
        "2, 3 time out after 3 s in the second all_reduce; rank 0 never reports the timeout "
        "before torchrun stops it.",
        crash("serial_work", [0], ["tokenizer"], kind="hang"),
        must=("Running tokenizer", "Timed out waiting"),
        must_not=("[rank0]: RuntimeError",),
    ),
    # 12. evidence in the victims' own frames; native and CPU-side asserts; a bad interface
    Scenario(
        "gloo_recv_peer_exits",
        torchrun(4, "recv_peer_exits"),
        "Rank 0 feeds ranks 1 and 2 with dist.send, then leaves quietly (exit 0) while they "
        "wait in `dist.recv(buf, 0)`: both fail with Gloo 'Connection closed by peer'; rank 3 "
        "works on until torchrun stops it. The victims' frames name rank 0.",
        crash("gloo", [0], ["rank 0"], kind="comm_error"),
        must=("Connection closed by peer", "leaving"),
    ),
    Scenario(
        "c_assert_rank2",
        torchrun(4, "c_assert --victim 2"),
        "Rank 2 fails a C-level assert in native code (glibc: \"Assertion `buf->size <= "
        "buf->cap' failed.\") and aborts (SIGABRT, no traceback); the others wait in their "
        "next all_reduce.",
        crash("exception", [2], ["buf->size <= buf->cap"]),
        must=("Assertion", "SIGABRT"),
    ),
    Scenario(
        "cpu_target_out_of_range",
        torchrun(2, "cpu_target_out_of_range --victim 1"),
        "Rank 1's batch holds a class label equal to the number of classes: on CPU "
        "cross_entropy raises IndexError at once (the CPU side of a device-side assert).",
        crash("exception", [1], ["IndexError"]),
        must=("out of bounds",),
    ),
    Scenario(
        "gloo_bad_ifname",
        torchrun(2, "init_only"),
        "GLOO_SOCKET_IFNAME=nosuchif0 names no interface of this host: every rank fails in "
        "init_process_group (gloo's 'Unable to find address for: nosuchif0').",
        crash("gloo", None, ["GLOO_SOCKET_IFNAME", "nosuchif0"], ["GLOO_SOCKET_IFNAME"],
              kind="comm_error"),
        env={"GLOO_SOCKET_IFNAME": "nosuchif0"},
        must=("Unable to find address for: nosuchif0",),
    ),
]
