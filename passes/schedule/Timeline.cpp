#include "passes/schedule/Timeline.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace cleave::passes::schedule {

namespace {

// Chrome traces count microseconds; a uniform-model unit is drawn as 1 ms.
double microsPerUnit(const PipelineCosts &costs) {
  return costs.timeUnit == "s" ? 1e6 : 1e3;
}

llvm::json::Object metadata(const char *what, int tid, llvm::json::Value v) {
  return llvm::json::Object{{"name", what},
                            {"ph", "M"},
                            {"pid", 0},
                            {"tid", tid},
                            {"args", llvm::json::Object{{"name", std::move(v)}}}};
}

llvm::json::Object span(std::string name, const char *cat, int tid,
                        const Span &sp, double scale, int microbatch) {
  return llvm::json::Object{{"name", std::move(name)},
                            {"cat", cat},
                            {"ph", "X"},
                            {"pid", 0},
                            {"tid", tid},
                            {"ts", sp.start * scale},
                            {"dur", (sp.end - sp.start) * scale},
                            {"args", llvm::json::Object{{"microbatch", microbatch}}}};
}

// One colour per compute kind (colour-blind safe Tableau hues).
const char *fillOf(ActionKind kind) {
  switch (kind) {
  case ActionKind::F: return "#4C78A8";
  case ActionKind::B: return "#F58518";
  case ActionKind::W: return "#54A24B";
  case ActionKind::BW: return "#B279A2";
  default: return "#555555";
  }
}

const char *legendText(ActionKind kind) {
  switch (kind) {
  case ActionKind::F: return "F forward";
  case ActionKind::B: return "B input gradient";
  case ActionKind::W: return "W weight gradient";
  case ActionKind::BW: return "BW full backward";
  default: return "";
  }
}

// Geometry of the Gantt chart, in pixels.
struct GanttLayout {
  double left = 70, top = 44, rowHeight = 26, rowGap = 8, width = 960;
  double scale = 1; // pixels per time unit
  double rowY(int stage) const { return top + stage * (rowHeight + rowGap); }
  double x(double t) const { return left + t * scale; }
};

// A tick spacing of 1, 2 or 5 times a power of ten, about 10 ticks.
double tickStep(double span) {
  double raw = span / 10, pow10 = std::pow(10, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (raw <= m * pow10)
      return m * pow10;
  return 10 * pow10;
}

// Short numbers for labels: 33, 2.5, 0.000125.
std::string fmt(double v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// "stage 2", or with several stages per rank "rank 1 (1,5)".
std::string rowLabel(const Schedule &s, const std::vector<int> &stages,
                     size_t rank) {
  if (!sharesRanks(s))
    return "stage " + std::to_string(stages.front());
  std::string label = "rank " + std::to_string(rank) + " (";
  for (size_t k = 0; k < stages.size(); ++k)
    label += (k ? "," : "") + std::to_string(stages[k]);
  return label + ")";
}

// One row per rank: its stage, or its several stages' actions (a rank's
// later stages drawn lighter, each box's title naming its stage).
void drawRows(llvm::raw_ostream &os, const Schedule &s, const SimResult &r,
              const GanttLayout &g) {
  std::vector<std::vector<int>> ranks = stagesOfRanks(s);
  bool shared = sharesRanks(s);
  for (size_t rk = 0; rk < ranks.size(); ++rk) {
    double y = g.rowY(int(rk));
    std::string label = rowLabel(s, ranks[rk], rk);
    os << llvm::formatv("<text x=\"{0}\" y=\"{1}\" text-anchor=\"end\">{2}"
                        "</text>\n",
                        g.left - 8, y + g.rowHeight * 0.65, label);
    // The grey background is the idle time: whatever no box covers.
    os << llvm::formatv("<rect x=\"{0}\" y=\"{1}\" width=\"{2}\" height=\"{3}\" "
                        "fill=\"#E6E6E6\"/>\n",
                        g.x(0), y, r.makespan * g.scale, g.rowHeight);
    for (int st : ranks[rk])
    for (size_t i = 0; i < s.actions[st].size(); ++i) {
      const Action &a = s.actions[st][i];
      const Span &sp = r.spans[st][i];
      double w = (sp.end - sp.start) * g.scale;
      if (isSend(a.kind) && w > 0) // the message in flight, under the row
        os << llvm::formatv("<rect x=\"{0}\" y=\"{1}\" width=\"{2}\" "
                            "height=\"3\" fill=\"#333333\"><title>{3} to stage "
                            "{4}</title></rect>\n",
                            g.x(sp.start), y + g.rowHeight + 1, w,
                            actionName(a), a.peer);
      if (isComm(a.kind) || a.kind == ActionKind::Step || w <= 0)
        continue;
      os << llvm::formatv("<rect x=\"{0}\" y=\"{1}\" width=\"{2}\" height=\"{3}\" "
                          "fill=\"{4}\" fill-opacity=\"{8}\" stroke=\"white\" "
                          "stroke-width=\"1\"><title>{9}{5}: {6} to {7}</title>"
                          "</rect>\n",
                          g.x(sp.start), y, w, g.rowHeight, fillOf(a.kind),
                          actionName(a), fmt(sp.start), fmt(sp.end),
                          st == ranks[rk].front() ? "1" : "0.6",
                          shared ? "stage " + std::to_string(st) + " " : "");
      if (w >= 12)
        os << llvm::formatv("<text x=\"{0}\" y=\"{1}\" text-anchor=\"middle\" "
                            "fill=\"white\">{2}</text>\n",
                            g.x(sp.start) + w / 2, y + g.rowHeight * 0.65,
                            a.microbatch);
    }
  }
}

void drawAxis(llvm::raw_ostream &os, const SimResult &r, const GanttLayout &g,
              double y, const std::string &unit) {
  double step = tickStep(r.makespan);
  for (double t = 0; t <= r.makespan + 1e-9; t += step) {
    os << llvm::formatv("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" "
                        "stroke=\"#999999\"/>\n",
                        g.x(t), y, y + 5);
    os << llvm::formatv("<text x=\"{0}\" y=\"{1}\" text-anchor=\"middle\">{2}"
                        "</text>\n",
                        g.x(t), y + 18, fmt(t));
  }
  // In the left margin, under the row labels: after the last tick it
  // would run into that tick's number.
  os << llvm::formatv("<text x=\"{0}\" y=\"{1}\" text-anchor=\"end\">"
                      "time ({2})</text>\n",
                      g.left - 8, y + 18, unit);
}

void drawLegend(llvm::raw_ostream &os, const Schedule &s, double y, double x) {
  std::vector<ActionKind> used;
  for (ActionKind k : {ActionKind::F, ActionKind::B, ActionKind::W,
                       ActionKind::BW})
    for (const auto &list : s.actions)
      if (std::any_of(list.begin(), list.end(),
                      [&](const Action &a) { return a.kind == k; })) {
        used.push_back(k);
        break;
      }
  for (ActionKind k : used) {
    os << llvm::formatv("<rect x=\"{0}\" y=\"{1}\" width=\"14\" height=\"14\" "
                        "fill=\"{2}\"/><text x=\"{3}\" y=\"{4}\">{5}</text>\n",
                        x, y, fillOf(k), x + 20, y + 12, legendText(k));
    x += 170;
  }
  os << llvm::formatv("<rect x=\"{0}\" y=\"{1}\" width=\"14\" height=\"14\" "
                      "fill=\"#E6E6E6\"/><text x=\"{2}\" y=\"{3}\">idle</text>\n",
                      x, y, x + 20, y + 12);
}

} // namespace

std::string chromeTrace(const Schedule &s, const SimResult &r,
                        const PipelineCosts &costs) {
  double scale = microsPerUnit(costs);
  llvm::json::Array events;
  events.push_back(metadata("process_name", 0,
                            "cleave schedule " + s.name + " (P=" +
                                std::to_string(s.stages) + ", M=" +
                                std::to_string(s.microbatches) + ")"));
  // One track per rank (its stage, or its stages), and one for its sends.
  bool shared = sharesRanks(s);
  std::vector<std::vector<int>> ranks = stagesOfRanks(s);
  for (size_t rk = 0; rk < ranks.size(); ++rk) {
    int computeTid = 2 * int(rk), sendTid = 2 * int(rk) + 1;
    std::string track = shared ? "rank " + std::to_string(rk)
                               : "stage " + std::to_string(ranks[rk].front());
    events.push_back(metadata("thread_name", computeTid, track));
    events.push_back(metadata("thread_name", sendTid, track + " sends"));
    for (int st : ranks[rk])
      for (size_t i = 0; i < s.actions[st].size(); ++i) {
        const Action &a = s.actions[st][i];
        std::string prefix = shared ? "stage " + std::to_string(st) + " " : "";
        if (isSend(a.kind))
          events.push_back(span(prefix + actionName(a) + " to stage " +
                                    std::to_string(a.peer),
                                kindName(a.kind), sendTid, r.spans[st][i],
                                scale, a.microbatch));
        else if (!isComm(a.kind))
          events.push_back(span(prefix + actionName(a), kindName(a.kind),
                                computeTid, r.spans[st][i], scale,
                                a.microbatch));
      }
  }
  llvm::json::Object trace{
      {"traceEvents", std::move(events)},
      {"displayTimeUnit", "ms"},
      {"otherData",
       llvm::json::Object{{"schedule", s.name},
                          {"time_unit", costs.timeUnit},
                          {"microseconds_per_time_unit", scale},
                          {"step_time", r.stepTime}}}};
  std::string out;
  llvm::raw_string_ostream os(out);
  os << llvm::formatv("{0:2}", llvm::json::Value(std::move(trace))) << "\n";
  return os.str();
}

namespace {

// A chart's times with seconds drawn as milliseconds, the unit of
// cleave-run's measured timeline, so that the predicted and the measured
// step read alike.
struct Chart {
  const Schedule &s;
  SimResult r;
  std::string unit;
};

Chart inMilliseconds(const Schedule &s, const SimResult &simulated,
                     const PipelineCosts &costs) {
  Chart c{s, simulated, costs.timeUnit};
  if (c.unit == "s") {
    c.unit = "ms";
    c.r.stepTime *= 1e3;
    c.r.makespan *= 1e3;
    for (std::vector<Span> &row : c.r.spans)
      for (Span &sp : row)
        sp.start *= 1e3, sp.end *= 1e3;
  }
  return c;
}

// Room on the left for the longest row label ("rank 3 (3,7,11)") and the
// axis's unit, at about 7 pixels a character.
double leftMargin(const Chart &c) {
  size_t longest = std::string("time (" + c.unit + ")").size();
  std::vector<std::vector<int>> ranks = stagesOfRanks(c.s);
  for (size_t rk = 0; rk < ranks.size(); ++rk)
    longest = std::max(longest, rowLabel(c.s, ranks[rk], rk).size());
  return std::max(GanttLayout{}.left, 12 + 7.0 * double(longest));
}

// "zb-h1: P=2, M=4, step time 12.19 ms, bubble up to 28.2%".
std::string titleOf(const Chart &c) {
  const Schedule &s = c.s;
  const SimResult &r = c.r;
  double worst = 0;
  for (const StageStats &st : r.stages)
    worst = std::max(worst, st.bubble);
  auto short4 = [](double v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%.4g", v);
    return std::string(buf);
  };
  // Without a barrier between steps the step time can be shorter than the
  // isolated step drawn here (Simulator.h); then say both.
  std::string isolated = r.makespan > r.stepTime
                             ? " (one isolated step, as drawn: " +
                                   short4(r.makespan) + ")"
                             : "";
  return llvm::formatv("{0}: P={1}, M={2}, step time {3} {4}{5}, bubble up "
                       "to {6:P1}",
                       s.name,
                       sharesRanks(s) ? std::to_string(rankCount(s)) +
                                            " ranks x " +
                                            std::to_string(s.stages /
                                                           rankCount(s))
                                      : std::to_string(s.stages),
                       s.microbatches, short4(r.stepTime), c.unit, isolated,
                       worst)
      .str();
}

// Wide enough for the rows and for the title (bold 15px, about 8.5 pixels
// a character).
double widthFor(const Chart &c, const GanttLayout &g) {
  return std::max(g.left + g.width + 30,
                  g.left + 8.5 * double(titleOf(c).size()) + 10);
}

// The title, rows, axis and legend of one chart whose top is at `top`;
// returns the chart's height.
double drawChart(llvm::raw_ostream &os, const Chart &c, GanttLayout g,
                 double top) {
  const Schedule &s = c.s;
  const SimResult &r = c.r;
  g.top += top;
  double axisY = g.rowY(rankCount(s)) + 2;
  double legendY = axisY + 34;
  os << llvm::formatv("<text x=\"{0}\" y=\"{1}\" font-size=\"15\" "
                      "font-weight=\"bold\">{2}</text>\n",
                      g.left, top + 22, titleOf(c));
  drawRows(os, s, r, g);
  drawAxis(os, r, g, axisY, c.unit);
  drawLegend(os, s, legendY, g.left);
  return legendY + 30 - top;
}

std::string svgDocument(const std::string &body, double width,
                        double height) {
  return llvm::formatv("<svg xmlns=\"http://www.w3.org/2000/svg\" "
                       "width=\"{0}\" height=\"{1}\" "
                       "font-family=\"sans-serif\" font-size=\"12\">\n"
                       "<rect width=\"{0}\" height=\"{1}\" "
                       "fill=\"white\"/>\n{2}</svg>\n",
                       width, height, body)
      .str();
}

} // namespace

std::string ganttSvg(const Schedule &s, const SimResult &r,
                     const PipelineCosts &costs) {
  Chart c = inMilliseconds(s, r, costs);
  GanttLayout g;
  g.left = leftMargin(c);
  g.scale = c.r.makespan > 0 ? g.width / c.r.makespan : 1;
  std::string body;
  llvm::raw_string_ostream os(body);
  double height = drawChart(os, c, g, 0);
  os.flush();
  return svgDocument(body, widthFor(c, g), height);
}

std::string ganttSvgPair(const Schedule &s1, const SimResult &r1,
                         const PipelineCosts &costs1, const Schedule &s2,
                         const SimResult &r2, const PipelineCosts &costs2) {
  Chart a = inMilliseconds(s1, r1, costs1), b = inMilliseconds(s2, r2, costs2);
  GanttLayout g;
  g.left = std::max(leftMargin(a), leftMargin(b));
  // One scale for both, so that equal times are equal lengths.
  double longest = std::max(a.r.makespan, b.r.makespan);
  g.scale = longest > 0 ? g.width / longest : 1;
  std::string body;
  llvm::raw_string_ostream os(body);
  double height = drawChart(os, a, g, 0);
  height += drawChart(os, b, g, height);
  os.flush();
  return svgDocument(body, std::max(widthFor(a, g), widthFor(b, g)), height);
}

} // namespace cleave::passes::schedule
