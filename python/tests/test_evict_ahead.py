"""Eviction ahead of a step (issue 35, the worst step): while the GPU computes a step, the engine
frees the GPU room the next step will allocate, so that step's allocations find it free."""

from pathlib import Path

import pytest

import hybridkv as hk
from test_manager_api import small_manager_config  # one recurrent and one attention layer

ROOT = Path(__file__).resolve().parents[2]
NEMOTRON = str(ROOT / "models" / "nemotron_h_8b.json")


def gpu_slots(stats, pool_group):
    (row,) = [s for s in stats if s["tier"] == hk.TierKind.GPU and s["pool_group"] == pool_group]
    return row


def filled_manager(upkeep_between_steps=False):
    """A Nemotron-H manager (host backend, GPU 1 GiB + host 2 GiB) with prompts computed and
    freed until the GPU's KV pool is nearly full: (manager, its attention pool group, prompts)."""
    tiers = [hk.TierConfig(kind=hk.TierKind.GPU, quota_bytes=1 << 30),
             hk.TierConfig(kind=hk.TierKind.HOST, quota_bytes=2 << 30)]
    policies = hk.PolicyConfig(upkeep_between_steps=upkeep_between_steps)
    serving = hk.ServingConfig(max_batch=4, tiers=tiers, policies=policies)
    h = hk.HybridCacheManager(hk.read_model_config(NEMOTRON, tp=8), serving, hk.BackendKind.HOST)
    attention = max(s["pool_group"] for s in h.storage_stats()
                    if s["tier"] == hk.TierKind.GPU and s["total_slots"] > 1000)
    prompts = []
    for i in range(100):
        if gpu_slots(h.storage_stats(), attention)["free_slots"] < 64:
            break
        prompts.append([10_000 * (i + 1) + t for t in range(2048)])
        h.add_request(i, prompts[-1])
        h.resume(i)
        h.resize(i, 2048, 2048)
        h.commit_at_snapshot(i)
        h.free_request(i)
    return h, attention, prompts


@pytest.mark.parametrize("upkeep_between_steps", [False, True])
def test_the_hybrid_manager_frees_a_steps_attention_pages_and_the_prompt_is_still_reused(
        upkeep_between_steps):
    # Between steps or not, the tree's upkeep after snapshot drops leaves the same reuse here.
    h, attention, prompts = filled_manager(upkeep_between_steps)
    before = gpu_slots(h.storage_stats(), attention)
    assert before["free_slots"] < 64 and before["evictable_slots"] > 0
    evicted = h.evict_ahead(4096)
    after = gpu_slots(h.storage_stats(), attention)
    assert evicted > 0
    assert after["free_slots"] == before["free_slots"] + evicted
    assert after["free_slots"] <= max(4096 // 16 * 2, after["total_slots"] // 8)
    assert h.evict_ahead(4096) == 0  # the room is there: nothing more goes
    h.add_request(500, prompts[0] + [1] * 100)  # the oldest prompt, moved to the host tier
    assert h.request(500)["reused_tokens"] > 0
    h.resume(500)


def test_a_kv_cache_manager_names_a_wrong_list_of_pool_groups():
    m = hk.KvCacheManager.create(small_manager_config())
    groups = len(m.storage_stats()) // len({s["tier"] for s in m.storage_stats()})
    assert m.evict_ahead([0] * groups, 10) == 0  # nothing asked, nothing evicted
    with pytest.raises(ValueError, match=f"free_slots has {groups + 1} entries"):
        m.evict_ahead([5] * (groups + 1), 10)


def test_a_touched_prompt_stays_on_the_gpu_while_the_others_go():
    """touch_reuse (issue 35, reuse): the prompt a queued request will reuse moves to the back of
    the eviction order, so evicting ahead takes the other prompts first."""
    runs = {}
    for touch in (False, True):
        h, _, prompts = filled_manager()
        turn = prompts[0] + [1] * 100  # the oldest prompt's next turn: LRU's first victim
        if touch:
            assert h.touch_reuse(turn) > 0  # what it would reuse; nothing taken
        assert h.evict_ahead(4096) > 0
        h.take_iteration_stats()
        h.add_request(500, turn)
        assert h.request(500)["reused_tokens"] > 0
        h.resume(500)  # brings up whatever went down a tier
        runs[touch] = h.take_iteration_stats()["bytes_onboarded"]
    assert runs[False] > 0  # untouched, its KV went to the host and came back
    assert runs[True] < runs[False], runs
