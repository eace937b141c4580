// The cost model (Cost.h): FLOPs and bytes per op, device profiles, measured
// profiles, and the predicted time of every op of a graph. An op's FLOPs
// come from its cost class in ir/Ops.def; only products (matrix products,
// convolutions and their gradient parts) have formulas of their own here.
#include "passes/Cost.h"
#include "passes/MemoryPlan.h"

#include "ir/TypeRules.h"
#include "support/FileIO.h"
#include "support/JsonDepth.h"

#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <map>

namespace cleave::passes {

using ir::OpKind;

static double elements(const ir::TensorType &t) {
  return double(t.numElements());
}

static double elements(llvm::ArrayRef<int64_t> shape) {
  double n = 1;
  for (int64_t d : shape)
    n *= double(d);
  return n;
}

// 2·M·N·K of a product whose result (or result gradient) has `outElements`
// elements and whose reduced dimension is `k`.
static double productFlops(double outElements, double k) {
  return 2 * outElements * k;
}

// Matrix-product and convolution work, forward and gradient parts. Each
// gradient part is one product as large as the forward one: dY (the size
// of the forward result) times the reduced extent of the operand it
// differentiates.
static std::optional<double> productWork(const ir::Op &op) {
  auto type = [&](unsigned i) { return op.operand(i)->type(); };
  auto lastDim = [](const ir::TensorType &t) {
    return t.rank() ? double(t.shape.back()) : 1.0;
  };
  // Extent reduced when a product with weights of this shape makes one
  // output element: all but the leading (output-channel) dimension.
  auto perOutput = [](llvm::ArrayRef<int64_t> w) {
    return w.empty() ? 1.0 : elements(w) / double(std::max<int64_t>(w[0], 1));
  };
  // Fused attention: the scores a row sees (the causal rule hides about
  // half), each a D-long product; the forward makes S = QK^T and PV (2),
  // the backward recomputes S and dO.V for dQ and again for dK and dV and
  // accumulates dQ, dK, dV (7; docs/design/fused-attention.md).
  auto seenScores = [&](const ir::TensorType &q, const ir::TensorType &k) {
    const ir::AttentionDims d =
        ir::attentionDims(q.shape, k.shape, ir::attentionLayout(op),
                          ir::attentionPackedKvHeads(op));
    double tq = double(d.queryLen), tk = double(d.keyLen);
    double perHead = tq * tk;
    if (op.getInt("causal")) { // query i sees keys 0..i (top-left)
      double full = std::max(0.0, tq - tk); // rows that see every key
      double part = tq - full;
      perHead = part * (part + 1) / 2 + full * tk;
    }
    return double(d.batch) * double(d.queryHeads) * perHead;
  };
  switch (op.kind()) {
  case OpKind::FusedAttention:
    return productFlops(seenScores(type(0), type(1)), lastDim(type(0))) * 2;
  case OpKind::FusedAttentionGrad:
    return productFlops(seenScores(type(1), type(2)), lastDim(type(1))) * 7;
  case OpKind::MatMul:
    return productFlops(elements(op.result()->type()), lastDim(type(0)));
  case OpKind::Gemm: {
    double k = double(type(0).shape[op.getInt("transA") ? 0 : 1]);
    double bias = op.numOperands() > 2 ? elements(op.result()->type()) : 0;
    return productFlops(elements(op.result()->type()), k) + bias;
  }
  case OpKind::MatMulGradA: // dA = dY·Bᵀ, reduced over A's last dim
    return productFlops(elements(type(0)), double(op.getInts("shape").back()));
  case OpKind::MatMulGradB: // dB = Aᵀ·dY, reduced over A's last dim
    return productFlops(elements(type(1)), lastDim(type(0)));
  case OpKind::MatMulGrad:
    return productFlops(elements(type(0)), lastDim(type(1))) * 2;
  case OpKind::GemmGradA: // dA[M,K] from dY[M,N]: K = |A| / M
    return productFlops(elements(type(0)),
                        elements(op.getInts("shape")) / double(type(0).shape[0]));
  case OpKind::GemmGradB: // dB[K,N] from dY[M,N]: K = |B| / N
    return productFlops(elements(type(1)),
                        elements(op.getInts("shape")) / double(type(1).shape[1]));
  case OpKind::GemmGrad:
    return productFlops(elements(type(0)), lastDim(type(1))) * 2;
  case OpKind::Conv:
    return productFlops(elements(op.result()->type()),
                        perOutput(type(1).shape));
  case OpKind::ConvGradData:
  case OpKind::ConvTranspose:
    return productFlops(elements(type(0)), perOutput(type(1).shape));
  case OpKind::ConvGradFilter:
    return productFlops(elements(type(1)), perOutput(op.getInts("shape")));
  case OpKind::ConvGrad:
    return productFlops(elements(type(0)), perOutput(type(2).shape)) * 2;
  default:
    return std::nullopt;
  }
}

// FLOPs per element of each cost class (ir/Ops.def gives every op one) but
// Product, whose ops have their formulas in productWork. The numbers only
// need to be right in order of magnitude: these ops are bound by memory
// traffic on every device we model, so their bytes decide their time.
static double flopsPerElement(ir::CostClass cost) {
  using ir::CostClass;
  switch (cost) {
  case CostClass::Free:
    return 0;
  case CostClass::Transcendental:
  case CostClass::SgdUpdate:
    return 4;
  case CostClass::Normalization:
    return 8;
  case CostClass::AdamUpdate:
    return 16;
  case CostClass::Elementwise:
  case CostClass::Reduction:
  case CostClass::Pooling:
  case CostClass::Scatter:
  case CostClass::Comm:
  case CostClass::HostCopy:
  case CostClass::Product: // productWork has every product's formula
    return 1;
  }
  return 1;
}

static bool isProduct(const ir::Op &op) {
  return op.info().cost == ir::CostClass::Product;
}

OpWork opWork(const ir::Op &op) {
  OpWork work;
  for (const ir::Value *v : op.operands())
    work.bytes += double(v->type().byteSize());
  double resultElements = 0;
  for (const ir::Value *v : op.results()) {
    work.bytes += double(v->type().byteSize());
    resultElements += elements(v->type());
  }
  // Reductions and pooling read more than they write: count their inputs.
  double elementsSeen = resultElements;
  if (op.numOperands())
    elementsSeen = std::max(elementsSeen, elements(op.operand(0)->type()));
  std::optional<double> product = productWork(op);
  assert(product.has_value() == isProduct(op) &&
         "a Product op needs its formula in productWork");
  work.flops = product.value_or(flopsPerElement(op.info().cost) * elementsSeen);
  return work;
}

// The work of part `result` of a combined gradient op: the operands the
// part takes (GradientPart::operands) read once, its result written once.
// Only for the normalizations' gradients (not products).
static OpWork partWork(const ir::Op &op, const ir::GradientSplit &split,
                       unsigned result) {
  const ir::GradientPart &part = split.part(result);
  OpWork work;
  double seen = elements(op.result(result)->type());
  for (unsigned i : part.operands) {
    work.bytes += double(op.operand(i)->type().byteSize());
    seen = std::max(seen, elements(op.operand(i)->type()));
  }
  work.bytes += double(op.result(result)->type().byteSize());
  work.flops = flopsPerElement(ir::opInfo(part.kind).cost) * seen;
  return work;
}

double stepBytes(const ir::Graph &g) {
  double bytes = 0;
  for (const ir::Value *v : g.inputs())
    bytes += double(v->type().byteSize());
  for (const ir::Value *v : g.declared())
    bytes += double(v->type().byteSize());
  for (const auto &op : g.ops())
    for (const ir::Value *v : op->results())
      bytes += double(v->type().byteSize());
  return bytes;
}

double predictOpTime(const ir::Op &op, const DeviceProfile &device,
                     double stepBytes) {
  // A view (MemoryPlan.h's isViewOp) shares its operand's bytes wherever
  // both live in one frame, and the executor then skips it: nothing to
  // run, not even a dispatch. (Counted at the profile's op overhead, the 56
  // Reshapes of the corpus's tiny GPT-2 made up half of its predicted
  // forward: 62 us a stage against 25 measured.)
  if (isViewOp(op))
    return 0;
  OpWork work = opWork(op);
  // An offload copy moves its operand once over the host link (on the
  // emulation, where host and device are one memory, at memory speed).
  if (op.info().cost == ir::CostClass::HostCopy) {
    double bytes = op.numOperands()
                       ? double(op.operand(0)->type().byteSize())
                       : 0.0;
    double bw = device.canOffload() ? device.hostBandwidth
                                    : device.memBandwidth;
    return device.opOverhead + bytes / bw;
  }
  bool attention = op.kind() == ir::OpKind::FusedAttention ||
                   op.kind() == ir::OpKind::FusedAttentionGrad;
  // Ops the device can time by their types: as timed. The fused attention
  // too: with the causal rule as an attribute its time depends on the
  // shapes alone; an additive mask's values decide which tiles it hides,
  // and the timer's (uniform in [-1, 1)) hide none, the whole product the
  // formula below counts as well, with the kernel's own fixed costs (at
  // the corpus's tiny GPT-2, 7 us a call measured, 2.8 by the formula).
  // Copies too (Split, Concat, Transpose, Slice: their bytes at the
  // device's streaming bandwidth made the corpus's tiny GPT-2's Split 34 us,
  // 7 measured, in cache); not the views (above) nor messages.
  bool timeable = !op.info().has(ir::optrait::LayoutOnly) &&
                  op.info().cost != ir::CostClass::Comm;
  // Before the update the runtime reads every gradient once more: the
  // non-finite check of --on-nan's default (runtime/executor/UpdateGuard).
  double checkBytes = 0;
  if ((op.kind() == ir::OpKind::SGD || op.kind() == ir::OpKind::AdamW) &&
      op.numOperands() > 1)
    checkBytes = double(op.operand(1)->type().byteSize());
  if (device.timeOp && timeable)
    if (std::optional<double> t = device.timeOp(op, stepBytes))
      return *t + checkBytes / device.memBandwidth;
  // Products with bf16 operands (--precision bf16) run at the bf16 peak.
  bool bf16 = op.numOperands() && op.operand(0)->type().dtype == ir::DType::BF16 &&
              isProduct(op);
  double peak = bf16 && device.peakFlops16 > 0 ? device.peakFlops16
                                                : device.peakFlops;
  if (attention && !bf16 && device.attentionFlops > 0)
    peak = device.attentionFlops;
  work.bytes += checkBytes;
  const ir::GradientSplit *split = ir::gradientSplit(op.kind());
  if (split && split->keptWhole && device.splitsKeptWholeGrads &&
      !isProduct(op)) {
    double t = 0;
    for (unsigned r : {0u, 1u}) {
      OpWork part = partWork(op, *split, r);
      t += device.opOverhead + std::max(part.flops / peak,
                                        part.bytes / device.memBandwidth);
    }
    return t;
  }
  return device.opOverhead + std::max(work.flops / peak,
                                      work.bytes / device.memBandwidth);
}

// The figures and where they come from: docs/design/partition.md.
static const DeviceProfile kProfiles[] = {
    // Measured with tests/bench/DeviceProfileBench.cpp on this machine
    // kind (2 cores, 2026-11-29, best of 3 runs on a busy host): the
    // runtime's f32 GEMM on 1024³ reached 1.15e11 FLOP/s, a STREAM-like
    // triad over 64 MiB arrays 1.0e10 bytes/s. Stages on one host pass
    // tensors by memcpy, so the link runs at memory bandwidth. The op
    // overhead and link latency are estimates (an op's dispatch through the
    // thread pool; a channel hand-off), not measurements.
    // The CPU has no bf16 arithmetic: bf16 products are widened to f32
    // (runtime/cpu/CpuBackend.cpp), so their peak is the f32 one.
    {"cpu", /*peakFlops=*/1.15e11, /*memBandwidth=*/1.0e10,
     /*opOverhead=*/2e-6, /*linkBandwidth=*/1.0e10, /*linkLatency=*/5e-6,
     /*peakFlops16=*/1.15e11, /*hostBandwidth=*/0, /*attentionFlops=*/0,
     /*sendOverhead=*/0, /*timeOp=*/{}, /*splitsKeptWholeGrads=*/false},
    // NVIDIA H200 SXM datasheet: FP32 67 TFLOP/s (no TF32 tensor cores:
    // cleave runs f32), HBM3e 4.8 TB/s, NVLink 900 GB/s total (450 GB/s
    // each way); overhead and latency are typical kernel-launch and NCCL
    // p2p figures, not datasheet numbers. BF16 tensor cores: 989 TFLOP/s
    // dense (the datasheet's 1,979 is with 2:4 sparsity).
    // Host link: PCIe Gen5 x16, 64 GB/s each way (the published figure,
    // not measured; pinned copies reach less).
    // The CUDA backend runs a kept-whole gradient as its two parts.
    {"h200", 67e12, 4.8e12, 5e-6, 450e9, 10e-6, 989e12, 64e9, 0, 0, {},
     /*splitsKeptWholeGrads=*/true},
    // NVIDIA A100 SXM4 80 GB datasheet: FP32 19.5 TFLOP/s (cleave runs f32
    // without TF32), HBM2e 2,039 GB/s, NVLink 600 GB/s total (300 GB/s each
    // way), BF16 tensor cores 312 TFLOP/s dense (624 with sparsity); the
    // overhead and latency as for h200. The class of GPU the 2BP paper
    // measured on.
    // Host link: PCIe Gen4 x16, 32 GB/s each way (published, not measured).
    {"a100", 19.5e12, 2.039e12, 5e-6, 300e9, 10e-6, 312e12, 32e9, 0, 0, {},
     /*splitsKeptWholeGrads=*/true},
};

// Profiles measured while the process runs (`host`), by name.
static std::vector<DeviceProfile> &registeredProfiles() {
  static std::vector<DeviceProfile> profiles;
  return profiles;
}

void registerDeviceProfile(const DeviceProfile &profile) {
  for (DeviceProfile &p : registeredProfiles())
    if (p.name == profile.name) {
      p = profile;
      return;
    }
  registeredProfiles().push_back(profile);
}

llvm::Expected<DeviceProfile> lookupDeviceProfile(llvm::StringRef name) {
  for (const DeviceProfile &p : registeredProfiles())
    if (p.name == name)
      return p;
  for (const DeviceProfile &p : kProfiles)
    if (p.name == name)
      return p;
  return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 "unknown device profile '" + name.str() +
                                     "' (known: cpu, host, h200, a100)");
}

llvm::Expected<CostModelSpec> parseCostModel(llvm::StringRef text) {
  CostModelSpec spec;
  if (text == "analytic")
    return spec;
  if (text == "uniform") {
    spec.kind = CostModelKind::Uniform;
    return spec;
  }
  if (llvm::StringRef path = text; path.consume_front("profile:") &&
                                    !path.empty()) {
    spec.kind = CostModelKind::Profile;
    spec.profilePath = path.str();
    return spec;
  }
  return llvm::createStringError(
      llvm::inconvertibleErrorCode(),
      "--cost-model must be analytic, uniform or profile:FILE, not '" +
          text.str() + "'");
}

std::string OpProfile::key(llvm::StringRef loc, ir::Phase phase) {
  return loc.str() + "\n" + std::string(ir::phaseName(phase));
}

static llvm::Error profileError(llvm::StringRef source, const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 "profile '" + source + "': " + msg);
}

llvm::Expected<OpProfile> OpProfile::parse(llvm::StringRef json,
                                           llvm::StringRef source) {
  if (llvm::Error e = support::checkJsonDepth(json))
    return profileError(source, llvm::toString(std::move(e)));
  llvm::Expected<llvm::json::Value> root = llvm::json::parse(json);
  if (!root)
    return profileError(source, llvm::toString(root.takeError()));
  const llvm::json::Object *top = root->getAsObject();
  if (!top)
    return profileError(source, "expected a JSON object");
  if (auto unit = top->getString("time_unit"); unit && *unit != "s")
    return profileError(source, "time_unit must be \"s\", not \"" + *unit +
                                    "\"");
  const llvm::json::Array *ops = top->getArray("ops");
  if (!ops)
    return profileError(source, "expected an \"ops\" array");
  OpProfile profile;
  for (size_t i = 0; i < ops->size(); ++i) {
    const llvm::json::Object *entry = (*ops)[i].getAsObject();
    llvm::Optional<llvm::StringRef> loc, phaseText;
    llvm::Optional<double> time, coreWait = 0.0;
    if (entry) {
      loc = entry->getString("loc");
      phaseText = entry->getString("phase");
      time = entry->getNumber("time");
      if (entry->get("core_wait"))
        coreWait = entry->getNumber("core_wait");
    }
    std::optional<ir::Phase> phase;
    if (phaseText)
      phase = ir::parsePhase(std::string_view(*phaseText));
    if (!loc || !phase || !time || *time < 0)
      return profileError(source,
                          "ops[" + llvm::Twine(i) +
                              "] needs \"loc\" (string), \"phase\" (fwd, B, "
                              "W or opt) and \"time\" (seconds, >= 0)");
    if (!coreWait || !std::isfinite(*coreWait) || *coreWait < 0 ||
        *coreWait > *time)
      return profileError(source, "ops[" + llvm::Twine(i) +
                                      "]: \"core_wait\" must be seconds from "
                                      "0 to its \"time\"");
    profile.times_[key(*loc, *phase)] += *time;
    profile.opCoreWaits_[key(*loc, *phase)] += *coreWait;
  }
  if (const llvm::json::Array *actions = top->getArray("actions"))
    for (size_t i = 0; i < actions->size(); ++i) {
      const llvm::json::Object *entry = (*actions)[i].getAsObject();
      llvm::Optional<llvm::StringRef> kind;
      llvm::Optional<double> overhead, coreWait = 0.0;
      if (entry) {
        kind = entry->getString("action");
        overhead = entry->getNumber("overhead");
        if (entry->get("core_wait"))
          coreWait = entry->getNumber("core_wait");
      }
      if (!kind || !overhead || *overhead < 0 ||
          (*kind != "F" && *kind != "B" && *kind != "W" && *kind != "BW" &&
           *kind != "STEP"))
        return profileError(source,
                            "actions[" + llvm::Twine(i) +
                                "] needs \"action\" (F, B, W, BW or STEP) and "
                                "\"overhead\" (seconds, >= 0)");
      if (!coreWait || !std::isfinite(*coreWait) || *coreWait < 0 ||
          *coreWait > *overhead)
        return profileError(source, "actions[" + llvm::Twine(i) +
                                        "]: \"core_wait\" must be seconds "
                                        "from 0 to its \"overhead\"");
      profile.overheads_[*kind].push_back(*overhead);
      profile.overheadCoreWaits_[*kind].push_back(*coreWait);
    }
  if (const llvm::json::Array *messages = top->getArray("messages"))
    for (size_t i = 0; i < messages->size(); ++i) {
      const llvm::json::Object *entry = (*messages)[i].getAsObject();
      llvm::Optional<int64_t> stage, waited, received;
      llvm::Optional<double> latency, coreWait = 0.0;
      if (entry) {
        stage = entry->getInteger("stage");
        latency = entry->getNumber("latency");
        waited = entry->getInteger("waited");
        received = entry->getInteger("received");
        if (entry->get("core_wait"))
          coreWait = entry->getNumber("core_wait");
      }
      if (!stage || *stage < 0 || !latency || *latency < 0 ||
          !std::isfinite(*latency) || !waited || *waited < 1)
        return profileError(source,
                            "messages[" + llvm::Twine(i) +
                                "] needs \"stage\" (>= 0), \"latency\" "
                                "(seconds, >= 0) and \"waited\" (>= 1)");
      if (!coreWait || !std::isfinite(*coreWait) || *coreWait < 0 ||
          *coreWait > *latency)
        return profileError(source, "messages[" + llvm::Twine(i) +
                                        "]: \"core_wait\" must be seconds "
                                        "from 0 to its \"latency\"");
      profile.messages_[int(*stage)] = {
          *latency, *waited, *coreWait,
          received ? std::max(*received, *waited) : *waited};
    }
  if (const llvm::json::Value *coresValue = top->get("cores")) {
    const llvm::json::Object *cores = coresValue->getAsObject();
    llvm::Optional<int64_t> count = cores ? cores->getInteger("cores") : llvm::None;
    if (!count || *count < 1)
      return profileError(source, "cores needs \"cores\" (>= 1)");
    Sharing sharing;
    sharing.cores = int(std::min<int64_t>(*count, 1 << 20));
    if (const llvm::json::Value *other = cores->get("other_cores")) {
      llvm::Optional<double> v = other->getAsNumber();
      if (!v || !std::isfinite(*v) || *v < 0)
        return profileError(source, "cores.other_cores must be a number >= 0");
      sharing.otherCores = *v;
    }
    if (const llvm::json::Value *other = cores->get("other_runnable")) {
      llvm::Optional<double> v = other->getAsNumber();
      if (!v || !std::isfinite(*v) || *v < 0)
        return profileError(source,
                            "cores.other_runnable must be a number >= 0");
      sharing.otherRunnable = *v;
    }
    if (const llvm::json::Value *waits = cores->get("core_wait")) {
      const llvm::json::Array *list = waits->getAsArray();
      if (!list)
        return profileError(source, "cores.core_wait must be an array");
      for (size_t i = 0; i < list->size(); ++i) {
        const llvm::json::Object *entry = (*list)[i].getAsObject();
        llvm::Optional<int64_t> stage;
        llvm::Optional<double> wait;
        if (entry) {
          stage = entry->getInteger("stage");
          wait = entry->getNumber("seconds");
        }
        if (!stage || *stage < 0 || !wait || !std::isfinite(*wait) || *wait < 0)
          return profileError(source,
                              "cores.core_wait[" + llvm::Twine(i) +
                                  "] needs \"stage\" (>= 0) and \"seconds\" "
                                  "(>= 0)");
        sharing.coreWait[int(*stage)] = *wait;
      }
    }
    profile.sharing_ = std::move(sharing);
  }
  return profile;
}

std::optional<double> OpProfile::messageLatency() const {
  bool lessCoreWait = sharesCores();
  double seconds = 0;
  int64_t waited = 0;
  for (const auto &[stage, m] : messages_) {
    seconds += (m.latency - (lessCoreWait ? m.coreWait : 0)) * double(m.waited);
    waited += m.waited;
  }
  if (waited == 0)
    return std::nullopt;
  return seconds / double(waited);
}

std::optional<double> OpProfile::messageLatency(int stage) const {
  bool lessCoreWait = sharesCores();
  auto it = messages_.find(stage);
  // A stage whose receives seldom waited (under a tenth of them) has a mean
  // of a few samples, an outlier often (zb-v's first stage on 2 cores: one
  // wait in 429 receives, 586 us): the mean over all stages stands in.
  if (it == messages_.end() ||
      it->second.waited * 10 < it->second.received)
    return std::nullopt;
  return it->second.latency - (lessCoreWait ? it->second.coreWait : 0);
}

static double meanOfList(const llvm::StringMap<std::vector<double>> &map,
                         llvm::StringRef kind) {
  auto it = map.find(kind);
  if (it == map.end() || it->second.empty())
    return 0;
  double sum = 0;
  for (double v : it->second)
    sum += v;
  return sum / double(it->second.size());
}

double OpProfile::actionOverhead(llvm::StringRef kind) const {
  double o = meanOfList(overheads_, kind);
  return sharesCores() ? std::max(0.0, o - meanOfList(overheadCoreWaits_, kind))
                       : o;
}

llvm::Expected<OpProfile> OpProfile::load(const std::string &path) {
  auto buf = support::readFile(path, "cost profile", support::kMaxTextBytes);
  if (!buf)
    return buf.takeError();
  return parse((*buf)->getBuffer(), path);
}

std::optional<double> OpProfile::time(llvm::StringRef loc,
                                      ir::Phase phase) const {
  auto it = times_.find(key(loc, phase));
  if (it == times_.end())
    return std::nullopt;
  if (!sharesCores())
    return it->second;
  return std::max(0.0, it->second - opCoreWaits_.lookup(key(loc, phase)));
}

std::optional<double> OpProfile::otherCoresWanted() const {
  if (!sharing_)
    return std::nullopt;
  std::optional<double> wanted = sharing_->otherCores;
  if (sharing_->otherRunnable)
    wanted = std::max(wanted.value_or(0), *sharing_->otherRunnable);
  if (!wanted)
    return std::nullopt;
  return std::min(*wanted, double(sharing_->cores));
}

bool OpProfile::sharesCores() const {
  std::optional<double> wanted = otherCoresWanted();
  return wanted && *wanted >= 0.25;
}

double OpProfile::kernelWaitShare() const {
  double total = 0, waited = 0;
  for (const auto &t : times_)
    total += t.second;
  for (const auto &w : opCoreWaits_)
    waited += w.second;
  return total > 0 ? std::clamp(waited / total, 0.0, 1.0) : 0.0;
}

double OpProfile::coresLeft() const {
  if (!sharesCores())
    return 0;
  const double cores = double(sharing_->cores);
  const double wanted = *otherCoresWanted();
  const double got = std::min(sharing_->otherCores.value_or(wanted), wanted);
  // The kernels' waits against what an even share of the cores among as
  // many ranks as cores and the others' threads would make them wait.
  const double even = 1.0 - cores / (cores + wanted);
  const double evenness =
      even > 0 ? std::min(1.0, kernelWaitShare() / even) : 1.0;
  const double others = wanted - evenness * (wanted - got);
  return std::max(0.25, cores - others);
}

// Shares each (location, phase) group's measured time evenly among the
// group's ops: the profile knows the group, not how its ops divide it.
static llvm::Expected<std::vector<double>>
profiledOpTimes(const ir::Graph &g, const OpProfile &profile,
                llvm::StringRef source, const DeviceProfile &device) {
  // A recomputed op (passes/Recompute.h) has its own key, `<loc>
  // (recompute)`, in a profile of a plan that recomputes; in one that does
  // not, it takes its share of the forward ops' time at its location.
  auto keyOf = [&](const ir::Op &op) -> std::pair<std::string, ir::Phase> {
    if (!op.attrs().count(ir::kRecomputeOfAttr))
      return {op.loc(), op.phase()};
    std::string own = op.loc() + " (recompute)";
    if (profile.time(own, op.phase()))
      return {own, op.phase()};
    return {op.loc(), ir::Phase::Fwd};
  };
  std::map<std::pair<std::string, ir::Phase>, int> groupSize;
  for (const auto &op : g.ops())
    if (op->info().cost == ir::CostClass::HostCopy)
      continue; // timed apart, below
    else if (!op->attrs().count(ir::kRecomputeOfAttr) ||
        keyOf(*op).first != op->loc())
      ++groupSize[keyOf(*op)];
  std::vector<double> times;
  for (const auto &op : g.ops()) {
    // An offload copy has its own key, `<loc> (offload)` and `<loc>
    // (fetch)`; in a profile of a plan without offload, the device
    // profile's host link times it.
    if (op->info().cost == ir::CostClass::HostCopy) {
      std::string own = op->loc() + (op->kind() == ir::OpKind::Offload
                                         ? " (offload)"
                                         : " (fetch)");
      std::optional<double> t = profile.time(own, op->phase());
      times.push_back(t ? *t : predictOpTime(*op, device));
      continue;
    }
    auto [loc, phase] = keyOf(*op);
    std::optional<double> t = profile.time(loc, phase);
    if (!t)
      return profileError(source, "no time for " + op->describe() +
                                      " in phase " +
                                      std::string(ir::phaseName(op->phase())));
    times.push_back(*t / std::max(1, groupSize[{loc, phase}]));
  }
  return times;
}

llvm::Expected<std::vector<double>>
predictOpTimes(const ir::Graph &g, const CostModelSpec &spec,
               const DeviceProfile &device) {
  assert(spec.kind != CostModelKind::Uniform && "uniform has no op times");
  if (spec.kind == CostModelKind::Profile) {
    auto profile = OpProfile::load(spec.profilePath);
    if (!profile)
      return profile.takeError();
    return profiledOpTimes(g, *profile, spec.profilePath, device);
  }
  std::vector<double> times;
  double bytes = device.timeOp ? stepBytes(g) : 0;
  for (const auto &op : g.ops())
    times.push_back(predictOpTime(*op, device, bytes));
  return times;
}

int64_t staticBytes(const ir::Value &declared) {
  int64_t bytes = declared.type().byteSize();
  return declared.kind() == ir::ValueKind::Param ? 2 * bytes : bytes;
}

} // namespace cleave::passes
