"""The shared tier from Python (issue 33): two managers on one real redis-server, started on a
loopback port by the test and stopped after."""
import subprocess
from pathlib import Path

import pytest

import hybridkv as hk
from test_manager_api import small_manager_config


@pytest.fixture
def redis_port():
    """A redis-server on a loopback port the test picks, no persistence; stopped after."""
    if not Path("/usr/bin/redis-server").exists():
        pytest.skip("redis-server is not installed (scripts/deps.sh installs it)")
    import socket
    import time
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:  # the server is stopped whatever happens
        store = hk.open_redis_store(port=port)
        for _ in range(500):
            try:
                store.ping()
                break
            except hk.HybridKvError:
                time.sleep(0.01)
        yield port
    finally:
        proc.kill()
        proc.wait()


def test_shared_tier_a_second_manager_fetches_what_the_first_committed(redis_port):
    """Issue 33: two managers on one Redis; the second fetches the first one's blocks and its
    snapshot (the hybrid rule) before creating its cache, which then reuses them."""
    def manager():
        shared = hk.SharedTierConfig(store=hk.open_redis_store(port=redis_port),
                                     model_id="small-test")
        c = small_manager_config(shared=shared)
        c.tiers = [hk.TierConfig(kind=hk.TierKind.GPU, quota_bytes=8 << 20),
                   hk.TierConfig(kind=hk.TierKind.HOST, quota_bytes=8 << 20)]
        return hk.KvCacheManager.create(c)
    prompt = list(range(100, 180))
    a = manager()
    cache = a.create_kv_cache(prompt)
    cache.resume()
    cache.resize(64, 0)
    cache.resize(64, 64)
    cache.commit(prompt[:64])
    cache.close()
    a.flush_shared()
    assert a.shared_stats()["objects_published"] == 5  # 4 KV blocks and the snapshot at 64
    b = manager()
    f = b.fetch_shared(prompt)
    assert (f["local_tokens"], f["hit_tokens"], f["objects_fetched"]) == (0, 64, 5)
    assert b.create_kv_cache(prompt).reused_tokens == 64
    # The same fetch as a prefetch on the tier's thread: a future, then the same answer.
    c = manager()
    future = c.fetch_shared_async(prompt)
    f = future.result()
    assert future.done() and (f["hit_tokens"], f["objects_fetched"]) == (64, 5)
    assert future.result() == f
    assert c.create_kv_cache(prompt).reused_tokens == 64
    with pytest.raises(ValueError, match="shared.model_id"):
        hk.KvCacheManager.create(small_manager_config(
            shared=hk.SharedTierConfig(store=hk.open_redis_store(port=redis_port))))
    with pytest.raises(RuntimeError, match="no shared tier"):
        hk.KvCacheManager.create(small_manager_config()).fetch_shared(prompt)
    with pytest.raises(RuntimeError, match="no shared tier"):
        hk.KvCacheManager.create(small_manager_config()).fetch_shared_async(prompt).result()
