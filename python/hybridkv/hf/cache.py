"""A ``transformers`` cache whose every K/V page and recurrent state lives in hybridkv's pools.

One ``PagedCache`` serves one request for one forward pass (batch 1). Its layers follow the
model's layers: ``PagedAttention`` writes the step's K/V into the request's pages through its
block table and returns the K/V the layer attends to, gathered from those pages;
``PagedLatent`` does the same for an MLA layer's latent rows;
``PagedState`` hands the model DLPack views of the request's conv and SSM state slot, so the
model's own state update lands in hybridkv's memory (zero copy); a model layer with both
mixers (Falcon-H1) gets both; a layer without cache (an MLP) gets an empty ``PagedState``.

Layouts (the plan promises bytes; these are the shapes hybridkv's views take):
  key / value page:  [tokens_per_block, kv_heads, head_dim]
  MLA latent page:   [tokens_per_block, kv_lora_rank + qk_rope_head_dim]
  conv_state:        [conv_dim, conv_kernel - 1]  (transformers keeps conv_kernel columns;
                     the oldest one never reaches the next token's window)
  ssm_state:         the model's own state shape, batch dimension dropped.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, LinearAttentionCacheLayerMixin

BAD_PAGE = -1


class RequestView:
    """What one forward of one request sees: its position, block tables and state slot."""

    def __init__(self, position: int, tables: dict[int, torch.Tensor], state_slot: int | None):
        self.position = position  # tokens already in the cache
        self.tables = tables  # cache group -> block table (int64 tensor of GPU slot ids)
        self.state_slot = state_slot


class PagedAttention(CacheLayerMixin):
    """One attention layer: K/V pages [slots, tokens_per_block, kv_heads, head_dim]."""

    is_compileable = False
    is_croppable = False

    def __init__(self, keys, values, group: int, window: int | None, view: RequestView):
        super().__init__()
        self.pages_k, self.pages_v = keys, values
        self.group, self.window, self.view = group, window, view
        self.used = False  # set by update(): the forward wrote and read its pages
        self.is_sliding = window is not None
        self.is_initialized = True
        self.tokens_per_block = keys.shape[1]

    def lazy_initialization(self, key_states, value_states) -> None:
        pass

    def unused(self) -> list[str]:
        """What the forward should have read and written here and did not."""
        return [] if self.used else ["K/V pages"]

    def _start(self, position: int) -> int:
        return max(0, position - self.window + 1) if self.window else 0

    def _addresses(self, begin: int, end: int):
        table = self.view.tables[self.group]
        if (end - 1) // self.tokens_per_block >= table.numel():  # no device read to know it
            raise RuntimeError(
                f"position {end - 1} is past the block table ({table.numel()} blocks)")
        pos = torch.arange(begin, end, device=self.pages_k.device)
        slots = table[pos // self.tokens_per_block]
        if bool((slots == BAD_PAGE).any()):
            raise RuntimeError(
                f"a page of positions [{begin}, {end}) is not resident (group {self.group})")
        return slots, pos % self.tokens_per_block

    def update(self, key_states, value_states, *args, **kwargs):
        self.used = True
        position, count = self.view.position, key_states.shape[-2]
        slots, offsets = self._addresses(position, position + count)
        self.pages_k[slots, offsets] = key_states[0].transpose(0, 1).to(self.pages_k.dtype)
        self.pages_v[slots, offsets] = value_states[0].transpose(0, 1).to(self.pages_v.dtype)
        slots, offsets = self._addresses(self._start(position), position + count)
        keys = self.pages_k[slots, offsets].permute(1, 0, 2).unsqueeze(0)
        values = self.pages_v[slots, offsets].permute(1, 0, 2).unsqueeze(0)
        return keys.to(key_states.dtype), values.to(value_states.dtype)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        start = self._start(self.view.position)
        return self.view.position - start + query_length, start

    def get_seq_length(self) -> int:
        return self.view.position

    def get_max_length(self) -> int:
        return self.window if self.window else -1


class PagedLatent(PagedAttention):
    """One MLA layer (Kimi-Linear, DeepSeek): the compressed latent and the rotary key of each
    token in one page row, [slots, tokens_per_block, kv_lora_rank + rope_dim]. transformers
    hands the cache the two latents as a single-head key and value; they are split back on
    the way out."""

    def __init__(self, latent, rank: int, group: int, window: int | None, view: RequestView):
        super().__init__(latent, latent, group, window, view)
        self.rank = rank

    def update(self, key_states, value_states, *args, **kwargs):
        self.used = True
        position, count = self.view.position, key_states.shape[-2]
        slots, offsets = self._addresses(position, position + count)
        rows = torch.cat([key_states[0, 0], value_states[0, 0]], dim=-1)
        self.pages_k[slots, offsets] = rows.to(self.pages_k.dtype)
        slots, offsets = self._addresses(self._start(position), position + count)
        rows = self.pages_k[slots, offsets].unsqueeze(0).unsqueeze(0)
        return (rows[..., : self.rank].to(key_states.dtype),
                rows[..., self.rank :].to(value_states.dtype))


class _Watched(dict):
    """A layer's state tensors (by state index, as transformers keeps them) that notes when the model takes one: a model updates its
    state either through update_conv_state / update_recurrent_state or in place on the tensor
    it took from here (the single-token decode kernels)."""

    def __init__(self, items, usage: dict, key: str):
        super().__init__(items)
        self.usage, self.key = usage, key

    def __getitem__(self, index):
        self.usage[self.key] = True
        return super().__getitem__(index)


class PagedState(LinearAttentionCacheLayerMixin):
    """One recurrent layer: conv and SSM state (a short convolution: conv state only) as views
    of the request's state slot. KDA's conv state is its q, k and v windows side by side, as
    transformers keeps them."""

    def __init__(self, conv=None, ssm=None, conv_shape=None, ssm_shape=None, view=None):
        super().__init__(number_of_states=1)
        self.record_past = False
        self.planned = conv is not None
        # Whether the forward took or updated each state (shared with a PagedHybrid's copy).
        self.usage = {"conv state": False}
        if ssm is not None:  # a short convolution (LFM2) has a conv state only
            self.usage["SSM state"] = False
        if conv is None:  # a layer without cache (MLP / MoE)
            return
        self.conv_states[0] = conv[view.state_slot].view(1, *conv_shape)
        if ssm is not None:
            self.recurrent_states[0] = ssm[view.state_slot].view(1, *ssm_shape)
        self.is_conv_states_initialized[0] = True
        self.is_recurrent_states_initialized[0] = ssm is not None
        self.has_previous_state[0] = view.position > 0
        self.conv_kernel_size[0] = conv_shape[-1] + 1
        self.dtype, self.device = conv.dtype, conv.device
        self.conv_states = _Watched(self.conv_states, self.usage, "conv state")
        self.recurrent_states = _Watched(self.recurrent_states, self.usage, "SSM state")

    def lazy_initialization(self, conv_states=None, recurrent_states=None, state_idx=0, **kw):
        raise RuntimeError("PagedState: the model uses a recurrent state hybridkv did not plan")

    def unused(self) -> list[str]:
        """The planned state the forward did not update (its conv window, its SSM state)."""
        if not self.planned:
            return []
        return [name for name, used in self.usage.items() if not used]

    def update_conv_state(self, conv_states, state_idx: int = 0, conv_kernel_size=None, **kwargs):
        state = self.conv_states[state_idx]
        if state is None:
            self.lazy_initialization()
        kernel = self.conv_kernel_size[state_idx]
        if conv_kernel_size is not None and conv_kernel_size != kernel:
            raise ValueError(f"conv_kernel_size: {conv_kernel_size}, the plan has {kernel}")
        if self.has_previous_state[state_idx]:
            full = torch.cat([state.to(conv_states.dtype), conv_states], dim=-1)
        else:
            full = conv_states
            if full.shape[-1] < kernel:  # as transformers does: pad a short prompt to the kernel
                full = torch.nn.functional.pad(full, (kernel - full.shape[-1], 0))
        state.copy_(full[..., -(kernel - 1) :])
        self.has_previous_state[state_idx] = True
        return full

    def update_recurrent_state(self, recurrent_states, state_idx: int = 0, **kwargs):
        state = self.recurrent_states[state_idx]
        if state is None:
            self.lazy_initialization()
        state.copy_(recurrent_states)
        return state


class PagedHybrid(PagedState, CacheLayerMixin):
    """A model layer with an attention and a recurrent mixer (Falcon-H1)."""

    def __init__(self, attention: PagedAttention, state: PagedState):
        self.__dict__.update(state.__dict__)
        self.attention = attention
        self.is_sliding = attention.is_sliding
        self.is_initialized = True

    def lazy_initialization(self, *args, **kwargs):
        raise RuntimeError("PagedHybrid: the model uses a cache hybridkv did not plan")

    def unused(self) -> list[str]:
        return self.attention.unused() + PagedState.unused(self)

    def update(self, key_states, value_states, *args, **kwargs):
        return self.attention.update(key_states, value_states, *args, **kwargs)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.attention.get_mask_sizes(query_length)

    def get_seq_length(self) -> int:
        return self.attention.get_seq_length()

    def get_max_length(self) -> int:
        return self.attention.get_max_length()


class PagedCache(Cache):
    """The cache of one request for one forward pass (built by ``PagedModel.cache_for``)."""

    def __init__(self, layers, view: RequestView):
        super().__init__(layers=layers)
        self.view = view

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.view.position

    def check_used(self) -> None:
        """Raises when a layer did not read and write the cache it was handed: the model then
        computed without hybridkv (a cache passed under a name the model does not take, a
        layer that builds a cache of its own), and its answer must not be trusted."""
        missing = [f"layer {i}: {', '.join(m)}" for i, layer in enumerate(self.layers)
                   if (m := layer.unused())]
        if missing:
            raise RuntimeError("the model computed without the hybridkv cache it was handed ("
                               + "; ".join(missing) + " never updated)")

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError(
            "hybridkv pages are not cropped: PagedModel.verify rolls back rejected drafts")
