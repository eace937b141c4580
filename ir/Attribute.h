// Op attributes: int, float, string, lists of those, and tensors.
//
// Floats are stored as `float`, as ONNX stores them, so that a value read from
// a model prints and parses back to exactly the same bits. An op's attributes
// live in an AttrMap ordered by name; that order is also the printed order.
#pragma once

#include "ir/TensorData.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace cleave::ir {

enum class AttrKind { Int, Float, String, Ints, Floats, Strings, Tensor };

std::string_view attrKindName(AttrKind k);

class Attribute {
public:
  using Storage =
      std::variant<int64_t, float, std::string, std::vector<int64_t>,
                   std::vector<float>, std::vector<std::string>,
                   std::shared_ptr<TensorData>>;

  Attribute(int64_t v) : v_(v) {}
  Attribute(float v) : v_(v) {}
  Attribute(std::string v) : v_(std::move(v)) {}
  Attribute(const char *v) : v_(std::string(v)) {}
  Attribute(std::vector<int64_t> v) : v_(std::move(v)) {}
  Attribute(std::vector<float> v) : v_(std::move(v)) {}
  Attribute(std::vector<std::string> v) : v_(std::move(v)) {}
  Attribute(std::shared_ptr<TensorData> v) : v_(std::move(v)) {}

  AttrKind kind() const { return AttrKind(v_.index()); }
  int64_t getInt() const { return std::get<int64_t>(v_); }
  float getFloat() const { return std::get<float>(v_); }
  const std::string &getString() const { return std::get<std::string>(v_); }
  const std::vector<int64_t> &getInts() const {
    return std::get<std::vector<int64_t>>(v_);
  }
  const std::vector<float> &getFloats() const {
    return std::get<std::vector<float>>(v_);
  }
  const std::vector<std::string> &getStrings() const {
    return std::get<std::vector<std::string>>(v_);
  }
  const std::shared_ptr<TensorData> &getTensor() const {
    return std::get<std::shared_ptr<TensorData>>(v_);
  }

private:
  Storage v_;
};

using AttrMap = std::map<std::string, Attribute, std::less<>>;

// A float attribute's value for arithmetic on float64 data. ONNX and the
// plan hold every float attribute in float32, while the producer wrote a
// decimal (PyTorch's eps=1e-5 is stored as 9.99999974737875e-06, 2.5e-8 off;
// `--momentum 0.9` as 0.899999976); a float64 graph means the decimal. The
// float's shortest round-trip decimal is that decimal for any value written
// with up to 7 significant digits, and otherwise within half a float ulp of
// the float, as the float itself is.
double decimalWidened(float f);

} // namespace cleave::ir
