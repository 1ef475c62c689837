#include "cli/help.h"

#include <sstream>
#include <string>
#include <vector>

namespace engine::cli {
namespace {

class HelpFormatter : public CLI::Formatter {
 public:
  static constexpr std::size_t kColumn = 34, kWidth = 80;
  HelpFormatter() {
    label("Usage", "usage");
    label("OPTIONS", "options");
    label("Positionals", "arguments");
    label("Options", "options");
    label("REQUIRED", "");
    label("TEXT", "");
    column_width(kColumn);
  }
  std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const override {
    if (mode == CLI::AppFormatMode::Sub) return make_expanded(app);
    std::string footer = make_footer(app);
    if (!footer.empty()) footer = "\n" + footer + "\n";
    return make_usage(app, name) + "\n" + wrap(app->get_description(), 0) + "\n" + make_positionals(app) +
           make_groups(app, mode) + footer;
  }
  std::string make_group(std::string group, bool is_positional, std::vector<const CLI::Option*> opts) const override {
    return CLI::Formatter::make_group(group == "Options" ? "options" : group, is_positional, std::move(opts));
  }
  std::string make_option_desc(const CLI::Option* opt) const override {
    return wrap(opt->get_description(), kColumn);
  }
  std::string make_option_opts(const CLI::Option* opt) const override {
    return opt->get_type_name().empty() ? "" : " " + opt->get_type_name();
  }

 private:
  // Words of `text` in lines of at most kWidth columns, the first starting at `indent`;
  // the caller indents the lines after it.
  static std::string wrap(const std::string& text, std::size_t indent) {
    std::istringstream words(text);
    std::string out, word;
    std::size_t col = indent;
    for (bool first = true; words >> word; first = false) {
      if (!first && col + 1 + word.size() > kWidth) {
        out += "\n";
        col = indent;
      } else if (!first) {
        out += " ";
        ++col;
      }
      out += word;
      col += word.size();
    }
    return out;
  }
};

}  // namespace

std::shared_ptr<CLI::Formatter> make_formatter() { return std::make_shared<HelpFormatter>(); }

}  // namespace engine::cli
