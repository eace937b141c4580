// Messages between stages that run as threads of one process on device
// backends, without host copies (docs/design/nccl.md, "Stages in one
// process").
//
// The executor stages a device backend's messages through host memory
// unless its comm takes them directly (Comm::bindBackend, Comm::direct).
// ParcelComm does so for the plan's own messages (the Send and Recv
// instructions of the stage's programs): a send packs the slot into a
// parcel of the sending backend's (Backend::pack: a device-to-device copy
// after the work issued so far, which never waits), and the parcel's
// descriptor travels through `inner`, the in-process comm, keyed as the
// message; a receive takes the descriptor and unpacks the parcel into the
// slot (Backend::unpack: a copy before the work issued after it, across
// GPUs where the stages' differ), which hands it back to its owner. The
// rest (the executor's vote and norms, collectives, barriers) passes to
// `inner` unchanged. Only for comms whose ends share one address space.
#pragma once

#include "runtime/Kernel.h"
#include "runtime/Plan.h"
#include "runtime/comm/Comm.h"

#include "llvm/ADT/STLFunctionalExtras.h"

#include <memory>
#include <string>

namespace cleave::runtime {

std::unique_ptr<Comm> createParcelComm(const Plan &plan, int stage,
                                       std::unique_ptr<Comm> inner);

// The parcel protocol over one key of `comm` (ParcelComm's, and the
// threaded channels' host transport's): sendParcel packs `bytes` at `data`
// (the sender's memory) and sends the parcel's descriptor; unpackParcel
// unpacks a received descriptor into `data` on `receiver`, or, where the
// receiver expects another size, hands the parcel back and fails with
// `mismatch(sent)`.
llvm::Error sendParcel(Backend &sender, Comm &comm, int peer, int64_t tag,
                       int microbatch, const void *data, size_t bytes);
llvm::Error unpackParcel(Backend &receiver, const Backend::Parcel &parcel,
                         void *data, size_t bytes,
                         llvm::function_ref<std::string(size_t)> mismatch);

// False when CLEAVE_PARCELS=0: messages then stage through host memory as
// before parcels (a fallback for a GPU run that finds them at fault).
bool parcelsEnabled();

} // namespace cleave::runtime
