// The model configs bundled in models/, read for tests.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "hybridkv/model.h"

namespace hybridkv::testing {

// The path of models/<file>. Appended, not `std::string(dir) + "/" + file`: GCC 12 warns falsely
// (-Warray-bounds) on that once inlined at -O1 beside the precompiled gtest header.
inline std::string bundled_model_path(const std::string& file) {
  std::string path = HKV_MODELS_DIR;
  path += '/';
  path += file;
  return path;
}

// models/<file> at tensor-parallel size `tp`; a failed read fails the test.
inline ModelDescription bundled_model(const std::string& file, uint32_t tp = 1) {
  ModelOptions o;
  o.tp_size = tp;
  Result<ModelDescription> m = read_model_config(bundled_model_path(file), o);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return std::move(m).value();
}

}  // namespace hybridkv::testing
