// The progress line; see progress.hpp.
#include "progress.hpp"

#include <algorithm>
#include <cmath>
#include <ostream>

namespace attncheck::cli {

void ProgressLine::begin(const std::string& law) {
  ++begun_;
  const int n = std::max(applicable_, begun_);
  prefix_ = "[" + std::to_string(begun_) + "/" + std::to_string(n) + "] " + law + ": ";
  started_ = last_ = now_();
  drawn_ = false;
}

std::string ProgressLine::time_left(double current_law_share) const {
  const double elapsed = std::chrono::duration<double>(now_() - run_started_).count();
  const int n = std::max(applicable_, begun_);
  const double done = (std::max(begun_ - 1, 0) + std::clamp(current_law_share, 0.0, 1.0)) / std::max(n, 1);
  if (elapsed < 2 || done <= 0 || done >= 1) return "";
  // Each law's cases as costly as the run's so far: the rest takes elapsed · (1 - done) / done.
  const double left = elapsed * (1 - done) / done;
  if (left < 90) return "about " + std::to_string(std::max(1, int(std::lround(left)))) + " s left";
  if (left < 5400) return "about " + std::to_string(int(std::lround(left / 60))) + " min left";
  const long tenths = std::lround(left / 360);
  return "about " + std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + " h left";
}

void ProgressLine::update(const Progress& p) {
  if (!enabled_) return;
  const auto now = now_();
  if (now - started_ < std::chrono::seconds(1)) return;
  if (drawn_ && now - last_ < (terminal_ ? std::chrono::milliseconds(100) : std::chrono::milliseconds(1000))) return;
  last_ = now;
  drawn_ = true;
  std::string state = p.shrinking ? "falsified after " + std::to_string(p.cases_done + 1) + " cases; shrinking, " +
                                        std::to_string(p.shrink_steps) + " steps"
                                  : std::to_string(p.cases_done) + "/" + std::to_string(p.cases_total) + " cases";
  // A shrinking law counts as done: its cases are over, and how long shrinking takes says nothing of the rest.
  const double share = p.shrinking ? 1.0 : p.cases_total > 0 ? double(p.cases_done) / p.cases_total : 0.0;
  if (const std::string left = time_left(share); !left.empty()) state += "; " + left;
  if (terminal_) err_ << "\r\033[K" << prefix_ << state << std::flush;
  else err_ << prefix_ << state << "\n" << std::flush;
}

void ProgressLine::end() {
  if (drawn_ && terminal_) err_ << "\r\033[K" << std::flush;
  drawn_ = false;
}

}  // namespace attncheck::cli
