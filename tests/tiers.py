"""The suite's tiers, by test id: the version matrix's smoke set (marked `matrix`) and the
extended tier (marked `extended`, left out unless asked for). tests/conftest.py marks and
selects them; each entry is "file::test" below tests/, or its prefix."""

# --- the version matrix's smoke set ------------------------------------------------------
# What CI runs again on the oldest torch distdoctor supports and on the newest release
# (`pytest -m matrix`, .ci/run): every op family traced with its call site, a mismatch, a
# hang, a deadlock, a crash, a healthy job, a straggler, `diagnose --log` on recorded output,
# the demo, and a compiled function's graph break at its line (dynamo's code differs most
# between versions). Test ids (or their prefix, for a parametrized test) in one place.
MATRIX_SMOKE = (
    "test_tracer_ops.py::",
    "test_torch_versions.py::",
    "test_torch215_hooks.py::",
    "test_compiled_sites.py::",
    # torch names a member-named group by a count whose rule changed between releases
    "test_member_names.py::test_members_that_made_different_numbers_of_groups_name_one_group",
    "test_member_names.py::test_each_torchs_recipe_is_read_back_from_the_name",
    "test_member_names.py::test_a_plain_group_after_a_member_named_one_hangs_only_where_torch",
    "test_counter_names.py::test_the_real_job_whose_non_members_name_a_plain_group_apart",
    # runs where torch numbers member-named groups too (2.15), skipped elsewhere
    "test_group_creation.py::test_a_rank_that_made_a_member_named_group_first",
    "test_diagnosis_corpus.py::test_bug_is_diagnosed[shape_mismatch]",
    "test_diagnosis_corpus.py::test_bug_is_diagnosed[stuck_outside]",
    "test_diagnosis_corpus.py::test_bug_is_diagnosed[p2p_deadlock]",
    "test_diagnosis_corpus.py::test_bug_is_diagnosed[oom_killed]",
    "test_diagnosis_corpus.py::test_healthy_job_has_no_findings",
    "test_stragglers.py::test_straggler_without_spans_is_found_with_its_cause[logs_before",
    "test_log_diagnosis.py::test_corpus",
    "test_demo.py::test_demo_without_a_terminal_prints_the_finding_live",
)


# --- the extended tier ---------------------------------------------------------------------
# Variants whose mechanism a sibling test in the default run exercises already, run only
# with `pytest -m extended` (or `-m "extended or not extended"` for everything): each
# launches a multi-process job of its own, and CI has 35 minutes for the whole suite and
# the version matrix. In one place, with the sibling that covers each in CI.
EXTENDED = (
    # bare and traced on every test of the subset (CI: traced, against the bare outcomes)
    "test_torch_suite.py::test_bare_and_traced_agree_test_by_test",
    # busy ranks (CI: dataloader; test_stragglers' periodic evaluator, busy on rank 0)
    "test_hang_auto.py::test_a_busy_rank_is_a_long_wait_never_a_hang[evaluate]",
    "test_hang_auto.py::test_a_busy_rank_is_a_long_wait_never_a_hang[checkpoint]",
    "test_hang_auto.py::test_a_busy_rank_is_a_long_wait_never_a_hang[warmup]",
    "test_hang_auto.py::test_a_busy_rank_is_a_long_wait_never_a_hang[generate]",
    "test_hang_auto.py::test_a_busy_rank_is_a_long_wait_never_a_hang[prepare]",
    # failures injected into the trainer (CI: its crash; its mismatch diagnosed live in
    # test_demo; the trainer's own shape, skip and hang tests in
    # test_reference_trainer_faults; the bug corpus's shape_mismatch and uneven_batches
    # and test_hang_auto's idle hangs, diagnosed)
    "test_trainer_diagnosis.py::test_injected_failure_is_diagnosed[mismatch:rank=2,step=3]",
    "test_trainer_diagnosis.py::test_injected_failure_is_diagnosed[shape:rank=1,step=3]",
    "test_trainer_diagnosis.py::test_injected_failure_is_diagnosed[skip:rank=3,step=2]",
    "test_trainer_diagnosis.py::test_injected_failure_is_diagnosed[hang:rank=2,step=3]",
    # a slow or throttled rank in the trainer (CI: test_straggler_roots' slow rank in DP x
    # PP and PP, the same injection)
    "test_trainer_diagnosis.py::test_slow_rank_is_the_straggler",
    # a hang found from the nodes' digests (CI: the mismatch from digests, and
    # test_netns_multinode's hang of a node whose link went down)
    "test_fleet.py::test_a_culprit_on_the_other_node_is_found_from_digests[stuck_outside.py",
    # idle hangs (CI: sleep, compute, spin, dead)
    "test_hang_auto.py::test_a_rank_without_progress_is_a_hang_within_seconds[lock]",
    "test_hang_auto.py::test_a_rank_without_progress_is_a_hang_within_seconds[queue]",
    # the same jobs as the bug corpus's (test_diagnosis_corpus.py), under the auto rule
    "test_hang_auto.py::test_hang_shapes_name_the_culprit_line[bugs/p2p_deadlock.py]",
    "test_hang_auto.py::test_hang_shapes_name_the_culprit_line[bugs/wrong_group.py]",
    # healthy modes with identical losses (CI: FSDP, PP; DDP's identical results in
    # test_run_and_rundir; the straggler tier runs DDP and EP healthy)
    "test_trainer_diagnosis.py::test_healthy_mode_has_no_findings_and_same_losses[mode0]",
    "test_trainer_diagnosis.py::test_healthy_mode_has_no_findings_and_same_losses[mode2]",
    "test_trainer_diagnosis.py::test_healthy_mode_has_no_findings_and_same_losses[mode4]",
    # healthy parallel modes judged for stragglers (CI: DDP, FSDP2, DDP+EP, PP 1f1b; TP's
    # slow link in test_stragglers' tp pair; ranks time-sliced on too few cores:
    # test_hang_auto's overloaded machine and test_straggler_roots' run beside many small
    # processes)
    "test_stragglers.py::test_healthy_trainer_modes_have_no_straggler[TP+SP]",
    "test_stragglers.py::test_healthy_trainer_modes_have_no_straggler[8-rank]",
    "test_stragglers.py::test_healthy_trainer_modes_have_no_straggler[HSDP]",
    "test_stragglers.py::test_healthy_trainer_modes_have_no_straggler[PP gpipe]",
    "test_stragglers.py::test_healthy_trainer_modes_have_no_straggler[PP interleaved]",
    # C and Python recorders alike on a second job (CI: all_ops.py at 4 ranks)
    "test_native.py::test_c_and_python_paths_record_the_same_events[parallel_stack.py-2]",
    # the dashboard on a terminal, closed by SIGHUP (CI: closed with q)
    "test_demo.py::test_demo_on_a_terminal_runs_behind_the_dashboard_and_stops_with_it[hangup]",
    # the public corpus's benchmark script scoring one case (CI: its flags; the corpus's
    # own checkers run the cases)
    "test_public_corpus.py::test_the_benchmark_scores_distdoctor_and_a_plain_timeout_on_a_corpus_case",
    # `--on-hang kill` on a Lightning job's own processes (CI: on-hang kill in the bug
    # corpus and the framework jobs; a signal to run stops ranks and detached children)
    "test_launch_cleanup.py::test_on_hang_kill_stops_every_process_of_a_lightning_job",
    # a periodic evaluator on a starved host (CI: a rank starved of CPU is its host's
    # finding; rank 0's periodic evaluation is no straggler)
    "test_stragglers.py::test_a_periodic_evaluator_starved_of_cpu_is_its_hosts_finding",
    # launches again and again (CI: an elastic restart traced per round; a rank that
    # remakes its default group is a new incarnation)
    "test_incarnations.py::test_a_script_that_launches_its_ranks_again_and_again",
    # a dtype that differs (CI: shape_mismatch, wrong_group, uneven_batches: signatures)
    "test_diagnosis_corpus.py::test_bug_is_diagnosed[dtype_mismatch]",
    # a straggler across nodes from real digests (CI: the lateness of digests' waits on
    # recorded positions in test_fleet; test_netns_multinode's rate-limited link)
    "test_fleet.py::test_a_rank_that_keeps_the_other_node_waiting_is_a_straggler_from_digests",
    # a Lightning rank slow in its own augmentation (CI: a rank slow in its data loading,
    # found with its cause, in test_stragglers; Lightning's steps in test_framework_steps)
    "test_stragglers.py::test_a_lightning_rank_that_augments_slowly_is_found_in_its_function",
    # the GPU suite's torch 2.15 stage on a CPU machine (CI: its dry run, every GPU test
    # skipped with the reason)
    "gpu/test_suite_plumbing.py::test_the_torch215_stage_runs_its_own_gpu_test",
    # branch kinds at 4 ranks whose 2-rank twins run in CI (a majority on the other side)
    "test_branch_jobs.py::test_the_condition_names_the_rank_that_strayed[early_return-4]",
    "test_branch_jobs.py::test_the_condition_names_the_rank_that_strayed[except_continue-4]",
    "test_branch_jobs.py::test_the_condition_names_the_rank_that_strayed[rank_name-4]",
    "test_parted.py::test_the_culprit_and_the_line_where_it_parted[resume_branch_2rank-4]",
    # the sweep's every root at 4 ranks (CI: every op, dtype and reduction at 2 ranks, and
    # the pairwise and per-rail sweeps at 4)
    "test_nccl_test_runs.py::test_four_ranks_every_root_dtype_and_redop_checks_out",
    # a bug in an inductor-compiled function (CI: the same under aot_eager; the version
    # matrix's compiled call sites)
    "test_framework_compiled.py::test_compiled_branch_mismatch_names_the_users_lines[inductor]",
    # rank 0 leaving by sys.exit (CI: rank 1 the same, under torchrun and spawned)
    "test_run_and_rundir.py::test_a_rank_that_calls_sys_exit_mid_training_is_named_at_that_line[0-nproc]",
    # every fixture log with 5,000-digit numbers (CI: a launcher's table, the reports and
    # DDP's counts with them, the parsers that raised)
    "security/test_log_hostile.py::test_every_fixture_log_with_numbers_of_5000_digits_is_read",
    # the step words before blanks in 64 files (CI: every log regex on a hostile line in
    # linear time)
    "security/test_log_hostile.py::test_step_words_before_a_run_of_blanks_in_many_files",
    # real ranks' dumps torn by chance, up to 8 runs (CI: torn dumps read from recorded
    # logs, and two real ranks' dumps through torchrun's tee)
    "test_logs_dumps.py::test_two_real_ranks_dumping_at_once_never_name_a_frame_they_were_not_in",
    # exec'd collectives with named code objects (CI: the same unnamed)
    "security/test_tracer_hostile.py::test_collectives_run_through_exec_of_a_string_leave_no_memory_behind[named]",
    # an onset straggler without spans (CI: slow data loading and logging without spans;
    # the corpus's h14 onset case)
    "test_stragglers.py::test_straggler_without_spans_is_found_with_its_cause[onset_extra_compute.py]",
    # a metrics thread on the default group beside training on a subgroup (CI: one on a
    # group of its own, healthy, and a straggler found beside one)
    "test_metrics_thread.py::test_a_thread_on_the_default_group_beside_training_on_a_subgroup_is_healthy",
    # exceptions told by the output whose ranks end late, stuck or in a new incarnation
    # (CI: one a running rank logged, one it lived past, one on a rank that ended of it)
    "test_log_live.py::test_an_exception_whose_rank_is_slow_to_end_is_not_said_handled",
    "test_log_live.py::test_an_exception_whose_rank_was_stopped_stuck_stays_its_crash",
    "test_log_live.py::test_an_exception_before_an_in_process_restart_is_one_finding_of_its_incarnation",
    # a rank spinning in Python without progress (CI: computing in torch, sleeping, dead)
    "test_hang_auto.py::test_a_rank_without_progress_is_a_hang_within_seconds[spin]",
    # check's slow link and its second node's NCCL value (CI: the sweep measuring again the
    # pairs below half the median, nccl-test's pairwise slow sends; bad settings on a node)
    "test_check.py::test_a_slow_link_is_named_by_the_sweep",
    "test_check.py::test_one_node_with_another_nccl_value_fails_on_both_nodes",
    # thousands of late nodes (CI: a network split of hundreds of nodes, every one named)
    "security/test_collector_fresh.py::test_thousands_of_late_nodes_leave_the_digests_findings_written",
    # a hello flood from many addresses (CI: a speaking flood from one address)
    "security/test_collector_flood.py::test_a_hello_flood_from_many_addresses_does_not_keep_a_node_out",
    # junk at log names, polled (CI: FIFOs and devices at a run dir's names refused, FIFOs
    # in ranks/ never holding the live engine)
    "security/test_rundir_fresh.py::test_junk_at_log_names_is_not_opened_again_on_every_poll",
    # a healthy run beside many small processes (CI: test_hang_auto's overloaded machine, a
    # rank starved of CPU as its host's finding)
    "test_straggler_roots.py::test_a_healthy_run_beside_many_small_processes_blames_no_rank",
    # the line no peer runs with a seldom sampler (CI: stragglers without spans found with
    # their cause and line)
    "test_stragglers.py::test_a_line_no_peer_runs_is_named_though_the_sampler_looked_seldom",
    # a forked child leaving by os._exit (CI: the same leaving by sys.exit)
    "test_chaos_rank_fork.py::test_a_rank_that_forks_is_traced_as_the_parent[_exit]",
    # a size that does not fit, skipped (CI: the sweep's every op at 2 ranks, a corrupted
    # result counted)
    "test_nccl_test_runs.py::test_a_size_that_does_not_fit_is_skipped_and_the_sweep_goes_on",
    # 4 ranks creating groups in a racy order, whatever torch wires (CI: the corpus's
    # group_order_deadlock, test_group_order's real jobs; test_engine_survives' broken
    # detector with --on-hang kill)
    "security/test_engine_survives.py::test_a_racy_group_order_job_is_diagnosed_whatever_the_wiring",
    # two optimizers in one step (CI: steps at HF's, Lightning's and Accelerate's counters)
    "test_framework_steps.py::test_two_optimizers_stepping_once_each_are_one_step",
    # the trainer under torchrun (CI: torchrun wrapped, results bit-identical)
    "test_reference_trainer_faults.py::test_runs_under_torchrun",
    # a stray barrier in a shared helper at 4 ranks (CI: a stray barrier named where it was
    # issued)
    "test_parted.py::test_the_culprit_and_the_line_where_it_parted[stray_barrier_same_helper-4]",
    # the dashboard of 4,096 ranks (CI: its cells, header and rank ranges of thousands of
    # ranks; benchmarks/watch_refresh.py times it at scale)
    "test_watch_units.py::test_the_dashboard_of_4096_ranks_draws_the_summary_and_finds_on_demand",
)
