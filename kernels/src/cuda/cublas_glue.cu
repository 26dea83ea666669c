// cublas_glue.cu — CUDA-only helpers around cuBLAS (no OpenCL counterpart: the OpenCL backend multiplies with its
// own matmul kernels that read f32 activations directly). cuBLAS takes both operands in one type, so activations
// are rounded to the weight's 16-bit type first; the bias, which cuBLAS does not add, is added after the product.
// Written over the macros of prelude.h (NVRTC receives prelude.h + this file).

// 1-D grid over `len` values: y = bf16(x), round to nearest even.
KERNEL void f32_to_bf16(GLOBAL const float* x, GLOBAL ushort* y, uint len) {
    GRID_DEP_SYNC();
    uint i = global_id0();
    if (i < len) store_bf16(y, i, x[i]);
}

// 1-D grid over `len` values: y = f16(x), round to nearest even.
KERNEL void f32_to_f16(GLOBAL const float* x, GLOBAL ushort* y, uint len) {
    GRID_DEP_SYNC();
    uint i = global_id0();
    if (i < len) {
        ushort h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x[i]));
        y[i] = h;
    }
}

// Grid: (ceil(n / ELEM_WG) groups, m): out[r, c] += bias[c].
KERNEL void add_bias(GLOBAL float* out, GLOBAL const float* bias, uint n) {
    GRID_DEP_SYNC();
    uint c = global_id0();
    uint r = group_id(1);
    if (c < n) out[(ulong)r * n + c] += bias[c];
}
