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
    "kimi_linear": "KDA + MLA attention: the plan reads Kimi-Linear's checkpoints, but "
                   "transformers' default config has no linear_attn_config and hybridkv.hf "
                   "has no KDA state views yet",
    "minimax": f"lightning (linear) attention + attention; {_UNKNOWN}",
    "olmo_hybrid": f"gated delta net + attention; {_UNKNOWN}",
    "qwen3_5": "multimodal wrapper of qwen3_5_text (run by test_hf.py): the model reader plans "
               "it from its text_config; the vision tower holds no cache",
    "qwen3_5_moe": "multimodal wrapper of qwen3_5_moe_text (run by test_hf.py): the model reader "
                   "plans it from its text_config; the vision tower holds no cache",
    "qwen4_exp": f"gated delta net + attention (multimodal wrapper); {_UNKNOWN}",
    "qwen4_exp_text": f"gated delta net + attention; {_UNKNOWN}",
    "zamba": f"Mamba1 + shared attention blocks; {_UNKNOWN}",
    "inkling_text": f"short convolutions + hybrid sliding-window layers; {_UNKNOWN}",
    # --- sliding-window attention ---
    "afmoe": _SWA, "cohere2_moe": _SWA, "cohere_compass_text": _SWA,
    "cwm": _SWA, "deepseek_v4": _SWA, "dots1": _SWA, "exaone_moe": _SWA,
    "gemma3n": _SWA, "gemma3n_text": _SWA, "gemma4": _SWA, "gemma4_text": _SWA,
    "gemma4_unified": _SWA, "gemma4_unified_text": _SWA,
    "granitemoe_swa": _SWA, "laguna": _SWA, "mellum": _SWA, "mimo_v2_flash": _SWA,
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
