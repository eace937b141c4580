#include "runtime/data/NumpyFiles.h"

#include "support/Errors.h"
#include "support/FileIO.h"
#include "support/ShapeMath.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CRC.h"
#include "llvm/Support/MemoryBuffer.h"

#ifdef CLEAVE_HAVE_ZLIB
#include <zlib.h>
#endif

#include <algorithm>
#include <new>
#include <vector>

namespace cleave::runtime {

using namespace cleave::ir;

// NumPy .npy, version 1.0-3.0: magic, header length, a Python dict literal
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }, raw data.
static const char *npyDescr(DType d) {
  switch (d) {
  case DType::F32:
    return "<f4";
  case DType::F16:
    return "<f2";
  case DType::F64:
    return "<f8";
  case DType::I64:
    return "<i8";
  case DType::I32:
    return "<i4";
  case DType::I8:
    return "|i1";
  case DType::Bool:
    return "|b1";
  case DType::BF16:
  case DType::U8: // never a graph input (the importer refuses it)
    return nullptr;
  }
  return nullptr;
}

// Parses the bytes of a .npy file; `what` names them in errors ("'f.npy'",
// or "'f.npz' member 'x.npy'"). With `owned` (the string `all` views),
// the data is moved out of it rather than copied.
static llvm::Expected<std::shared_ptr<TensorData>>
parseNpy(llvm::StringRef all, const std::string &what,
         std::string *owned = nullptr) {
  if (!all.startswith("\x93NUMPY") || all.size() < 10)
    return fail(what + " is not a NumPy .npy file");
  uint8_t major = all[6];
  size_t headerLen, start;
  if (major == 1) {
    headerLen = uint8_t(all[8]) | (uint8_t(all[9]) << 8);
    start = 10;
  } else {
    if (all.size() < 12)
      return fail(what + " is a truncated .npy file");
    headerLen = uint32_t(uint8_t(all[8])) | (uint32_t(uint8_t(all[9])) << 8) |
                (uint32_t(uint8_t(all[10])) << 16) |
                (uint32_t(uint8_t(all[11])) << 24);
    start = 12;
  }
  if (start + headerLen > all.size())
    return fail(what + " is a truncated .npy file");
  llvm::StringRef header = all.substr(start, headerLen);
  auto field = [&](llvm::StringRef key) -> llvm::StringRef {
    size_t k = header.find("'" + key.str() + "'");
    if (k == llvm::StringRef::npos)
      return "";
    llvm::StringRef rest = header.substr(k + key.size() + 2).ltrim();
    if (!rest.consume_front(":"))
      return "";
    return rest.ltrim();
  };
  llvm::StringRef descr = field("descr");
  if (!descr.consume_front("'"))
    return fail(what + ": .npy header has no 'descr'");
  descr = descr.take_until([](char c) { return c == '\''; });
  std::optional<DType> dt;
  for (DType d : {DType::F32, DType::F16, DType::F64, DType::I64, DType::I32,
                  DType::I8, DType::Bool})
    if (descr == npyDescr(d) ||
        (descr.size() == 3 && descr.drop_front() ==
                                  llvm::StringRef(npyDescr(d)).drop_front() &&
         (descr[0] == '=' || descr[0] == '|' || descr[0] == '<')))
      dt = d;
  if (!dt)
    return fail(what + ": NumPy dtype '" + descr +
                "' is not supported (use float32, float64, float16, int64, "
                "int32, int8 or bool, little-endian)");
  if (field("fortran_order").startswith("True"))
    return fail(what + ": Fortran-ordered arrays are not supported");
  llvm::StringRef shapeText = field("shape");
  if (!shapeText.consume_front("("))
    return fail(what + ": .npy header has no 'shape'");
  shapeText = shapeText.take_until([](char c) { return c == ')'; });
  Shape shape;
  llvm::SmallVector<llvm::StringRef, 4> parts;
  shapeText.split(parts, ',', -1, false);
  for (llvm::StringRef p : parts) {
    p = p.trim();
    if (p.empty())
      continue;
    int64_t d;
    if (p.getAsInteger(10, d) || d < 0)
      return fail(what + ": bad shape in .npy header");
    shape.push_back(d);
  }
  if (auto e = support::checkShape(shape))
    return fail(what + ": " + llvm::toString(std::move(e)));
  TensorType type(*dt, shape);
  size_t dataStart = start + headerLen;
  if (all.size() - dataStart != size_t(type.byteSize()))
    return fail(what + " holds " + std::to_string(all.size() - dataStart) +
                " data bytes but " + type.str() + " needs " +
                std::to_string(type.byteSize()));
  if (owned && owned->data() == all.data() && owned->size() == all.size()) {
    owned->erase(0, dataStart); // no second copy of a large member
    return std::make_shared<TensorData>(type, std::move(*owned));
  }
  return std::make_shared<TensorData>(type, all.substr(dataStart).str());
}

llvm::Expected<std::shared_ptr<TensorData>>
readNpyFile(const std::string &path) {
  auto buf = support::readFile(path, "tensor file");
  if (!buf)
    return buf.takeError();
  return parseNpy((*buf)->getBuffer(), "'" + path + "'");
}

llvm::Error writeNpyFile(const std::string &path, const TensorData &d) {
  const char *descr = npyDescr(d.type().dtype);
  if (!descr)
    return fail("cannot write " + d.type().str() + " as .npy (no NumPy type)");
  std::string shape = "(";
  for (int64_t dim : d.type().shape)
    shape += std::to_string(dim) + ", ";
  if (d.type().rank() == 1)
    shape.resize(shape.size() - 1); // "(3,)"
  else if (d.type().rank() > 1)
    shape.resize(shape.size() - 2);
  shape += ")";
  std::string header = std::string("{'descr': '") + descr +
                       "', 'fortran_order': False, 'shape': " + shape + ", }";
  // Pad with spaces so the data starts at a multiple of 64, ending in '\n'.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += char(1);
  out += char(0);
  out += char(header.size() & 0xff);
  out += char(header.size() >> 8);
  out += header;
  llvm::ArrayRef<uint8_t> b = d.bytes();
  out.append(b.begin(), b.end());
  return support::writeFileAtomically(path, out);
}

// --- .npz: a zip archive of .npy members -----------------------------------
//
// Read through the central directory (the authoritative list: local headers
// written by streaming zip writers may carry no sizes); ZIP64 records, which
// numpy.savez always writes for its members, are understood. Every offset and
// length is checked against the file before use.

namespace {
constexpr uint32_t kEocdSig = 0x06054b50, kZip64EocdSig = 0x06064b50,
                   kZip64LocatorSig = 0x07064b50, kCentralSig = 0x02014b50,
                   kLocalSig = 0x04034b50;

// Little-endian reads from a byte range known to be long enough.
uint64_t le(llvm::StringRef b, size_t at, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i)
    v = (v << 8) | uint8_t(b[at + i]);
  return v;
}

#ifdef CLEAVE_HAVE_ZLIB
// Inflates a raw deflate stream into exactly `size` bytes. The output
// grows with what the stream really yields (never past `size`), so a
// member whose header claims gigabytes it does not hold is found out
// before that much memory is taken. An empty string on failure; `error`
// says why.
bool inflateRaw(llvm::StringRef in, std::string &out, uint64_t size,
                std::string &error) {
  z_stream s{};
  if (inflateInit2(&s, -MAX_WBITS) != Z_OK) {
    error = "does not decompress";
    return false;
  }
  constexpr size_t kPiece = size_t(1) << 20;
  std::vector<unsigned char> piece(kPiece);
  s.next_in = reinterpret_cast<Bytef *>(const_cast<char *>(in.data()));
  size_t inLeft = in.size();
  int rc = Z_OK;
  error.clear();
  while (rc == Z_OK) {
    // avail_in is 32-bit: feed large members in pieces.
    if (s.avail_in == 0 && inLeft) {
      s.avail_in = uInt(std::min<size_t>(inLeft, 1u << 30));
      inLeft -= s.avail_in;
    }
    s.next_out = piece.data();
    s.avail_out = uInt(kPiece);
    rc = inflate(&s, Z_NO_FLUSH);
    size_t got = kPiece - s.avail_out;
    if (got > size - out.size()) {
      error = "holds more than the " + std::to_string(size) +
              " bytes its header claims";
      break;
    }
    try {
      if (out.capacity() < out.size() + got)
        out.reserve(std::min<uint64_t>(
            size, std::max<uint64_t>(2 * out.capacity(), out.size() + got)));
      out.append(reinterpret_cast<const char *>(piece.data()), got);
    } catch (const std::bad_alloc &) {
      error = "cannot allocate " + std::to_string(size) +
              " bytes to decompress it";
      break;
    }
    if (rc == Z_BUF_ERROR && (s.avail_in || inLeft))
      rc = Z_OK; // progress still possible
  }
  inflateEnd(&s);
  if (error.empty() && (rc != Z_STREAM_END || out.size() != size))
    error = "does not decompress to the " + std::to_string(size) +
            " bytes its header claims";
  return error.empty();
}
#endif
} // namespace

llvm::Expected<std::map<std::string, std::shared_ptr<TensorData>>>
readNpzFile(const std::string &path) {
  auto buf = support::readFile(path, "tensor file");
  if (!buf)
    return buf.takeError();
  llvm::StringRef all = (*buf)->getBuffer();
  const std::string file = "'" + path + "'";
  auto corrupt = [&](const llvm::Twine &what) {
    return fail(file + " is a truncated or corrupt .npz file (" + what + ")");
  };

  // End of central directory: 22 bytes plus a comment of up to 64 KiB.
  if (all.size() < 22)
    return fail(file + " is not a .npz file (too short to be a zip archive)");
  size_t eocd = llvm::StringRef::npos;
  size_t lowest = all.size() > 22 + 0xffff ? all.size() - 22 - 0xffff : 0;
  for (size_t at = all.size() - 22 + 1; at-- > lowest;)
    if (le(all, at, 4) == kEocdSig && at + 22 + le(all, at + 20, 2) == all.size()) {
      eocd = at;
      break;
    }
  if (eocd == llvm::StringRef::npos)
    return fail(file + " is not a .npz file (no zip end-of-central-directory "
                       "record; truncated, or not a zip archive)");
  uint64_t disk = le(all, eocd + 4, 2), cdDisk = le(all, eocd + 6, 2);
  uint64_t count = le(all, eocd + 10, 2);
  uint64_t cdSize = le(all, eocd + 12, 4), cdOffset = le(all, eocd + 16, 4);
  if (count == 0xffff || cdSize == 0xffffffff || cdOffset == 0xffffffff) {
    // ZIP64: a locator just before the record points at the 64-bit record.
    if (eocd < 20 || le(all, eocd - 20, 4) != kZip64LocatorSig)
      return corrupt("ZIP64 locator missing");
    uint64_t at = le(all, eocd - 20 + 8, 8);
    if (at > all.size() || all.size() - at < 56 ||
        le(all, at, 4) != kZip64EocdSig)
      return corrupt("bad ZIP64 end-of-central-directory record");
    disk = le(all, at + 16, 4);
    cdDisk = le(all, at + 20, 4);
    count = le(all, at + 32, 8);
    cdSize = le(all, at + 40, 8);
    cdOffset = le(all, at + 48, 8);
  }
  if (disk != 0 || cdDisk != 0)
    return fail(file + ": multi-part zip archives are not supported");
  if (cdOffset > all.size() || cdSize > all.size() - cdOffset)
    return corrupt("central directory lies outside the file");
  // Each entry takes at least 46 bytes, which bounds `count`.
  if (count > cdSize / 46)
    return corrupt("central directory is too short for its entries");

  std::map<std::string, std::shared_ptr<TensorData>> out;
  llvm::StringRef cd = all.substr(cdOffset, cdSize);
  size_t pos = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (cd.size() - pos < 46 || le(cd, pos, 4) != kCentralSig)
      return corrupt("bad central directory entry");
    uint64_t flags = le(cd, pos + 8, 2), method = le(cd, pos + 10, 2);
    uint32_t crc = uint32_t(le(cd, pos + 16, 4));
    uint64_t csize = le(cd, pos + 20, 4), usize = le(cd, pos + 24, 4);
    uint64_t nameLen = le(cd, pos + 28, 2), extraLen = le(cd, pos + 30, 2),
             commentLen = le(cd, pos + 32, 2);
    uint64_t startDisk = le(cd, pos + 34, 2), local = le(cd, pos + 42, 4);
    if (cd.size() - pos - 46 < nameLen + extraLen + commentLen)
      return corrupt("bad central directory entry");
    std::string name = cd.substr(pos + 46, nameLen).str();
    llvm::StringRef extra = cd.substr(pos + 46 + nameLen, extraLen);
    pos += 46 + nameLen + extraLen + commentLen;
    // ZIP64 extended information replaces the fields saturated above, in
    // this order.
    for (size_t e = 0; e + 4 <= extra.size();) {
      uint64_t id = le(extra, e, 2), len = le(extra, e + 2, 2);
      if (extra.size() - e - 4 < len)
        break;
      if (id == 0x0001) {
        llvm::StringRef z = extra.substr(e + 4, len);
        size_t k = 0;
        auto take = [&](uint64_t &field, uint64_t saturated, int n) {
          if (field != saturated)
            return true;
          if (z.size() - k < size_t(n))
            return false;
          field = le(z, k, n);
          k += n;
          return true;
        };
        if (!take(usize, 0xffffffff, 8) || !take(csize, 0xffffffff, 8) ||
            !take(local, 0xffffffff, 8) || !take(startDisk, 0xffff, 4))
          return corrupt("bad ZIP64 field of member '" + name + "'");
      }
      e += 4 + len;
    }
    const std::string member = file + " member '" + name + "'";
    if (name.empty() || name.back() == '/')
      continue; // a folder entry
    if (flags & 1)
      return fail(member + " is encrypted");
    if (startDisk != 0)
      return fail(file + ": multi-part zip archives are not supported");

    // The local header repeats the name and may carry a different extra
    // field; the data follows it.
    if (local > all.size() || all.size() - local < 30 ||
        le(all, local, 4) != kLocalSig)
      return corrupt("bad local header of member '" + name + "'");
    uint64_t dataAt = local + 30 + le(all, local + 26, 2) + le(all, local + 28, 2);
    if (dataAt > all.size() || csize > all.size() - dataAt)
      return corrupt("data of member '" + name + "' lies outside the file");
    llvm::StringRef raw = all.substr(dataAt, csize);

    std::string inflated;
    llvm::StringRef bytes;
    if (method == 0) {
      if (usize != csize)
        return corrupt("stored member '" + name + "' has two sizes");
      bytes = raw;
    } else if (method == 8) {
#ifdef CLEAVE_HAVE_ZLIB
      // Deflate expands at most ~1032:1; larger claims are corruption, not
      // a reason to allocate.
      if (usize / 1032 > csize + 1)
        return corrupt("member '" + name + "' claims an impossible size");
      std::string why;
      if (!inflateRaw(raw, inflated, usize, why))
        return corrupt("member '" + name + "' " + why);
      bytes = inflated;
#else
      return fail(member + " is compressed; save with numpy.savez, not "
                           "savez_compressed (this cleave was built without "
                           "zlib)");
#endif
    } else {
      return fail(member + " uses zip compression method " +
                  std::to_string(method) +
                  "; save with numpy.savez or numpy.savez_compressed");
    }
    if (llvm::crc32(llvm::arrayRefFromStringRef(bytes)) != crc)
      return corrupt("checksum mismatch in member '" + name + "'");

    llvm::StringRef key = name;
    if (!key.consume_back(".npy"))
      return fail(member + " is not a .npy array");
    auto t = parseNpy(bytes, member, method == 8 ? &inflated : nullptr);
    if (!t)
      return t.takeError();
    if (!out.emplace(key.str(), std::move(*t)).second)
      return fail(file + " holds array '" + key + "' twice");
  }
  return out;
}

bool canReadCompressedNpz() {
#ifdef CLEAVE_HAVE_ZLIB
  return true;
#else
  return false;
#endif
}

} // namespace cleave::runtime
