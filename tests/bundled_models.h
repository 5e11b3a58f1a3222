// The model configs bundled in models/, read for tests.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "hybridkv/model.h"

namespace hybridkv::testing {

// models/<file> at tensor-parallel size `tp`; a failed read fails the test.
inline ModelDescription bundled_model(const std::string& file, uint32_t tp = 1) {
  ModelOptions o;
  o.tp_size = tp;
  Result<ModelDescription> m = read_model_config(std::string(HKV_MODELS_DIR) + "/" + file, o);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return std::move(m).value();
}

}  // namespace hybridkv::testing
