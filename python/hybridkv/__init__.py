"""hybridkv: the cache memory manager for hybrid LLMs (attention + Mamba2 / GDN / KDA layers).

Plan the pools of a model from its HuggingFace ``config.json``, run requests through a
``HybridCacheManager`` (prefix reuse with recurrent-state snapshots, suspend and resume), and
hand kernels the per-step indices::

    import hybridkv as hk
    model = hk.read_model_config("config.json")
    serving = hk.ServingConfig(max_batch=8, tiers=[hk.TierConfig(kind=hk.TierKind.GPU,
                                                                 quota_bytes=8 << 30)])
    print(hk.plan_text(model, serving))

Errors: ``ValueError`` for bad configurations and arguments, ``KeyError`` for unknown requests,
``OutOfPagesError`` when a pool group has no room (a scheduler catches it and preempts),
``RefusedError`` when a bound refuses (the resume gate), ``HybridKvError`` for the rest; every
message is the library's.
"""

import json as _json

from ._hybridkv import (  # noqa: F401  (the public names)
    AttentionLayerConfig,
    BackendKind,
    BufferConfig,
    CacheState,
    DType,
    HybridCacheManager,
    HybridKvError,
    KvCache,
    KvCacheManager,
    ManagerConfig,
    ModelDescription,
    OutOfPagesError,
    RefusedError,
    ReplayLayout,
    ReusePolicy,
    ServingConfig,
    SnapshotPolicy,
    SsmLayerConfig,
    TierConfig,
    TierKind,
    plan_text,
    read_model_config,
)
from ._hybridkv import plan_json as _plan_json
from ._hybridkv import run_cli as _run_cli


def plan(model, serving):
    """The storage plan as ``hybridkv plan --json`` reports it, as a dict."""
    return _json.loads(_plan_json(model, serving))


def main(argv=None):
    """Runs the command line (``python -m hybridkv plan|sim ...``); returns the exit code."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    return _run_cli(["hybridkv", *args])


__all__ = [
    "AttentionLayerConfig",
    "BackendKind",
    "BufferConfig",
    "CacheState",
    "DType",
    "HybridCacheManager",
    "HybridKvError",
    "KvCache",
    "KvCacheManager",
    "ManagerConfig",
    "ModelDescription",
    "OutOfPagesError",
    "RefusedError",
    "ReplayLayout",
    "ReusePolicy",
    "ServingConfig",
    "SnapshotPolicy",
    "SsmLayerConfig",
    "TierConfig",
    "TierKind",
    "main",
    "plan",
    "plan_text",
    "read_model_config",
]
