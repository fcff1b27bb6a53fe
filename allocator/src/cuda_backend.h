// cuda_backend.h — the Backend for a real NVIDIA GPU (CUDA driver API, VMM).
//
// This header deliberately does not include <cuda.h>: callers only see the abstract
// Backend, so nothing outside cuda_backend.cpp needs the CUDA toolkit to compile.
// libcuda.so.1 is loaded with dlopen the first time either function below is called,
// never at library load, so libpyalloc loads on machines without a GPU or a driver.
//
// Thread safety: both functions may be called from any thread, concurrently; the
// driver is loaded exactly once. Neither throws nor prints.
#pragma once

#include <memory>
#include <string>

#include "backend.h"

namespace pyalloc {

// Returns nullptr and fills *error (a full sentence saying what is wrong and what to do) when
// the driver cannot be loaded, there is no such device, or the device lacks VMM support.
// The backend maps memory in the device's primary context, the one PyTorch's runtime uses.
std::unique_ptr<Backend> make_cuda_backend(int device, std::string* error);

// Number of CUDA devices, or -1 with *error filled when no driver can be loaded. Never throws.
// A driver that is present but sees no GPU (or CUDA_VISIBLE_DEVICES="") gives 0, not -1.
int cuda_device_count(std::string* error);

}  // namespace pyalloc
