// The one rule for dense tables addressed by small ids (pages, tree nodes, caches): a new entry
// reuses the most recently freed id, else the table grows by one.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

namespace hybridkv {

// Returns the id of a default-constructed entry of `table` (a std::vector or a ChunkedRows).
// Id: uint32_t or a StrongId.
template <typename Id, typename Table>
Id take_dense_id(Table& table, std::vector<Id>& free_ids) {
  using T = std::remove_reference_t<decltype(table[0])>;
  if (!free_ids.empty()) {
    const Id id = free_ids.back();
    free_ids.pop_back();
    if constexpr (std::is_integral_v<Id>) {
      table[id] = T{};
    } else {
      table[id.value] = T{};
    }
    return id;
  }
  table.emplace_back();
  return Id(static_cast<uint32_t>(table.size() - 1));
}

}  // namespace hybridkv
