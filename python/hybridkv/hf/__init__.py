"""hybridkv.hf: HuggingFace ``transformers`` models generating through hybridkv's pages.

``PagedModel(model)`` plans hybridkv's pools from the model's own config and runs requests whose
K/V pages and recurrent states live in them (``PagedCache`` is the ``transformers`` cache object
it hands the model). Needs ``torch`` and ``transformers``.
"""

from .cache import PagedAttention, PagedCache, PagedHybrid, PagedState, RequestView
from .engine import PagedModel

__all__ = ["PagedAttention", "PagedCache", "PagedHybrid", "PagedModel", "PagedState", "RequestView"]
