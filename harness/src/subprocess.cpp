// The parent side of the exec: protocol. One child serves every call; a crash, a hang past the per-call
// timeout, or a broken frame becomes an ImplementationError, and the next call starts a fresh child.
#include "subprocess.hpp"

#include <fcntl.h>
#include <linux/sockios.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <thread>

#include "attncheck/allocator.hpp"
#include "attncheck/cancel.hpp"
#include "attncheck/format.hpp"
#include "attncheck/law.hpp"
#include "c_plugin.hpp"
#include "descendants.hpp"
#include "protocol.hpp"

extern char** environ;

namespace attncheck::detail {
namespace {

using Clock = std::chrono::steady_clock;
using Kind = ImplementationError::Kind;

// How much of the child's stderr is kept for messages: enough for a Python traceback's last lines.
constexpr std::size_t kStderrTail = 2000;
// After this many failed starts in a row (a crash or a hang before the handshake ended), the implementation
// is given up: every later call fails at once with what the last start printed, instead of waiting for a
// start-up timeout each.
constexpr int kMaxFailedStarts = 3;
// The phase of a child that finished its handshake (for messages: "... during the call").
constexpr const char* kInCall = "during the call";
// After the first timeout of a run, a call may take this many times the slowest answer seen so far, and at
// least kMinDerivedTimeout: a hang then costs about a second instead of the configured timeout, so shrinking
// a hanging case (one timeout per candidate) stays short, while a call as slow as the slowest one that
// answered still has room to spare.
constexpr double kSlowestFactor = 4;
constexpr double kMinDerivedTimeout = 1;

// Our environment, with attncheck's Python client (attncheck_plugin.py) importable by the children: its
// folder is appended to PYTHONPATH, so `exec:python3 my_attention.py` needs no setup.
std::vector<std::string> child_environment() {
  std::vector<std::string> env;
  std::string pythonpath, tunables;
  bool has_tunables = false;
  for (char** e = environ; *e; ++e) {
    if (std::strncmp(*e, "PYTHONPATH=", 11) == 0)
      pythonpath = *e + 11;
    else if (std::strncmp(*e, "GLIBC_TUNABLES=", 15) == 0) {
      tunables = *e + 15;
      has_tunables = true;
    } else
      env.emplace_back(*e);
  }
  if (const std::string dir = python_client_dir(); !dir.empty())
    pythonpath += (pythonpath.empty() ? "" : ":") + dir;
  if (!pythonpath.empty()) env.push_back("PYTHONPATH=" + pythonpath);
  // The child's allocator keeps what a call frees for the next call (attncheck/allocator.hpp), unless the user
  // set that tunable: theirs wins.
  for (const char* const* t = freed_memory_tunables(); *t; ++t) {
    const std::string_view entry = *t, key = entry.substr(0, entry.find('=') + 1);
    if (tunables.find(key) == std::string::npos) tunables += (tunables.empty() ? "" : ":") + std::string(entry);
  }
  if (!tunables.empty() || has_tunables) env.push_back("GLIBC_TUNABLES=" + tunables);
  // The plug-in host checks it was not orphaned before its parent-death signal took effect.
  std::erase_if(env, [](const std::string& e) { return e.starts_with("ATTNCHECK_PARENT_PID="); });
  env.push_back("ATTNCHECK_PARENT_PID=" + std::to_string(::getpid()));
  return env;
}

// The children (plug-in host guards) of every live ExecImplementation in this process: when attncheck is a
// subreaper, anything else among its descendants is an orphan some plug-in left behind, and is ended.
std::mutex g_children_mu;
std::vector<pid_t> g_children;

void remove_child(pid_t pid) {
  std::lock_guard lock(g_children_mu);
  std::erase(g_children, pid);
}

// Ends whatever was re-parented to this process (a subreaper) by a plug-in tree that was killed outright,
// sparing the live guards and their trees. Without the subreaper there is nothing to adopt.
void end_orphans() {
  if (!is_subreaper()) return;
  std::lock_guard lock(g_children_mu);
  end_descendants(g_children.data(), static_cast<int>(g_children.size()));
}

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "was killed by signal " + std::to_string(sig) + " (" + ::strsignal(sig) + ")";
  }
  if (WIFEXITED(status)) {
    const int code = WEXITSTATUS(status);
    // exec: runs the command through /bin/sh, which reports a child killed by signal N as status 128 + N.
    if (code > 128 && code < 128 + 32)
      return "exited with status " + std::to_string(code) +
             " (the shell's way of saying its command was killed by signal " + std::to_string(code - 128) + ", " +
             ::strsignal(code - 128) + ")";
    return "exited with status " + std::to_string(code);
  }
  return "stopped (status " + std::to_string(status) + ")";
}

class ExecImplementation final : public Implementation {
 public:
  ExecImplementation(std::string name, std::vector<std::string> argv, const HarnessOptions& opts)
      : name_(std::move(name)), argv_(std::move(argv)), opts_(opts) {
    try {
      const wire::Handshake h = start();
      caps_ = h.caps;
      // The plug-in host names its implementation as we do ("plugin:PATH"); other children name their own.
      description_ = printable_text(
          h.name == name_ ? h.description : h.name + (h.description.empty() ? "" : ": " + h.description));
    } catch (const ImplementationError& e) {
      // An interrupt ends the child it is starting (the signal handler ends every descendant), which is no
      // fault of the implementation's: the run stops as interrupted, not as a bad --impl.
      if (stop_requested()) throw Cancelled(name_ + ": interrupted while starting the implementation");
      throw SpecError(e.what());
    }
  }
  ~ExecImplementation() override { stop(/*gently=*/true); }

  const std::string& name() const override { return name_; }
  const std::string& description() const override { return description_; }
  const Capabilities& capabilities() const override { return caps_; }

  Outcome forward(const Problem& p) const override {
    // A child of version 1 declares none of version 2's capabilities, so its calls never use version 2's
    // fields: a forward frame without them is the same at both versions; likewise version 3's modifiers, LSE
    // and causal = false for a child of version 2.
    check_within_capabilities(p, caps_, name_, false);
    std::lock_guard lock(mu_);
    check_in_step();
    ensure_started();
    const Shape qs = p.q.shape();
    const Shape want_w{qs.B, qs.H, qs.T, p.k.shape().T}, lse_shape{qs.B, qs.H, qs.T, 1};
    const bool want_lse = p.want_lse && caps_.declares(Feature::lse);  // asked only of a child that declared it
    Problem call = p;
    call.want_lse = want_lse;
    const std::size_t es = wire::element_size(p.dtype);
    // A wrong-size answer up to twice the expected size is decoded and reported as such; beyond that the
    // frame is refused unread.
    const std::size_t expected = std::size_t(p.output_shape().numel() + want_w.numel()) * es + std::size_t(lse_shape.numel()) * 8;
    const std::string payload =
        timed_exchange(wire::encode_forward(call), wire::FrameType::result, 2 * expected + (1u << 20));
    wire::Result r;
    try {
      r = wire::decode_result(payload, p.dtype);
    } catch (const wire::ProtocolError& e) {
      stop(false);
      throw ImplementationError(Kind::protocol, name_ + ": " + e.what());
    }
    throw_on_failure(r.status, r.message);
    const Shape os = p.output_shape();  // [B,H,T_q,D_v]
    const std::array<std::int64_t, 4> want_out{os.B, os.H, os.T, os.D};
    if (r.out_shape != want_out)
      throw ImplementationError(Kind::wrong_size, name_ + ": output is " + wire::shape_string(r.out_shape) +
                                                      (os == qs ? " but q is " + to_string(qs) + " (the output must have q's shape)"
                                                                : " but must be " + to_string(os) + " ([B,H,T_q,D_v])"));
    Outcome o;
    o.output = wire::from_bytes(r.out_bytes, os, p.dtype);
    if (r.has_weights) {
      const std::array<std::int64_t, 4> want{want_w.B, want_w.H, want_w.T, want_w.D};
      if (r.w_shape != want)
        throw ImplementationError(Kind::wrong_size, name_ + ": weights are " + wire::shape_string(r.w_shape) +
                                                        " but must be " + to_string(want_w) + " ([B,H,T_q,T_k])");
      if (p.want_weights) o.weights = wire::from_bytes(r.w_bytes, want_w, p.dtype);
    } else if (p.want_weights && caps_.returns_weights) {
      throw ImplementationError(Kind::wrong_size, name_ +
                                                      ": returned no weights although its handshake says it "
                                                      "returns them and this call asked for them");
    }
    if (r.has_lse) {
      if (r.lse_shape != std::array<std::int64_t, 4>{qs.B, qs.H, qs.T, 1})
        throw ImplementationError(Kind::wrong_size, name_ + ": lse is " + wire::shape_string(r.lse_shape) +
                                                        " but must be " + to_string(lse_shape) +
                                                        " ([B,H,T_q,1], one per query row)");
      if (want_lse) o.lse = wire::from_bytes(r.lse_bytes, lse_shape, DType::f64);
    } else if (want_lse) {
      throw ImplementationError(Kind::wrong_size, name_ +
                                                      ": returned no LSE although its handshake declares it (flags3 "
                                                      "0x1) and this call asked for it");
    }
    return o;
  }

  Gradients backward(const Problem& p) const override {
    if (!caps_.declares(Feature::backward)) return Implementation::backward(p);
    if (!p.d_output) throw std::logic_error(name_ + ": a backward call needs Problem::d_output");
    check_within_capabilities(p, caps_, name_, true);
    std::lock_guard lock(mu_);
    check_in_step();
    ensure_started();
    const Shape qs = p.q.shape(), ks = p.k.shape();
    // As for a forward: a wrong-size answer up to twice the expected size is decoded and reported as such.
    const std::size_t expected =
        std::size_t(qs.numel() + ks.numel() + p.v.shape().numel() + (p.bias ? Index(p.bias->values.size()) : 0)) *
            wire::element_size(p.dtype) +
        std::size_t(qs.H) * 8;
    const std::string payload =
        timed_exchange(wire::encode_backward(p), wire::FrameType::gradients, 2 * expected + (1u << 20));
    wire::GradientsResult r;
    try {
      r = wire::decode_gradients(payload, p.dtype);
    } catch (const wire::ProtocolError& e) {
      stop(false);
      throw ImplementationError(Kind::protocol, name_ + ": " + e.what());
    }
    throw_on_failure(r.status, r.message);
    const char* names[] = {"dq", "dk", "dv"};
    const Shape want[] = {qs, ks, p.v.shape()};
    Gradients g;
    Tensor<double>* parts[] = {&g.dq, &g.dk, &g.dv};
    for (std::size_t i = 0; i < 3; ++i) {
      const Shape& w = want[i];
      if (r.shapes[i] != std::array<std::int64_t, 4>{w.B, w.H, w.T, w.D})
        throw ImplementationError(
            Kind::wrong_size,
            name_ + ": " + names[i] + " is " + wire::shape_string(r.shapes[i]) + " but must be " + to_string(w) +
                (i == 0 ? std::string(" (the shape of q)")
                        : " (the shape of " + std::string(i == 1 ? "k, [B,H_kv,T_k,D]" : "v, [B,H_kv,T_k,D_v]") +
                              ": a kv head's gradient sums over the " + std::to_string(qs.H / ks.H) +
                              " query heads of its group)"));
      *parts[i] = wire::from_bytes(r.bytes[i], w, p.dtype);
    }
    // d_sinks: as many as came (check_gradients_shape names a count other than H); none asked, none kept.
    if (r.d_sinks && !p.sinks.empty()) g.dsinks = std::move(*r.d_sinks);
    // d_bias: in the bias's shape (check_gradients_shape names a missing one where dBias is declared).
    if (r.d_bias_shape && p.bias) {
      const Shape want{p.bias->B, p.bias->H, p.bias->T_q, p.bias->T_k};
      if (*r.d_bias_shape != std::array<std::int64_t, 4>{want.B, want.H, want.T, want.D})
        throw ImplementationError(
            Kind::wrong_size, name_ + ": d_bias is " + wire::shape_string(*r.d_bias_shape) + " but must be " +
                                  to_string(want) + " (the bias's shape: dS summed over the axes it broadcasts over)");
      g.dbias = wire::from_bytes(r.d_bias_bytes, want, p.dtype);
    }
    return g;
  }

  std::string unavailable() const override {
    std::lock_guard lock(mu_);
    return given_up_;
  }

 private:
  // A fresh child after the last one was killed (a crash, a hang, garbage). After kMaxFailedStarts failed
  // starts in a row the implementation is given up: this call and every later one fail at once.
  void ensure_started() const {
    if (pid_ >= 0) return;
    if (!given_up_.empty()) throw ImplementationError(Kind::unavailable, given_up_);
    // A failed start says nothing about the case at hand: it is "not started", which the runner never
    // takes for a counterexample (nor for a smaller one while shrinking).
    try {
      start();
      failed_starts_ = 0;
    } catch (const ImplementationError& e) {
      if (++failed_starts_ < kMaxFailedStarts)
        throw ImplementationError(Kind::unavailable, name_ + ": could not be restarted (" +
                                                         std::to_string(failed_starts_) + " of " +
                                                         std::to_string(kMaxFailedStarts) + " tries): " + e.what());
      given_up_ = name_ + ": could not be started: " + std::to_string(failed_starts_) +
                  " starts in a row failed, so no further call is made. The last: " + e.what();
      throw ImplementationError(Kind::unavailable, given_up_);
    }
  }

  // Turns a result's failure status into the ImplementationError it stands for.
  void throw_on_failure(std::int32_t status, const std::string& message) const {
    // The plug-in host's messages already start with our name ("plugin:PATH ..."); others get it prefixed.
    const bool named = message.rfind(name_, 0) == 0;
    if (status == wire::wrong_size)
      throw ImplementationError(Kind::wrong_size, named ? message : name_ + ": " + message);
    if (status != wire::ok)
      throw ImplementationError(Kind::error_status,
                                named ? message
                                      : name_ + " returned status " + std::to_string(status) + " (" +
                                            (status == wire::unsupported ? "unsupported" : "error") +
                                            "): " + (message.empty() ? "(no message)" : message));
  }

  // The configured timeout until the first call times out; then one derived from the slowest answer so far
  // (kSlowestFactor, kMinDerivedTimeout), never above the configured one. With no answer at all yet the
  // floor applies: a child that has never answered is most likely hanging on every call.
  double call_timeout() const {
    if (!timed_out_) return opts_.call_timeout_s;
    return std::min(opts_.call_timeout_s, std::max(kMinDerivedTimeout, kSlowestFactor * slowest_answer_s_));
  }

  // One call's exchange (forward or backward) under call_timeout(): a timeout marks the run as having hung,
  // so later calls derive theirs, and a derived timeout says how it was derived; an answer, an error status
  // included, shows how long this implementation takes to reply.
  std::string timed_exchange(const std::string& request, wire::FrameType expect, std::size_t max_payload) const {
    const double timeout_s = call_timeout();
    const auto started = Clock::now();
    std::string payload;
    try {
      payload = exchange(request, expect, timeout_s, max_payload);
    } catch (const ImplementationError& e) {
      if (e.kind() != Kind::timeout) throw;
      const bool derived = timed_out_ && timeout_s < opts_.call_timeout_s;
      timed_out_ = true;
      if (!derived) throw;
      throw ImplementationError(
          Kind::timeout,
          std::string(e.what()) + " (after an earlier timeout, calls get " + format_number(kSlowestFactor, 3) +
              " x the slowest answer so far, at least " + format_number(kMinDerivedTimeout, 3) + " s and at most the " +
              format_number(opts_.call_timeout_s, 3) + " s of --timeout; " +
              (slowest_answer_s_ > 0 ? "the slowest answer took " + format_number(slowest_answer_s_, 3) + " s)"
                                     : "no call has been answered yet)"));
    }
    slowest_answer_s_ = std::max(slowest_answer_s_, std::chrono::duration<double>(Clock::now() - started).count());
    return payload;
  }

  // Spawns the child in its own process group (so a kill reaches whatever it started) with stdin and
  // stdout on one socket and stderr on a pipe, then does the handshake. Throws ImplementationError.
  wire::Handshake start() const {
    stderr_tail_.clear();
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
      throw ImplementationError(Kind::crash, name_ + ": socketpair failed: " + std::strerror(errno));
    int err[2];
    if (::pipe2(err, O_CLOEXEC) != 0) {
      ::close(sv[0]);
      ::close(sv[1]);
      throw ImplementationError(Kind::crash, name_ + ": pipe failed: " + std::strerror(errno));
    }
    // Everything the child needs is made here: between fork and exec only async-signal-safe calls.
    std::vector<char*> args;
    for (const auto& a : argv_) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const std::vector<std::string> env = child_environment();
    std::vector<char*> envp;
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    int exec_err[2];  // the child writes errno here when exec fails; exec closes it (CLOEXEC) when it works
    if (::pipe2(exec_err, O_CLOEXEC) != 0) {
      for (const int fd : {sv[0], sv[1], err[0], err[1]}) ::close(fd);
      throw ImplementationError(Kind::crash, name_ + ": pipe failed: " + std::strerror(errno));
    }
    const pid_t parent = ::getpid();
    // Registered as ours in the same breath as it is made, so an end_orphans() of another thread never
    // takes it for an orphan.
    std::unique_lock children_lock(g_children_mu);
    const pid_t pid = ::fork();
    if (pid == 0) {
      // Its own process group, so one kill reaches whatever it starts; and killed when attncheck dies, by
      // whatever signal (SIGKILL included), so it never outlives us. The plug-in host passes this on to
      // the children it starts (tools/plugin_host.cpp).
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // died before prctl took effect
      ::dup2(sv[1], 0);
      ::dup2(sv[1], 1);
      ::dup2(err[1], 2);
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      for (const int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &dfl, nullptr);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::execve(args[0], args.data(), envp.data());
      const int e = errno;
      [[maybe_unused]] const auto n = ::write(exec_err[1], &e, sizeof e);
      ::_exit(127);
    }
    const int fork_errno = errno;
    if (pid > 0) g_children.push_back(pid);
    children_lock.unlock();
    ::close(sv[1]);
    ::close(err[1]);
    ::close(exec_err[1]);
    int rc = pid < 0 ? fork_errno : 0;
    if (pid > 0) {
      ::setpgid(pid, pid);  // also here, so a kill right after fork finds the group
      int e = 0;
      ssize_t n;
      while ((n = ::read(exec_err[0], &e, sizeof e)) < 0 && errno == EINTR) {
      }
      if (n == sizeof e) {
        rc = e;
        ::waitpid(pid, nullptr, 0);
        remove_child(pid);
      }
    }
    ::close(exec_err[0]);
    if (rc != 0) {
      ::close(sv[0]);
      ::close(err[0]);
      throw ImplementationError(Kind::crash, name_ + ": cannot start " + argv_[0] + ": " + std::strerror(rc));
    }
    pid_ = pid;
    phase_ = "before finishing the handshake";
    sock_ = sv[0];
    err_ = err[0];
    ::fcntl(sock_, F_SETFL, ::fcntl(sock_, F_GETFL) | O_NONBLOCK);
    ::fcntl(err_, F_SETFL, ::fcntl(err_, F_GETFL) | O_NONBLOCK);

    const std::string hint = " (expected a program speaking the attncheck exec protocol, harness/PROTOCOL.md)";
    std::string payload;
    wire::FrameType type{};
    try {
      payload = exchange(wire::encode_hello(), std::nullopt, opts_.startup_timeout_s, 1u << 20, &type);
    } catch (const ImplementationError& e) {
      throw ImplementationError(e.kind(), std::string(e.what()) + hint);
    }
    try {
      if (type == wire::FrameType::refuse) {
        wire::Reader r(payload, "refuse frame");
        const std::string msg = r.str();
        stop(true);
        throw ImplementationError(Kind::protocol, msg);
      }
      if (type != wire::FrameType::caps)
        throw wire::ProtocolError("sent a " + std::string(wire::frame_type_name(type)) + " frame instead of caps");
      const wire::Handshake h = wire::decode_caps(payload);
      if (h.version < wire::kOldestProtocolVersion || h.version > wire::kProtocolVersion) {
        stop(true);
        throw ImplementationError(Kind::protocol, name_ + ": speaks protocol version " + std::to_string(h.version) +
                                                      " but this attncheck speaks versions " +
                                                      std::to_string(wire::kOldestProtocolVersion) + " to " +
                                                      std::to_string(wire::kProtocolVersion));
      }
      phase_ = kInCall;
      return h;
    } catch (const wire::ProtocolError& e) {
      stop(false);
      throw ImplementationError(Kind::protocol, name_ + ": bad handshake: " + e.what() + hint);
    }
  }

  // Ends the child: gently (bye, then a second to exit) at the end of a run, at once after a failure. The
  // child is the plug-in host's guard: SIGTERM makes it end its worker's whole tree (setsid() children
  // included) and exit; only if it does not within a second is its process group killed outright. Then
  // whatever a tree orphaned to this process (a subreaper) is ended too, so nothing outlives the harness.
  void stop(bool gently) const {
    if (pid_ < 0) return;
    if (gently && sock_ >= 0) {
      const std::string bye = wire::frame(wire::FrameType::bye, {});
      [[maybe_unused]] const auto n = ::send(sock_, bye.data(), bye.size(), MSG_NOSIGNAL);
    }
    if (sock_ >= 0) ::close(sock_);
    sock_ = -1;
    int status = 0;
    const auto reap_within = [&](int ms) {
      for (int i = 0; i < ms / 10; ++i) {
        const pid_t r = ::waitpid(pid_, &status, WNOHANG);
        if (r == pid_ || (r < 0 && errno == ECHILD)) return true;  // ECHILD: already reaped
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      return false;
    };
    bool reaped = gently && reap_within(1000);
    if (!reaped) {
      ::kill(pid_, SIGTERM);
      reaped = reap_within(1000);
    }
    ::kill(-pid_, SIGKILL);
    if (!reaped) ::waitpid(pid_, &status, 0);
    if (err_ >= 0) ::close(err_);
    err_ = -1;
    remove_child(pid_);
    pid_ = -1;
    end_orphans();
  }

  void drain_stderr() const {
    char buf[4096];
    while (err_ >= 0) {
      const ssize_t n = ::read(err_, buf, sizeof buf);
      if (n > 0) {
        stderr_tail_.append(buf, std::size_t(n));
        if (stderr_tail_.size() > kStderrTail) stderr_tail_.erase(0, stderr_tail_.size() - kStderrTail);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        if (n == 0) {
          ::close(err_);
          err_ = -1;
        }
        return;
      }
    }
  }

  std::string stderr_note() const {
    drain_stderr();
    std::string t = stderr_tail_;
    while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
    return t.empty() ? "" : "; its stderr ends with:\n" + t;
  }

  // The child closed its end: reap it (it is exiting or has exited), say how it ended, and kill whatever
  // it started.
  [[noreturn]] void died() const {
    int status = 0;
    bool reaped = false;
    bool gone = false;  // reaped elsewhere (ECHILD): nothing to wait for or kill
    for (int i = 0; i < 200 && !reaped && !gone; ++i) {
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      reaped = r == pid_;
      gone = r < 0 && errno == ECHILD;
      if (!reaped && !gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    reaped = reaped || gone;
    const std::string how = reaped && !gone ? describe_status(status) : "closed its end of the socket";
    const std::string note = stderr_note();
    if (!reaped) {
      ::kill(pid_, SIGTERM);  // the guard ends what the worker left, then exits
      for (int i = 0; i < 100 && !reaped; ++i) {
        reaped = ::waitpid(pid_, &status, WNOHANG) == pid_;
        if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    ::kill(-pid_, SIGKILL);
    if (!reaped) ::waitpid(pid_, &status, 0);
    if (sock_ >= 0) ::close(sock_);
    if (err_ >= 0) ::close(err_);
    sock_ = err_ = -1;
    remove_child(pid_);
    pid_ = -1;
    end_orphans();
    throw ImplementationError(Kind::crash, name_ + ": the process " + how + " " + phase_ + note);
  }

  // Between calls the child owes nothing, and it answers a call only once it has read the whole request: bytes
  // waiting before a request is sent, or coming while part of it is still unread, are an answer nobody asked for
  // (most often a second answer to an earlier call). Read as this call's answer, they would pass an earlier
  // call's result off as this one's, a false counterexample. So they are a protocol error, and since an answer
  // that slipped through before (the two checks sample a race) cannot be told from a real one afterwards, every
  // later call of the run fails with it too (check_in_step): the implementation is out of step, not a law.
  void check_nothing_unasked() const {
    if (sock_ < 0 || phase_ != kInCall) return;
    char head[wire::kHeaderSize];
    const ssize_t n = ::recv(sock_, head, sizeof head, MSG_PEEK | MSG_DONTWAIT);
    if (n <= 0) return;  // nothing waiting; or the end of the stream, which the exchange reports as a death
    std::string what = std::to_string(n) + (n == 1 ? " byte" : " bytes");
    try {
      if (std::size_t(n) == wire::kHeaderSize)
        what = "a " + std::string(wire::frame_type_name(wire::parse_header(std::string_view(head, sizeof head)).first)) +
               " frame";
    } catch (const wire::ProtocolError&) {
    }
    out_of_step("sent " + what + " before this call was made");
  }

  // After bytes came in during a call: the child has not read all of the request yet (its bytes are still in
  // the socket), so whatever it sent was written before it could know the request.
  void check_request_read(std::size_t written, std::size_t size, std::size_t received) const {
    if (phase_ != kInCall) return;
    int unread = 0;
    if (written == size && (::ioctl(sock_, SIOCOUTQ, &unread) != 0 || unread == 0)) return;
    out_of_step("sent " + std::to_string(received) + " bytes while " +
                (written < size ? std::to_string(size - written) + " bytes of the request were still to be sent"
                                : std::to_string(unread) + " bytes of the request were still unread"));
  }

  [[noreturn]] void out_of_step(const std::string& what) const {
    out_of_step_ = name_ + ": " + what + ", an answer nobody asked for (expected exactly one result frame per "
                   "forward and one gradients frame per backward, each after the whole request was read: an earlier "
                   "call answered twice?)";
    const std::string note = stderr_note();
    stop(false);
    throw ImplementationError(Kind::protocol, out_of_step_ + "; the process was killed" + note);
  }

  void check_in_step() const {
    if (!out_of_step_.empty())
      throw ImplementationError(Kind::protocol, out_of_step_ + " (so no call of this run is made any more: none "
                                                               "of its answers can be matched to its call)");
  }

  // Sends `request` and reads one whole frame back within `timeout_s`, draining stderr meanwhile. Returns its
  // payload; `expect` (when set) is the only frame type accepted. Throws ImplementationError and leaves no
  // child behind on a timeout, a death or garbage.
  std::string exchange(const std::string& request, std::optional<wire::FrameType> expect, double timeout_s,
                       std::size_t max_payload, wire::FrameType* got_type = nullptr) const {
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    check_nothing_unasked();
    std::size_t written = 0;
    bool send_failed = false, eof = false;
    std::string in;
    std::optional<std::pair<wire::FrameType, std::uint64_t>> header;
    char buf[1 << 16];
    while (true) {
      const bool sending = written < request.size() && !send_failed;
      pollfd fds[2] = {{sock_, short(POLLIN | (sending ? POLLOUT : 0)), 0}, {err_, POLLIN, 0}};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) {
        const std::string note = stderr_note();
        // Only a call that timed out is followed by another one that starts a new process; a timed-out start is
        // retried by the caller (ensure_started says how many tries are left) or, the first, ends the run.
        const bool in_call = phase_ == kInCall;
        stop(false);
        throw ImplementationError(Kind::timeout, name_ + ": no answer within " + format_number(timeout_s, 3) + " s " +
                                                     phase_ + "; the process was killed" +
                                                     (in_call ? " (a later call starts a new one)" : "") + note);
      }
      const int n = ::poll(fds, err_ >= 0 ? 2 : 1, int(std::min<long long>(left, 1000)));
      if (n < 0 && errno != EINTR)
        throw ImplementationError(Kind::crash, name_ + ": poll failed: " + std::strerror(errno));
      if (n <= 0) continue;
      if (err_ >= 0 && fds[1].revents) drain_stderr();
      // Read before writing, and judge what was read before the end of the stream: a child that printed
      // text and exited is a protocol error (with its text quoted), not only a dead child.
      if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
        const ssize_t r = ::recv(sock_, buf, sizeof buf, 0);
        if (r > 0) {
          in.append(buf, std::size_t(r));
          check_request_read(written, request.size(), in.size());
        }
        else if (r == 0 || (errno != EAGAIN && errno != EINTR)) eof = true;
      }
      if (sending && (fds[0].revents & POLLOUT)) {
        const ssize_t w = ::send(sock_, request.data() + written, request.size() - written, MSG_NOSIGNAL);
        if (w > 0) written += std::size_t(w);
        else if (w < 0 && errno != EAGAIN && errno != EINTR) send_failed = true;  // gone: read what it left
      }
      try {
        if (!header && in.size() >= wire::kHeaderSize) {
          header = wire::parse_header(std::string_view(in).substr(0, wire::kHeaderSize));
          if (expect && header->first != *expect)
            throw wire::ProtocolError("sent a " + std::string(wire::frame_type_name(header->first)) +
                                      " frame where a " + std::string(wire::frame_type_name(*expect)) +
                                      " frame was expected");
          if (header->second > max_payload)
            throw wire::ProtocolError("announced a payload of " + std::to_string(header->second) +
                                      " bytes, more than the " + std::to_string(max_payload) + " this call allows");
        }
        if (header && in.size() >= wire::kHeaderSize + header->second) {
          if (written < request.size() || in.size() > wire::kHeaderSize + header->second)
            throw wire::ProtocolError("answered before reading the whole request, or sent more than one frame");
          if (got_type) *got_type = header->first;
          return in.substr(wire::kHeaderSize);
        }
        if (eof) died();
      } catch (const wire::ProtocolError& e) {
        const std::string note = stderr_note();
        stop(false);
        throw ImplementationError(Kind::protocol, name_ + ": " + e.what() + note);
      }
    }
  }

  std::string name_, description_;
  std::vector<std::string> argv_;
  HarnessOptions opts_;
  Capabilities caps_;
  mutable std::mutex mu_;
  mutable pid_t pid_ = -1;
  mutable int sock_ = -1, err_ = -1;
  mutable std::string stderr_tail_;
  mutable std::string phase_;  ///< "during the call", or the handshake: for crash messages
  mutable int failed_starts_ = 0;        ///< starts in a row that failed (crash or hang before the handshake)
  mutable std::string given_up_;         ///< non-empty once kMaxFailedStarts starts in a row failed
  mutable std::string out_of_step_;      ///< non-empty once the child sent an answer nobody asked for
  mutable bool timed_out_ = false;       ///< a call of this run has timed out: call_timeout() derives
  mutable double slowest_answer_s_ = 0;  ///< the longest a call took to be answered, in seconds
};

}  // namespace

ImplementationPtr start_subprocess(std::string name, std::vector<std::string> argv, const HarnessOptions& opts) {
  return std::make_shared<ExecImplementation>(std::move(name), std::move(argv), opts);
}

}  // namespace attncheck::detail
