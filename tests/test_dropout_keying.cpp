// Golden dropout masks on the CPU (tests/golden_dropout.h; tests/gpu/test_dropout_keying.cpp
// runs the same on a GPU where one is present).
#include "golden_dropout.h"

using namespace engine;

TEST_CASE("the reference Philox is the published one") {
  // Random123's known-answer vectors for philox4x32_10 (kat_vectors): counter and key
  // all zero, and all ones.
  uint32_t zero[4] = {0, 0, 0, 0};
  golden_dropout::philox4x32_10_reference(zero, 0, 0);
  CHECK(zero[0] == 0x6627e8d5u);
  CHECK(zero[1] == 0xe169c58du);
  CHECK(zero[2] == 0xbc57ac4cu);
  CHECK(zero[3] == 0x9b00dbd8u);
  uint32_t ones[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
  golden_dropout::philox4x32_10_reference(ones, 0xffffffffu, 0xffffffffu);
  CHECK(ones[0] == 0x408f276du);
  CHECK(ones[1] == 0x41c83b0eu);
  CHECK(ones[2] == 0xa20bc7c6u);
  CHECK(ones[3] == 0x6d5451fdu);
}

TEST_CASE("dropout masks are the documented keying's, at every step of every epoch (cpu)") {
  const auto masks = golden_dropout::check_run(Device::cpu(), 3);
  REQUIRE(masks.size() == 15);
  // The same step of another epoch draws other values: epoch 2 step 5 is not epoch 1's.
  for (int step = 0; step < 5; ++step) {
    CAPTURE(step);
    CHECK(masks[step] != masks[5 + step]);
    CHECK(masks[5 + step] != masks[10 + step]);
  }
}
