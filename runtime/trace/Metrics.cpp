#include "runtime/trace/Metrics.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"

#include "llvm/ADT/STLExtras.h"

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <functional>

namespace cleave::runtime {

static std::string number(double v) {
  if (!std::isfinite(v))
    return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string metricsJsonl(const std::vector<StepMetrics> &steps) {
  std::string out;
  for (const StepMetrics &m : steps) {
    out += "{\"step\": " + std::to_string(m.step) +
           ", \"loss\": " + number(m.loss);
    if (m.evalLoss)
      out += ", \"eval_loss\": " + number(*m.evalLoss);
    if (m.evalAccuracy)
      out += ", \"eval_accuracy\": " + number(*m.evalAccuracy);
    if (m.lr)
      out += ", \"lr\": " + number(*m.lr);
    if (m.gradNorm)
      out += ", \"grad_norm\": " + number(*m.gradNorm);
    out += ", \"step_ms\": " + number(1e3 * m.stepSeconds) +
           ", \"samples_per_s\": " + number(m.samplesPerSecond) + "}\n";
  }
  return out;
}

llvm::Expected<std::vector<StepMetrics>>
parseMetricsJsonl(llvm::StringRef text) {
  std::vector<StepMetrics> out;
  int line = 0;
  while (!text.empty()) {
    auto [first, rest] = text.split('\n');
    text = rest;
    ++line;
    if (first.trim().empty())
      continue;
    auto bad = [&](const std::string &why) {
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "line " + std::to_string(line) + ": " +
                                         why);
    };
    auto v = llvm::json::parse(first);
    if (!v)
      return bad(llvm::toString(v.takeError()));
    const llvm::json::Object *o = v->getAsObject();
    if (!o)
      return bad("not a JSON object");
    auto num = [&](const char *key) -> std::optional<double> {
      const llvm::json::Value *x = o->get(key);
      if (!x)
        return std::nullopt;
      if (x->kind() == llvm::json::Value::Null)
        return std::nan("");
      if (auto d = x->getAsNumber())
        return *d;
      return std::nullopt;
    };
    StepMetrics m;
    std::optional<int64_t> step;
    if (auto s = o->getInteger("step"))
      step = *s;
    std::optional<double> loss = num("loss");
    if (!step || *step < 1 || !loss)
      return bad("no step and loss");
    m.step = *step;
    m.loss = *loss;
    m.evalLoss = num("eval_loss");
    m.evalAccuracy = num("eval_accuracy");
    m.lr = num("lr");
    m.gradNorm = num("grad_norm");
    m.stepSeconds = num("step_ms").value_or(0) / 1e3;
    m.samplesPerSecond = num("samples_per_s").value_or(0);
    out.push_back(m);
  }
  return out;
}

namespace {

// Escapes the characters XML gives a meaning.
std::string xml(const std::string &s) {
  std::string out;
  for (char c : s)
    switch (c) {
    case '<': out += "&lt;"; break;
    case '>': out += "&gt;"; break;
    case '&': out += "&amp;"; break;
    case '"': out += "&quot;"; break;
    default: out += c;
    }
  return out;
}

std::string label(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// One chart: a box at (x0, y0) of w x h, its y range from the values.
struct Chart {
  double x0, y0, w, h;
  double xmin, xmax, ymin = INFINITY, ymax = -INFINITY;
  void cover(double v) {
    if (std::isfinite(v)) {
      ymin = std::min(ymin, v);
      ymax = std::max(ymax, v);
    }
  }
  void settle() {
    if (!(ymin <= ymax))
      ymin = 0, ymax = 1;
    if (ymax - ymin < 1e-12 * std::max(1.0, std::abs(ymax))) {
      ymin -= 0.5;
      ymax += 0.5;
    }
  }
  double x(double step) const {
    return x0 + (xmax > xmin ? (step - xmin) / (xmax - xmin) : 0.5) * w;
  }
  double y(double v) const { return y0 + h - (v - ymin) / (ymax - ymin) * h; }
  std::string frame(const std::string &name) const {
    return llvm::formatv(
               "<rect x=\"{0}\" y=\"{1}\" width=\"{2}\" height=\"{3}\" "
               "fill=\"none\" stroke=\"#888\"/>\n"
               "<text x=\"{4}\" y=\"{5}\" text-anchor=\"end\">{6}</text>\n"
               "<text x=\"{4}\" y=\"{7}\" text-anchor=\"end\">{8}</text>\n"
               "<text x=\"{0}\" y=\"{9}\">{10}</text>\n",
               x0, y0, w, h, x0 - 6, y0 + 10, label(ymax), y0 + h,
               label(ymin), y0 - 6, xml(name))
        .str();
  }
  // A polyline through the finite points (dots too when `dots`).
  std::string line(const std::vector<std::pair<double, double>> &pts,
                   const char *color, bool dots) const {
    std::string p, out;
    for (const auto &[s, v] : pts)
      if (std::isfinite(v)) {
        p += llvm::formatv("{0:F1},{1:F1} ", x(s), y(v)).str();
        if (dots)
          out += llvm::formatv("<circle cx=\"{0:F1}\" cy=\"{1:F1}\" r=\"3\" "
                               "fill=\"{2}\"/>\n",
                               x(s), y(v), color)
                     .str();
      }
    if (p.empty())
      return out;
    return "<polyline fill=\"none\" stroke=\"" + std::string(color) +
           "\" stroke-width=\"1.5\" points=\"" + p + "\"/>\n" + out;
  }
};

} // namespace

std::string lossCurveSvg(const std::vector<StepMetrics> &steps,
                         const std::string &title) {
  const double width = 800, left = 70, right = 20, top = 50;
  bool hasLr = llvm::any_of(steps, [](const StepMetrics &m) {
    return m.lr.has_value();
  });
  double xmin = steps.empty() ? 0 : double(steps.front().step);
  double xmax = steps.empty() ? 1 : double(steps.back().step);
  Chart loss{left, top, width - left - right, 280, xmin, xmax};
  Chart lr{left, top + 280 + 50, width - left - right, 110, xmin, xmax};
  std::vector<std::pair<double, double>> train, eval, rate;
  for (const StepMetrics &m : steps) {
    train.push_back({double(m.step), m.loss});
    loss.cover(m.loss);
    if (m.evalLoss) {
      eval.push_back({double(m.step), *m.evalLoss});
      loss.cover(*m.evalLoss);
    }
    if (m.lr) {
      rate.push_back({double(m.step), *m.lr});
      lr.cover(*m.lr);
    }
  }
  loss.settle();
  lr.settle();
  double height = hasLr ? lr.y0 + lr.h + 40 : loss.y0 + loss.h + 40;
  std::string svg = llvm::formatv(
                        "<svg xmlns=\"http://www.w3.org/2000/svg\" "
                        "width=\"{0}\" height=\"{1}\" font-family=\"sans-serif\" "
                        "font-size=\"12\">\n"
                        "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
                        "<text x=\"{2}\" y=\"22\" font-size=\"15\">{3}</text>\n",
                        width, height, left, xml(title))
                        .str();
  svg += loss.frame("loss: training (blue), validation (orange)");
  svg += loss.line(train, "#1f77b4", false);
  svg += loss.line(eval, "#ff7f0e", true);
  Chart &bottom = hasLr ? lr : loss;
  if (hasLr) {
    svg += lr.frame("learning rate");
    svg += lr.line(rate, "#2ca02c", false);
  }
  svg += llvm::formatv("<text x=\"{0}\" y=\"{1}\">step {2}</text>\n"
                       "<text x=\"{3}\" y=\"{1}\" text-anchor=\"end\">step "
                       "{4}</text>\n",
                       bottom.x0, bottom.y0 + bottom.h + 18, label(xmin),
                       bottom.x0 + bottom.w, label(xmax))
             .str();
  return svg + "</svg>\n";
}

} // namespace cleave::runtime
