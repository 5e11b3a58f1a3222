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
import os as _os

from ._hybridkv import (  # noqa: F401  (the public names)
    AttentionLayerConfig,
    BackendKind,
    BatchShape,
    BlockHash,
    BufferConfig,
    CacheState,
    DisaggRole,
    DType,
    HybridCacheManager,
    HybridKvError,
    KvCache,
    KvCacheManager,
    ManagerConfig,
    ModelDescription,
    OutOfPagesError,
    PolicyConfig,
    SharedFetchFuture,
    SharedStore,
    SharedTierConfig,
    SnapshotRole,
    open_redis_store,
    RefusedError,
    ReplayLayout,
    RequestShape,
    ReusePolicy,
    ServingConfig,
    SnapshotPolicy,
    SsmLayerConfig,
    TierConfig,
    TierKind,
    plan_text,
)
from ._hybridkv import read_model_config as _read_model_config
from ._hybridkv import plan_json as _plan_json
from ._hybridkv import run_cli as _run_cli


def _finite(value):
    """JSON-safe: a non-finite float becomes the string JSON would need for it ("NaN",
    "Infinity", "-Infinity"), so a field the reader needs is refused naming it and the value,
    and one it never reads (HF writes ``Infinity`` for e.g. ``time_step_limit``) stays unread."""
    if isinstance(value, float) and (value != value or abs(value) == float("inf")):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def read_model_config(source, tp=1, kv_dtype=None, ssm_dtype=None, conv_dtype=None):
    """A model's cache layers as a ``ModelDescription``.

    ``source``: a HuggingFace ``config.json`` path, its parsed dict, or a ``transformers`` config
    object (its text config is read). Dtypes by name (``"bfloat16"``, ``"float32"``, ``"fp8"``...):
    ``kv_dtype`` for K/V pages, ``conv_dtype`` for conv windows, ``ssm_dtype`` for SSM states
    (default: the config's ``mamba_ssm_cache_dtype``, else fp32). Errors: ``ValueError`` naming
    the field and value.
    """
    if hasattr(source, "to_dict") and not isinstance(source, dict):
        text = source.get_text_config(decoder=True) if hasattr(source, "get_text_config") else source
        source = text.to_dict()
    if isinstance(source, dict):
        source = _finite(source)
    elif not isinstance(source, (str, _os.PathLike)):
        raise TypeError("read_model_config: source: expected a config.json path (str or "
                        "os.PathLike), its dict or a transformers config, got "
                        f"{type(source).__name__} {source!r:.60}")
    return _read_model_config(source, tp, kv_dtype, ssm_dtype, conv_dtype)


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
    "BatchShape",
    "BlockHash",
    "BufferConfig",
    "CacheState",
    "DisaggRole",
    "DType",
    "HybridCacheManager",
    "HybridKvError",
    "KvCache",
    "KvCacheManager",
    "ManagerConfig",
    "ModelDescription",
    "OutOfPagesError",
    "PolicyConfig",
    "RefusedError",
    "ReplayLayout",
    "RequestShape",
    "ReusePolicy",
    "ServingConfig",
    "SharedFetchFuture",
    "SharedStore",
    "SharedTierConfig",
    "SnapshotPolicy",
    "SnapshotRole",
    "SsmLayerConfig",
    "TierConfig",
    "TierKind",
    "main",
    "open_redis_store",
    "plan",
    "plan_text",
    "read_model_config",
]
