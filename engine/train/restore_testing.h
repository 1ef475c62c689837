// Test seam of Trainer::restore (private: not installed, not in the public API).
// When set, it is called after each component's load_state with the component's
// group name; a test throws from it to act as a component that fails after changing
// part (here: all) of its state, and checks that restore rolls every change back.
#pragma once
#include <string>

namespace engine::testing {
extern void (*after_component_load)(const std::string& group);
}
