// JSON encoding of counterexamples (tensors, problems, law cases, violations) so a stored case replays
// exactly: finite doubles are written to round-trip bit for bit, non-finite ones as the strings below.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

#include "attncheck/law.hpp"

namespace attncheck::reports {

/// Keeps keys in the order they were written, so a report reads top-down (law first, tensors last).
using Json = nlohmann::ordered_json;

/// A report or corpus file that is not what attncheck writes; the message names the file or field and what
/// was expected.
class FormatError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// How non-finite numbers are spelled, since JSON has no Inf or NaN: "inf", "-inf", "nan" (a NaN's sign and
/// payload are not kept). Every other number is a JSON number that parses back to the same double.
inline constexpr std::string_view kNumberEncoding =
    "finite numbers are JSON numbers that parse back to the same double (-0.0 included); "
    "non-finite numbers are the strings \"inf\", \"-inf\" and \"nan\"";

/// A double as JSON: a number when finite, "inf" / "-inf" / "nan" otherwise.
Json number_to_json(double x);
/// The inverse of number_to_json; throws FormatError naming `what` for anything else.
double number_from_json(const Json& j, std::string_view what);

/// A report's dtype field parsed back ("float32", ...); throws FormatError for any other name.
DType dtype_field(std::string_view name);
/// "top-left" or "bottom-right".
std::string_view alignment_name(CausalAlignment a);

/// {"shape": [B,H,T,D], "values": [[[[...]]]]} nested b, h, i, then the last extent.
Json to_json(const Tensor<double>& t);
Tensor<double> tensor_from_json(const Json& j, std::string_view what);

/// dtype, alignment, scale (null: the default 1/√D), want_weights, then q, k, v in full.
Json to_json(const Problem& p);
Problem problem_from_json(const Json& j, std::string_view what);

/// problem, variant (null when the law has none), params, tags.
Json to_json(const LawCase& c);
LawCase law_case_from_json(const Json& j, std::string_view what);

/// message, quantity, worst_index, magnitude, tolerance, then expected, actual, tolerances, weights (null when
/// absent) and series as [[D, variance, low, high], ...].
Json to_json(const Violation& v);
Violation violation_from_json(const Json& j, std::string_view what);

/// Pretty JSON with a trailing newline: two-space indent, and arrays of plain values on one line, so a
/// tensor row reads as one line.
std::string dump_pretty(const Json& j);

/// A short stable hash of a law case (FNV-1a 64 of its compact JSON), as 16 hex digits: names corpus files.
std::string case_hash(const LawCase& c);

}  // namespace attncheck::reports
