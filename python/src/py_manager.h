// The Python object behind hybridkv.HybridCacheManager, shared by the files that bind its
// methods (manager.cc: requests, steps, diagnostics; manager_snapshots.cc: snapshots).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "hybridkv/hybrid.h"

namespace hybridkv::python {

using IndexArray = nanobind::ndarray<nanobind::numpy, int32_t>;

class Manager {
 public:
  // `devices`: one tensor-parallel rank per entry (BackendOptions::devices); empty: one rank on
  // `device`.
  Manager(const ModelDescription& model, const ServingConfig& serving, BackendKind backend,
          int device, std::vector<int> devices)
      : device_(device), devices_(devices) {
    BackendOptions o{backend, device};
    o.devices = std::move(devices);
    h_ = value_or_raise(HybridCacheManager::create(model, serving, o));
  }

  // Runs `fn` on the manager with the GIL released and the manager's lock held.
  template <typename Fn>
  auto locked(Fn&& fn) {
    nanobind::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu_);
    return fn(*h_);
  }
  template <typename Fn>
  void call(Fn&& fn) {
    raise_if_error(locked(std::forward<Fn>(fn)));
  }
  // Runs `fn(manager, cache)` on one request's cache (KeyError when there is none).
  template <typename Fn>
  void on_request(uint64_t id, Fn&& fn) {
    call([&](HybridCacheManager& h) -> Status {
      KvCache* c = h.cache(id);
      if (c == nullptr) return Status::not_found("no request " + std::to_string(id));
      return fn(h, *c);
    });
  }

  HybridCacheManager& h() { return *h_; }

  // Grows every request of `ids` by one token (resize to history + 1) as one operation and
  // returns the step's arrays: state and replay index per request, and for `group` the block
  // table of each request (row r, -1 past its blocks). The arrays own their memory: a later
  // step never changes or frees them.
  nanobind::tuple decode_step(const std::vector<uint64_t>& ids, std::optional<uint32_t> group) {
    StepArrays out;
    raise_if_error(locked([&](HybridCacheManager& h) -> Status {
      if (Status s = check_group(h, group); !s) return s;
      if (Status s = h.decode_step(ids); !s) return s;
      return fill_step(h, ids, group, out);
    }));
    return nanobind::make_tuple(owned(std::move(out.state), {out.state_size}),
                                owned(std::move(out.replay), {out.state_size}),
                                owned(std::move(out.tables), {out.state_size, out.width}));
  }

  // Replay indices whose replay state the engine must reset before the last decode_step.
  std::vector<int32_t> replay_resets() const { return resets_; }

  // prepare_step + fill_step as one call (HybridCacheManager::step_buffers); returns the
  // step's replay resets.
  // Every rank's buffers are written, rank r's on streams[r] (one per rank), or all on `stream`
  // when `streams` is empty (0: each device's default stream).
  std::vector<int32_t> fill_step(const std::vector<uint64_t>& ids, uint32_t dummies,
                                 uintptr_t stream, const std::vector<uintptr_t>& streams) {
    const uint32_t n = ranks();
    if (!streams.empty() && streams.size() != n) {
      throw nanobind::value_error(("fill_step: streams has " + std::to_string(streams.size()) +
                                   " entries; the manager has " + std::to_string(n) + " ranks")
                                      .c_str());
    }
    raise_if_error(locked([&](HybridCacheManager& h) -> Status {
      Result<HybridCacheManager::Step> step = h.prepare_step(ids, dummies);
      if (!step) return step.status();
      for (uint32_t r = 0; r < n; ++r) {
        const Stream on{streams.empty() ? stream : streams[r]};
        if (Status s = h.fill_step(*step, on, r); !s) return s;
      }
      resets_ = step->replay_resets;
      keep_copies(*step);
      return Status::ok();
    }));
    return resets_;
  }

  // BackendKind.ENGINE: the copies the steps handed out and those queued since, oldest first.
  // Other backends: the error KvCacheManager.take_copies gives.
  Result<std::vector<EngineCopyBatch>> take_copies() {
    return locked([&](HybridCacheManager& h) -> Result<std::vector<EngineCopyBatch>> {
      Result<std::vector<EngineCopyBatch>> more = h.manager().take_copies();
      if (!more) return more.status();
      std::vector<EngineCopyBatch> out = std::exchange(copies_, {});
      out.insert(out.end(), more->begin(), more->end());
      return out;
    });
  }

  BackendKind backend_kind() const { return h_->manager().backend_kind(); }
  uint32_t ranks() const { return h_->manager().ranks(); }
  // The CUDA device of a rank's memory. Requires: rank < ranks() (check_rank).
  int device(uint32_t rank = 0) const { return devices_.empty() ? device_ : devices_[rank]; }
  // ValueError naming `what` and the rank unless the manager has it.
  void check_rank(uint32_t rank, const char* what) const {
    if (rank < ranks()) return;
    throw nanobind::value_error((std::string(what) + ": rank " + std::to_string(rank) +
                                 "; the manager has " + std::to_string(ranks()) + " ranks")
                                    .c_str());
  }
  std::byte* slot_address(TierKind tier, PoolGroupId pg, uint32_t pool, uint32_t slot,
                          uint32_t rank) {
    return h_->manager().slot_address(tier, pg, pool, slot, rank);
  }

 private:
  struct StepArrays {
    std::vector<int32_t> state, replay, tables;
    size_t state_size = 0, width = 0;
  };

  // A numpy array that owns `values` (freed with the array, never before).
  static IndexArray owned(std::vector<int32_t>&& values, std::initializer_list<size_t> shape) {
    auto* heap = new std::vector<int32_t>(std::move(values));
    nanobind::capsule owner(heap,
                            [](void* p) noexcept { delete static_cast<std::vector<int32_t>*>(p); });
    return IndexArray(heap->data(), shape.size(), shape.begin(), owner);
  }

  // `group` must have block tables: checked before the step changes anything.
  static Status check_group(HybridCacheManager& h, std::optional<uint32_t> group) {
    if (!group) return Status::ok();
    const size_t groups = h.plan().cache_groups().size();
    if (*group >= groups) {
      return Status::not_found("decode_step: group " + std::to_string(*group) +
                               " is not a cache group (the plan has " + std::to_string(groups) +
                               ")");
    }
    if (h.plan().cache_group(CacheGroupId(*group)).kind == GroupKind::kSsm) {
      return Status::invalid("decode_step: group " + std::to_string(*group) +
                             " is an SSM group: it has no block table (state indices are "
                             "returned for it)");
    }
    return Status::ok();
  }

  Status fill_step(HybridCacheManager& h, const std::vector<uint64_t>& ids,
                   std::optional<uint32_t> group, StepArrays& out) {
    const size_t n = ids.size();
    Result<HybridCacheManager::Step> step = h.prepare_step(ids, 0);
    if (!step) return step.status();
    std::vector<std::span<const int32_t>> rows(n);
    if (group) {
      for (size_t i = 0; i < n; ++i) {
        rows[i] = *h.cache(ids[i])->block_table(CacheGroupId(*group));
        out.width = std::max(out.width, rows[i].size());
      }
    }
    out.state_size = n;
    out.state.resize(n);
    out.replay.resize(n);
    out.tables.assign(n * out.width, kBadPageIndex);
    for (size_t i = 0; i < n; ++i) {
      out.state[i] = step->entries[i].state_index;
      out.replay[i] = step->entries[i].replay_index;
      std::copy(rows[i].begin(), rows[i].end(),
                out.tables.begin() + static_cast<int64_t>(i * out.width));
    }
    resets_ = step->replay_resets;
    keep_copies(*step);
    return Status::ok();
  }

  std::unique_ptr<HybridCacheManager> h_;
  int device_ = 0;
  std::vector<int> devices_;
  // Requires mu_. A step's copies wait here until take_copies (none are lost between steps).
  void keep_copies(HybridCacheManager::Step& step) {
    for (EngineCopyBatch& b : step.copies) copies_.push_back(std::move(b));
  }

  std::mutex mu_;
  std::vector<int32_t> resets_;
  std::vector<EngineCopyBatch> copies_;
};

// Snapshot calls: where a chunk ends, commits, states inside a chunk (manager_snapshots.cc).
void bind_snapshots(nanobind::class_<Manager>& cls);

}  // namespace hybridkv::python
