// Golden dropout masks on a GPU (tests/golden_dropout.h): a run on CUDA draws the masks
// the documented keying defines, at every step of every epoch. Exits 77 (skipped) where
// no GPU is present; tests/test_dropout_keying.cpp runs the same on the CPU everywhere.
#include "engine/core/device.h"
#include "golden_dropout.h"
#include "gpu/device_test_util.h"  // skips (exit 77) without a GPU

TEST_CASE("dropout masks are the documented keying's, at every step of every epoch (cuda)") {
  const auto masks = golden_dropout::check_run(engine::Device::cuda(0), 2);
  REQUIRE(masks.size() == 10);
  for (int step = 0; step < 5; ++step) CHECK(masks[step] != masks[5 + step]);
}
