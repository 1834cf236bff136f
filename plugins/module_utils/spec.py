# -*- coding: utf-8 -*-
"""Speculative-decoding compatibility checks between a target and a draft model.

Pure logic: no Ansible import.

What is checked (sglang 0.5.23, docs "Hidden-state dimensions")
----------------------------------------------------------------
DFLASH / DDTREE
    * The target layers whose hidden states are captured come from the DRAFT
      config: ``dflash_config.target_layer_ids`` or a top-level
      ``target_layer_ids``; otherwise they are spread from the draft's
      ``num_hidden_layers`` over the target's layers (:func:`spread_target_layer_ids`).
    * Every id must satisfy ``0 <= id < target num_hidden_layers``.
    * The draft must declare ``block_size`` (top level or in ``dflash_config``).
      sglang itself falls back to 16 when it is missing; the fleet refuses such
      a draft because DDTREE sizes its verify tree from it and a draft without
      it is usually not a DFlash checkpoint at all.
    * ``provided_dim = len(target_layer_ids) * target hidden_size`` must equal
      the draft projection's input features: from the draft's ``fc`` weight
      shape ``[hidden, in_features]`` when safetensors headers are available,
      else ``len(target_layer_ids) * draft hidden_size`` (the projection is
      ``Linear(len(ids) * hidden_size, hidden_size)``).
NEXTN
    The target must carry MTP layers (``num_nextn_predict_layers`` or
    ``mtp_num_hidden_layers`` > 0, also inside ``text_config``).
EAGLE / EAGLE3
    A draft model is required.
"""

from __future__ import annotations

import glob
import json
import os
import struct

# The algorithm names are ddtree_flags' (one list for the command line, the compatibility check,
# the spec_compat module's choices; tests/unit/flags checks the argument specs' Limits and the role vars against it).
from ansible_collections.ddtree.fleet.plugins.module_utils.flags import ALGORITHMS, DFLASH_FAMILY  # noqa: F401  (re-exported)
from ansible_collections.ddtree.fleet.plugins.module_utils.flags import DRAFT_ALGORITHMS as DRAFT_REQUIRED
MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")
NESTED_CONFIG_KEYS = ("text_config", "language_config", "llm_config")
FC_WEIGHT_NAMES = ("fc.weight",)

# A safetensors header is JSON; real ones are well below this.
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024


def _lookup(config, key):
    """Value of ``key`` at the top level of ``config`` or in a nested text config."""
    if not isinstance(config, dict):
        return None
    for sub in [config] + [config.get(nested) for nested in NESTED_CONFIG_KEYS]:
        if isinstance(sub, dict) and sub.get(key) is not None:
            return sub[key]
    return None


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(value):
    return _is_int(value) and value > 0


def mtp_layer_count(config):
    """Number of MTP (next-n prediction) layers a target config declares (0 if none)."""
    counts = [_lookup(config, key) for key in MTP_KEYS]
    return max([count for count in counts if _positive_int(count)], default=0)


def spread_target_layer_ids(num_target_layers, num_draft_layers):
    """Spread ``num_draft_layers`` capture points over the target's layers.

    One draft layer captures the middle target layer; otherwise the points run
    evenly from layer 1 to layer ``num_target_layers - 3`` (64 target layers,
    5 draft layers -> [1, 16, 31, 46, 61]).
    """
    if not _positive_int(num_target_layers) or not _positive_int(num_draft_layers):
        raise ValueError(
            "cannot spread target layers: need positive layer counts, got target=%r draft=%r"
            % (num_target_layers, num_draft_layers)
        )
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    first, last = 1, num_target_layers - 3
    step = (last - first) / (num_draft_layers - 1)
    return [int(round(first + i * step)) for i in range(num_draft_layers)]


def draft_target_layer_ids(draft_config):
    """``(ids, source)`` declared by a DFlash draft config, or ``(None, None)``."""
    dflash = draft_config.get("dflash_config") if isinstance(draft_config, dict) else None
    if isinstance(dflash, dict) and dflash.get("target_layer_ids") is not None:
        return dflash["target_layer_ids"], "draft dflash_config.target_layer_ids"
    if isinstance(draft_config, dict) and draft_config.get("target_layer_ids") is not None:
        return draft_config["target_layer_ids"], "draft target_layer_ids"
    return None, None


def draft_block_size(draft_config):
    """The draft's ``block_size``: top level first, then in ``dflash_config``."""
    if not isinstance(draft_config, dict):
        return None
    for where in (draft_config, draft_config.get("dflash_config")):
        if isinstance(where, dict) and where.get("block_size") is not None:
            return where["block_size"]
    return None


def find_fc_weight(shapes):
    """``(name, shape)`` of the draft's input projection weight, or ``(None, None)``."""
    for name in sorted(shapes or ()):
        if any(name == wanted or name.endswith("." + wanted) for wanted in FC_WEIGHT_NAMES):
            return name, shapes[name]
    return None, None


def check_compat(algorithm, target_config, draft_config=None, draft_weight_shapes=None):
    """Check that ``draft_config`` can serve ``target_config`` under ``algorithm``.

    Returns a dict: ok, errors, warnings, algorithm, target_hidden_size,
    target_num_layers, target_layer_ids, target_layer_ids_source, provided_dim,
    expected_dim, expected_dim_source, block_size, mtp_layers.
    """
    algo = str(algorithm or "").strip().upper()
    errors = []
    warnings = []
    result = {
        "ok": False,
        "errors": errors,
        "warnings": warnings,
        "algorithm": algo,
        "target_hidden_size": None,
        "target_num_layers": None,
        "target_layer_ids": None,
        "target_layer_ids_source": None,
        "provided_dim": None,
        "expected_dim": None,
        "expected_dim_source": None,
        "block_size": None,
        "mtp_layers": 0,
    }
    if algo not in ALGORITHMS:
        errors.append("unknown speculative algorithm %r; expected one of %s" % (algorithm, ", ".join(ALGORITHMS)))
        return result
    if not isinstance(target_config, dict):
        errors.append("target config must be a JSON object (config.json), got %s" % type(target_config).__name__)
        return result

    result["target_hidden_size"] = _lookup(target_config, "hidden_size")
    result["target_num_layers"] = _lookup(target_config, "num_hidden_layers")
    result["mtp_layers"] = mtp_layer_count(target_config)

    if algo in DRAFT_REQUIRED and draft_config is None:
        errors.append("%s needs a draft model (speculative_draft_model_path); none was given" % algo)
    elif draft_config is not None and not isinstance(draft_config, dict):
        errors.append("draft config must be a JSON object (config.json), got %s" % type(draft_config).__name__)
        draft_config = None

    if algo == "NEXTN":
        if result["mtp_layers"] <= 0:
            errors.append(
                "NEXTN needs a target with MTP layers (num_nextn_predict_layers or mtp_num_hidden_layers > 0, "
                "top level or in text_config); target %s declares none"
                % (", ".join(target_config.get("architectures") or []) or "config")
            )
    elif algo in DFLASH_FAMILY and draft_config is not None:
        _check_dflash(result, target_config, draft_config, draft_weight_shapes)

    result["ok"] = not errors
    return result


def _check_dflash(result, target_config, draft_config, draft_weight_shapes):
    errors = result["errors"]
    warnings = result["warnings"]
    algo = result["algorithm"]
    hidden = result["target_hidden_size"]
    layers = result["target_num_layers"]
    draft_hidden = _lookup(draft_config, "hidden_size")
    draft_layers = _lookup(draft_config, "num_hidden_layers")
    for config, key, value in (("target", "hidden_size", hidden),
                               ("target", "num_hidden_layers", layers),
                               ("draft", "hidden_size", draft_hidden)):
        if not _positive_int(value):
            errors.append("%s config has no positive integer %s (got %r)" % (config, key, value))

    block = draft_block_size(draft_config)
    result["block_size"] = block
    if block is None:
        errors.append(
            "%s draft config has no block_size (top level or in dflash_config); expected the DFlash "
            "block size (sglang would silently assume 16)" % algo
        )
    elif not _positive_int(block):
        errors.append("draft block_size must be a positive integer, got %r" % (block,))

    ids, source = draft_target_layer_ids(draft_config)
    if ids is None:
        if _positive_int(layers) and _positive_int(draft_layers):
            ids = spread_target_layer_ids(layers, draft_layers)
            source = "spread from draft num_hidden_layers=%d over %d target layers" % (draft_layers, layers)
        else:
            errors.append(
                "draft declares no target_layer_ids (dflash_config or top level) and they cannot be spread: "
                "target num_hidden_layers=%r, draft num_hidden_layers=%r" % (layers, draft_layers)
            )
            return
    result["target_layer_ids_source"] = source
    if not isinstance(ids, list) or not ids or not all(_is_int(i) for i in ids):
        errors.append("%s must be a non-empty list of integers, got %r" % (source, ids))
        return
    result["target_layer_ids"] = list(ids)
    if _positive_int(layers):
        bad = [i for i in ids if i < 0 or i >= layers]
        if bad:
            errors.append(
                "%s %s reference target layers %s outside 0..%d (target has num_hidden_layers=%d); "
                "the draft was built for a different target" % (source, ids, bad, layers - 1, layers)
            )
    if len(set(ids)) != len(ids):
        warnings.append("%s %s repeats layer ids" % (source, ids))
    if _positive_int(draft_hidden) and _positive_int(hidden) and draft_hidden != hidden:
        warnings.append(
            "draft hidden_size %d differs from target hidden_size %d; DFlash drafts normally share the "
            "target's embedding and LM head" % (draft_hidden, hidden)
        )

    count = len(ids)
    if _positive_int(hidden):
        result["provided_dim"] = count * hidden

    config_expected = count * draft_hidden if _positive_int(draft_hidden) else None
    fc_name, fc_shape = find_fc_weight(draft_weight_shapes)
    if fc_name is not None:
        if not (isinstance(fc_shape, (list, tuple)) and len(fc_shape) == 2 and all(_is_int(d) for d in fc_shape)):
            errors.append("draft weight %s has shape %r; expected [hidden_size, in_features]" % (fc_name, fc_shape))
            return
        result["expected_dim"] = int(fc_shape[1])
        result["expected_dim_source"] = "weights:%s %s" % (fc_name, list(fc_shape))
        if config_expected is not None and config_expected != fc_shape[1]:
            errors.append(
                "draft weight %s %s has %d input features but the draft config implies %d "
                "(%d layers x hidden_size %d); the draft checkpoint is inconsistent"
                % (fc_name, list(fc_shape), fc_shape[1], config_expected, count, draft_hidden)
            )
        if _positive_int(draft_hidden) and fc_shape[0] != draft_hidden:
            errors.append(
                "draft weight %s %s outputs %d features but draft hidden_size is %d"
                % (fc_name, list(fc_shape), fc_shape[0], draft_hidden)
            )
        expected_detail = "per %s %s" % (fc_name, list(fc_shape))
    else:
        result["expected_dim"] = config_expected
        result["expected_dim_source"] = "config" if config_expected is not None else None
        expected_detail = "(%d layers x %d)" % (count, draft_hidden) if config_expected else ""

    provided, expected = result["provided_dim"], result["expected_dim"]
    if provided is not None and expected is not None and provided != expected:
        errors.append(
            "draft projection expects %d features %s but target provides %d (%d layers x target "
            "hidden_size %d); sglang would fail with 'DFLASH target_hidden feature dim mismatch'"
            % (expected, expected_detail, provided, count, hidden)
        )


# --------------------------------------------------------------------------
# safetensors headers
# --------------------------------------------------------------------------

def read_safetensors_entries(path):
    """Return the validated header of a safetensors file (``{name: {dtype, shape, data_offsets}}``).

    Reads only the 8-byte length prefix and the JSON header, never tensor data.
    ``__metadata__`` is left out. Raises ValueError for a malformed file.
    """
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) != 8:
            raise ValueError("%s: %d bytes; a safetensors file starts with an 8-byte header length" % (path, size))
        (length,) = struct.unpack("<Q", prefix)
        if length == 0 or length > MAX_SAFETENSORS_HEADER or length > size - 8:
            raise ValueError(
                "%s: header length %d is impossible for a %d-byte file; expected a safetensors file"
                % (path, length, size)
            )
        raw = handle.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError("%s: safetensors header is not valid UTF-8 JSON (%s)" % (path, exc)) from None
    if not isinstance(header, dict):
        raise ValueError("%s: safetensors header is %s; expected a JSON object" % (path, type(header).__name__))
    data_size = size - 8 - length
    entries = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise ValueError("%s: tensor %r header entry is not an object" % (path, name))
        shape = entry.get("shape")
        offsets = entry.get("data_offsets")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise ValueError("%s: tensor %r has shape %r; expected a list of non-negative integers" % (path, name, shape))
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(_is_int(o) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data_size
        ):
            raise ValueError(
                "%s: tensor %r data_offsets %r do not fit the %d-byte data section" % (path, name, offsets, data_size)
            )
        entries[name] = {"dtype": entry.get("dtype"), "shape": list(shape), "data_offsets": list(offsets)}
    return entries


def read_safetensors_header(path):
    """``{tensor_name: shape}`` from a safetensors file header (tensor data is never read)."""
    return {name: entry["shape"] for name, entry in read_safetensors_entries(path).items()}


def collect_safetensors_shapes(directory):
    """Merge :func:`read_safetensors_header` over every ``*.safetensors`` in ``directory``.

    Returns ``{}`` when there is none. A tensor present in two files is an error.
    """
    shapes = {}
    owner = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.safetensors"))):
        for name, shape in read_safetensors_header(path).items():
            if name in shapes:
                raise ValueError(
                    "tensor %r appears in both %s and %s; expected each tensor in one shard"
                    % (name, os.path.basename(owner[name]), os.path.basename(path))
                )
            shapes[name] = shape
            owner[name] = path
    return shapes


def load_config(directory):
    """Load ``directory/config.json``; raises ValueError with the path on any problem."""
    path = os.path.join(directory, "config.json")
    if not os.path.isdir(directory):
        raise ValueError("%s is not a directory; expected a model directory holding config.json" % directory)
    if not os.path.isfile(path):
        raise ValueError("%s not found; expected a Hugging Face style model directory" % path)
    try:
        with open(path, "r", encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as exc:
        raise ValueError("%s is not readable JSON: %s" % (path, exc)) from None
    if not isinstance(config, dict):
        raise ValueError("%s holds %s; expected a JSON object" % (path, type(config).__name__))
    return config
