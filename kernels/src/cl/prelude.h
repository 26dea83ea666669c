// prelude.h — the portability layer every kernel source includes, so one source compiles as OpenCL C (clang ->
// SPIR-V, launched through OpenCL or Level Zero) and as CUDA C++ (NVRTC). Kernels use only these names for address
// spaces, work-item ids, barriers, sub-group reductions and 16-bit float loads; nothing vendor-specific appears in a
// kernel body.
//
// Conventions: work-groups are 1-D (`local_id()` is the id in dimension 0); grids may be 2-D/3-D (`group_id(d)`).
// Every work-group size is a multiple of 64, so sub-groups are full. Sub-group reductions must be reached by all
// work-items of a sub-group (sub-group-uniform control flow). 16-bit floats (f16, bf16) travel as `ushort`.
// Launch constants (ROW_WG, ATTN_WG, ...) come from kernels/src/launch.rs as -D flags.
//
// Never divide and take the remainder of the same run-time operands (`a / b` and `a % b`): LLVM 15 turns the pair
// into a `freeze` instruction that llvm-spirv 15 cannot translate. Write `q = a / b; r = a - q * b;` instead.
#ifndef RSERVE_PRELUDE_H
#define RSERVE_PRELUDE_H

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
// ---------------------------------------------------------------- CUDA / NVRTC
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned long long ulong;
#define KERNEL extern "C" __global__
#define GLOBAL
#define LOCAL __shared__
#define LOCAL_PTR
#define INLINE __device__ __forceinline__
#define local_id() ((uint)threadIdx.x)
#define local_size() ((uint)blockDim.x)
#define group_id(d) ((uint)((d) == 0 ? blockIdx.x : (d) == 1 ? blockIdx.y : blockIdx.z))
#define barrier_local() __syncthreads()
#define sub_size() 32u
#define sub_id() ((uint)threadIdx.x / 32u)
#define sub_lane() ((uint)threadIdx.x % 32u)
#define num_subs() (((uint)blockDim.x + 31u) / 32u)
#define NEG_INF (-__int_as_float(0x7f800000))
INLINE float sub_reduce_add(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
INLINE float sub_reduce_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
INLINE float bits_to_f32(uint u) { return __uint_as_float(u); }
INLINE uint f32_to_bits(float f) { return __float_as_uint(f); }
INLINE float load_f16(GLOBAL const ushort* p, ulong i) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(p[i]));
    return f;
}
INLINE float erf_f32(float x) { return erff(x); }
#else
// ---------------------------------------------------------------- OpenCL C 2.0 (SPIR-V)
#define KERNEL __kernel
#define GLOBAL __global
#define LOCAL __local
#define LOCAL_PTR __local
#define INLINE static inline
#define local_id() ((uint)get_local_id(0))
#define local_size() ((uint)get_local_size(0))
#define group_id(d) ((uint)get_group_id(d))
#define barrier_local() barrier(CLK_LOCAL_MEM_FENCE)
#define sub_size() ((uint)get_sub_group_size())
#define sub_id() ((uint)get_sub_group_id())
#define sub_lane() ((uint)get_sub_group_local_id())
#define num_subs() ((uint)get_num_sub_groups())
#define NEG_INF (-INFINITY)
INLINE float sub_reduce_add(float v) { return sub_group_reduce_add(v); }
INLINE float sub_reduce_max(float v) { return sub_group_reduce_max(v); }
INLINE float bits_to_f32(uint u) { return as_float(u); }
INLINE uint f32_to_bits(float f) { return as_uint(f); }
INLINE float load_f16(GLOBAL const ushort* p, ulong i) { return vload_half(i, (GLOBAL const half*)p); }
INLINE float erf_f32(float x) { return erf(x); }
#endif

// ---------------------------------------------------------------- launch ordering
// GRID_DEP_SYNC() is the first statement of every kernel (matmul_pdla_* first issues its weight copies, which no
// earlier kernel writes). On CUDA devices of compute capability 9.0 and newer the
// host launches kernels with programmatic dependent launch, so a kernel's work-groups may start while the kernel
// before it on the stream is still finishing: the wait blocks until that kernel has completed and its writes are
// visible (so nothing is read or written early), and the trigger lets the next kernel be scheduled while this one
// runs. Everywhere else launches are ordered the usual way and the macro is empty.
#if (defined(__CUDACC_RTC__) || defined(__CUDACC__)) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GRID_DEP_SYNC() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define GRID_DEP_SYNC()
#endif

// ---------------------------------------------------------------- 4-wide vectors (float4)
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
INLINE float4 zero4() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
INLINE float4 mad4(float4 a, float4 b, float4 c) {
    return make_float4(a.x * b.x + c.x, a.y * b.y + c.y, a.z * b.z + c.z, a.w * b.w + c.w);
}
INLINE float4 axpy4(float a, float4 x, float4 y) {
    return make_float4(a * x.x + y.x, a * x.y + y.y, a * x.z + y.z, a * x.w + y.w);
}
INLINE float4 add4(float4 a, float4 b) { return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }
INLINE float4 scale4(float4 a, float s) { return make_float4(a.x * s, a.y * s, a.z * s, a.w * s); }
#else
INLINE float4 zero4() { return (float4)(0.0f); }
INLINE float4 mad4(float4 a, float4 b, float4 c) { return a * b + c; }
INLINE float4 axpy4(float a, float4 x, float4 y) { return a * x + y; }
INLINE float4 add4(float4 a, float4 b) { return a + b; }
INLINE float4 scale4(float4 a, float s) { return a * s; }
#endif
INLINE float hsum4(float4 v) { return (v.x + v.y) + (v.z + v.w); }
INLINE float dot4(float4 a, float4 b) { return (a.x * b.x + a.y * b.y) + (a.z * b.z + a.w * b.w); }

// ---------------------------------------------------------------- shared helpers
#define global_id0() (group_id(0) * local_size() + local_id())

INLINE float load_f32(GLOBAL const float* p, ulong i) { return p[i]; }
// bf16 is the upper half of an f32.
INLINE float load_bf16(GLOBAL const ushort* p, ulong i) { return bits_to_f32(((uint)p[i]) << 16); }
// Four consecutive values p[i .. i + 4) as f32 (no alignment needed beyond the element's).
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
INLINE float4 load4_f32(GLOBAL const float* p, ulong i) { return make_float4(p[i], p[i + 1], p[i + 2], p[i + 3]); }
INLINE float4 load4_bf16(GLOBAL const ushort* p, ulong i) {
    return make_float4(load_bf16(p, i), load_bf16(p, i + 1), load_bf16(p, i + 2), load_bf16(p, i + 3));
}
INLINE float4 load4_f16(GLOBAL const ushort* p, ulong i) {
    return make_float4(load_f16(p, i), load_f16(p, i + 1), load_f16(p, i + 2), load_f16(p, i + 3));
}
#else
INLINE float4 load4_f32(GLOBAL const float* p, ulong i) { return vload4(0, p + i); }
INLINE float4 load4_bf16(GLOBAL const ushort* p, ulong i) { return as_float4(convert_uint4(vload4(0, p + i)) << 16); }
INLINE float4 load4_f16(GLOBAL const ushort* p, ulong i) { return vload_half4(0, (GLOBAL const half*)(p + i)); }
#endif

// Eight consecutive 16-bit floats p[i .. i + 8) as two float4, read with one 16-byte load (i must be a multiple of 8
// and p 16-byte aligned), and four consecutive floats read or written as one vector (i a multiple of 4, p 16-byte
// aligned).
typedef struct {
    float4 lo;
    float4 hi;
} f32x8;
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
INLINE float4 bf16_pairs(uint a, uint b) {
    return make_float4(__uint_as_float(a << 16), __uint_as_float(a & 0xffff0000u), __uint_as_float(b << 16),
                       __uint_as_float(b & 0xffff0000u));
}
INLINE float half_bits(uint h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((ushort)h));
    return f;
}
INLINE float4 f16_pairs(uint a, uint b) {
    return make_float4(half_bits(a & 0xffffu), half_bits(a >> 16), half_bits(b & 0xffffu), half_bits(b >> 16));
}
// Eight 16-bit values in one 16-byte load, widened two at a time by PAIRS.
#define DEFINE_LOAD8(NAME, PAIRS)                                \
    INLINE f32x8 NAME(GLOBAL const ushort* p, ulong i) {         \
        uint4 u = *(const uint4*)(p + i);                        \
        f32x8 r;                                                 \
        r.lo = PAIRS(u.x, u.y);                                  \
        r.hi = PAIRS(u.z, u.w);                                  \
        return r;                                                \
    }
DEFINE_LOAD8(load8_bf16, bf16_pairs)
DEFINE_LOAD8(load8_f16, f16_pairs)
INLINE float4 load4a_f32(GLOBAL const float* p, ulong i) { return *(const float4*)(p + i); }
INLINE void store4a_f32(GLOBAL float* p, ulong i, float4 v) { *(float4*)(p + i) = v; }
#else
INLINE f32x8 load8_bf16(GLOBAL const ushort* p, ulong i) {
    uint4 u = vload4(0, (GLOBAL const uint*)(p + i));
    f32x8 r;
    r.lo = as_float4((uint4)(u.x << 16, u.x & 0xffff0000u, u.y << 16, u.y & 0xffff0000u));
    r.hi = as_float4((uint4)(u.z << 16, u.z & 0xffff0000u, u.w << 16, u.w & 0xffff0000u));
    return r;
}
INLINE f32x8 load8_f16(GLOBAL const ushort* p, ulong i) {
    f32x8 r;
    r.lo = vload_half4(0, (GLOBAL const half*)(p + i));
    r.hi = vload_half4(0, (GLOBAL const half*)(p + i + 4));
    return r;
}
INLINE float4 load4a_f32(GLOBAL const float* p, ulong i) { return vload4(0, p + i); }
INLINE void store4a_f32(GLOBAL float* p, ulong i, float4 v) { vstore4(v, 0, p + i); }
#endif
// Four consecutive 16-bit floats p[i .. i + 4) with one 8-byte load (i a multiple of 4, p 8-byte aligned).
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
INLINE float4 load4a_bf16(GLOBAL const ushort* p, ulong i) {
    uint2 u = *(const uint2*)(p + i);
    return bf16_pairs(u.x, u.y);
}
INLINE float4 load4a_f16(GLOBAL const ushort* p, ulong i) {
    uint2 u = *(const uint2*)(p + i);
    return f16_pairs(u.x, u.y);
}
#else
INLINE float4 load4a_bf16(GLOBAL const ushort* p, ulong i) {
    uint2 u = vload2(0, (GLOBAL const uint*)(p + i));
    return as_float4((uint4)(u.x << 16, u.x & 0xffff0000u, u.y << 16, u.y & 0xffff0000u));
}
INLINE float4 load4a_f16(GLOBAL const ushort* p, ulong i) { return vload_half4(0, (GLOBAL const half*)(p + i)); }
#endif

// KV-cache elements in the cache's type: `kind` 0 f32 (`f`), 1 bf16, 2 f16 (`h`, the same memory). Each entry point
// passes a constant kind, so it compiles to one load path. load4_kv: i a multiple of 4.
INLINE float load_kv(GLOBAL const float* f, GLOBAL const ushort* h, ulong i, uint kind) {
    return kind == 0 ? f[i] : kind == 1 ? load_bf16(h, i) : load_f16(h, i);
}
INLINE float4 load4_kv(GLOBAL const float* f, GLOBAL const ushort* h, ulong i, uint kind) {
    return kind == 0 ? load4a_f32(f, i) : kind == 1 ? load4a_bf16(h, i) : load4a_f16(h, i);
}

// A 4-value KV load kept in its stored form until kv_widen(): on CUDA, 16-bit values stay two 32-bit words (in .x
// and .y), so a load in flight holds two registers, not four; f32 values (and every value on OpenCL) are loaded
// widened. Same arguments as load4_kv; kv_widen takes the same constant kind.
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
INLINE float4 load4_kv_raw(GLOBAL const float* f, GLOBAL const ushort* h, ulong i, uint kind) {
    if (kind == 0) return load4a_f32(f, i);
    uint2 u = *(const uint2*)(h + i);
    return make_float4(__uint_as_float(u.x), __uint_as_float(u.y), 0.0f, 0.0f);
}
INLINE float4 kv_widen(float4 r, uint kind) {
    if (kind == 0) return r;
    uint a = __float_as_uint(r.x);
    uint b = __float_as_uint(r.y);
    return kind == 1 ? bf16_pairs(a, b) : f16_pairs(a, b);
}
#else
INLINE float4 load4_kv_raw(GLOBAL const float* f, GLOBAL const ushort* h, ulong i, uint kind) {
    return load4_kv(f, h, i, kind);
}
INLINE float4 kv_widen(float4 r, uint kind) { return r; }
#endif

// Eight 16-bit weights kept as loaded (one 16-byte register quad on CUDA) until widen8(); every call passes a
// constant is_f16 (0 bf16, 1 f16).
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
typedef uint4 raw16x8;
// bf16 halves of a 32-bit word as f32, as `volatile` instructions: ptxas then widens each 16-byte weight piece where
// it is used instead of all pieces at once, which holds fewer registers.
INLINE float bf16_lo(uint a) {
    float f;
    asm volatile("prmt.b32 %0, %1, 0, 0x1044;" : "=f"(f) : "r"(a));
    return f;
}
INLINE float bf16_hi(uint a) {
    float f;
    asm volatile("and.b32 %0, %1, 0xffff0000;" : "=f"(f) : "r"(a));
    return f;
}
INLINE float4 bf16_pairs_pinned(uint a, uint b) { return make_float4(bf16_lo(a), bf16_hi(a), bf16_lo(b), bf16_hi(b)); }
INLINE f32x8 widen8(raw16x8 u, uint is_f16) {
    f32x8 r;
    r.lo = is_f16 ? f16_pairs(u.x, u.y) : bf16_pairs_pinned(u.x, u.y);
    r.hi = is_f16 ? f16_pairs(u.z, u.w) : bf16_pairs_pinned(u.z, u.w);
    return r;
}
#else
typedef f32x8 raw16x8;
INLINE f32x8 widen8(raw16x8 u, uint is_f16) { return u; }
#endif

// Eight 16-bit floats held as the 16 bytes they were stored in (a `uint4`, e.g. read back from local memory) as f32.
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
INLINE f32x8 widen8_bits(uint4 u, uint is_f16) { return widen8(u, is_f16); }
#else
INLINE f32x8 widen8_bits(uint4 u, uint is_f16) {
    f32x8 r;
    if (is_f16) {
        uint4 c = u;
        r.lo = vload_half4(0, (const half*)&c);
        r.hi = vload_half4(1, (const half*)&c);
    } else {
        r.lo = as_float4((uint4)(u.x << 16, u.x & 0xffff0000u, u.y << 16, u.y & 0xffff0000u));
        r.hi = as_float4((uint4)(u.z << 16, u.z & 0xffff0000u, u.w << 16, u.w & 0xffff0000u));
    }
    return r;
}
#endif

// A hint to bring the 16 bytes at p + i (floats) into the first-level cache; it holds no register and never faults.
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
INLINE void prefetch_f32(GLOBAL const float* p, ulong i) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p + i)); }
#else
INLINE void prefetch_f32(GLOBAL const float* p, ulong i) { prefetch(p + i, 4); }
#endif

// ---------------------------------------------------------------- asynchronous copies into local memory
// async_copy16(dst, src) copies 16 bytes (16-byte aligned) from global to local memory; async_commit() closes the
// work-item's current group of copies, and ASYNC_WAIT(N) (N a literal) waits until at most N of its groups are still
// in flight, after which the work-item may read what those copies wrote. Only the work-item that issued a copy reads
// it, so no barrier is involved. On CUDA sm_80+ a copy is a `cp.async` (cached in L2 only) that holds no register
// while in flight: bytes in flight cost local memory, not registers. Elsewhere the copy is a plain load and store
// and the other two do nothing.
#if (defined(__CUDACC_RTC__) || defined(__CUDACC__)) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
INLINE void async_copy16(LOCAL_PTR uint4* dst, GLOBAL const uint4* src) {
    uint s = (uint)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src) : "memory");
}
#define async_commit() asm volatile("cp.async.commit_group;" ::: "memory")
#define ASYNC_WAIT(N) asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory")
#else
INLINE void async_copy16(LOCAL_PTR uint4* dst, GLOBAL const uint4* src) { *dst = *src; }
#define async_commit()
#define ASYNC_WAIT(N)
#endif

// Two or four consecutive floats of local memory (i a multiple of 2 / 4, so the load is aligned).
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
INLINE float2 lload2(LOCAL_PTR const float* p, uint i) { return *(const float2*)(p + i); }
INLINE float4 lload4(LOCAL_PTR const float* p, uint i) { return *(const float4*)(p + i); }
#else
INLINE float2 lload2(LOCAL_PTR const float* p, uint i) { return vload2(0, p + i); }
INLINE float4 lload4(LOCAL_PTR const float* p, uint i) { return vload4(0, p + i); }
#endif

INLINE float dot8(f32x8 w, float4 a, float4 b) { return hsum4(mad4(a, w.lo, mad4(b, w.hi, zero4()))); }

// Gated activations of a fused gate/up projection (`gated_act*`, the routed experts' `moe_pair_gate_up_*`): `act`
// 0 SiLU, 1 GELU-tanh (PyTorch's `gelu(approximate="tanh")`, Gemma's `gelu_pytorch_tanh`), 2 gpt-oss's SwiGLU:
// g = min(gate, LIMIT), u = clamp(up, -LIMIT, LIMIT), out = g * sigmoid(ALPHA g) * (u + 1).
#define ACT_SILU 0u
#define ACT_GELU_TANH 1u
#define ACT_SWIGLU_OAI 2u
#define SWIGLU_ALPHA 1.702f
#define SWIGLU_LIMIT 7.0f
INLINE float gated(float g, float u, uint act) {
    if (act == ACT_GELU_TANH) return 0.5f * g * (1.0f + tanh(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u;
    if (act == ACT_SWIGLU_OAI) {
        g = fmin(g, SWIGLU_LIMIT);
        return g / (1.0f + exp(-SWIGLU_ALPHA * g)) * (fmin(fmax(u, -SWIGLU_LIMIT), SWIGLU_LIMIT) + 1.0f);
    }
    return g / (1.0f + exp(-g)) * u;
}

// Round to nearest even (finite values; NaN payloads are not preserved).
INLINE void store_bf16(GLOBAL ushort* p, ulong i, float v) {
    uint u = f32_to_bits(v);
    u += 0x7fffu + ((u >> 16) & 1u);
    p[i] = (ushort)(u >> 16);
}

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
INLINE void store_f16(GLOBAL ushort* p, ulong i, float v) {
    ushort h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    p[i] = h;
}
#else
INLINE void store_f16(GLOBAL ushort* p, ulong i, float v) { vstore_half_rte(v, i, (GLOBAL half*)p); }
#endif

// An activation store in the type of its buffer: `kind` 0 f32 (`out`), 1 bf16, 2 f16 (`out16`, the same memory). Each
// entry point passes a constant kind, so it compiles to one store (the 16-bit outputs feed matrix multiplies that
// take 16-bit operands, which would otherwise need a conversion pass).
INLINE void store_act(GLOBAL float* out, GLOBAL ushort* out16, ulong i, float v, uint kind) {
    if (kind == 0) {
        out[i] = v;
    } else if (kind == 1) {
        store_bf16(out16, i, v);
    } else {
        store_f16(out16, i, v);
    }
}

// Four consecutive activations out[i .. i + 4) in the buffer's type (i a multiple of 4; 16-byte aligned for f32).
INLINE void store4_act(GLOBAL float* out, ulong i, float4 v, uint kind) {
    if (kind == 0) {
        store4a_f32(out, i, v);
    } else {
        GLOBAL ushort* o16 = (GLOBAL ushort*)out;
        store_act(out, o16, i, v.x, kind);
        store_act(out, o16, i + 1, v.y, kind);
        store_act(out, o16, i + 2, v.z, kind);
        store_act(out, o16, i + 3, v.w, kind);
    }
}

// ---------------------------------------------------------------- hand-off between work-groups of one launch
// A work-group publishes its share of a result (global stores, then global_fence() by every work-item, a barrier,
// and one counter_add()); the work-group whose counter_add() returns the last count combines the shares, reading
// them with load_coherent() (past any non-coherent first-level cache). The CUDA backend uses it for the split-KV
// reduction; the portable fallback is a second kernel.
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
INLINE void global_fence() { __threadfence(); }
INLINE uint counter_add(GLOBAL uint* p, uint v) { return atomicAdd(p, v); }
INLINE float load_coherent(GLOBAL const float* p, ulong i) { return __ldcg(p + i); }
#else
INLINE void global_fence() { mem_fence(CLK_GLOBAL_MEM_FENCE); }
INLINE uint counter_add(GLOBAL uint* p, uint v) { return atomic_add((volatile GLOBAL uint*)p, v); }
INLINE float load_coherent(GLOBAL const float* p, ulong i) { return ((volatile GLOBAL const float*)p)[i]; }
#endif

// ---------------------------------------------------------------- local-memory GEMM tile
// Work-items across a GEMM_TILE_M x GEMM_TILE_N output tile's columns (GEMM_WG == GEMM_TX * GEMM_TILE_M / 4).
#define GEMM_TX (GEMM_TILE_N / 4)
// One GEMM_TILE_K-deep step of the tile from the staged, transposed tiles xs[GEMM_TILE_K][GEMM_TILE_M] and
// ws[GEMM_TILE_K][GEMM_TILE_N] in local memory: the work-item at (tx, ty) adds its 4 x 4 outputs (rows
// ty + i * GEMM_TILE_M / 4, columns tx + j * GEMM_TX) into `acc[4][4]` (matmul_tiled, moe_matmul_tiled). A macro, so
// the accumulators stay in registers.
#define GEMM_TILE_STEP(xs, ws, acc, tx, ty)                                                                 \
    for (uint kk_ = 0; kk_ < GEMM_TILE_K; kk_++) {                                                          \
        float a_[4];                                                                                        \
        float b_[4];                                                                                        \
        for (uint i_ = 0; i_ < 4; i_++) a_[i_] = xs[kk_ * GEMM_TILE_M + (ty) + i_ * (GEMM_TILE_M / 4)];     \
        for (uint j_ = 0; j_ < 4; j_++) b_[j_] = ws[kk_ * GEMM_TILE_N + (tx) + j_ * GEMM_TX];               \
        for (uint i_ = 0; i_ < 4; i_++)                                                                     \
            for (uint j_ = 0; j_ < 4; j_++) acc[i_][j_] += a_[i_] * b_[j_];                                 \
    }

// The multiplier of an attention output accumulated against the score maximum `m` with softmax sum `total`, when a
// head's learned sink logit `sink` (gpt-oss; NEG_INF: none) joins the softmax denominator: 1 / (total + e^(sink -
// m)), taken against max(m, sink) so that neither exponential overflows (paged attention's decode, reduce and
// prefill kernels).
INLINE float attn_norm(float m, float total, float sink) {
    float mx = fmax(m, sink);
    float a = exp(m - mx);
    return a / (total * a + exp(sink - mx));
}

// Sum of `v` over the work-group; `scratch` holds one float per sub-group (size it to the work-group size).
// Every work-item must call it; it returns the total to all of them.
INLINE float wg_reduce_sum(float v, LOCAL_PTR float* scratch) {
    v = sub_reduce_add(v);
    if (sub_lane() == 0) scratch[sub_id()] = v;
    barrier_local();
    float r = 0.0f;
    for (uint i = 0; i < num_subs(); i++) r += scratch[i];
    barrier_local();
    return r;
}

INLINE float wg_reduce_max(float v, LOCAL_PTR float* scratch) {
    v = sub_reduce_max(v);
    if (sub_lane() == 0) scratch[sub_id()] = v;
    barrier_local();
    float r = NEG_INF;
    for (uint i = 0; i < num_subs(); i++) r = fmax(r, scratch[i]);
    barrier_local();
    return r;
}

#endif
