#!/usr/bin/python
# -*- coding: utf-8 -*-
# ddtree-fleet: read a host's live serving state and list how it differs from the declared one.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_state
short_description: Read a host's live SGLang serving state in one call and list what differs from the declared state
description:
  - Reads, in one pass on the host, everything the "is anything different from the declared state?"
    decision needs, so that a host in sync costs one round trip instead of one per file.
  - The live unit, EnvironmentFile and logging config (sha1, compared with the declared digests), whether the service
    is active and enabled (C(systemctl is-active), C(systemctl is-enabled)).
  - The quarantine record of the declared configuration fingerprint, and the known-good record
    (link, C(meta.json), C(unit), C(env), C(logging) with sha256, number of records under C(records/)).
  - The declared venv's completion stamp, its Python version, and a dry run of the patch set on it
    (GNU patch C(--dry-run); the venv is never changed).
  - The verification markers of the declared weights directories.
  - Returns the differences in the drift report's words, whether the service itself must change, and
    why a damaged known-good record makes a change unsafe. Deciding what to do is the caller's.
  - Read-only; never reports a change.
options:
  state_dir:
    description: The fleet's state directory on the host (known-good, records, quarantine).
    type: path
    required: true
  quarantine_dir:
    description:
      - Where the quarantine records are (role known_good's C(known_good_quarantine_dir)).
      - Default is C(quarantine) under O(state_dir).
    type: path
  fingerprint:
    description: The declared configuration's fingerprint (names the quarantine record to look for).
    type: str
    required: true
  service:
    description: The systemd unit name of the SGLang service.
    type: str
    required: true
  unit_path:
    description: Where the unit file lives.
    type: path
    required: true
  unit_sha1:
    description: sha1 of the declared unit text.
    type: str
    required: true
  env_file:
    description: Where the EnvironmentFile lives. It holds secrets; only its digest is returned.
    type: path
    required: true
  env_sha1:
    description: sha1 of the declared environment text.
    type: str
    required: true
  logging_file:
    description:
      - Where the logging config the unit points SGLang at (C(SGLANG_LOGGING_CONFIG_PATH)) lives.
      - When set, a missing or different file is a difference and makes the service change.
    type: path
  logging_sha1:
    description: sha1 of the declared logging config text; required with O(logging_file).
    type: str
  venv:
    description: The declared venv directory.
    type: path
    required: true
  python:
    description: The interpreter the venv was built with; asked for its version when the venv's C(lib/) does not say.
    type: path
    default: /usr/bin/python3
  patches:
    description: Patch files on the host, in series order; checked with a dry run when the venv exists.
    type: list
    elements: path
    default: []
  checksums:
    description: Pinned sha256 of each patch, by file name.
    type: dict
    default: {}
  weights:
    description: Weights directories that must hold a C(.ddtree-verified.json) marker.
    type: list
    elements: path
    default: []
  gpu:
    description:
      - Also read the GPUs with nvidia-smi (the C(--query-gpu) query of M(ansible.legacy.gpu_facts); not C(-L), as
        the UUIDs are not compared), so that C(in_sync) can tell whether they are still those the known-good
        configuration was proven on.
      - A GPU read that fails is not an error here; it is returned in C(gpu_error) and the host is
        not in sync (preflight then fails with M(ansible.legacy.gpu_facts)' own message).
    type: bool
    default: false
  nvidia_smi:
    description: Path to nvidia-smi; when unset it is looked up on PATH.
    type: path
  lock_dir:
    description: The host lock's directory (role host_lock); a lock held by any run makes the host not in sync.
    type: path
  served_url:
    description:
      - Base URL of the running server. When given with O(served_model_path) and the service is active, the
        module asks it what it serves (C(GET /model_info), 5 s at most) and lists a C(model_path) other than
        the declared one as a difference of the service (a runtime weight update, such as
        C(/update_weights_from_disk), moves it). A server that does not answer is not judged.
    type: str
  served_api_key:
    description: API key for that request (never logged).
    type: str
  served_model_path:
    description: The declared C(--model-path) of the unit.
    type: str
  force:
    description:
      - Report the host as not in sync even when nothing differs, so that the caller re-applies and gates the
        declared configuration (the playbooks pass C(quality_gate_always)). The differences are still those read.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: The module only reads; it does the same in check mode.
  diff_mode:
    support: none
    description: Nothing changes, so there is nothing to show.
notes:
  - Standard library only on the host; the patch dry run uses GNU patch like M(ansible.legacy.sglang_patch).
seealso:
  - module: ansible.legacy.sglang_patch
author:
  - ddtree-fleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Read the live state in one call
  host_state:
    state_dir: /var/lib/ddtree-fleet
    fingerprint: "{{ sglang_service_unit_text | ddtree_config_fingerprint(sglang_service_env_text) }}"
    service: sglang.service
    unit_path: /etc/systemd/system/sglang.service
    unit_sha1: "{{ sglang_service_unit_text | hash('sha1') }}"
    env_file: /etc/sglang/sglang.env
    env_sha1: "{{ sglang_service_env_text | hash('sha1') }}"
    logging_file: /etc/sglang/sglang-logging.json
    logging_sha1: "{{ sglang_service_logging_text | hash('sha1') }}"
    venv: /opt/sglang/venvs/0.5.23-abc123
    patches: [/opt/sglang/patches/abc123/0001-ddtree-register-algorithm.patch]
    checksums: {0001-ddtree-register-algorithm.patch: "{{ '0' * 64 }}"}
    weights: [/srv/models/Qwen--Qwen3.6-27B/main]
  register: state

- name: Show what differs
  ansible.builtin.debug:
    msg: "{{ state.differences | join('; ') or 'in sync' }}"
"""

RETURN = r"""
differences:
  description: What differs from the declared state, one line each; empty when the host is in sync.
  returned: always
  type: list
  elements: str
  sample: ["service: sglang.service is inactive", "known-good: record is 1a2b, declared 3c4d"]
fingerprint:
  description: The declared configuration's fingerprint, as given in O(fingerprint).
  returned: always
  type: str
pending_change:
  description: Whether the unit, the environment, the logging config, or the service's active/enabled state must change.
  returned: always
  type: bool
quarantine:
  description: The quarantine record of the declared fingerprint.
  returned: always
  type: dict
  contains:
    path: {description: Where the record would be., type: str}
    exists: {description: Whether it exists., type: bool}
    record: {description: "Its content (fingerprint, since, evidence) or null.", type: dict}
known_good:
  description: The known-good record.
  returned: always
  type: dict
  contains:
    dir: {description: The known-good link., type: str}
    link_exists: {description: "Whether the link (or directory) exists, dangling or not.", type: bool}
    link_target: {description: "The link's target as written, or null.", type: str}
    files: {description: "meta.json, unit, env and logging (the latter only in records that have one), each with exists and sha256.", type: dict}
    meta: {description: "The parsed meta.json, or null.", type: dict}
    records: {description: How many records are under records/., type: int}
    fingerprint: {description: "The known-good fingerprint, empty when there is none.", type: str}
    problem: {description: "Why the record cannot be trusted for a rollback, or null.", type: str}
live:
  description: The live unit, environment and (with O(logging_file)) logging config (path, exists, sha1) and the service's active and enabled state.
  returned: always
  type: dict
venv:
  description: The declared venv (path, exists, python_version).
  returned: always
  type: dict
patch:
  description: The patch set's dry run (checked, changed, applied, failed, msg).
  returned: always
  type: dict
weights:
  description: Each declared weights directory with whether its verification marker exists.
  returned: always
  type: list
  elements: dict
gpu:
  description: The GPU summary (as M(ansible.legacy.gpu_facts) returns in C(ansible_facts.gpu), without UUIDs), or null when not read.
  returned: always
  type: dict
gpu_error:
  description: Why the GPUs could not be read, or null.
  returned: always
  type: str
served:
  description:
    - What the running server serves (C(checked), C(url), C(model_path), C(weight_version), C(declared),
      C(differs), and C(error) when it did not answer).
  returned: always
  type: dict
lock:
  description: Whether a run holds the host's lock (held) and its owner record (owner).
  returned: always
  type: dict
in_sync:
  description:
    - Nothing to do. No difference, the known-good record intact and the declared configuration,
      no quarantine, no lock held, and the GPUs those the known-good record was proven on
      (its C(gpu) entry). A caller may then skip every later stage. Always false with O(force).
  returned: always
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.ddtree.fleet.plugins.module_utils.state import read_state


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state_dir=dict(type="path", required=True),
            quarantine_dir=dict(type="path"),
            fingerprint=dict(type="str", required=True),
            service=dict(type="str", required=True),
            unit_path=dict(type="path", required=True),
            unit_sha1=dict(type="str", required=True),
            env_file=dict(type="path", required=True),
            env_sha1=dict(type="str", required=True),
            logging_file=dict(type="path"),
            logging_sha1=dict(type="str"),
            venv=dict(type="path", required=True),
            python=dict(type="path", default="/usr/bin/python3"),
            patches=dict(type="list", elements="path", default=[]),
            checksums=dict(type="dict", default={}),
            weights=dict(type="list", elements="path", default=[]),
            gpu=dict(type="bool", default=False),
            nvidia_smi=dict(type="path"),
            lock_dir=dict(type="path"),
            served_url=dict(type="str"),
            served_api_key=dict(type="str", no_log=True),
            served_model_path=dict(type="str"),
            force=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
        required_together=[("logging_file", "logging_sha1")],
    )
    params = dict(module.params)
    params["checksums"] = {str(k): str(v) for k, v in (params["checksums"] or {}).items()}
    try:
        state = read_state(params)
    except (OSError, ValueError) as exc:
        module.fail_json(msg="%s: cannot read the host's state: %s" % (params["state_dir"], exc))
    state["in_sync"] = state["in_sync"] and not params["force"]
    module.exit_json(changed=False, fingerprint=params["fingerprint"], **state)


if __name__ == "__main__":
    main()
