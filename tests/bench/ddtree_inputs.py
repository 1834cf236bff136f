"""Host time of one DDTREE step's tree inputs: the patched worker's ``_ddtree_inputs`` on CPU.

Per decode step the DDTree worker copies the draft block's top-k to the host once, grows and
compiles one tree per request (patch 0003) and builds the verify mask (on the device, from the
trees' parent pointers). That host work adds to every step's latency on a GPU host, so it is
measured here across budgets and batch sizes. Run it with the real-stack venv (it patches a
scratch copy of the real sglang 0.5.23 the way tests/real/conftest.py does):

    "$(bash tests/real/setup.sh)/bin/python" tests/bench/ddtree_inputs.py [--repeat 30]

It prints milliseconds per step (median of ``--repeat`` runs after a warm-up) and asserts nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
BLOCK = 16  # the pinned draft's block size
VOCAB = 4096  # only the top-k matters; its width is the budget


def patched_sglang(scratch: Path) -> None:
    """A scratch copy of the venv's sglang with the fleet's series applied, first on sys.path."""
    spec = importlib.util.spec_from_file_location("ddtree_real_conftest", REPO / "tests" / "real" / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    shutil.copytree(conftest._pristine_sglang(), scratch / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    conftest._apply_series(scratch)
    sys.path.insert(0, str(scratch))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--budgets", type=int, nargs="+", default=[8, 32, 128, 512, 1023])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="ddtree-bench-"))
    try:
        patched_sglang(scratch)
        import torch

        from sglang.srt.speculative import ddtree_worker_v2 as worker
        from sglang.srt.speculative.eagle_utils import TreeMaskMode

        torch.set_num_threads(1)
        print(f"{'budget':>6} {'bs':>4} {'width':>5} {'ms/step':>9} {'ms/request':>11}")
        for budget in args.budgets:
            for bs in args.batch_sizes:
                me = SimpleNamespace(block_size=BLOCK, ddtree_budget=budget,
                                     ddtree_width=worker._verify_width(budget, BLOCK),
                                     ddtree_max_depth=min(BLOCK, budget + 1), device=torch.device("cpu"))
                gen = torch.Generator().manual_seed(budget * 100 + bs)
                logits = torch.randn((bs * (BLOCK - 1), VOCAB), generator=gen)
                values, ids = torch.topk(torch.log_softmax(logits, dim=-1), min(budget, VOCAB), dim=-1)
                roots, starts = torch.arange(bs), torch.arange(bs) * 37 + 500

                def step():
                    worker.DDTreeWorkerV2._ddtree_inputs(me, values, ids, roots, starts, TreeMaskMode.FULL_MASK)

                step()
                times = []
                for _ in range(args.repeat):
                    began = time.perf_counter()
                    step()
                    times.append(time.perf_counter() - began)
                ms = statistics.median(times) * 1000
                print(f"{budget:>6} {bs:>4} {me.ddtree_width:>5} {ms:>9.2f} {ms / bs:>11.3f}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
