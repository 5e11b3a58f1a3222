// ChunkedRows: rows of `width` elements in chunks of 4,096 rows that never move. Adding a row
// is O(1) and copies nothing (a vector's doubling moved every node of a million-block tree in
// one call: page faults and moves of tens of ms), and a row's elements stay contiguous.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace hybridkv {

template <typename T>
class ChunkedRows {
 public:
  explicit ChunkedRows(size_t width) : width_(width) {}

  size_t size() const { return rows_; }
  // A new row of value-initialized elements, at index size() - 1.
  void add_row() {
    if (rows_ % kRows == 0) {
      chunks_.emplace_back();
      chunks_.back().reserve(kRows * width_);  // the chunk's elements never move
    }
    chunks_.back().resize(chunks_.back().size() + width_);
    ++rows_;
  }
  std::span<T> row(size_t i) { return {&at(i), width_}; }
  std::span<const T> row(size_t i) const { return {&at(i), width_}; }
  // The row's first element (the row itself when width is 1).
  T& at(size_t i) { return chunks_[i >> kShift][(i & (kRows - 1)) * width_]; }
  const T& at(size_t i) const { return chunks_[i >> kShift][(i & (kRows - 1)) * width_]; }
  // As a table of rows' first elements (take_dense_id; width 1: a vector that never moves).
  T& operator[](size_t i) { return at(i); }
  const T& operator[](size_t i) const { return at(i); }
  void emplace_back() { add_row(); }

 private:
  static constexpr size_t kShift = 12, kRows = size_t{1} << kShift;
  size_t width_;
  size_t rows_ = 0;
  std::vector<std::vector<T>> chunks_;
};

}  // namespace hybridkv
