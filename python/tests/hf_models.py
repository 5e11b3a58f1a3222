"""Small random-weight HuggingFace hybrid models and their own-cache reference generations
(test support for test_hf.py and the snapshot-precision benchmark)."""

from __future__ import annotations

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

transformers.logging.set_verbosity_error()

VOCAB = 128
_ATTN = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16)
_BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, **_ATTN)

# Per family: the model_type and a small config (each forward takes milliseconds on a CPU).
FAMILIES = {
    "qwen3_next": dict(  # gated delta net + full attention, MoE
        _BASE, num_hidden_layers=4, full_attention_interval=2, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32),
    "nemotron_h": dict(  # Mamba2 + attention + MLP layers
        _BASE, num_hidden_layers=4, hybrid_override_pattern="M*M-", mamba_num_heads=4,
        mamba_head_dim=16, ssm_state_size=16, n_groups=2, conv_kernel=4, chunk_size=16),
    "falcon_h1": dict(  # Mamba2 and attention in parallel in every layer
        _BASE, num_hidden_layers=3, mamba_n_heads=4, mamba_d_head=16, mamba_d_state=16,
        mamba_n_groups=2, mamba_d_conv=4, mamba_chunk_size=16, mamba_d_ssm=64),
    "jamba": dict(  # Mamba1 + attention, MoE
        _BASE, num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1,
        expert_layer_period=2, expert_layer_offset=1, num_experts=2, mamba_d_state=8,
        mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=8),
    "granitemoehybrid": dict(  # Granite-4.0-H: Mamba2 + attention, MoE
        _BASE, num_hidden_layers=4, layer_types=["mamba", "attention", "mamba", "attention"],
        mamba_n_heads=8, mamba_d_head=16, mamba_expand=2, mamba_d_state=16, mamba_n_groups=2,
        mamba_d_conv=4, mamba_chunk_size=16, num_local_experts=2, num_experts_per_tok=1,
        shared_intermediate_size=64),
    "mamba2": dict(  # pure Mamba2 (Mamba-Codestral, mamba2-2.7b): its forward takes cache_params
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_heads=8, head_dim=16,
        expand=2, state_size=16, n_groups=2, conv_kernel=4, chunk_size=16),
    "qwen3_5_text": dict(  # Qwen3.5: gated delta net + full attention
        _BASE, num_hidden_layers=4, layer_types=["linear_attention", "full_attention"] * 2,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4),
    "qwen3_5_moe_text": dict(  # Qwen3.5 MoE: gated delta net + full attention, MoE
        _BASE, num_hidden_layers=4, layer_types=["linear_attention", "full_attention"] * 2,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=32),
    "zamba2": dict(  # Mamba2 in every layer, a shared attention block in the hybrid ones
        vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=4,
        layers_block_type=["mamba", "hybrid", "mamba", "hybrid"], mamba_d_state=16,
        mamba_d_conv=4, mamba_expand=2, mamba_ngroups=2, n_mamba_heads=8, num_attention_heads=4,
        num_key_value_heads=4, attention_head_dim=32, num_mem_blocks=1, chunk_size=16),
    "lfm2": dict(  # LFM2: gated short convolutions (conv state only) + full attention
        _BASE, num_hidden_layers=4, layer_types=["conv", "full_attention"] * 2, conv_L_cache=3),
    "lfm2_moe": dict(  # LFM2-MoE: as LFM2, MoE feed-forward
        _BASE, num_hidden_layers=4, layer_types=["conv", "full_attention"] * 2, conv_L_cache=3,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, num_dense_layers=1),
    "olmo_hybrid": dict(  # OLMo-Hybrid: gated delta net (Qwen3-Next's fields) + attention
        _BASE, num_hidden_layers=4, layer_types=["linear_attention", "full_attention"] * 2,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4, pad_token_id=0, bos_token_id=1,
        eos_token_id=2),
    "kimi_linear": dict(  # Kimi-Linear: KDA (conv q/k/v windows + fp32 state) + MLA latents, MoE
        vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=16, linear_num_heads=2, linear_head_dim=16,
        linear_conv_kernel_dim=4, layer_types=["linear_attention", "full_attention"] * 2,
        num_experts=4, num_experts_per_token=2, moe_intermediate_size=32, pad_token_id=0,
        bos_token_id=1, eos_token_id=2),
    "gemma3_text": dict(  # sliding-window (8 tokens) and full attention
        _BASE, num_hidden_layers=4, sliding_window=8, sliding_window_pattern=2),
    "gpt_oss": dict(  # sliding-window (8 tokens) and full attention with sinks, MoE
        _BASE, num_hidden_layers=4, sliding_window=8, num_local_experts=4, num_experts_per_tok=2,
        layer_types=["sliding_attention", "full_attention"] * 2),
}
# Attention-only families with sliding-window layers (8 tokens), run like the others.
_SWA = dict(_BASE, num_hidden_layers=4, sliding_window=8,
            layer_types=["sliding_attention", "full_attention"] * 2)
_MOE = dict(num_experts_per_tok=2, moe_intermediate_size=32)
_FULL = dict(layer_types=["full_attention"] * 4)  # a sliding_window field no layer uses
FAMILIES.update({
    "gemma2": _SWA, "cohere2": _SWA, "exaone4": _SWA, "olmo3": _SWA, "granite_swa": _SWA,
    "ministral": _SWA, "vaultgemma": _SWA, "cwm": _SWA,
    "mistral": dict(_BASE, num_hidden_layers=2, sliding_window=32),  # every layer sliding
    "afmoe": dict(_SWA, **_MOE, num_experts=4, num_dense_layers=1, global_attn_every_n_layers=2),
    "cohere2_moe": dict(_SWA, **_MOE, num_experts=4),
    "exaone_moe": dict(_SWA, **_MOE, num_experts=4),
    "granitemoe_swa": dict(_SWA, num_local_experts=4, num_experts_per_tok=2),
    "dots1": dict(_SWA, **_MOE, **_FULL, n_routed_experts=4, n_shared_experts=1,
                  first_k_dense_replace=1),
    "laguna": dict(_SWA, **_MOE, **_FULL, num_experts=4, shared_expert_intermediate_size=32),
    "mellum": dict(_SWA, **_FULL, num_local_experts=4, num_experts_per_tok=2),
})
# The attention-only families past Gemma 3 and GPT-OSS go through the same PagedAttention with
# a window: CI runs them one request and against their own cache (fp32, bf16); the other
# scenarios run for them in bench/hf_report.py (on the H200 too).
EXTRA_WINDOW = ["gemma2", "cohere2", "exaone4", "olmo3", "granite_swa", "ministral",
                "vaultgemma", "mistral", "cwm", "afmoe", "cohere2_moe", "exaone_moe",
                "granitemoe_swa", "dots1", "laguna", "mellum"]
WINDOW_ONLY = ["gemma3_text", "gpt_oss"] + EXTRA_WINDOW
SCENARIOS = [f for f in FAMILIES if f not in EXTRA_WINDOW]
# Families whose suspended request kept its pages on the GPU in test_suspend_to_host_and_resume
# (measured: nothing onboarded at resume); the scenario still runs and must match generate().
PAGES_STAY_ON_SUSPEND = {"lfm2", "lfm2_moe"}
# Families whose own chunked prefill is not exact in transformers 5.17 (the model with its own
# cache fed the prompt in chunks differs from one forward of it: Mamba1 by 0.052, Falcon-Mamba by
# 0.57, Bamba by 0.0034, measured): generate() cannot be matched token for token through any chunked cache, so
# only the stricter reference runs them (test_hf.py: the same chunks through the model's own
# cache). hf_registry.EXCLUDED says the same.
STRICT_ONLY = {
    "mamba": dict(  # pure Mamba1 (state-spaces/mamba): its forward takes cache_params
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, state_size=8, expand=2,
        conv_kernel=4, time_step_rank=8),
    "bamba": dict(  # Mamba2 + attention at attn_layer_indices (own chunked prefill: 0.0034)
        _BASE, num_hidden_layers=4, attn_layer_indices=[1, 3], mamba_n_heads=8, mamba_d_head=16,
        mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16),
    "falcon_mamba": dict(  # pure Mamba1 with RMS-normed B, C and dt (Falcon-Mamba-7B)
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, state_size=8, expand=2,
        conv_kernel=4, time_step_rank=8),
}
RECURRENT = [f for f in FAMILIES if f not in WINDOW_ONLY]
ATTENTION = [f for f in SCENARIOS if f != "mamba2"]


def make_model(family: str, device="cpu", dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    config = AutoConfig.for_model(family, **{**FAMILIES, **STRICT_ONLY}[family])
    return AutoModelForCausalLM.from_config(config).to(device=device, dtype=dtype).eval()


def prompt(length: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (length,), generator=g).tolist()


@torch.no_grad()
def reference(model, tokens, new_tokens: int):
    """Greedy generation with the model's own cache (transformers' generate and DynamicCache):
    the new tokens and the logits that chose each [new_tokens, vocab]."""
    device = next(model.parameters()).device
    ids = torch.tensor([tokens], device=device)
    # An explicit mask: without it generate treats pad_token_id (0) in the prompt as padding.
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False, output_logits=True,
                         return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)
    return out.sequences[0, len(tokens):].tolist(), torch.stack([l[0] for l in out.logits]).float()


def _own_forward(model, cache, tokens):
    from hybridkv.hf import PagedModel

    device = next(model.parameters()).device
    ids = torch.tensor([list(tokens)], device=device)
    out = model(input_ids=ids, use_cache=True, **{PagedModel._cache_keyword(model): cache})
    return out.logits[0].float()


@torch.no_grad()
def own_cache_chunks(model, chunks):
    """The model with its own cache (DynamicCache) fed exactly these chunks, one forward each:
    the logits of every chunk's tokens, concatenated [tokens, vocab]. The stricter reference:
    same kernels, same inputs as a paged run that computes the same chunks."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    return torch.cat([_own_forward(model, cache, chunk) for chunk in chunks])


class ForwardLog:
    """Every forward a PagedModel runs, per request: (position, tokens, advance, logits). The
    record from which own_cache_replay rebuilds the same computation with the model's own
    cache."""

    def __init__(self, pm):
        self.events: dict[int, list] = {}
        real = pm.forward

        def forward(request_id, tokens, advance=True):
            position = pm.requests[request_id]["position"]
            logits = real(request_id, tokens, advance)
            self.events.setdefault(request_id, []).append(
                (position, [int(t) for t in tokens], advance, logits))
            return logits

        pm.forward = forward  # prefill, decode and verify call it through the instance


@torch.no_grad()
def own_cache_replay(model, log: ForwardLog, request_id: int, prefix_of: int | None = None):
    """The largest logit difference between every forward the paged model ran for the request
    and the same forward through the model's own cache, fed the same chunks in the same order.
    A forward that did not advance (a verify step with a rejected draft) runs on a copy of the
    cache. A request that reused a prefix starts from request `prefix_of`'s chunks up to its
    first position (cropped there: attention only; recurrent reuse starts on a chunk end)."""
    import copy

    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    events = log.events[request_id]
    start = events[0][0]
    if start:
        fed = 0
        for (position, tokens, _, _), kept in zip(log.events[prefix_of],
                                                   _kept(log.events[prefix_of])):
            if not kept or fed >= start:
                continue
            assert position == fed, (position, fed)
            if fed + len(tokens) > start:  # the chunk that holds the reused point: crop it back
                cache.activate_past_recording()
            _own_forward(model, cache, tokens)
            fed += len(tokens)
        if fed > start:
            cache.crop(start - fed)  # negative: tokens to remove (a full window takes no other)
            for layer in cache.layers:
                layer.record_past = False
    worst = 0.0
    for (_, tokens, _, logits), kept in zip(events, _kept(events)):
        own = _own_forward(model, cache if kept else copy.deepcopy(cache), tokens)
        worst = max(worst, (logits.cpu() - own.cpu()).abs().max().item())
    return worst


def _kept(events) -> list[bool]:
    """Per forward: whether its tokens became history. A forward that did not advance (a verify
    step) was kept when the request's next forward starts after it (every draft accepted), and
    rolled back when the next one starts where it did."""
    out = []
    for i, (position, tokens, advance, _) in enumerate(events):
        following = events[i + 1][0] if i + 1 < len(events) else None
        out.append(advance or following == position + len(tokens))
    return out


def serve(engine, request_id, tokens, new_tokens):
    """One request to its end: prefill, greedy decode, commit (prompt + answer) and free."""
    engine.add_request(request_id, tokens)
    engine.generate(request_id, new_tokens)
    engine.finish(request_id)


def speculate(engine, request_id, ref_tokens, count, k=3):
    """Speculative decoding of `count` tokens with k drafts a step by a fixed rule: the drafts are
    the reference's next tokens, every third one wrong. Returns (tokens, logits, accepted,
    rejected)."""
    logits = [engine.prefill(request_id)]
    tokens = [int(logits[0].argmax())]
    accepted = rejected = step = 0
    while len(tokens) < count:
        ahead = ref_tokens[len(tokens) : len(tokens) + k]
        drafts = [t if (step + i) % 3 != 2 else (t + 1) % VOCAB for i, t in enumerate(ahead)]
        new, new_logits = engine.verify(request_id, tokens[-1], drafts)
        accepted += len(new) - 1
        rejected += len(drafts) - (len(new) - 1)
        tokens += new
        logits += list(new_logits)
        step += 1
    return tokens, torch.stack(logits), accepted, rejected
