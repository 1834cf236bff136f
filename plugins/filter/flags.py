"""Jinja filters that render SGLang command lines (logic lives in module_utils/ddtree_flags.py)."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError


from ansible_collections.ddtree.fleet.plugins.module_utils import disk as ddtree_disk
from ansible_collections.ddtree.fleet.plugins.module_utils import flags as ddtree_flags
from ansible_collections.ddtree.fleet.plugins.module_utils import gpu as ddtree_gpu


def sglang_argv(cfg):
    try:
        return ddtree_flags.sglang_argv(dict(cfg))
    except ddtree_flags.FlagError as exc:
        raise AnsibleFilterError(f"sglang_argv: {exc}") from exc


def sglang_exec_line(argv):
    return ddtree_flags.exec_line([str(a) for a in argv])


def config_fingerprint(text, *more):
    return ddtree_flags.config_fingerprint(str(text), *[str(m) for m in more])


def attention_allowed(arch, backend):
    """[allowed, reason] for an attention backend on a GPU architecture."""
    return list(ddtree_gpu.attention_backend_allowed(str(arch), str(backend)))


def model_fits(weights_gib, tp_size, gpu_mem_gib, mem_fraction_static, kv_headroom_gib):
    """The fit check's detail dict (with `fits` and `message`), or `fits: false` on bad numbers."""
    try:
        fits, detail = ddtree_gpu.model_fits(weights_gib, tp_size, gpu_mem_gib, mem_fraction_static, kv_headroom_gib)
    except ValueError as exc:
        return {"fits": False, "message": str(exc)}
    return dict(detail, fits=fits)


def disk_budget(items, headroom_gib):
    """Preflight's disk budget (module_utils/disk.py): per filesystem, what the change writes."""
    try:
        return ddtree_disk.disk_budget(list(items), headroom_gib)
    except (KeyError, TypeError, ValueError) as exc:
        raise AnsibleFilterError("disk_budget: %s" % exc) from exc


class FilterModule:
    def filters(self):
        return {
            "sglang_argv": sglang_argv,
            "sglang_exec_line": sglang_exec_line,
            "config_fingerprint": config_fingerprint,
            "attention_allowed": attention_allowed,
            "model_fits": model_fits,
            "disk_budget": disk_budget,
        }
