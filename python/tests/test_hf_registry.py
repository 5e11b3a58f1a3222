"""Issue 30: transformers' registry of model types against what hybridkv supports (see
hf_registry.py): every family with recurrent, linear-attention, convolution or sliding-window
layers is run token for token by test_hf.py or listed with the reason it is not."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))
import hf_models as hm  # noqa: E402
import hf_registry as reg  # noqa: E402


def test_every_marked_family_is_supported_or_listed_with_a_reason(capsys):
    marked = reg.marked_families()
    supported = set(hm.FAMILIES)
    unhandled = sorted(set(marked) - supported - set(reg.EXCLUDED))
    assert not unhandled, ("families with recurrent / linear-attention / convolution / "
                           "sliding-window layers that are neither run by test_hf.py nor listed "
                           f"in hf_registry.EXCLUDED: { {t: marked[t] for t in unhandled} }")
    assert not supported & set(reg.EXCLUDED), "a family both supported and excluded"
    assert all(reason.strip() for reason in reg.EXCLUDED.values())
    stale = sorted(set(reg.EXCLUDED) - set(marked))
    assert not stale, f"listed but no longer marked by transformers' registry: {stale}"
    missing = sorted(supported - set(marked))
    assert not missing, f"run by test_hf.py but not marked by the registry walk: {missing}"
    with capsys.disabled():
        print(f"\nhf registry: {len(supported)} supported ({', '.join(sorted(supported))}); "
              f"{len(reg.EXCLUDED)} excluded with a reason")


@pytest.mark.parametrize("wrapper", ["qwen3_5", "qwen3_5_moe", "gemma3"])
def test_a_multimodal_wrapper_is_planned_from_its_text_config(wrapper):
    """The checkpoints of Qwen3.5 and Gemma 3 ship the wrapper's config.json; its cache layers
    are those of its text_config, read the same way."""
    import hybridkv as hk
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config = CONFIG_MAPPING[wrapper]()
    text = config.get_text_config(decoder=True)
    outer, inner = hk.read_model_config(config.to_dict()), hk.read_model_config(text.to_dict())
    assert outer.model_type == wrapper
    assert len(outer.layers) == len(inner.layers) > 0
    assert [(d["mixer"], d["window"]) for d in outer.layers] == \
        [(d["mixer"], d["window"]) for d in inner.layers]
