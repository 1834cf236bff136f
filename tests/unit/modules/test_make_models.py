"""Tests for lab/mirror/make_models.py: determinism, manifests, valid safetensors, compat."""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys
from pathlib import Path

from ansible_collections.ddtree.fleet.plugins.module_utils import spec as ddtree_spec
from ddtree_testlib import MAKE_MODELS, model_dir

REPOS = ("Qwen/Qwen3.6-27B", "z-lab/Qwen3.6-27B-DFlash", "z-lab/Qwen3-8B-DFlash")


def _tree(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(Path(root).rglob("*")) if p.is_file()}


def test_deterministic(mirror, tmp_path):
    outdir, summary = mirror
    proc = subprocess.run([sys.executable, str(MAKE_MODELS), str(tmp_path / "again")],
                          capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(proc.stdout) == summary
    assert _tree(outdir) == _tree(tmp_path / "again")


def test_usage_error(tmp_path):
    proc = subprocess.run([sys.executable, str(MAKE_MODELS)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "usage" in proc.stderr


def test_summary_and_index(mirror):
    outdir, summary = mirror
    assert [m["repo_id"] for m in summary["models"]] == list(REPOS)
    index = json.loads((Path(outdir) / "index.json").read_text())
    assert index == summary
    for model in summary["models"]:
        assert len(model["revision"]) == 40 and int(model["revision"], 16) >= 0
        assert model["path"] == "%s/%s" % (model["repo_id"], model["revision"])
        manifest_bytes = (Path(outdir) / model["path"] / "manifest.json").read_bytes()
        assert hashlib.sha256(manifest_bytes).hexdigest() == model["manifest_sha256"]


def test_manifests_match_files(mirror):
    outdir, summary = mirror
    for model in summary["models"]:
        root = Path(outdir) / model["path"]
        manifest = json.loads((root / "manifest.json").read_text())
        assert manifest["repo_id"] == model["repo_id"] and manifest["revision"] == model["revision"]
        listed = {f["path"] for f in manifest["files"]}
        on_disk = {p.name for p in root.iterdir()} - {"manifest.json"}
        assert listed == on_disk
        for entry in manifest["files"]:
            data = (root / entry["path"]).read_bytes()
            assert len(data) == entry["size"]
            assert hashlib.sha256(data).hexdigest() == entry["sha256"]
        assert manifest["total_size"] == sum(f["size"] for f in manifest["files"]) == model["total_size"]


def test_sizes_are_small(mirror):
    _outdir, summary = mirror
    total = sum(m["total_size"] for m in summary["models"])
    assert 200_000 < total < 3_000_000


def test_safetensors_are_valid(mirror):
    outdir, summary = mirror
    files = sorted(Path(outdir).rglob("*.safetensors"))
    assert len(files) == 5
    for path in files:
        raw = path.read_bytes()
        (length,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + length])
        assert header["__metadata__"]["format"] == "pt"
        assert "placeholder" in header["__metadata__"]["ddtree_lab"]
        data = raw[8 + length:]
        spans = sorted(tuple(v["data_offsets"]) for k, v in header.items() if k != "__metadata__")
        # contiguous, covering the whole data section, sizes matching shape x 2 bytes (BF16)
        assert spans[0][0] == 0 and spans[-1][1] == len(data)
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            count = 1
            for dim in entry["shape"]:
                count *= dim
            assert entry["dtype"] == "BF16"
            assert entry["data_offsets"][1] - entry["data_offsets"][0] == 2 * count
            blob = data[entry["data_offsets"][0]:entry["data_offsets"][1]]
            # every bf16 value is finite (exponent bits never all ones)
            assert all((blob[i + 1] & 0x7F) != 0x7F for i in range(0, len(blob), 2))
        assert ddtree_spec.read_safetensors_header(str(path))
        # no fake projection weight: the lab's projection width lives in config.json only
        assert ddtree_spec.find_fc_weight(ddtree_spec.read_safetensors_header(str(path))) == (None, None)


def test_target_index_json(mirror):
    outdir, summary = mirror
    root = model_dir(outdir, summary, "Qwen/Qwen3.6-27B")
    index = json.loads((root / "model.safetensors.index.json").read_text())
    shards = sorted(root.glob("model-*-of-00003.safetensors"))
    assert len(shards) == 3
    assert set(index["weight_map"].values()) == {p.name for p in shards}
    total = 0
    for shard in shards:
        for name, entry in ddtree_spec.read_safetensors_entries(str(shard)).items():
            assert index["weight_map"][name] == shard.name
            total += entry["data_offsets"][1] - entry["data_offsets"][0]
    assert index["metadata"]["total_size"] == total


def test_configs(mirror):
    outdir, summary = mirror
    target = ddtree_spec.load_config(str(model_dir(outdir, summary, "Qwen/Qwen3.6-27B")))
    assert target["hidden_size"] == 5120 and target["num_hidden_layers"] == 64
    assert target["num_nextn_predict_layers"] == 1 and target["torch_dtype"] == "bfloat16"
    assert target["vocab_size"] == 151936 and target["architectures"]
    draft = ddtree_spec.load_config(str(model_dir(outdir, summary, "z-lab/Qwen3.6-27B-DFlash")))
    assert draft["dflash_config"]["target_layer_ids"] == [1, 16, 31, 46, 61]
    assert draft["block_size"] == 16 and draft["num_hidden_layers"] == 5
    assert "mask_token_id" in draft["dflash_config"]


def test_good_draft_passes_check_compat(mirror):
    outdir, summary = mirror
    target = ddtree_spec.load_config(str(model_dir(outdir, summary, "Qwen/Qwen3.6-27B")))
    draft_dir = str(model_dir(outdir, summary, "z-lab/Qwen3.6-27B-DFlash"))
    draft = ddtree_spec.load_config(draft_dir)
    shapes = ddtree_spec.collect_safetensors_shapes(draft_dir)
    for algo in ("DFLASH", "DDTREE"):
        r = ddtree_spec.check_compat(algo, target, draft, shapes)
        assert r["ok"], r["errors"]
        assert r["provided_dim"] == r["expected_dim"] == 25600


def test_mismatch_draft_fails_check_compat(mirror):
    outdir, summary = mirror
    target = ddtree_spec.load_config(str(model_dir(outdir, summary, "Qwen/Qwen3.6-27B")))
    draft = ddtree_spec.load_config(str(model_dir(outdir, summary, "z-lab/Qwen3-8B-DFlash")))
    r = ddtree_spec.check_compat("DDTREE", target, draft)
    assert r["ok"] is False
    msg = "; ".join(r["errors"])
    assert "20480" in msg and "25600" in msg
