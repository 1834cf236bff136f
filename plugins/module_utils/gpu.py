# -*- coding: utf-8 -*-
"""GPU inventory parsing and per-architecture rules for ddtree-fleet.

Pure logic: no Ansible import, no subprocesses.

Inputs understood
-----------------
* ``nvidia-smi --query-gpu=name,compute_cap,memory.total,memory.used,driver_version
  --format=csv,noheader,nounits`` (see :data:`QUERY_FIELDS` / :data:`QUERY_ARGS`),
  one line per GPU in index order, e.g.::

      NVIDIA RTX A6000, 8.6, 49140, 1, 570.86.15

* ``nvidia-smi -L``, e.g.::

      GPU 0: NVIDIA RTX A6000 (UUID: GPU-4b1f...)
        MIG 1g.10gb     Device  0: (UUID: MIG-...)

  Indented MIG device lines are ignored: the fleet schedules whole GPUs.

Decisions
---------
* Anything unexpected raises :class:`ValueError` naming the offending line and
  what was expected (``[N/A]`` / ``[Not Supported]`` values, a wrong column
  count, non-numeric memory, empty output, a driver error banner).
* Mixed architectures on one host are refused by default (:func:`summarize`
  raises): SGLang runs one attention backend and one CUDA-graph setup for all
  tensor-parallel ranks, so a host with e.g. sm86 + sm120 cards has no single
  correct configuration. With ``allow_mixed=True`` the summary reports the
  *lowest* architecture as ``arch`` (the most restrictive one, so rule checks
  stay conservative) and lists all of them in ``archs``.
* ``memory_total_mib`` in the summary is the minimum across GPUs: a
  tensor-parallel shard must fit on the smallest card.
"""

from __future__ import annotations

import re

QUERY_FIELDS = ("name", "compute_cap", "memory.total", "memory.used", "driver_version")
QUERY_ARGS = [
    "--query-gpu=" + ",".join(QUERY_FIELDS),
    "--format=csv,noheader,nounits",
]
LIST_ARGS = ["-L"]

_CC_RE = re.compile(r"^(\d{1,2})\.(\d)$")
_DRIVER_RE = re.compile(r"^\d+(\.\d+)+$")
_LIST_RE = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[0-9A-Za-z-]+)\)$")
_DRIVER_ERROR_HINTS = (
    "couldn't communicate with the nvidia driver",
    "no devices were found",
    "driver/library version mismatch",
    "unable to determine the device handle",
    "gpu is lost",
)


def _excerpt(text, limit=200):
    text = text if isinstance(text, str) else repr(text)
    return text if len(text) <= limit else text[:limit] + "..."


def _lines(output, what):
    if output is None or not str(output).strip():
        raise ValueError("empty output from %s; expected one line per GPU" % what)
    lines = [line for line in str(output).splitlines() if line.strip()]
    lowered = "\n".join(lines).lower()
    if any(hint in lowered for hint in _DRIVER_ERROR_HINTS):
        raise ValueError(
            "%s reported a driver problem instead of GPU data: %r; check that the "
            "NVIDIA kernel module is loaded and matches the user-space driver"
            % (what, _excerpt(lines[0]))
        )
    return lines


def arch_from_compute_cap(compute_cap):
    """Map a compute capability string to an SM arch name.

    ``"8.6"`` -> ``"sm86"``, ``"9.0"`` -> ``"sm90"``, ``"10.0"`` -> ``"sm100"``,
    ``"12.0"`` -> ``"sm120"``. Raises ValueError for anything else.
    """
    value = str(compute_cap).strip()
    match = _CC_RE.match(value)
    if not match:
        raise ValueError(
            "compute capability %r is not of the form MAJOR.MINOR (e.g. 8.6, 12.0)" % value
        )
    return "sm%d%s" % (int(match.group(1)), match.group(2))


def arch_number(arch):
    """``"sm86"`` -> 86, ``"sm120"`` -> 120 (for ordering archs)."""
    match = re.match(r"^sm(\d+)$", str(arch))
    if not match:
        raise ValueError("architecture %r is not of the form smNN (e.g. sm86, sm120)" % (arch,))
    return int(match.group(1))


def _mib(value, field):
    try:
        number = int(value)
    except ValueError:
        raise ValueError(
            "%s is %r; expected an integer number of MiB (query with "
            "--format=csv,noheader,nounits)" % (field, value)
        ) from None
    if number < 0:
        raise ValueError("%s is negative (%d)" % (field, number))
    return number


def parse_query_gpu(output):
    """Parse the ``--query-gpu`` CSV output into a list of GPU dicts.

    Each dict: index, name, compute_cap, arch, memory_total_mib,
    memory_used_mib, memory_free_mib, driver_version.
    """
    gpus = []
    for lineno, line in enumerate(_lines(output, "nvidia-smi --query-gpu"), start=1):
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != len(QUERY_FIELDS):
            raise ValueError(
                "line %d %r has %d comma-separated column(s); expected %d (%s)"
                % (lineno, _excerpt(line), len(fields), len(QUERY_FIELDS), ", ".join(QUERY_FIELDS))
            )
        name, compute_cap, mem_total, mem_used, driver = fields
        try:  # each check names the field; the line is added here
            for field_name, value in zip(QUERY_FIELDS, fields):
                if not value or value.startswith("["):
                    raise ValueError("%s is %r; expected a value (the driver could not report it "
                                     "for this GPU)" % (field_name, value))
            arch = arch_from_compute_cap(compute_cap)
            total = _mib(mem_total, "memory.total")
            used = _mib(mem_used, "memory.used")
            if total == 0:
                raise ValueError("memory.total is 0 MiB")
            if not _DRIVER_RE.match(driver):
                raise ValueError(
                    "driver_version %r is not a dotted version like 570.86.15" % driver)
        except ValueError as exc:
            raise ValueError("line %d %r: %s" % (lineno, _excerpt(line), exc)) from None
        gpus.append(
            {
                "index": lineno - 1,
                "name": name,
                "compute_cap": compute_cap,
                "arch": arch,
                "memory_total_mib": total,
                "memory_used_mib": used,
                "memory_free_mib": max(total - used, 0),
                "driver_version": driver,
            }
        )
    return gpus


def parse_list(output):
    """Parse ``nvidia-smi -L`` into ``[{"index", "name", "uuid"}]`` (MIG lines skipped)."""
    gpus = []
    for lineno, line in enumerate(_lines(output, "nvidia-smi -L"), start=1):
        if line[:1].isspace() and line.strip().startswith("MIG "):
            continue
        match = _LIST_RE.match(line.strip())
        if not match:
            raise ValueError(
                "nvidia-smi -L line %d %r; expected 'GPU <index>: <name> (UUID: GPU-...)'"
                % (lineno, _excerpt(line))
            )
        gpus.append({"index": int(match.group(1)), "name": match.group(2), "uuid": match.group(3)})
    if not gpus:
        raise ValueError("nvidia-smi -L listed no GPU lines; expected 'GPU <index>: ...' lines")
    indexes = [gpu["index"] for gpu in gpus]
    if indexes != list(range(len(gpus))):
        raise ValueError("nvidia-smi -L GPU indexes are %s; expected 0..%d in order" % (indexes, len(gpus) - 1))
    return gpus


def merge_uuids(gpus, listed):
    """Attach ``uuid`` from :func:`parse_list` output to the query GPUs (by index)."""
    if len(listed) != len(gpus):
        raise ValueError(
            "nvidia-smi -L lists %d GPU(s) but --query-gpu returned %d; expected the same count"
            % (len(listed), len(gpus))
        )
    merged = []
    for gpu, entry in zip(gpus, listed):
        if entry["name"] != gpu["name"]:
            raise ValueError(
                "GPU %d is %r in nvidia-smi -L but %r in --query-gpu; expected the same name"
                % (gpu["index"], entry["name"], gpu["name"])
            )
        merged.append(dict(gpu, uuid=entry["uuid"]))
    return merged


def summarize(gpus, allow_mixed=False):
    """Summarize a host's GPUs (see the module docstring for the decisions)."""
    if not gpus:
        raise ValueError("no GPUs to summarize; expected at least one")
    archs = sorted({gpu["arch"] for gpu in gpus}, key=arch_number)
    if len(archs) > 1 and not allow_mixed:
        detail = ", ".join("GPU %d %s (%s)" % (g["index"], g["name"], g["arch"]) for g in gpus)
        raise ValueError(
            "mixed GPU architectures on one host: %s; expected one architecture per host "
            "(one attention backend and CUDA-graph setup serves all TP ranks). Split the "
            "GPUs with CUDA_VISIBLE_DEVICES or allow mixed architectures explicitly "
            "(gpu_facts allow_mixed_arch=true)" % detail
        )
    drivers = sorted({gpu["driver_version"] for gpu in gpus})
    if len(drivers) > 1:
        raise ValueError("GPUs report different driver versions %s; expected one driver per host" % drivers)
    arch = archs[0]
    compute_cap = next(gpu["compute_cap"] for gpu in gpus if gpu["arch"] == arch)
    memory_total_mib = min(gpu["memory_total_mib"] for gpu in gpus)
    return {
        "count": len(gpus),
        "names": [gpu["name"] for gpu in gpus],
        "arch": arch,
        "archs": archs,
        "mixed_arch": len(archs) > 1,
        "compute_cap": compute_cap,
        "memory_total_mib": memory_total_mib,
        "memory_total_gib": round(memory_total_mib / 1024.0, 2),
        "memory_used_mib": [gpu["memory_used_mib"] for gpu in gpus],
        "driver_version": drivers[0],
        "uuids": [gpu.get("uuid") for gpu in gpus] if all("uuid" in g for g in gpus) else [],
        "gpus": [dict(gpu) for gpu in gpus],
    }


def gpu_facts_from_outputs(query_output, list_output=None, allow_mixed=False):
    """Parse both nvidia-smi outputs and return :func:`summarize` of the result."""
    gpus = parse_query_gpu(query_output)
    if list_output is not None:
        gpus = merge_uuids(gpus, parse_list(list_output))
    return summarize(gpus, allow_mixed=allow_mixed)


# --------------------------------------------------------------------------
# Architecture rules (sglang 0.5.23, see docs "Architecture limits")
# --------------------------------------------------------------------------

#: Attention backends known to run on each architecture. Only architectures
#: listed here are accepted: add a row after checking a new one.
#: - fa3: sm80..sm90 only (fails on sm120 Blackwell workstation cards).
#: - fa4: the FlashAttention-4 kernels target compute capability 9.x/10.x
#:   (not 12.x); the sglang doc does not state it, so it is kept conservative.
#: - trtllm_mha: sm90/sm100/sm120.
#: - triton, flashinfer: every listed architecture.
ATTENTION_BACKENDS_BY_ARCH = {
    "sm80": ("triton", "flashinfer", "fa3"),
    "sm86": ("triton", "flashinfer", "fa3"),
    "sm89": ("triton", "flashinfer", "fa3"),
    "sm90": ("triton", "flashinfer", "fa3", "fa4", "trtllm_mha"),
    "sm100": ("triton", "flashinfer", "fa4", "trtllm_mha"),
    "sm120": ("triton", "flashinfer", "trtllm_mha"),
}

#: Hybrid (linear + full attention) Qwen3.5/3.6 models are further limited on
#: some architectures.
HYBRID_MODEL_BACKENDS_BY_ARCH = {
    "sm120": ("triton", "trtllm_mha", "flashinfer"),
}

#: (arch, backend) -> KV cache dtypes that backend cannot use there.
#: trtllm_mha prefill on sm120 has no fp8_e4m3 KV.
KV_DTYPE_LIMITS = {
    ("sm120", "trtllm_mha"): ("fp8_e4m3",),
}

#: Ampere parts (sm80..sm88) run FP8 checkpoints as weight-only Marlin.
FP8_WEIGHT_ONLY_ARCHS = ("sm80", "sm86", "sm87", "sm88")


def attention_backend_allowed(arch, backend, hybrid_model=False, kv_cache_dtype=None):
    """Return ``(allowed, reason)`` for running ``backend`` on ``arch``.

    ``reason`` always explains the decision (also when allowed) so preflight
    messages can quote it.
    """
    arch = str(arch).strip().lower()
    backend = str(backend).strip()
    if arch not in ATTENTION_BACKENDS_BY_ARCH:
        return False, (
            "no attention-backend rules for architecture %r (known: %s); add it to "
            "ATTENTION_BACKENDS_BY_ARCH after checking which backends run there"
            % (arch, ", ".join(sorted(ATTENTION_BACKENDS_BY_ARCH, key=arch_number)))
        )
    allowed = ATTENTION_BACKENDS_BY_ARCH[arch]
    if backend not in allowed:
        return False, "attention backend %r does not run on %s; choose one of: %s" % (
            backend, arch, ", ".join(allowed))
    if hybrid_model and arch in HYBRID_MODEL_BACKENDS_BY_ARCH:
        hybrid_allowed = HYBRID_MODEL_BACKENDS_BY_ARCH[arch]
        if backend not in hybrid_allowed:
            return False, (
                "hybrid Qwen3.5/3.6 models on %s allow only %s attention, not %r"
                % (arch, ", ".join(hybrid_allowed), backend)
            )
    if kv_cache_dtype and str(kv_cache_dtype) in KV_DTYPE_LIMITS.get((arch, backend), ()):
        return False, (
            "%s on %s cannot use kv_cache_dtype %s (prefill has no %s KV); use auto or bf16"
            % (backend, arch, kv_cache_dtype, kv_cache_dtype))
    return True, "attention backend %r is supported on %s" % (backend, arch)


def _number(name, value, allow_equal=True):
    """``value`` as a float that must be >= 0 (> 0 without ``allow_equal``)."""
    if isinstance(value, bool):
        raise ValueError("%s must be a number, got %r" % (name, value))
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError("%s must be a number, got %r" % (name, value)) from None
    if number < 0 or (not allow_equal and number == 0):
        raise ValueError("%s must be %s 0.0, got %r" % (name, ">=" if allow_equal else ">", value))
    return number


def model_fits(weights_gib, tp_size, gpu_mem_gib, mem_fraction_static, kv_headroom_gib):
    """Check ``weights/tp + kv_headroom <= gpu_mem * mem_fraction_static``.

    Returns ``(fits, detail)``; ``detail`` has the numbers and a ``message``.
    Raises ValueError on nonsensical inputs (tp < 1, fraction outside (0, 1): the range of
    sglang_mem_fraction_static's Limits line in roles/sglang/meta/argument_specs.yml).
    """
    weights = _number("weights_gib", weights_gib)
    gpu_mem = _number("gpu_mem_gib", gpu_mem_gib, allow_equal=False)
    headroom = _number("kv_headroom_gib", kv_headroom_gib)
    fraction = _number("mem_fraction_static", mem_fraction_static, allow_equal=False)
    if fraction >= 1.0:
        raise ValueError("mem_fraction_static must be in (0, 1), got %r" % (mem_fraction_static,))
    if isinstance(tp_size, bool) or int(tp_size) != tp_size or int(tp_size) < 1:
        raise ValueError("tp_size must be an integer >= 1, got %r" % (tp_size,))
    tp = int(tp_size)
    per_gpu = weights / tp
    needed = per_gpu + headroom
    budget = gpu_mem * fraction
    fits = needed <= budget + 1e-9
    min_tp = None
    if budget > headroom:
        min_tp = tp
        while weights / min_tp + headroom > budget + 1e-9:
            min_tp += 1
    detail = {
        "weights_gib": round(weights, 3),
        "tp_size": tp,
        "per_gpu_weights_gib": round(per_gpu, 3),
        "kv_headroom_gib": round(headroom, 3),
        "needed_gib": round(needed, 3),
        "gpu_mem_gib": round(gpu_mem, 3),
        "mem_fraction_static": fraction,
        "budget_gib": round(budget, 3),
        "margin_gib": round(budget - needed, 3),
        "min_tp_size": min_tp,
    }
    sums = (
        "%.2f GiB weights / tp %d + %.2f GiB KV headroom = %.2f GiB %s %.2f GiB "
        "(%.2f GiB x mem_fraction_static %.2f)"
        % (weights, tp, headroom, needed, "<=" if fits else ">", budget, gpu_mem, fraction)
    )
    if fits:
        detail["message"] = "fits: " + sums
    else:
        hint = (
            "raise tp_size to at least %d or use a quantized checkpoint" % min_tp
            if min_tp is not None
            else "the KV headroom alone exceeds the budget; lower kv_headroom_gib or raise mem_fraction_static"
        )
        detail["message"] = "does not fit: %s; %s" % (sums, hint)
    return fits, detail
