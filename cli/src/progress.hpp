// The progress line on stderr: which of the applicable laws, cases done or shrinking, and the time left estimated
// from the run so far. It appears only once a law has run for a second, so quick runs stay quiet, and it is
// redrawn at most ten times a second.
#pragma once

#include <chrono>
#include <functional>
#include <iosfwd>
#include <string>

#include "attncheck/law.hpp"

namespace attncheck::cli {

class ProgressLine {
 public:
  using Clock = std::chrono::steady_clock;
  /// `terminal`: redraw one line in place; otherwise print a line per update, at most one a second. `now`: the
  /// clock (a test's own).
  ProgressLine(std::ostream& err, bool enabled, bool terminal, std::function<Clock::time_point()> now = Clock::now)
      : err_(err), enabled_(enabled), terminal_(terminal), now_(std::move(now)), run_started_(now_()) {}
  /// The run checks `applicable` laws (those not n/a: an n/a law reports no progress and is not counted).
  void set_applicable(int applicable) { applicable_ = applicable; }
  /// A law starts.
  void begin(const std::string& law);
  /// RapidCheck reported progress of the current law.
  void update(const Progress& p);
  /// The current law finished: clears the line if one was drawn.
  void end();
  /// "about 40 s left" from the time so far and the share of the run done (laws done, then the current law's
  /// cases); "" before 2 s, before anything is done, and once every law's cases are.
  std::string time_left(double current_law_share) const;

 private:
  std::ostream& err_;
  bool enabled_, terminal_;
  std::function<Clock::time_point()> now_;
  Clock::time_point run_started_;
  int applicable_ = 0, begun_ = 0;
  bool drawn_ = false;
  std::string prefix_;
  Clock::time_point started_, last_;
};

}  // namespace attncheck::cli
