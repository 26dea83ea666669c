// gemv_bulk.cu — CUDA-only (sm_90+): the decode GEMV of 16-bit weights and activations through Hopper's bulk-copy
// engine. out[j] = x . w[j, :] (+ bias[j]) for one row x (m must be 1: the op layer takes it at batch-1 decode),
// f32 accumulation and output.
// Written over the macros of prelude.h (NVRTC receives prelude.h + this file); no OpenCL counterpart, because the
// copy engine and the transaction-counting barriers it signals have none (OpenCL and Level Zero devices take
// matmul.cl's GEMVs).
//
// Why it exists: the per-warp GEMVs of matmul.cl stream a weight matrix as thousands of small independent reads and
// lose 10-30 % of the bandwidth on the decode shapes (ramp, tail, reads in flight limited by registers or the
// cp.async ring). Here each work-group owns one contiguous slice of weight rows (the grid is sized to the device, two
// work-groups a multiprocessor) and one producer lane streams it through BULK_STAGES tiles of local memory with
// `cp.async.bulk`; the copies need no registers and complete on an mbarrier, so a whole tile is in flight per copy.
//
// Work-group: BULK_WG = 32 x (BULK_CONSUMERS + 1). Warp BULK_CONSUMERS is the producer; warps 0 .. BULK_CONSUMERS-1
// multiply. A tile is `rpt` whole rows (short rows: rpt a power of two up to BULK_CONSUMERS) or one `chunk` of one
// row (rows longer than a tile); BULK_CONSUMERS / rpt warps share a row, each walking 16-byte pieces of it with
// its lanes (at most BULK_PIECES a lane a tile, their loads issued together), the x pieces kept in registers. A warp keeps its sums across the chunks of a
// row, reduces them at the row's last chunk into `part` (by slot), and releases the slot on its `empty` barrier;
// the producer, which waits on that barrier before refilling the slot, adds the warps' parts and stores the row.
// The first BULK_STAGES tiles are issued before GRID_DEP_SYNC() (weights are never written by an earlier kernel),
// so under programmatic dependent launch a work-group that starts while the kernel before it drains streams at once.

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define BULK_SUPPORTED 1
#else
#define BULK_SUPPORTED 0
#endif

#define BULK_CONSUMERS (BULK_WG / 32 - 1)
#if BULK_SUPPORTED
#define BULK_DEP_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define BULK_DEP_LAUNCH() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#endif

#if BULK_SUPPORTED
INLINE uint bulk_smem(const void* p) { return (uint)__cvta_generic_to_shared(p); }

INLINE void mbar_init(unsigned long long* b, uint count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bulk_smem(b)), "r"(count) : "memory");
}

INLINE void mbar_wait(unsigned long long* b, uint parity) {
    uint done = 0;
    while (!done) {
        asm volatile(
            "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
            : "=r"(done)
            : "r"(bulk_smem(b)), "r"(parity)
            : "memory");
    }
}

INLINE void mbar_arrive(unsigned long long* b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bulk_smem(b)) : "memory");
}

// Announces `bytes` of copies to barrier `b` (with this lane's arrival).
INLINE void bulk_expect(unsigned long long* b, uint bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bulk_smem(b)), "r"(bytes) : "memory");
}

// Copies `bytes` (a multiple of 16, both addresses 16-byte aligned) from global `src` to local `dst`, completing on
// barrier `b`, in pieces of at most 4 KiB so several run at once.
INLINE void bulk_copy(void* dst, const void* src, uint bytes, unsigned long long* b) {
    for (uint o = 0; o < bytes; o += 4096u) {
        uint len = min(4096u, bytes - o);
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                         bulk_smem((char*)dst + o)),
                     "l"((const char*)src + o), "r"(len), "r"(bulk_smem(b))
                     : "memory");
    }
}

// The producer lane. Tiles go in order: row group g (rows r_begin + g * rpt, nr of them), chunk c (values c * chunk,
// len of them); tile t lives in slot t % stages. Each slot is refilled once the warps have released it, and a row
// group's sums are stored once the warps have released its last chunk.
INLINE void bulk_produce(GLOBAL const ushort* w, GLOBAL const float* bias, GLOBAL float* out, uint k, uint has_bias,
                         uint rpt, uint chunk, uint stages, uint prefetch, uint r_begin, uint rows, uint4* slots,
                         unsigned long long* full, unsigned long long* empty, float (*part)[BULK_CONSUMERS]) {
    uint chunks = (k + chunk - 1) / chunk;
    uint tiles = (rows + rpt - 1) / rpt * chunks;
    uint slot_vals = rpt * chunk;
    uint wpr = BULK_CONSUMERS / rpt;
    // Issue position (g, c, slot) and release position (tile, g, c, slot, phase), stepped without divisions.
    uint ig = 0, ic = 0, is = 0;
    uint rg = 0, rc = 0, rs = 0, rph = 0;
    uint synced = 0;
    for (uint t = 0; t < tiles + stages; t++) {
        if (t == prefetch) {
            BULK_DEP_WAIT();  // after the first `prefetch` tiles' copies, before any store
            synced = 1;
        }
        // The released tile's row group is complete after its last chunk: its sums are read now (before the slot's
        // refill, after which the warps may write its parts again) and stored after the refill is issued, so the
        // copy engine is not kept waiting.
        float sums[BULK_CONSUMERS];
        uint done_rows = 0;
        if (t >= stages) {
            mbar_wait(&empty[rs], rph);
            if (rc == chunks - 1) {
                done_rows = min(rpt, rows - rg * rpt);
                for (uint i = 0; i < BULK_CONSUMERS; i++) {
                    sums[i] = 0.0f;
                    if (i < done_rows)
                        for (uint q = 0; q < wpr; q++) sums[i] += part[rs][i * wpr + q];
                }
            }
        }
        if (t < tiles) {
            uint r0 = r_begin + ig * rpt;
            uint nr = min(rpt, rows - ig * rpt);
            uint c0 = ic * chunk;
            uint len = min(chunk, k - c0);
            // The slot was last read through the generic proxy; order those reads before the copy engine's writes.
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            bulk_expect(&full[is], nr * len * 2u);
            for (uint i = 0; i < nr; i++)
                bulk_copy(slots + (is * slot_vals + i * chunk) / 8u, w + (ulong)(r0 + i) * k + c0, len * 2u, &full[is]);
            if (++ic == chunks) ic = 0, ig++;
            if (++is == stages) is = 0;
        }
        if (t >= stages) {
            uint r0 = r_begin + rg * rpt;
            for (uint i = 0; i < BULK_CONSUMERS; i++)
                if (i < done_rows) out[r0 + i] = has_bias ? sums[i] + bias[r0 + i] : sums[i];
            if (++rc == chunks) rc = 0, rg++;
            if (++rs == stages) rs = 0, rph ^= 1u;
        }
    }
    if (!synced) BULK_DEP_WAIT();  // wait once in every case, like every kernel
    BULK_DEP_LAUNCH();
}

// One tile row's share of a warp: the lane's pieces p0 + i * step (i < BULK_PIECES, below `pieces`) of `slot` times
// the activations `xr` (16-bit, widened here: registers are what lets the next kernel's work-groups in beside).
INLINE float bulk_dot(const uint4* slot, uint p0, uint step, uint pieces, const uint4* xr, uint is_f16) {
    float acc = 0.0f;
#pragma unroll
    for (uint i = 0; i < BULK_PIECES; i++) {
        if (p0 + i * step < pieces) {
            f32x8 xf = widen8_bits(xr[i], is_f16);
            acc += dot8(widen8_bits(slot[p0 + i * step], is_f16), xf.lo, xf.hi);
        }
    }
    return acc;
}

// The lane's activations for pieces p0 + i * step of the chunk at x + c0.
INLINE void bulk_load_x(GLOBAL const ushort* x, uint c0, uint p0, uint step, uint pieces, uint4* xr) {
    GLOBAL const uint4* xp = (GLOBAL const uint4*)(x + c0);
#pragma unroll
    for (uint i = 0; i < BULK_PIECES; i++)
        if (p0 + i * step < pieces) xr[i] = xp[p0 + i * step];
}
#endif

INLINE void matmul_bulk(GLOBAL const ushort* x, GLOBAL const ushort* w, GLOBAL const float* bias, GLOBAL float* out,
                        uint k, uint n, uint has_bias, uint rpt, uint chunk, uint stages, uint prefetch, uint is_f16) {
#if BULK_SUPPORTED
    extern __shared__ uint4 bulk_slots[];
    __shared__ unsigned long long full[BULK_MAX_STAGES], empty[BULK_MAX_STAGES];
    __shared__ float part[BULK_MAX_STAGES][BULK_CONSUMERS];
    uint groups = gridDim.x;
    uint r_begin = (uint)((ulong)group_id(0) * n / groups);
    uint rows = (uint)((ulong)(group_id(0) + 1) * n / groups) - r_begin;
    uint warp = sub_id(), lane = sub_lane();
    if (local_id() == 0) {
        for (uint s = 0; s < stages; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], BULK_CONSUMERS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    barrier_local();
    if (warp == BULK_CONSUMERS) {
        if (lane == 0)
            bulk_produce(w, bias, out, k, has_bias, rpt, chunk, stages, prefetch, r_begin, rows, bulk_slots, full, empty,
                         part);
        else
            BULK_DEP_WAIT();
        return;
    }
    BULK_DEP_WAIT();
    uint chunks = (k + chunk - 1) / chunk;
    uint row_groups = (rows + rpt - 1) / rpt;
    uint wpr = BULK_CONSUMERS / rpt;
    uint rit = warp / wpr;
    uint p0 = (warp % wpr) * 32u + lane;  // this lane's pieces of a tile row: p0 + i * step
    uint step = 32u * wpr;
    uint slot_vals = rpt * chunk;
    uint4 xr[BULK_PIECES];
    uint s = 0, ph = 0;
    if (chunks == 1) {
        // Whole rows: a warp multiplies the same columns in every tile, so its activations are loaded once.
        uint pieces = k / 8u;
        bulk_load_x(x, 0, p0, step, pieces, xr);
        for (uint g = 0; g < row_groups; g++) {
            mbar_wait(&full[s], ph);
            if (rit < min(rpt, rows - g * rpt)) {  // uniform per warp
                float acc = bulk_dot(bulk_slots + (s * slot_vals + rit * chunk) / 8u, p0, step, pieces, xr, is_f16);
                acc = sub_reduce_add(acc);
                if (lane == 0) part[s][warp] = acc;
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[s]);
            if (++s == stages) s = 0, ph ^= 1u;
        }
    } else {
        // Chunked rows (one row a tile): the warp's sums run across the row's chunks, activations loaded per chunk.
        for (uint g = 0; g < row_groups; g++) {
            float acc = 0.0f;
            for (uint c = 0; c < chunks; c++) {
                uint c0 = c * chunk;
                uint pieces = min(chunk, k - c0) / 8u;
                bulk_load_x(x, c0, p0, step, pieces, xr);
                mbar_wait(&full[s], ph);
                acc += bulk_dot(bulk_slots + (s * slot_vals) / 8u, p0, step, pieces, xr, is_f16);
                if (c == chunks - 1) {
                    acc = sub_reduce_add(acc);
                    if (lane == 0) part[s][warp] = acc;
                }
                __syncwarp();
                if (lane == 0) mbar_arrive(&empty[s]);
                if (++s == stages) s = 0, ph ^= 1u;
            }
        }
    }
    BULK_DEP_LAUNCH();  // the next kernel is launched as this one's last tiles are multiplied, not at its start
#else
    GRID_DEP_SYNC();
    __trap();  // never launched below sm_90 (KernelTuning::bulk_gemv_groups is 0 there)
#endif
}

// Registers held to what three work-groups would leave (BULK_GROUPS_PER_SM + 1): the grid has BULK_GROUPS_PER_SM a
// multiprocessor, and the rest of the register file is where the next kernel's work-groups wait under
// programmatic dependent launch.
KERNEL void __launch_bounds__(BULK_WG, BULK_GROUPS_PER_SM + 1) matmul_bulk_bf16(GLOBAL const ushort* x, GLOBAL const ushort* w, GLOBAL const float* bias, GLOBAL float* out,
                             uint m, uint k, uint n, uint has_bias, uint rpt, uint chunk, uint stages,
                                                                        uint prefetch) {
    matmul_bulk(x, w, bias, out, k, n, has_bias, rpt, chunk, stages, prefetch, 0u);
}

KERNEL void __launch_bounds__(BULK_WG, BULK_GROUPS_PER_SM + 1) matmul_bulk_f16(GLOBAL const ushort* x, GLOBAL const ushort* w, GLOBAL const float* bias, GLOBAL float* out,
                            uint m, uint k, uint n, uint has_bias, uint rpt, uint chunk, uint stages,
                                                                        uint prefetch) {
    matmul_bulk(x, w, bias, out, k, n, has_bias, rpt, chunk, stages, prefetch, 1u);
}
