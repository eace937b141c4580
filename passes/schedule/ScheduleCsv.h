// Schedules in PyTorch torch.distributed.pipelining's CSV notation, so a
// schedule can be moved between cleave and PyTorch: one row per rank,
// comma-separated actions `<stage><type><microbatch>` with type F
// (forward), I (input gradient: cleave's B), W (weight gradient), B (full
// backward: cleave's BW), SEND_F, RECV_F, SEND_B, RECV_B. Example row:
// `0F0,0F1,0I0,0W0`. Empty cells (PyTorch's idle slots) are skipped.
// Row r is rank r's program; a row with actions of several stages (the
// interleaved and V schedules) places them on that rank. STEP is not
// written; reading adds one per stage at the end of its rank's row. A CSV without any
// SEND/RECV (PyTorch's compute-only form) gets them inserted
// (insertCommunication).
#pragma once

#include "passes/schedule/Schedule.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <string>

namespace cleave::passes::schedule {

// One line per stage, SEND/RECV included unless `computeOnly`.
std::string scheduleToCsv(const Schedule &s, bool computeOnly = false);

// Parses CSV text; `source` names it in errors (a file name). The schedule
// is not validated here (validateSchedule does that).
llvm::Expected<Schedule> scheduleFromCsv(llvm::StringRef text,
                                         const std::string &source,
                                         const std::string &name = "csv");

llvm::Expected<Schedule> readScheduleCsvFile(const std::string &path);

} // namespace cleave::passes::schedule
