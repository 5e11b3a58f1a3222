// MemoryStore: hybridkv/testing/memory_store.h.
#include "hybridkv/testing/memory_store.h"

#include <cstring>

namespace hybridkv::testing {

MemoryStore::MemoryStore(uint64_t max_bytes, Charge charge)
    : max_bytes_(max_bytes), charge_(std::move(charge)) {}

void MemoryStore::touch(Entry& e) { lru_.splice(lru_.begin(), lru_, e.lru); }

void MemoryStore::erase(std::unordered_map<std::string, Entry>::iterator it) {
  bytes_ -= it->second.charged;
  lru_.erase(it->second.lru);
  entries_.erase(it);
}

std::vector<StoreOutcome> MemoryStore::put(std::span<const std::string> keys,
                                           std::span<const std::span<const std::byte>> values) {
  std::lock_guard lock(mu_);
  std::vector<StoreOutcome> out;
  for (size_t i = 0; i < keys.size(); ++i) {
    ++stats_.puts;
    if (entries_.count(keys[i]) > 0) {
      out.push_back(StoreOutcome::kExists);
      continue;
    }
    const uint64_t charged = charge_ ? charge_(keys[i], values[i].size()) : values[i].size();
    if (charged > max_bytes_) {  // as Redis answers OOM for a value above maxmemory
      ++stats_.failures;
      out.push_back(StoreOutcome::kFailed);
      continue;
    }
    while (bytes_ + charged > max_bytes_) {
      erase(entries_.find(lru_.back()));
      ++evictions_;
    }
    lru_.push_front(keys[i]);
    Entry& e = entries_[keys[i]];
    e.value.assign(values[i].begin(), values[i].end());
    e.charged = charged;
    e.lru = lru_.begin();
    bytes_ += charged;
    stats_.bytes_put += values[i].size();
    out.push_back(StoreOutcome::kOk);
  }
  return out;
}

std::vector<StoreOutcome> MemoryStore::get(std::span<const std::string> keys,
                                           std::span<const std::span<std::byte>> buffers,
                                           std::span<uint64_t> sizes) {
  std::lock_guard lock(mu_);
  std::vector<StoreOutcome> out;
  for (size_t i = 0; i < keys.size(); ++i) {
    ++stats_.gets;
    auto it = entries_.find(keys[i]);
    if (it == entries_.end()) {
      ++stats_.misses;
      out.push_back(StoreOutcome::kMissing);
      continue;
    }
    touch(it->second);
    const std::vector<std::byte>& v = it->second.value;
    sizes[i] = v.size();
    if (v.size() > buffers[i].size()) {
      out.push_back(StoreOutcome::kTooLarge);
      continue;
    }
    if (!v.empty()) std::memcpy(buffers[i].data(), v.data(), v.size());
    ++stats_.hits;
    stats_.bytes_got += v.size();
    out.push_back(StoreOutcome::kOk);
  }
  return out;
}

std::vector<StoreOutcome> MemoryStore::exists(std::span<const std::string> keys) {
  std::lock_guard lock(mu_);
  std::vector<StoreOutcome> out;
  for (const std::string& k : keys)
    out.push_back(entries_.count(k) > 0 ? StoreOutcome::kOk : StoreOutcome::kMissing);
  return out;
}

std::vector<StoreOutcome> MemoryStore::remove(std::span<const std::string> keys) {
  std::lock_guard lock(mu_);
  std::vector<StoreOutcome> out;
  for (const std::string& k : keys) {
    auto it = entries_.find(k);
    if (it == entries_.end()) {
      out.push_back(StoreOutcome::kMissing);
      continue;
    }
    erase(it);
    out.push_back(StoreOutcome::kOk);
  }
  return out;
}

StoreStats MemoryStore::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

uint64_t MemoryStore::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

uint64_t MemoryStore::objects() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

uint64_t MemoryStore::evictions() const {
  std::lock_guard lock(mu_);
  return evictions_;
}

}  // namespace hybridkv::testing
