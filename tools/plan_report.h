// Rendering of a storage plan for people (text) and programs (JSON).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "hybridkv/model.h"
#include "hybridkv/plan.h"

namespace hybridkv::tools {

nlohmann::json plan_to_json(const ModelDescription& model, const StoragePlan& plan);
std::string plan_to_text(const ModelDescription& model, const StoragePlan& plan);

}  // namespace hybridkv::tools
