// The progress line on stderr: which law, cases done, shrinking. It appears only once a law has run for a
// second, so quick runs stay quiet, and it is redrawn at most ten times a second.
#pragma once

#include <chrono>
#include <iosfwd>
#include <string>

#include "attncheck/law.hpp"

namespace attncheck::cli {

class ProgressLine {
 public:
  /// `terminal`: redraw one line in place; otherwise print a line per update, at most one a second.
  ProgressLine(std::ostream& err, bool enabled, bool terminal) : err_(err), enabled_(enabled), terminal_(terminal) {}
  /// A law starts: the k-th of n.
  void begin(const std::string& law, int k, int n);
  /// RapidCheck reported progress of the current law.
  void update(const Progress& p);
  /// The current law finished: clears the line if one was drawn.
  void end();

 private:
  using Clock = std::chrono::steady_clock;
  std::ostream& err_;
  bool enabled_, terminal_;
  bool drawn_ = false;
  std::string prefix_;
  Clock::time_point started_, last_;
};

}  // namespace attncheck::cli
