// splitmix64's finalizer (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014): a
// bijection of 64-bit words in which every output bit depends on every input bit, and whose outputs pass BigCrush.
// What spreads a number drawn from RapidCheck over coordinates, cells and pages (the randomness itself comes from
// RapidCheck alone).
#pragma once

#include <cstdint>

namespace attncheck {

inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace attncheck
