// The hybrid manager's snapshot calls: where a prefill chunk ends, the commits, and the states a
// chunked kernel writes inside a chunk (SnapshotPolicy::chunk_states).
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "py_manager.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace hybridkv::python {

void bind_snapshots(nb::class_<Manager>& cls) {
  cls.def(
         "next_snapshot_point",
         [](Manager& m, uint64_t id) {
           return value_or_raise(m.locked([&](auto& h) { return h.next_snapshot_point(id); }));
         },
         "request_id"_a,
         "Where the request's next prefill chunk should end (the snapshot policy; the prompt's "
         "end at most).")
      .def(
          "reserve_chunk_states",
          [](Manager& m, uint64_t id, uint64_t upto) {
            const std::vector<ChunkState> states =
                value_or_raise(m.locked([&](auto& h) { return h.reserve_chunk_states(id, upto); }));
            std::vector<std::tuple<uint64_t, int32_t>> out;
            for (const ChunkState& s : states) out.emplace_back(s.point, s.state_index);
            return out;
          },
          "request_id"_a, "upto"_a,
          "SnapshotPolicy.chunk_states: after resize, before the step, the states the kernel "
          "writes inside the chunk ending at upto, as (point, state_index) pairs: the state after "
          "point tokens goes into GPU slot state_index of the state group. commit_at_snapshot "
          "publishes them. Empty when the policy has no chunk states.")
      .def(
          "commit_at_snapshot",
          [](Manager& m, uint64_t id) {
            m.call([&](auto& h) { return h.commit_at_snapshot(id); });
          },
          "request_id"_a, "Publishes the prompt's computed tokens; states only at snapshot points.")
      .def(
          "commit_answer",
          [](Manager& m, uint64_t id, std::vector<int32_t> generated) {
            m.call([&](auto& h) { return h.commit_answer(id, generated); });
          },
          "request_id"_a, "generated"_a,
          "Publishes the rest of the prompt and the generated tokens, with a snapshot at history "
          "(chat).");
}

}  // namespace hybridkv::python
