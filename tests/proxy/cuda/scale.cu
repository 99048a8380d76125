// The module cuda_check.c loads on the GPU host (as cubin, PTX and fat binary).
extern "C" __global__ void scale_f32(float *x, float a, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}

// A device variable, read and written through cuModuleGetGlobal's address.
__device__ int hipr_probe[4];
