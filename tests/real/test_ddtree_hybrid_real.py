"""DDTREE on a Gated-DeltaNet hybrid target, executed with the real sglang 0.5.23 kernels on CPU.

The pinned target (Qwen3.6-27B) mixes full-attention and Gated-DeltaNet layers. Its linear-attention
layers carry a recurrent state, so a tree verify must start every node from its parent's state, not
from the node before it in the flattened verify batch. Patch 0004 sends a DDTree verify down 0.5.23's
own EAGLE tree path for GDN layers. Here, with Triton's interpreter (conftest.py sets
``TRITON_INTERPRET=1``, so the real ``@triton.jit`` kernels run on CPU tensors), one verify step is
executed piece by piece:

1. the patched worker's real ``_ddtree_verify`` builds the verify input from a draft block (on a
   fake verify call that only records what it is given);
2. the patched ``HybridLinearAttnBackend`` metadata code turns that input into tree metadata;
3. the real ``causal_conv1d_update`` kernel derives each node's parent from the lineage arrays
   and convolves along the node's root path;
4. the real GDN verify kernel (``TritonGDNKernel.target_verify``, the kernel the backend picks for
   a tree) starts each node from its parent's per-step state;
5. the real ``_verify_commit_step_indices`` (and the Triton kernel a GPU runs instead,
   ``fused_commit_track_indices``) picks the step whose conv window and SSM state are committed,
   and the backend's state scatter (its CPU branch) commits them.

Each node's output, conv window and per-step state is compared with the same kernels run as a plain chain over
that node's root-to-node path (what a target without speculation computes for the accepted
tokens). One negative control shows that the comparison fails when the tree is verified as a chain,
the state the pinned target was in before this change.
"""

from __future__ import annotations

import copy
import random
from types import SimpleNamespace

import pytest
import torch

from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update
from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend, MambaAttnBackendBase
from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.speculative import ddtree_tree
from sglang.srt.speculative import ddtree_worker_v2 as worker
from sglang.srt.speculative.spec_utils import _verify_commit_step_indices

from realkit import BLOCK, parse

H, HV, K, V = 2, 4, 16, 16  # GDN heads (q/k heads, v heads) and head dims, small
CONV_DIM, CONV_WIDTH = 24, 4  # the conv1d channels and kernel width (Qwen3.5/3.6: width 4)
VOCAB, HIDDEN = 40, 8


class _Recorded(Exception):
    """Raised by the fake run_eagle_verify once it has the verify input."""


def verify_input_from_the_worker(monkeypatch, budget: int, bs: int, seed: int):
    """Run the patched worker's _ddtree_verify on a toy draft block; return its verify input."""
    gen = torch.Generator().manual_seed(seed)
    lm_head = SimpleNamespace(weight=torch.randn((VOCAB, HIDDEN), generator=gen))
    me = SimpleNamespace(
        block_size=BLOCK, ddtree_budget=budget, ddtree_width=worker._verify_width(budget, BLOCK),
        ddtree_topk=min(budget, VOCAB), ddtree_max_depth=min(BLOCK, budget + 1), device=torch.device("cpu"),
        draft_parallel_layout=SimpleNamespace(tp_group=None),
        target_worker=SimpleNamespace(model_runner=SimpleNamespace(attn_backend=SimpleNamespace(verify_mask=None))),
        model_runner=SimpleNamespace(req_to_token_pool=None, token_to_kv_pool_allocator=None),
    )
    me._ddtree_topk = lambda hidden, head: worker.DDTreeWorkerV2._ddtree_topk(me, hidden, head)
    me._ddtree_inputs = lambda *a: worker.DDTreeWorkerV2._ddtree_inputs(me, *a)
    seen = {}

    def fake_verify(batch, **kwargs):
        seen["spec_info"], seen["kwargs"] = batch.spec_info, kwargs
        raise _Recorded

    monkeypatch.setattr(worker, "run_eagle_verify", fake_verify)
    batch = SimpleNamespace(seq_lens=torch.tensor([7 + 3 * b for b in range(bs)]), spec_info=None)
    with pytest.raises(_Recorded):
        worker.DDTreeWorkerV2._ddtree_verify(
            me, batch=batch, draft_hidden=torch.randn((bs * BLOCK, HIDDEN), generator=gen), lm_head=lm_head,
            root_tokens=torch.arange(bs) + 1, prefix_lens=batch.seq_lens, positions_2d=None, kv_loc_plan=None,
            on_publish=None, grammar_barrier=None, pp_proxy_tensors=None)
    assert seen["kwargs"]["num_draft_tokens"] == me.ddtree_width
    return seen["spec_info"], me.ddtree_width


def backend_metadata(spec_info, bs: int, width: int, topk: int = 1):
    """The patched HybridLinearAttnBackend code's metadata for an eager TARGET_VERIFY forward."""
    backend = object.__new__(MambaAttnBackendBase)
    backend.topk = topk  # --speculative-eagle-topk: DFLASH's resolution makes it 1 for DDTREE
    backend.device = torch.device("cpu")
    backend.req_to_token_pool = SimpleNamespace(get_mamba_indices=lambda rows: rows.to(torch.int32),
                                                translate_mamba_indices=lambda ids: ids)
    forward_batch = SimpleNamespace(
        batch_size=bs, forward_mode=ForwardMode.TARGET_VERIFY, logical_forward_mode=ForwardMode.TARGET_VERIFY,
        req_pool_indices=torch.arange(bs), mamba_track_indices=None, mamba_track_mask=None,
        extend_start_loc=None, extend_seq_lens=None,
        spec_info=spec_info, input_ids=torch.zeros(bs * width, dtype=torch.long))
    return backend._forward_metadata(forward_batch)


def tree_parents(spec_info, b: int, width: int) -> list[int]:
    """Each node's parent, walked from the root through the lineage arrays (-1: root or unused)."""
    first, sibling = spec_info.retrieve_next_token[b].tolist(), spec_info.retrieve_next_sibling[b].tolist()
    parents, stack = [-1] * width, [0]
    while stack:
        node = stack.pop()
        child = first[node]
        while child != -1:
            parents[child] = node
            stack.append(child)
            child = sibling[child]
    return parents


def root_path(parents: list[int], node: int) -> list[int]:
    path = [node]
    while parents[path[-1]] != -1:
        path.append(parents[path[-1]])
    return path[::-1]


class Layer:
    """One GDN layer's weights and pre-verify state for ``bs`` requests, random but fixed."""

    def __init__(self, seed: int, bs: int):
        gen = torch.Generator().manual_seed(seed)
        self.gen = gen
        self.conv_weight = torch.randn((CONV_DIM, CONV_WIDTH), generator=gen)
        self.conv_bias = torch.randn((CONV_DIM,), generator=gen)
        self.conv_state = torch.randn((bs, CONV_DIM, CONV_WIDTH - 1), generator=gen)
        self.A_log = torch.randn((HV,), generator=gen)
        self.dt_bias = torch.randn((HV,), generator=gen)
        self.ssm = torch.randn((bs, HV, V, K), generator=gen)

    def conv(self, x, b: int, next_token=None, next_sibling=None, parent=None):
        """causal_conv1d_update for request b over x [CONV_DIM, T] as a verify runs it: returns the
        outputs and each step's conv window (the last CONV_WIDTH - 1 inputs on its path), in the
        dense per-step layout the pool keeps for a tree (memory_pool.conv_window_dedup_enabled)."""
        steps = x.shape[1]
        windows = torch.zeros((1, steps, CONV_DIM, CONV_WIDTH - 1))
        out = causal_conv1d_update(
            x[None].clone(), self.conv_state[b:b + 1].clone(), self.conv_weight, self.conv_bias, activation="silu",
            conv_state_indices=torch.tensor([0], dtype=torch.int32), intermediate_conv_window=windows,
            intermediate_state_indices=torch.tensor([0], dtype=torch.int32),
            retrieve_next_token=next_token, retrieve_next_sibling=next_sibling, retrieve_parent_token=parent)
        return out[0], windows[0]

    def recurrent(self, q, k, v, a, g, b: int, parent=None):
        """The GDN verify kernel for request b over T tokens; returns (outputs, per-step states)."""
        steps = q.shape[1]
        states = torch.zeros((1, steps, HV, V, K))
        out = TritonGDNKernel().target_verify(
            A_log=self.A_log, dt_bias=self.dt_bias, q=q, k=k, v=v, a=a, b=g,
            ssm_states=self.ssm[b:b + 1].clone(), cache_indices=torch.tensor([0], dtype=torch.int32),
            query_start_loc=torch.tensor([0, steps], dtype=torch.int32), intermediate_states_buffer=states,
            intermediate_state_indices=torch.tensor([0], dtype=torch.int32), cache_steps=steps,
            retrieve_parent_token=parent)
        return out[0], states[0]

    def inputs(self, width: int):
        gen = self.gen
        return SimpleNamespace(
            x=torch.randn((CONV_DIM, width), generator=gen), q=torch.randn((1, width, H, K), generator=gen),
            k=torch.randn((1, width, H, K), generator=gen), v=torch.randn((1, width, HV, V), generator=gen),
            a=torch.randn((width, HV), generator=gen), g=torch.randn((width, HV), generator=gen))


@pytest.mark.parametrize("budget", [1, 7, BLOCK - 1, 32])
def test_a_ddtree_verify_on_gdn_layers_equals_each_nodes_own_chain(monkeypatch, budget):
    bs = 2
    spec_info, width = verify_input_from_the_worker(monkeypatch, budget, bs, seed=budget)
    assert spec_info.is_ddtree_tree and spec_info.draft_token_num == width

    # The patched backend hands the tree to the GDN layers although topk is 1 ...
    meta = backend_metadata(spec_info, bs, width)
    assert meta.retrieve_parent_token is not None
    assert torch.equal(meta.retrieve_next_token, spec_info.retrieve_next_token)
    assert meta.query_start_loc.tolist() == [b * width for b in range(bs + 1)]
    # ... where 0.5.23 without the patch would verify the tree as one chain (the unpatched branch).
    as_chain = copy.copy(spec_info)
    as_chain.is_ddtree_tree = False
    assert backend_metadata(as_chain, bs, width).retrieve_parent_token is None

    for b in range(bs):
        layer = Layer(seed=100 * budget + b, bs=bs)
        x = layer.inputs(width)
        parents = tree_parents(spec_info, b, width)
        assert sum(p != -1 for p in parents) == min(width - 1, budget)  # every drafted node is reachable
        parent = meta.retrieve_parent_token[b:b + 1].clone()
        conv_out, windows = layer.conv(x.x, b, meta.retrieve_next_token[b:b + 1], meta.retrieve_next_sibling[b:b + 1],
                                       parent)
        # The conv kernel derived the parents the tree has.
        for node in range(1, width):
            if parents[node] != -1:
                assert int(parent[0, node]) == parents[node], (budget, node)
        out, states = layer.recurrent(x.q, x.k, x.v, x.a, x.g, b, parent)
        for node in range(width):
            if node and parents[node] == -1:
                continue  # the padding node (width == budget + 2): never reachable, never committed
            path = root_path(parents, node)
            chain_conv, chain_windows = layer.conv(x.x[:, path], b)
            assert torch.allclose(conv_out[:, node], chain_conv[:, -1], atol=1e-5), (budget, node)
            assert torch.equal(windows[node], chain_windows[-1]), (budget, node)
            chain_out, chain_states = layer.recurrent(x.q[:, path], x.k[:, path], x.v[:, path], x.a[path], x.g[path], b)
            assert torch.allclose(out[node], chain_out[-1], atol=1e-4), (budget, node)
            assert torch.allclose(states[node], chain_states[-1], atol=1e-4), (budget, node)


def test_the_committed_state_is_the_last_accepted_nodes(monkeypatch):
    """After the verify, run_eagle_verify commits per request the per-step conv window and SSM
    state at the tree step _verify_commit_step_indices names (on a GPU: its fused kernel). For
    an accepted branch that is not the first child (so its steps are not 0, 1, 2, ... in the
    flattened tree) that must be the step of the path's last node, whose states equal the chain's
    over the accepted tokens. The commit itself: the backend's state scatter (its CPU branch)."""
    from sglang.kernels.ops.mamba.mamba_state_scatter_triton import fused_commit_track_indices

    budget, bs = 32, 2
    spec_info, width = verify_input_from_the_worker(monkeypatch, budget, bs, seed=5)
    rng = random.Random(5)
    accept_rows, accept_lens, paths = [], [], []
    for b in range(bs):
        parents = tree_parents(spec_info, b, width)
        # accept the deepest path through a node that is not its parent's first child
        later = [n for n in range(1, width) if parents[n] != -1
                 and int(spec_info.retrieve_next_token[b, parents[n]]) != n]
        leafs = [n for n in range(1, width) if parents[n] != -1 and int(spec_info.retrieve_next_token[b, n]) == -1
                 and any(m in root_path(parents, n) for m in later)]
        assert leafs, "the tree has a branch"
        path = root_path(parents, rng.choice(leafs))
        paths.append(path)
        accept_rows.append([b * width + n for n in path] + [-1] * (spec_info.ddtree_max_depth - len(path)))
        accept_lens.append(len(path))
    accept_index, lens = torch.tensor(accept_rows), torch.tensor(accept_lens)
    seq_lens = torch.tensor([62, 100])  # request 0 crosses a 64-token radix track boundary
    batch = SimpleNamespace(mamba_track_indices=None, seq_lens=seq_lens)
    steps, track = _verify_commit_step_indices(batch=batch, accept_index=accept_index, accept_lens=lens,
                                               draft_token_num=width)
    assert track is None and steps.tolist() == [p[-1] for p in paths]
    # The CUDA path of the same choice (a Triton kernel, interpreted here), with radix tracking on.
    fused_steps, fused_track = fused_commit_track_indices(accept_index, lens, seq_lens, width, 64)
    assert fused_steps.tolist() == steps.tolist()
    assert fused_track.tolist() == [paths[0][64 - 62 - 1], -1]

    meta = backend_metadata(spec_info, bs, width)
    pool_ssm, pool_conv = torch.zeros((1, bs, HV, V, K)), torch.zeros((1, bs, CONV_DIM, CONV_WIDTH - 1))
    step_ssm, step_conv = torch.zeros((1, bs, width, HV, V, K)), torch.zeros((1, bs, width, CONV_DIM, CONV_WIDTH - 1))
    layers = [Layer(seed=900 + b, bs=bs) for b in range(bs)]
    inputs = [layer.inputs(width) for layer in layers]
    for b, (layer, x) in enumerate(zip(layers, inputs)):
        parent = meta.retrieve_parent_token[b:b + 1].clone()
        _out, step_conv[0, b] = layer.conv(x.x, b, meta.retrieve_next_token[b:b + 1],
                                           meta.retrieve_next_sibling[b:b + 1], parent)
        _out, step_ssm[0, b] = layer.recurrent(x.q, x.k, x.v, x.a, x.g, b, parent)
    slots = torch.arange(bs, dtype=torch.int32)
    HybridLinearAttnBackend._scatter_speculative_state_with_mask(pool_ssm, step_ssm, slots, steps)
    HybridLinearAttnBackend._scatter_speculative_state_with_mask(pool_conv, step_conv, slots, steps)
    for b, (layer, x) in enumerate(zip(layers, inputs)):
        path = paths[b]
        _out, chain_windows = layer.conv(x.x[:, path], b)
        _out, chain_states = layer.recurrent(x.q[:, path], x.k[:, path], x.v[:, path], x.a[path], x.g[path], b)
        assert torch.equal(pool_conv[0, b], chain_windows[-1])
        assert torch.allclose(pool_ssm[0, b], chain_states[-1], atol=1e-4)


def test_the_pool_keeps_dense_conv_windows_for_ddtree(mirror):
    """0.5.23 overlaps consecutive steps' conv windows in memory (a deduplicated sliding window)
    for a linear chain under topk 1; a tree's siblings need their own windows, so 0004 keeps the
    dense layout for DDTREE, as 0.5.23 does for EAGLE trees (topk > 1)."""
    from sglang.srt import runtime_context
    from sglang.srt.mem_cache import memory_pool

    on_cuda = dict(is_npu=False, is_cpu=False, speculative_eagle_topk=1, is_kda=False)
    runtime_context.publish(parse(mirror, "DFLASH"), role="scheduler")
    assert not memory_pool.ddtree_tree_verify()
    assert memory_pool.conv_window_dedup_enabled(**on_cuda, tree_verify=memory_pool.ddtree_tree_verify())
    runtime_context.publish(parse(mirror, "DDTREE"), role="scheduler")
    assert memory_pool.ddtree_tree_verify()
    assert not memory_pool.conv_window_dedup_enabled(**on_cuda, tree_verify=memory_pool.ddtree_tree_verify())
    assert not memory_pool.conv_window_dedup_enabled(**{**on_cuda, "speculative_eagle_topk": 4})


def test_a_tree_verified_as_a_chain_gets_branch_states_wrong(monkeypatch):
    """The negative control: without parents (0.5.23's topk-1 path, the unpatched backend), a node
    that is not its predecessor's child starts from the wrong state, so its output differs."""
    spec_info, width = verify_input_from_the_worker(monkeypatch, 32, 1, seed=11)
    parents = tree_parents(spec_info, 0, width)
    layer = Layer(seed=11, bs=1)
    x = layer.inputs(width)
    out, _states = layer.recurrent(x.q, x.k, x.v, x.a, x.g, 0, parent=None)
    branch = [n for n in range(1, width) if parents[n] not in (-1, n - 1)]
    assert branch, "the tree has a node whose parent is not the node before it"
    node = branch[0]
    path = root_path(parents, node)
    chain_out, _ = layer.recurrent(x.q[:, path], x.k[:, path], x.v[:, path], x.a[path], x.g[path], 0)
    assert not torch.allclose(out[node], chain_out[-1], atol=1e-3)


def start_up_self(backend, model_config, need_mamba: bool) -> SimpleNamespace:
    lm_head = SimpleNamespace(weight=torch.zeros((8, 4), dtype=torch.bfloat16))
    runner = SimpleNamespace(attn_backend=backend, model=SimpleNamespace(lm_head=lm_head), model_config=model_config)
    return SimpleNamespace(block_size=BLOCK, page_size=1, selector=None, lilicorr=None, _is_domino=False,
                           _need_mamba_verify_commit=need_mamba, target_worker=SimpleNamespace(model_runner=runner))


def hybrid_backend(full_attn_cls) -> HybridLinearAttnBackend:
    """The real classes, without their GPU set-up: the check reads only their types."""
    backend = object.__new__(HybridLinearAttnBackend)
    backend.full_attn_backend = object.__new__(full_attn_cls)
    return backend


def test_the_pinned_hybrid_target_passes_the_start_up_check(mirror):
    """The pinned target (the mirror's copy of its config.json) is a Gated-DeltaNet hybrid by sglang's
    own classification; 0004's start-up check takes it on the backend 0.5.23 gives it
    (HybridLinearAttnBackend) when the full-attention layers run on triton or flashinfer."""
    from sglang.srt.configs.hybrid_arch import hybrid_gdn_config
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend

    # fa3's class by its name: its module loads sgl_kernel's compiled ops, which need a GPU.
    FlashAttentionBackend = type("FlashAttentionBackend", (), {})  # noqa: N806

    config = ModelConfig.from_server_args(parse(mirror, "DDTREE"))
    assert hybrid_gdn_config(config) is not None
    for full in (TritonAttnBackend, FlashInferAttnBackend):
        worker.DDTreeWorkerV2._check_ddtree_support(start_up_self(hybrid_backend(full), config, True))
    with pytest.raises(ValueError) as refused:
        worker.DDTreeWorkerV2._check_ddtree_support(start_up_self(hybrid_backend(FlashAttentionBackend), config, True))
    assert str(refused.value) == ("DDTREE cannot run with target attention backend FlashAttentionBackend "
                                  "(needs --attention-backend flashinfer or triton).")
    # A hybrid whose linear layers are not GDN (here: a config sglang does not classify as GDN).
    other = SimpleNamespace(hf_config=SimpleNamespace(get_text_config=lambda: object()))
    with pytest.raises(ValueError, match="not Gated-DeltaNet"):
        worker.DDTreeWorkerV2._check_ddtree_support(start_up_self(hybrid_backend(TritonAttnBackend), other, True))
    # A dense target on triton passes as before.
    worker.DDTreeWorkerV2._check_ddtree_support(start_up_self(object.__new__(TritonAttnBackend), other, False))


def test_the_stand_in_refuses_the_backends_the_patched_worker_refuses():
    """The stand-in's spec_worker crash (lab physics) says what 0004's check raises, for the class
    0.5.23's attention registry creates for each --attention-backend it models."""
    import inspect

    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    from sglang_lab_standin import physics  # on sys.path by conftest.py

    assert set(physics.DDTREE_TREE_MASK_CLASSES) == set(worker.TREE_MASK_BACKENDS)
    for name, cls in physics.ATTENTION_BACKEND_CLASSES.items():
        assert "return %s(" % cls in inspect.getsource(ATTENTION_BACKENDS[name]), (name, cls)
        backend = type(cls, (), {})()  # the class by its name: several modules need sgl_kernel's compiled ops
        check = start_up_self(backend, None, False)
        if cls in physics.DDTREE_TREE_MASK_CLASSES:
            worker.DDTreeWorkerV2._check_ddtree_support(check)
            continue
        with pytest.raises(ValueError) as refused:
            worker.DDTreeWorkerV2._check_ddtree_support(check)
        assert "ValueError: " + str(refused.value) == physics.DDTREE_BACKEND_ERROR.format(cls=cls)
