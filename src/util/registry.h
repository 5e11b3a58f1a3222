// Registry<Policy>: the named implementations of one policy (eviction, offload admission,
// rebalancing): the shipped ones, then any an embedder or a test registers. Lookups name the
// config field, the value and every known name. Policies are never removed, so the pointers
// handed out stay valid for the process.
// Thread-safety: every call is safe from any thread.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "hybridkv/status.h"

namespace hybridkv {

template <typename Policy>
class Registry {
 public:
  Registry(const char* field, std::vector<std::unique_ptr<Policy>> shipped)
      : field_(field), policies_(std::move(shipped)) {}

  Result<const Policy*> find(std::string_view name) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& p : policies_) {
      if (p->name() == name) return p.get();
    }
    std::string known;
    for (const auto& p : policies_) known += (known.empty() ? "" : ", ") + p->name();
    return Status::invalid(std::string(field_) + ": no policy '" + std::string(name) +
                           "' (known: " + known + ")");
  }

  std::vector<std::string> names() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const auto& p : policies_) out.push_back(p->name());
    return out;
  }

  Status add(std::unique_ptr<Policy> policy) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& p : policies_) {
      if (p->name() == policy->name())
        return Status::invalid(std::string(field_) + ": a policy '" + p->name() +
                               "' is already registered");
    }
    policies_.push_back(std::move(policy));
    return Status::ok();
  }

 private:
  const char* field_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Policy>> policies_;  // never removed: pointers stay valid
};

}  // namespace hybridkv
