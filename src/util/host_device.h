// HKV_HOST_DEVICE: a function compiled for the host and, under nvcc, for the device too.
#pragma once

#ifdef __CUDACC__
#define HKV_HOST_DEVICE __host__ __device__
#else
#define HKV_HOST_DEVICE
#endif
