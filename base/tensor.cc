#include "base/tensor.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace ktune {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::U8: return "U8";
    case DType::BF16: return "BF16";
    case DType::F32: return "F32";
    case DType::I32: return "I32";
  }
  return "?";
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::U8: return 1;
    case DType::BF16: return 2;
    case DType::F32: return 4;
    case DType::I32: return 4;
  }
  return 0;
}

bool parse_dtype(const std::string& s, DType* out) {
  for (DType t : {DType::U8, DType::BF16, DType::F32, DType::I32})
    if (s == dtype_name(t)) {
      *out = t;
      return true;
    }
  return false;
}

size_t Tensor::numel() const {
  size_t n = 1;
  for (int64_t d : shape) n *= size_t(d);
  return n;
}

Tensor Tensor::make(DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.nbytes = t.numel() * dtype_size(dtype);
  auto buf = std::make_shared<std::vector<uint8_t>>(t.nbytes ? t.nbytes : 1, 0);
  t.data = buf->data();
  t.owner = buf;
  return t;
}

const Tensor* TensorFile::find(const std::string& name) const {
  auto it = tensors.find(name);
  return it == tensors.end() ? nullptr : &it->second;
}

namespace {
struct Mapping {
  void* base = MAP_FAILED;
  size_t size = 0;
  ~Mapping() {
    if (base != MAP_FAILED) munmap(base, size);
  }
};
}  // namespace

bool read_safetensors(const std::string& path, TensorFile* out, std::string* err) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    *err = "cannot open " + path + ": " + std::strerror(errno);
    return false;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size < 8) {
    close(fd);
    *err = path + ": not a safetensors file (too short)";
    return false;
  }
  auto map = std::make_shared<Mapping>();
  map->size = size_t(st.st_size);
  map->base = mmap(nullptr, map->size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map->base == MAP_FAILED) {
    *err = "cannot map " + path + ": " + std::strerror(errno);
    return false;
  }
  auto* bytes = static_cast<uint8_t*>(map->base);
  uint64_t header_len;
  std::memcpy(&header_len, bytes, 8);
  if (header_len > map->size - 8) {
    *err = path + ": header length " + std::to_string(header_len) + " runs past the end of the file";
    return false;
  }
  json header = json::parse(bytes + 8, bytes + 8 + header_len, nullptr, false);
  if (header.is_discarded() || !header.is_object()) {
    *err = path + ": header is not a JSON object";
    return false;
  }
  const uint8_t* data_start = bytes + 8 + header_len;
  size_t data_size = map->size - 8 - header_len;
  TensorFile file;
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      file.metadata = info;
      continue;
    }
    Tensor t;
    if (!info.contains("dtype") || !parse_dtype(info["dtype"].get<std::string>(), &t.dtype)) {
      *err = path + ": tensor " + name + " has an unknown dtype";
      return false;
    }
    t.shape = info.value("shape", std::vector<int64_t>{});
    auto offsets = info.value("data_offsets", std::vector<uint64_t>{});
    if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > data_size) {
      *err = path + ": tensor " + name + " has bad data_offsets";
      return false;
    }
    t.nbytes = offsets[1] - offsets[0];
    if (t.nbytes != t.numel() * dtype_size(t.dtype)) {
      *err = path + ": tensor " + name + " size does not match its shape";
      return false;
    }
    // The mapping is private and read-only; const_cast keeps one Tensor type
    // for owned (writable) and mapped (read-only) data.
    t.data = const_cast<uint8_t*>(data_start + offsets[0]);
    t.owner = map;
    file.tensors.emplace(name, std::move(t));
  }
  *out = std::move(file);
  return true;
}

bool write_safetensors(const std::string& path, const TensorFile& file, std::string* err) {
  json header = json::object();
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  uint64_t offset = 0;
  for (auto& [name, t] : file.tensors) {
    header[name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  std::string text = header.dump();
  while ((text.size() + 8) % 8) text.push_back(' ');  // align the data to 8 bytes
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) {
    *err = "cannot write " + tmp + ": " + std::strerror(errno);
    return false;
  }
  uint64_t len = text.size();
  bool ok = std::fwrite(&len, 8, 1, f) == 1 && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  for (auto& [name, t] : file.tensors)
    ok = ok && (t.nbytes == 0 || std::fwrite(t.data, 1, t.nbytes, f) == t.nbytes);
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    *err = "cannot write " + path + ": " + std::strerror(errno);
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

}  // namespace ktune
