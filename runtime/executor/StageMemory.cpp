// The executor's stage memory (runtime/Executor.h): where a slot's bytes
// are, microbatch frames taken and given back, slot copies, the inputs a
// frame is filled with, and slots by name.
#include "runtime/ExecutorSupport.h"

namespace cleave::runtime {

using namespace detail;

void *StageExecutor::slotData(int slot, void *frame) const {
  const Slot &s = stage_.slots[slot];
  switch (s.kind) {
  case SlotKind::Input:
  case SlotKind::MicroTemp:
    return static_cast<char *>(frame) + s.offset;
  case SlotKind::StepTemp:
    if (stepAlias_[slot] >= 0)
      return persistent_[stepAlias_[slot]];
    return static_cast<char *>(stepFrame_) + s.offset;
  case SlotKind::HostTemp:
    return static_cast<char *>(hostFrames_.at(frame)) + s.offset;
  default:
    return persistent_[slot];
  }
}

llvm::Expected<void *> StageExecutor::takeFrame() {
  if (freeFrames_.empty()) {
    void *p = backend_.allocate(size_t(std::max<int64_t>(stage_.frameBytes, 0)));
    if (!p)
      return fail(llvm::formatv("cannot allocate a {0}-byte microbatch frame",
                                stage_.frameBytes));
    allFrames_.push_back(p);
    freeFrames_.push_back(p);
    if (stage_.hostFrameBytes > 0) {
      void *h = backend_.allocateHost(size_t(stage_.hostFrameBytes));
      if (!h)
        return fail(llvm::formatv("cannot allocate a {0}-byte host frame for "
                                  "offloaded activations",
                                  stage_.hostFrameBytes));
      hostFrames_[p] = h;
    }
    stats_.framesAllocated = int(allFrames_.size());
  }
  void *f = freeFrames_.back();
  freeFrames_.pop_back();
  int inFlight = int(allFrames_.size() - freeFrames_.size());
  if (inFlight > stats_.maxFramesInFlight) {
    stats_.maxFramesInFlight = inFlight;
    stats_.peakBytes = stats_.persistentBytes +
                       int64_t(inFlight) * stage_.frameBytes +
                       stage_.stepFrameBytes;
    stats_.hostPeakBytes = int64_t(inFlight) * stage_.hostFrameBytes;
  }
  return f;
}

void StageExecutor::giveFrame(void *frame) { freeFrames_.push_back(frame); }

// dst takes src's bytes (same type and size, checked at create): the
// backend's Identity kernel where it has one, else through host memory.
llvm::Error StageExecutor::copySlot(int dst, void *dstFrame, int src,
                                    void *srcFrame) {
  const Slot &d = stage_.slots[dst], &s = stage_.slots[src];
  void *dp = slotData(dst, dstFrame), *sp = slotData(src, srcFrame);
  if (dp == sp || d.bytes == 0)
    return llvm::Error::success();
  if (backend_.supports(ir::OpKind::Identity, s.dtype)) {
    TensorRef in{s.dtype, d.shape, sp}, out{d.dtype, d.shape, dp};
    KernelCall call{ir::OpKind::Identity, noAttrs(), in, out, 0};
    return wrap(backend_.run(call), [&] {
      return "copying '" + s.name + "' to '" + d.name + "'";
    });
  }
  staging_.resize(size_t(s.bytes));
  backend_.copyToHost(staging_.data(), sp, size_t(s.bytes));
  backend_.copyToDevice(dp, staging_.data(), size_t(s.bytes));
  return llvm::Error::success();
}

llvm::Error StageExecutor::fillInputs(int microbatch, void *frame,
                                      const DataFn &data) {
  for (size_t s = 0; s < stage_.slots.size(); ++s) {
    const Slot &sl = stage_.slots[s];
    if (sl.kind != SlotKind::Input)
      continue;
    if (!data)
      return fail("input '" + sl.name + "': no data function given");
    void *dst = slotData(int(s), frame), *p = dst;
    if (!hostMemory_) {
      staging_.resize(size_t(sl.bytes));
      p = staging_.data();
    }
    if (auto e = data(microbatch, sl.name, p, size_t(sl.bytes)))
      return wrap(std::move(e), "input '" + sl.name + "'");
    if (!hostMemory_)
      backend_.copyToDevice(dst, p, size_t(sl.bytes));
  }
  return llvm::Error::success();
}


int StageExecutor::findSlot(const std::string &name) const {
  auto it = byName_.find(name);
  return it == byName_.end() ? -1 : it->second;
}

llvm::Expected<std::vector<uint8_t>>
StageExecutor::readSlot(const std::string &name) const {
  int s = findSlot(name);
  if (s < 0)
    return fail(llvm::formatv("stage {0}: no slot named '{1}'", stage_.index,
                              name));
  const Slot &sl = stage_.slots[s];
  if (!isPersistent(sl.kind))
    return fail(llvm::formatv("stage {0}: slot '{1}' is a {2} slot; only "
                              "state, const and accum slots can be read",
                              stage_.index, name, slotKindName(sl.kind)));
  std::vector<uint8_t> out(size_t(sl.bytes));
  backend_.copyToHost(out.data(), persistent_[s], out.size());
  return out;
}

llvm::Error StageExecutor::writeSlot(const std::string &name,
                                     const std::vector<uint8_t> &bytes) {
  int s = findSlot(name);
  if (s < 0)
    return fail(llvm::formatv("stage {0}: no slot named '{1}'", stage_.index,
                              name));
  const Slot &sl = stage_.slots[s];
  if (sl.kind != SlotKind::State)
    return fail(llvm::formatv("stage {0}: slot '{1}' is a {2} slot; only "
                              "state slots can be written",
                              stage_.index, name, slotKindName(sl.kind)));
  if (int64_t(bytes.size()) != sl.bytes)
    return fail(llvm::formatv("stage {0}: slot '{1}' has {2} bytes, {3} "
                              "given",
                              stage_.index, name, sl.bytes, bytes.size()));
  backend_.copyToDevice(persistent_[s], bytes.data(), bytes.size());
  return llvm::Error::success();
}

} // namespace cleave::runtime
