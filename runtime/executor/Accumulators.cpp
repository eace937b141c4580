// The executor's accumulators (runtime/Executor.h): gradient sums over a
// step's microbatches, and their all-reduce over data-parallel replicas
// and tied-parameter groups in a fixed order.
#include "runtime/ExecutorSupport.h"

namespace cleave::runtime {

using namespace detail;

llvm::Error StageExecutor::accumulate(Phase phase, int microbatch,
                                      void *frame) {
  for (int s : accumWrites_[int(phase)])
    if (auto e = accumulateSlot(s, microbatch, frame))
      return e;
  return llvm::Error::success();
}

llvm::Error StageExecutor::accumulateSlot(int s, int microbatch,
                                          void *frame) {
  {
    const Slot &v = stage_.slots[s];
    int acc = v.accum;
    const Slot &a = stage_.slots[acc];
    // checkActions() proved the order for this action list; keep the
    // runtime check cheap and loud anyway.
    if (accumCount_[acc] != microbatch)
      return fail(llvm::formatv("sums '{0}' into '{1}' out of microbatch "
                                "order (microbatch {2} is next)",
                                v.name, a.name, accumCount_[acc]));
    if (accumCount_[acc] == 0) {
      if (accumPreset_[acc])
        accumPreset_[acc] = false; // the kernel wrote it there
      else if (auto e = copySlot(acc, nullptr, s, frame))
        return e;
    } else {
      TensorRef ins[2] = {{a.dtype, a.shape, persistent_[acc]},
                          {v.dtype, a.shape, slotData(s, frame)}};
      TensorRef out{a.dtype, a.shape, persistent_[acc]};
      KernelCall call{ir::OpKind::Add, noAttrs(), ins, out, 0};
      if (auto e = backend_.run(call))
        return wrap(std::move(e),
                    "summing '" + v.name + "' into '" + a.name + "'");
    }
    ++accumCount_[acc];
  }
  return llvm::Error::success();
}

llvm::Error StageExecutor::allReduceAccums() {
  Comm &dp = *dataParallel_;
  int replicas = dp.size();
  if (replicas <= 1)
    return llvm::Error::success();
  for (size_t s = 0; s < stage_.slots.size(); ++s) {
    const Slot &a = stage_.slots[s];
    if (a.kind != SlotKind::Accum)
      continue;
    size_t bytes = size_t(a.bytes);
    int64_t tag = int64_t(s);
    auto where = [&] { return "summing '" + a.name + "' over the replicas"; };
    // The replicas' sums are added on rank 0 in one backend buffer, grown
    // to the largest accumulator once and kept: the steady state allocates
    // nothing.
    if (dp.rank() == 0 && reduceDeviceBytes_ < bytes) {
      backend_.release(reduceDevice_);
      reduceDevice_ = backend_.allocate(bytes);
      reduceDeviceBytes_ = reduceDevice_ ? bytes : 0;
      if (!reduceDevice_)
        return fail(where() + ": cannot allocate " + std::to_string(bytes) +
                    " bytes");
    }
    DeviceAccess access{
        [&](void *host, const void *dev, size_t n) {
          backend_.copyToHost(host, dev, n);
        },
        [&](void *dev, const void *host, size_t n) {
          backend_.copyToDevice(dev, host, n);
        },
        [&](void *acc, const void *other) {
          TensorRef ins[2] = {{a.dtype, a.shape, acc},
                              {a.dtype, a.shape, const_cast<void *>(other)}};
          TensorRef out{a.dtype, a.shape, acc};
          KernelCall call{ir::OpKind::Add, noAttrs(), ins, out, 0};
          return backend_.run(call);
        },
        reduceDevice_,
        [&](llvm::Error e, int peer) {
          return nameTimeout(
              std::move(e), "replica " + std::to_string(peer),
              peer == 0 ? "the sum of '" + a.name + "' over the replicas"
                        : "its sum of '" + a.name + "' to add",
              tag);
        },
        [&] { backend_.synchronize(); }};
    if (auto e = dp.allReduceOrdered(persistent_[s], bytes, tag, access))
      return wrap(std::move(e), where());
  }
  return llvm::Error::success();
}

} // namespace cleave::runtime
