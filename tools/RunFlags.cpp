#include "tools/RunFlags.h"
#include "support/Errors.h"

#include <cmath>
#include <cstdlib>

namespace cleave::tools {

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
          {"warmup-steps", true, false},
          {"lr-decay", true, false},
          {"min-lr", true, false},
          {"decay-steps", true, false},
          {"clip-grad-norm", true, false},
          {"eval-data", true, false},
          {"eval-every", true, false},
          {"eval-batches", true, false},
          {"data-order", true, false},
          {"log", true, false},
          {"loss-curve", true, false},
          {"threads", true, false},
          {"device", true, false},
          {"save", true, false},
          {"profile", true, false},
          {"batch-w", false, false},
          {"cuda-graphs", false, false},
          {"trace", true, false},
          {"timeline", true, false},
          {"checkpoint-dir", true, false},
          {"checkpoint-every", true, false},
          {"resume", true, false},
          {"on-nan", true, false},
          {"overlap-steps", false, false},
          {"comm-timeout", true, false},
          {"comm", true, false},
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

// --warmup-steps, --lr-decay, --min-lr, --decay-steps: a schedule when any
// is given (runtime/LrSchedule.h).
static llvm::Error parseLrSchedule(const Flags &flags, RunOptions &opt) {
  if (!flags.has("warmup-steps") && !flags.has("lr-decay") &&
      !flags.has("min-lr") && !flags.has("decay-steps"))
    return llvm::Error::success();
  runtime::LrSchedule s;
  s.peak = opt.lr ? std::strtod(flags.get("lr")->c_str(), nullptr) : NAN;
  if (auto v = flags.get("warmup-steps")) {
    auto n = parseCount("warmup-steps", *v);
    if (!n)
      return n.takeError();
    s.warmupSteps = *n;
  }
  std::string decay = flags.get("lr-decay").value_or("none");
  if (decay == "cosine")
    s.decay = runtime::LrSchedule::Decay::Cosine;
  else if (decay == "linear")
    s.decay = runtime::LrSchedule::Decay::Linear;
  else if (decay != "none")
    return cleave::fail(
        "--lr-decay must be 'cosine', 'linear' or 'none', not '" + decay + "'");
  if (auto v = flags.get("min-lr")) {
    auto x = nonNegative(*v);
    if (!x)
      return cleave::fail("--min-lr needs a non-negative number, not '" + *v +
                          "'");
    if (s.decay == runtime::LrSchedule::Decay::None)
      return cleave::fail("--min-lr goes with --lr-decay=cosine or linear");
    if (opt.lr && *x > s.peak)
      return cleave::fail("--min-lr (" + *v + ") is above --lr (" +
                          *flags.get("lr") + ")");
    s.minLr = *x;
  }
  if (auto v = flags.get("decay-steps")) {
    auto n = parseCount("decay-steps", *v);
    if (!n)
      return n.takeError();
    if (*n == 0 || s.decay == runtime::LrSchedule::Decay::None)
      return cleave::fail(*n == 0
                              ? "--decay-steps needs a positive step count"
                              : "--decay-steps goes with --lr-decay=cosine or "
                                "linear");
    s.decaySteps = *n;
  }
  opt.lrSchedule = s;
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
      return cleave::fail("--lr needs a non-negative number, not '" + *v + "'");
    opt.lr = float(*x);
  }
  if (auto e = parseLrSchedule(flags, opt))
    return e;
  for (auto [name, var] : {std::pair<const char *, int64_t *>{
                               "eval-every", &opt.evalEvery},
                           {"eval-batches", &opt.evalBatches}})
    if (auto v = flags.get(name)) {
      auto n = parseCount(name, *v);
      if (!n)
        return n.takeError();
      if (*n == 0 || !flags.has("eval-data"))
        return cleave::fail(
            std::string("--") + name +
            (*n == 0 ? " needs a positive count" : " goes with --eval-data"));
      *var = *n;
    }
  if (auto v = flags.get("data-order")) {
    if (*v != "sequential" && *v != "shuffle")
      return cleave::fail(
          "--data-order must be 'sequential' or 'shuffle', not '" + *v + "'");
    std::string data = flags.get("data").value_or("");
    if (*v == "shuffle" && !(llvm::StringRef(data).startswith("tokens:") ||
                             llvm::StringRef(data).startswith("tokens32:")))
      return cleave::fail(
          "--data-order shuffle goes with --data tokens:FILE or "
          "tokens32:FILE");
    opt.shuffle = *v == "shuffle";
  }
  if (auto v = flags.get("clip-grad-norm")) {
    auto x = nonNegative(*v);
    if (!x || *x == 0)
      return cleave::fail("--clip-grad-norm needs a positive number, not '" +
                          *v + "'");
    opt.stage.clipGradNorm = *x;
  }
  if (auto v = flags.get("comm-timeout")) {
    auto x = nonNegative(*v);
    if (!x)
      return cleave::fail("--comm-timeout needs a number of seconds (0: wait "
                          "forever), not '" +
                          *v + "'");
    opt.stage.commTimeoutSeconds = *x;
  }
  if (auto v = flags.get("comm")) {
    if (*v != "keyed" && *v != "ordered" && *v != "nccl")
      return cleave::fail("--comm must be 'keyed', 'ordered' or 'nccl', not '" +
                          *v + "'");
    opt.stage.comm = *v;
  }
  std::string onNan = flags.get("on-nan").value_or("stop");
  if (onNan != "stop" && onNan != "skip-step" && onNan != "off")
    return cleave::fail("--on-nan must be 'stop', 'skip-step' or 'off', not '" +
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
  opt.stage.graphs = flags.has("cuda-graphs");
  if (opt.stage.device != "cpu" && opt.stage.device != "cuda" &&
      opt.stage.device != "cuda-emulated")
    return cleave::fail(
        "--device must be 'cpu', 'cuda' or 'cuda-emulated', not '" +
        opt.stage.device + "'");
  if (opt.stage.graphs && opt.stage.device == "cpu")
    return cleave::fail(
        "--cuda-graphs records CUDA kernels: it needs --device cuda "
        "(or cuda-emulated, which checks the recording on the host)");
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
