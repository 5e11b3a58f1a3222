#include "memory/cuda_memory.h"

#include <cudaTypedefs.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "hybridkv/units.h"

namespace hybridkv::memory::cuda {
namespace {

// The driver's VMM entry points, found through the runtime: the library links no libcuda, so
// programs built with CUDA still start on machines without a driver.
struct Driver {
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemAddressReserve_v10020 reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  Status status;
};

template <typename F>
Status load(const char* name, F& fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  const cudaError_t e =
      cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found);
  if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || p == nullptr) {
    return Status::invalid(std::string("cuda backend: the driver has no ") + name + " (" +
                           cudaGetErrorString(e) + ")");
  }
  fn = reinterpret_cast<F>(p);
  return Status::ok();
}

const Driver& driver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] {
    for (Status s : {load("cuMemCreate", d.create), load("cuMemRelease", d.release),
                     load("cuMemAddressReserve", d.reserve),
                     load("cuMemAddressFree", d.address_free), load("cuMemMap", d.map),
                     load("cuMemUnmap", d.unmap), load("cuMemSetAccess", d.set_access),
                     load("cuMemGetAllocationGranularity", d.granularity)}) {
      if (!s && d.status) d.status = s;
    }
  });
  return d;
}

Status cu_status(CUresult r, const std::string& what) {
  if (r == CUDA_SUCCESS) return Status::ok();
  const StatusCode code =
      r == CUDA_ERROR_OUT_OF_MEMORY ? StatusCode::kOutOfPages : StatusCode::kInvalidArgument;
  return Status(code, "cuda backend: " + what + " failed (CUresult " + std::to_string(r) + ")");
}

CUmemAllocationProp device_prop(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

uint64_t round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

}  // namespace

Status cuda_status(cudaError_t error, const std::string& what) {
  if (error == cudaSuccess) return Status::ok();
  const StatusCode code =
      error == cudaErrorMemoryAllocation ? StatusCode::kOutOfPages : StatusCode::kInvalidArgument;
  return Status(code, "cuda backend: " + what + ": " + cudaGetErrorString(error));
}

Result<std::unique_ptr<Reservation>> Reservation::make(TierKind tier, int device, uint64_t bytes,
                                                       uint64_t chunk) {
  std::unique_ptr<Reservation> r(new Reservation());
  r->tier_ = tier;
  r->device_ = device;
  uint64_t granularity = 2ull << 20;
  if (tier == TierKind::kGpu) {
    const Driver& d = driver();
    if (!d.status) return d.status;
    const CUmemAllocationProp prop = device_prop(device);
    size_t g = 0;
    if (Status s = cu_status(d.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                             "cuMemGetAllocationGranularity");
        !s) {
      return s;
    }
    granularity = std::max<uint64_t>(g, 1);
  }
  r->chunk_ = round_up(std::max<uint64_t>(chunk, granularity), granularity);
  r->reserved_ = round_up(std::max<uint64_t>(bytes, 1), r->chunk_);
  if (tier == TierKind::kGpu) {
    CUdeviceptr p = 0;
    if (Status s = cu_status(driver().reserve(&p, r->reserved_, r->chunk_, 0, 0),
                             "reserving " + format_bytes(r->reserved_) + " of address space");
        !s) {
      return s;
    }
    r->base_ = reinterpret_cast<std::byte*>(p);
  } else {
    void* p =
        mmap(nullptr, r->reserved_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      return Status(StatusCode::kOutOfPages, "cuda backend: reserving " +
                                                 format_bytes(r->reserved_) +
                                                 " of host address space: " + strerror(errno));
    }
    r->base_ = static_cast<std::byte*>(p);
  }
  return r;
}

Reservation::~Reservation() {
  decommit(0);
  if (base_ == nullptr) return;
  if (tier_ == TierKind::kGpu) {
    driver().address_free(reinterpret_cast<CUdeviceptr>(base_), reserved_);
  } else {
    munmap(base_, reserved_);
  }
}

Status Reservation::commit(uint64_t bytes) {
  const uint64_t want = round_up(bytes, chunk_) / chunk_;
  if (want * chunk_ > reserved_) {
    return Status(StatusCode::kRefused, "cuda backend: " + format_bytes(bytes) +
                                            " exceed the reserved " + format_bytes(reserved_));
  }
  const uint64_t before = chunks_;
  while (chunks_ < want) {
    if (Status s = map_chunk(chunks_); !s) {
      decommit(before * chunk_);
      return s;
    }
    ++chunks_;
  }
  return Status::ok();
}

void Reservation::decommit(uint64_t bytes) {
  const uint64_t keep = round_up(bytes, chunk_) / chunk_;
  while (chunks_ > keep) unmap_chunk(--chunks_);
}

Status Reservation::map_chunk(uint64_t index) {
  std::byte* at = base_ + index * chunk_;
  const std::string what =
      "committing " + format_bytes(chunk_) + " of " + tier_kind_name(tier_) + " memory";
  if (tier_ != TierKind::kGpu) {
    if (mprotect(at, chunk_, PROT_READ | PROT_WRITE) != 0) {
      return Status(StatusCode::kOutOfPages, "cuda backend: " + what + ": " + strerror(errno));
    }
    const cudaError_t e =
        cudaHostRegister(at, chunk_, cudaHostRegisterMapped | cudaHostRegisterPortable);
    if (e != cudaSuccess) {
      mprotect(at, chunk_, PROT_NONE);
      return cuda_status(e, what + " (cudaHostRegister)");
    }
    return Status::ok();
  }
  const Driver& d = driver();
  const CUmemAllocationProp prop = device_prop(device_);
  CUmemGenericAllocationHandle h{};
  if (Status s = cu_status(d.create(&h, chunk_, &prop, 0), what + " (cuMemCreate)"); !s) return s;
  const CUdeviceptr p = reinterpret_cast<CUdeviceptr>(at);
  if (Status s = cu_status(d.map(p, chunk_, 0, h, 0), what + " (cuMemMap)"); !s) {
    d.release(h);
    return s;
  }
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (Status s = cu_status(d.set_access(p, chunk_, &access, 1), what + " (cuMemSetAccess)"); !s) {
    d.unmap(p, chunk_);
    d.release(h);
    return s;
  }
  handles_.push_back(h);
  return Status::ok();
}

void Reservation::unmap_chunk(uint64_t index) {
  std::byte* at = base_ + index * chunk_;
  if (tier_ != TierKind::kGpu) {
    cudaHostUnregister(at);
    madvise(at, chunk_, MADV_DONTNEED);
    mprotect(at, chunk_, PROT_NONE);
    return;
  }
  const Driver& d = driver();
  d.unmap(reinterpret_cast<CUdeviceptr>(at), chunk_);
  d.release(handles_.back());
  handles_.pop_back();
}

}  // namespace hybridkv::memory::cuda
