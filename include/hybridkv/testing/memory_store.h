// MemoryStore: a SharedStore (hybridkv/shared_store.h) in this process's memory: a map under a
// mutex, bounded in bytes with least-recently-used eviction, as a Redis with `maxmemory` and
// `allkeys-lru`. It stands in for a server where none can run (the GPU machines, whose image has
// no hiredis) and is the simulator's modelled shared tier (`hybridkv sim --instances`).
//
// `charge` says what an object costs against the limit (default: its size); the simulator's
// none backend publishes objects without payload and charges each the bytes of its page.
//
// Thread-safety: every call is thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "hybridkv/shared_store.h"

namespace hybridkv::testing {

class MemoryStore : public SharedStore {
 public:
  using Charge = std::function<uint64_t(std::string_view key, uint64_t size)>;
  explicit MemoryStore(uint64_t max_bytes = UINT64_MAX, Charge charge = nullptr);

  std::vector<StoreOutcome> put(std::span<const std::string> keys,
                                std::span<const std::span<const std::byte>> values) override;
  std::vector<StoreOutcome> get(std::span<const std::string> keys,
                                std::span<const std::span<std::byte>> buffers,
                                std::span<uint64_t> sizes) override;
  std::vector<StoreOutcome> exists(std::span<const std::string> keys) override;
  std::vector<StoreOutcome> remove(std::span<const std::string> keys) override;
  Status ping() override { return Status::ok(); }
  StoreStats stats() const override;

  uint64_t bytes() const;      // charged bytes held
  uint64_t objects() const;    // objects held
  uint64_t evictions() const;  // objects evicted to stay within max_bytes

 private:
  struct Entry {
    std::vector<std::byte> value;
    uint64_t charged = 0;
    std::list<std::string>::iterator lru;  // position in lru_ (front: most recent)
  };
  void touch(Entry& e);
  void erase(std::unordered_map<std::string, Entry>::iterator it);

  const uint64_t max_bytes_;
  const Charge charge_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
  std::list<std::string> lru_;
  uint64_t bytes_ = 0;
  uint64_t evictions_ = 0;
  StoreStats stats_;
};

}  // namespace hybridkv::testing
