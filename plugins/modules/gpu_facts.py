#!/usr/bin/python
# -*- coding: utf-8 -*-
# ddtree-fleet: gather NVIDIA GPU facts with nvidia-smi.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Gather NVIDIA GPU facts (name, architecture, memory, driver, UUIDs) with nvidia-smi
description:
  - Runs C(nvidia-smi --query-gpu=name,compute_cap,memory.total,memory.used,driver_version
    --format=csv,noheader,nounits) and C(nvidia-smi -L) on the managed host and returns the parsed
    result as the C(gpu) fact plus a few top-level convenience keys.
  - The SM architecture is derived from the compute capability (C(8.6) -> C(sm86), C(12.0) -> C(sm120)).
  - Read-only; never reports a change.
  - Fails with the offending output excerpt when nvidia-smi is missing, exits non-zero, reports
    C([N/A]) values or prints anything that is not one CSV line per GPU.
  - A host whose GPUs have different architectures fails unless O(allow_mixed_arch=true); then the
    lowest architecture is reported as C(arch) and all of them in C(archs).
options:
  nvidia_smi:
    description:
      - Path to the nvidia-smi binary.
      - When unset, C(nvidia-smi) is looked up on the host's PATH (and the usual sbin directories).
    type: path
  allow_mixed_arch:
    description:
      - Accept GPUs of different architectures on one host instead of failing.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: The module only reads; it runs the same commands in check mode.
  diff_mode:
    support: none
    description: Nothing changes, so there is nothing to show.
  facts:
    support: full
    description: Returns the GPU summary as the C(gpu) fact (C(ansible_facts.gpu)).
notes:
  - memory_total_mib is the minimum over the host's GPUs (a tensor-parallel shard must fit the smallest card).
  - MIG device lines in C(nvidia-smi -L) are ignored.
author:
  - ddtree-fleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Gather GPU facts
  gpu_facts:

- name: Use a driver installed outside PATH
  gpu_facts:
    nvidia_smi: /usr/local/nvidia/bin/nvidia-smi

- name: Show the architecture
  ansible.builtin.debug:
    msg: "{{ ansible_facts.gpu.count }} x {{ ansible_facts.gpu.names[0] }} ({{ ansible_facts.gpu.arch }})"
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to the host.
  returned: success
  type: dict
  contains:
    gpu:
      description: Summary of the host's GPUs.
      returned: success
      type: dict
      contains:
        count:
          description: Number of GPUs.
          type: int
          sample: 2
        names:
          description: GPU names in index order.
          type: list
          elements: str
          sample: ["NVIDIA RTX A6000", "NVIDIA RTX A6000"]
        arch:
          description: SM architecture (the lowest one when mixed architectures are allowed).
          type: str
          sample: sm86
        archs:
          description: All distinct architectures, lowest first.
          type: list
          elements: str
          sample: ["sm86"]
        mixed_arch:
          description: Whether the GPUs have different architectures.
          type: bool
          sample: false
        compute_cap:
          description: Compute capability matching C(arch).
          type: str
          sample: "8.6"
        memory_total_mib:
          description: Smallest total memory of any GPU, in MiB.
          type: int
          sample: 49140
        memory_total_gib:
          description: C(memory_total_mib) in GiB, rounded to 2 decimals.
          type: float
          sample: 47.99
        memory_used_mib:
          description: Used memory per GPU, in MiB.
          type: list
          elements: int
          sample: [1, 1]
        driver_version:
          description: NVIDIA driver version.
          type: str
          sample: 570.86.15
        uuids:
          description: GPU UUIDs in index order.
          type: list
          elements: str
          sample: ["GPU-5a6e1b1c-0000-4000-8000-000000000000"]
        gpus:
          description: Per-GPU details (index, name, compute_cap, arch, memory_total_mib, memory_used_mib,
            memory_free_mib, driver_version, uuid).
          type: list
          elements: dict
gpus:
  description: Same as C(ansible_facts.gpu.gpus).
  returned: success
  type: list
  elements: dict
gpu_count:
  description: Number of GPUs.
  returned: success
  type: int
  sample: 8
gpu_arch:
  description: SM architecture.
  returned: success
  type: str
  sample: sm120
gpu_compute_cap:
  description: Compute capability.
  returned: success
  type: str
  sample: "12.0"
gpu_memory_total_mib:
  description: Smallest total memory of any GPU, in MiB.
  returned: success
  type: int
  sample: 97887
gpu_memory_total_gib:
  description: Same in GiB.
  returned: success
  type: float
  sample: 95.59
gpu_driver_version:
  description: NVIDIA driver version.
  returned: success
  type: str
  sample: 575.57.08
gpu_uuids:
  description: GPU UUIDs in index order.
  returned: success
  type: list
  elements: str
nvidia_smi:
  description: The nvidia-smi binary that was run.
  returned: success
  type: str
  sample: /usr/bin/nvidia-smi
"""

import os
import platform

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.ddtree.fleet.plugins.module_utils.gpu import (
    LIST_ARGS,
    QUERY_ARGS,
    merge_uuids,
    parse_list,
    parse_query_gpu,
    summarize,
)


def _excerpt(text, limit=400):
    text = (text or "").strip()
    return text if len(text) <= limit else text[:limit] + "..."


def _run(module, binary, args):
    cmd = [binary] + list(args)
    rc, out, err = module.run_command(cmd, environ_update={"LC_ALL": "C"})
    if rc != 0:
        hint = ""
        if "not a valid field" in (out or "") + (err or ""):
            hint = " (this driver is too old to report compute_cap; the fleet needs driver R510 or newer)"
        module.fail_json(
            msg="%s exited with rc=%d; expected 0%s. stderr: %s stdout: %s"
            % (" ".join(cmd), rc, hint, _excerpt(err) or "(empty)", _excerpt(out) or "(empty)"),
            cmd=cmd,
            rc=rc,
            stdout=out,
            stderr=err,
        )
    return cmd, out


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nvidia_smi=dict(type="path"),
            allow_mixed_arch=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    host = platform.node() or "the host"
    binary = module.params["nvidia_smi"]
    if binary:
        if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
            module.fail_json(
                msg="nvidia_smi=%s on %s is not an executable file; point it at the driver's nvidia-smi"
                % (binary, host),
                nvidia_smi=binary,
            )
    else:
        binary = module.get_bin_path("nvidia-smi", required=False)
        if not binary:
            module.fail_json(
                msg="nvidia-smi not found on %s PATH (%s); install the NVIDIA driver (it ships nvidia-smi) "
                "or set nvidia_smi to its full path" % (host, os.environ.get("PATH", "")),
                path=os.environ.get("PATH", ""),
            )

    query_cmd, query_out = _run(module, binary, QUERY_ARGS)
    list_cmd, list_out = _run(module, binary, LIST_ARGS)
    try:
        gpus = parse_query_gpu(query_out)
    except ValueError as exc:
        module.fail_json(
            msg="unexpected output from %s on %s: %s. Output: %s" % (" ".join(query_cmd), host, exc, _excerpt(query_out)),
            cmd=query_cmd,
            stdout=query_out,
        )
    try:
        gpus = merge_uuids(gpus, parse_list(list_out))
        summary = summarize(gpus, allow_mixed=module.params["allow_mixed_arch"])
    except ValueError as exc:
        module.fail_json(
            msg="unexpected GPU inventory from nvidia-smi on %s: %s. nvidia-smi -L output: %s"
            % (host, exc, _excerpt(list_out)),
            cmd=list_cmd,
            stdout=list_out,
            query_stdout=query_out,
        )

    module.exit_json(
        changed=False,
        ansible_facts={"gpu": summary},
        gpus=summary["gpus"],
        gpu_count=summary["count"],
        gpu_arch=summary["arch"],
        gpu_compute_cap=summary["compute_cap"],
        gpu_memory_total_mib=summary["memory_total_mib"],
        gpu_memory_total_gib=summary["memory_total_gib"],
        gpu_driver_version=summary["driver_version"],
        gpu_uuids=summary["uuids"],
        nvidia_smi=binary,
    )


if __name__ == "__main__":
    main()
