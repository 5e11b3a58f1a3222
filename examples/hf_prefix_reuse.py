"""A HuggingFace hybrid model generating through hybridkv's pages, with prefix reuse.

Two chat requests share a long system prompt. The first computes it (its K/V pages and the
recurrent-state snapshots are committed to hybridkv's prefix tree as it goes); the second reuses
them and computes only its own question. The script prints the reused tokens, the tokens the model
computed, the block tables and the prefill time saved against the same request without reuse.
The model is built from a config with random weights (no download).

    PYTHONPATH=build/release/python build/venv/bin/python examples/hf_prefix_reuse.py \
        [--family nemotron_h|qwen3_next|falcon_h1|jamba|gemma3_text] [--device cuda]
"""

import argparse
import time

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

import hybridkv as hk
from hybridkv.hf import PagedModel

transformers.logging.set_verbosity_error()

CONFIGS = {
    "nemotron_h": dict(hybrid_override_pattern="M*M-M*M-", mamba_num_heads=8, mamba_head_dim=32,
                       ssm_state_size=32, n_groups=2, conv_kernel=4, chunk_size=64),
    "qwen3_next": dict(full_attention_interval=4, linear_num_key_heads=4, linear_num_value_heads=8,
                       linear_key_head_dim=32, linear_value_head_dim=32, num_experts=4,
                       num_experts_per_tok=2, moe_intermediate_size=128,
                       shared_expert_intermediate_size=128),
    "falcon_h1": dict(mamba_n_heads=8, mamba_d_head=32, mamba_d_state=32, mamba_n_groups=2,
                      mamba_d_ssm=256, mamba_chunk_size=64),
    "jamba": dict(attn_layer_period=4, attn_layer_offset=1, expert_layer_period=2,
                  expert_layer_offset=1, num_experts=2, mamba_d_state=16, mamba_expand=2),
    "gemma3_text": dict(sliding_window=256, sliding_window_pattern=2),
}


def build(family, device):
    torch.manual_seed(0)
    config = AutoConfig.for_model(family, vocab_size=1024, hidden_size=256, intermediate_size=512,
                                  num_hidden_layers=8, num_attention_heads=8,
                                  num_key_value_heads=2, head_dim=32, **CONFIGS[family])
    return AutoModelForCausalLM.from_config(config).to(device).eval()


def timed_prefill(engine, request_id, prompt):
    reused = engine.add_request(request_id, prompt)
    if engine.device is not None:
        torch.cuda.synchronize()
    start = time.perf_counter()
    logits = engine.prefill(request_id)
    if engine.device is not None:
        torch.cuda.synchronize()
    return reused, logits, time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="nemotron_h", choices=list(CONFIGS))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--system-tokens", type=int, default=1024)
    args = ap.parse_args()
    model = build(args.family, args.device)
    kind = hk.BackendKind.CUDA if args.device == "cuda" else hk.BackendKind.HOST
    g = torch.Generator().manual_seed(1)
    system = torch.randint(0, 1024, (args.system_tokens,), generator=g).tolist()
    questions = [torch.randint(0, 1024, (48,), generator=g).tolist() for _ in range(2)]
    snapshots = hk.SnapshotPolicy(periodic_interval=256)

    engine = PagedModel(model, tokens_per_block=16, gpu_bytes=64 << 20, snapshots=snapshots,
                        backend=kind)
    print(hk.plan_text(engine.description, engine.serving).split("\ncache groups")[0])
    _, _, first_time = timed_prefill(engine, 1, system + questions[0])
    answer = [int(engine.decode(1, 1).argmax())]
    engine.finish(1)

    computed_before = engine.forward_tokens
    reused, logits, second_time = timed_prefill(engine, 2, system + questions[1])
    computed = engine.forward_tokens - computed_before
    group = engine.manager.buffer_group(
        next(d["cache_layer"] for d in engine.description.layers if d["mixer"] == "attention"),
        "key")
    print(f"request 1: {len(system + questions[0])} prompt tokens computed in "
          f"{first_time * 1e3:.1f} ms (answer starts with token {answer[0]})")
    table = engine.manager.block_table(2, group)
    print(f"request 2: reused {reused} of {len(system + questions[1])} prompt tokens, computed "
          f"{computed}; block table of group {group}: {table[:4]} ... {table[-4:]} "
          f"({len(table)} blocks, -1: left the sliding window)")
    if engine.manager.state_group is not None:
        print(f"request 2: recurrent state in slot {engine.manager.state_index(2)}")

    cold = PagedModel(model, tokens_per_block=16, gpu_bytes=64 << 20, snapshots=snapshots,
                      backend=kind)
    _, cold_logits, cold_time = timed_prefill(cold, 2, system + questions[1])
    same = torch.equal(logits.argmax(), cold_logits.argmax())
    print(f"request 2 without reuse: {cold_time * 1e3:.1f} ms; with reuse: "
          f"{second_time * 1e3:.1f} ms: {(cold_time - second_time) * 1e3:.1f} ms saved "
          f"({cold_time / second_time:.1f}x); next token {'equal' if same else 'DIFFERS'}, "
          f"largest logit difference {(logits - cold_logits).abs().max().item():.2e}")


if __name__ == "__main__":
    main()
