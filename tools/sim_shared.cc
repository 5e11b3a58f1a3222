// `hybridkv sim --shared-redis HOST:PORT --instance K/N`: the shared tier in the simulator.
// Each sim process is one serving instance; several on one Redis make a fleet.
#include <charconv>

#include "sim_internal.h"

#ifdef HKV_HAVE_REDIS
#include "hybridkv/shared_store.h"
#endif

namespace hybridkv::tools {

Result<std::pair<uint32_t, uint32_t>> parse_instance(const std::string& text) {
  const size_t slash = text.find('/');
  uint32_t k = 0, n = 0;
  const char* end = text.data() + text.size();
  if (slash == std::string::npos ||
      std::from_chars(text.data(), text.data() + slash, k).ec != std::errc{} ||
      std::from_chars(text.data() + slash + 1, end, n).ec != std::errc{} || n == 0 || k >= n) {
    return Status::invalid("--instance: '" + text + "' is not K/N with 0 <= K < N");
  }
  return std::pair{k, n};
}

std::vector<TraceRequest> instance_share(const std::vector<TraceRequest>& trace, uint32_t k,
                                         uint32_t n) {
  std::vector<TraceRequest> out;
  for (size_t i = k; i < trace.size(); i += n) out.push_back(trace[i]);
  return out;
}

Status add_shared_tier(const SimOptions& o, ServingConfig& serving) {
  if (o.shared_redis.empty()) return Status::ok();
  if (o.backend == "none") {
    return Status::invalid(
        "--shared-redis: the none backend has no bytes to share (use --backend "
        "host or cuda)");
  }
  const size_t colon = o.shared_redis.rfind(':');
  uint16_t port = 0;
  if (colon == std::string::npos || colon == 0 ||
      std::from_chars(o.shared_redis.data() + colon + 1,
                      o.shared_redis.data() + o.shared_redis.size(), port)
              .ec != std::errc{} ||
      port == 0) {
    return Status::invalid("--shared-redis: '" + o.shared_redis + "' is not host:port");
  }
#ifdef HKV_HAVE_REDIS
  RedisStoreConfig c;
  c.host = o.shared_redis.substr(0, colon);
  c.port = port;
  Result<std::unique_ptr<SharedStore>> store = open_redis_store(c);
  if (!store) return store.status();
  serving.shared.store = std::shared_ptr<SharedStore>(std::move(store).value().release());
  serving.shared.model_id = o.model;
  return Status::ok();
#else
  (void)serving;
  return Status::invalid("--shared-redis: this build has no Redis store (libhiredis-dev)");
#endif
}

}  // namespace hybridkv::tools
