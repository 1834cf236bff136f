"""Unit tests for plugins/module_utils/gpu.py (pure logic, no host needed)."""

from __future__ import annotations

import pytest

from ansible_collections.ddtree.fleet.plugins.module_utils import gpu as g
from ddtree_testlib import A6000_LIST, A6000_QUERY, PRO6000_LIST, PRO6000_NAME, PRO6000_QUERY


@pytest.mark.parametrize(
    "cc, arch",
    [("8.0", "sm80"), ("8.6", "sm86"), ("8.9", "sm89"), ("9.0", "sm90"), ("10.0", "sm100"), ("12.0", "sm120")],
)
def test_arch_from_compute_cap(cc, arch):
    assert g.arch_from_compute_cap(cc) == arch


@pytest.mark.parametrize("bad", ["", "8", "8.x", "[N/A]", "8.6.1", "sm86"])
def test_arch_from_compute_cap_rejects(bad):
    with pytest.raises(ValueError, match="MAJOR.MINOR"):
        g.arch_from_compute_cap(bad)


def test_parse_a6000_pair():
    gpus = g.parse_query_gpu(A6000_QUERY)
    assert len(gpus) == 2
    assert gpus[0] == {
        "index": 0,
        "name": "NVIDIA RTX A6000",
        "compute_cap": "8.6",
        "arch": "sm86",
        "memory_total_mib": 49140,
        "memory_used_mib": 1,
        "memory_free_mib": 49139,
        "driver_version": "570.86.15",
    }
    assert gpus[1]["index"] == 1


def test_summary_a6000_with_uuids():
    facts = g.gpu_facts_from_outputs(A6000_QUERY, A6000_LIST)
    assert facts["count"] == 2
    assert facts["arch"] == "sm86"
    assert facts["archs"] == ["sm86"]
    assert facts["mixed_arch"] is False
    assert facts["compute_cap"] == "8.6"
    assert facts["memory_total_mib"] == 49140
    assert facts["memory_total_gib"] == pytest.approx(47.99, abs=0.01)
    assert facts["driver_version"] == "570.86.15"
    assert facts["names"] == ["NVIDIA RTX A6000"] * 2
    assert facts["uuids"] == [
        "GPU-a6000000-0000-4000-8000-000000000000",
        "GPU-a6000000-0000-4000-8000-000000000001",
    ]
    assert facts["gpus"][1]["uuid"].endswith("0001")


def test_summary_pro6000_x8():
    facts = g.gpu_facts_from_outputs(PRO6000_QUERY, PRO6000_LIST)
    assert facts["count"] == 8
    assert facts["arch"] == "sm120"
    assert facts["compute_cap"] == "12.0"
    assert facts["memory_total_mib"] == 97887
    assert facts["memory_total_gib"] == pytest.approx(95.59, abs=0.01)
    assert facts["driver_version"] == "575.57.08"
    assert set(facts["names"]) == {PRO6000_NAME}
    assert len(facts["uuids"]) == 8


def test_summary_without_list_has_no_uuids():
    assert g.gpu_facts_from_outputs(A6000_QUERY)["uuids"] == []


def test_crlf_and_blank_lines_tolerated():
    facts = g.gpu_facts_from_outputs("\r\n" + A6000_QUERY.replace("\n", "\r\n") + "\n\n")
    assert facts["count"] == 2


@pytest.mark.parametrize("empty", ["", "   \n\n", None])
def test_empty_output(empty):
    with pytest.raises(ValueError, match="empty output"):
        g.parse_query_gpu(empty)


def test_na_value_names_line_and_field():
    out = "NVIDIA RTX A6000, 8.6, [N/A], 1, 570.86.15\n"
    with pytest.raises(ValueError) as info:
        g.parse_query_gpu(out)
    msg = str(info.value)
    assert "line 1" in msg and "memory.total" in msg and "[N/A]" in msg


def test_not_supported_value():
    with pytest.raises(ValueError, match="compute_cap"):
        g.parse_query_gpu("Tesla K80, [Not Supported], 11441, 0, 470.1\n")


def test_wrong_column_count():
    with pytest.raises(ValueError) as info:
        g.parse_query_gpu(A6000_QUERY + "NVIDIA RTX A6000, 8.6, 49140\n")
    msg = str(info.value)
    assert "line 3" in msg and "3 comma-separated" in msg and "expected 5" in msg


def test_non_numeric_memory():
    with pytest.raises(ValueError, match="memory.used is '1 MiB'.*integer"):
        g.parse_query_gpu("NVIDIA RTX A6000, 8.6, 49140, 1 MiB, 570.86.15\n")


def test_bad_driver_version():
    with pytest.raises(ValueError, match="driver_version"):
        g.parse_query_gpu("NVIDIA RTX A6000, 8.6, 49140, 1, unknown\n")


def test_garbage():
    with pytest.raises(ValueError, match="line 1 .*expected 5"):
        g.parse_query_gpu("Segmentation fault\n")


def test_driver_banner():
    banner = (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running.\n"
    )
    with pytest.raises(ValueError, match="driver problem"):
        g.parse_query_gpu(banner)


def test_mixed_arch_refused_by_default():
    out = "NVIDIA RTX A6000, 8.6, 49140, 1, 575.57.08\n%s, 12.0, 97887, 0, 575.57.08\n" % PRO6000_NAME
    with pytest.raises(ValueError) as info:
        g.gpu_facts_from_outputs(out)
    msg = str(info.value)
    assert "mixed GPU architectures" in msg and "sm86" in msg and "sm120" in msg


def test_mixed_arch_allowed_reports_lowest_and_min_memory():
    out = "%s, 12.0, 97887, 0, 575.57.08\nNVIDIA RTX A6000, 8.6, 49140, 1, 575.57.08\n" % PRO6000_NAME
    facts = g.gpu_facts_from_outputs(out, allow_mixed=True)
    assert facts["arch"] == "sm86"
    assert facts["compute_cap"] == "8.6"
    assert facts["archs"] == ["sm86", "sm120"]
    assert facts["mixed_arch"] is True
    assert facts["memory_total_mib"] == 49140


def test_different_drivers_refused():
    out = "NVIDIA RTX A6000, 8.6, 49140, 1, 570.86.15\nNVIDIA RTX A6000, 8.6, 49140, 1, 575.57.08\n"
    with pytest.raises(ValueError, match="driver versions"):
        g.gpu_facts_from_outputs(out)


def test_parse_list_skips_mig_lines():
    out = A6000_LIST.splitlines()[0] + "\n  MIG 1g.10gb     Device  0: (UUID: MIG-1234)\n"
    assert g.parse_list(out) == [
        {"index": 0, "name": "NVIDIA RTX A6000", "uuid": "GPU-a6000000-0000-4000-8000-000000000000"}
    ]


def test_parse_list_rejects_garbage():
    with pytest.raises(ValueError, match="expected 'GPU <index>: <name> \\(UUID: GPU-...\\)'"):
        g.parse_list("No devices found here\n")


def test_list_count_mismatch():
    with pytest.raises(ValueError, match="lists 1 GPU.*returned 2"):
        g.gpu_facts_from_outputs(A6000_QUERY, A6000_LIST.splitlines()[0])


# ----------------------------------------------------------------- arch rules

@pytest.mark.parametrize("arch", ["sm80", "sm86", "sm89", "sm90"])
def test_fa3_allowed_up_to_hopper(arch):
    assert g.attention_backend_allowed(arch, "fa3")[0] is True


@pytest.mark.parametrize("arch", ["sm100", "sm120"])
def test_fa3_refused_on_blackwell(arch):
    ok, reason = g.attention_backend_allowed(arch, "fa3")
    assert ok is False
    assert "fa3" in reason and arch in reason and "triton" in reason


@pytest.mark.parametrize("arch", ["sm80", "sm86", "sm89"])
def test_trtllm_mha_needs_sm90_plus(arch):
    assert g.attention_backend_allowed(arch, "trtllm_mha")[0] is False


@pytest.mark.parametrize("arch", ["sm90", "sm100", "sm120"])
def test_trtllm_mha_allowed(arch):
    assert g.attention_backend_allowed(arch, "trtllm_mha") == (True, "attention backend 'trtllm_mha' is supported on %s" % arch)


@pytest.mark.parametrize("arch", sorted(g.ATTENTION_BACKENDS_BY_ARCH))
@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
def test_triton_flashinfer_everywhere(arch, backend):
    assert g.attention_backend_allowed(arch, backend)[0] is True


def test_fa4_not_on_sm120_or_ampere():
    assert g.attention_backend_allowed("sm120", "fa4")[0] is False
    assert g.attention_backend_allowed("sm86", "fa4")[0] is False
    assert g.attention_backend_allowed("sm100", "fa4")[0] is True


def test_hybrid_model_on_sm120():
    assert g.attention_backend_allowed("sm120", "flashinfer", hybrid_model=True)[0] is True
    # every backend allowed on sm120 is also allowed for hybrid models there
    for backend in g.ATTENTION_BACKENDS_BY_ARCH["sm120"]:
        assert backend in g.HYBRID_MODEL_BACKENDS_BY_ARCH["sm120"]


def test_trtllm_mha_fp8_kv_on_sm120():
    ok, reason = g.attention_backend_allowed("sm120", "trtllm_mha", kv_cache_dtype="fp8_e4m3")
    assert ok is False and "fp8_e4m3" in reason
    assert g.attention_backend_allowed("sm90", "trtllm_mha", kv_cache_dtype="fp8_e4m3")[0] is True
    assert g.attention_backend_allowed("sm120", "trtllm_mha", kv_cache_dtype="auto")[0] is True


def test_unknown_arch():
    ok, reason = g.attention_backend_allowed("sm75", "triton")
    assert ok is False and "sm75" in reason and "ATTENTION_BACKENDS_BY_ARCH" in reason


def test_unknown_backend():
    ok, reason = g.attention_backend_allowed("sm86", "nonsense")
    assert ok is False and "nonsense" in reason


# ---------------------------------------------------------------- model_fits

def test_27b_bf16_does_not_fit_one_a6000():
    fits, detail = g.model_fits(54, 1, 47.99, 0.88, 4)
    assert fits is False
    assert detail["needed_gib"] == 58
    assert detail["min_tp_size"] == 2
    assert "tp_size to at least 2" in detail["message"]


def test_27b_bf16_fits_two_a6000():
    fits, detail = g.model_fits(54, 2, 47.99, 0.88, 4)
    assert fits is True
    assert detail["per_gpu_weights_gib"] == 27
    assert detail["budget_gib"] == pytest.approx(42.231, abs=0.001)
    assert detail["margin_gib"] > 0
    assert detail["message"].startswith("fits")


def test_27b_fits_one_pro6000():
    assert g.model_fits(54, 1, 95.59, 0.85, 8)[0] is True


def test_exact_boundary_fits():
    assert g.model_fits(40, 1, 50, 0.9, 5)[0] is True


def test_headroom_exceeds_budget():
    fits, detail = g.model_fits(1, 8, 10, 0.5, 6)
    assert fits is False and detail["min_tp_size"] is None
    assert "KV headroom alone" in detail["message"]


@pytest.mark.parametrize(
    "args, match",
    [
        ((54, 0, 48, 0.9, 4), "tp_size"),
        ((54, 1.5, 48, 0.9, 4), "tp_size"),
        ((54, True, 48, 0.9, 4), "tp_size"),
        ((54, 1, 48, 1.5, 4), "mem_fraction_static"),
        ((54, 1, 48, 1.0, 4), "mem_fraction_static"),
        ((54, 1, 48, 0, 4), "mem_fraction_static"),
        ((54, 1, 0, 0.9, 4), "gpu_mem_gib"),
        ((-1, 1, 48, 0.9, 4), "weights_gib"),
        (("lots", 1, 48, 0.9, 4), "weights_gib"),
    ],
)
def test_model_fits_rejects_nonsense(args, match):
    with pytest.raises(ValueError, match=match):
        g.model_fits(*args)
