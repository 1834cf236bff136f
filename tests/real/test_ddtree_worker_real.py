"""The patched DDTREE worker's own code, executed under the real sglang 0.5.23 and torch on CPU.

Everything here is imported from the patched copy of the wheel that conftest.py builds with the
product's patch code: the real argument parser and runtime context, 0003's tree functions and
0004's worker. What cannot run without a GPU (the target's forward, sgl_kernel's verify kernel)
is replaced by a toy target and 0003's plain-Python reference of verify_tree_greedy; every other
step of a DDTREE decode step is the worker's code.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from sglang.srt import runtime_context
from sglang.srt.mem_cache.allocation_sizing import get_alloc_len_per_decode
from sglang.srt.server_args import prepare_server_args
from sglang.srt.speculative import ddtree_tree
from sglang.srt.speculative import ddtree_worker_v2 as worker
from sglang.srt.speculative.dflash_info_v2 import decode_reserve
from sglang.srt.speculative.eagle_utils import TreeMaskMode

from realkit import BLOCK, CPU_ONLY, DRAFT, TARGET, parse

ALL_BUDGETS = range(1, ddtree_tree.MAX_BUDGET + 1)
# Where the layout changes: width below the block, equal to it (padded), just above, far above.
EDGE_BUDGETS = [1, 2, 3, 7, BLOCK - 3, BLOCK - 2, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK, 100, ddtree_tree.MAX_BUDGET]


# ------------------------------------------------------------------------------------- the parser


def test_the_series_applies_to_the_real_wheel(applied_patches):
    assert applied_patches == ["0001-ddtree-register-algorithm.patch", "0002-ddtree-dflash-family.patch",
                               "0003-ddtree-tree.patch", "0004-ddtree-worker.patch"]


@pytest.mark.parametrize("budget", [None, 1, BLOCK - 2, BLOCK - 1, 32, ddtree_tree.MAX_BUDGET])
def test_real_parser_takes_every_valid_budget_and_sizes_the_kv_for_the_tree(mirror, budget):
    extra = [] if budget is None else ["--speculative-ddtree-budget", str(budget)]
    runtime_context.publish(parse(mirror, "DDTREE", *extra), role="scheduler")
    want = ddtree_tree.DEFAULT_BUDGET if budget is None else budget
    # What the worker reads (DDTreeWorkerV2.__init__): the resolved budget and block.
    spec = runtime_context.get_spec()
    assert spec.speculative_ddtree_budget == want
    assert spec.speculative_num_draft_tokens == BLOCK
    width = worker._verify_width(want, BLOCK)
    # Pool sizing (allocation_sizing, from 0004's width in spec_info) and the DFlash V2 decode reservation (0004,
    # dflash_info_v2.decode_reserve) both cover the tree verify's width, double-buffered.
    assert get_alloc_len_per_decode() >= width
    assert decode_reserve(BLOCK) == 2 * max(BLOCK, want + 2) >= 2 * width
    # The width 0.5.23 sizes a hybrid target's per-step conv/SSM verify states from (the GDN
    # kernels index them with the buffer's own per-request pitch): the tree fits.
    assert runtime_context.max_speculative_num_draft_tokens() == max(BLOCK, want + 2) >= width


def test_dflash_keeps_its_reservation(mirror):
    runtime_context.publish(parse(mirror, "DFLASH"), role="scheduler")
    assert decode_reserve(BLOCK) == 2 * BLOCK
    assert get_alloc_len_per_decode() == BLOCK
    assert runtime_context.max_speculative_num_draft_tokens() == BLOCK


def test_real_parser_refuses_the_replayssm_verify_ring_for_ddtree(mirror):
    with pytest.raises(ValueError, match="DDTREE does not support --enable-linear-replayssm-spec"):
        runtime_context.publish(parse(mirror, "DDTREE", "--enable-linear-replayssm-spec"), role="scheduler")


@pytest.mark.parametrize("budget", ["0", str(ddtree_tree.MAX_BUDGET + 1)])
def test_real_parser_refuses_a_budget_out_of_range(mirror, budget):
    """Refused before start-up: 0.5.23 runs its resolution hooks (0004's _handle_ddtree among
    them) by the time the parsed arguments are published, which a server does before it loads
    anything (seen here: depending on import order, in prepare_server_args or at publish)."""
    with pytest.raises(ddtree_tree.DDTreeError, match="--speculative-ddtree-budget must be between 1 and 1023"):
        runtime_context.publish(parse(mirror, "DDTREE", "--speculative-ddtree-budget", budget), role="scheduler")


# -------------------------------------------------------------------- widths and hidden-state rows


def test_every_accepted_budget_has_a_width_and_block_rows_the_draft_kv_accepts():
    bs, hidden = 3, 4
    for budget in ALL_BUDGETS:
        assert ddtree_tree.validate_budget(budget) == budget
        width = worker._verify_width(budget, BLOCK)
        assert width >= budget + 1 and width != BLOCK, budget  # never DFLASH's graph width
        rows = torch.arange(bs * width * hidden, dtype=torch.float32).view(bs * width, hidden)
        out = worker._block_rows(rows, bs, width, BLOCK)
        # One row per block slot, as _append_target_hidden_to_draft_kv_by_loc checks against
        # cache_loc (the "cache_loc length mismatch" of budgets below BLOCK - 1 before the fix).
        assert out.shape == (bs * BLOCK, hidden), budget
        keep = min(width, BLOCK)
        out3, rows3 = out.view(bs, BLOCK, hidden), rows.view(bs, width, hidden)
        assert torch.equal(out3[:, :keep], rows3[:, :keep]), budget
        assert not out3[:, keep:].any(), budget
        # The accepted path (root included) fits the rows that were kept.
        assert min(BLOCK, budget + 1) <= keep, budget
    for bad in (0, ddtree_tree.MAX_BUDGET + 1, True, 2.0):
        with pytest.raises(ddtree_tree.DDTreeError):
            ddtree_tree.validate_budget(bad)


# ------------------------------------------------------------------------------- the tree inputs


def fake_worker(budget: int) -> SimpleNamespace:
    """The attributes DDTreeWorkerV2.__init__ sets that _ddtree_inputs reads."""
    return SimpleNamespace(block_size=BLOCK, ddtree_budget=budget, ddtree_width=worker._verify_width(budget, BLOCK),
                           ddtree_max_depth=min(BLOCK, budget + 1), device=torch.device("cpu"))


def draft_topk(gen: torch.Generator, bs: int, budget: int, vocab: int):
    """What _ddtree_topk hands over: per block position, the top-k (log-prob, id), best first."""
    logits = torch.randn((bs * (BLOCK - 1), vocab), generator=gen)
    return torch.topk(torch.log_softmax(logits, dim=-1), min(budget, vocab), dim=-1)


def children(next_token: list[int], next_sibling: list[int], node: int) -> list[int]:
    out, child = [], next_token[node]
    while child != -1:
        out.append(child)
        child = next_sibling[child]
    return out


def unpack(inputs: dict, bs: int, width: int, starts: list[int], mode: TreeMaskMode):
    """Per request: tokens, positions, lineage arrays and the [width, width] tree mask."""
    mask = inputs["custom_mask"]
    per_req, offset = [], 0
    for b in range(bs):
        if mode == TreeMaskMode.QLEN_ONLY:
            tree_mask = mask[b * width * width:(b + 1) * width * width].view(width, width)
        else:
            size = width * (starts[b] + width)
            full = mask[offset:offset + size].view(width, starts[b] + width)
            offset += size
            assert full[:, :starts[b]].all()  # the verified prefix is visible to every node
            tree_mask = full[:, starts[b]:]
        per_req.append(SimpleNamespace(
            tokens=inputs["draft_token"][b * width:(b + 1) * width].tolist(),
            positions=inputs["positions"][b * width:(b + 1) * width].tolist(),
            index=inputs["retrieve_index"][b].tolist(),
            next_token=inputs["retrieve_next_token"][b].tolist(),
            next_sibling=inputs["retrieve_next_sibling"][b].tolist(),
            mask=tree_mask))
    if mode != TreeMaskMode.QLEN_ONLY:
        assert offset == mask.numel()
    return per_req


@pytest.mark.parametrize("mode", [TreeMaskMode.QLEN_ONLY, TreeMaskMode.FULL_MASK], ids=lambda m: m.name)
@pytest.mark.parametrize("budget", EDGE_BUDGETS)
def test_tree_inputs_are_an_ancestor_masked_tree_for_the_budget(budget, mode):
    gen = torch.Generator().manual_seed(budget)
    bs, vocab = 2, 40
    me = fake_worker(budget)
    values, ids = draft_topk(gen, bs, budget, vocab)
    starts = [5, 11]
    inputs = worker.DDTreeWorkerV2._ddtree_inputs(me, values, ids, torch.tensor([3, 7]), torch.tensor(starts), mode)
    width = me.ddtree_width
    assert inputs["draft_token"].numel() == bs * width
    topk_ids = ids.view(bs, BLOCK - 1, -1)
    for b, req in enumerate(unpack(inputs, bs, width, starts, mode)):
        assert req.index == list(range(b * width, (b + 1) * width))
        assert req.tokens[0] == [3, 7][b] and req.positions[0] == starts[b]
        # Walk the tree from the root: every reachable node sits one position below its parent,
        # carries one of the draft's top-k tokens for that depth, and sees exactly its ancestors.
        reached, stack = {0: [0]}, [0]
        while stack:
            node = stack.pop()
            for child in children(req.next_token, req.next_sibling, node):
                assert child not in reached
                reached[child] = reached[node] + [child]
                depth = len(reached[child]) - 1
                assert req.positions[child] == starts[b] + depth
                assert req.tokens[child] in topk_ids[b, depth - 1].tolist()
                stack.append(child)
        assert len(reached) == min(width, budget + 1)  # the budget's nodes plus the root
        assert max(len(p) for p in reached.values()) <= me.ddtree_max_depth
        for node, path in reached.items():
            assert sorted(torch.nonzero(req.mask[node]).flatten().tolist()) == sorted(path), (budget, node)


def test_the_device_mask_is_compile_trees_mask():
    """_ddtree_inputs builds the ancestor mask on the device from the trees' parents
    (_ancestor_mask); 0003's compile_tree builds the same mask on the host (its reference, and
    what the worker did before): equal for every edge budget, padding nodes included."""
    gen = torch.Generator().manual_seed(7)
    for budget in EDGE_BUDGETS:
        width = worker._verify_width(budget, BLOCK)
        values, ids = draft_topk(gen, 3, budget, vocab=2000)
        parents, masks = [], []
        for b in range(3):
            rows = range(b * (BLOCK - 1), (b + 1) * (BLOCK - 1))
            tree = ddtree_tree.build_tree([list(zip(ids[r].tolist(), values[r].tolist())) for r in rows], budget)
            compiled = ddtree_tree.compile_tree(tree, 1, 0, num_draft_tokens=width, batch_index=b)
            parents.append(compiled.parents)
            masks.append(compiled.attention_mask)
        device = worker._ancestor_mask(torch.tensor(parents), min(BLOCK, budget + 1))
        assert torch.equal(device, torch.tensor(masks, dtype=torch.bool)), budget


def test_one_transfer_keeps_every_token_id():
    """The top-k ids travel to the host as float64 with the log-probabilities (one copy): exact for
    any vocabulary id (the pinned target's is 151936 entries; float64 is exact up to 2**53)."""
    me = fake_worker(4)
    ids = torch.tensor([[248319, 151643, 0, 2 ** 31 - 1]] * (BLOCK - 1))
    values = torch.tensor([[-0.1, -0.2, -0.3, -0.4]] * (BLOCK - 1))
    inputs = worker.DDTreeWorkerV2._ddtree_inputs(me, values, ids, torch.tensor([248318]), torch.tensor([9]),
                                                  TreeMaskMode.QLEN_ONLY)
    assert inputs["draft_token"][0] == 248318
    assert set(inputs["draft_token"].tolist()) <= {248318, 248319, 151643, 0, 2 ** 31 - 1}
    assert 248319 in inputs["draft_token"].tolist()


# ------------------------------------------------------------------- a toy model, end to end


VOCAB = 48


def target_next(seq: list[int]) -> int:
    """The toy target's greedy next token: depends on the last two tokens and the position."""
    return (seq[-1] * 31 + seq[-2] * 17 + len(seq) * 7 + 3) % VOCAB


def greedy(prompt: list[int], n: int) -> list[int]:
    seq = list(prompt)
    while len(seq) < len(prompt) + n:
        seq.append(target_next(seq))
    return seq


def toy_draft(rng: random.Random, seq: list[int], k: int):
    """Top-k per block position: the target's true continuation at rank 0 (60%), at a lower rank
    (25%) or missing (15%), the rest random; log-probabilities best first."""
    truth = greedy(seq, BLOCK - 1)[len(seq):]
    values, ids = [], []
    for tok in truth:
        others = [t for t in rng.sample(range(VOCAB), min(VOCAB, k + 1)) if t != tok][:k]
        roll = rng.random()
        if roll < 0.6:
            row = [tok] + others[:k - 1]
        elif roll < 0.85 and k > 1:
            row = others[:1] + [tok] + others[1:k - 1]
        else:
            row = others[:k]
        ids.append(row)
        values.append(sorted((-rng.random() * 5 for _ in row), reverse=True))
    return torch.tensor(values), torch.tensor(ids)


def tree_decode(prompt: list[int], n: int, budget: int, mode: TreeMaskMode, break_mask: bool = False):
    """Decode n tokens: each step the worker's _ddtree_inputs builds the tree, the toy target
    scores every node from what the mask lets it see, 0003's verify_tree_greedy reference walks it."""
    rng = random.Random(budget * 7919 + int(mode))
    me = fake_worker(budget)
    width = me.ddtree_width
    k = min(budget, VOCAB - 1)  # one token left out, so the truth can be missing
    seq, steps, accepted = list(prompt), 0, 0
    while len(seq) < len(prompt) + n:
        values, ids = toy_draft(rng, seq, k)
        start = len(seq) - 1  # the root (last committed token) sits at this position
        inputs = worker.DDTreeWorkerV2._ddtree_inputs(
            me, values, ids, torch.tensor([seq[-1]]), torch.tensor([start]), mode)
        req = unpack(inputs, 1, width, [start], mode)[0]
        mask = torch.tril(torch.ones_like(req.mask)) if break_mask else req.mask
        predict = []
        for node in range(width):
            seen = sorted((req.positions[j], req.tokens[j]) for j in torch.nonzero(mask[node]).flatten().tolist())
            predict.append(target_next(seq[:start] + [t for _, t in seen]))
        predicts, accept_index, num = ddtree_tree.reference_verify_tree_greedy(
            [req.tokens], [req.index], [req.next_token], [req.next_sibling], [predict], me.ddtree_max_depth)
        path = accept_index[0][1:num[0] + 1]
        last = accept_index[0][num[0]]
        seq += [req.tokens[i] for i in path] + [predicts[last]]
        steps += 1
        accepted += num[0]
    return seq[:len(prompt) + n], steps, accepted


@pytest.mark.parametrize("mode", [TreeMaskMode.QLEN_ONLY, TreeMaskMode.FULL_MASK], ids=lambda m: m.name)
@pytest.mark.parametrize("budget", [1, 2, 7, BLOCK - 2, BLOCK - 1, BLOCK, 32, 200])
def test_tree_verified_output_equals_plain_greedy(budget, mode):
    prompt, n = [5, 9, 2], 120
    out, steps, accepted = tree_decode(prompt, n, budget, mode)
    assert out == greedy(prompt, n)
    assert accepted > 0 and steps < n  # drafts were accepted: fewer target passes than tokens
    print(f"budget {budget}: {n} tokens in {steps} verify steps ({accepted} drafts accepted)")


@pytest.mark.parametrize("budget", [7, 32])
def test_a_chain_mask_on_a_branching_tree_breaks_losslessness(budget):
    """The check above can fail: give siblings each other's tokens (a causal mask) and the toy
    target's predictions at branch nodes go wrong, so the output leaves the greedy sequence."""
    prompt, n = [5, 9, 2], 120
    out, _steps, _accepted = tree_decode(prompt, n, budget, TreeMaskMode.QLEN_ONLY, break_mask=True)
    assert out != greedy(prompt, n)


# ------------------------------------------------------------------------ ddtree-gpu-check's argv


def test_gpu_checks_command_lines_parse_under_the_real_parser(mirror):
    """bin/ddtree-gpu-check starts the target alone and then DDTREE (rendered by the fleet's own
    plugins/module_utils/flags.py), both with --enable-deterministic-inference: the real patched
    parser takes both command lines for the pinned target (what a GPU host would then do with
    them is not run here)."""
    from argparse import Namespace

    from ansible_collections.ddtree.fleet.plugins.plugin_utils.cli import gpucheck

    args = Namespace(python="python", module="sglang.launch_server", model_path=str(mirror[TARGET]),
                     draft_model_path=str(mirror[DRAFT]), budget=32, tp_size=1, port=31000,
                     server_arg=CPU_ONLY, deterministic=True)
    argvs = gpucheck.server_argvs(args)
    target = prepare_server_args(argvs["target"][3:])
    assert target.speculative_algorithm is None and target.enable_deterministic_inference
    ddtree = prepare_server_args(argvs["ddtree"][3:])
    assert ddtree.speculative_algorithm == "DDTREE" and ddtree.enable_deterministic_inference
    assert ddtree.speculative_ddtree_budget == 32
    assert ddtree.speculative_draft_model_path == str(mirror[DRAFT])
