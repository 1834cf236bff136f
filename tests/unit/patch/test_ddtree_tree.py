"""DDTree without a GPU: the module patch 0003 adds, loaded straight from the patch text.

One source of truth: the added lines of roles/sglang/files/patches/0003-ddtree-tree.patch are
extracted and executed; nothing imports sglang or torch. Toy target and draft distributions
(seeded random vocabularies, 200 seeds) show that greedy DDTree decoding (draft tree -> target
verify through the mask and positions -> follow the path -> keep the path's KV -> repeat) emits
exactly the target's greedy tokens. The last test reads the real 0.5.23 wheel with ``ast`` and
checks the kernels and fields the compiled output is laid out for.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import math
import os
import random
import re
import sys
import types
import zipfile
from pathlib import Path

import pytest
from patchset_testlib import PATCH_DIR, sha256

PATCH = PATCH_DIR / "0003-ddtree-tree.patch"
TARGET = "sglang/srt/speculative/ddtree_tree.py"
SEEDS = range(200)


def extract_new_file(text, target):
    """The content of ``target`` as created by a ``--- /dev/null`` hunk of ``text``."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if line == "+++ b/" + target:
            assert lines[index - 1].startswith("--- /dev/null"), lines[index - 1]
            match = re.match(r"^@@ -0,0 \+1,(\d+) @@", lines[index + 1])
            assert match, lines[index + 1]
            count = int(match.group(1))
            body = lines[index + 2 : index + 2 + count]
            assert len(body) == count and all(l.startswith("+") for l in body), "truncated or malformed hunk"
            assert index + 2 + count == len(lines), "trailing lines after the hunk"
            return "".join(l[1:] + "\n" for l in body)
    raise AssertionError("%s is not created by %s" % (target, PATCH.name))


SOURCE = extract_new_file(PATCH.read_text(encoding="utf-8"), TARGET)


@pytest.fixture(scope="module")
def dd():
    name = "ddtree_tree_from_patch"
    module = types.ModuleType(name)
    module.__file__ = str(PATCH) + ":" + TARGET
    sys.modules[name] = module  # dataclasses look the module up
    try:
        exec(compile(SOURCE, module.__file__, "exec", dont_inherit=True), module.__dict__)
        yield module
    finally:
        sys.modules.pop(name, None)


# ---------------------------------------------------------------------------------------------
# toy models
# ---------------------------------------------------------------------------------------------


class ToyTarget:
    """A deterministic 'model': the greedy next token is a salted hash of the WHOLE sequence.

    Any change in what a verify node sees (a sibling leaking through the mask, an ancestor
    missing, a wrong order or a wrong KV entry) changes its argmax with probability 1 - 1/V.
    """

    def __init__(self, rng):
        self.vocab = rng.randint(3, 40)
        self.salt = rng.getrandbits(48)

    def next(self, seq):
        return hash((self.salt, len(seq)) + tuple(seq)) % self.vocab

    def greedy(self, prompt, n):
        seq = list(prompt)
        for _ in range(n):
            seq.append(self.next(seq))
        return seq[len(prompt) :]


class ToyDraft:
    """Block-diffusion-like drafts: one pass gives every position's top-k at once.

    Position d's distribution is random logits with a random boost on the target's true greedy
    token at that position (so the true token is often top-1, sometimes rank 2..k, sometimes
    absent), independent of which token the tree puts at the earlier positions.
    """

    def __init__(self, rng, target):
        self.rng = rng
        self.target = target
        self.block = rng.randint(1, 8)  # draft positions D
        self.skill = rng.uniform(0.0, 4.0)

    def topk(self, context):
        rng, vocab = self.rng, self.target.vocab
        truth = self.target.greedy(context, self.block)
        out = []
        for d in range(self.block):
            logits = [rng.gauss(0.0, 1.0) for _ in range(vocab)]
            logits[truth[d]] += rng.uniform(0.0, self.skill) / (1 + 0.3 * d)
            top = max(logits)
            norm = top + math.log(sum(math.exp(x - top) for x in logits))
            ranked = sorted(range(vocab), key=lambda t: -logits[t])
            k = rng.randint(1, min(4, vocab))
            pairs = [(t, logits[t] - norm) for t in ranked[:k]]
            rng.shuffle(pairs)  # build_tree must not rely on the caller's order
            out.append(pairs)
        return out


def verify_on_target(dd, target, cache, compiled):
    """One target forward pass over the verify nodes, through the mask and positions only."""
    start = compiled.start_position
    assert [p for _t, p in cache] == list(range(start)), "KV cache positions are not 0..start-1"
    argmax = []
    for i in range(compiled.num_draft_tokens):
        visible = [j for j in range(compiled.num_draft_tokens) if compiled.attention_mask[i][j]]
        visible.sort(key=lambda j: compiled.positions[j])
        assert [compiled.positions[j] for j in visible] == list(range(start, start + len(visible)))
        seq = [t for t, _p in cache] + [compiled.verify_tokens[j] for j in visible]
        argmax.append(target.next(seq))
    return argmax


def decode(dd, seed, budget=None, include_greedy_chain=False, chain_only=False, new_tokens=24, trace=None):
    rng = random.Random(seed)
    target = ToyTarget(rng)
    draft = ToyDraft(rng, target)
    budget = budget if budget is not None else rng.randint(1, 40)
    prompt = [rng.randrange(target.vocab) for _ in range(rng.randint(1, 6))]
    context = list(prompt)
    cache = [(t, p) for p, t in enumerate(context[:-1])]  # KV of everything but the root
    steps = 0
    while len(context) - len(prompt) < new_tokens:
        topk = draft.topk(context)
        if chain_only:
            tree = dd.greedy_chain(topk)
        else:
            tree = dd.build_tree(topk, budget, include_greedy_chain=include_greedy_chain)
        compiled = dd.compile_tree(tree, context[-1], len(context) - 1)
        argmax = verify_on_target(dd, target, cache, compiled)
        result = dd.follow_greedy(compiled, argmax)
        # KV compaction: keep only the accepted path's entries, at contiguous positions.
        assert list(result.kv_positions) == list(range(len(context) - 1, len(context) + result.num_correct_drafts))
        cache += [(compiled.verify_tokens[j], compiled.positions[j]) for j in result.kv_keep]
        context += result.output_tokens
        assert [t for t, _p in cache] == context[:-1]
        if trace is not None:
            trace.append((topk, tree, compiled, argmax, result))
        steps += 1
    produced = context[len(prompt) :]
    return produced, target.greedy(prompt, len(produced)), steps


# ---------------------------------------------------------------------------------------------
# the file in the patch
# ---------------------------------------------------------------------------------------------


def test_patch_creates_one_pure_stdlib_file(dd):
    tree = ast.parse(SOURCE)
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported <= {"__future__", "heapq", "math", "dataclasses", "typing"}, imported
    for name in ("build_tree", "compile_tree", "follow_greedy"):
        assert callable(getattr(dd, name))
    assert dd.BUDGET_FLAG == "--speculative-ddtree-budget"
    assert 1 <= dd.DEFAULT_BUDGET <= dd.MAX_BUDGET == 1023
    assert set(dd.__all__) <= set(vars(dd))


# ---------------------------------------------------------------------------------------------
# losslessness and KV compaction
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_greedy_ddtree_decoding_is_lossless(dd, seed):
    produced, expected, _steps = decode(dd, seed)
    assert produced == expected


def test_losslessness_also_with_the_chain_and_tiny_or_large_budgets(dd):
    for seed in range(0, 200, 5):
        for kwargs in ({"budget": 1}, {"budget": 100}, {"chain_only": True}, {"include_greedy_chain": True}):
            produced, expected, _ = decode(dd, seed, **kwargs)
            assert produced == expected, (seed, kwargs)


def test_trees_accept_more_than_one_token_per_step_on_average(dd):
    """Sanity of the toy: drafting is useful, so the test above exercises long accepted paths."""
    tokens = steps = deep = 0
    for seed in SEEDS:
        trace = []
        produced, _expected, n = decode(dd, seed, budget=32, trace=trace)
        tokens, steps = tokens + len(produced), steps + n
        deep += sum(1 for *_x, r in trace if r.num_correct_drafts >= 2)
    assert tokens / steps > 1.5 and deep > 100


# ---------------------------------------------------------------------------------------------
# structure: budget, best first, mask, positions, lineage
# ---------------------------------------------------------------------------------------------


def random_topk(rng, positions=None, max_k=4, vocab=50):
    positions = positions or rng.randint(1, 7)
    out = []
    for _ in range(positions):
        k = rng.randint(1, max_k)
        tokens = rng.sample(range(vocab), k)
        out.append([(t, -rng.expovariate(1.0)) for t in tokens])
    return out


def all_nodes(topk):
    """Every possible node (path of ranks) with its cumulative score, by brute force."""
    nodes = []
    for depth in range(1, len(topk) + 1):
        ranked = [sorted(c, key=lambda p: -p[1]) for c in topk[:depth]]
        for ranks in itertools.product(*[range(len(c)) for c in ranked]):
            nodes.append(sum(ranked[d][r][1] for d, r in enumerate(ranks)))
    return nodes


def test_tree_respects_budget_and_is_best_first(dd):
    rng = random.Random(7)
    for _ in range(400):
        topk = random_topk(rng)
        budget = rng.randint(1, 60)
        tree = dd.build_tree(topk, budget)
        possible = all_nodes(topk)
        assert tree.num_draft_nodes == min(budget, len(possible)) <= budget
        scores = list(tree.scores[1:])
        assert all(a >= b - 1e-12 for a, b in zip(scores, scores[1:])), "nodes not added best first"
        best = sorted(possible, reverse=True)[: tree.num_draft_nodes]
        assert all(math.isclose(a, b, abs_tol=1e-9) for a, b in zip(sorted(scores, reverse=True), best))
        for i in range(1, tree.num_nodes):
            p = tree.parents[i]
            assert 0 <= p < i and tree.depths[i] == tree.depths[p] + 1
            by_rank = sorted(topk[tree.depths[i] - 1], key=lambda c: -c[1])
            assert tree.tokens[i] == by_rank[tree.ranks[i]][0]
            assert math.isclose(tree.scores[i], tree.scores[p] + by_rank[tree.ranks[i]][1], abs_tol=1e-9)
        siblings = {}
        for i in range(1, tree.num_nodes):
            siblings.setdefault(tree.parents[i], []).append(tree.tokens[i])
        assert all(len(v) == len(set(v)) for v in siblings.values()), "duplicate tokens among siblings"


@pytest.mark.parametrize("pad", [0, 1, 7])
def test_mask_positions_and_lineage(dd, pad):
    rng = random.Random(100 + pad)
    for _ in range(300):
        topk = random_topk(rng)
        tree = dd.build_tree(topk, rng.randint(1, 40), include_greedy_chain=rng.random() < 0.5)
        start = rng.randint(0, 5000)
        batch_index = rng.randint(0, 5)
        n = tree.num_nodes + pad
        c = dd.compile_tree(tree, 11, start, num_draft_tokens=n, batch_index=batch_index)
        assert c.num_draft_tokens == n and c.num_nodes == tree.num_nodes
        assert c.verify_tokens[: tree.num_nodes] == (11,) + tree.tokens[1:]
        assert c.max_tree_depth == max(tree.depths) + 1
        for i in range(n):
            assert c.positions[i] == start + c.depths[i]
            sees = {j for j in range(n) if c.attention_mask[i][j]}
            expected = set(tree.path(i)) if i < tree.num_nodes else {i}
            assert sees == expected, (i, sees, expected)
        assert c.retrive_index == tuple(batch_index * n + i for i in range(n))
        # Lineage walks == parent pointers (children in increasing index order, each once).
        reached = []
        for i in range(n):
            kids, child = [], c.retrive_next_token[i]
            while child != -1:
                kids.append(child)
                child = c.retrive_next_sibling[child]
            assert kids == [j for j in range(n) if c.parents[j] == i]
            reached += kids
        assert sorted(reached) == list(range(1, tree.num_nodes)), "every draft node has exactly one parent link"
        assert all(c.retrive_next_sibling[j] == -1 for j in range(n) if c.parents[j] == -1)
        assert all(c.retrive_next_token[j] == -1 and c.parents[j] == -1 for j in range(tree.num_nodes, n))
        # Flat masks in TreeMaskMode layouts.
        q = c.flat_tree_mask("QLEN_ONLY")
        assert len(q) == n * n
        assert all(q[r * n : (r + 1) * n] == list(c.attention_mask[r]) for r in range(n))
        full = c.flat_tree_mask("FULL_MASK")
        assert len(full) == n * (start + n)
        row = start + n
        assert all(full[r * row : r * row + start] == [True] * start for r in range(n))
        assert all(full[r * row + start : (r + 1) * row] == list(c.attention_mask[r]) for r in range(n))
        arrays = c.eagle_verify_arrays("FULL_MASK")
        assert list(arrays) == list(dd.EAGLE_BUILD_TREE_RETURNS)
        assert arrays["draft_tokens"] == list(c.verify_tokens) and arrays["positions"] == list(c.positions)


def test_follow_greedy_matches_the_kernel_semantics_on_a_padded_batch(dd):
    """follow_greedy per request == the verify_tree_greedy re-statement over a whole batch."""
    rng = random.Random(5)
    for _ in range(200):
        trees = [dd.build_tree(random_topk(rng, vocab=6), rng.randint(1, 30)) for _ in range(rng.randint(1, 5))]
        n = max(t.num_nodes for t in trees)
        width = max(t.max_depth for t in trees) + 1
        compiled = [dd.compile_tree(t, rng.randrange(6), rng.randint(0, 99), n, b) for b, t in enumerate(trees)]
        argmax = []
        for c in compiled:  # a target that often agrees with some branch
            argmax.append([rng.choice([c.verify_tokens[j] for j in range(n)] + [rng.randrange(6)]) for _ in range(n)])
        predicts, accept_index, accept_num = dd.reference_verify_tree_greedy(
            [list(c.verify_tokens) for c in compiled],
            [list(c.retrive_index) for c in compiled],
            [list(c.retrive_next_token) for c in compiled],
            [list(c.retrive_next_sibling) for c in compiled],
            argmax,
            width,
        )
        for b, c in enumerate(compiled):
            r = dd.follow_greedy(c, argmax[b], max_tree_depth=width)
            assert list(r.accept_index) == accept_index[b]
            assert r.num_correct_drafts == accept_num[b]
            got = [predicts[i] for i in accept_index[b] if i != -1]
            assert tuple(got) == r.output_tokens  # accepted drafts + bonus, as the kernel writes them
            path = list(r.accepted_nodes)
            assert all(c.parents[path[k + 1]] == path[k] for k in range(len(path) - 1))
            assert all(argmax[b][path[k]] == c.verify_tokens[path[k + 1]] for k in range(len(path) - 1))


# ---------------------------------------------------------------------------------------------
# tree vs. linear chain
# ---------------------------------------------------------------------------------------------


def accepted(dd, tree, root, argmax_fn):
    c = dd.compile_tree(tree, root, 0)
    return dd.follow_greedy(c, [argmax_fn(c, i) for i in range(c.num_draft_tokens)]).num_correct_drafts


def path_target(truth):
    """Target that agrees with the draft path ``truth`` (tokens by depth) and nothing else."""

    def argmax(c, i):
        d = c.depths[i]
        on_path = all(c.verify_tokens[j] == truth[c.depths[j] - 1] for j in range(c.num_draft_tokens) if c.attention_mask[i][j] and j != 0)
        return truth[d] if on_path and d < len(truth) else 10**6

    return argmax


def test_with_the_chain_included_the_tree_accepts_at_least_the_chain(dd):
    rng = random.Random(11)
    for _ in range(2000):
        topk = random_topk(rng, vocab=5)
        depth = len(topk)
        truth = [rng.choice([t for t, _ in c] + [99]) for c in topk] + [7]
        chain = accepted(dd, dd.greedy_chain(topk), 0, path_target(truth))
        budget = rng.randint(depth, depth + 30)
        tree = dd.build_tree(topk, budget, include_greedy_chain=True)
        assert accepted(dd, tree, 0, path_target(truth)) >= chain


def test_pure_best_first_beats_the_chain_it_contains(dd):
    """The paper's tree contains a prefix of the chain; it accepts at least as far along it."""
    rng = random.Random(12)
    for _ in range(2000):
        topk = random_topk(rng, vocab=5)
        truth = [rng.choice([t for t, _ in c] + [99]) for c in topk] + [7]
        chain_tree = dd.greedy_chain(topk)
        chain = accepted(dd, chain_tree, 0, path_target(truth))
        tree = dd.build_tree(topk, rng.randint(len(topk), len(topk) + 30))
        contained = 0  # depth of the chain prefix inside the tree
        node = 0
        for d in range(1, len(topk) + 1):
            kids = [i for i in range(tree.num_nodes) if tree.parents[i] == node and tree.ranks[i] == 0]
            if not kids:
                break
            node, contained = kids[0], d
        assert accepted(dd, tree, 0, path_target(truth)) >= min(chain, contained)


def test_pure_best_first_can_drop_the_chain_tail(dd):
    """Why include_greedy_chain exists: budget == D, a wide first position, a weak second one."""
    topk = [[(1, -0.1), (2, -0.2)], [(3, -5.0)]]
    tree = dd.build_tree(topk, 2)
    assert tree.tokens == (None, 1, 2)  # the chain's depth-2 node lost to the sibling
    truth = [1, 3, 7]
    assert accepted(dd, tree, 0, path_target(truth)) == 1
    assert accepted(dd, dd.greedy_chain(topk), 0, path_target(truth)) == 2
    assert accepted(dd, dd.build_tree(topk, 2, include_greedy_chain=True), 0, path_target(truth)) == 2


# ---------------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "topk, budget, fragment",
    [
        ([[(1, -0.1)]], 0, "between 1 and 1023"),
        ([[(1, -0.1)]], 1024, "between 1 and 1023"),
        ([[(1, -0.1)]], True, "must be an integer"),
        ([[(1, -0.1)]], 2.0, "must be an integer"),
        ([], 4, "at least one draft position"),
        ([[]], 4, "no \\(token, logprob\\) candidates"),
        ("abc", 4, "must be a sequence"),
        ([[(1, 0.5)]], 4, "not logits"),
        ([[(1, float("nan"))]], 4, "finite"),
        ([[(1, float("-inf"))]], 4, "finite"),
        ([[(1, -0.1), (1, -0.2)]], 4, "listed twice"),
        ([[(-1, -0.1)]], 4, "integers >= 0"),
        ([[(1.0, -0.1)]], 4, "integers >= 0"),
        ([[(1, -0.1, 3)]], 4, "pairs"),
    ],
)
def test_build_tree_refuses_bad_input(dd, topk, budget, fragment):
    with pytest.raises(dd.DDTreeError, match=fragment):
        dd.build_tree(topk, budget)
    assert issubclass(dd.DDTreeError, ValueError)


def test_the_fast_check_and_the_checking_loop_agree(dd):
    """_checked_fast (whole columns, exact int/float types) gives what the per-pair loop gives:
    the same pairs, best first, ties in their given order, tiny positive values clamped to 0.
    A float subclass takes the loop (the fast check wants exact types), so both paths run."""

    class Real(float):
        pass

    rng = random.Random(3)
    for trial in range(300):
        n = rng.randint(1, 40)
        tokens = rng.sample(range(1000), n)
        values = [-round(rng.random() * 4, 1) for _ in range(n)]  # rounded: ties happen
        if trial % 5 == 0:
            values[0] = dd.LOGPROB_TOLERANCE / 2
        fast_in = [(t, float(v)) for t, v in zip(tokens, values)]
        loop_in = [(t, Real(v)) for t, v in zip(tokens, values)]
        assert dd._checked_fast(fast_in) is not None and dd._checked_fast(loop_in) is None
        fast, loop = dd._validate_topk([fast_in])[0], dd._validate_topk([loop_in])[0]
        assert fast == loop and all(type(v) is float for _, v in loop)
        assert [v for _, v in fast] == sorted((v for _, v in fast), reverse=True)
        assert max(v for _, v in fast) <= 0.0


def test_compile_without_the_mask_keeps_every_other_field(dd):
    tree = dd.build_tree([[(1, -0.1), (2, -1.0)], [(3, -0.3), (4, -0.9)]], 5)
    full, bare = dd.compile_tree(tree, 7, 40, num_draft_tokens=8), dd.compile_tree(tree, 7, 40, 8, with_mask=False)
    assert bare.attention_mask is None and full.attention_mask is not None
    assert dataclasses.replace(full, attention_mask=None) == bare
    with pytest.raises(dd.DDTreeError, match="without its mask"):
        bare.flat_tree_mask()


def test_max_budget_tree(dd):
    topk = [[(t, -0.01 * t) for t in range(8)] for _ in range(6)]
    tree = dd.build_tree(topk, dd.MAX_BUDGET)
    assert tree.num_draft_nodes == dd.MAX_BUDGET
    c = dd.compile_tree(tree, 0, 0)
    assert c.num_draft_tokens == dd.MAX_BUDGET + 1 == 1024


def test_budget_error_names_the_flag(dd):
    with pytest.raises(ValueError, match="--speculative-ddtree-budget"):
        dd.validate_budget(0)
    assert dd.validate_budget(dd.DEFAULT_BUDGET) == dd.DEFAULT_BUDGET


def test_compile_and_follow_refuse_bad_input(dd):
    tree = dd.build_tree([[(1, -0.1), (2, -1.0)], [(3, -0.3)]], 4)
    with pytest.raises(dd.DDTreeError, match="root_token"):
        dd.compile_tree(tree, -1, 0)
    with pytest.raises(dd.DDTreeError, match="start_position"):
        dd.compile_tree(tree, 0, -3)
    with pytest.raises(dd.DDTreeError, match="num_draft_tokens"):
        dd.compile_tree(tree, 0, 0, num_draft_tokens=tree.num_nodes - 1)
    with pytest.raises(dd.DDTreeError, match="DraftTree"):
        dd.compile_tree({"tokens": []}, 0, 0)
    compiled = dd.compile_tree(tree, 0, 0)
    with pytest.raises(dd.DDTreeError, match="one token per verify node"):
        dd.follow_greedy(compiled, [0])
    with pytest.raises(dd.DDTreeError, match="integer token ids"):
        dd.follow_greedy(compiled, [0.5] * compiled.num_draft_tokens)
    with pytest.raises(dd.DDTreeError, match="mode"):
        compiled.flat_tree_mask("BITPACKING")


# ---------------------------------------------------------------------------------------------
# the real sglang 0.5.23 wheel: what the compiled output is laid out for
# ---------------------------------------------------------------------------------------------

WHEEL_NAME = "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl"
WHEEL_CANDIDATES = [
    os.environ.get("DDTREE_SGLANG_WHEEL", ""),
    "/var/cache/ddtree-lab/wheels/" + WHEEL_NAME,
    "/tmp/sgwheel/" + WHEEL_NAME,
]


def _wheel():
    for candidate in WHEEL_CANDIDATES:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    pytest.skip(
        "sglang 0.5.23 wheel not found (looked in %s); set DDTREE_SGLANG_WHEEL or run "
        "`.venv/bin/pip download sglang==0.5.23 --no-deps -d /tmp/sgwheel`" % ", ".join(c for c in WHEEL_CANDIDATES if c)
    )


def _params(func):
    a = func.args
    return tuple(x.arg for x in a.posonlyargs + a.args + a.kwonlyargs)


def _top(tree, kind, name):
    found = [n for n in tree.body if isinstance(n, kind) and n.name == name]
    assert found, "%s not found" % name
    return found[0]


def test_compiled_format_matches_the_real_0_5_23_wheel(dd):
    wheel = _wheel()
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())

        def src(path):
            return zf.read(path).decode("utf-8")

        assert TARGET not in names, "0.5.23 already ships %s; 0003 would clash" % TARGET
        assert "sglang/srt/speculative" in {n.rsplit("/", 1)[0] for n in names}

        tree_ops = ast.parse(src("sglang/kernels/ops/speculative/tree.py"))
        assert _params(_top(tree_ops, ast.FunctionDef, "verify_tree_greedy")) == dd.VERIFY_TREE_GREEDY_PARAMS
        assert _params(_top(tree_ops, ast.FunctionDef, "build_tree_kernel_efficient")) == dd.BUILD_TREE_KERNEL_EFFICIENT_OP_PARAMS

        spec_tree = ast.parse(src("sglang/kernels/ops/speculative/spec_tree.py"))
        func = _top(spec_tree, ast.FunctionDef, "verify_tree_greedy_func")
        assert _params(func) == dd.VERIFY_TREE_GREEDY_FUNC_PARAMS
        assert ast.literal_eval(func.args.defaults[-1]) == -1  # topk=-1
        modes = {
            t.id: ast.literal_eval(s.value)
            for s in _top(spec_tree, ast.ClassDef, "TreeMaskMode").body
            if isinstance(s, ast.Assign)
            for t in s.targets
        }
        assert {k: modes[k] for k in dd.TREE_MASK_MODES} == dd.TREE_MASK_MODES

        cuh = src("sglang/kernels/jit/csrc/speculative/tree.cuh")
        decl = re.search(r"inline void verify_tree_greedy\((.*?)\)\s*\{", cuh, re.S)
        assert decl and tuple(re.findall(r"TensorView (\w+)", decl.group(1))) == dd.VERIFY_TREE_GREEDY_PARAMS
        body = cuh[decl.end() : decl.end() + 1500]
        assert "TensorMatcher({batch_size, draft_tokens})" in body and "with_dtype<int64_t>()" in body
        assert "TensorMatcher({batch_size, spec_tokens}).with_dtype<int32_t>()" in body

        eagle_utils = ast.parse(src("sglang/srt/speculative/eagle_utils.py"))
        build = _top(eagle_utils, ast.FunctionDef, "build_tree_kernel_efficient")
        returns = [n for n in ast.walk(build) if isinstance(n, ast.Return)]
        assert len(returns) == 1 and isinstance(returns[0].value, ast.Tuple)
        assert tuple(e.id for e in returns[0].value.elts) == dd.EAGLE_BUILD_TREE_RETURNS
        sample = _top(eagle_utils, ast.FunctionDef, "eagle_sample")
        calls = [
            n for n in ast.walk(sample)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "verify_tree_greedy_func"
        ]
        assert calls and all(tuple(k.arg for k in c.keywords) == dd.VERIFY_TREE_GREEDY_FUNC_PARAMS for c in calls)
        assert "(bs, verify_input.max_tree_depth), -1" in ast.get_source_segment(src("sglang/srt/speculative/eagle_utils.py"), sample)

        eagle_info = ast.parse(src("sglang/srt/speculative/eagle_info.py"))
        verify_input = _top(eagle_info, ast.ClassDef, "EagleVerifyInput")
        fields = {s.target.id for s in verify_input.body if isinstance(s, ast.AnnAssign)}
        assert set(dd.EAGLE_VERIFY_INPUT_FIELDS) <= fields, set(dd.EAGLE_VERIFY_INPUT_FIELDS) - fields
        depth = _top(verify_input, ast.FunctionDef, "max_tree_depth")
        assert any(isinstance(d, ast.Name) and d.id == "property" for d in depth.decorator_list)


# ---------------------------------------------------------------------------------------------
# the patch through the project's patcher (no wheel needed)
# ---------------------------------------------------------------------------------------------


def test_0003_creates_the_file_idempotently(tmp_path, logic):
    site = tmp_path / "site-packages"
    (site / "sglang" / "srt" / "speculative").mkdir(parents=True)
    sums = {PATCH.name: sha256(PATCH)}
    first = logic.ensure_patchset(str(site), [str(PATCH)], sums)
    assert first["applied"] == [PATCH.name] and first["files"] == [TARGET]
    assert (site / TARGET).read_text(encoding="utf-8") == SOURCE
    again = logic.ensure_patchset(str(site), [str(PATCH)], sums)
    assert again["changed"] is False and again["already_applied"] == [PATCH.name]
    assert sorted(p.name for p in (site / "sglang" / "srt" / "speculative").iterdir()) == ["ddtree_tree.py"]
