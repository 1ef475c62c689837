#include "report/report.h"
#include "core/utc_time.h"

#include "engine/run/run_files.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "engine/io/checkpoint.h"
#include "engine/train/config.h"
#include "engine/train/epoch_metrics.h"
#include "engine/io/dataset.h"
#include "engine/core/device.h"
#include "engine/train/inference.h"
#include "io/atomic_file.h"

namespace engine {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct BestEvaluation {
  EvalResult result;
  std::vector<std::string> class_names;  // as the dataset names them; may be empty
};

// The field of the one description of the per-epoch metrics (epoch_metric_fields(),
// engine/train/epoch_metrics.h) that holds `member`: its name and description.
const EpochMetricField& metric_field(double EpochMetrics::*member) {
  for (const EpochMetricField& f : epoch_metric_fields())
    if (f.member == member) return f;
  throw std::logic_error("engine report: an EpochMetrics member is missing from epoch_metric_fields()");
}

struct TestLine {
  double loss = 0, accuracy = 0;
  int64_t count = 0;
};

struct RunMetrics {
  std::vector<EpochMetrics> epochs;
  std::optional<TestLine> test;  // the end-of-training test evaluation (metrics.jsonl only)
  std::string source;
};

struct CheckpointRow {
  std::string file;
  uintmax_t bytes = 0;
  std::string integrity;  // "ok" or the one-line error
  std::optional<int64_t> epoch, step_in_epoch;
  std::string created_utc, saved_on;
};

std::string escape_html(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string human_bytes(uintmax_t n) {
  if (n < 1024) return std::to_string(n) + " B";
  if (n < 1024 * 1024) return fmt("%.1f KiB", n / 1024.0);
  return fmt("%.2f MiB", n / (1024.0 * 1024.0));
}

double number_or_nan(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>()
                                          : std::numeric_limits<double>::quiet_NaN();
}

// ---- reading the run -----------------------------------------------------------------

std::optional<RunMetrics> read_metrics_jsonl(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  RunMetrics m;
  m.source = path.string();
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::parse_error&) {
      throw std::runtime_error(path.string() + ":" + std::to_string(line_no) + ": invalid JSON");
    }
    if (!j.is_object())
      throw std::runtime_error(path.string() + ":" + std::to_string(line_no) + ": not a JSON object");
    if (j.contains("epoch") && j["epoch"].is_number_integer()) {
      EpochMetrics e;
      e.epoch = j["epoch"].get<int64_t>();
      for (const EpochMetricField& f : epoch_metric_fields()) e.*f.member = number_or_nan(j, f.name);
      m.epochs.push_back(e);
    } else if (j.contains("test_acc")) {
      TestLine t;
      t.loss = number_or_nan(j, "test_loss");
      t.accuracy = number_or_nan(j, "test_acc");
      t.count = j.value("test_count", int64_t{0});
      m.test = t;
    } else {
      throw std::runtime_error(path.string() + ":" + std::to_string(line_no) +
                               ": neither an epoch nor a test line");
    }
  }
  return m;
}

RunMetrics read_metrics_checkpoint(const fs::path& path) {
  const Checkpoint c = load_checkpoint(path.string());
  const StateDict& g = c.groups.at("metrics");
  RunMetrics m;
  m.source = path.string() + " (metrics group)";
  const std::vector<double>& epochs = g.get_series("epoch");
  m.epochs.resize(epochs.size());
  auto fill = [&](const char* key, double EpochMetrics::*field) {
    const std::vector<double>& v = g.get_series(key);
    for (std::size_t i = 0; i < m.epochs.size() && i < v.size(); ++i) m.epochs[i].*field = v[i];
  };
  for (std::size_t i = 0; i < epochs.size(); ++i) m.epochs[i].epoch = static_cast<int64_t>(epochs[i]);
  for (const EpochMetricField& f : epoch_metric_fields()) fill(f.name, f.member);
  return m;
}

RunMetrics read_metrics(const fs::path& dir) {
  const fs::path jsonl = dir / run_files::kMetrics;
  std::optional<RunMetrics> m = read_metrics_jsonl(jsonl);
  if (m && !m->epochs.empty()) return *m;
  const fs::path last = dir / run_files::kLast;
  std::string why = fs::exists(jsonl) ? jsonl.string() + " holds no epoch" : "no " + jsonl.string();
  if (fs::exists(last)) {
    try {
      RunMetrics c = read_metrics_checkpoint(last);
      if (!c.epochs.empty()) return c;
      why += ", and " + last.string() + " holds no epoch";
    } catch (const std::exception& e) {
      why += ", and " + std::string(e.what());
    }
  } else {
    why += ", and no " + last.string();
  }
  throw std::runtime_error(dir.string() + ": no metrics to report (" + why + ")");
}

std::vector<CheckpointRow> scan_checkpoints(const fs::path& dir, std::string& config_json) {
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string f = entry.path().filename().string();
    long long e = 0;
    char tail[8] = {0};
    const bool milestone = f.size() == 13 && std::sscanf(f.c_str(), "epoch_%4lld.%3s", &e, tail) == 2 &&
                           std::string(tail) == "h5";
    if (f == run_files::kLast || f == run_files::kBest || milestone) files.push_back(f);
  }
  auto rank = [](const std::string& f) { return f == run_files::kLast ? 0 : f == run_files::kBest ? 1 : 2; };
  std::sort(files.begin(), files.end(), [&](const std::string& a, const std::string& b) {
    return rank(a) != rank(b) ? rank(a) < rank(b) : a < b;
  });
  std::vector<CheckpointRow> rows;
  for (const std::string& f : files) {
    CheckpointRow r;
    r.file = f;
    const std::string path = (dir / f).string();
    std::error_code ec;
    r.bytes = fs::file_size(path, ec);
    try {
      verify_checkpoint_file(path);
      r.integrity = "ok";
      const Checkpoint c = load_checkpoint(path);
      const StateDict& t = c.groups.at("trainer");
      r.epoch = t.get_int("epoch");
      r.step_in_epoch = t.get_int("step_in_epoch");
      r.created_utc = c.meta.created_utc;
      r.saved_on = c.meta.saved_on;
      if (config_json.empty() || f == run_files::kLast) config_json = c.config_json;
    } catch (const std::exception& e) {
      if (r.integrity.empty()) r.integrity = e.what();
    }
    rows.push_back(r);
  }
  return rows;
}

// best.h5 on the test set, through the inference API (the one "checkpoint -> model ->
// evaluate" path): the accuracy and the confusion matrix of the classifier's
// predictions, the loss the mean cross-entropy of its logits. The class names come
// from the dataset the stored config names.
std::optional<BestEvaluation> evaluate_best(const fs::path& dir, const ReportOptions& opt,
                                            std::vector<std::string>& notes) {
  const fs::path best = dir / run_files::kBest;
  if (!fs::exists(best)) {
    notes.push_back(best.string() + ": not present, no confusion matrix");
    return std::nullopt;
  }
  try {
    if (!opt.make_model) throw std::runtime_error("no model factory given (ReportOptions::make_model)");
    const Classifier classifier(best.string(), resolve_device(opt.device), opt.make_model);
    DataConfig data = classifier.config().data;
    if (!opt.data_dir.empty()) data.dir = opt.data_dir;
    const std::unique_ptr<Dataset> dataset = make_dataset(data, Device::cpu());
    const SplitData& test = dataset->get(Split::Test);
    const int classes = classifier.num_classes();
    if (dataset->num_classes() != classes)
      throw std::runtime_error("the model has " + std::to_string(classes) + " classes, the dataset " +
                               std::to_string(dataset->num_classes()));
    const Predictions p =
        classifier.predict(static_cast<const uint8_t*>(test.images.raw()), test.count, Scores::Logits);
    const auto* truth = static_cast<const uint8_t*>(test.labels.raw());

    BestEvaluation out;
    out.class_names = dataset->class_names();
    EvalResult& r = out.result;
    r.count = test.count;
    r.confusion.assign(classes, std::vector<int64_t>(classes, 0));
    int64_t correct = 0;
    double loss_sum = 0;
    for (int64_t i = 0; i < test.count; ++i) {
      const int y = truth[i];
      ++r.confusion[y][p.labels[i]];
      correct += p.labels[i] == y;
      const float* z = &p.scores[static_cast<size_t>(i) * classes];
      const double top = *std::max_element(z, z + classes);
      double denom = 0;
      for (int k = 0; k < classes; ++k) denom += std::exp(double(z[k]) - top);
      loss_sum += std::log(denom) + top - z[y];
    }
    r.accuracy = test.count ? double(correct) / test.count : 0.0;
    r.loss = test.count ? loss_sum / test.count : 0.0;
    return out;
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (what.rfind(best.string(), 0) != 0) what = best.string() + ": " + what;
    notes.push_back(what + " (no confusion matrix)");
    return std::nullopt;
  }
}

// ---- SVG charts ----------------------------------------------------------------------

struct Series {
  std::string name, color;
  std::vector<std::pair<double, double>> points;  // (epoch, value), finite only
  bool dashed = false;
};

struct Axis {
  double lo = 0, hi = 1, step = 1;
  std::vector<double> ticks;
};

double nice_step(double raw) {
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

Axis make_axis(double lo, double hi, int target, double min_step) {
  if (!(hi - lo > 1e-12 * std::max(1.0, std::fabs(hi)))) {
    const double pad = lo != 0 ? std::fabs(lo) * 0.1 : 1.0;
    lo -= pad;
    hi += pad;
  }
  Axis a;
  a.step = std::max(min_step, nice_step((hi - lo) / target));
  a.lo = std::floor(lo / a.step + 1e-9) * a.step;
  a.hi = std::ceil(hi / a.step - 1e-9) * a.step;
  for (double t = a.lo; t <= a.hi + a.step * 1e-6; t += a.step)
    a.ticks.push_back(std::fabs(t) < a.step * 1e-9 ? 0.0 : t);
  return a;
}

std::string tick_label(double v, double step, double max_abs) {
  if (max_abs >= 1e6 || step < 1e-4) return fmt("%.2g", v);
  const int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string svg_chart(const std::string& id, const std::string& title, const std::string& y_label,
                      const std::vector<Series>& series) {
  const double W = 600, H = 340, left = 78, right = 16, top = 50, bottom = 52;
  const double pw = W - left - right, ph = H - top - bottom;
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
  for (const Series& s : series)
    for (const auto& [x, y] : s.points) {
      xmin = std::min(xmin, x), xmax = std::max(xmax, x);
      ymin = std::min(ymin, y), ymax = std::max(ymax, y);
    }
  std::ostringstream o;
  o << "<figure class=\"chart\"><svg id=\"" << id << "\" xmlns=\"http://www.w3.org/2000/svg\" width=\""
    << W << "\" height=\"" << H << "\" viewBox=\"0 0 " << W << " " << H << "\" role=\"img\" aria-label=\""
    << escape_html(title) << "\">\n";
  o << "<text class=\"title\" x=\"" << W / 2 << "\" y=\"20\" text-anchor=\"middle\">" << escape_html(title)
    << "</text>\n";
  if (!std::isfinite(xmin)) {
    o << "<text x=\"" << W / 2 << "\" y=\"" << H / 2 << "\" text-anchor=\"middle\">no data</text></svg></figure>\n";
    return o.str();
  }
  const Axis ax = make_axis(xmin, xmax, 8, 1.0);
  const Axis ay = make_axis(ymin, ymax, 5, 0.0);
  auto X = [&](double x) { return left + (x - ax.lo) / (ax.hi - ax.lo) * pw; };
  auto Y = [&](double y) { return top + ph - (y - ay.lo) / (ay.hi - ay.lo) * ph; };
  const double ymax_abs = std::max(std::fabs(ay.lo), std::fabs(ay.hi));
  o << "<g class=\"grid\">";
  for (double t : ay.ticks)
    o << "<line x1=\"" << left << "\" x2=\"" << left + pw << "\" y1=\"" << Y(t) << "\" y2=\"" << Y(t) << "\"/>";
  o << "</g>\n<g class=\"axis\">";
  o << "<line x1=\"" << left << "\" x2=\"" << left << "\" y1=\"" << top << "\" y2=\"" << top + ph << "\"/>";
  o << "<line x1=\"" << left << "\" x2=\"" << left + pw << "\" y1=\"" << top + ph << "\" y2=\"" << top + ph
    << "\"/>";
  for (double t : ax.ticks) {
    o << "<line class=\"tick\" x1=\"" << X(t) << "\" x2=\"" << X(t) << "\" y1=\"" << top + ph << "\" y2=\""
      << top + ph + 5 << "\"/><text class=\"xtick\" x=\"" << X(t) << "\" y=\"" << top + ph + 18
      << "\" text-anchor=\"middle\">" << tick_label(t, ax.step, 0) << "</text>";
  }
  for (double t : ay.ticks) {
    o << "<line class=\"tick\" x1=\"" << left - 5 << "\" x2=\"" << left << "\" y1=\"" << Y(t) << "\" y2=\""
      << Y(t) << "\"/><text class=\"ytick\" x=\"" << left - 8 << "\" y=\"" << Y(t) + 4
      << "\" text-anchor=\"end\">" << tick_label(t, ay.step, ymax_abs) << "</text>";
  }
  o << "<text class=\"xlabel\" x=\"" << left + pw / 2 << "\" y=\"" << H - 10
    << "\" text-anchor=\"middle\">epoch</text>";
  o << "<text class=\"ylabel\" transform=\"translate(16," << top + ph / 2
    << ") rotate(-90)\" text-anchor=\"middle\">" << escape_html(y_label) << "</text></g>\n";
  double legend_x = left + 10;
  for (const Series& s : series) {
    if (s.points.empty()) continue;
    o << "<path class=\"series\" data-name=\"" << escape_html(s.name) << "\" data-points=\"" << s.points.size()
      << "\" fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"2\""
      << (s.dashed ? " stroke-dasharray=\"6 4\"" : "") << " d=\"";
    for (std::size_t i = 0; i < s.points.size(); ++i)
      o << (i ? " L" : "M") << fmt("%.2f", X(s.points[i].first)) << " " << fmt("%.2f", Y(s.points[i].second));
    o << "\"/>\n";
    if (!s.dashed)
      for (const auto& [x, y] : s.points)
        o << "<circle cx=\"" << fmt("%.2f", X(x)) << "\" cy=\"" << fmt("%.2f", Y(y)) << "\" r=\"2.5\" fill=\""
          << s.color << "\"><title>" << escape_html(s.name) << ", epoch " << static_cast<int64_t>(x) << ": "
          << fmt("%.6g", y) << "</title></circle>";
    // The legend sits in its own row between the title and the plot, clear of the curves.
    o << "\n<g class=\"legend\"><line x1=\"" << legend_x << "\" x2=\"" << legend_x + 18 << "\" y1=\"" << top - 14
      << "\" y2=\"" << top - 14 << "\" stroke=\"" << s.color << "\" stroke-width=\"2\""
      << (s.dashed ? " stroke-dasharray=\"6 4\"" : "") << "/><text x=\"" << legend_x + 22 << "\" y=\""
      << top - 10 << "\">" << escape_html(s.name) << "</text></g>\n";
    legend_x += 34 + 7.0 * s.name.size();
  }
  o << "</svg></figure>\n";
  return o.str();
}

// The curve of one per-epoch metric, named as the metrics table names it.
Series series_of(const std::vector<EpochMetrics>& h, double EpochMetrics::*field, const std::string& color) {
  Series s{metric_field(field).name, color, {}, false};
  for (const EpochMetrics& m : h)
    if (std::isfinite(m.*field)) s.points.emplace_back(static_cast<double>(m.epoch), m.*field);
  return s;
}

// ---- HTML ----------------------------------------------------------------------------

const char kStyle[] = R"(
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#555;margin:0 0 12px}
.charts{display:flex;flex-wrap:wrap;gap:12px}
figure.chart{margin:0;border:1px solid #e3e3e3;border-radius:4px}
svg text{font-size:12px;fill:#333}svg text.title{font-size:14px;font-weight:600}
svg .grid line{stroke:#eee}svg .axis line{stroke:#666}
table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ddd;padding:4px 8px;text-align:right}
th{background:#f5f5f5}td.left,th.left{text-align:left}
#confusion td.cm{min-width:38px}#confusion th.corner{background:#fff}
#checkpoints td{white-space:nowrap}#checkpoints td.integrity{white-space:normal}
.ok{color:#17632a;font-weight:600}.bad{color:#a40000}
pre#config{background:#f7f7f7;border:1px solid #e3e3e3;padding:10px;font-size:12px;overflow:auto}
.notes li{color:#8a5300}
#metric-descriptions{display:grid;grid-template-columns:max-content auto;gap:2px 12px;font-size:13px}
#metric-descriptions dt{font-family:monospace}#metric-descriptions dd{margin:0;color:#555}
)";

std::string confusion_table(const EvalResult& t, const std::vector<std::string>& names) {
  std::ostringstream o;
  int64_t total = 0;
  o << "<p>best.h5 on " << t.count << " test images: accuracy " << fmt("%.2f%%", 100.0 * t.accuracy)
    << ", mean loss " << fmt("%.4f", t.loss) << ". Rows: true class; columns: predicted class.</p>\n";
  o << "<table id=\"confusion\"><thead><tr><th class=\"corner\">true \\ predicted</th>";
  const int classes = static_cast<int>(t.confusion.size());
  // Fashion-MNIST's class names when the matrix is that size; indices otherwise.
  auto class_name = [&](int k) { return k < static_cast<int>(names.size()) ? names[k] : std::string(); };
  for (int k = 0; k < classes; ++k) o << "<th>" << k << "<br>" << escape_html(class_name(k)) << "</th>";
  o << "<th>recall</th></tr></thead><tbody>\n";
  for (int i = 0; i < classes; ++i) {
    int64_t row = 0;
    for (int k = 0; k < classes; ++k) row += t.confusion[i][k];
    total += row;
    o << "<tr><th class=\"left\">" << i << " " << escape_html(class_name(i)) << "</th>";
    for (int k = 0; k < classes; ++k) {
      const int64_t n = t.confusion[i][k];
      const double a = row > 0 ? static_cast<double>(n) / row : 0.0;
      const char* rgb = i == k ? "49,130,189" : "203,24,29";  // not a curve colour
      o << "<td class=\"cm\" data-count=\"" << n << "\" style=\"background:rgba(" << rgb << ","
        << fmt("%.3f", a) << ")" << (a > 0.55 ? ";color:#fff" : "") << "\">" << n << "</td>";
    }
    o << "<td>" << (row ? fmt("%.1f%%", 100.0 * t.confusion[i][i] / row) : "-") << "</td></tr>\n";
  }
  o << "</tbody></table>\n<p class=\"meta\">" << total << " images in the matrix.</p>\n";
  return o.str();
}

std::string checkpoint_table(const std::vector<CheckpointRow>& rows) {
  if (rows.empty()) return "<p id=\"checkpoints\">No checkpoint files in the run directory.</p>\n";
  std::ostringstream o;
  o << "<table id=\"checkpoints\"><thead><tr><th class=\"left\">file</th><th>epoch</th><th>size</th>"
       "<th class=\"left\">saved (UTC)</th><th class=\"left\">trained on</th><th class=\"left\">integrity</th>"
       "</tr></thead><tbody>\n";
  for (const CheckpointRow& r : rows) {
    std::string epoch = "-";
    if (r.epoch) {
      epoch = std::to_string(*r.epoch);
      if (r.step_in_epoch && *r.step_in_epoch > 0)
        epoch += " (+" + std::to_string(*r.step_in_epoch) + " steps)";
    }
    const bool ok = r.integrity == "ok";
    o << "<tr data-file=\"" << escape_html(r.file) << "\"><td class=\"left\">" << escape_html(r.file) << "</td><td>"
      << epoch << "</td><td data-bytes=\"" << r.bytes << "\">" << human_bytes(r.bytes) << "</td><td class=\"left\">"
      << escape_html(r.created_utc) << "</td><td class=\"left\">" << escape_html(r.saved_on)
      << "</td><td class=\"left integrity " << (ok ? "ok" : "bad") << "\">" << escape_html(r.integrity)
      << "</td></tr>\n";
  }
  o << "</tbody></table>\n";
  return o.str();
}

}  // namespace

ReportSummary write_run_report(const std::string& run_dir, const ReportOptions& options) {
  const fs::path dir(run_dir);
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw std::runtime_error(run_dir + ": no such run directory");
  if (!fs::is_directory(dir, ec)) throw std::runtime_error(run_dir + ": not a directory");
  ReportSummary summary;
  const RunMetrics metrics = read_metrics(dir);
  summary.epochs = static_cast<int64_t>(metrics.epochs.size());
  summary.metrics_source = metrics.source;
  std::string config_json;
  const std::vector<CheckpointRow> checkpoints = scan_checkpoints(dir, config_json);
  const std::optional<BestEvaluation> best = evaluate_best(dir, options, summary.notes);
  if (best) summary.best_test = best->result;
  summary.path = options.output.empty() ? (dir / run_files::kReport).string() : options.output;

  const auto& h = metrics.epochs;
  std::vector<Series> acc = {series_of(h, &EpochMetrics::val_acc, "#2ca02c")};
  if (metrics.test && std::isfinite(metrics.test->accuracy) && !h.empty()) {
    acc.push_back(Series{"test_acc " + fmt("%.4f", metrics.test->accuracy), "#9467bd",
                         {{static_cast<double>(h.front().epoch), metrics.test->accuracy},
                          {static_cast<double>(h.back().epoch), metrics.test->accuracy}},
                         true});
  }

  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
    << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
    << "<title>engine run report: " << escape_html(run_dir) << "</title><style>" << kStyle << "</style></head>\n<body>\n";
  o << "<h1>Run report: " << escape_html(run_dir) << "</h1>\n<p class=\"meta\">Generated " << utc_now(UtcFormat::Readable)
    << " by engine report. Metrics from " << escape_html(metrics.source) << ".</p>\n";

  o << "<table id=\"summary\"><tbody>";
  o << "<tr><th class=\"left\">epochs</th><td>" << h.size() << "</td></tr>";
  if (!h.empty()) {
    const EpochMetrics* best_val = nullptr;
    for (const EpochMetrics& m : h)
      if (std::isfinite(m.val_loss) && (!best_val || m.val_loss < best_val->val_loss)) best_val = &m;
    o << "<tr><th class=\"left\">final " << metric_field(&EpochMetrics::val_acc).name << "</th><td>"
      << fmt("%.4f", h.back().val_acc) << "</td></tr>";
    if (best_val)
      o << "<tr><th class=\"left\">lowest " << metric_field(&EpochMetrics::val_loss).name << "</th><td>"
        << fmt("%.4f", best_val->val_loss) << " (epoch "
        << best_val->epoch << ")</td></tr>";
    double total = 0;
    for (const EpochMetrics& m : h) total += std::isfinite(m.epoch_seconds) ? m.epoch_seconds : 0;
    o << "<tr><th class=\"left\">training time</th><td>" << fmt("%.1f s", total) << "</td></tr>";
  }
  if (metrics.test)
    o << "<tr><th class=\"left\">test accuracy (end of training)</th><td>" << fmt("%.4f", metrics.test->accuracy)
      << " on " << metrics.test->count << " images</td></tr>";
  if (summary.best_test)
    o << "<tr><th class=\"left\">test accuracy (best.h5)</th><td>" << fmt("%.4f", summary.best_test->accuracy)
      << "</td></tr>";
  o << "</tbody></table>\n";

  o << "<h2>Curves per epoch</h2>\n<div class=\"charts\">\n";
  o << svg_chart("chart-loss", "Loss", "cross-entropy",
                 {series_of(h, &EpochMetrics::train_loss, "#1f77b4"),
                  series_of(h, &EpochMetrics::val_loss, "#ff7f0e")});
  o << svg_chart("chart-accuracy", "Accuracy", "accuracy", acc);
  o << svg_chart("chart-lr", "Learning rate", "learning rate",
                 {series_of(h, &EpochMetrics::lr, "#d62728")});
  o << svg_chart("chart-loss-scale", "Loss scale", "loss scale",
                 {series_of(h, &EpochMetrics::loss_scale, "#8c564b")});
  o << "</div>\n";
  // What each curve is: the descriptions of the metrics table, in its order.
  o << "<dl id=\"metric-descriptions\">";
  for (const EpochMetricField& f : epoch_metric_fields())
    o << "<dt>" << escape_html(f.name) << "</dt><dd>" << escape_html(f.description) << "</dd>";
  o << "</dl>\n";

  o << "<h2>Confusion matrix of best.h5 on the test set</h2>\n";
  if (best) o << confusion_table(best->result, best->class_names);
  else o << "<p id=\"confusion-missing\">Not available (see the notes below).</p>\n";

  o << "<h2>Checkpoints</h2>\n" << checkpoint_table(checkpoints);

  o << "<h2>Config</h2>\n";
  if (config_json.empty()) {
    o << "<p id=\"config-missing\">No readable checkpoint holds the config.</p>\n";
  } else {
    std::string pretty = config_json;
    try {
      pretty = json::parse(config_json).dump(2);
    } catch (const std::exception&) {
      summary.notes.push_back("the stored config is not valid JSON; shown as stored");
    }
    o << "<pre id=\"config\">" << escape_html(pretty) << "</pre>\n";
  }
  if (!summary.notes.empty()) {
    o << "<h2>Notes</h2>\n<ul class=\"notes\">";
    for (const std::string& n : summary.notes) o << "<li>" << escape_html(n) << "</li>";
    o << "</ul>\n";
  }
  o << "</body></html>\n";

  // Atomically and durably, like every file of a run: a crash leaves the old page or the
  // new one, never half of one. The error names the path.
  write_file_atomically(Env::posix(), summary.path, o.str());
  return summary;
}

}  // namespace engine
