// DLPack in and out of the `moesq` Python module (python/module.cpp): tensors cross as DLPack
// capsules or objects with __dlpack__ / __dlpack_device__ (NumPy, PyTorch, CuPy, JAX), zero-copy.
//
// In: `view_dlpack` takes a producer object (calls obj.__dlpack__(stream=...)) or a raw "dltensor"
// capsule, checks dtype, rank, shape, device and C-contiguity against what the op needs, and keeps
// the producer's memory alive (and its deleter called once) for the life of the DlView. Errors are
// Python TypeError/ValueError naming the function, the argument and what was expected. A CPU
// argument whose __dlpack__ refuses with BufferError (NumPy < 2 cannot export a read-only array, e.g.
// numpy.from_dlpack's view of a moesq.Tensor) is read through the buffer protocol instead.
// Out: `Tensor` owns its storage (a shared buffer: host vector or device allocation); every
// __dlpack__ call hands out a new DLManagedTensor that shares the buffer, so the consumer's array is
// a zero-copy view that outlives the Tensor object. A host Tensor also has the buffer protocol, so
// numpy.asarray(t) is a WRITABLE zero-copy view (numpy.from_dlpack views are read-only in NumPy < 2).
// Non-obvious decision: the stream argument of __dlpack__ is honoured the protocol's way — the
// PRODUCER makes its work visible on the consumer's stream; for CPU tensors it must be None.
#pragma once
#include <dlpack/dlpack.h>
#include <pybind11/pybind11.h>
#include <pybind11/buffer_info.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace moesq::py {

namespace pyb = pybind11;

enum class DType { F32, I32, I64, U8, U16, BF16 };
const char* dtype_name(DType d);
size_t dtype_bytes(DType d);

// What an argument must be. dims: -1 = any extent; rank = dims.size().
struct Expect {
  std::string fn, arg;              // e.g. "moesq.sparse_gemm_ref", "x"
  std::vector<DType> dtypes;        // accepted dtypes
  std::vector<int64_t> dims;        // required shape (-1 = any)
  bool cuda = false;                // true: kDLCUDA memory; false: kDLCPU
};

// A checked, borrowed view of a producer's tensor.
class DlView {
 public:
  DlView(const pyb::object& obj, const Expect& e, intptr_t consumer_stream = 0);
  ~DlView();
  DlView(const DlView&) = delete;
  DlView& operator=(const DlView&) = delete;

  void* data() const;
  int device_type() const;  // kDLCPU or kDLCUDA (checked against Expect::cuda)
  int device_id() const;
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[static_cast<size_t>(i)]; }
  int64_t numel() const;
  template <class T>
  const T* as() const { return static_cast<const T*>(data()); }

 private:
  void check(const DLTensor& t, const Expect& e);  // device, dtype, shape, C-contiguity
  DLManagedTensor* mt_ = nullptr;  // the DLPack path
  Py_buffer buf_{};                // the buffer-protocol path (has_buf_)
  bool has_buf_ = false;
  DType dtype_ = DType::F32;
  std::vector<int64_t> shape_;
};

// An output tensor of the module (host or device memory it owns).
class Tensor {
 public:
  // Host tensor over `bytes` (moved in); shape in elements.
  static Tensor host(DType dt, std::vector<int64_t> shape, std::vector<uint8_t> bytes);
  template <class T>
  static Tensor host_from(DType dt, std::vector<int64_t> shape, const std::vector<T>& v) {
    std::vector<uint8_t> b(v.size() * sizeof(T));
    if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
    return host(dt, std::move(shape), std::move(b));
  }
  // Device tensor over memory that `owner` keeps alive (freed when the last view goes); `ready` (may
  // be empty) makes the producer's work visible on a consumer stream (the __dlpack__ stream protocol).
  static Tensor device(DType dt, std::vector<int64_t> shape, void* data, int device_id, std::shared_ptr<void> owner,
                       std::function<void(intptr_t)> ready);

  pyb::capsule dlpack(const pyb::object& stream) const;  // __dlpack__(stream=None)
  // The buffer protocol of a host tensor (writable, C-contiguous); BufferError for a device tensor or
  // bfloat16 (no buffer format: use torch.from_dlpack).
  pyb::buffer_info buffer() const;
  uintptr_t data_ptr() const { return reinterpret_cast<uintptr_t>(data_); }
  pyb::tuple dlpack_device() const;                      // __dlpack_device__()
  std::vector<int64_t> shape() const { return shape_; }
  std::string dtype() const { return dtype_name(dtype_); }
  std::string device_str() const;

 private:
  DType dtype_ = DType::F32;
  std::vector<int64_t> shape_;
  std::shared_ptr<void> owner_;  // keeps data_ alive
  void* data_ = nullptr;
  int device_type_ = kDLCPU, device_id_ = 0;
  std::function<void(intptr_t)> ready_;
};

}  // namespace moesq::py
