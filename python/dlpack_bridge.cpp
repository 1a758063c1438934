// DLPack bridge of the moesq Python module (see dlpack_bridge.h).
#include "dlpack_bridge.h"

#include <cstring>
#include <sstream>

namespace moesq::py {

namespace {

constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";

bool to_dtype(const DLDataType& t, DType* out) {
  if (t.lanes != 1) return false;
  if (t.code == kDLFloat && t.bits == 32) return *out = DType::F32, true;
  if (t.code == kDLInt && t.bits == 32) return *out = DType::I32, true;
  if (t.code == kDLInt && t.bits == 64) return *out = DType::I64, true;
  if (t.code == kDLUInt && t.bits == 8) return *out = DType::U8, true;
  if (t.code == kDLUInt && t.bits == 16) return *out = DType::U16, true;
  if (t.code == kDLBfloat && t.bits == 16) return *out = DType::BF16, true;
  return false;
}

DLDataType from_dtype(DType d) {
  switch (d) {
    case DType::F32: return {kDLFloat, 32, 1};
    case DType::I32: return {kDLInt, 32, 1};
    case DType::I64: return {kDLInt, 64, 1};
    case DType::U8: return {kDLUInt, 8, 1};
    case DType::U16: return {kDLUInt, 16, 1};
    case DType::BF16: return {kDLBfloat, 16, 1};
  }
  return {kDLFloat, 32, 1};
}

std::string dl_type_str(const DLDataType& t) {
  const char* c = t.code == kDLFloat ? "float" : t.code == kDLInt ? "int" : t.code == kDLUInt ? "uint"
                  : t.code == kDLBfloat ? "bfloat" : "code";
  std::string s = std::string(c) + std::to_string(t.bits);
  if (t.lanes != 1) s += "x" + std::to_string(t.lanes);
  return s;
}

std::string shape_str(const std::vector<int64_t>& s, bool wildcard = false) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + (wildcard && s[i] < 0 ? "*" : std::to_string(s[i]));
  return r + "]";
}

[[noreturn]] void fail(bool type_error, const Expect& e, const std::string& what) {
  const std::string msg = e.fn + ": argument '" + e.arg + "' " + what;
  if (type_error) throw pyb::type_error(msg);
  throw pyb::value_error(msg);
}

// Consumer side of the protocol: the capsule must be an unused "dltensor".
DLManagedTensor* take_capsule(const pyb::capsule& cap, const Expect& e) {
  const char* name = PyCapsule_GetName(cap.ptr());
  if (!name || std::strcmp(name, kCapsuleName) != 0)
    fail(true, e, std::string("is a capsule named '") + (name ? name : "(null)") +
                      "', expected an unused 'dltensor' DLPack capsule (each capsule can be consumed once)");
  auto* mt = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap.ptr(), kCapsuleName));
  if (!mt) throw pyb::error_already_set();
  PyCapsule_SetName(cap.ptr(), kUsedCapsuleName);  // now ours: we call the deleter
  return mt;
}

}  // namespace

size_t dtype_bytes(DType d) {
  switch (d) {
    case DType::F32: case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
    case DType::U16: case DType::BF16: return 2;
  }
  return 1;
}

const char* dtype_name(DType d) {
  switch (d) {
    case DType::F32: return "float32";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::U8: return "uint8";
    case DType::U16: return "uint16";
    case DType::BF16: return "bfloat16";
  }
  return "?";
}

// A host buffer (PEP 3118) as the DLTensor the checks read: element strides, little-endian formats.
// `shape` / `strides` hold the arrays t points at. False when the format is not one of moesq's dtypes.
bool buffer_as_dltensor(const Py_buffer& b, DLTensor* t, std::vector<int64_t>* shape, std::vector<int64_t>* strides) {
  std::string f = b.format ? b.format : "B";
  if (!f.empty() && (f[0] == '@' || f[0] == '=' || f[0] == '<')) f.erase(0, 1);
  const bool sint = f == "i" || f == "l" || f == "q", uint = f == "B" || f == "H";
  if (f == "f" && b.itemsize == 4) t->dtype = {kDLFloat, 32, 1};
  else if (sint && (b.itemsize == 4 || b.itemsize == 8)) t->dtype = {kDLInt, static_cast<uint8_t>(8 * b.itemsize), 1};
  else if (uint) t->dtype = {kDLUInt, static_cast<uint8_t>(8 * b.itemsize), 1};
  else return false;
  shape->assign(b.shape, b.shape + b.ndim);
  strides->clear();
  for (int i = 0; i < b.ndim; ++i) strides->push_back(b.strides ? b.strides[i] / b.itemsize : 0);
  if (!b.strides) {  // C-contiguous by the protocol
    int64_t s = 1;
    strides->assign(static_cast<size_t>(b.ndim), 0);
    for (int i = b.ndim - 1; i >= 0; --i) (*strides)[i] = s, s *= b.shape[i];
  }
  t->data = b.buf;
  t->device = {kDLCPU, 0};
  t->ndim = b.ndim;
  t->shape = shape->data();
  t->strides = strides->data();
  t->byte_offset = 0;
  return true;
}

DlView::DlView(const pyb::object& obj, const Expect& e, intptr_t consumer_stream) {
  pyb::capsule cap;
  if (PyCapsule_CheckExact(obj.ptr())) {
    cap = pyb::reinterpret_borrow<pyb::capsule>(obj);
  } else if (pyb::hasattr(obj, "__dlpack__")) {
    // CUDA producers get our stream (1 = the legacy default stream, per the protocol, when 0).
    pyb::object dev = pyb::hasattr(obj, "__dlpack_device__") ? obj.attr("__dlpack_device__")() : pyb::none();
    const bool on_cuda = !dev.is_none() && pyb::cast<int>(pyb::tuple(dev)[0]) == kDLCUDA;
    pyb::object s = on_cuda ? pyb::int_(consumer_stream ? consumer_stream : 1) : pyb::object(pyb::none());
    pyb::object c;
    try {
      c = obj.attr("__dlpack__")(pyb::arg("stream") = s);
    } catch (pyb::error_already_set& err) {
      // NumPy < 2 refuses to export a read-only array ("signalling readonly is unsupported by DLPack"),
      // e.g. numpy.from_dlpack's view of a moesq.Tensor handed back: read it through the buffer protocol.
      if (!err.matches(PyExc_BufferError) || on_cuda || e.cuda || !PyObject_CheckBuffer(obj.ptr())) throw;
      if (PyObject_GetBuffer(obj.ptr(), &buf_, PyBUF_STRIDES | PyBUF_FORMAT) != 0) throw pyb::error_already_set();
      has_buf_ = true;
    }
    if (!has_buf_) {
      if (!PyCapsule_CheckExact(c.ptr())) fail(true, e, "returned a non-capsule from __dlpack__()");
      cap = pyb::reinterpret_borrow<pyb::capsule>(c);
    }
  } else {
    fail(true, e, std::string("is a ") + Py_TYPE(obj.ptr())->tp_name +
                      ", expected a DLPack tensor (an object with __dlpack__, e.g. a NumPy array or torch "
                      "tensor, or a 'dltensor' capsule)");
  }
  if (has_buf_) {
    DLTensor t{};
    std::vector<int64_t> shape, strides;
    try {
      if (!buffer_as_dltensor(buf_, &t, &shape, &strides))
        fail(true, e, std::string("has buffer format '") + (buf_.format ? buf_.format : "") +
                          "' (item size " + std::to_string(buf_.itemsize) + "), not one moesq reads");
      check(t, e);
    } catch (...) {
      PyBuffer_Release(&buf_);
      has_buf_ = false;
      throw;
    }
    return;
  }
  mt_ = take_capsule(cap, e);
  // From here on, errors must release the producer's memory: ~DlView does not run for a throwing ctor.
  try {
    check(mt_->dl_tensor, e);
  } catch (...) {
    if (mt_->deleter) mt_->deleter(mt_);
    mt_ = nullptr;
    throw;
  }
}

void DlView::check(const DLTensor& t, const Expect& e) {
  {
    const bool want_cuda = e.cuda;
    if (want_cuda ? t.device.device_type != kDLCUDA : t.device.device_type != kDLCPU) {
      const std::string have = t.device.device_type == kDLCPU ? "cpu"
                               : t.device.device_type == kDLCUDA ? "cuda:" + std::to_string(t.device.device_id)
                                                                 : "device type " + std::to_string(t.device.device_type);
      fail(false, e, "is on " + have + "; this op needs " +
                         (want_cuda ? std::string("CUDA memory") : std::string("CPU (host) memory")) +
                         (want_cuda ? "" : " (copy it with .cpu() / numpy, or use the GPU op)"));
    }
    std::string want;
    for (DType d : e.dtypes) want += (want.empty() ? "" : " or ") + std::string(dtype_name(d));
    const bool known = to_dtype(t.dtype, &dtype_);
    bool ok = false;
    for (DType d : e.dtypes) ok |= known && d == dtype_;
    if (!ok) fail(true, e, "has dtype " + (known ? std::string(dtype_name(dtype_)) : dl_type_str(t.dtype)) + ", expected " + want);
    shape_.assign(t.shape, t.shape + t.ndim);
    bool shape_ok = shape_.size() == e.dims.size();
    for (size_t i = 0; shape_ok && i < shape_.size(); ++i) shape_ok = e.dims[i] < 0 || e.dims[i] == shape_[i];
    if (!shape_ok) fail(false, e, "has shape " + shape_str(shape_) + ", expected " + shape_str(e.dims, true));
    if (t.strides) {  // C-contiguous: stride of dim i = product of the later extents (extent-1 dims free)
      int64_t want_stride = 1;
      for (int i = t.ndim - 1; i >= 0; --i) {
        if (t.shape[i] != 1 && t.strides[i] != want_stride)
          fail(false, e, "is not C-contiguous (strides " + shape_str(std::vector<int64_t>(t.strides, t.strides + t.ndim)) +
                             " for shape " + shape_str(shape_) + "); pass a contiguous copy");
        want_stride *= t.shape[i];
      }
    }
  }
}

DlView::~DlView() {
  if (mt_ && mt_->deleter) mt_->deleter(mt_);
  if (has_buf_) PyBuffer_Release(&buf_);
}

void* DlView::data() const {
  if (has_buf_) return buf_.buf;
  return static_cast<uint8_t*>(mt_->dl_tensor.data) + mt_->dl_tensor.byte_offset;
}

int DlView::device_type() const { return has_buf_ ? kDLCPU : mt_->dl_tensor.device.device_type; }
int DlView::device_id() const { return has_buf_ ? 0 : mt_->dl_tensor.device.device_id; }

int64_t DlView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

Tensor Tensor::host(DType dt, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (static_cast<size_t>(n) * dtype_bytes(dt) != bytes.size())
    throw std::logic_error("moesq.Tensor: shape does not match the byte count");
  Tensor t;
  t.dtype_ = dt;
  t.shape_ = std::move(shape);
  auto buf = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  t.data_ = buf->data();
  t.owner_ = buf;
  return t;
}

Tensor Tensor::device(DType dt, std::vector<int64_t> shape, void* data, int device_id, std::shared_ptr<void> owner,
                      std::function<void(intptr_t)> ready) {
  Tensor t;
  t.dtype_ = dt;
  t.shape_ = std::move(shape);
  t.data_ = data;
  t.owner_ = std::move(owner);
  t.device_type_ = kDLCUDA;
  t.device_id_ = device_id;
  t.ready_ = std::move(ready);
  return t;
}

namespace {

// What one exported DLManagedTensor holds: the shape array and a reference to the storage.
struct Export {
  DLManagedTensor mt{};
  std::vector<int64_t> shape;
  std::shared_ptr<void> owner;
};

void export_deleter(DLManagedTensor* self) { delete static_cast<Export*>(self->manager_ctx); }

void capsule_destructor(PyObject* cap) {
  // Never consumed: the capsule still owns the tensor (the protocol's rule).
  if (std::strcmp(PyCapsule_GetName(cap), kCapsuleName) != 0) return;
  auto* mt = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, kCapsuleName));
  if (mt && mt->deleter) mt->deleter(mt);
}

}  // namespace

pyb::capsule Tensor::dlpack(const pyb::object& stream) const {
  if (device_type_ == kDLCPU) {
    if (!stream.is_none())
      throw pyb::value_error("moesq.Tensor.__dlpack__: stream must be None for a CPU tensor, got " +
                             std::string(pyb::str(stream)));
  } else if (ready_) {
    ready_(stream.is_none() ? 0 : pyb::cast<intptr_t>(stream));
  }
  auto* ex = new Export();
  ex->shape = shape_;
  ex->owner = owner_;
  ex->mt.manager_ctx = ex;
  ex->mt.deleter = export_deleter;
  DLTensor& t = ex->mt.dl_tensor;
  t.data = data_;
  t.device = {static_cast<DLDeviceType>(device_type_), device_id_};
  t.ndim = static_cast<int32_t>(shape_.size());
  t.dtype = from_dtype(dtype_);
  t.shape = ex->shape.data();
  t.strides = nullptr;  // C-contiguous
  t.byte_offset = 0;
  PyObject* cap = PyCapsule_New(&ex->mt, kCapsuleName, capsule_destructor);
  if (!cap) {
    delete ex;
    throw pyb::error_already_set();
  }
  return pyb::reinterpret_steal<pyb::capsule>(cap);
}

pyb::buffer_info Tensor::buffer() const {
  if (device_type_ != kDLCPU)
    throw pyb::buffer_error("moesq.Tensor on " + device_str() + " has no buffer protocol (host memory only); use torch.from_dlpack");
  const char* fmt = nullptr;
  switch (dtype_) {
    case DType::F32: fmt = "f"; break;
    case DType::I32: fmt = "i"; break;
    case DType::I64: fmt = "q"; break;
    case DType::U8: fmt = "B"; break;
    case DType::U16: fmt = "H"; break;
    case DType::BF16:
      throw pyb::buffer_error("moesq.Tensor of bfloat16 has no buffer format; view it with torch.from_dlpack");
  }
  const auto item = static_cast<pyb::ssize_t>(dtype_bytes(dtype_));
  std::vector<pyb::ssize_t> shape(shape_.begin(), shape_.end()), strides(shape_.size());
  pyb::ssize_t s = item;
  for (size_t i = shape_.size(); i-- > 0;) strides[i] = s, s *= shape[i];
  return pyb::buffer_info(data_, item, fmt, static_cast<pyb::ssize_t>(shape.size()), shape, strides, /*readonly=*/false);
}

pyb::tuple Tensor::dlpack_device() const { return pyb::make_tuple(device_type_, device_id_); }

std::string Tensor::device_str() const {
  return device_type_ == kDLCPU ? "cpu" : "cuda:" + std::to_string(device_id_);
}

}  // namespace moesq::py
