"""Unit tests for plugins/module_utils/spec.py (pure logic, no host needed)."""

from __future__ import annotations

import struct

import pytest

from ansible_collections.ddtree.fleet.plugins.module_utils import spec as s
from ddtree_testlib import write_safetensors

TARGET = {
    "architectures": ["Qwen3_5ForCausalLM"],
    "hidden_size": 5120,
    "num_hidden_layers": 64,
    "num_nextn_predict_layers": 1,
}
DRAFT = {
    "hidden_size": 5120,
    "num_hidden_layers": 5,
    "block_size": 16,
    "dflash_config": {"target_layer_ids": [1, 16, 31, 46, 61], "mask_token_id": 151669},
}


# ----------------------------------------------------------- DFLASH / DDTREE

@pytest.mark.parametrize("algo", ["DFLASH", "DDTREE", "dflash"])
def test_good_pair(algo):
    r = s.check_compat(algo, TARGET, DRAFT)
    assert r["ok"] is True, r["errors"]
    assert r["errors"] == []
    assert r["algorithm"] == algo.upper()
    assert r["target_hidden_size"] == 5120
    assert r["target_num_layers"] == 64
    assert r["target_layer_ids"] == [1, 16, 31, 46, 61]
    assert r["target_layer_ids_source"] == "draft dflash_config.target_layer_ids"
    assert r["provided_dim"] == r["expected_dim"] == 25600
    assert r["expected_dim_source"] == "config"
    assert r["block_size"] == 16
    assert r["mtp_layers"] == 1


def test_mismatched_hidden_names_both_numbers():
    draft = dict(DRAFT, hidden_size=4096, dflash_config={"target_layer_ids": [1, 9, 17, 25, 33]})
    r = s.check_compat("DDTREE", TARGET, draft)
    assert r["ok"] is False
    assert r["provided_dim"] == 25600 and r["expected_dim"] == 20480
    msg = " ".join(r["errors"])
    assert "expects 20480 features (5 layers x 4096) but target provides 25600" in msg
    assert any("4096" in w and "5120" in w for w in r["warnings"])


def test_one_layer_target_vs_five_layer_draft_weights():
    # a target that only gives 1 layer's hidden states (hidden 5120) vs a 25600-wide projection
    target = dict(TARGET)
    draft = dict(DRAFT, dflash_config={"target_layer_ids": [31]})
    shapes = {"fc.weight": [5120, 25600]}
    r = s.check_compat("DFLASH", target, draft, shapes)
    assert r["ok"] is False
    assert r["provided_dim"] == 5120 and r["expected_dim"] == 25600
    msg = "; ".join(r["errors"])
    assert "draft projection expects 25600 features" in msg and "target provides 5120" in msg


def test_top_level_target_layer_ids_and_block_size_in_dflash_config():
    draft = {"hidden_size": 5120, "num_hidden_layers": 3, "target_layer_ids": [2, 30, 60],
             "dflash_config": {"block_size": 8}}
    r = s.check_compat("DFLASH", TARGET, draft)
    assert r["ok"], r["errors"]
    assert r["target_layer_ids_source"] == "draft target_layer_ids"
    assert r["block_size"] == 8
    assert r["provided_dim"] == 15360


def test_spread_when_no_ids():
    draft = {"hidden_size": 5120, "num_hidden_layers": 5, "block_size": 16}
    r = s.check_compat("DFLASH", TARGET, draft)
    assert r["ok"], r["errors"]
    assert r["target_layer_ids"] == [1, 16, 31, 46, 61]
    assert r["target_layer_ids_source"].startswith("spread from draft num_hidden_layers=5")


@pytest.mark.parametrize(
    "target_layers, draft_layers, expected",
    [(64, 5, [1, 16, 31, 46, 61]), (36, 5, [1, 9, 17, 25, 33]), (40, 1, [20]), (64, 2, [1, 61])],
)
def test_spread_target_layer_ids(target_layers, draft_layers, expected):
    assert s.spread_target_layer_ids(target_layers, draft_layers) == expected


def test_spread_rejects_zero():
    with pytest.raises(ValueError):
        s.spread_target_layer_ids(0, 5)


def test_layer_id_out_of_range():
    draft = dict(DRAFT, dflash_config={"target_layer_ids": [1, 16, 31, 46, 64]})
    r = s.check_compat("DFLASH", TARGET, draft)
    assert r["ok"] is False
    assert "[64]" in r["errors"][0] and "0..63" in r["errors"][0]


def test_negative_layer_id():
    draft = dict(DRAFT, dflash_config={"target_layer_ids": [-1, 16]})
    assert not s.check_compat("DFLASH", TARGET, draft)["ok"]


def test_bad_layer_ids_type():
    draft = dict(DRAFT, dflash_config={"target_layer_ids": "1,2"})
    r = s.check_compat("DFLASH", TARGET, draft)
    assert r["ok"] is False and "list of integers" in r["errors"][0]


def test_missing_block_size():
    draft = {k: v for k, v in DRAFT.items() if k != "block_size"}
    r = s.check_compat("DDTREE", TARGET, draft)
    assert r["ok"] is False
    assert any("block_size" in e for e in r["errors"])


def test_missing_draft():
    r = s.check_compat("DFLASH", TARGET, None)
    assert r["ok"] is False and "needs a draft" in r["errors"][0]


def test_target_missing_hidden_size():
    r = s.check_compat("DFLASH", {"num_hidden_layers": 64}, DRAFT)
    assert r["ok"] is False and any("hidden_size" in e for e in r["errors"])


def test_text_config_wrapped_target():
    target = {"architectures": ["Qwen3_5ForConditionalGeneration"],
              "text_config": {"hidden_size": 5120, "num_hidden_layers": 64, "mtp_num_hidden_layers": 1}}
    r = s.check_compat("DDTREE", target, DRAFT)
    assert r["ok"], r["errors"]
    assert r["provided_dim"] == 25600 and r["mtp_layers"] == 1


def test_weights_override_config_and_agree():
    r = s.check_compat("DFLASH", TARGET, DRAFT, {"model.fc.weight": [5120, 25600], "x": [1]})
    assert r["ok"], r["errors"]
    assert r["expected_dim"] == 25600
    assert r["expected_dim_source"] == "weights:model.fc.weight [5120, 25600]"


def test_weights_disagree_with_config():
    r = s.check_compat("DFLASH", TARGET, DRAFT, {"fc.weight": [5120, 20480]})
    assert r["ok"] is False
    msg = "; ".join(r["errors"])
    assert "implies 25600" in msg and "20480" in msg
    assert "draft projection expects 20480 features" in msg


def test_weights_bad_output_dim():
    r = s.check_compat("DFLASH", TARGET, DRAFT, {"fc.weight": [4096, 25600]})
    assert r["ok"] is False and "outputs 4096" in r["errors"][0]


def test_fc_name_matching_is_exact_suffix():
    assert s.find_fc_weight({"lab_placeholder.fc_weight": [1, 2], "xfc.weight": [1]}) == (None, None)
    assert s.find_fc_weight({"a.fc.weight": [1, 2]}) == ("a.fc.weight", [1, 2])


# -------------------------------------------------------- NEXTN / EAGLE

def test_nextn_ok():
    r = s.check_compat("NEXTN", TARGET)
    assert r["ok"] and r["mtp_layers"] == 1


def test_nextn_without_mtp():
    target = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 36}
    r = s.check_compat("NEXTN", target)
    assert r["ok"] is False
    assert "MTP" in r["errors"][0] and "Qwen3ForCausalLM" in r["errors"][0]


def test_nextn_zero_mtp():
    assert not s.check_compat("NEXTN", dict(TARGET, num_nextn_predict_layers=0))["ok"]


def test_nextn_mtp_in_text_config():
    target = {"text_config": {"hidden_size": 5120, "num_hidden_layers": 64, "mtp_num_hidden_layers": 2}}
    r = s.check_compat("NEXTN", target)
    assert r["ok"] and r["mtp_layers"] == 2


@pytest.mark.parametrize("algo", ["EAGLE", "EAGLE3"])
def test_eagle_needs_draft(algo):
    assert not s.check_compat(algo, TARGET, None)["ok"]
    assert s.check_compat(algo, TARGET, {"hidden_size": 5120})["ok"]


def test_unknown_algorithm():
    r = s.check_compat("MEDUSA", TARGET)
    assert r["ok"] is False and "unknown speculative algorithm" in r["errors"][0]


def test_target_not_a_dict():
    assert not s.check_compat("NEXTN", ["x"])["ok"]


# --------------------------------------------------------- safetensors

def test_read_header_roundtrip(tmp_path):
    path = write_safetensors(tmp_path / "a.safetensors", {"fc.weight": [8, 40], "norm": [8]}, pad=3)
    assert s.read_safetensors_header(path) == {"fc.weight": [8, 40], "norm": [8]}
    entries = s.read_safetensors_entries(path)
    assert entries["norm"]["data_offsets"] == [640, 656]


def test_read_header_never_reads_data(tmp_path, monkeypatch):
    path = write_safetensors(tmp_path / "a.safetensors", {"big": [256, 256]})
    reads = []
    real_open = open

    class Spy:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def read(self, n=-1):
            reads.append(n)
            return self.handle.read(n)

    monkeypatch.setattr("builtins.open", lambda p, mode="r", *a, **k: Spy(real_open(p, mode, *a, **k)))
    s.read_safetensors_header(str(path))
    assert reads[0] == 8 and len(reads) == 2 and reads[1] < 1000


def test_header_length_too_big(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", 10**6) + b"{}")
    with pytest.raises(ValueError, match="impossible"):
        s.read_safetensors_header(path)


def test_truncated_file(tmp_path):
    path = tmp_path / "short.safetensors"
    path.write_bytes(b"abc")
    with pytest.raises(ValueError, match="8-byte"):
        s.read_safetensors_header(path)


def test_header_not_json(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", 4) + b"\xff\xfe{}")
    with pytest.raises(ValueError, match="not valid UTF-8 JSON"):
        s.read_safetensors_header(path)


def test_offsets_outside_data(tmp_path):
    def grow(header):
        header["t"]["data_offsets"][1] += 2

    path = write_safetensors(tmp_path / "x.safetensors", {"t": [4]}, corrupt=grow)
    with pytest.raises(ValueError, match="data_offsets"):
        s.read_safetensors_header(path)


def test_bad_shape(tmp_path):
    def bad(header):
        header["t"]["shape"] = ["4"]

    path = write_safetensors(tmp_path / "x.safetensors", {"t": [4]}, corrupt=bad)
    with pytest.raises(ValueError, match="shape"):
        s.read_safetensors_header(path)


def test_collect_shapes(tmp_path):
    write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {"fc.weight": [8, 40]})
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"norm": [8]})
    (tmp_path / "config.json").write_text("{}")
    assert s.collect_safetensors_shapes(str(tmp_path)) == {"fc.weight": [8, 40], "norm": [8]}


def test_collect_shapes_duplicate(tmp_path):
    write_safetensors(tmp_path / "a.safetensors", {"norm": [8]})
    write_safetensors(tmp_path / "b.safetensors", {"norm": [8]})
    with pytest.raises(ValueError, match="both a.safetensors and b.safetensors"):
        s.collect_safetensors_shapes(str(tmp_path))


def test_collect_shapes_empty_dir(tmp_path):
    assert s.collect_safetensors_shapes(str(tmp_path)) == {}


def test_load_config_errors(tmp_path):
    with pytest.raises(ValueError, match="not a directory"):
        s.load_config(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="config.json not found"):
        s.load_config(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not readable JSON"):
        s.load_config(str(tmp_path))
    (tmp_path / "config.json").write_text("[]")
    with pytest.raises(ValueError, match="JSON object"):
        s.load_config(str(tmp_path))
