// The help of a command as the rest of the CLI writes it (CLI11's formatter, reworded).
#pragma once
#include <CLI/CLI.hpp>
#include <memory>

namespace engine::cli {

// "usage: engine train [options] CONFIG.json" first, then what the command does, then its
// options with their text wrapped to fit 80 columns.
std::shared_ptr<CLI::Formatter> make_formatter();

}  // namespace engine::cli
