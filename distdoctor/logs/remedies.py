"""What to try, per failure: concrete flags, environment variables and commands."""

FIND_LATE_RANK = (
    "A rank never reached this collective. `distdoctor run` names it within seconds of the "
    "hang, with its stack; post-mortem, enable the Flight Recorder (TORCH_FR_BUFFER_SIZE=2000 "
    "TORCH_FR_DUMP_ON_TIMEOUT=1 TORCH_FR_DUMP_TEMP_FILE=/tmp/fr_rank_; an older torch's "
    "TORCH_NCCL_TRACE_BUFFER_SIZE / TORCH_NCCL_DUMP_ON_TIMEOUT still read) and run `distdoctor diagnose --fr-dump PREFIX`. "
    "Raise timeout= in init_process_group only if the step is legitimately slow.")
GLOO_TIMEOUT = FIND_LATE_RANK.replace(
    " TORCH_FR_DUMP_ON_TIMEOUT=1 TORCH_FR_DUMP_TEMP_FILE=/tmp/fr_rank_; an older torch's "
    "TORCH_NCCL_TRACE_BUFFER_SIZE / TORCH_NCCL_DUMP_ON_TIMEOUT still read)", ")")
SETTLE_ABSENCE = (
    "This log does not show every rank's output, so the rank that never arrived cannot be "
    "named from it: each rank's own output (torchrun --tee 3 / --log-dir), `distdoctor run` "
    "or Flight Recorder dumps (TORCH_FR_BUFFER_SIZE=2000 TORCH_FR_DUMP_ON_TIMEOUT=1 "
    "TORCH_FR_DUMP_TEMP_FILE=/tmp/fr_rank_, then `distdoctor diagnose --fr-dump PREFIX`) would settle it.")
SERIAL_WORK = (
    "One rank did long work alone (tokenizing, loading, preprocessing) while the others "
    "waited in a collective: do it before init_process_group, on every rank, or on rank 0 "
    "inside `with accelerator.main_process_first()` / a barrier with a long enough timeout; "
    "or raise timeout= in init_process_group (e.g. timedelta(hours=2)) for that phase.")
NCCL_SYSTEM = (
    "Usually the network or shared memory: rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS="
    "INIT,NET to see which; pin the interface with NCCL_SOCKET_IFNAME=eth0; try "
    "NCCL_IB_DISABLE=1 to rule out InfiniBand; in containers check `df -h /dev/shm` and give it "
    "room (--shm-size=1g or --ipc=host).")
NCCL_CUDA = (
    "A CUDA call inside NCCL failed: check `nvidia-smi` and `dmesg` for XID errors, rerun with "
    "CUDA_LAUNCH_BLOCKING=1 and NCCL_DEBUG=INFO; a driver/CUDA/NCCL version skew across nodes "
    "also shows this way.")
NCCL_USAGE = (
    "Usually two ranks on one GPU or mismatched arguments: call torch.cuda.set_device("
    "LOCAL_RANK) before init_process_group (or pass device_id=), check CUDA_VISIBLE_DEVICES, and "
    "that every rank calls the same collectives with the same sizes (`distdoctor run` compares "
    "them live).")
NCCL_REMOTE = (
    "A peer failed first: a rank that exited (its traceback, an OOM kill in `dmesg`) or a "
    "network fault. Find the first failure; NCCL_DEBUG=INFO shows which connection broke.")
NCCL_INTERNAL = (
    "Often a version skew (NCCL or driver differing across nodes) or a P2P/topology problem: "
    "compare versions on every node, try NCCL_P2P_LEVEL=NVL or NCCL_P2P_DISABLE=1, and rerun "
    "with NCCL_DEBUG=INFO.")
TOPOLOGY = ("NCCL could not read the GPUs' PCI tree under /sys (a container or VM that hides "
            "the host's /sys/class/pci_bus or /sys/devices): mount /sys from the host (docker "
            "-v /sys:/sys:ro, or --privileged), or give NCCL the topology with NCCL_TOPO_FILE; "
            "a newer NCCL tolerates missing paths better.")
SHM = ("NCCL could not allocate shared memory: check `df -h /dev/shm`, give the container more "
       "(docker --shm-size=1g or --ipc=host), or set NCCL_SHM_DISABLE=1.")
SHM_DATALOADER = ("/dev/shm is too small for the DataLoader's shared tensors (Docker's default "
                  "is 64 MB): check `df -h /dev/shm`, run the container with --shm-size=8g or "
                  "--ipc=host, or lower num_workers.")
SOCKET = ("A socket between ranks failed: check the address NCCL/Gloo picked is reachable from "
          "every node (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME=eth0, firewall, MTU), and "
          "NCCL_DEBUG=INFO for the interface in use.")
IB = ("InfiniBand transport error: check the links (`ibstat`, `ibv_devinfo`), NCCL_IB_HCA, and "
      "try NCCL_IB_DISABLE=1 to confirm the job runs over sockets; a failed ibv_reg_mr is "
      "usually the locked-memory limit: `ulimit -l unlimited` (memlock) in the container or "
      "the scheduler's limits.")
P2P = ("GPU peer-to-peer access failed between two GPUs: check `nvidia-smi topo -m`, disable "
       "ACS / set iommu=pt, or work around it with NCCL_P2P_DISABLE=1 (or NCCL_P2P_LEVEL=NVL).")
NVLS = ("NVLink SHARP multicast failed: check the Fabric Manager (`systemctl status "
        "nvidia-fabricmanager`, `nvidia-smi -q | grep -i fabric`) and the NVSwitches; "
        "NCCL_NVLS_ENABLE=0 runs without NVLS.")
WATCHDOG_STUCK = ("The NCCL watchdog itself made no progress, usually a CUDA call hung in the "
                  "driver: check `nvidia-smi` and `dmesg` for XID errors.")
PEER_GONE = ("A peer process went away mid-collective: the real failure is on the rank that "
             "exited first (its traceback, or an OOM kill in `dmesg`).")
PEER_LEFT = ("One rank finished (or returned from main) while the others still ran "
             "collectives: every rank must run the same number of steps (an uneven last batch, "
             "an early `break` or `return` on one rank); use drop_last=True or the Join context "
             "manager for uneven inputs.")
STORE_JOIN = ("Not every rank reached the rendezvous: check that all nodes started, that "
              "--nnodes/--nproc-per-node match WORLD_SIZE, and that MASTER_ADDR:MASTER_PORT is "
              "reachable from every node; raise timeout= in init_process_group if nodes start "
              "slowly.")
STORE_CONNECT = ("Could not reach the c10d store at MASTER_ADDR:MASTER_PORT: check that the "
                 "store's host (rank 0 / the --rdzv-endpoint) is up and listening, the address "
                 "and port, and the firewall (`nc -zv HOST PORT`).")
PORT_IN_USE = ("MASTER_PORT is taken, often by a previous run still alive: pick another port "
               "(--master-port / --rdzv-endpoint HOST:PORT, or --standalone) or stop the stale "
               "job (`ss -ltnp | grep PORT`).")
STORE_ADDR = ("The store's host binds MASTER_ADDR / --master-addr / --rdzv-endpoint: run the "
              "first node (node rank 0) on the host that address names, or set it to this "
              "host's own address on the network the nodes share.")
STORE_GONE = ("The c10d store's server (rank 0 / the launcher's agent) went away: look for its "
              "failure first.")
STORE_KEY = ("A rank waited for a key that another rank never wrote to the c10d store: a rank "
             "that skipped new_group()/a barrier, or died before it; every rank must create "
             "every process group in the same order.")
RDZV_TIMEOUT = ("The rendezvous did not complete: a node never joined (check that every node "
                "started, with the same --rdzv-id and --rdzv-endpoint, and --nnodes), or raise "
                "--rdzv-conf join_timeout=...")
HOST_OOM = ("The kernel's OOM killer most likely ended it (SIGKILL, no traceback): check "
            "`dmesg -T | grep -i -E 'killed process|oom'` on that host and the job's memory "
            "limit; lower host memory use (DataLoader num_workers, pin_memory, prefetch_factor, "
            "dataset held in RAM per rank).")
CUDA_OOM = ("Lower the batch size or sequence length, enable activation checkpointing, shard "
            "more (FSDP / ZeRO), and set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True when "
            "reserved memory far exceeds allocated (fragmentation).")
LAUNCHER_SIGNALED = ("The launcher itself was told to stop (SIGTERM/SIGINT): the scheduler "
                     "(time limit, preemption, scancel) or a user; check the job's accounting "
                     "(`sacct -j JOBID`), not the ranks.")
EXCEPTION = ("Fix the exception on that rank; the other ranks then waited for it in a "
             "collective until their timeout.")
STARTUP = "Every rank failed the same way before training began: fix that one error."
THREAD = ("An uncaught exception ends its thread alone: Python prints it and the process goes "
          "on, without what the thread did (a prefetch, a metrics push, a queue another thread "
          "waits on). Catch it in the thread, or end the job from threading.excepthook.")
DDP_UNUSED = ("Some parameters got no gradient this iteration: pass find_unused_parameters="
              "True to DistributedDataParallel, or make every rank use every parameter (a "
              "branch taken on some steps or ranks only); TORCH_DISTRIBUTED_DEBUG=DETAIL names "
              "them.")
DDP_MODEL_MISMATCH = ("The model differs across ranks (parameter count or shapes): build it "
                      "the same way on every rank (same config, seed-independent shapes) "
                      "before wrapping it in DDP.")
MISMATCH = ("Ranks called different collectives at the same point: find the branch that "
            "depends on the rank or on the data (an uneven last batch, a rank-0-only "
            "evaluation); `distdoctor run` names the line on each rank.")
MONITORED_BARRIER = ("That rank never reached the barrier: look at what it was doing (its "
                     "stack: `py-spy dump --pid PID`, or `distdoctor run`).")
REPEAT_WAIT = ("The job prints the same line and nothing else: what it waits on never came (a "
               "rank, a worker or a resource it asked for). Take a stack of every rank now "
               "(`py-spy dump --pid PID`), or rerun under `distdoctor run`, which names the rank "
               "the others wait for.")
WORKERS_STOPPED = ("torchrun stops the other workers once one fails: read the output of the one "
                   "it did not stop (its own log file with --log-dir/--tee, or the lines before "
                   "this excerpt), or rerun under `distdoctor run`, which names it.")
SIGTERM_FROM_OUTSIDE = ("Something outside the job sent that rank SIGTERM: a scheduler "
                        "preempting or evicting it (`sacct -j JOBID`, `kubectl describe pod`), "
                        "a node agent or health check, a user's `kill`. Find the sender in "
                        "that host's logs (`journalctl`); the other ranks' SIGTERMs are the "
                        "launcher's own teardown after it.")
