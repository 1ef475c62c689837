// The shape of one sample: channels x height x width. Models declare the shape they
// take, datasets the shape they hold; the trainer checks that the two agree.
#pragma once
#include <cstdint>
#include <string>

namespace engine {

struct ImageShape {
  int channels = 0, height = 0, width = 0;

  int64_t numel() const { return static_cast<int64_t>(channels) * height * width; }
  std::string str() const {  // "1x28x28"
    return std::to_string(channels) + "x" + std::to_string(height) + "x" + std::to_string(width);
  }
  bool operator==(const ImageShape& o) const {
    return channels == o.channels && height == o.height && width == o.width;
  }
  bool operator!=(const ImageShape& o) const { return !(*this == o); }
};

}  // namespace engine
