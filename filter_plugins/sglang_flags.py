"""Jinja filters that render SGLang command lines (logic lives in module_utils/ddtree_flags.py)."""
from __future__ import annotations

import os
import sys

from ansible.errors import AnsibleFilterError

_MODULE_UTILS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils")
if _MODULE_UTILS not in sys.path:
    sys.path.insert(0, _MODULE_UTILS)

import ddtree_flags  # noqa: E402  (path set above: one implementation for modules, filters and tests)
import ddtree_gpu  # noqa: E402


def sglang_argv(cfg):
    try:
        return ddtree_flags.sglang_argv(dict(cfg))
    except ddtree_flags.FlagError as exc:
        raise AnsibleFilterError(f"sglang_argv: {exc}") from exc


def sglang_exec_line(argv):
    return ddtree_flags.exec_line([str(a) for a in argv])


def ddtree_config_fingerprint(text, *more):
    return ddtree_flags.config_fingerprint(str(text), *[str(m) for m in more])


def ddtree_attention_allowed(arch, backend):
    """[allowed, reason] for an attention backend on a GPU architecture."""
    return list(ddtree_gpu.attention_backend_allowed(str(arch), str(backend)))


def ddtree_model_fits(weights_gib, tp_size, gpu_mem_gib, mem_fraction_static, kv_headroom_gib):
    """The fit check's detail dict (with `fits` and `message`), or `fits: false` on bad numbers."""
    try:
        fits, detail = ddtree_gpu.model_fits(weights_gib, tp_size, gpu_mem_gib, mem_fraction_static, kv_headroom_gib)
    except ValueError as exc:
        return {"fits": False, "message": str(exc)}
    return dict(detail, fits=fits)


class FilterModule:
    def filters(self):
        return {
            "sglang_argv": sglang_argv,
            "sglang_exec_line": sglang_exec_line,
            "ddtree_config_fingerprint": ddtree_config_fingerprint,
            "ddtree_attention_allowed": ddtree_attention_allowed,
            "ddtree_model_fits": ddtree_model_fits,
        }
