"""sglang_lab_standin: a faithful, GPU-free stand-in for ``python -m sglang.launch_server`` 0.5.23.

The lab has no GPUs, so its systemd unit runs ``python -m sglang_lab_standin <same args>``.
It parses the real 0.5.23 command line (``cli``), decides from the host's (fake) nvidia-smi,
its flags and the installed sglang *source files* what a real server would do (``physics``,
documented in docs/lab-physics.md), and then serves the real HTTP surface (``server``) with
deterministic text (``textgen``) and lab fault switches (``faults``).  Stdlib only; it never
imports sglang.

Package data ``sglang-0.5.23-cli.json`` came from the argparse parser of the real sglang 0.5.23
wheel (see README.md next to it).
"""

SGLANG_VERSION = "0.5.23"
__version__ = "0.5.23.post1"

__all__ = ["SGLANG_VERSION", "__version__"]
