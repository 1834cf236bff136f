"""What several real-tier tests share: the pinned models, and the real parser on this CPU machine."""

from __future__ import annotations

from sglang.srt.server_args import prepare_server_args

TARGET = "Qwen/Qwen3.6-27B"
DRAFT = "z-lab/Qwen3.6-27B-DFlash"
BLOCK = 16  # the draft's block_size (the mirror's config.json, as the real checkpoint's)
# What the real parser needs on a machine without an accelerator: ``--device cuda`` because the
# parser asks the platform for one; ``--mamba-radix-cache-strategy no_buffer`` (which needs page
# size 1) and ``--disable-overlap-schedule`` because the default strategy for a hybrid target
# (extra_buffer) needs a GPU platform's state snapshots.
CPU_ONLY = ["--page-size", "1", "--device", "cuda", "--mamba-radix-cache-strategy", "no_buffer",
            "--disable-overlap-schedule"]


def parse(mirror, algorithm="DDTREE", *extra):
    """The real 0.5.23 parser on the pinned target's config, with the draft."""
    argv = ["--model-path", str(mirror[TARGET]), "--speculative-algorithm", algorithm,
            "--speculative-draft-model-path", str(mirror[DRAFT]), *CPU_ONLY, *extra]
    return prepare_server_args(argv)
