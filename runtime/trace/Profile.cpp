#include "runtime/trace/Profile.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>

namespace cleave::runtime {

void ProfileSteps::take(StageExecutor &ex) {
  for (const auto &[key, prof] : ex.profile())
    seconds_[key].push_back(prof.seconds);
  ex.clearProfile();
}

ProfileMap ProfileSteps::trimmedMean() const {
  ProfileMap out;
  for (auto [key, all] : seconds_) {
    std::sort(all.begin(), all.end());
    size_t cut = all.size() / 10;
    double sum = 0;
    for (size_t i = cut; i < all.size() - cut; ++i)
      sum += all[i];
    out[key] = {sum / double(all.size() - 2 * cut), 1};
  }
  return out;
}

void appendProfileOps(const Plan &plan, const ProfileMap &profile,
                      llvm::json::Array &ops) {
  for (const auto &[key, prof] : profile) {
    if (key.first.empty())
      continue;
    bool step = key.second == Phase::Step;
    const char *phase = key.second == Phase::F   ? "fwd"
                        : key.second == Phase::B ? "B"
                        : key.second == Phase::W ? "W"
                                                 : "opt";
    double per = step ? prof.seconds : prof.seconds / double(plan.microbatches);
    ops.push_back(llvm::json::Object{
        {"loc", key.first}, {"phase", phase}, {"time", per}});
  }
}

std::string profileJson(llvm::json::Array ops) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::formatv("{0:2}\n",
                      llvm::json::Value(llvm::json::Object{
                          {"time_unit", "s"}, {"ops", std::move(ops)}}));
  os.flush();
  return text;
}

} // namespace cleave::runtime
