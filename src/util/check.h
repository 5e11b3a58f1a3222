// HKV_CHECK: aborts with a message when an internal invariant is broken. Never used for bad user
// input (that is a Status); only for states the library itself must never reach.
#pragma once

#include <cstdio>
#include <cstdlib>

#define HKV_CHECK(cond, ...)                                                                    \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      std::fprintf(stderr, "hybridkv: check failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, "hybridkv: " __VA_ARGS__);                                           \
      std::fprintf(stderr, "\n");                                                               \
      std::abort();                                                                             \
    }                                                                                           \
  } while (0)
