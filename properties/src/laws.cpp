#include "attncheck/law.hpp"
namespace attncheck {
const std::vector<Law>& laws() { static const std::vector<Law> all; return all; }
const Law* find_law(std::string_view name) {
  for (const auto& l : laws()) if (l.name == name) return &l;
  return nullptr;
}
}  // namespace attncheck
