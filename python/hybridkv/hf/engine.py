"""A small serving loop: a ``transformers`` causal LM generating through hybridkv's pages.

``PagedModel`` plans the pools from the model's own config (``read_model_config``), keeps one
``HybridCacheManager``, and runs requests one forward at a time (batch 1): prefill in chunks that
end where the snapshot policy asks (each chunk committed, so later requests reuse it: KV pages
and the SSM snapshot), greedy decode, suspend to the host tier and resume, and speculative
decoding (``verify``) whose rejected drafts are rolled back: the state slot is restored from the
checkpoint taken before the verify step and the accepted tokens are replayed through the model.

``forward_tokens`` counts the tokens the model computed, so reuse shows up as tokens not computed.
"""

from __future__ import annotations

import inspect
import math

import torch

import hybridkv as hk

from .cache import (PagedAttention, PagedCache, PagedHybrid, PagedLatent, PagedState,
                    RequestView)

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _tensor(array):
    """A hybridkv buffer view (numpy, or a CUDA DLPack array) as a torch tensor, no copy."""
    on_host = hasattr(array, "__array_interface__")
    t = torch.from_numpy(array) if on_host else torch.from_dlpack(array)
    return t.view(torch.bfloat16) if t.dtype == torch.uint16 else t  # bf16 shows as uint16


class PagedModel:
    """A HuggingFace causal LM whose caches are hybridkv's pages and state slots."""

    def __init__(self, model, *, tokens_per_block=16, gpu_bytes=256 << 20, host_bytes=512 << 20,
                 snapshots=None, max_batch=4, num_spec_tokens=0, snapshot_dtype=None,
                 backend=hk.BackendKind.HOST, device=0, policies=None):
        self.model = model.eval()
        name = _DTYPE_NAMES[next(model.parameters()).dtype]
        self.description = hk.read_model_config(model.config, kv_dtype=name, conv_dtype=name)
        serving = hk.ServingConfig(
            max_batch=max_batch, tokens_per_block=tokens_per_block,
            num_spec_tokens=num_spec_tokens,
            tiers=[hk.TierConfig(kind=hk.TierKind.GPU, quota_bytes=gpu_bytes),
                   hk.TierConfig(kind=hk.TierKind.HOST, quota_bytes=host_bytes)],
            snapshots=snapshots or hk.SnapshotPolicy(periodic_interval=tokens_per_block))
        if snapshot_dtype is not None:
            serving.snapshot_dtype = snapshot_dtype
        if policies is not None:
            serving.policies = policies
        self.serving = serving
        self.manager = hk.HybridCacheManager(self.description, serving, backend, device)
        self.tokens_per_block = tokens_per_block
        self.device = torch.device("cuda", device) if backend == hk.BackendKind.CUDA else None
        self._layers = self._plan_layers()
        self._cache_argument = self._cache_keyword(model)
        self.requests: dict[int, dict] = {}
        self.forward_tokens = 0  # tokens the model computed, over all requests
        self.replayed_tokens = 0  # of which: accepted tokens replayed after a rejection

    # --- the plan's layout as torch views ---

    def _view(self, layer: int, role: str):
        return _tensor(self.manager.buffer_view(hk.TierKind.GPU, layer, role))

    def _plan_layers(self):
        """Per model layer: its attention (pages, group, window) and recurrent (views, shapes)."""
        layers: dict[int, dict] = {}
        for d in self.description.layers:
            entry = layers.setdefault(d["model_layer"], {})
            cl = d["cache_layer"]
            if d["mixer"] == "attention":
                shape = (-1, self.tokens_per_block, d["kv_heads"], d["head_dim"])
                entry["attention"] = dict(
                    keys=self._view(cl, "key").reshape(shape),
                    values=self._view(cl, "value").reshape(shape),
                    group=self.manager.buffer_group(cl, "key"), window=d["window"])
            elif d["mixer"] == "mla":  # the compressed latent and the rotary key, one row
                rank = self.model.config.get_text_config(decoder=True).kv_lora_rank
                entry["attention"] = dict(
                    latent=self._view(cl, "mla_latent").reshape(
                        -1, self.tokens_per_block, d["head_dim"]),
                    rank=rank, group=self.manager.buffer_group(cl, "mla_latent"),
                    window=d["window"])
            elif d["mixer"] == "short_conv":  # LFM2: a conv state only
                conv_shape = (d["conv_dim"], d["conv_kernel"] - 1)
                if math.prod(conv_shape) != d["conv_elements"]:
                    raise ValueError(f"cache layer {cl}: the plan's conv state "
                                     f"({d['conv_elements']} elements) is not {conv_shape}")
                entry["state"] = dict(conv=self._view(cl, "conv_state"), conv_shape=conv_shape)
            elif d["mixer"] in ("mamba1", "mamba2", "gdn", "kda"):
                conv_shape, ssm_shape = (d["conv_dim"], d["conv_kernel"] - 1), self._ssm_shape(d)
                if math.prod(ssm_shape) != d["ssm_elements"] or \
                        math.prod(conv_shape) != d["conv_elements"]:
                    raise ValueError(f"cache layer {cl}: the plan's state ({d['ssm_elements']} + "
                                     f"{d['conv_elements']} elements) is not the model's "
                                     f"{ssm_shape} + {conv_shape}")
                entry["state"] = dict(
                    conv=self._view(cl, "conv_state"), ssm=self._view(cl, "ssm_state"),
                    conv_shape=conv_shape, ssm_shape=ssm_shape)
            else:
                raise ValueError(f"model layer {d['model_layer']}: mixer '{d['mixer']}' is not "
                                 "supported by hybridkv.hf")
        return layers

    @staticmethod
    def _cache_keyword(model) -> str:
        """The name the model's forward takes its cache by: ``past_key_values`` for most,
        ``cache_params`` for the pure SSM families (Mamba, Mamba2), which would otherwise take
        the cache as an unknown keyword and compute with a fresh cache of their own."""
        parameters = inspect.signature(model.forward).parameters
        for name in ("past_key_values", "cache_params"):
            if name in parameters:
                return name
        raise ValueError(f"{type(model).__name__}.forward takes neither past_key_values nor "
                         "cache_params: hybridkv.hf cannot hand it a cache")

    @staticmethod
    def _ssm_shape(d):
        if d["mixer"] == "mamba1":
            return (d["d_inner"], d["state_size"])
        if d["mixer"] == "gdn":  # [value heads, key head dim, value head dim]
            return (d["num_heads"], d["state_size"], d["head_dim"])
        if d["mixer"] == "kda":  # [heads, key head dim, value head dim], both head_dim
            return (d["num_heads"], d["head_dim"], d["head_dim"])
        return (d["num_heads"], d["head_dim"], d["state_size"])

    def cache_for(self, view: RequestView) -> PagedCache:
        """The transformers cache of one request for one forward pass."""
        layers = []
        for i in range(self.model.config.get_text_config(decoder=True).num_hidden_layers):
            entry = self._layers.get(i, {})
            attention = state = None
            if "attention" in entry:
                kind = PagedLatent if "latent" in entry["attention"] else PagedAttention
                attention = kind(**entry["attention"], view=view)
            if "state" in entry:
                state = PagedState(**entry["state"], view=view)
            if attention is not None and state is not None:
                layers.append(PagedHybrid(attention, state))
            else:
                layers.append(attention or state or PagedState())
        return PagedCache(layers, view)

    # --- requests ---

    def add_request(self, request_id: int, prompt) -> int:
        """Admits a request; returns the prompt tokens reused from the prefix tree."""
        prompt = [int(t) for t in prompt]
        self.manager.add_request(request_id, prompt)
        self.manager.resume(request_id)
        reused = self.manager.request(request_id)["reused_tokens"]
        self.requests[request_id] = dict(prompt=prompt, generated=[], position=reused)
        return reused

    def _request_view(self, request_id: int, position: int, count: int) -> RequestView:
        """Pages for [position, position + count) and the view a forward uses."""
        self.manager.resize(request_id, position + count, position)
        self.manager.synchronize()  # pages that arrived or left are in place
        tables = {}
        for entry in self._layers.values():
            if "attention" in entry:
                g = entry["attention"]["group"]
                if g not in tables:
                    tables[g] = torch.tensor(self.manager.block_table(request_id, g),
                                             dtype=torch.int64, device=self.device)
        slot = None
        if self.manager.state_group is not None:
            slot = self.manager.state_index(request_id)
        return RequestView(position, tables, slot)

    @torch.no_grad()
    def forward(self, request_id: int, tokens, advance: bool = True) -> torch.Tensor:
        """Runs `tokens` after the request's position; returns their logits [len, vocab].
        With `advance` the tokens become history (computed); without, the caller decides."""
        r = self.requests[request_id]
        view = self._request_view(request_id, r["position"], len(tokens))
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
        cache = self.cache_for(view)
        out = self.model(input_ids=ids, use_cache=True, **{self._cache_argument: cache})
        cache.check_used()
        if self.device is not None:
            # The manager's copies (snapshots, offloads) read what the model wrote: let the
            # model's stream finish first (an engine would hand the manager an event instead).
            torch.cuda.current_stream(self.device).synchronize()
        self.forward_tokens += len(tokens)
        if advance:
            self._advance(request_id, r["position"] + len(tokens))
        return out.logits[0].float()

    def _advance(self, request_id: int, position: int) -> None:
        self.requests[request_id]["position"] = position
        self.manager.resize(request_id, position, position)

    def prefill(self, request_id: int, chunk: int | None = None) -> torch.Tensor:
        """Computes the rest of the prompt in chunks that end at the snapshot points (and at most
        `chunk` tokens long), committing each; returns the last prompt token's logits."""
        r = self.requests[request_id]
        logits = None
        while r["position"] < len(r["prompt"]):
            end = self.manager.next_snapshot_point(request_id)
            if chunk is not None:
                end = min(end, r["position"] + chunk)
            logits = self.forward(request_id, r["prompt"][r["position"] : end])
            self.manager.commit_at_snapshot(request_id)
            self.manager.synchronize()  # the snapshot copy read the state slot
        if logits is None:  # the manager leaves the last prompt token to compute: not reached
            raise RuntimeError("prefill: nothing to compute (the whole prompt was reused)")
        return logits[-1]

    def decode(self, request_id: int, token: int) -> torch.Tensor:
        """Appends one token; returns the logits after it."""
        self.requests[request_id]["generated"].append(int(token))
        return self.forward(request_id, [int(token)])[-1]

    def generate(self, request_id: int, max_new_tokens: int, chunk: int | None = None):
        """Greedy generation: the new tokens and the logits that chose each."""
        logits = [self.prefill(request_id, chunk)]
        tokens = [int(logits[-1].argmax())]
        while len(tokens) < max_new_tokens:
            logits.append(self.decode(request_id, tokens[-1]))
            tokens.append(int(logits[-1].argmax()))
        return tokens, torch.stack(logits)

    # --- speculative decoding ---

    def _state_views(self, request_id: int):
        if self.manager.state_group is None:
            return []
        slot = self.manager.state_index(request_id)
        return [e["state"][k][slot] for e in self._layers.values() if "state" in e
                for k in ("conv", "ssm") if k in e["state"]]

    def verify(self, request_id: int, last_token: int, drafts) -> tuple[list[int], list]:
        """One speculative step: runs `last_token` and the drafts, accepts drafts while they equal
        the model's greedy choice, and returns (accepted drafts + the model's next token, their
        logits). Rejected drafts leave no trace: the state slot is restored from the checkpoint
        and the accepted tokens are replayed."""
        r = self.requests[request_id]
        drafts = [int(t) for t in drafts]
        checkpoint = [t.clone() for t in self._state_views(request_id)]
        logits = self.forward(request_id, [last_token, *drafts], advance=False)
        choice = logits.argmax(-1).tolist()
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == choice[accepted]:
            accepted += 1
        r["generated"].append(int(last_token))
        r["generated"].extend(drafts[:accepted])
        if accepted < len(drafts):  # roll back, then replay the accepted tokens
            for view, saved in zip(self._state_views(request_id), checkpoint):
                view.copy_(saved)
            self.replayed_tokens += accepted + 1
            self.forward(request_id, [last_token, *drafts[:accepted]])
        else:
            self._advance(request_id, r["position"] + len(drafts) + 1)
        return [*drafts[:accepted], choice[accepted]], logits[: accepted + 1]

    # --- lifecycle ---

    def suspend(self, request_id: int) -> None:
        self.manager.suspend(request_id)

    def resume(self, request_id: int) -> None:
        self.manager.resume(request_id)
        self.manager.synchronize()

    def finish(self, request_id: int, commit: bool = True) -> None:
        """Commits the prompt and answer (the next turn reuses both) and frees the request."""
        r = self.requests.pop(request_id)
        if commit and r["generated"]:
            self.manager.commit_answer(request_id, r["generated"])
            self.manager.synchronize()
        self.manager.free_request(request_id)
