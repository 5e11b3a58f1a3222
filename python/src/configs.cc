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

// A dtype argument by name ("f32", "bf16", ...); the error names the argument.
DType dtype_arg(const char* what, const std::string& name) {
  const std::optional<DType> d = parse_dtype(name);
  if (!d) throw nb::value_error((std::string(what) + ": '" + name + "' is not a dtype").c_str());
  return *d;
}

ModelDescription read_model(nb::object source, uint32_t tp, std::optional<std::string> kv_dtype,
                            std::optional<std::string> ssm_dtype,
                            std::optional<std::string> conv_dtype) {
  ModelOptions o;
  o.tp_size = tp;
  if (kv_dtype) o.kv_dtype = dtype_arg("kv_dtype", *kv_dtype);
  if (ssm_dtype) o.ssm_dtype = dtype_arg("ssm_dtype", *ssm_dtype);
  if (conv_dtype) o.conv_dtype = dtype_arg("conv_dtype", *conv_dtype);
  if (nb::isinstance<nb::dict>(source)) {
    const nb::object dumps = nb::module_::import_("json").attr("dumps");
    const std::string text = nb::cast<std::string>(dumps(source));
    return value_or_raise(parse_model_config(text, o, "dict"));
  }
  const std::string path = nb::cast<std::string>(nb::str(source));
  return value_or_raise(read_model_config(path, o));
}

// One cache layer as a dict (ModelDescription.layers).
nb::list layer_dicts(const ModelDescription& model) {
  nb::list out;
  for (const ModelLayer& l : model.layers) {
    nb::dict d;
    d["cache_layer"] = l.cache_layer;
    d["model_layer"] = l.model_layer;
    d["mixer"] = mixer_kind_name(l.mixer);
    d["window"] = l.window;
    d["kv_heads"] = l.kv_heads;
    d["head_dim"] = l.is_attention() ? l.head_dim : l.shape.head_dim;
    d["conv_elements"] = l.conv_elements;
    d["ssm_elements"] = l.ssm_elements;
    d["num_heads"] = l.shape.num_heads;
    d["state_size"] = l.shape.state_size;
    d["n_groups"] = l.shape.n_groups;
    d["d_inner"] = l.shape.d_inner;
    d["conv_dim"] = l.shape.conv_dim;
    d["conv_kernel"] = l.shape.conv_kernel;
    out.append(d);
  }
  return out;
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
      .value("CUDA", BackendKind::kCuda)
      .value("ENGINE", BackendKind::kEngine);
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
      .def_rw("answer_end", &SnapshotPolicy::answer_end)
      .def_rw("chunk_states", &SnapshotPolicy::chunk_states);

  nb::class_<PolicyConfig> policies(
      m, "PolicyConfig",
      "The manager's policies, each by name (config.h): eviction ('priced', 'snapshot-aware', "
      "'lru'), offload ('selective', 'all', 'room'), keep_colder_copies, rebalance ('off', "
      "'pressure'), upkeep_between_steps (the tree's upkeep after a snapshot drop waits for "
      "evict_ahead).");
  kw_init(policies);
  policies.def_rw("eviction", &PolicyConfig::eviction)
      .def_rw("offload", &PolicyConfig::offload)
      .def_rw("keep_colder_copies", &PolicyConfig::keep_colder_copies)
      .def_rw("rebalance", &PolicyConfig::rebalance)
      .def_rw("upkeep_between_steps", &PolicyConfig::upkeep_between_steps);

  nb::enum_<DisaggRole>(m, "DisaggRole")
      .value("BOTH", DisaggRole::kBoth)
      .value("CONTEXT", DisaggRole::kContext)
      .value("GENERATION", DisaggRole::kGeneration);
  nb::class_<ServingConfig> serving(m, "ServingConfig",
                                    "Serving settings of one rank (hybridkv/hybrid.h).");
  kw_init(serving);
  serving.def_rw("max_batch", &ServingConfig::max_batch)
      .def_rw("pp_size", &ServingConfig::pp_size)
      .def_rw("pp_rank", &ServingConfig::pp_rank)
      .def_rw("overlap_scheduling", &ServingConfig::overlap_scheduling)
      .def_rw("role", &ServingConfig::role)
      .def_rw("mtp_layers", &ServingConfig::mtp_layers)
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
      .def_rw("policies", &ServingConfig::policies)
      .def_rw("shared", &ServingConfig::shared)
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
      .def_prop_ro("num_recurrent_layers", &ModelDescription::num_recurrent_layers)
      .def_prop_ro("layers", &layer_dicts,
                   "The cache layers: dicts of cache_layer, model_layer, mixer ('attention', "
                   "'mamba2', ...), window, kv_heads, head_dim, conv_elements, ssm_elements and "
                   "the recurrent shape (num_heads, state_size, n_groups, d_inner, conv_dim, "
                   "conv_kernel).");
  m.def("read_model_config", &read_model, "source"_a, "tp"_a = 1, "kv_dtype"_a = nb::none(),
        "ssm_dtype"_a = nb::none(), "conv_dtype"_a = nb::none(),
        "A HuggingFace config.json (a path, or the parsed dict) as a ModelDescription; dtypes "
        "by name ('f32', 'bf16', ...).");

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
