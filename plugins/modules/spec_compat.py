#!/usr/bin/python
# -*- coding: utf-8 -*-
# ddtree-fleet: check a speculative-decoding target/draft pair before deploying it.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: spec_compat
short_description: Check that a draft model fits a target model for NEXTN, EAGLE, EAGLE3, DFLASH or DDTREE
description:
  - Reads C(config.json) of the target and (when given) the draft model directory on the managed host and
    checks them the way SGLang 0.5.23 will use them, so an incompatible pair fails before any server
    is touched.
  - For DFLASH and DDTREE, the target layers to capture come from the draft config
    (C(dflash_config.target_layer_ids) or a top-level C(target_layer_ids); otherwise spread from the
    draft's C(num_hidden_layers)); every id must be a target layer; the draft needs a C(block_size);
    and the number of layer ids times the target C(hidden_size) must equal the input features of the
    draft's C(fc) projection (the "5120 vs 25600" hidden-state mismatch).
  - With O(read_weights=true) the projection width is taken from the C(fc.weight) shape in the draft's
    safetensors headers when present (only the headers are read, never tensor data), else from the
    draft config.
  - For NEXTN the target must carry MTP layers (C(num_nextn_predict_layers) or C(mtp_num_hidden_layers),
    also inside C(text_config)). EAGLE and EAGLE3 need a draft.
  - Fails with all problems joined in one message; on success returns the computed dimensions.
options:
  algorithm:
    description: Speculative algorithm the pair will be served with.
    type: str
    required: true
    choices: [NEXTN, EAGLE, EAGLE3, DFLASH, DDTREE]
  target_path:
    description: Directory of the target model (holds C(config.json)).
    type: path
    required: true
  draft_path:
    description:
      - Directory of the draft model (holds C(config.json) and optionally C(*.safetensors)).
      - Required for DFLASH, DDTREE, EAGLE and EAGLE3; ignored for NEXTN.
    type: path
  read_weights:
    description: Use the draft's safetensors headers, when present, to read the projection width.
    type: bool
    default: true
attributes:
  check_mode:
    support: full
    description: The module only reads files; it performs the same checks in check mode.
  diff_mode:
    support: none
    description: Nothing changes, so there is nothing to show.
author:
  - ddtree-fleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Check the DFlash draft against the target before deploying DDTREE
  spec_compat:
    algorithm: DDTREE
    target_path: /srv/models/Qwen/Qwen3.6-27B/{{ target_revision }}
    draft_path: /srv/models/z-lab/Qwen3.6-27B-DFlash/{{ draft_revision }}

- name: NEXTN needs MTP layers in the target
  spec_compat:
    algorithm: NEXTN
    target_path: /srv/models/Qwen/Qwen3.6-27B/{{ target_revision }}
"""

RETURN = r"""
ok:
  description: Whether the pair is compatible (always true when the module succeeds).
  returned: always
  type: bool
  sample: true
algorithm:
  description: The algorithm checked.
  returned: always
  type: str
  sample: DDTREE
errors:
  description: Problems found (empty on success).
  returned: always
  type: list
  elements: str
warnings_found:
  description: Non-fatal observations (also emitted as Ansible warnings).
  returned: always
  type: list
  elements: str
target_hidden_size:
  description: Target C(hidden_size) (top level or text_config).
  returned: always
  type: int
  sample: 5120
target_num_layers:
  description: Target C(num_hidden_layers).
  returned: always
  type: int
  sample: 64
target_layer_ids:
  description: Target layers whose hidden states the draft consumes (DFLASH/DDTREE).
  returned: always
  type: list
  elements: int
  sample: [1, 16, 31, 46, 61]
target_layer_ids_source:
  description: Where C(target_layer_ids) came from.
  returned: always
  type: str
  sample: draft dflash_config.target_layer_ids
provided_dim:
  description: Features the target provides, C(len(target_layer_ids) x target hidden_size).
  returned: always
  type: int
  sample: 25600
expected_dim:
  description: Input features of the draft's projection.
  returned: always
  type: int
  sample: 25600
expected_dim_source:
  description: C(config), or C(weights:<tensor> <shape>) when read from a safetensors header.
  returned: always
  type: str
  sample: config
block_size:
  description: Draft block size (DFLASH/DDTREE).
  returned: always
  type: int
  sample: 16
mtp_layers:
  description: MTP layers the target declares.
  returned: always
  type: int
  sample: 1
weights_checked:
  description: Whether a projection weight shape from safetensors headers was used.
  returned: always
  type: bool
  sample: false
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.ddtree.fleet.plugins.module_utils.spec import (
    ALGORITHMS,
    DRAFT_REQUIRED,
    check_compat,
    collect_safetensors_shapes,
    load_config,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            algorithm=dict(type="str", required=True, choices=list(ALGORITHMS)),
            target_path=dict(type="path", required=True),
            draft_path=dict(type="path"),
            read_weights=dict(type="bool", default=True),
        ),
        required_if=[("algorithm", algo, ("draft_path",)) for algo in DRAFT_REQUIRED],
        supports_check_mode=True,
    )
    algorithm = module.params["algorithm"]
    target_path = module.params["target_path"]
    draft_path = module.params["draft_path"] if algorithm in DRAFT_REQUIRED else None

    try:
        target_config = load_config(target_path)
    except ValueError as exc:
        module.fail_json(msg="target model: %s" % exc, target_path=target_path)

    draft_config = None
    shapes = None
    if draft_path:
        try:
            draft_config = load_config(draft_path)
        except ValueError as exc:
            module.fail_json(msg="draft model: %s" % exc, draft_path=draft_path)
        if module.params["read_weights"]:
            try:
                shapes = collect_safetensors_shapes(draft_path)
            except (OSError, ValueError) as exc:
                module.fail_json(
                    msg="draft model: cannot read safetensors headers in %s: %s (set read_weights=false "
                    "to check from config.json only)" % (draft_path, exc),
                    draft_path=draft_path,
                )

    result = check_compat(algorithm, target_config, draft_config, shapes or None)
    result = dict(result)
    result["warnings_found"] = result.pop("warnings")
    result["weights_checked"] = str(result.get("expected_dim_source") or "").startswith("weights:")
    result["target_path"] = target_path
    result["draft_path"] = draft_path
    for warning in result["warnings_found"]:
        module.warn(warning)

    if not result["ok"]:
        module.fail_json(
            msg="%s target %s and draft %s are incompatible: %s"
            % (algorithm, target_path, draft_path or "(none)", "; ".join(result["errors"])),
            **result
        )
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
