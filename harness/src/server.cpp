// The child side of the exec: protocol: answers the handshake, then forward and backward frames, until bye or
// EOF. The plug-in host runs a C ABI plug-in through it; a C++ project can expose its own implementation the
// same way.
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "attncheck/harness.hpp"
#include "protocol.hpp"

namespace attncheck {
namespace {

// Reads exactly n bytes; false on EOF before the first byte, ProtocolError on EOF in the middle. The buffer
// grows with what arrives, never ahead of it: n comes from the other side, and a header announcing 2^60 bytes
// must end in "input ended", not in an allocation of 2^60 bytes (fuzz/fuzz_protocol_child sends such headers).
bool read_full(int fd, std::string& buf, std::size_t n) {
  constexpr std::size_t kChunk = std::size_t{1} << 20;
  buf.clear();
  while (buf.size() < n) {
    const std::size_t have = buf.size();
    buf.resize(have + std::min(kChunk, n - have));
    const ssize_t r = ::read(fd, buf.data() + have, buf.size() - have);
    buf.resize(have + std::size_t(std::max<ssize_t>(r, 0)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      if (have == 0 && r == 0) return false;
      throw wire::ProtocolError("input ended in the middle of a frame");
    }
  }
  return true;
}

void write_all(int fd, const std::string& data) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t r = ::write(fd, data.data() + done, data.size() - done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) throw wire::ProtocolError("cannot write a frame: the other side is gone");
    done += std::size_t(r);
  }
}

// The failure frame for an exception the implementation threw while answering a call.
std::string failure_reply(wire::FrameType type) {
  try {
    throw;
  } catch (const ImplementationError& e) {
    const auto st = e.kind() == ImplementationError::Kind::wrong_size ? wire::wrong_size : wire::error;
    return wire::encode_failure(st, e.what(), type);
  } catch (const std::exception& e) {
    return wire::encode_failure(wire::error, e.what(), type);
  }
}

}  // namespace

int serve(const std::function<ImplementationPtr()>& make, int in_fd, int out_fd) {
  std::string header, payload;
  ImplementationPtr impl;
  try {
    while (read_full(in_fd, header, wire::kHeaderSize)) {
      const auto [type, length] = wire::parse_header(header);
      if (!read_full(in_fd, payload, length) && length > 0) throw wire::ProtocolError("input ended before a payload");
      switch (type) {
        case wire::FrameType::hello: {
          const std::uint32_t version = wire::decode_hello(payload);
          if (version < wire::kOldestProtocolVersion) {
            // Answer with our version anyway: the harness names both numbers.
            wire::Handshake h;
            h.version = wire::kProtocolVersion;
            write_all(out_fd, wire::encode_caps(h));
            return 2;
          }
          try {
            impl = make();
          } catch (const SpecError& e) {
            write_all(out_fd, wire::encode_refuse(e.what()));
            return 2;
          }
          // The lower of the two newest versions: an older attncheck gets the caps frame it knows.
          wire::Handshake h;
          h.version = std::min(version, wire::kProtocolVersion);
          h.caps = impl->capabilities();
          h.name = impl->name();
          h.description = impl->description();
          write_all(out_fd, wire::encode_caps(h));
          break;
        }
        case wire::FrameType::forward: {
          if (!impl) throw wire::ProtocolError("a forward frame came before the hello");
          const Problem p = wire::decode_forward(payload);
          std::string reply;
          try {
            reply = wire::encode_result(impl->forward(p), p.dtype);
          } catch (const std::exception&) {
            reply = failure_reply(wire::FrameType::result);
          }
          write_all(out_fd, reply);
          break;
        }
        case wire::FrameType::backward: {
          if (!impl) throw wire::ProtocolError("a backward frame came before the hello");
          const Problem p = wire::decode_backward(payload);
          std::string reply;
          try {
            Gradients g = impl->backward(p);
            if (!impl->capabilities().declares(Feature::bias_grad)) g.dbias.reset();  // undeclared
            reply = wire::encode_gradients(g, p.dtype);
          } catch (const std::exception&) {
            reply = failure_reply(wire::FrameType::gradients);
          }
          write_all(out_fd, reply);
          break;
        }
        case wire::FrameType::bye:
          return 0;
        default:
          throw wire::ProtocolError("unexpected " + std::string(wire::frame_type_name(type)) + " frame");
      }
    }
  } catch (const wire::ProtocolError& e) {
    const std::string msg = std::string("attncheck serve: protocol error: ") + e.what() + "\n";
    [[maybe_unused]] const auto n = ::write(2, msg.data(), msg.size());
    return 2;
  }
  return 0;
}

}  // namespace attncheck
