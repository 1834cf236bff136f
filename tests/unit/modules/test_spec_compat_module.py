"""Tests for plugins/modules/spec_compat.py against the generated lab mirror and small fixtures."""

from __future__ import annotations

import json

from ddtree_testlib import model_dir, run_adhoc, write_safetensors

TARGET = "Qwen/Qwen3.6-27B"
GOOD = "z-lab/Qwen3.6-27B-DFlash"
BAD = "z-lab/Qwen3-8B-DFlash"


def _dirs(mirror):
    outdir, summary = mirror
    return {repo: str(model_dir(outdir, summary, repo)) for repo in (TARGET, GOOD, BAD)}


def test_ddtree_good_pair(run_module, mirror):
    d = _dirs(mirror)
    res = run_module("spec_compat", {"algorithm": "DDTREE", "target_path": d[TARGET], "draft_path": d[GOOD]})
    assert not res.failed, res.result["msg"]
    r = res.result
    assert r["changed"] is False and r["ok"] is True
    assert r["provided_dim"] == r["expected_dim"] == 25600
    assert r["target_layer_ids"] == [1, 16, 31, 46, 61]
    assert r["block_size"] == 16
    assert r["target_hidden_size"] == 5120 and r["target_num_layers"] == 64
    assert r["mtp_layers"] == 1
    # the lab shards hold placeholder tensors only: the width comes from config.json
    assert r["expected_dim_source"] == "config" and r["weights_checked"] is False
    assert r["errors"] == [] and r["warnings_found"] == []


def test_dflash_good_pair_check_mode(run_module, mirror):
    d = _dirs(mirror)
    res = run_module(
        "spec_compat", {"algorithm": "DFLASH", "target_path": d[TARGET], "draft_path": d[GOOD]}, check_mode=True
    )
    assert not res.failed and res.result["changed"] is False


def test_mismatched_draft_fails_with_both_numbers(run_module, mirror):
    d = _dirs(mirror)
    res = run_module("spec_compat", {"algorithm": "DDTREE", "target_path": d[TARGET], "draft_path": d[BAD]})
    assert res.failed
    msg = res.result["msg"]
    assert "incompatible" in msg and "20480" in msg and "25600" in msg
    assert res.result["provided_dim"] == 25600 and res.result["expected_dim"] == 20480
    assert res.result["ok"] is False


def test_nextn_on_target(run_module, mirror):
    d = _dirs(mirror)
    res = run_module("spec_compat", {"algorithm": "NEXTN", "target_path": d[TARGET]})
    assert not res.failed and res.result["mtp_layers"] == 1


def test_nextn_ignores_draft_path(run_module, mirror, tmp_path):
    d = _dirs(mirror)
    res = run_module("spec_compat", {"algorithm": "NEXTN", "target_path": d[TARGET],
                                     "draft_path": str(tmp_path / "missing")})
    assert not res.failed and res.result["draft_path"] is None


def test_nextn_on_draft_without_mtp(run_module, mirror):
    d = _dirs(mirror)
    res = run_module("spec_compat", {"algorithm": "NEXTN", "target_path": d[GOOD]})
    assert res.failed and "MTP" in res.result["msg"]


def test_draft_path_required(run_module, mirror):
    d = _dirs(mirror)
    res = run_module("spec_compat", {"algorithm": "DFLASH", "target_path": d[TARGET]})
    assert res.failed and "draft_path" in res.result["msg"]


def test_missing_target_config(run_module, tmp_path, mirror):
    res = run_module("spec_compat", {"algorithm": "DFLASH", "target_path": str(tmp_path),
                                     "draft_path": _dirs(mirror)[GOOD]})
    assert res.failed and res.result["msg"].startswith("target model:") and "config.json not found" in res.result["msg"]


def test_missing_draft_dir(run_module, mirror, tmp_path):
    res = run_module("spec_compat", {"algorithm": "EAGLE3", "target_path": _dirs(mirror)[TARGET],
                                     "draft_path": str(tmp_path / "nope")})
    assert res.failed and res.result["msg"].startswith("draft model:")


def _draft_with_weights(tmp_path, fc_shape, hidden=64, ids=(1, 2, 3, 4, 5)):
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps(
        {"hidden_size": hidden, "num_hidden_layers": len(ids), "block_size": 8,
         "dflash_config": {"target_layer_ids": list(ids)}}))
    write_safetensors(draft / "model.safetensors", {"fc.weight": fc_shape, "norm": [hidden]})
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 8}))
    return str(target), str(draft)


def test_weights_used_when_present(run_module, tmp_path):
    target, draft = _draft_with_weights(tmp_path, [64, 320])
    res = run_module("spec_compat", {"algorithm": "DFLASH", "target_path": target, "draft_path": draft})
    assert not res.failed, res.result["msg"]
    assert res.result["weights_checked"] is True
    assert res.result["expected_dim"] == 320
    assert res.result["expected_dim_source"] == "weights:fc.weight [64, 320]"


def test_weights_disagree(run_module, tmp_path):
    target, draft = _draft_with_weights(tmp_path, [64, 256])
    res = run_module("spec_compat", {"algorithm": "DFLASH", "target_path": target, "draft_path": draft})
    assert res.failed and "256" in res.result["msg"] and "320" in res.result["msg"]
    res = run_module("spec_compat", {"algorithm": "DFLASH", "target_path": target, "draft_path": draft,
                                     "read_weights": False})
    assert not res.failed and res.result["weights_checked"] is False


def test_corrupt_safetensors(run_module, tmp_path):
    target, draft = _draft_with_weights(tmp_path, [64, 320])
    with open(draft + "/model.safetensors", "r+b") as handle:
        handle.write(b"\xff" * 8)
    res = run_module("spec_compat", {"algorithm": "DFLASH", "target_path": target, "draft_path": draft})
    assert res.failed and "safetensors" in res.result["msg"] and "read_weights=false" in res.result["msg"]


def test_warning_for_hidden_mismatch(run_module, tmp_path):
    target, draft = _draft_with_weights(tmp_path, [32, 160], hidden=32)
    res = run_module("spec_compat", {"algorithm": "DFLASH", "target_path": target, "draft_path": draft})
    assert res.failed  # 5 x 64 provided vs 160 expected
    assert any("differs from target hidden_size" in w for w in res.result["warnings_found"])


def test_through_ansible_adhoc(mirror, tmp_path):
    d = _dirs(mirror)
    rc, status, result, raw = run_adhoc(
        tmp_path, "spec_compat", "algorithm=DDTREE target_path=%s draft_path=%s" % (d[TARGET], d[BAD]))
    assert rc != 0 and status == "FAILED!", raw
    assert "draft projection expects 20480 features" in result["msg"]
    assert "target provides 25600" in result["msg"]
