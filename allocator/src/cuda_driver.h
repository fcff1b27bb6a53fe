// cuda_driver.h — the part of the CUDA driver API that cuda_backend.cpp calls, declared here.
//
// Note [Declaring the driver API ourselves]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The backend never links libcuda: it opens it with dlopen and looks each function up by its
// versioned ABI name (Note [Loading the driver with dlsym] in cuda_backend.cpp). So all it
// needs at build time are the types and prototypes of those functions. Taken from the CUDA
// toolkit's cuda.h, they made the backend depend on a toolkit being found at build time, and
// most machines that train with PyTorch have none: a CUDA build of torch from pip brings its
// own runtime, and the driver comes with the GPU. There, `pip install pyalloc` built a library
// without a CUDA backend, and `install()` on a GPU fell back to the simulated device.
//
// So the thirty-three functions, six handle types, three structs and the constants the
// backend uses are declared here, once, for every build. Each is a stable part of the driver's
// ABI: the explicitly versioned names (cuMemGetInfo_v2, cuStreamDestroy_v2, ...) keep their
// signatures and struct layouts for as long as the driver exports them. cuda_driver_check.cpp
// compares every declaration here with a toolkit's cuda.h (struct sizes and field offsets,
// constant values, each function's parameters) and fails to compile on any difference;
// tests/test_cuda_driver_decls.py compiles it wherever a toolkit is found, CI's machines
// included. It is not part of the library's build: a toolkit a user happens to have, newer
// than this file (one that renamed a prototype by macro, as cuda.h does for the _v2 entry
// points), must not stop pyalloc from installing.
//
// Included once per translation unit, at namespace scope: cuda_driver_check.cpp includes it
// inside a namespace of its own, beside cuda.h. Hence no extern "C": the functions are never
// defined or called by these names, only named in decltype (the backend calls them through
// pointers from dlsym).
#pragma once

#include <cstddef>

// --- handles -----------------------------------------------------------------------------

using CUdevice = int;
using CUdeviceptr = unsigned long long;  // 64-bit platforms only, as PyTorch
using CUmemGenericAllocationHandle = unsigned long long;
using CUcontext = struct CUctx_st*;
using CUstream = struct CUstream_st*;
using CUevent = struct CUevent_st*;

// --- constants ---------------------------------------------------------------------------
// Each enum holds only the values the backend uses; cuda.h's own enums are four bytes, as these.

enum CUresult : unsigned int {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_NOT_READY = 600,
};

enum CUdevice_attribute : unsigned int {
  CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
};

enum CUmemAllocationType : unsigned int { CU_MEM_ALLOCATION_TYPE_PINNED = 0x1 };
enum CUmemAllocationHandleType : unsigned int { CU_MEM_HANDLE_TYPE_NONE = 0x0 };
enum CUmemLocationType : unsigned int { CU_MEM_LOCATION_TYPE_DEVICE = 0x1 };
enum CUmemAccess_flags : unsigned int { CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3 };
enum CUmemAllocationGranularity_flags : unsigned int { CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0 };
enum CUstreamCaptureStatus : unsigned int {
  CU_STREAM_CAPTURE_STATUS_NONE = 0,
  CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
};

// Flags passed as unsigned int (cuda.h: enumerators of CUstream_flags and CUevent_flags, and
// a macro for cuMemHostAlloc's).
constexpr unsigned int CU_STREAM_NON_BLOCKING = 0x1;
constexpr unsigned int CU_EVENT_DISABLE_TIMING = 0x2;
constexpr unsigned int CU_MEMHOSTALLOC_PORTABLE = 0x01;
constexpr unsigned int CU_MEMHOSTREGISTER_PORTABLE = 0x01;

// --- structs (virtual memory management) -------------------------------------------------

struct CUmemLocation {
  CUmemLocationType type;
  int id;
};

struct CUmemAllocationProp {
  CUmemAllocationType type;
  CUmemAllocationHandleType requestedHandleTypes;
  CUmemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
};

struct CUmemAccessDesc {
  CUmemLocation location;
  CUmemAccess_flags flags;
};

// --- functions, by the ABI names the backend loads ------------------------------------------

CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice* device, int ordinal);
CUresult cuDeviceGetCount(int* count);
CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice device);
CUresult cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice device);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device);
CUresult cuCtxGetCurrent(CUcontext* context);
CUresult cuCtxSetCurrent(CUcontext context);
CUresult cuCtxSynchronize();
CUresult cuMemGetInfo_v2(std::size_t* free, std::size_t* total);
CUresult cuMemGetAllocationGranularity(std::size_t* granularity, const CUmemAllocationProp* prop,
                                       CUmemAllocationGranularity_flags option);
CUresult cuMemAddressReserve(CUdeviceptr* ptr, std::size_t size, std::size_t alignment,
                             CUdeviceptr addr, unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, std::size_t size);
CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, std::size_t size,
                     const CUmemAllocationProp* prop, unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuMemMap(CUdeviceptr ptr, std::size_t size, std::size_t offset,
                  CUmemGenericAllocationHandle handle, unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr ptr, std::size_t size);
CUresult cuMemSetAccess(CUdeviceptr ptr, std::size_t size, const CUmemAccessDesc* desc,
                        std::size_t count);
CUresult cuStreamCreate(CUstream* stream, unsigned int flags);
CUresult cuStreamDestroy_v2(CUstream stream);
CUresult cuStreamSynchronize(CUstream stream);
CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags);
CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus* status);
CUresult cuEventCreate(CUevent* event, unsigned int flags);
CUresult cuEventDestroy_v2(CUevent event);
CUresult cuEventRecord(CUevent event, CUstream stream);
CUresult cuEventQuery(CUevent event);
CUresult cuEventSynchronize(CUevent event);
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, CUstream stream);
CUresult cuMemHostAlloc(void** pointer, std::size_t bytes, unsigned int flags);
CUresult cuMemFreeHost(void* pointer);
CUresult cuMemHostRegister_v2(void* pointer, std::size_t bytes, unsigned int flags);
CUresult cuMemHostUnregister(void* pointer);
CUresult cuGetErrorString(CUresult error, const char** text);
CUresult cuGetErrorName(CUresult error, const char** name);
