// The progress line; see progress.hpp.
#include "progress.hpp"

#include <ostream>

namespace attncheck::cli {

void ProgressLine::begin(const std::string& law, int k, int n) {
  prefix_ = "[" + std::to_string(k) + "/" + std::to_string(n) + "] " + law + ": ";
  started_ = last_ = Clock::now();
  drawn_ = false;
}

void ProgressLine::update(const Progress& p) {
  if (!enabled_) return;
  const auto now = Clock::now();
  if (now - started_ < std::chrono::seconds(1)) return;
  if (drawn_ && now - last_ < (terminal_ ? std::chrono::milliseconds(100) : std::chrono::milliseconds(1000))) return;
  last_ = now;
  drawn_ = true;
  const std::string state = p.shrinking ? "falsified after " + std::to_string(p.cases_done + 1) +
                                              " cases; shrinking, " + std::to_string(p.shrink_steps) + " steps"
                                        : std::to_string(p.cases_done) + "/" + std::to_string(p.cases_total) + " cases";
  if (terminal_) err_ << "\r\033[K" << prefix_ << state << std::flush;
  else err_ << prefix_ << state << "\n" << std::flush;
}

void ProgressLine::end() {
  if (drawn_ && terminal_) err_ << "\r\033[K" << std::flush;
  drawn_ = false;
}

}  // namespace attncheck::cli
