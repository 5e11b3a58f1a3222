// Configuration types (keyword-argument constructors with the C++ defaults), the model reader
// and the storage plan with the CLI's text and JSON reports.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "hybridkv/hybrid.h"
#include "hybridkv/model.h"
#include "plan_report.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace hybridkv::python {
namespace {

ModelDescription read_model(nb::object source, uint32_t tp, std::optional<std::string> kv_dtype,
                            std::optional<std::string> ssm_dtype) {
  ModelOptions o;
  o.tp_size = tp;
  if (kv_dtype) {
    const std::optional<DType> d = parse_dtype(*kv_dtype);
    if (!d) throw nb::value_error(("kv_dtype: '" + *kv_dtype + "' is not a dtype").c_str());
    o.kv_dtype = *d;
  }
  if (ssm_dtype) {
    const std::optional<DType> d = parse_dtype(*ssm_dtype);
    if (!d) throw nb::value_error(("ssm_dtype: '" + *ssm_dtype + "' is not a dtype").c_str());
    o.ssm_dtype = *d;
  }
  if (nb::isinstance<nb::dict>(source)) {
    const nb::object dumps = nb::module_::import_("json").attr("dumps");
    const std::string text = nb::cast<std::string>(dumps(source));
    return value_or_raise(parse_model_config(text, o, "dict"));
  }
  const std::string path = nb::cast<std::string>(nb::str(source));
  return value_or_raise(read_model_config(path, o));
}

}  // namespace

void bind_configs(nb::module_& m) {
  nb::enum_<TierKind>(m, "TierKind")
      .value("GPU", TierKind::kGpu)
      .value("HOST", TierKind::kHost)
      .value("DISK", TierKind::kDisk);
  nb::enum_<BackendKind>(m, "BackendKind")
      .value("NONE", BackendKind::kNone)
      .value("HOST", BackendKind::kHost)
      .value("CUDA", BackendKind::kCuda);
  nb::enum_<CacheState>(m, "CacheState")
      .value("SUSPENDED", CacheState::kSuspended)
      .value("ACTIVE", CacheState::kActive)
      .value("CLOSED", CacheState::kClosed);
  nb::enum_<DType>(m, "DType")
      .value("F32", DType::kF32)
      .value("F16", DType::kF16)
      .value("BF16", DType::kBF16)
      .value("FP8_E4M3", DType::kFP8E4M3)
      .value("FP8_E5M2", DType::kFP8E5M2)
      .value("INT8", DType::kINT8)
      .value("UINT8", DType::kUINT8);
  nb::enum_<ReplayLayout>(m, "ReplayLayout")
      .value("PRIVATE", ReplayLayout::kPrivate)
      .value("RING", ReplayLayout::kRing);

  nb::class_<TierConfig> tier(m, "TierConfig", "One memory tier: kind, quota, directory (disk).");
  kw_init(tier);
  tier.def_rw("kind", &TierConfig::kind)
      .def_rw("quota_bytes", &TierConfig::quota_bytes)
      .def_rw("path", &TierConfig::path)
      .def_rw("max_quota_bytes", &TierConfig::max_quota_bytes);

  nb::class_<SnapshotPolicy> policy(m, "SnapshotPolicy", "Where SSM snapshots are taken.");
  kw_init(policy);
  policy.def_rw("periodic_interval", &SnapshotPolicy::periodic_interval)
      .def_rw("aligned_end", &SnapshotPolicy::aligned_end)
      .def_rw("offsets_from_start", &SnapshotPolicy::offsets_from_start)
      .def_rw("offsets_from_end", &SnapshotPolicy::offsets_from_end)
      .def_rw("final_prompt_boundary", &SnapshotPolicy::final_prompt_boundary)
      .def_rw("branch_point", &SnapshotPolicy::branch_point)
      .def_rw("demand_driven", &SnapshotPolicy::demand_driven)
      .def_rw("answer_end", &SnapshotPolicy::answer_end);

  nb::class_<ServingConfig> serving(m, "ServingConfig",
                                    "Serving settings of one rank (hybridkv/hybrid.h).");
  kw_init(serving);
  serving.def_rw("max_batch", &ServingConfig::max_batch)
      .def_rw("pp_size", &ServingConfig::pp_size)
      .def_rw("pp_rank", &ServingConfig::pp_rank)
      .def_rw("overlap_scheduling", &ServingConfig::overlap_scheduling)
      .def_rw("dummy_slots", &ServingConfig::dummy_slots)
      .def_rw("num_spec_tokens", &ServingConfig::num_spec_tokens)
      .def_rw("replay_layout", &ServingConfig::replay_layout)
      .def_rw("tokens_per_block", &ServingConfig::tokens_per_block)
      .def_rw("tiers", &ServingConfig::tiers)
      .def_rw("max_util_for_resume", &ServingConfig::max_util_for_resume)
      .def_rw("enable_block_reuse", &ServingConfig::enable_block_reuse)
      .def_rw("enable_partial_reuse", &ServingConfig::enable_partial_reuse)
      .def_rw("typical_len", &ServingConfig::typical_len)
      .def_rw("max_seq_len", &ServingConfig::max_seq_len)
      .def_rw("pool_rebalance", &ServingConfig::pool_rebalance)
      .def_rw("selective_offload", &ServingConfig::selective_offload)
      .def_rw("snapshot_aware_eviction", &ServingConfig::snapshot_aware_eviction)
      .def_rw("snapshot_dtype", &ServingConfig::snapshot_dtype)
      .def_rw("record_events", &ServingConfig::record_events)
      .def_rw("snapshots", &ServingConfig::snapshots);

  nb::class_<ModelDescription>(m, "ModelDescription", "A model's cache layers (read_model_config).")
      .def_ro("source", &ModelDescription::source)
      .def_ro("model_type", &ModelDescription::model_type)
      .def_ro("family", &ModelDescription::family)
      .def_ro("num_model_layers", &ModelDescription::num_model_layers)
      .def_ro("tp_size", &ModelDescription::tp_size)
      .def_prop_ro("kv_bytes_per_token", &ModelDescription::kv_bytes_per_token)
      .def_prop_ro("state_bytes_per_sequence", &ModelDescription::state_bytes_per_sequence)
      .def_prop_ro("num_attention_layers", &ModelDescription::num_attention_layers)
      .def_prop_ro("num_recurrent_layers", &ModelDescription::num_recurrent_layers);
  m.def("read_model_config", &read_model, "source"_a, "tp"_a = 1, "kv_dtype"_a = nb::none(),
        "ssm_dtype"_a = nb::none(),
        "A HuggingFace config.json (a path, or the parsed dict) as a ModelDescription.");

  m.def(
      "plan_text",
      [](const ModelDescription& model, const ServingConfig& serving) {
        const ManagerConfig c = value_or_raise(hybrid_manager_config(model, serving));
        return tools::plan_to_text(model, value_or_raise(StoragePlan::build(c)));
      },
      "model"_a, "serving"_a, "The storage plan as `hybridkv plan` prints it.");
  m.def(
      "plan_json",
      [](const ModelDescription& model, const ServingConfig& serving) {
        const ManagerConfig c = value_or_raise(hybrid_manager_config(model, serving));
        return tools::plan_to_json(model, value_or_raise(StoragePlan::build(c))).dump();
      },
      "model"_a, "serving"_a, "The storage plan as `hybridkv plan --json` prints it (a string).");
}

}  // namespace hybridkv::python
