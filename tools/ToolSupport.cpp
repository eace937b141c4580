#include "tools/ToolSupport.h"
#include "support/Errors.h"

#include "passes/Pass.h"
#include "support/FileIO.h"
#include "support/TextFormat.h"

#include "llvm/Support/FormatVariadic.h"

#include "llvm/Support/Regex.h"

#include <cmath>
#include <new>
#include <stdexcept>
#include <cstdio>
#include <set>

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/raw_ostream.h"

#include <unistd.h>

namespace cleave::tools {

std::string escapeControls(llvm::StringRef text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    unsigned char u = static_cast<unsigned char>(c);
    if (c == '\n')
      out += "\\n";
    else if (u < 0x20 || u == 0x7f) {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", unsigned(u));
      out += hex;
    } else
      out += c;
  }
  return out;
}

std::string wrapText(llvm::StringRef text, unsigned indent, unsigned width) {
  std::string out, line;
  llvm::SmallVector<llvm::StringRef, 32> words;
  text.split(words, ' ', -1, false);
  for (llvm::StringRef w : words) {
    if (!line.empty() && indent + line.size() + 1 + w.size() > width) {
      out += std::string(indent, ' ') + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + w.str();
  }
  if (!line.empty())
    out += std::string(indent, ' ') + line;
  return out;
}

int fail(const std::string &tool, const std::string &message, int code) {
  // Keep the promise of one line: names from files and flags may hold a
  // newline, a carriage return or a terminal escape.
  // One write: under mpirun each rank's stderr is forwarded as it comes, and
  // a line written in pieces can be split by another process's output.
  std::string line = tool + ": error: " + escapeControls(message) + "\n";
  llvm::errs() << line;
  llvm::errs().flush();
  return code;
}

llvm::Error Flags::parse(int argc, char **argv) {
  for (int i = 1; i < argc; ++i) {
    llvm::StringRef arg = argv[i];
    if (arg == "-" || !arg.startswith("-")) {
      positional_.push_back(arg.str());
      continue;
    }
    llvm::StringRef body = arg.startswith("--") ? arg.drop_front(2)
                                                : arg.drop_front(1);
    auto [name, value] = body.split('=');
    bool hasValue = body.contains('=');
    const Spec *spec = nullptr;
    for (const Spec &s : specs_)
      if (s.name == name)
        spec = &s;
    if (!spec)
      return cleave::fail("unknown flag '" + arg.str() + "' (see --help)");
    std::string v;
    if (spec->takesValue) {
      if (hasValue) {
        v = value.str();
      } else if (i + 1 < argc) {
        v = argv[++i];
      } else {
        return cleave::fail("flag '" + arg.str() + "' needs a value");
      }
    } else if (hasValue) {
      return cleave::fail("flag '--" + name.str() + "' takes no value");
    }
    if (!spec->repeatable && values_.count(spec->name))
      return cleave::fail("flag '--" + spec->name + "' is given twice");
    values_.emplace(spec->name, v);
  }
  return llvm::Error::success();
}

std::optional<std::string> Flags::get(const std::string &name) const {
  auto it = values_.find(name);
  if (it == values_.end())
    return std::nullopt;
  return it->second;
}

std::vector<std::string> Flags::getAll(const std::string &name) const {
  std::vector<std::string> out;
  auto [b, e] = values_.equal_range(name);
  for (auto it = b; it != e; ++it)
    out.push_back(it->second);
  return out;
}

llvm::Expected<int64_t> parseCount(const std::string &flag,
                                   const std::string &value) {
  long long v;
  if (llvm::StringRef(value).getAsInteger(10, v) || v < 0) {
    bool digits = !value.empty() &&
                  value.find_first_not_of("0123456789") == std::string::npos;
    if (digits)
      return cleave::fail("--" + flag + "=" + value + " is too large");
    return cleave::fail("--" + flag + " needs a non-negative integer, not '" +
                        value + "'");
  }
  return int64_t(v);
}

// "--x" for a flag named x, "-o" for a one-letter one.
static std::string spelled(const std::string &name) {
  return (name.size() == 1 ? "-" : "--") + name;
}

std::vector<std::string> documentedFlags(llvm::StringRef help) {
  std::vector<std::string> out;
  llvm::SmallVector<llvm::StringRef, 64> lines;
  help.split(lines, '\n');
  for (llvm::StringRef line : lines) {
    if (!line.startswith("  -"))
      continue;
    // The entry is what comes before its description, which starts after
    // a run of two or more spaces.
    llvm::StringRef entry = line.drop_front(2);
    entry = entry.take_front(entry.find("  "));
    for (size_t i = 0; i < entry.size(); ++i) {
      if (entry[i] != '-' || (i > 0 && entry[i - 1] != ' ' &&
                              entry[i - 1] != ','))
        continue;
      size_t end = i;
      while (end < entry.size() && entry[end] == '-')
        ++end;
      size_t nameStart = end;
      while (end < entry.size() &&
             (llvm::isAlnum(entry[end]) || entry[end] == '-'))
        ++end;
      if (end > nameStart)
        out.push_back(entry.slice(i, end).str());
      i = end;
    }
  }
  return out;
}

llvm::Error Flags::checkHelp(llvm::StringRef help) const {
  std::set<std::string> documented;
  for (const std::string &flag : documentedFlags(help)) {
    std::string name = llvm::StringRef(flag).ltrim('-').str();
    if (!documented.insert(name).second)
      return cleave::fail("--help documents " + flag + " twice");
    if (llvm::none_of(specs_, [&](const Spec &s) { return s.name == name; }))
      return cleave::fail("--help documents " + flag +
                          ", which the flag parser does not take");
  }
  for (const Spec &s : specs_)
    if (!documented.count(s.name))
      return cleave::fail("the flag parser takes " + spelled(s.name) +
                          ", which --help does not document");
  return llvm::Error::success();
}

int printHelp(const std::string &tool, const Flags &flags,
              llvm::StringRef help) {
  if (auto e = flags.checkHelp(help))
    return fail(tool, "internal error: " + llvm::toString(std::move(e)),
                kBadInput);
  llvm::outs() << help;
  return kOk;
}

int guardedMain(const char *tool, int argc, char **argv,
                int (*body)(int, char **)) {
  try {
    return body(argc, argv);
  } catch (const std::bad_alloc &) {
    return fail(tool,
                "out of memory: an allocation failed (a size in the input "
                "asks for more memory than this process may take; check the "
                "input, or raise the memory limit)",
                kBadInput);
  } catch (const std::length_error &e) {
    return fail(tool,
                std::string("out of memory: a size in the input is too "
                            "large (") +
                    e.what() + ")",
                kBadInput);
  }
}

Flags::Spec allowLargeFlagSpec() { return {"allow-large", false, false}; }

std::string allowLargeHelp(const std::vector<LargeBound> &bounds) {
  std::string text = "raise the bounds on what may be asked for from what "
                     "one machine or a modest cluster runs:";
  for (size_t i = 0; i < bounds.size(); ++i) {
    switch (bounds[i]) {
    case LargeBound::Threads:
      text += " --threads from 4 x the cores to 2^16";
      break;
    case LargeBound::Workers:
      text += " stages x data-parallel replicas from 4096 to 2^20";
      break;
    case LargeBound::Stages:
      text += " stages (P x V) from 4096 to 2^20";
      break;
    case LargeBound::Microbatches:
      text += " microbatches from 2^20 to 2^24";
      break;
    case LargeBound::Steps:
      text += " --steps from 2^40 to 2^62";
      break;
    }
    text += i + 1 == bounds.size() ? "" : ",";
  }
  // Wrapped into the description column of the other entries.
  constexpr size_t kColumn = 25, kWidth = 77;
  const std::string entry = "  --allow-large";
  std::string out = "limits:\n" + entry + std::string(kColumn - entry.size(), ' ');
  llvm::SmallVector<llvm::StringRef, 32> words;
  llvm::StringRef(text).split(words, ' ', -1, false);
  size_t col = kColumn;
  for (llvm::StringRef w : words) {
    if (col > kColumn && col + 1 + w.size() > kWidth) {
      out += "\n" + std::string(kColumn, ' ');
      col = kColumn;
    } else if (col > kColumn) {
      out += ' ';
      ++col;
    }
    out += w.str();
    col += w.size();
  }
  return out + "\n";
}

Flags::Spec trustDirFlagSpec() { return {"trust-dir", true, true}; }

llvm::Expected<support::TrustedFolders> readTrustDirs(const Flags &flags) {
  support::TrustedFolders trusted;
  for (const std::string &dir : flags.getAll("trust-dir")) {
    if (!llvm::sys::fs::is_directory(dir))
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "--trust-dir '" + dir +
                                         "' is not a folder");
    trusted.dirs.push_back(dir);
  }
  return trusted;
}


support::SizeLimits limitsFor(const Flags &flags) {
  return support::limitsFor(flags.has("allow-large"));
}

static llvm::Error overLimit(const Flags &flags, const std::string &asked,
                             int64_t limit, int64_t support::SizeLimits::*field,
                             const std::string &what) {
  bool large = flags.has("allow-large");
  return cleave::fail(
      asked + " is more than " + std::to_string(limit) + " " + what +
      ", the most cleave runs " +
      (large ? std::string("even with --allow-large")
             : "without --allow-large (which allows up to " +
                   std::to_string(support::largeLimits().*field) + ")"));
}

llvm::Error checkLimit(const Flags &flags, const std::string &flag,
                       int64_t value, int64_t support::SizeLimits::*limit,
                       const std::string &what) {
  int64_t most = limitsFor(flags).*limit;
  if (value <= most)
    return llvm::Error::success();
  return overLimit(flags, "--" + flag + "=" + std::to_string(value), most,
                   limit, what);
}

llvm::Error checkCsvLimits(const Flags &flags, const std::string &source,
                           int64_t stages, int64_t ranks,
                           int64_t microbatches) {
  support::SizeLimits most = limitsFor(flags);
  if (stages > most.workers || ranks > most.workers)
    return overLimit(flags,
                     source + " (" + std::to_string(std::max(stages, ranks)) +
                         (stages >= ranks ? " stages)" : " ranks)"),
                     most.workers, &support::SizeLimits::workers, "stages");
  if (microbatches > most.microbatches)
    return overLimit(flags,
                     source + " (" + std::to_string(microbatches) +
                         " microbatches)",
                     most.microbatches, &support::SizeLimits::microbatches,
                     "microbatches");
  return llvm::Error::success();
}

llvm::Error checkWorkers(const Flags &flags, int64_t stages,
                         int64_t dataParallel) {
  int64_t most = limitsFor(flags).workers;
  if (stages <= most && dataParallel <= most / std::max<int64_t>(stages, 1))
    return llvm::Error::success();
  return overLimit(flags,
                   std::to_string(stages) + " stages x " +
                       std::to_string(dataParallel) + " data-parallel replicas",
                   most, &support::SizeLimits::workers, "workers");
}

std::vector<std::string> splitList(const std::string &s) {
  llvm::SmallVector<llvm::StringRef, 8> parts;
  llvm::StringRef(s).split(parts, ',', -1, false);
  std::vector<std::string> out;
  for (llvm::StringRef p : parts)
    if (!p.trim().empty())
      out.push_back(p.trim().str());
  return out;
}

llvm::Error readPrintFlags(const Flags &flags, ir::PrintOptions &opts) {
  if (auto lim = flags.get("inline-limit")) {
    auto v = parseCount("inline-limit", *lim);
    if (!v)
      return v.takeError();
    opts.inlineLimit = *v;
  }
  return llvm::Error::success();
}

llvm::Error loadSmallTensors(ir::Graph &g, int64_t limit) {
  for (ir::Value *v : g.declared())
    if (v->type().numElements() <= limit && !v->data()->isLoaded())
      if (llvm::Error e = v->data()->load())
        return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                       "%" + v->name() + ": " +
                                           llvm::toString(std::move(e)));
  return llvm::Error::success();
}

llvm::Error readImportFlags(const Flags &flags,
                            frontend::ImportOptions &opts) {
  opts.differentiate = passes::differentiate;
  for (const std::string &spec : flags.getAll("input-shape")) {
    auto [name, dims] = llvm::StringRef(spec).split('=');
    if (name.empty() || !llvm::StringRef(spec).contains('='))
      return cleave::fail("--input-shape needs NAME=d0,d1,..., not '" + spec +
                          "'");
    std::vector<int64_t> shape;
    for (const std::string &d : splitList(dims.str())) {
      auto v = parseCount("input-shape", d);
      if (!v)
        return v.takeError();
      shape.push_back(*v);
    }
    if (opts.inputShapes.count(name.str()))
      return cleave::fail("--input-shape gives '" + name.str() + "' twice");
    opts.inputShapes[name.str()] = shape;
  }
  if (auto mb = flags.get("microbatch-size")) {
    auto v = parseCount("microbatch-size", *mb);
    if (!v)
      return v.takeError();
    if (*v == 0)
      return cleave::fail("--microbatch-size must be at least 1");
    opts.microbatchSize = *v;
  }
  if (auto mode = flags.get("module-mode")) {
    using Mode = frontend::ImportOptions::ModuleMode;
    if (*mode == "auto")
      opts.moduleMode = Mode::Auto;
    else if (*mode == "train")
      opts.moduleMode = Mode::Train;
    else if (*mode == "eval")
      opts.moduleMode = Mode::Eval;
    else
      return cleave::fail("--module-mode must be auto, train or eval, not '" +
                          *mode + "'");
  }
  return llvm::Error::success();
}

llvm::Error checkMicrobatchSizeUsed(const ir::Graph &g,
                                    const frontend::ImportOptions &opts) {
  if (!opts.microbatchSize)
    return llvm::Error::success();
  int64_t n = *opts.microbatchSize;
  const ir::Value *fixed = nullptr;
  for (const ir::Value *v : g.inputs()) {
    if (v->type().rank() == 0)
      continue;
    if (v->type().shape[0] == n)
      return llvm::Error::success();
    if (!fixed)
      fixed = v;
  }
  std::string why =
      fixed ? "the model fixes the leading (batch) dimension of its inputs ('" +
                  fixed->name() + "' is " + fixed->type().str() + ")"
            : "the model has no input with a leading dimension";
  return cleave::fail("--microbatch-size=" + std::to_string(n) +
                      " would do nothing: " + why +
                      "; re-export the model with a dynamic batch dimension "
                      "(torch.onnx.export's dynamic_shapes or dynamic_axes) "
                      "to choose the batch here, or leave the flag out");
}

std::vector<Flags::Spec> trainingFlagSpecs() {
  return {{"loss", true, false},         {"add-loss", true, false},
          {"freeze", true, false},       {"trainable", true, false},
          {"optimizer", true, false},
          {"lr", true, false},           {"momentum", true, false},
          {"nesterov", false, false},    {"weight-decay", true, false},
          {"no-decay", true, false},
          {"adam-betas", true, false},   {"adam-eps", true, false},
          {"microbatches", true, false}, {"data-parallel", true, false},
          {"precision", true, false},    {"fused-attention", true, false},
          allowLargeFlagSpec()};
}

const char kTrainingHelp[] = R"(training:
  --loss=NAME            the output that is the loss (needed when the model
                         has several outputs); it must be a float scalar
  --add-loss=cross-entropy:LOGITS,LABELS | mse:OUTPUT,TARGET
                         give an inference model a loss: mean cross-entropy
                         of output LOGITS ([N,C,...]) against a new i64 input
                         LABELS, or mean squared error of OUTPUT against a
                         new input TARGET
  --freeze=REGEX         keep parameters whose whole name matches REGEX
                         fixed (they become buffers; no gradient work)
  --trainable=REGEX      train only the parameters whose whole name matches
                         REGEX; the others are kept fixed
  --optimizer=sgd|adamw  the update rule (default sgd)
  --lr=X                 learning rate (default 0.01; a runtime scalar)
  --momentum=X           SGD momentum (default 0)
  --nesterov             SGD with Nesterov momentum
  --weight-decay=X       default 0 for SGD (L2), 0.01 for AdamW (decoupled)
  --no-decay=1-d|none|REGEX
                         parameters updated without weight decay: 1-d, every
                         parameter of rank below 2 (biases, normalization
                         weights: nanoGPT's and HF Trainer's groups; the
                         default for AdamW), none (every parameter decays:
                         torch.optim's one group; the default for SGD), or
                         those whose whole name matches REGEX; the summary
                         lists both groups
  --adam-betas=B1,B2     AdamW betas (default 0.9,0.999)
  --adam-eps=X           AdamW epsilon (default 1e-8)
  --microbatches=M       gradients of M microbatches are averaged per step
                         (default 1)
  --data-parallel=D      D replicas of the pipeline each run M microbatches
                         of different samples; their gradients are summed
                         before the update (average over M x D; default 1)
  --precision=f32|bf16   bf16: matrix products and convolutions (forward,
                         B and W) read and write bf16, with f32 master
                         weights, gradients and optimizer; everything else
                         stays f32 (default f32)
  --fused-attention=on|off
                         on: attention exported as MatMul, scale, mask
                         (an added bias or masked_fill with -inf),
                         Softmax, MatMul runs as one FusedAttention op that
                         never stores the Tq x Tk scores (the
                         recognize-attention pass); off: as exported
                         (default on)
)";

static llvm::Expected<double> parseReal(const std::string &flag,
                                        const std::string &value) {
  double v;
  if (llvm::StringRef(value).getAsDouble(v) || !std::isfinite(v) || v < 0)
    return cleave::fail("--" + flag + " needs a non-negative number, not '" +
                        value + "'");
  return v;
}

std::string decayGroupsText(const ir::Graph &g,
                            const passes::TrainingOptions &t) {
  passes::DecayGroups groups = passes::weightDecayGroups(g, t);
  auto names = [](const std::vector<std::string> &list) {
    std::string s;
    for (size_t i = 0; i < list.size() && i < 8; ++i)
      s += (i ? ", " : "") + list[i];
    if (list.size() > 8)
      s += ", and " + std::to_string(list.size() - 8) + " more";
    return list.empty() ? s : " (" + s + ")";
  };
  double wd = t.weightDecay.value_or(t.optimizer == "adamw" ? 0.01 : 0.0);
  return llvm::formatv("weight decay {0}: {1} parameter(s){2}\n"
                       "no weight decay (--no-decay {3}): {4} "
                       "parameter(s){5}\n",
                       support::formatDouble(wd), groups.decayed.size(),
                       names(groups.decayed), passes::noDecayRule(t),
                       groups.exempt.size(),
                       names(groups.exempt))
      .str();
}

llvm::Error readTrainingFlags(const Flags &flags, passes::TrainingOptions &opts,
                              std::optional<LossRequest> &addLoss) {
  opts.loss = flags.get("loss").value_or("");
  opts.freeze = flags.get("freeze").value_or("");
  opts.trainable = flags.get("trainable").value_or("");
  opts.noDecay = flags.get("no-decay").value_or("");
  if (flags.has("no-decay") && opts.noDecay.empty())
    return cleave::fail(
        "--no-decay needs '1-d', 'none' or a regular expression");
  for (auto [flag, regex] : {std::pair{"freeze", &opts.freeze},
                             std::pair{"trainable", &opts.trainable},
                             std::pair{"no-decay", &opts.noDecay}}) {
    std::string why;
    if (!regex->empty() && *regex != "none" && !llvm::Regex("^(" + *regex + ")$").isValid(why))
      return cleave::fail(std::string("--") + flag +
                          ": invalid regular expression '" + *regex +
                          "': " + why);
  }
  opts.optimizer = flags.get("optimizer").value_or("sgd");
  if (opts.optimizer != "sgd" && opts.optimizer != "adamw")
    return cleave::fail("--optimizer must be 'sgd' or 'adamw', not '" +
                        opts.optimizer + "'");
  opts.nesterov = flags.has("nesterov");
  struct Real {
    const char *flag;
    double *dst;
  };
  double wd = -1;
  for (Real r : {Real{"lr", &opts.lr}, Real{"momentum", &opts.momentum},
                 Real{"weight-decay", &wd}, Real{"adam-eps", &opts.epsilon}})
    if (auto v = flags.get(r.flag)) {
      auto x = parseReal(r.flag, *v);
      if (!x)
        return x.takeError();
      *r.dst = *x;
    }
  if (wd >= 0)
    opts.weightDecay = wd;
  if (opts.nesterov && opts.momentum == 0)
    return cleave::fail("--nesterov needs --momentum above 0");
  if (auto v = flags.get("adam-betas")) {
    auto parts = splitList(*v);
    if (parts.size() != 2)
      return cleave::fail("--adam-betas needs B1,B2, not '" + *v + "'");
    auto b1 = parseReal("adam-betas", parts[0]);
    if (!b1)
      return b1.takeError();
    auto b2 = parseReal("adam-betas", parts[1]);
    if (!b2)
      return b2.takeError();
    if (*b1 >= 1 || *b2 >= 1)
      return cleave::fail("--adam-betas must be below 1");
    opts.beta1 = *b1;
    opts.beta2 = *b2;
  }
  if (auto v = flags.get("microbatches")) {
    auto m = parseCount("microbatches", *v);
    if (!m)
      return m.takeError();
    if (*m == 0)
      return cleave::fail("--microbatches must be at least 1");
    if (auto e = checkLimit(flags, "microbatches", *m,
                            &support::SizeLimits::microbatches, "microbatches"))
      return e;
    opts.microbatches = *m;
  }
  if (auto v = flags.get("data-parallel")) {
    auto d = parseCount("data-parallel", *v);
    if (!d)
      return d.takeError();
    if (*d == 0)
      return cleave::fail("--data-parallel must be at least 1");
    if (auto e = checkLimit(flags, "data-parallel", *d,
                            &support::SizeLimits::workers,
                            "data-parallel replicas"))
      return e;
    opts.dataParallel = *d;
  }
  opts.precision = flags.get("precision").value_or("f32");
  if (opts.precision != "f32" && opts.precision != "bf16")
    return cleave::fail("--precision must be 'f32' or 'bf16', not '" +
                        opts.precision + "'");
  if (auto v = flags.get("fused-attention")) {
    if (*v != "on" && *v != "off")
      return cleave::fail("--fused-attention must be 'on' or 'off', not '" +
                          *v + "'");
    opts.fuseAttention = *v == "on";
  }
  if (auto v = flags.get("add-loss")) {
    auto [kind, rest] = llvm::StringRef(*v).split(':');
    auto names = splitList(rest.str());
    if (names.size() != 2 || (kind != "cross-entropy" && kind != "mse"))
      return cleave::fail("--add-loss needs cross-entropy:LOGITS,LABELS or "
                          "mse:OUTPUT,TARGET, not '" +
                          *v + "'");
    addLoss = LossRequest{kind.str(), names[0], names[1]};
    if (!opts.loss.empty())
      return cleave::fail("--loss and --add-loss do not go together");
  }
  return llvm::Error::success();
}

llvm::Error checkOutputs(const Flags &flags,
                         const std::vector<std::string> &fileFlags,
                         const std::vector<std::string> &dirFlags) {
  for (const std::string &f : fileFlags)
    for (const std::string &path : flags.getAll(f))
      if (path != "-")
        if (auto e = support::checkOutputFile(path))
          return e;
  for (const std::string &f : dirFlags)
    for (const std::string &dir : flags.getAll(f))
      if (auto e = support::checkOutputDirectory(dir))
        return e;
  return llvm::Error::success();
}

llvm::Error writeOutput(const std::string &path, const std::string &text) {
  if (path == "-") {
    llvm::outs() << text;
    llvm::outs().flush();
    return llvm::Error::success();
  }
  return support::writeFileAtomically(path, text);
}

} // namespace cleave::tools
