/* device_cuda.cu - CUDA device discovery.  A missing driver or device is a
 * normal case: the count is 0 and `why` says what the runtime reported. */
#include <cuda_runtime.h>
#include <stdio.h>

#include "runtime/backend/backend.h"

extern "C" int moe_cuda_device_count(char *why, size_t why_len)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        if (why) snprintf(why, why_len, "%s", cudaGetErrorString(err));
        cudaGetLastError(); /* clear the sticky error */
        return 0;
    }
    if (n == 0 && why) snprintf(why, why_len, "the CUDA runtime reports no device");
    return n;
}
