// A real redis-server (Debian's) for the shared-tier tests: started on a loopback port it picks,
// without persistence, and stopped after; the fault tests kill, freeze and restart it for real.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "hybridkv/shared_store.h"

extern char** environ;

namespace hybridkv::testing {

class RedisServer {
 public:
  // Nothing when redis-server is not installed (the caller skips; CI installs it). `extra`:
  // more arguments (a cluster node's); port 0: one the system picks.
  static std::unique_ptr<RedisServer> start(std::vector<std::string> extra = {},
                                            uint16_t port = 0) {
    if (!installed()) return nullptr;
    auto server = std::unique_ptr<RedisServer>(
        new RedisServer(port != 0 ? port : free_port(), std::move(extra)));
    if (!server->launch()) return nullptr;
    return server;
  }
  static bool installed() { return ::access("/usr/bin/redis-server", X_OK) == 0; }
  // A loopback port nothing listens on now.
  static uint16_t free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
  }

  ~RedisServer() { stop(SIGKILL); }

  uint16_t port() const { return port_; }
  RedisStoreConfig config() const {
    RedisStoreConfig c;
    c.port = port_;
    c.timeout = std::chrono::milliseconds(300);
    c.reconnect_backoff = std::chrono::milliseconds(20);
    c.max_reconnect_backoff = std::chrono::milliseconds(200);
    return c;
  }

  void kill() { stop(SIGKILL); }
  bool alive() const { return pid_ > 0; }
  void freeze() { ::kill(pid_, SIGSTOP); }
  void thaw() { ::kill(pid_, SIGCONT); }
  // Starts it again on the same port (empty: no persistence).
  bool restart() {
    stop(SIGKILL);
    return launch();
  }

 private:
  RedisServer(uint16_t port, std::vector<std::string> extra)
      : port_(port), extra_(std::move(extra)) {}

  bool launch() {
    const std::string port = std::to_string(port_);
    std::vector<std::string> args = {"redis-server", "--port",      port,    "--bind",
                                     "127.0.0.1",    "--save",      "",      "--appendonly",
                                     "no",           "--dir",       "/tmp",  "--loglevel",
                                     "warning",      "--maxmemory", "512mb", "--maxmemory-policy",
                                     "allkeys-lru"};
    args.insert(args.end(), extra_.begin(), extra_.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t io;
    posix_spawn_file_actions_init(&io);
    posix_spawn_file_actions_addopen(&io, 1, "/dev/null", O_WRONLY, 0);
    const int rc = posix_spawn(&pid_, "/usr/bin/redis-server", &io, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&io);
    if (rc != 0) return false;
    // Up when it answers PING (a few milliseconds; 5 s at most).
    Result<std::unique_ptr<SharedStore>> probe = open_redis_store(config());
    for (int i = 0; i < 500; ++i) {
      if (probe && (*probe)->ping().is_ok()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  void stop(int signal) {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, signal);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  uint16_t port_;
  std::vector<std::string> extra_;
  pid_t pid_ = -1;
};

}  // namespace hybridkv::testing
