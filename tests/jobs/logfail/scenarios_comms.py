"""Recorded scenarios (scenarios.py): ranks that disagree or lose each other, as torch's own
checks report it: DETAIL mode's mismatch report, monitored_barrier, DDP's checks, gloo's
timeouts and lost peers, the c10d store and rendezvous."""

from scenario_spec import TORCHRUN, WORKER, Scenario, crash, torchrun

COMMS = [
    # 5. DETAIL mode's own mismatch report
    Scenario(
        "detail_mismatch_op",
        torchrun(4, "mismatch_op --victim 1"),
        "TORCH_DISTRIBUTED_DEBUG=DETAIL: rank 1 called broadcast while ranks 0, 2, 3 called "
        "all_reduce.",
        crash("mismatch", [1], ["broadcast"], kind="mismatch"),
        env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
        must=("Detected mismatch between collectives", "BROADCAST"),
    ),
    Scenario(
        "detail_mismatch_shape",
        torchrun(4, "mismatch_shape --victim 1"),
        "TORCH_DISTRIBUTED_DEBUG=DETAIL: rank 1 all_reduced a tensor of shape [5] where the "
        "others used [4].",
        crash("mismatch", [1], ["shape"], kind="mismatch"),
        env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
        must=("Detected mismatch between collectives", "TensorShape=[5]"),
    ),
    # 6. monitored_barrier
    Scenario(
        "monitored_barrier_rank2",
        torchrun(4, "monitored_barrier --victim 2"),
        "Rank 2 was busy for 6 s and never reached monitored_barrier (timeout 2 s); rank 0 "
        "reports it.",
        crash("mismatch", [2], ["monitoredBarrier"], kind="hang"),
        must=("Rank 2 failed to pass monitoredBarrier",),
    ),
    # 7. DDP unused parameters
    Scenario(
        "ddp_unused",
        torchrun(2, "ddp_unused"),
        "A DDP model has a parameter (aux_head) its forward never uses, without "
        "find_unused_parameters: the second iteration fails on every rank with 'Expected to "
        "have finished reduction in the prior iteration' (indices 4 and 5 listed).",
        crash("ddp", None, ["find_unused_parameters"], ["find_unused_parameters=True"]),
        must=("Expected to have finished reduction", "indices"),
    ),
    Scenario(
        "ddp_detail_segfault",
        torchrun(2, "ddp_unused"),
        "With TORCH_DISTRIBUTED_DEBUG=DETAIL, constructing DistributedDataParallel on gloo/CPU "
        "segfaults on both ranks (torch 2.13.0+cpu; no traceback, exit code -11); the unused "
        "parameter is never reached.",
        crash("launcher", [0, 1], ["SIGSEGV"]),
        env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
        note="PYTHONFAULTHANDLER=1 shows the fault in the DDP constructor (worker.py, train). "
        "A healthy DDP run under DETAIL crashes the same way here.",
        must=("(SIGSEGV)",),
    ),
    Scenario(
        "ddp_unused_info",
        torchrun(2, "ddp_unused"),
        "As ddp_unused with TORCH_DISTRIBUTED_DEBUG=INFO.",
        crash("ddp", None, ["aux_head.weight"], ["find_unused_parameters=True"]),
        env={"TORCH_DISTRIBUTED_DEBUG": "INFO"},
        must=("Expected to have finished reduction", "aux_head.weight"),
    ),
    Scenario(
        "ddp_model_mismatch",
        torchrun(2, "ddp_model_mismatch --victim 1"),
        "Rank 1 built its model with an extra layer: DistributedDataParallel's start-up check "
        "across ranks fails on every rank.",
        crash("ddp", None, ["DDP model differs"], kind="mismatch"),
        must=("DDP expects same model across all ranks",),
    ),
    # 8. gloo timeouts and lost peers
    Scenario(
        "gloo_timeout_rank3",
        torchrun(4, "gloo_skip --victim 3"),
        "Rank 3 skipped an all_reduce (then slept); ranks 0, 1, 2 time out in Gloo after 3 s.",
        crash("gloo", [3], ["timed out"], kind="hang"),
        must=("Timed out waiting",),
    ),
    Scenario(
        "gloo_timeout_rank3_filter0",
        torchrun(4, "gloo_skip --victim 3", launcher="--local-ranks-filter 0"),
        "As gloo_timeout_rank3 shown through `--local-ranks-filter 0`: only rank 0's output "
        "is on the terminal, so the log cannot tell which rank never arrived.",
        crash("gloo", [], ["timed out"], kind="hang"),
        must=("[rank0]: RuntimeError",),
        must_not=("[rank1]",),
    ),
    Scenario(
        "gloo_timeout_rank3_redirects",
        torchrun(4, "gloo_skip --victim 3", launcher="--redirects 3 --log-dir {log_dir}"),
        "As gloo_timeout_rank3 with `--redirects 3 --log-dir`: the terminal has only "
        "torchrun's lines; each rank's stderr is its own file (rank 3's is empty and absent).",
        crash("gloo", [3], ["timed out"], kind="hang"),
        must=("FAILED",),
    ),
    Scenario(
        "gloo_peer_exits",
        torchrun(4, "peer_exits --victim 2"),
        "Rank 2 left cleanly (destroy_process_group, exit code 0) while ranks 0, 1, 3 waited "
        "for it in an all_reduce: they fail with Gloo 'Connection closed by peer'. Rank 2 "
        "prints no error; torchrun's root cause is a victim, and rank 2 is listed at most as "
        "SIGTERMed (when torchrun caught it still exiting).",
        crash("gloo", [2], ["peer"], kind="comm_error"),
        must=("Connection closed by peer", "leaving"),
    ),
    Scenario(
        "gloo_peer_exits_early",
        torchrun(4, "peer_exits --victim 2 --early"),
        "Rank 2 returned from main right after the first all_reduce, without "
        "destroy_process_group (exit code 0), while the others were still busy before the "
        "next one: they fail in it with Gloo 'Connection closed by peer' or 'Connection reset "
        "by peer'; torchrun's root cause is a victim.",
        crash("gloo", [2], ["peer"], kind="comm_error"),
        note="Exiting without destroy_process_group sometimes ends in 'terminate called "
        "without an active exception' and SIGABRT (exit -6) on this machine (see "
        "raise_then_kill.log); not in every run.",
        must=("by peer", "leaving"),
    ),
    # 9. c10d store and rendezvous
    Scenario(
        "store_port_in_use",
        torchrun(2, "store_port_in_use"),
        "MASTER_PORT was already taken by another process: torchrun's TCPStore server fails "
        "to listen (EADDRINUSE).",
        crash("store", [], ["{port}"], ["MASTER_PORT"], kind="comm_error"),
        hold_port=True,
        must=("EADDRINUSE",),
    ),
    Scenario(
        "store_port_in_use_python",
        f"python {WORKER} store_port_in_use",
        "Plain python with env:// (RANK 0 of 2): MASTER_PORT already taken, the store server "
        "fails to listen.",
        crash("store", [0], ["{port}"], ["MASTER_PORT"], kind="comm_error"),
        env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "{port}", "RANK": "0", "WORLD_SIZE": "2"},
        hold_port=True,
        must=("EADDRINUSE",),
    ),
    Scenario(
        "store_client_timeout",
        f"python {WORKER} store_no_server",
        "Rank 1 of 2 started alone (plain python, env://): nobody listens at "
        "MASTER_ADDR:MASTER_PORT, the client socket times out after 3 s.",
        crash("store", [], ["127.0.0.1", "{port}"], kind="comm_error"),
        env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "{port}", "RANK": "1", "WORLD_SIZE": "2"},
        must=("client socket has timed out",),
    ),
    Scenario(
        "store_clients_joined",
        f"python {WORKER} store_no_server",
        "Rank 0 of 2 started alone (plain python, env://): its store server times out after "
        "3 s waiting for clients, 1/2 joined.",
        crash("store", [1], ["1/2"], kind="comm_error"),
        env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "{port}", "RANK": "0", "WORLD_SIZE": "2"},
        must=("1/2 clients joined",),
    ),
    Scenario(
        "rdzv_c10d_no_server",
        f"{TORCHRUN} --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint "
        f"127.0.0.1:{{port}} --rdzv-conf is_host=false,join_timeout=5,read_timeout=3 {WORKER} healthy",
        "torchrun on a second node: the c10d rendezvous endpoint has no store server "
        "listening (the first node never started).",
        crash("store", [], ["RendezvousConnectionError"], kind="comm_error"),
        timeout=90,
        must=("RendezvousConnectionError",),
    ),
    Scenario(
        "rdzv_c10d_timeout",
        f"{TORCHRUN} --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint "
        f"127.0.0.1:{{port}} --rdzv-conf join_timeout=5 {WORKER} healthy",
        "torchrun of a 2-node job started on one node only: the second node never joins and "
        "the rendezvous times out after 5 s.",
        crash("store", [], ["RendezvousTimeoutError"], kind="comm_error"),
        timeout=90,
        must=("RendezvousTimeoutError",),
    ),
    Scenario(
        "rdzv_static_node_missing",
        f"{TORCHRUN} --nnodes 2 --node-rank 0 --nproc-per-node 2 --master-addr 127.0.0.1 "
        f"--master-port {{port}} --rdzv-conf timeout=5 {WORKER} healthy",
        "torchrun node 0 of a 2-node static job: node 1 never starts; the store times out.",
        crash("store", [], ["1/2"], kind="comm_error"),
        timeout=90,
        must=("1/2 clients joined",),
    ),
    Scenario(
        "store_new_group_rank3",
        torchrun(4, "store_new_group --victim 3"),
        "Rank 3 never called new_group; ranks 0, 1, 2 wait in the store for its key and time "
        "out after 3 s.",
        crash("store", [3], ["timeout"], kind="hang"),
        must=("wait timeout",),
    ),
    Scenario(
        "store_get_timeout",
        torchrun(2, "store_get"),
        "Rank 0 calls store.get for a key rank 1 never sets ('rank1/inference_server_addr'); "
        "the get times out after 3 s.",
        crash("store", None, ["rank1/inference_server_addr"], kind="hang"),
        must=("inference_server_addr",),
    ),
]
