// The shared tier's Redis store through the installed package (hybridkv::shared): a refused
// configuration names its field; a store with no server answers ping() with an error naming
// the address. Exits 0 when both hold.
#include <cstdio>
#include <string>

#include <hybridkv/shared_store.h>

int main() {
  hybridkv::RedisStoreConfig bad;
  bad.port = 0;
  const auto refused = hybridkv::open_redis_store(bad);
  if (refused || refused.status().message().find("port") == std::string::npos) {
    std::fprintf(stderr, "consumer_shared: port 0 was not refused by name\n");
    return 1;
  }
  hybridkv::RedisStoreConfig none;
  none.port = 1;  // nothing listens there
  auto store = hybridkv::open_redis_store(none);
  if (!store) return 1;
  const hybridkv::Status ping = (*store)->ping();
  std::printf("consumer_shared: %s\n", ping.to_string().c_str());
  return !ping && ping.message().find("127.0.0.1:1") != std::string::npos ? 0 : 1;
}
