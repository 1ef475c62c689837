// placeholder, replaced below
#include <doctest/doctest.h>
TEST_CASE("placeholder") {}
