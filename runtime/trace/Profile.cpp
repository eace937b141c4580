#include "runtime/trace/Profile.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>

namespace cleave::runtime {

namespace {

// The mean of every profiled step, in the steps' order.
double meanOf(const std::vector<double> &all) {
  if (all.empty())
    return 0;
  double sum = 0;
  for (double x : all)
    sum += x;
  return sum / double(all.size());
}

} // namespace

void ProfileSteps::take(StageExecutor &ex) {
  for (const auto &[key, prof] : ex.profile()) {
    seconds_[key].push_back(prof.seconds);
    if (key.second != Phase::Step)
      kernelSeconds_[size_t(key.second)] += prof.seconds;
  }
  for (Phase p : {Phase::F, Phase::B, Phase::W})
    kernelWait_[size_t(p)] += ex.kernelCoreWait(p);
  for (size_t k = 0; k < overhead_.size(); ++k) {
    const InstrProfile &o = ex.actionOverhead()[k];
    if (o.calls > 0) {
      overhead_[k].push_back(o.seconds / double(o.calls));
      coreWait_[k].push_back(ex.actionCoreWait()[k] / double(o.calls));
    }
  }
  // Taken every step, so a step that was not profiled leaves none behind.
  MessageDelays d = ex.comm().takeMessageDelays();
  if (ex.profiling()) {
    delays_.seconds += d.seconds;
    delays_.waited += d.waited;
    delays_.received += d.received;
    delays_.coreWait += ex.recvCoreWait();
  }
  ex.clearProfile();
}

ProfileMap ProfileSteps::mean() const {
  ProfileMap out;
  for (const auto &[key, all] : seconds_)
    out[key] = {meanOf(all), 1};
  return out;
}

std::array<double, 3> ProfileSteps::kernelCoreWaitShare() const {
  std::array<double, 3> out{};
  for (size_t p = 0; p < out.size(); ++p)
    out[p] = kernelSeconds_[p] > 0
                 ? std::clamp(kernelWait_[p] / kernelSeconds_[p], 0.0, 1.0)
                 : 0;
  return out;
}

std::array<double, 5> ProfileSteps::actionCoreWait() const {
  std::array<double, 5> out{};
  for (size_t k = 0; k < out.size(); ++k)
    out[k] = meanOf(coreWait_[k]);
  return out;
}

std::array<double, 5> ProfileSteps::actionOverhead() const {
  std::array<double, 5> out{};
  for (size_t k = 0; k < out.size(); ++k)
    out[k] = meanOf(overhead_[k]);
  return out;
}

void appendActionOverheads(int stage, const std::array<double, 5> &overhead,
                           llvm::json::Array &ops,
                           const std::array<double, 5> *coreWait) {
  for (ActionKind k : {ActionKind::F, ActionKind::B, ActionKind::W,
                       ActionKind::BW, ActionKind::Step})
    if (overhead[size_t(k)] > 0) {
      llvm::json::Object entry{{"stage", stage},
                               {"action", actionKindName(k)},
                               {"overhead", overhead[size_t(k)]}};
      if (coreWait)
        entry["core_wait"] = std::min((*coreWait)[size_t(k)], overhead[size_t(k)]);
      ops.push_back(std::move(entry));
    }
}

void appendMessageDelays(int stage, const MessageDelays &delays,
                         llvm::json::Array &ops) {
  if (delays.waited == 0)
    return;
  ops.push_back(llvm::json::Object{
      {"stage", stage},
      {"latency", delays.seconds / double(delays.waited)},
      {"waited", delays.waited},
      {"received", delays.received},
      {"core_wait", std::min(delays.coreWait, delays.seconds) /
                        double(delays.waited)}});
}

void appendProfileOps(const Plan &plan, const ProfileMap &profile,
                      llvm::json::Array &ops,
                      const std::array<double, 3> *coreWaitShare) {
  for (const auto &[key, prof] : profile) {
    if (key.first.empty())
      continue;
    bool step = key.second == Phase::Step;
    const char *phase = key.second == Phase::F   ? "fwd"
                        : key.second == Phase::B ? "B"
                        : key.second == Phase::W ? "W"
                                                 : "opt";
    double per = step ? prof.seconds : prof.seconds / double(plan.microbatches);
    llvm::json::Object entry{{"loc", key.first}, {"phase", phase}, {"time", per}};
    if (coreWaitShare && !step)
      entry["core_wait"] = per * (*coreWaitShare)[size_t(key.second)];
    ops.push_back(std::move(entry));
  }
}

void appendCoreWait(int stage, double seconds, llvm::json::Array &ops) {
  ops.push_back(
      llvm::json::Object{{"stage", stage}, {"step_core_wait", seconds}});
}

std::string profileJson(llvm::json::Array entries, int cores,
                        std::optional<double> otherCores,
                        std::optional<double> otherRunnable) {
  llvm::json::Array ops, actions, messages, waits;
  for (llvm::json::Value &e : entries) {
    const llvm::json::Object *o = e.getAsObject();
    if (o && o->get("step_core_wait")) {
      waits.push_back(llvm::json::Object{
          {"stage", *o->getInteger("stage")},
          {"seconds", *o->getNumber("step_core_wait")}});
      continue;
    }
    (o && o->get("latency")  ? messages
     : o && o->get("action") ? actions
                             : ops)
        .push_back(std::move(e));
  }
  llvm::json::Object top{{"time_unit", "s"},
                         {"ops", std::move(ops)},
                         {"actions", std::move(actions)},
                         {"messages", std::move(messages)}};
  if (cores > 0) {
    llvm::json::Object c{{"cores", cores}, {"core_wait", std::move(waits)}};
    if (otherCores)
      c["other_cores"] = *otherCores;
    if (otherRunnable)
      c["other_runnable"] = *otherRunnable;
    top["cores"] = std::move(c);
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::formatv("{0:2}\n", llvm::json::Value(std::move(top)));
  os.flush();
  return text;
}

} // namespace cleave::runtime
