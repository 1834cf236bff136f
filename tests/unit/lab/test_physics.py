"""One test per row of the lab physics table (docs/lab-physics.md)."""

import pytest

from sglang_lab_standin import cli, physics
from sglang_lab_standin.physics import Gpu, SourceState, decide

A6000 = [Gpu("NVIDIA RTX A6000", "8.6", 49140)] * 2
PRO = [Gpu("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "12.0", 97887)] * 8

UNPATCHED = SourceState(found=True, path="/x/sglang", ddtree_known=False)
KNOWN = SourceState(found=True, path="/x/sglang", ddtree_known=True,
                    files_with_ddtree=("speculative/spec_info.py",),
                    files_missing_ddtree=physics.DDTREE_DFLASH_FILES[1:])
FULL = SourceState(found=True, path="/x/sglang", ddtree_known=True,
                   files_with_ddtree=physics.DDTREE_DFLASH_FILES, files_missing_ddtree=())


def args(*extra, tp=None, mfs=None):
    argv = ["--model-path", "m"]
    if tp is not None:
        argv += ["--tp-size", str(tp)]
    if mfs is not None:
        argv += ["--mem-fraction-static", str(mfs)]
    return cli.parse_args(argv + list(extra))


def test_arch_from_compute_cap():
    assert A6000[0].arch == "sm86" and PRO[0].arch == "sm120"
    assert Gpu("H100", "9.0", 81559).arch == "sm90"


def test_a6000_085_tp2_starts():
    b = decide(A6000, args(tp=2, mfs=0.85), FULL)
    assert b.serves and b.exit_code == 0


def test_a6000_095_crashes_even_without_cuda_graphs():
    for extra in ((), ("--cuda-graph-backend-decode", "disabled")):
        b = decide(A6000, args(*extra, tp=2, mfs=0.95), FULL)
        assert not b.serves and b.exit_code == 1
        assert b.crash_lines[-1].startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ")
        assert "GPU 0 has a total capacity of 47.99 GiB" in b.crash_lines[-1]
    assert decide(A6000, args("--cuda-graph-backend-decode", "disabled", tp=2, mfs=0.95), FULL).crash_phase == "memory_pool"
    assert decide(A6000, args(tp=2, mfs=0.95), FULL).crash_phase == "cuda_graph"


def test_pro6000_095_with_max_bs_48_starts():
    b = decide(PRO, args("--cuda-graph-max-bs-decode", "48", mfs=0.95), FULL)
    assert b.serves and b.cuda_graph_max_bs_decode == 48


def test_graph_batch_size_eats_the_reserve():
    # 0.95 on 96 GB leaves 4.78 GiB: 3.0 + 0.02 x 96 = 4.92 does not fit, 48 -> 3.96 does.
    assert not decide(PRO, args("--cuda-graph-max-bs-decode", "96", mfs=0.95), FULL).serves
    assert decide(PRO, args("--cuda-graph-max-bs-decode", "96", "--disable-decode-cuda-graph", mfs=0.95), FULL).serves


def test_weights_do_not_fit_one_a6000():
    b = decide(A6000, args(tp=1, mfs=0.85), FULL)
    assert not b.serves and b.crash_phase == "load_weights"
    assert "OutOfMemoryError" in b.crash_lines[-1]


def test_auto_mem_fraction():
    assert decide(A6000, args(tp=2), FULL).mem_fraction_static == 0.85
    assert decide(PRO, args(), FULL).mem_fraction_static == 0.90


def test_tp_larger_than_gpu_count():
    b = decide(A6000, args(tp=4, mfs=0.85), FULL)
    assert not b.serves and b.exit_code == 1 and b.crash_phase == "spawn"
    assert "--tp-size 4" in b.crash_lines[-1] and "2" in b.crash_lines[-1]


def test_no_gpus():
    b = decide([], args(), FULL)
    assert not b.serves and "No CUDA GPUs" in b.crash_lines[-1]


def test_ddtree_unknown_aborts_before_weights():
    b = decide(PRO, args("--speculative-algorithm", "DDTREE"), UNPATCHED)
    assert not b.serves and b.crash_phase == "args" and b.exit_code == 1
    assert b.crash_lines[0] == "Traceback (most recent call last):"
    assert b.crash_lines[-1] == "ValueError: Unknown speculative algorithm name: DDTREE"


def test_ddtree_known_not_dflash_family_crashes_on_first_generation():
    b = decide(PRO, args("--speculative-algorithm", "DDTREE"), KNOWN)
    assert b.serves      # start-up completes; the first generation (the warm-up) kills it
    assert b.first_request_crash == (
        "ValueError: DFLASH target_hidden feature dim mismatch. Expected shape [N, 25600] "
        "(num_context_features=5, hidden_size=5120), but got shape=(6, 5120). This usually means the "
        "target model is capturing a different number of layer features than the draft "
        "checkpoint/config expects.")
    assert "kv_cache_hook.py" in " ".join(b.notes)


def test_ddtree_full_on_sm86_is_bang():
    b = decide(A6000, args("--speculative-algorithm", "DDTREE", tp=2, mfs=0.85), FULL)
    assert b.serves and b.text_mode == "bang" and b.first_request_crash is None
    assert b.tokens_per_second == pytest.approx(0.057)
    assert 1 / b.tokens_per_second == pytest.approx(17.5, abs=0.1)


def test_ddtree_full_on_sm120_is_124x_dflash():
    dd = decide(PRO, args("--speculative-algorithm", "DDTREE"), FULL)
    df = decide(PRO, args("--speculative-algorithm", "DFLASH"), FULL)
    assert dd.text_mode == df.text_mode == "correct"
    assert dd.tokens_per_second == pytest.approx(1.24 * df.tokens_per_second)
    assert dd.accept_length == 5.2 and df.accept_length == 4.2


@pytest.mark.parametrize("gpus, algo, rate, accept", [
    (PRO, "NEXTN", 96.0, 3.1), (PRO, "EAGLE", 96.0, 3.1), (PRO, "EAGLE3", 96.0, 3.1),
    (PRO, "DFLASH", 120.0, 4.2), (A6000, "NEXTN", 40.0, 3.1), (A6000, "DFLASH", 48.0, 4.2),
])
def test_base_rates(gpus, algo, rate, accept):
    tp = 2 if gpus is A6000 else 1
    b = decide(gpus, args("--speculative-algorithm", algo, tp=tp, mfs=0.85), UNPATCHED)
    assert b.serves and b.text_mode == "correct" and b.accept_length == accept
    assert b.tokens_per_second == pytest.approx(rate * physics.tp_factor(tp))


def test_cuda_graphs_off_is_07x_and_tp_is_mild():
    on = decide(PRO, args("--speculative-algorithm", "NEXTN"), UNPATCHED).tokens_per_second
    off = decide(PRO, args("--speculative-algorithm", "NEXTN", "--cuda-graph-backend-decode", "disabled"),
                 UNPATCHED).tokens_per_second
    assert off == pytest.approx(0.7 * on)
    tp4 = decide(PRO, args("--speculative-algorithm", "NEXTN", tp=4), UNPATCHED).tokens_per_second
    assert on < tp4 < 1.3 * on


def test_dflash_defaults_max_running_requests_48():
    assert decide(PRO, args("--speculative-algorithm", "DFLASH"), UNPATCHED).max_running_requests == 48
    assert decide(PRO, args("--max-running-requests", "8"), UNPATCHED).max_running_requests == 8


def test_batching_penalty():
    assert physics.per_stream_rate(100.0, 1) == 100.0
    assert 80.0 < physics.per_stream_rate(100.0, 5) < 100.0


def test_attention_backend_arch_limits():
    b = decide(PRO, args("--attention-backend", "fa3"), FULL)
    assert not b.serves and b.crash_phase == "args" and "fa3" in b.crash_lines[-1]
    assert decide(A6000, args("--attention-backend", "fa3", tp=2), FULL).serves
    assert not decide(A6000, args("--attention-backend", "trtllm_mha", tp=2), FULL).serves


def test_fork_style_ddtree_flag():
    a = cli.parse_args(["--model-path", "m", "--speculative-algorithm", "DFLASH", "--tp-size", "2",
                        cli.DDTREE_FORK_FLAG], extra_flags=[cli.DDTREE_FORK_FLAG])
    b = decide(A6000, a, UNPATCHED)
    assert b.family == "DDTREE" and b.text_mode == "bang"


def test_sglang_missing():
    b = decide(PRO, args(), SourceState(found=False))
    assert not b.serves and "No module named 'sglang'" in b.crash_lines[-1]


def test_inspect_source_three_states(sglang_tree):
    un = physics.inspect_source(sglang_tree("unpatched"))
    kn = physics.inspect_source(sglang_tree("ddtree_known"))
    full = physics.inspect_source(sglang_tree("ddtree_full"))
    assert (un.ddtree_known, un.ddtree_dflash_family) == (False, False)
    assert (kn.ddtree_known, kn.ddtree_dflash_family) == (True, False)
    assert "mem_cache/kv_cache_configurator.py" in kn.files_missing_ddtree
    assert (full.ddtree_known, full.ddtree_dflash_family) == (True, True)
    assert physics.inspect_source(None).found is False


def test_find_sglang_dir_override_accepts_pkg_or_parent(sglang_tree):
    pkg = sglang_tree("unpatched")
    assert physics.find_sglang_dir({"DDTREE_LAB_SGLANG_DIR": str(pkg)}) == pkg
    assert physics.find_sglang_dir({"DDTREE_LAB_SGLANG_DIR": str(pkg.parent)}) == pkg


def test_query_gpus_runs_nvidia_smi(smi):
    gpus = physics.query_gpus({"DDTREE_LAB_NVIDIA_SMI": str(smi("a6000x2"))})
    assert gpus == [Gpu("NVIDIA RTX A6000", "8.6", 49140)] * 2
    pro = physics.query_gpus({"DDTREE_LAB_NVIDIA_SMI": str(smi("pro6000x8")), "CUDA_VISIBLE_DEVICES": "0,3"})
    assert len(pro) == 2 and pro[0].arch == "sm120" and pro[0].memory_mib == 97887
    assert physics.query_gpus({"DDTREE_LAB_NVIDIA_SMI": "/nonexistent/nvidia-smi"}) == []


# --- the DDTree worker's start-up checks (a source with patch 0004's speculative_ddtree_budget) ----

WORKER = SourceState(found=True, path="/x/sglang", ddtree_known=True, files_with_ddtree=physics.DDTREE_DFLASH_FILES,
                     files_missing_ddtree=(), ddtree_budget_known=True)
BUDGET = [cli.DDTREE_BUDGET_FLAG]


def budget_args(*extra):
    return cli.parse_args(["--model-path", "m", "--speculative-algorithm", "DDTREE", *extra], extra_flags=BUDGET)


@pytest.mark.parametrize("budget", ["1", "32", "1023"])
def test_ddtree_budget_in_range_serves(budget):
    b = decide(PRO, budget_args(cli.DDTREE_BUDGET_FLAG, budget), WORKER)
    assert b.serves and b.ddtree_budget == int(budget) and b.warnings == ()


def test_the_reference_budget_is_the_unset_one_with_the_tables_rate_and_acceptance():
    unset = decide(PRO, budget_args(), WORKER)
    ref = decide(PRO, budget_args(cli.DDTREE_BUDGET_FLAG, str(physics.DDTREE_REFERENCE_BUDGET)), WORKER)
    dflash = decide(PRO, cli.parse_args(["--model-path", "m", "--speculative-algorithm", "DFLASH"]), WORKER)
    assert ref.tokens_per_second == unset.tokens_per_second
    assert ref.tokens_per_second == pytest.approx(physics.DDTREE_SPEEDUP * dflash.tokens_per_second)
    assert ref.accept_length == unset.accept_length == physics.ACCEPT["DDTREE"][0]
    for running in (1, 2, 8, 48):   # the batch cost of the reference tree is in the base rate already
        assert physics.batch_factor(ref, running) == 1.0


LADDER = (8, 16, 24, 32, 48, 64, 96, 128)


def best_budget(arch: str, running: int) -> int:
    return max(LADDER, key=lambda b: physics.ddtree_budget_factor(b, arch, running))


def test_the_budget_has_an_interior_optimum_that_a_bigger_batch_moves_down():
    b1, b8 = best_budget("sm120", 1), best_budget("sm120", 8)
    assert LADDER[0] < b8 < b1 < LADDER[-1], (b1, b8)
    assert physics.ddtree_budget_factor(b1, "sm120") > 1.0 > physics.ddtree_budget_factor(128, "sm120")
    # acceptance saturates: more nodes always accept more, by less and less
    acc = [physics.ddtree_accept_length(b) for b in LADDER]
    gains = [b - a for a, b in zip(acc, acc[1:])]
    assert all(g > 0 for g in gains) and acc[-1] < physics.DDTREE_ACCEPT_MAX
    # a smaller GPU pays more per node: its best tree is not bigger
    assert best_budget("sm86", 1) <= b1


def test_the_served_rate_and_accept_length_follow_the_budget():
    rates = {b: decide(PRO, budget_args(cli.DDTREE_BUDGET_FLAG, str(b)), WORKER) for b in (8, 32, 48, 128)}
    assert rates[48].tokens_per_second > rates[32].tokens_per_second > rates[8].tokens_per_second
    assert rates[128].tokens_per_second < rates[32].tokens_per_second
    assert rates[8].accept_length < rates[32].accept_length < rates[128].accept_length
    # in a batch of 8 the bigger tree loses its lead: verify cost grows with the batch
    assert (rates[48].tokens_per_second * physics.batch_factor(rates[48], 8)
            < rates[32].tokens_per_second * physics.batch_factor(rates[32], 8))


def nextn(*extra):
    return decide(PRO, cli.parse_args(["--model-path", "m", "--speculative-algorithm", "NEXTN", *extra]), WORKER)


def test_nextn_parameters_resolve_as_0523_does_and_have_an_interior_optimum():
    ref = nextn("--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")
    assert ref.tokens_per_second == nextn().tokens_per_second == physics.BASE_RATES["sm120"]["EAGLE"]
    assert ref.accept_length == physics.ACCEPT["EAGLE"][0]
    # topk 1: the draft tokens are num_steps + 1 whatever is given
    assert physics.eagle_params(cli.parse_args(["--model-path", "m", "--speculative-num-steps", "5",
                                                "--speculative-num-draft-tokens", "2"])) == (5, 1, 6)
    steps = {s: physics.eagle_params_factor(s, 1, s + 1, "sm120") for s in range(1, 10)}
    best = max(steps, key=steps.get)
    assert 3 < best < 9 and steps[best] > 1.0 > steps[1]
    deeper = nextn("--speculative-num-steps", str(best), "--speculative-eagle-topk", "1")
    assert deeper.tokens_per_second == pytest.approx(ref.tokens_per_second * steps[best])
    assert deeper.accept_length > ref.accept_length


def test_a_batch_above_the_biggest_decode_graph_runs_eagerly():
    b = decide(PRO, cli.parse_args(["--model-path", "m", "--speculative-algorithm", "NEXTN",
                                    "--cuda-graph-max-bs-decode", "16"]), WORKER)
    assert b.cuda_graph_decode and b.cuda_graph_max_bs_decode == 16
    assert physics.batch_factor(b, 16) == 1.0
    assert physics.batch_factor(b, 17) == physics.CUDA_GRAPH_OFF_FACTOR


@pytest.mark.parametrize("budget", ["0", "1024", "-3"])
def test_ddtree_budget_out_of_range_aborts_before_weights(budget):
    b = decide(PRO, budget_args(cli.DDTREE_BUDGET_FLAG, budget), WORKER)
    assert not b.serves and b.crash_phase == "args" and b.exit_code == 1
    assert b.crash_lines[0] == "Traceback (most recent call last):"
    # validate_budget (0003) raises DDTreeError, a ValueError subclass: the traceback names its class.
    assert b.crash_lines[-1] == (
        "sglang.srt.speculative.ddtree_tree.DDTreeError: --speculative-ddtree-budget must be between 1 and 1023"
        f" (draft nodes per tree, root excluded; the verify width is budget + 1), got {budget}")
    text = "\n".join(b.crash_lines)
    assert "in _handle_dflash" in text and "in _handle_ddtree" in text and "in validate_budget" in text


@pytest.mark.parametrize("page_size", ["16", "64"])
def test_ddtree_page_size_other_than_1_aborts(page_size):
    b = decide(PRO, budget_args("--page-size", page_size), WORKER)
    assert not b.serves and b.crash_phase == "args" and b.exit_code == 1
    assert b.crash_lines[-1] == ("ValueError: DDTREE requires --page-size 1 (the accepted tree path is compacted"
                                 f" token by token), got {page_size}.")
    assert decide(PRO, budget_args("--page-size", "1"), WORKER).serves
    assert decide(PRO, budget_args("--page-size", "0"), WORKER).serves  # 0004 reads `page_size or 1`


def test_ddtree_rejection_sampling_aborts():
    b = decide(PRO, budget_args("--speculative-use-rejection-sampling"), WORKER)
    assert not b.serves and b.crash_phase == "args" and b.exit_code == 1
    assert b.crash_lines[-1] == (
        "ValueError: DDTREE does not support --speculative-use-rejection-sampling: the tree is built from the"
        " draft's top-k log-probabilities, so there is no draft distribution per verify node.")


def test_ddtree_replayssm_verify_ring_aborts():
    b = decide(PRO, budget_args("--enable-linear-replayssm-spec"), WORKER)
    assert not b.serves and b.crash_phase == "args" and b.exit_code == 1
    assert b.crash_lines[-1] == ("ValueError: DDTREE does not support --enable-linear-replayssm-spec: its verify"
                                 " ring replays a linear draft chain, not a tree.")
    assert decide(PRO, budget_args(), WORKER).serves


@pytest.mark.parametrize("backend,cls", [("trtllm_mha", "TRTLLMHAAttnBackend"), ("torch_native", "TorchNativeAttnBackend")])
def test_ddtree_worker_refuses_a_backend_without_the_tree_mask(backend, cls):
    """0004's worker check, after the target is up (its weights, pool and graphs are logged first)."""
    b = decide(PRO, budget_args("--attention-backend", backend), WORKER)
    assert not b.serves and b.crash_phase == "spec_worker" and b.exit_code == 1
    assert b.crash_lines[-1] == physics.DDTREE_BACKEND_ERROR.format(cls=cls)
    assert "in _check_ddtree_support" in "\n".join(b.crash_lines)
    for ok in ("triton", "flashinfer"):
        assert decide(PRO, budget_args("--attention-backend", ok), WORKER).serves
    dflash = ["--model-path", "m", "--speculative-algorithm", "DFLASH", "--attention-backend", backend]
    assert decide(PRO, cli.parse_args(dflash, extra_flags=BUDGET), WORKER).serves  # DFLASH has no such check
    # 0001-0003 only: no 0004 worker, so nothing checks the backend (DDTREE is DFLASH renamed there).
    assert decide(PRO, budget_args("--attention-backend", backend), FULL).crash_phase != "spec_worker"


def test_ddtree_checks_need_the_worker_source():
    # 0001-0003 only (no budget field): the parser has no budget flag, and DDTREE's page size and
    # rejection sampling are not checked at start-up (the incident's half-built states stay as they were).
    assert decide(PRO, budget_args("--page-size", "16"), FULL).serves
    assert decide(PRO, budget_args("--speculative-use-rejection-sampling"), FULL).serves


@pytest.mark.parametrize("algorithm,shown", [("NEXTN", "EAGLE"), ("DFLASH", "DFLASH"), ("EAGLE3", "EAGLE3"),
                                              (None, "None")])
def test_budget_with_another_algorithm_only_warns(algorithm, shown):
    """0004 warns in handle_speculative_decoding, after the alias is resolved (NEXTN is EAGLE there)."""
    algo = ["--speculative-algorithm", algorithm, "--speculative-draft-model-path", "d"] if algorithm else []
    a = cli.parse_args(["--model-path", "m", *algo, cli.DDTREE_BUDGET_FLAG, "24"], extra_flags=BUDGET)
    b = decide(PRO, a, WORKER)
    assert b.serves
    assert b.warnings == (f"--speculative-ddtree-budget has no effect with speculative_algorithm={shown}"
                          " (honored by DDTREE only).",)
    # ... even an out-of-range one: only DDTREE checks it.
    a.speculative_ddtree_budget = 5000
    assert decide(PRO, a, WORKER).serves


def test_fork_style_honors_the_budget_like_ddtree():
    extra = [cli.DDTREE_FORK_FLAG, cli.DDTREE_BUDGET_FLAG]
    fork = SourceState(found=True, path="/x/sglang", ddtree_flag_known=True, ddtree_budget_known=True)
    a = cli.parse_args(["--model-path", "m", "--speculative-algorithm", "DFLASH", cli.DDTREE_FORK_FLAG,
                        cli.DDTREE_BUDGET_FLAG, "2000"], extra_flags=extra)
    b = decide(PRO, a, fork)
    assert not b.serves and "between 1 and 1023" in b.crash_lines[-1]


def test_inspect_source_finds_the_budget_field(sglang_tree):
    assert physics.inspect_source(sglang_tree("ddtree_worker")).ddtree_budget_known is True
    assert physics.inspect_source(sglang_tree("budget_only")).ddtree_budget_known is True
    assert physics.inspect_source(sglang_tree("ddtree_full")).ddtree_budget_known is False
    assert physics.inspect_source(sglang_tree("ddtree_full")).ddtree_flag_known is False
