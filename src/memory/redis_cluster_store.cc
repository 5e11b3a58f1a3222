// The shared tier on a Redis Cluster (hybridkv/shared_store.h, RedisStoreConfig::cluster).
//
// Routing: a key's hash slot is CRC16 (XMODEM) of the key, or of its {hash tag}, mod 16384;
// the slot map (CLUSTER SLOTS, read from any node that answers) names each slot's master. A
// batch is split by master and sent as one pipeline per master. A MOVED reply updates the map
// for its slot and the key is sent again to the new master; an ASK reply (a slot being
// migrated) sends the key once to the named node, preceded by ASKING, without changing the map.
// A master that does not answer fails its keys (a miss for the caller, within the timeout) and
// marks the map stale: the next call reads it again, so once a replica has taken over (the
// cluster's failover) its slots are served by it.
//
// Thread-safety: one mutex serializes every call.
#include <array>
#include <charconv>
#include <memory>
#include <mutex>
#include <string_view>

#include "hybridkv/shared_store.h"
#include "memory/redis_batch.h"
#include "memory/redis_connection.h"

namespace hybridkv::memory {

RedisTimeouts timeouts_of(const RedisStoreConfig& c);

namespace {

constexpr uint32_t kSlots = 16384;
constexpr int kMaxRedirects = 5;  // per key and call: a map changing faster than this fails it

uint16_t crc16(std::string_view s) {
  uint16_t crc = 0;
  for (char ch : s) {
    crc ^= static_cast<uint16_t>(static_cast<uint8_t>(ch) << 8);
    for (int b = 0; b < 8; ++b)
      crc = (crc & 0x8000) != 0 ? static_cast<uint16_t>((crc << 1) ^ 0x1021) : crc << 1;
  }
  return crc;
}

// The key's slot: only the part between the first '{' and the next '}' is hashed when it is
// not empty (a hash tag), as the cluster itself computes it.
uint32_t key_slot(std::string_view key) {
  const size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1)
      key = key.substr(open + 1, close - open - 1);
  }
  return crc16(key) % kSlots;
}

// "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381": the slot and the address.
struct Redirect {
  bool ask = false;
  uint32_t slot = 0;
  std::string host;
  uint16_t port = 0;
};

std::optional<Redirect> parse_redirect(const redisReply& r) {
  if (r.type != REDIS_REPLY_ERROR) return std::nullopt;
  const std::string_view text(r.str, r.len);
  Redirect out;
  std::string_view rest;
  if (text.starts_with("MOVED ")) {
    rest = text.substr(6);
  } else if (text.starts_with("ASK ")) {
    out.ask = true;
    rest = text.substr(4);
  } else {
    return std::nullopt;
  }
  const size_t space = rest.find(' ');
  const size_t colon = rest.rfind(':');
  if (space == std::string_view::npos || colon == std::string_view::npos || colon < space)
    return std::nullopt;
  if (std::from_chars(rest.data(), rest.data() + space, out.slot).ec != std::errc{} ||
      out.slot >= kSlots ||
      std::from_chars(rest.data() + colon + 1, rest.data() + rest.size(), out.port).ec !=
          std::errc{}) {
    return std::nullopt;
  }
  out.host = std::string(rest.substr(space + 1, colon - space - 1));
  return out;
}

class RedisClusterStore final : public SharedStore {
 public:
  explicit RedisClusterStore(const RedisStoreConfig& config)
      : timeouts_(timeouts_of(config)), seed_host_(config.host) {
    owner_.fill(-1);
    node(config.host, config.port);
  }

  std::vector<StoreOutcome> put(std::span<const std::string> keys,
                                std::span<const std::span<const std::byte>> values) override {
    return run({.op = KeyedBatch::Op::kPut, .keys = keys, .values = values});
  }
  std::vector<StoreOutcome> get(std::span<const std::string> keys,
                                std::span<const std::span<std::byte>> buffers,
                                std::span<uint64_t> sizes) override {
    return run({.op = KeyedBatch::Op::kGet, .keys = keys, .buffers = buffers, .sizes = sizes});
  }
  std::vector<StoreOutcome> exists(std::span<const std::string> keys) override {
    return run({.op = KeyedBatch::Op::kExists, .keys = keys});
  }
  std::vector<StoreOutcome> remove(std::span<const std::string> keys) override {
    return run({.op = KeyedBatch::Op::kRemove, .keys = keys});
  }

  // Answers when a node gives the slot map and every slot has a master.
  Status ping() override {
    std::lock_guard lock(mu_);
    if (!refresh()) {
      return Status(StatusCode::kIoError, "redis cluster via " + nodes_.front()->address() +
                                              ": no node gave the slot map (" + last_error_ + ")");
    }
    for (uint32_t s = 0; s < kSlots; ++s) {
      if (owner_[s] < 0) {
        return Status(StatusCode::kIoError, "redis cluster via " + nodes_.front()->address() +
                                                ": slot " + std::to_string(s) + " has no master");
      }
    }
    return Status::ok();
  }

  StoreStats stats() const override {
    std::lock_guard lock(mu_);
    StoreStats s = stats_;
    for (const auto& n : nodes_) s.reconnects += n->reconnects();
    return s;
  }

 private:
  struct Pending {
    size_t key;
    int node;
    bool asking;
    int redirects;
  };

  std::vector<StoreOutcome> run(const KeyedBatch& b) {
    std::lock_guard lock(mu_);
    b.count_calls(stats_);
    if (stale_) refresh();
    std::vector<StoreOutcome> out(b.keys.size(), StoreOutcome::kFailed);
    std::vector<Pending> pending;
    pending.reserve(b.keys.size());
    for (size_t i = 0; i < b.keys.size(); ++i)
      pending.push_back({i, owner_[key_slot(b.keys[i])], false, 0});
    while (!pending.empty()) pending = send_round(b, pending, out);
    return out;
  }

  // Sends every pending key to its node, one pipeline per node; returns the redirected keys.
  std::vector<Pending> send_round(const KeyedBatch& b, const std::vector<Pending>& pending,
                                  std::vector<StoreOutcome>& out) {
    std::vector<Pending> next;
    std::vector<std::vector<const Pending*>> by_node(nodes_.size());
    for (const Pending& p : pending) {
      if (p.node < 0 || p.redirects > kMaxRedirects) {
        out[p.key] = b.outcome(p.key, nullptr, stats_);
        stale_ = true;
        continue;
      }
      by_node[static_cast<size_t>(p.node)].push_back(&p);
    }
    for (size_t n = 0; n < by_node.size(); ++n) {
      if (!by_node[n].empty()) send_to_node(b, static_cast<int>(n), by_node[n], out, next);
    }
    return next;
  }

  void send_to_node(const KeyedBatch& b, int n, const std::vector<const Pending*>& keys,
                    std::vector<StoreOutcome>& out, std::vector<Pending>& next) {
    static const std::string kAsking = "ASKING";
    std::vector<RedisCommand> commands;
    for (const Pending* p : keys) {
      if (p->asking) commands.emplace_back().add(kAsking);
      commands.push_back(b.command(p->key));
    }
    const std::vector<Reply> replies = nodes_[static_cast<size_t>(n)]->pipeline(commands);
    size_t at = 0;
    for (const Pending* p : keys) {
      if (p->asking) ++at;  // ASKING's own +OK
      const redisReply* r = replies[at++].get();
      if (r == nullptr) stale_ = true;  // the node is away: read the map again next call
      const std::optional<Redirect> to = r != nullptr ? parse_redirect(*r) : std::nullopt;
      if (!to) {
        out[p->key] = b.outcome(p->key, r, stats_);
        continue;
      }
      ++stats_.redirects;
      const int dst = node(to->host.empty() ? seed_host_ : to->host, to->port);
      if (!to->ask) owner_[to->slot] = dst;
      next.push_back({p->key, dst, to->ask, p->redirects + 1});
    }
  }

  // Reads the slot map from the first node that gives it. Requires mu_.
  bool refresh() {
    static const std::string kCluster = "CLUSTER", kSlotsArg = "SLOTS";
    RedisCommand c;
    c.add(kCluster);
    c.add(kSlotsArg);
    for (size_t n = 0; n < nodes_.size(); ++n) {
      const Reply r = nodes_[n]->command(c);
      if (!r || r->type != REDIS_REPLY_ARRAY) {
        last_error_ = r ? "unexpected reply to CLUSTER SLOTS" : nodes_[n]->last_error();
        continue;
      }
      read_slot_map(*r, nodes_[n]->host());
      ++stats_.slot_refreshes;
      stale_ = false;
      return true;
    }
    return false;
  }

  // CLUSTER SLOTS: [[start, end, [host, port, id, ...], replicas...], ...].
  void read_slot_map(const redisReply& r, const std::string& asked_host) {
    owner_.fill(-1);
    for (size_t i = 0; i < r.elements; ++i) {
      const redisReply& range = *r.element[i];
      if (range.type != REDIS_REPLY_ARRAY || range.elements < 3) continue;
      const redisReply& master = *range.element[2];
      if (master.type != REDIS_REPLY_ARRAY || master.elements < 2) continue;
      std::string host(master.element[0]->str, master.element[0]->len);
      if (host.empty() || host == "?") host = asked_host;
      const int n = node(host, static_cast<uint16_t>(master.element[1]->integer));
      for (long long s = range.element[0]->integer; s <= range.element[1]->integer; ++s) {
        if (s >= 0 && s < kSlots) owner_[static_cast<size_t>(s)] = n;
      }
    }
  }

  // The index of the node at host:port (added when new).
  int node(const std::string& host, uint16_t port) {
    for (size_t n = 0; n < nodes_.size(); ++n) {
      if (nodes_[n]->host() == host && nodes_[n]->port() == port) return static_cast<int>(n);
    }
    nodes_.push_back(std::make_unique<RedisConnection>(host, port, timeouts_));
    return static_cast<int>(nodes_.size() - 1);
  }

  const RedisTimeouts timeouts_;
  const std::string seed_host_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<RedisConnection>> nodes_;  // the seed first
  std::array<int, kSlots> owner_;                        // per slot: its master's node index
  bool stale_ = true;                                    // read the slot map before the next call
  std::string last_error_;
  StoreStats stats_;
};

}  // namespace

std::unique_ptr<SharedStore> make_redis_cluster_store(const RedisStoreConfig& config) {
  return std::make_unique<RedisClusterStore>(config);
}

}  // namespace hybridkv::memory
