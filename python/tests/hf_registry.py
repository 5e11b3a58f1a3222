"""Issue 30: every causal-LM family transformers ships whose layers hold recurrent or
linear-attention state, short convolutions or sliding windows, and what hybridkv does with it.
A family is either run token for token through hybridkv.hf by test_hf.py (hf_models.FAMILIES)
or listed here, in EXCLUDED, with the reason. test_hf_registry.py walks transformers' own
registry: a new transformers version that adds such a family fails it until the family is
handled or listed.

The reasons are what was measured with transformers 5.17 (each default config read by
read_model_config): most are refused by the C++ model reader as an unknown model_type.
"""

from __future__ import annotations

# Marks of the layers that matter, in a config's own fields.
_MARKS = ("mamba", "ssm", "conv", "linear", "sliding", "gdn", "kda", "delta")

_UNKNOWN = "model_type unknown to the model reader (src/hybrid/families.cc)"
_SWA = f"sliding-window attention layers; {_UNKNOWN}"

EXCLUDED = {
    # --- recurrent, linear-attention or short-convolution layers ---
    "bamba": "Mamba2 + attention: planned and run through hybridkv.hf, whose logits equal the "
             "model's own cache fed the same chunks (test_hf.py, STRICT_ONLY; fp32 prefill within "
             "1e-6), but transformers' own chunked prefill differs from one forward by 0.0034, "
             "so generate() is not matched token for token",
    "mamba": "pure Mamba1: planned and run through hybridkv.hf, whose logits equal the model's "
             "own cache fed the same chunks (test_hf.py, STRICT_ONLY); but transformers' own "
             "chunked prefill is not exact (0.052 from one forward), so generate() is not "
             "matched token for token",
    "falcon_mamba": "pure Mamba1 with normed B/C/dt: as mamba (its own chunked prefill differs "
                    "from one forward by 0.57)",
    "minimax": f"lightning (linear) attention + attention; {_UNKNOWN}",
    "qwen3_5": "multimodal wrapper of qwen3_5_text (run by test_hf.py): the model reader plans "
               "it from its text_config; the vision tower holds no cache",
    "qwen3_5_moe": "multimodal wrapper of qwen3_5_moe_text (run by test_hf.py): the model reader "
                   "plans it from its text_config; the vision tower holds no cache",
    "qwen4_exp": "multimodal wrapper of qwen4_exp_text (excluded below)",
    "qwen4_exp_text": "gated delta net + qwen_sparse_attention layers (sparse attention with an "
                      f"indexer): no such attention mixer; {_UNKNOWN}",
    "zamba": f"Mamba1 + shared attention blocks; {_UNKNOWN}",
    "inkling_text": f"short convolutions + hybrid sliding-window layers; {_UNKNOWN}",
    # --- sliding-window attention ---
    "cohere_compass_text": "full attention only (its sliding_window field is unused); "
                           "transformers 5.17 builds no model from its config (empty "
                           "rope_parameters: KeyError 'full_attention'; with them, its 3-D "
                           "rotary fails), so nothing can be run; the reader plans it "
                           "(full attention)",
    "deepseek_v4": "compressed sparse attention layers (compressed_sparse_attention, "
                   f"heavily_compressed_attention) with an indexer: no such mixer; {_UNKNOWN}",
    "gemma3n": "multimodal wrapper of gemma3n_text (excluded below)",
    "gemma3n_text": "the last num_kv_shared_layers (15) layers read earlier layers' K/V; the "
                    f"plan keeps one cache per attention layer; {_UNKNOWN}",
    "gemma4": "multimodal wrapper of gemma4_text (excluded below)",
    "gemma4_text": "full-attention layers take another head_dim through per-layer overrides "
                   "(global_head_dim 512 against head_dim 256) that the reader does not read; "
                   f"{_UNKNOWN}",
    "gemma4_unified": "multimodal wrapper of gemma4_unified_text (excluded below)",
    "gemma4_unified_text": "as gemma4_text (per-layer head_dim overrides); " + _UNKNOWN,
    "mimo_v2_flash": "sliding-window attention whose keys and values have different head "
                     f"dims (192 / 128); {_UNKNOWN}",
    "modernbert-decoder": _SWA,
    "moshi": f"audio-text model with a sliding-window depth decoder; {_UNKNOWN}",
    "gemma3": "multimodal wrapper of gemma3_text (run by test_hf.py): the model reader plans it "
              "from its text_config; the vision tower holds no cache",
    # --- not text LMs whose default config can be built ---
    "musicgen": "audio decoder; transformers' default config cannot be built "
                "(StrictDataclassFieldValidationError)",
    "musicgen_melody": "audio decoder; transformers' default config cannot be built "
                       "(StrictDataclassFieldValidationError)",
}


def marked_families() -> dict[str, list[str]]:
    """Causal-LM model types of transformers' registry whose default config marks recurrent,
    linear-attention, convolution or sliding-window layers: {model_type: the marks}. A config
    that cannot be built counts (it cannot be shown not to have them)."""
    import warnings

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    warnings.filterwarnings("ignore")
    out = {}
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        try:
            config = CONFIG_MAPPING[model_type]()
        except Exception as e:  # noqa: BLE001  (any failure to build it)
            out[model_type] = [f"config error {type(e).__name__}"]
            continue
        try:
            config = config.get_text_config(decoder=True)
        except Exception:  # noqa: BLE001
            pass
        fields = config.to_dict()
        marks = set()
        for key, value in fields.items():
            if isinstance(value, (list, tuple)) and value and isinstance(value[0], str):
                marks |= {f"{key}:{v}" for v in set(value)
                          if any(m in v.lower() for m in _MARKS)}
            lowered = key.lower()
            if lowered == "sliding_window" and value and fields.get("use_sliding_window", True):
                marks.add(f"sliding_window={value}")
            if any(m in lowered for m in ("mamba", "ssm_state", "conv_kernel", "linear_conv",
                                          "conv_l_cache", "hybrid_override")) \
                    and value not in (None, False):
                marks.add(key)
        if marks:
            out[model_type] = sorted(marks)
    return out
