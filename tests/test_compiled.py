"""The compiled fast path against the eager engine: same tokens, same draws, no recompiles.

Compiling is the slow part: the module compiles one model, and its calls stay in one batch and
length bucket where they can (one graph). The eager reference is the session's ``toy_lm``.
Llama and the bridge are marked slow; they trace with ``aot_eager`` (their family's step and
the bridge's unwrapping, not inductor's code generation, which the GPT-2 model checks).
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import steerlab as sl
from steerlab.core.request import Request, Steer
from steerlab.engine.compiled.fit import model_reason
from steerlab.testing import save_tiny

PROMPTS = ["Once upon a time", "The sea was", "Hi"]


def _steers(d_model: int) -> list[sl.Steer]:
    torch.manual_seed(1)
    v = torch.randn(d_model)
    return [
        sl.Steer("blocks.1.hook_resid_pre", v, alpha=[0.0, 4.0], positions="generated"),
        sl.Steer("blocks.2.hook_attn_out", v, alpha=[-3.0, 2.0], positions=3, op=sl.Ablate()),
        sl.Steer("hook_embed", v, alpha=[0.5, 1.0], positions="all", op=sl.Clamp(2.0)),
        sl.Steer("blocks.0.hook_mlp_out", v, alpha=[0.0, 6.0], positions="prompt"),
    ]


@pytest.fixture(scope="module")
def pair(toy_lm) -> tuple[sl.SteerableModel, sl.SteerableModel]:
    """steerlab-tiny compiled by inductor, and the shared eager reference."""
    return sl.load("steerlab-tiny", backend="hf", compile=True), toy_lm


def _assert_same(fast: sl.SteerableModel, eager: sl.SteerableModel, steers: list[sl.Steer],
                 **kw: object) -> None:  # fmt: skip
    for steer in steers:
        assert fast.explain(PROMPTS, steer).startswith("compiled")
        got = fast.generate(PROMPTS, steer, max_new_tokens=24, stop_at_eos=False, **kw)
        want = eager.generate(PROMPTS, steer, max_new_tokens=24, stop_at_eos=False, **kw)
        assert got.tokens == want.tokens, steer
        assert fast.hook_count() == 0


def test_greedy_equals_eager(pair) -> None:
    fast, eager = pair
    _assert_same(fast, eager, _steers(fast.d_model))


def test_seeded_sampling_equals_eager_draw_for_draw(pair) -> None:
    fast, eager = pair
    _assert_same(fast, eager, _steers(fast.d_model), temperature=0.9, top_p=0.95, seed=7)


def test_logits_match_eager_closely(pair) -> None:
    fast, eager = pair
    steer = _steers(fast.d_model)[0]
    # All three prompts: six rows, the greedy test's bucket, so no second inductor build.
    got = fast.generate(PROMPTS, steer, max_new_tokens=16, stop_at_eos=False)
    want = eager.generate(PROMPTS, steer, max_new_tokens=16, stop_at_eos=False)
    assert len(got.logprobs) == len(want.logprobs) == 6
    diff = max(abs(a - b) for g, w in zip(got.logprobs, want.logprobs) for a, b in zip(g, w))
    assert diff < 1e-4


def test_no_recompile_for_alpha_prompt_vector_positions_or_batch_in_bucket(pair) -> None:
    """Within one spec (the slots a batch steers, the terms its ops use) every call reuses
    the bucket's graph: alphas, prompts, vectors, position rules and batch sizes are data."""
    fast, _ = pair
    v = torch.randn(fast.d_model)
    fast.generate(PROMPTS, sl.Steer("blocks.1.hook_resid_pre", v, alpha=[0.0, 1.0]),
                  max_new_tokens=20)  # fmt: skip  # 6 rows: batch bucket 8
    graphs = counters["stats"]["unique_graphs"]
    calls = [
        (PROMPTS, sl.Steer("blocks.1.hook_resid_pre", v, alpha=[0.0, 9.0])),
        (PROMPTS[:2] + ["A much longer prompt than before"],
         sl.Steer("blocks.1.hook_resid_pre", -v, alpha=[1.0, 2.0], positions=2)),
        (PROMPTS[:1], sl.Steer("blocks.1.hook_resid_pre", 2 * v, alpha=[1.0] * 7,
                               positions="generated")),
    ]  # fmt: skip
    for prompts, steer in calls:
        fast.generate(prompts, steer, max_new_tokens=20)
    assert counters["stats"]["unique_graphs"] == graphs
    assert fast.engine.compiled.compile_times()  # the first step of each bucket, timed


def test_one_graph_per_spec_computing_only_the_terms_it_uses(pair) -> None:
    """A new set of steered slots or operation terms is one new graph, cached: the second
    call of each spec compiles nothing; a batch of additions computes only additions."""
    from steerlab.engine.compiled.step import Spec
    from steerlab.engine.compiled.tables import slot_of

    fast, _ = pair
    v = torch.randn(fast.d_model)
    specs = [
        sl.Steer("blocks.3.hook_resid_post", v, alpha=[1.0, 2.0]),
        sl.Steer("hook_embed", v, alpha=[2.0, -2.0], op=sl.Ablate()),
        sl.Steer("blocks.0.hook_resid_mid", v, alpha=[1.0, 3.0], op=sl.Clamp(1.0)),
    ]
    for steer in specs:
        fast.generate(PROMPTS, steer, max_new_tokens=4)
        graphs = counters["stats"]["unique_graphs"]
        fast.generate(PROMPTS[::-1], steer, max_new_tokens=6)
        assert counters["stats"]["unique_graphs"] == graphs
    fast.generate(PROMPTS, specs[0], max_new_tokens=4)
    want = Spec((slot_of(3, "hook_resid_post"),), ("add",))  # no proj, feat or rot terms
    assert want in {r.spec for r in fast.engine.compiled._runners.values()}


def test_stream_closed_early_takes_hooks_off_and_frees_the_model(pair) -> None:
    fast, _ = pair
    steer = _steers(fast.d_model)[0]
    steps = fast.stream(PROMPTS, steer, max_new_tokens=10)
    next(steps), next(steps)
    steps.close()
    assert fast.hook_count() == 0
    # The model is free again: a fresh call, in the bucket the stream used (no new graph).
    again = fast.generate(PROMPTS, steer, max_new_tokens=3, stop_at_eos=False).tokens
    assert [len(row) for row in again] == [3] * 6


def test_fallbacks_say_why(pair) -> None:
    fast, eager = pair
    v = torch.randn(fast.d_model)
    steer = sl.Steer("blocks.1.hook_resid_pre", v)
    assert fast.explain("Hi", steer, capture=["blocks.0.hook_resid_post"]).startswith("eager: capt")
    assert "keep_cache" in fast.explain("Hi", steer, keep_cache=True)
    twice = [steer, sl.Steer("blocks.1.hook_resid_pre", -v)]
    assert "two steers at one site" in fast.explain("Hi", twice)
    custom = Steer("blocks.1.hook_resid_pre", v, 1.0, "all", lambda a, d, al: a)
    assert "custom operation" in fast.explain(Request((0, 5, 6), (custom,)))
    assert "'hooked' backend" in (model_reason("hooked", None, 10, None) or "")
    assert eager.explain("Hi").startswith("eager: the model is not compiled")
    # A fallback still runs, and equals the eager engine.
    got = fast.generate("Hi", steer, max_new_tokens=8, keep_cache=True)
    assert got.tokens == eager.generate("Hi", steer, max_new_tokens=8).tokens


def _family_pair(name: str, backend: str) -> tuple[sl.SteerableModel, sl.SteerableModel]:
    """A model traced by ``aot_eager`` (its family's step, not inductor's code), and eager."""
    fast = sl.load(name, backend=backend).compile(backend="aot_eager")
    return fast, sl.load(name, backend=backend)


@pytest.mark.slow
def test_tiny_llama_equals_eager(tmp_path) -> None:
    folder = save_tiny(tmp_path / "llama", "llama", n_layers=3)
    fast, eager = _family_pair(str(folder), "hf")
    _assert_same(fast, eager, _steers(fast.d_model)[:3])
    _assert_same(fast, eager, _steers(fast.d_model)[:1], temperature=0.8, seed=3)


@pytest.mark.slow
def test_bridge_equals_eager() -> None:
    fast, eager = _family_pair("steerlab-tiny", "bridge")
    _assert_same(fast, eager, _steers(fast.d_model))
    _assert_same(fast, eager, _steers(fast.d_model)[:2], temperature=0.8, seed=3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graphs_equal_eager() -> None:
    fast = sl.load("steerlab-tiny", backend="hf", device="cuda", compile=True)
    eager = sl.load("steerlab-tiny", backend="hf", device="cuda")
    assert fast.engine.compiled.mode == "reduce-overhead"
    _assert_same(fast, eager, _steers(fast.d_model))
    _assert_same(fast, eager, _steers(fast.d_model), temperature=0.9, seed=5)


def test_a_wide_vocabulary_head_is_the_same_product_in_another_order() -> None:
    """On a CPU with a vocabulary of 8192 or more and several rows, the compiled step's LM
    head multiplies with the weight on the left (``unembed``, faster there): the same logits
    within float rounding; one row, more than 64 rows, or a narrow head keep the module's own
    product."""
    from steerlab.backends.head import wide
    from steerlab.engine.compiled.families import unembed

    torch.manual_seed(0)
    head = torch.nn.Linear(64, 9000, bias=False)
    for rows in (1, 2, 8):
        x = torch.randn(rows, 1, 64)
        got = unembed(head, x)
        assert got.shape == (rows, 1, 9000)
        torch.testing.assert_close(got, head(x), rtol=1e-5, atol=1e-5)
        assert got.is_contiguous() and wide(head, rows) == (rows > 1)
    many = torch.randn(65, 1, 64)  # past WIDE_ROWS: the module itself
    assert torch.equal(unembed(head, many), head(many))
    narrow = torch.nn.Linear(64, 678, bias=True)
    x = torch.randn(4, 1, 64)
    assert torch.equal(unembed(narrow, x), narrow(x))


@pytest.mark.slow
def test_a_wide_vocabulary_model_compiled_equals_eager_and_hf_generate() -> None:
    """A GPT-2 with 9000 logits, so the compiled step's head takes ``unembed``'s wide path
    (six rows): the same tokens as the eager engine and HF ``generate``, logprobs within 1e-4."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from steerlab.testing import char_tokenizer

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=9000, n_positions=128,
                        bos_token_id=0, eos_token_id=1, pad_token_id=2)  # fmt: skip
    model = GPT2LMHeadModel(config).eval()
    fast, eager = sl.wrap(model, char_tokenizer()).compile(), sl.wrap(model, char_tokenizer())
    steer = sl.Steer("blocks.1.hook_resid_pre", torch.randn(64), alpha=[0.0, 4.0],
                     positions="generated")  # fmt: skip
    assert fast.explain(PROMPTS, steer).startswith("compiled")
    got = fast.generate(PROMPTS, steer, max_new_tokens=16, stop_at_eos=False)
    want = eager.generate(PROMPTS, steer, max_new_tokens=16, stop_at_eos=False)
    assert got.tokens == want.tokens
    diff = max(abs(a - b) for g, w in zip(got.logprobs, want.logprobs) for a, b in zip(g, w))
    assert diff < 1e-4
    same = [PROMPTS[0]] * 2  # unsteered rows against HF's own loop, two rows in one batch
    ids = torch.tensor([fast.tokenizer(PROMPTS[0])["input_ids"]] * 2)
    with torch.inference_mode():
        hf = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16,
                            min_new_tokens=16, do_sample=False, pad_token_id=2)  # fmt: skip
    ours = fast.generate(same, max_new_tokens=16, stop_at_eos=False)
    assert fast.explain(same).startswith("compiled")
    assert ours.tokens == hf[:, ids.shape[1] :].tolist()
