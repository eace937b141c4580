#include "tools/RunFlags.h"

#include <cmath>
#include <cstdlib>

namespace cleave::tools {

static llvm::Error usage(const std::string &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg);
}

// A finite number >= 0, or nothing.
static std::optional<double> nonNegative(const std::string &v) {
  char *end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end || !(x >= 0) || !std::isfinite(x))
    return std::nullopt;
  return x;
}

std::vector<Flags::Spec> runFlagSpecs() {
  return {{"help", false, false},
          {"data", true, false},
          {"seed", true, false},
          {"steps", true, false},
          {"lr", true, false},
          {"threads", true, false},
          {"device", true, false},
          {"save", true, false},
          {"profile", true, false},
          {"batch-w", false, false},
          {"trace", true, false},
          {"timeline", true, false},
          {"checkpoint-dir", true, false},
          {"checkpoint-every", true, false},
          {"resume", true, false},
          {"on-nan", true, false},
          {"overlap-steps", false, false},
          {"comm-timeout", true, false},
          {"print-plan", false, false},
          trustDirFlagSpec(),
          allowLargeFlagSpec(),
          {"quiet", false, false}};
}

// --checkpoint-every: sets `every` (0 without the flag: a checkpoint only
// after the last step).
static llvm::Error parseCheckpointEvery(const Flags &flags, int64_t &every) {
  auto k = flags.get("checkpoint-every");
  if (!k)
    return llvm::Error::success();
  auto n = parseCount("checkpoint-every", *k);
  if (!n)
    return n.takeError();
  if (*n == 0 || !flags.has("checkpoint-dir"))
    return llvm::createStringError(
        llvm::inconvertibleErrorCode(),
        *n == 0 ? "--checkpoint-every needs a positive step count"
                : "--checkpoint-every goes with --checkpoint-dir");
  every = *n;
  return llvm::Error::success();
}

llvm::Error readRunOptions(const Flags &flags, RunOptions &opt) {
  for (auto [name, var] :
       {std::pair<const char *, int64_t *>{"steps", &opt.steps},
        {"seed", &opt.seed},
        {"threads", &opt.threads}})
    if (auto v = flags.get(name)) {
      auto n = parseCount(name, *v);
      if (!n)
        return n.takeError();
      *var = *n;
    }
  if (auto e =
          checkLimit(flags, "threads", opt.threads,
                     &support::SizeLimits::threads, "kernel threads per stage"))
    return e;
  if (auto e = checkLimit(flags, "steps", opt.steps,
                          &support::SizeLimits::steps, "steps"))
    return e;
  if (auto v = flags.get("lr")) {
    auto x = nonNegative(*v);
    if (!x)
      return usage("--lr needs a non-negative number, not '" + *v + "'");
    opt.lr = float(*x);
  }
  if (auto v = flags.get("comm-timeout")) {
    auto x = nonNegative(*v);
    if (!x)
      return usage("--comm-timeout needs a number of seconds (0: wait "
                   "forever), not '" +
                   *v + "'");
    opt.stage.commTimeoutSeconds = *x;
  }
  std::string onNan = flags.get("on-nan").value_or("stop");
  if (onNan != "stop" && onNan != "skip-step" && onNan != "off")
    return usage("--on-nan must be 'stop', 'skip-step' or 'off', not '" +
                 onNan + "'");
  opt.skipNonFinite = onNan == "skip-step";
  opt.stage.nonFinite =
      onNan == "off"       ? runtime::StageExecutor::NonFinitePolicy::Ignore
      : opt.skipNonFinite ? runtime::StageExecutor::NonFinitePolicy::SkipStep
                          : runtime::StageExecutor::NonFinitePolicy::Stop;
  opt.overlapSteps = flags.has("overlap-steps");
  auto trusted = readTrustDirs(flags);
  if (!trusted)
    return trusted.takeError();
  opt.trusted = std::move(*trusted);
  opt.stage.device = flags.get("device").value_or("cpu");
  opt.stage.batchW = flags.has("batch-w");
  if (opt.stage.device != "cpu" && opt.stage.device != "cuda" &&
      opt.stage.device != "cuda-emulated")
    return usage("--device must be 'cpu', 'cuda' or 'cuda-emulated', not '" +
                 opt.stage.device + "'");
  return parseCheckpointEvery(flags, opt.checkpointEvery);
}

std::string resultFlagsText(const Flags &flags) {
  std::string text;
  for (const Flags::Spec &sp : runFlagSpecs()) {
    if (sp.name == "threads" || sp.name == "quiet" ||
        sp.name == "comm-timeout")
      continue;
    if (sp.takesValue)
      for (const std::string &v : flags.getAll(sp.name))
        text += sp.name + "=" + v + "\n";
    else if (flags.has(sp.name))
      text += sp.name + "\n";
  }
  return text;
}

} // namespace cleave::tools
