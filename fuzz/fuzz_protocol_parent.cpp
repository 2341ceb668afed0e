// Fuzzes what attncheck decodes from an exec: child or the plug-in host: frame headers, the caps frame of
// the handshake (versions 1 to 3), result frames (version 3: with the LSE) and (version 2) gradients frames
// (version 3: with d_sinks) at every dtype. Any ProtocolError is a clean refusal; anything else (a
// crash, a sanitizer report, another exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "protocol.hpp"

using namespace attncheck;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  // The first byte picks the dtype a result is decoded at, as the call that asked for it would.
  const DType dtype = std::array{DType::f32, DType::f64, DType::f16, DType::bf16}[data[0] % 4];
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  // What the harness does with an answer of the expected shape: widen its bytes.
  const auto to_shape = [](const std::array<std::int64_t, 4>& a) { return Shape{a[0], a[1], a[2], a[3]}; };
  const auto positive = [](const std::array<std::int64_t, 4>& a) { return a[0] > 0 && a[1] > 0 && a[2] > 0 && a[3] > 0; };
  try {
    if (bytes.size() >= wire::kHeaderSize) wire::parse_header(bytes.substr(0, wire::kHeaderSize));
  } catch (const wire::ProtocolError&) {
  }
  try {
    wire::decode_caps(bytes);
  } catch (const wire::ProtocolError&) {
  }
  try {
    const wire::Result r = wire::decode_result(bytes, dtype);
    if (r.status == wire::ok && positive(r.out_shape)) wire::from_bytes(r.out_bytes, to_shape(r.out_shape), dtype);
    if (r.status == wire::ok && r.has_weights && positive(r.w_shape))
      wire::from_bytes(r.w_bytes, to_shape(r.w_shape), dtype);
    if (r.status == wire::ok && r.has_lse && positive(r.lse_shape))  // version 3: always float64
      wire::from_bytes(r.lse_bytes, to_shape(r.lse_shape), DType::f64);
  } catch (const wire::ProtocolError&) {
  }
  try {
    const wire::GradientsResult g = wire::decode_gradients(bytes, dtype);
    if (g.status == wire::ok)
      for (std::size_t i = 0; i < 3; ++i)
        if (positive(g.shapes[i])) wire::from_bytes(g.bytes[i], to_shape(g.shapes[i]), dtype);
  } catch (const wire::ProtocolError&) {
  }
  return 0;
}
