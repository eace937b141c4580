// NCCL's library, bootstrap and channels (runtime/cuda/Nccl.h).
#include "runtime/cuda/Nccl.h"

#include "runtime/comm/MessageOrder.h"

#include "llvm/Support/FormatVariadic.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstring>

namespace cleave::runtime::cuda {
namespace {

// The NCCL entry points cleave uses, from libnccl.so.2.
struct NcclLib {
  decltype(&ncclGetVersion) getVersion = nullptr;
  decltype(&ncclGetUniqueId) getUniqueId = nullptr;
  decltype(&ncclCommInitRank) commInitRank = nullptr;
  decltype(&ncclCommAbort) commAbort = nullptr;
  decltype(&ncclCommDestroy) commDestroy = nullptr;
  decltype(&ncclCommGetAsyncError) commGetAsyncError = nullptr;
  decltype(&ncclGetErrorString) getErrorString = nullptr;
  decltype(&ncclGetLastError) getLastError = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGroupStart) groupStart = nullptr;
  decltype(&ncclGroupEnd) groupEnd = nullptr;
  std::string error; // why it could not be loaded
};

const NcclLib &nccl() {
  static const NcclLib lib = [] {
    NcclLib l;
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    // CUDA 13's toolkit keeps NCCL in lib/, which is not on the loader's
    // path by default.
    for (const char *path : {"/usr/local/cuda/lib/libnccl.so.2",
                             "/usr/local/cuda/lib64/libnccl.so.2"})
      if (!h)
        h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      l.error = std::string("cannot load NCCL (libnccl.so.2): ") + dlerror();
      return l;
    }
    auto sym = [&](auto &fn, const char *name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(
          dlsym(h, name));
      if (!fn && l.error.empty())
        l.error = std::string("NCCL lacks ") + name;
    };
    sym(l.getVersion, "ncclGetVersion");
    sym(l.getUniqueId, "ncclGetUniqueId");
    sym(l.commInitRank, "ncclCommInitRank");
    sym(l.commAbort, "ncclCommAbort");
    sym(l.commDestroy, "ncclCommDestroy");
    sym(l.commGetAsyncError, "ncclCommGetAsyncError");
    sym(l.getErrorString, "ncclGetErrorString");
    sym(l.getLastError, "ncclGetLastError");
    sym(l.send, "ncclSend");
    sym(l.recv, "ncclRecv");
    sym(l.groupStart, "ncclGroupStart");
    sym(l.groupEnd, "ncclGroupEnd");
    return l;
  }();
  return lib;
}

llvm::Error ncclFail(const llvm::Twine &what) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), what);
}

// "NCCL <call>: <reason> (<NCCL's last error>)", one line.
llvm::Error ncclCallFail(const char *call, ncclResult_t r, ncclComm_t comm) {
  const NcclLib &l = nccl();
  std::string last = l.getLastError ? l.getLastError(comm) : "";
  while (!last.empty() && (last.back() == '\n' || last.back() == ' '))
    last.pop_back();
  for (char &c : last)
    if (c == '\n')
      c = ' ';
  return ncclFail(llvm::Twine("NCCL ") + call + ": " + l.getErrorString(r) +
                  (last.empty() ? "" : " (" + last + ")"));
}

} // namespace

llvm::Expected<std::string> ncclLibraryVersion() {
  const NcclLib &l = nccl();
  if (!l.error.empty())
    return ncclFail(l.error);
  int v = 0;
  if (ncclResult_t r = l.getVersion(&v))
    return ncclCallFail("ncclGetVersion", r, nullptr);
  // NCCL 2.9 and later: major * 10000 + minor * 100 + patch.
  return llvm::formatv("NCCL {0}.{1}.{2}", v / 10000, v / 100 % 100, v % 100)
      .str();
}

llvm::Expected<NcclId> newNcclId() {
  const NcclLib &l = nccl();
  if (!l.error.empty())
    return ncclFail(l.error);
  ncclUniqueId id;
  if (ncclResult_t r = l.getUniqueId(&id))
    return ncclCallFail("ncclGetUniqueId", r, nullptr);
  NcclId out;
  static_assert(sizeof(id.internal) == sizeof(out.bytes));
  std::memcpy(out.bytes.data(), id.internal, sizeof(id.internal));
  return out;
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_)
    nccl().commAbort(static_cast<ncclComm_t>(comm_));
}

llvm::Error NcclCommunicator::asyncError() const {
  ncclResult_t state = ncclSuccess;
  auto comm = static_cast<ncclComm_t>(comm_);
  if (ncclResult_t r = nccl().commGetAsyncError(comm, &state))
    return ncclCallFail("ncclCommGetAsyncError", r, comm);
  if (state != ncclSuccess && state != ncclInProgress)
    return ncclCallFail("a communicator", state, comm);
  return llvm::Error::success();
}

llvm::Expected<std::unique_ptr<NcclCommunicator>>
openNcclCommunicator(const NcclId &id, int rank, int size, int device) {
  const NcclLib &l = nccl();
  if (!l.error.empty())
    return ncclFail(l.error);
  if (size < 1 || rank < 0 || rank >= size)
    return ncclFail(llvm::formatv("NCCL: rank {0} of a {1}-rank communicator",
                                  rank, size));
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0)
    return ncclFail(llvm::Twine("NCCL needs a GPU: no usable CUDA device (") +
                    (e != cudaSuccess ? cudaGetErrorString(e)
                                      : "the CUDA runtime sees no device") +
                    ")");
  if (device < 0 || device >= devices)
    return ncclFail(llvm::formatv("NCCL: CUDA device {0} does not exist ({1} "
                                  "visible)",
                                  device, devices));
  if (cudaError_t s = cudaSetDevice(device))
    return ncclFail(llvm::Twine("NCCL: cudaSetDevice: ") +
                    cudaGetErrorString(s));
  ncclUniqueId raw;
  std::memcpy(raw.internal, id.bytes.data(), sizeof(raw.internal));
  ncclComm_t comm = nullptr;
  if (ncclResult_t r = l.commInitRank(&comm, size, raw, rank))
    return ncclCallFail("ncclCommInitRank", r, comm);
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator);
  c->comm_ = comm;
  c->rank_ = rank;
  c->size_ = size;
  return std::move(c);
}

std::vector<NcclChannel> ncclChannels(const Plan &plan) {
  RankPairOrder order = rankPairOrder(plan, Channel::StagePair);
  std::vector<NcclChannel> out;
  int n = order.ranks;
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      if (const auto &s = order.sends[size_t(a) * n + b]; !s.empty())
        out.push_back({a, b, int64_t(s.size())});
  return out;
}

} // namespace cleave::runtime::cuda
