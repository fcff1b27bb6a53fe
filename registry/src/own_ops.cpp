// own_ops.cpp — tensors on storages the registry holds, and byte copies between them.
#include "own_ops.h"

#include <ATen/ATen.h>
#include <c10/core/TensorOptions.h>

#include "engine_api.h"

namespace pyalloc::registry {

at::Tensor tensor_on(const c10::intrusive_ptr<c10::StorageImpl>& storage, c10::ScalarType dtype,
                     c10::IntArrayRef sizes, c10::IntArrayRef strides, std::int64_t offset) {
  const c10::DispatchKey backend =
      c10::computeDispatchKey(dtype, c10::kStrided, storage->device());
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(storage), c10::DispatchKeySet(backend), c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
  return t;
}

at::Tensor same_view_on(const c10::intrusive_ptr<c10::StorageImpl>& storage, const at::Tensor& t) {
  at::Tensor view = tensor_on(storage, t.scalar_type(), t.sizes(), t.strides(), t.storage_offset());
  view.unsafeGetTensorImpl()->_set_conj(t.is_conj());
  view.unsafeGetTensorImpl()->_set_neg(t.is_neg());
  return view;
}

at::Tensor detached_alias(const at::Tensor& t) {
  return same_view_on(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(
                          t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl()),
                      t);
}

at::Tensor detached_sparse_alias(const at::Tensor& t) {
  // With Python excluded, a sparse TensorImpl copies itself; otherwise it asks a Python
  // mode's (or subclass's) detach, which dispatches.
  c10::impl::ExcludeDispatchKeyGuard no_python(c10::DispatchKey::Python);
  return at::Tensor(t.unsafeGetTensorImpl()->shallow_copy_and_detach(
      c10::VariableVersion(/*version=*/0), /*allow_tensor_metadata_change=*/false));
}

EvictableScope::EvictableScope(bool on) {
  if (on) was_ = engine_api::api().set_thread_evictable(1);
}

EvictableScope::~EvictableScope() {
  if (was_ >= 0) engine_api::api().set_thread_evictable(was_);
}

TentativeScope::TentativeScope() : was_(engine_api::api().set_thread_tentative(1)) {}

TentativeScope::~TentativeScope() { engine_api::api().set_thread_tentative(was_); }

void copy_bytes(const c10::intrusive_ptr<c10::StorageImpl>& dst,
                const c10::intrusive_ptr<c10::StorageImpl>& src, std::size_t nbytes) {
  const std::int64_t n = static_cast<std::int64_t>(nbytes);
  const std::int64_t one = 1;
  at::Tensor to = tensor_on(dst, c10::ScalarType::Byte, {n}, {one}, 0);
  at::Tensor from = tensor_on(src, c10::ScalarType::Byte, {n}, {one}, 0);
  to.copy_(from);
}

}  // namespace pyalloc::registry
