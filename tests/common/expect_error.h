#pragma once
// expect_error<E>(fn, {"needle", ...}): fn throws E, and its message holds
// every needle. No exception, or another type, is a failure naming what was
// expected and what came.
#include <gtest/gtest.h>

#include <exception>
#include <string>
#include <vector>

namespace flex_test {

template <class E, class F>
void expect_error(F fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "no exception; expected one mentioning " << needles.front();
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "message: " << msg << "\nmissing: " << n;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

}  // namespace flex_test
