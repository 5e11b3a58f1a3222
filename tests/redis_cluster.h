// A real Redis Cluster for the shared-tier tests: three masters and three replicas
// (redis-server from Debian, cluster mode, no persistence) on loopback ports the test picks,
// joined by `redis-cli --cluster create`, stopped and their files removed after. Masters can
// be killed for real (a replica takes over) and slots migrated by hand (MOVED and ASK).
#pragma once

#include <stdio.h>
#include <stdlib.h>

#include <filesystem>
#include <map>
#include <sstream>

#include "redis_server.h"

namespace hybridkv::testing {

class RedisCluster {
 public:
  // Nothing when redis-server or redis-cli is missing, or the cluster does not form.
  static std::unique_ptr<RedisCluster> start() {
    if (!RedisServer::installed() || ::access("/usr/bin/redis-cli", X_OK) != 0) return nullptr;
    auto c = std::unique_ptr<RedisCluster>(new RedisCluster());
    return c->form() ? std::move(c) : nullptr;
  }
  ~RedisCluster() {
    nodes_.clear();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // A store config that learns the cluster from the first node.
  RedisStoreConfig config() const {
    RedisStoreConfig c = nodes_.front()->config();
    c.cluster = true;
    return c;
  }

  // redis-cli against one node; its output.
  static std::string cli(uint16_t port, const std::string& args) {
    const std::string cmd = "redis-cli -p " + std::to_string(port) + " " + args + " 2>&1";
    std::string out;
    if (FILE* f = ::popen(cmd.c_str(), "r")) {
      char buf[4096];
      size_t n;
      while ((n = ::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
      ::pclose(f);
    }
    return out;
  }
  // A one-line answer without its line end.
  static std::string line(std::string out) {
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
    return out;
  }
  // redis-cli against the first node still running.
  std::string cli(const std::string& args) const { return cli(live_port(), args); }
  uint16_t live_port() const {
    for (const auto& n : nodes_) {
      if (n->alive()) return n->port();
    }
    return 0;
  }

  struct Node {
    std::string id;
    uint16_t port = 0;
    bool master = false;
    bool failed = false;
  };
  // CLUSTER NODES as one node sees it.
  std::vector<Node> topology(uint16_t via) const {
    std::vector<Node> out;
    std::istringstream in(cli(via, "cluster nodes"));
    for (std::string line; std::getline(in, line);) {
      std::istringstream f(line);
      Node n;
      std::string addr, flags;
      if (!(f >> n.id >> addr >> flags)) continue;
      n.port = static_cast<uint16_t>(std::stoi(addr.substr(addr.find(':') + 1)));
      n.master = flags.find("master") != std::string::npos;
      n.failed = flags.find("fail") != std::string::npos;
      out.push_back(n);
    }
    return out;
  }
  // The port of the master serving `slot` as the node on `via` sees it (0: none).
  uint16_t master_of(uint32_t slot, uint16_t via) const {
    std::istringstream in(cli(via, "cluster nodes"));
    for (std::string line; std::getline(in, line);) {
      std::istringstream f(line);
      std::string id, addr, flags, master, ping, pong, epoch, link, range;
      f >> id >> addr >> flags >> master >> ping >> pong >> epoch >> link;
      if (flags.find("master") == std::string::npos || flags.find("fail") != std::string::npos)
        continue;
      while (f >> range) {
        if (range.front() == '[') continue;  // a slot being migrated
        const size_t dash = range.find('-');
        const uint32_t lo = static_cast<uint32_t>(std::stoul(range.substr(0, dash)));
        const uint32_t hi = dash == std::string::npos
                                ? lo
                                : static_cast<uint32_t>(std::stoul(range.substr(dash + 1)));
        if (slot >= lo && slot <= hi)
          return static_cast<uint16_t>(std::stoi(addr.substr(addr.find(':') + 1)));
      }
    }
    return 0;
  }
  uint32_t slot_of(const std::string& key) const {
    return static_cast<uint32_t>(std::stoul(cli("cluster keyslot " + key)));
  }
  std::string id_of(uint16_t port) const { return line(cli(port, "cluster myid")); }
  std::vector<uint16_t> ports() const {
    std::vector<uint16_t> out;
    for (const auto& n : nodes_) out.push_back(n->port());
    return out;
  }
  // Kills the node on `port` for real (SIGKILL).
  void kill(uint16_t port) {
    for (auto& n : nodes_) {
      if (n && n->port() == port) n->kill();
    }
  }
  // The master on `port` has a replica that acknowledged every write made so far (WAIT answers
  // 1) within `seconds`. A replica still in its first sync answers 0: killing the master then
  // would lose the keys for good, which is data loss by the test, not by the store.
  static bool replicated(uint16_t port, int seconds) {
    for (int i = 0; i < seconds; ++i) {
      if (line(cli(port, "wait 1 1000")) == "1") return true;
    }
    return false;
  }
  // Every master has a replica online (its first sync done) within `seconds`.
  bool replicas_online(int seconds) const {
    for (int i = 0; i < seconds * 10; ++i) {
      int online = 0, masters = 0;
      for (const Node& n : topology(live_port())) {
        if (!n.master || n.failed) continue;
        ++masters;
        const std::string info = cli(n.port, "info replication");
        online += info.find("connected_slaves:1") != std::string::npos &&
                  info.find("state=online") != std::string::npos;
      }
      if (masters > 0 && online == masters) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
  // Every live node reports cluster_state:ok within `seconds`.
  bool wait_ok(int seconds, uint16_t skip = 0) const {
    for (int i = 0; i < seconds * 10; ++i) {
      bool ok = true;
      for (const auto& n : nodes_) {
        if (n->port() == skip) continue;
        ok = ok && cli(n->port(), "cluster info").find("cluster_state:ok") != std::string::npos;
      }
      if (ok) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

 private:
  // A port p with p + 10000 (the cluster bus) free too.
  static uint16_t cluster_port() {
    for (;;) {
      const uint16_t p = RedisServer::free_port();
      if (p >= 1024 && p < 55535) return p;
    }
  }

  bool form() {
    char tmpl[] = "/tmp/hkv-cluster-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return false;
    dir_ = tmpl;
    std::string create = "--cluster create";
    for (int i = 0; i < 6; ++i) {
      const uint16_t port = cluster_port();
      auto n = RedisServer::start({"--cluster-enabled", "yes", "--cluster-config-file",
                                   dir_ + "/nodes-" + std::to_string(port) + ".conf",
                                   "--cluster-node-timeout", "1000", "--dir", dir_},
                                  port);
      if (!n) return false;
      create += " 127.0.0.1:" + std::to_string(port);
      nodes_.push_back(std::move(n));
    }
    cli(create + " --cluster-replicas 1 --cluster-yes");
    return wait_ok(30) && replicas_online(30);
  }

  std::string dir_;
  std::vector<std::unique_ptr<RedisServer>> nodes_;
};

}  // namespace hybridkv::testing
