// cuda_driver_check.cpp — cuda_driver.h's declarations against a toolkit's cuda.h.
//
// Not part of the library: tests/test_cuda_driver_decls.py compiles it (syntax only) wherever
// a toolkit's cuda.h is found. Every check is a static_assert, so a declaration that differs
// from the driver's in size, layout, value or parameters fails to compile, naming what differs.
// See Note [Declaring the driver API ourselves] in cuda_driver.h.
#include <cuda.h>

#include <cstddef>
#include <type_traits>
#include <utility>

// cuda.h defines this flag as a macro, which would rewrite the declaration of the same name.
constexpr unsigned int kToolkitMemHostAllocPortable = CU_MEMHOSTALLOC_PORTABLE;
#undef CU_MEMHOSTALLOC_PORTABLE
constexpr unsigned int kToolkitMemHostRegisterPortable = CU_MEMHOSTREGISTER_PORTABLE;
#undef CU_MEMHOSTREGISTER_PORTABLE

namespace declared {
#include "cuda_driver.h"
}  // namespace declared

namespace {

// --- structs -----------------------------------------------------------------------------

#define PYALLOC_SAME_SHAPE(type)                                                   \
  static_assert(sizeof(declared::type) == sizeof(::type), #type ": size differs"); \
  static_assert(alignof(declared::type) == alignof(::type), #type ": alignment differs");
#define PYALLOC_SAME_FIELD(type, field)                                  \
  static_assert(offsetof(declared::type, field) == offsetof(::type, field), \
                #type "." #field ": offset differs");                     \
  static_assert(sizeof(std::declval<declared::type&>().field) ==     \
                    sizeof(std::declval<::type&>().field),               \
                #type "." #field ": size differs");

PYALLOC_SAME_SHAPE(CUmemLocation)
PYALLOC_SAME_FIELD(CUmemLocation, type)
PYALLOC_SAME_FIELD(CUmemLocation, id)
PYALLOC_SAME_SHAPE(CUmemAllocationProp)
PYALLOC_SAME_FIELD(CUmemAllocationProp, type)
PYALLOC_SAME_FIELD(CUmemAllocationProp, requestedHandleTypes)
PYALLOC_SAME_FIELD(CUmemAllocationProp, location)
PYALLOC_SAME_FIELD(CUmemAllocationProp, win32HandleMetaData)
// allocFlags as a whole: the backend leaves it zeroed, so only its place and size matter, and
// a toolkit that names its inner bytes otherwise still builds.
PYALLOC_SAME_FIELD(CUmemAllocationProp, allocFlags)
PYALLOC_SAME_SHAPE(CUmemAccessDesc)
PYALLOC_SAME_FIELD(CUmemAccessDesc, location)
PYALLOC_SAME_FIELD(CUmemAccessDesc, flags)

// Handles and enums: the same size and, for the integers, the same signedness.
PYALLOC_SAME_SHAPE(CUdevice)
PYALLOC_SAME_SHAPE(CUdeviceptr)
PYALLOC_SAME_SHAPE(CUmemGenericAllocationHandle)
PYALLOC_SAME_SHAPE(CUcontext)
PYALLOC_SAME_SHAPE(CUstream)
PYALLOC_SAME_SHAPE(CUevent)
PYALLOC_SAME_SHAPE(CUresult)
PYALLOC_SAME_SHAPE(CUdevice_attribute)
PYALLOC_SAME_SHAPE(CUmemAllocationType)
PYALLOC_SAME_SHAPE(CUmemAllocationHandleType)
PYALLOC_SAME_SHAPE(CUmemLocationType)
PYALLOC_SAME_SHAPE(CUmemAccess_flags)
PYALLOC_SAME_SHAPE(CUmemAllocationGranularity_flags)
PYALLOC_SAME_SHAPE(CUstreamCaptureStatus)
static_assert(std::is_same_v<declared::CUdevice, ::CUdevice> &&
                  std::is_same_v<declared::CUdeviceptr, ::CUdeviceptr> &&
                  std::is_same_v<declared::CUmemGenericAllocationHandle,
                                 ::CUmemGenericAllocationHandle>,
              "an integer handle's type differs");
#undef PYALLOC_SAME_SHAPE
#undef PYALLOC_SAME_FIELD

// --- constants ---------------------------------------------------------------------------

#define PYALLOC_SAME_VALUE(name)                                                     \
  static_assert(static_cast<long long>(declared::name) == static_cast<long long>(::name), \
                #name ": value differs");
PYALLOC_SAME_VALUE(CUDA_SUCCESS)
PYALLOC_SAME_VALUE(CUDA_ERROR_OUT_OF_MEMORY)
PYALLOC_SAME_VALUE(CUDA_ERROR_NO_DEVICE)
PYALLOC_SAME_VALUE(CUDA_ERROR_NOT_READY)
PYALLOC_SAME_VALUE(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)
PYALLOC_SAME_VALUE(CU_MEM_ALLOCATION_TYPE_PINNED)
PYALLOC_SAME_VALUE(CU_MEM_HANDLE_TYPE_NONE)
PYALLOC_SAME_VALUE(CU_MEM_LOCATION_TYPE_DEVICE)
PYALLOC_SAME_VALUE(CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
PYALLOC_SAME_VALUE(CU_MEM_ALLOC_GRANULARITY_MINIMUM)
PYALLOC_SAME_VALUE(CU_STREAM_CAPTURE_STATUS_NONE)
PYALLOC_SAME_VALUE(CU_STREAM_CAPTURE_STATUS_ACTIVE)
PYALLOC_SAME_VALUE(CU_STREAM_NON_BLOCKING)
PYALLOC_SAME_VALUE(CU_EVENT_DISABLE_TIMING)
#undef PYALLOC_SAME_VALUE
static_assert(declared::CU_MEMHOSTALLOC_PORTABLE == kToolkitMemHostAllocPortable,
              "CU_MEMHOSTALLOC_PORTABLE: value differs");
static_assert(declared::CU_MEMHOSTREGISTER_PORTABLE == kToolkitMemHostRegisterPortable,
              "CU_MEMHOSTREGISTER_PORTABLE: value differs");

// --- functions ---------------------------------------------------------------------------
// The two declarations name different types (declared::CUresult, ::CUresult), so a function's
// signature is compared by what the calling convention sees: the return value's and each
// parameter's size and class (integer, pointer), and for a pointer what it points to (its size,
// whether it is const or itself a pointer, and to what).

template <typename T, typename = void>
struct IsComplete : std::false_type {};
template <typename T>
struct IsComplete<T, std::void_t<decltype(sizeof(T))>> : std::true_type {};

struct ParamShape {
  std::size_t size = 0;
  bool integral = false;  // an integer or an enum
  bool pointer = false;
  std::size_t pointee_size = 0;  // 0: void or an opaque struct
  bool pointee_const = false;
  bool pointee_pointer = false;
  bool pointee_pointee_const = false;  // const char** against char**

  constexpr bool operator==(const ParamShape& o) const {
    return size == o.size && integral == o.integral && pointer == o.pointer &&
           pointee_size == o.pointee_size && pointee_const == o.pointee_const &&
           pointee_pointer == o.pointee_pointer &&
           pointee_pointee_const == o.pointee_pointee_const;
  }
};

template <typename T>
constexpr ParamShape shape_of() {
  ParamShape s;
  s.size = sizeof(T);
  s.integral = std::is_integral_v<T> || std::is_enum_v<T>;
  s.pointer = std::is_pointer_v<T>;
  if constexpr (std::is_pointer_v<T>) {
    using P = std::remove_pointer_t<T>;
    s.pointee_const = std::is_const_v<P>;
    s.pointee_pointer = std::is_pointer_v<P>;
    if constexpr (std::is_pointer_v<P>)
      s.pointee_pointee_const = std::is_const_v<std::remove_pointer_t<P>>;
    if constexpr (!std::is_void_v<P> && IsComplete<P>::value) s.pointee_size = sizeof(P);
  }
  return s;
}

template <typename F>
struct Signature;
template <typename R, typename... A>
struct Signature<R (*)(A...)> {
  static constexpr std::size_t arity = sizeof...(A);
  static constexpr ParamShape result = shape_of<R>();
  static constexpr ParamShape params[sizeof...(A) + 1] = {shape_of<A>()..., ParamShape{}};
};

template <typename Ours, typename Theirs>
constexpr bool same_signature() {
  using O = Signature<Ours>;
  using T = Signature<Theirs>;
  if (O::arity != T::arity || !(O::result == T::result)) return false;
  for (std::size_t i = 0; i < O::arity; ++i)
    if (!(O::params[i] == T::params[i])) return false;
  return true;
}

#define PYALLOC_SAME_SIGNATURE(f)                                                      \
  static_assert(same_signature<decltype(&declared::f), decltype(&::f)>(),            \
                #f ": the parameters differ from cuda.h's");
PYALLOC_SAME_SIGNATURE(cuInit)
PYALLOC_SAME_SIGNATURE(cuDeviceGet)
PYALLOC_SAME_SIGNATURE(cuDeviceGetCount)
PYALLOC_SAME_SIGNATURE(cuDeviceGetAttribute)
PYALLOC_SAME_SIGNATURE(cuDevicePrimaryCtxRetain)
PYALLOC_SAME_SIGNATURE(cuDevicePrimaryCtxRelease_v2)
PYALLOC_SAME_SIGNATURE(cuCtxGetCurrent)
PYALLOC_SAME_SIGNATURE(cuCtxSetCurrent)
PYALLOC_SAME_SIGNATURE(cuCtxSynchronize)
PYALLOC_SAME_SIGNATURE(cuMemGetInfo_v2)
PYALLOC_SAME_SIGNATURE(cuMemGetAllocationGranularity)
PYALLOC_SAME_SIGNATURE(cuMemAddressReserve)
PYALLOC_SAME_SIGNATURE(cuMemAddressFree)
PYALLOC_SAME_SIGNATURE(cuMemCreate)
PYALLOC_SAME_SIGNATURE(cuMemRelease)
PYALLOC_SAME_SIGNATURE(cuMemMap)
PYALLOC_SAME_SIGNATURE(cuMemUnmap)
PYALLOC_SAME_SIGNATURE(cuMemSetAccess)
PYALLOC_SAME_SIGNATURE(cuStreamCreate)
PYALLOC_SAME_SIGNATURE(cuStreamDestroy_v2)
PYALLOC_SAME_SIGNATURE(cuStreamSynchronize)
PYALLOC_SAME_SIGNATURE(cuStreamWaitEvent)
PYALLOC_SAME_SIGNATURE(cuStreamIsCapturing)
PYALLOC_SAME_SIGNATURE(cuEventCreate)
PYALLOC_SAME_SIGNATURE(cuEventDestroy_v2)
PYALLOC_SAME_SIGNATURE(cuEventRecord)
PYALLOC_SAME_SIGNATURE(cuEventQuery)
PYALLOC_SAME_SIGNATURE(cuEventSynchronize)
PYALLOC_SAME_SIGNATURE(cuMemcpyAsync)
PYALLOC_SAME_SIGNATURE(cuMemHostAlloc)
PYALLOC_SAME_SIGNATURE(cuMemFreeHost)
PYALLOC_SAME_SIGNATURE(cuMemHostRegister_v2)
PYALLOC_SAME_SIGNATURE(cuMemHostUnregister)
PYALLOC_SAME_SIGNATURE(cuGetErrorString)
PYALLOC_SAME_SIGNATURE(cuGetErrorName)
#undef PYALLOC_SAME_SIGNATURE

}  // namespace
