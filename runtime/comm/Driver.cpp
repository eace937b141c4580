#include "runtime/comm/Driver.h"

#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace cleave::runtime {

char ReportedElsewhere::ID = 0;

void ReportedElsewhere::log(llvm::raw_ostream &os) const {
  os << "another process of the run failed and reported it";
}

std::error_code ReportedElsewhere::convertToErrorCode() const {
  return llvm::inconvertibleErrorCode();
}

llvm::Error agree(Driver &driver, llvm::Error mine) {
  bool failed = bool(mine);
  auto all = driver.allGather({failed ? 1.0 : 0.0});
  if (!all) {
    llvm::consumeError(std::move(mine));
    return driver.failAlone(all.takeError());
  }
  for (int r = 0; r < driver.size(); ++r)
    if ((*all)[size_t(r)] != 0) {
      if (r == driver.rank())
        return mine;
      llvm::consumeError(std::move(mine));
      return llvm::make_error<ReportedElsewhere>();
    }
  return llvm::Error::success();
}

namespace {

class SingleProcessDriver : public Driver {
public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  llvm::Expected<std::vector<double>>
  allGather(const std::vector<double> &mine) override {
    return mine;
  }
  llvm::Expected<std::vector<std::vector<uint8_t>>>
  gatherToRoot(const std::vector<uint8_t> &mine) override {
    return std::vector<std::vector<uint8_t>>{mine};
  }
  llvm::Error failAlone(llvm::Error e) override { return e; }
};

} // namespace

std::unique_ptr<Driver> createSingleProcessDriver() {
  return std::make_unique<SingleProcessDriver>();
}

bool launchedByMpirun() {
  for (const char *var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(var))
      return true;
  return false;
}

void putRecord(std::vector<uint8_t> &out, const void *data, uint64_t n) {
  const uint8_t *len = reinterpret_cast<const uint8_t *>(&n);
  out.insert(out.end(), len, len + sizeof(n));
  const uint8_t *p = static_cast<const uint8_t *>(data);
  out.insert(out.end(), p, p + n);
}

std::vector<std::vector<uint8_t>> splitRecords(const std::vector<uint8_t> &in) {
  std::vector<std::vector<uint8_t>> out;
  size_t pos = 0;
  while (pos + sizeof(uint64_t) <= in.size()) {
    uint64_t n = 0;
    std::memcpy(&n, in.data() + pos, sizeof(n));
    pos += sizeof(n);
    n = std::min<uint64_t>(n, in.size() - pos);
    out.emplace_back(in.begin() + long(pos), in.begin() + long(pos + n));
    pos += n;
  }
  return out;
}

} // namespace cleave::runtime
