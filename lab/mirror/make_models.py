#!/usr/bin/env python3
"""Generate the lab's model mirror: small, deterministic stand-ins for the fleet's models.

Usage: python3 lab/mirror/make_models.py OUTDIR

Writes, for each model, OUTDIR/<repo_id>/<revision>/ with:
  * config.json (the real architecture numbers the deploy checks: hidden_size,
    num_hidden_layers, MTP layers, DFlash target_layer_ids, block_size, ...),
  * other small metadata files,
  * VALID safetensors shards holding tiny PLACEHOLDER tensors (named ``lab_placeholder.*``,
    announced in each header's ``__metadata__``). They are not the model's weights and
    deliberately contain no ``fc.weight``: a real DFlash projection [5120, 25600] bf16 is
    262 MB, so in the lab the projection width comes from config.json only,
  * manifest.json = {"repo_id", "revision", "files": [{"path", "size", "sha256"}], "total_size"}.
Plus OUTDIR/index.json listing the models. Prints a JSON summary with each model's
manifest sha256 (the deploy pins those).

Every byte is a pure function of this file: running it twice gives identical output.
Only the Python standard library is used.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys

MIRROR_FORMAT = 1

TARGET_REPO = "Qwen/Qwen3.6-27B"
DRAFT_REPO = "z-lab/Qwen3.6-27B-DFlash"
MISMATCH_DRAFT_REPO = "z-lab/Qwen3-8B-DFlash"

VOCAB_SIZE = 151936
MASK_TOKEN_ID = 151669


def revision_for(repo_id):
    """Fixed 40-hex revision of a lab model (a pure function of the repo id)."""
    return hashlib.sha1(("ddtree-lab-mirror/v%d/%s" % (MIRROR_FORMAT, repo_id)).encode()).hexdigest()


def dumps(obj):
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8")


# --------------------------------------------------------------------------
# deterministic tensor bytes and safetensors writer
# --------------------------------------------------------------------------

# bf16 high byte: keep the sign bit, force exponent 118..121, so every value is a small
# finite number (|x| between ~2^-9 and ~2^-5), never NaN/Inf.
_HIGH_BYTE = bytes((b & 0x80) | (0x3C if b & 1 else 0x3B) for b in range(256))


def bf16_bytes(seed, count):
    """``count`` deterministic bf16 values (little-endian) derived from ``seed``."""
    raw = bytearray(hashlib.shake_256(seed.encode("utf-8")).digest(2 * count))
    raw[1::2] = bytes(raw[1::2]).translate(_HIGH_BYTE)
    return bytes(raw)


def safetensors_bytes(tensors, metadata):
    """Serialize ``[(name, shape)]`` bf16 tensors into a valid safetensors file."""
    header = {"__metadata__": dict(metadata)}
    blobs = []
    offset = 0
    for name, shape in tensors:
        count = 1
        for dim in shape:
            count *= dim
        data = bf16_bytes("%s|%s" % (metadata.get("repo_id", ""), name), count)
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    text += b" " * (-(len(text)) % 8)  # the format allows trailing spaces; keep data 8-byte aligned
    return struct.pack("<Q", len(text)) + text + b"".join(blobs), offset


# --------------------------------------------------------------------------
# model definitions
# --------------------------------------------------------------------------

def _placeholder_note(repo_id):
    return {
        "format": "pt",
        "repo_id": repo_id,
        "ddtree_lab": "placeholder tensors for the lab mirror; not model weights",
    }


def target_model():
    layers = 64
    config = {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "torch_dtype": "bfloat16",
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "num_hidden_layers": layers,
        "num_attention_heads": 24,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        "full_attention_interval": 4,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 48,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "num_nextn_predict_layers": 1,
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000000,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "vocab_size": VOCAB_SIZE,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "transformers_version": "4.57.1",
        "ddtree_lab": {"placeholder_weights": True, "real_weights_gib": 50.3},
    }
    shards = [
        [("lab_placeholder.embed_tokens", [512, 256]), ("lab_placeholder.layers.0", [256, 256])],
        [("lab_placeholder.layers.31", [256, 512]), ("lab_placeholder.layers.32", [256, 256])],
        [("lab_placeholder.layers.63", [256, 256]), ("lab_placeholder.lm_head", [512, 256])],
    ]
    files = {
        "config.json": dumps(config),
        "generation_config.json": dumps(
            {"bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643],
             "pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95}
        ),
        "tokenizer_config.json": dumps(
            {"tokenizer_class": "Qwen2Tokenizer", "model_max_length": 262144, "bos_token": None,
             "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": False,
             "clean_up_tokenization_spaces": False}
        ),
    }
    files.update(_sharded_weights(TARGET_REPO, shards))
    return TARGET_REPO, "target", files


def _sharded_weights(repo_id, shards):
    files = {}
    weight_map = {}
    total = 0
    count = len(shards)
    for number, tensors in enumerate(shards, start=1):
        name = "model-%05d-of-%05d.safetensors" % (number, count)
        data, size = safetensors_bytes(tensors, _placeholder_note(repo_id))
        files[name] = data
        total += size
        for tensor, _shape in tensors:
            weight_map[tensor] = name
    files["model.safetensors.index.json"] = dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    return files


def draft_model(repo_id, hidden, target_layer_ids, num_target_layers, intermediate, heads):
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "torch_dtype": "bfloat16",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": len(target_layer_ids),
        "num_attention_heads": heads,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_target_layers": num_target_layers,
        "block_size": 16,
        "dflash_config": {"target_layer_ids": list(target_layer_ids), "mask_token_id": MASK_TOKEN_ID},
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "vocab_size": VOCAB_SIZE,
        "transformers_version": "4.57.1",
        "ddtree_lab": {
            "placeholder_weights": True,
            "projection": {"in_features": len(target_layer_ids) * hidden, "out_features": hidden},
        },
    }
    tensors = [("lab_placeholder.layers.%d" % i, [128, 256]) for i in range(len(target_layer_ids))]
    tensors.append(("lab_placeholder.norm", [256]))
    data, _size = safetensors_bytes(tensors, _placeholder_note(repo_id))
    return {"config.json": dumps(config), "model.safetensors": data}


def models():
    """``[(repo_id, role, {relative_path: bytes})]`` for every lab model, in a fixed order."""
    target = target_model()
    good = (DRAFT_REPO, "draft",
            draft_model(DRAFT_REPO, 5120, [1, 16, 31, 46, 61], 64, 17408, 32))
    bad = (MISMATCH_DRAFT_REPO, "draft-mismatch",
           draft_model(MISMATCH_DRAFT_REPO, 4096, [1, 9, 17, 25, 33], 36, 12288, 32))
    out = []
    for repo_id, role, files in (target, good, bad):
        files = dict(files)
        files["README.md"] = (
            "# %s (ddtree lab mirror)\n\nGenerated by lab/mirror/make_models.py. config.json carries the real\n"
            "architecture numbers; the safetensors shards hold tiny placeholder tensors, not weights.\n"
            % repo_id
        ).encode("utf-8")
        out.append((repo_id, role, files))
    return out


# --------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------

def _write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def build_manifest(repo_id, revision, files):
    entries = [
        {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        for path, data in sorted(files.items())
    ]
    return {
        "repo_id": repo_id,
        "revision": revision,
        "files": entries,
        "total_size": sum(entry["size"] for entry in entries),
    }


def generate(outdir):
    """Write the mirror under ``outdir``; return the summary dict that is printed."""
    summary = []
    for repo_id, role, files in models():
        revision = revision_for(repo_id)
        root = os.path.join(outdir, *repo_id.split("/"), revision)
        for path, data in sorted(files.items()):
            _write(os.path.join(root, path), data)
        manifest = dumps(build_manifest(repo_id, revision, files))
        _write(os.path.join(root, "manifest.json"), manifest)
        summary.append({
            "repo_id": repo_id,
            "revision": revision,
            "role": role,
            "path": "%s/%s" % (repo_id, revision),
            "manifest_sha256": hashlib.sha256(manifest).hexdigest(),
            "total_size": sum(len(data) for data in files.values()),
            "files": len(files),
        })
    index = {"format": MIRROR_FORMAT, "models": summary}
    _write(os.path.join(outdir, "index.json"), dumps(index))
    return index


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        sys.stderr.write("usage: %s OUTDIR\n" % os.path.basename(argv[0]))
        return 2
    index = generate(argv[1])
    sys.stdout.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
