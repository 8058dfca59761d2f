// Tensor: a named block of typed, shaped bytes, either owned or viewing a
// memory-mapped file; and safetensors I/O. The task's weights, its cached
// generated weights and the golden vectors all live in safetensors files, so
// one reader serves all three, and a generated weight file can be loaded by
// PyTorch users as is.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/json.h"

namespace ktune {

enum class DType { U8, BF16, F32, I32 };

const char* dtype_name(DType t);
size_t dtype_size(DType t);
bool parse_dtype(const std::string& s, DType* out);

struct Tensor {
  DType dtype = DType::U8;
  std::vector<int64_t> shape;
  uint8_t* data = nullptr;
  size_t nbytes = 0;
  std::shared_ptr<void> owner;  // keeps the bytes alive (a vector or a mapping)

  size_t numel() const;
  template <class T> T* as() const { return reinterpret_cast<T*>(data); }

  // A new zero-filled tensor that owns its bytes.
  static Tensor make(DType dtype, std::vector<int64_t> shape);
};

struct TensorFile {
  std::map<std::string, Tensor> tensors;
  json metadata = json::object();  // the __metadata__ strings

  const Tensor* find(const std::string& name) const;
};

// Maps the file read-only (tensors view the mapping; nothing is copied).
bool read_safetensors(const std::string& path, TensorFile* out, std::string* err);
// Metadata values must be strings (the format's rule). Written atomically.
bool write_safetensors(const std::string& path, const TensorFile& file, std::string* err);

}  // namespace ktune
