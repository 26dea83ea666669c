//! The device-neutral op layer (`backend::kernels`) against the kernels themselves, on a recording device for every
//! tuning (portable GPU, Level Zero with the XMX matmul and its emulated form, CPU OpenCL, CUDA): every launch
//! passes exactly as many arguments as its entry point declares
//! in the SPIR-V module, uses a work-group size that divides its grid, every kernel is launched by some op, the
//! attention work split covers every query row (decode) or (token, head) pair (prefill) exactly once and is built
//! once per batch shape, not once per step; indices outside their buffers are refused on the host.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use rserve_engine::backend::kernels::{
    self, split_work, Contents, KernelDevice, KernelTuning, Launch, MatMulCall, PlanCache,
};
use rserve_engine::backend::{
    Activation, AttentionMeta, AttnShape, HeldExperts, MoeInput, MoeTiles, Op, QkNorm, RopeIo, WeightDType,
};
use rserve_kernels::launch::{ATTN_MAX_PARTITION, PREFILL_ROWS};

type FakeBuf = Contents;

/// (kernel, number of arguments, grid, work-group size) of one recorded launch.
type Recorded = (String, usize, [usize; 3], usize);

struct Fake {
    launches: RefCell<Vec<Recorded>>,
    plans: PlanCache<FakeBuf>,
    tuning: Cell<KernelTuning>,
}

impl Fake {
    fn new(tuning: KernelTuning) -> Self {
        Self { launches: RefCell::default(), plans: PlanCache::default(), tuning: Cell::new(tuning) }
    }
}

impl KernelDevice for Fake {
    type Buf = FakeBuf;
    fn contents<'b>(&self, b: &'b FakeBuf) -> &'b Contents {
        b
    }
    fn scratch_f32(&self, len: usize) -> rserve_engine::backend::Result<FakeBuf> {
        Ok(Contents::F32 { len })
    }
    fn upload_indices(&self, data: &[u32]) -> rserve_engine::backend::Result<FakeBuf> {
        Ok(Contents::u32_of(data))
    }
    fn launch(&self, l: &Launch<'_, FakeBuf>) -> rserve_engine::backend::Result<()> {
        self.launches.borrow_mut().push((l.kernel.to_string(), l.args.len(), l.global, l.local));
        Ok(())
    }
    fn plans(&self) -> &PlanCache<FakeBuf> {
        &self.plans
    }
    fn tuning(&self) -> KernelTuning {
        self.tuning.get()
    }
    fn vendor_matmul(&self, call: &MatMulCall<'_, FakeBuf>) -> rserve_engine::backend::Result<()> {
        kernels::matmul_check(self, call).map(drop)
    }
}

/// Parameters of every entry point of every module, read from the SPIR-V words (OpEntryPoint names a function;
/// OpFunctionParameter instructions follow its OpFunction).
fn spirv_params() -> HashMap<String, usize> {
    let mut out = HashMap::new();
    for m in rserve_kernels::MODULES {
        let w: Vec<u32> = m.spirv.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let (mut names, mut params, mut current) = (HashMap::new(), HashMap::<u32, usize>::new(), None);
        let mut i = 5;
        while i < w.len() {
            let (count, op) = ((w[i] >> 16) as usize, w[i] & 0xffff);
            match op {
                15 => {
                    let bytes: Vec<u8> = w[i + 3..i + count].iter().flat_map(|x| x.to_le_bytes()).collect();
                    let end = bytes.iter().position(|&b| b == 0).unwrap();
                    names.insert(w[i + 2], String::from_utf8(bytes[..end].to_vec()).unwrap());
                }
                54 => {
                    current = Some(w[i + 2]);
                    params.insert(w[i + 2], 0);
                }
                55 => *params.get_mut(&current.unwrap()).unwrap() += 1,
                _ => {}
            }
            i += count;
        }
        for (id, name) in names {
            out.insert(name, params[&id]);
        }
    }
    out
}

/// `Op::PagedAttention` on buffers q, k cache, v cache, out with [heads, kv heads, head dim, block size].
fn attention<'a>(
    [q, k_cache, v_cache, out]: [&'a FakeBuf; 4],
    meta: &'a AttentionMeta<'a, FakeBuf>,
    [num_heads, num_kv_heads, head_dim, block_size]: [usize; 4],
) -> Op<'a, FakeBuf> {
    Op::PagedAttention {
        q,
        k_cache,
        v_cache,
        out,
        meta,
        shape: AttnShape { num_heads, num_kv_heads, head_dim, block_size, scale: 0.25, window: None, softcap: None },
        sinks: None,
    }
}

fn f(len: usize) -> FakeBuf {
    Contents::F32 { len }
}

fn u(v: Vec<u32>) -> FakeBuf {
    Contents::u32_of(&v)
}

fn mat(dtype: WeightDType, rows: usize, cols: usize) -> FakeBuf {
    Contents::Matrix { dtype, rows, cols }
}

fn half(dtype: WeightDType, len: usize) -> FakeBuf {
    Contents::Half { dtype, len }
}

/// Attention metadata of `qs` / `ctx` with distinct blocks per sequence.
struct Batch {
    qs: Vec<u32>,
    ctx: Vec<u32>,
    tables: Vec<u32>,
    max_blocks: usize,
    bs: usize,
    bufs: [FakeBuf; 3],
}

fn batch(qs: Vec<u32>, ctx: Vec<u32>, bs: usize) -> Batch {
    let max_blocks = (*ctx.iter().max().unwrap() as usize).div_ceil(bs);
    let tables: Vec<u32> = (0..ctx.len() * max_blocks).map(|i| (i % 60) as u32).collect();
    let bufs = [u(qs.clone()), u(ctx.clone()), u(tables.clone())];
    Batch { qs, ctx, tables, max_blocks, bs, bufs }
}

impl Batch {
    fn meta(&self) -> AttentionMeta<'_, FakeBuf> {
        let [qs, ctx, tables] = &self.bufs;
        AttentionMeta::new([qs, ctx, tables], [&self.qs, &self.ctx, &self.tables], self.max_blocks, self.bs).unwrap()
    }
}

/// Every op on `d` with buffers of `act` (f32, or 16-bit activations and KV cache of that type).
fn exercise(d: &Fake, act: Option<WeightDType>) {
    let (h, hd, heads, kvh, bs, vocab, inter) = (64usize, 16usize, 4usize, 2usize, 16usize, 100usize, 96usize);
    let act_buf = |len: usize| act.map_or(f(len), |t| half(t, len));
    let (x, res, out) = (f(40 * h), f(40 * h), act_buf(40 * h));
    let norm = f(h);
    let ids = u((0..40).collect());
    for dtype in [WeightDType::F32, WeightDType::BF16, WeightDType::F16] {
        kernels::run(
            d,
            Op::Embedding {
                table: &mat(dtype, vocab, h),
                ids: &ids,
                out: &f(40 * h),
                num_tokens: 40,
                hidden: h,
                scale: 1.0,
            },
        )
        .unwrap();
        if act.is_some_and(|t| t != dtype) {
            continue;
        }
        // Routed experts: 8 experts of [inter, h] (gate/up) and [h, inter] (down), 40 tokens x top 2.
        let (experts, top_k, pairs) = (8, 2, 80);
        let max_tiles = rserve_engine::backend::moe_max_tiles(pairs, experts);
        let rows = max_tiles * rserve_kernels::launch::MOE_TILE_M;
        let out_u32 = |len: usize| Contents::U32 { len, bound: u32::MAX };
        let (eids, sorted, tile_expert, slot) = (out_u32(pairs), out_u32(rows), out_u32(max_tiles), out_u32(pairs));
        let tiles = MoeTiles { sorted: &sorted, tile_expert: &tile_expert, slot: &slot, max_tiles };
        let ew = f(pairs);
        kernels::run(
            d,
            Op::MoeRoute {
                logits: &f(40 * experts),
                ids: &eids,
                weights: &ew,
                rows: 40,
                experts,
                top_k,
                renormalize: true,
            },
        )
        .unwrap();
        kernels::run(d, Op::MoeAlign { ids: &eids, tiles: &tiles, pairs, experts, first_expert: 0 }).unwrap();
        let input = MoeInput::Tokens { top_k, tokens: 40 };
        let (gu, y) = (f(rows * inter), f(rows * h));
        kernels::run(
            d,
            Op::MoeMatMul { x: &x, w: &mat(dtype, experts * inter, h), tiles: &tiles, input, out: &gu, k: h, n: inter },
        )
        .unwrap();
        // Many pairs per expert (80 pairs over 2 experts): the tiled variant.
        let few = rserve_engine::backend::moe_max_tiles(pairs, 2);
        let few_rows = few * rserve_kernels::launch::MOE_TILE_M;
        let (fs, ft) = (out_u32(few_rows), out_u32(few));
        let few_tiles = MoeTiles { sorted: &fs, tile_expert: &ft, slot: &slot, max_tiles: few };
        let (w2, o2) = (mat(dtype, 2 * inter, h), f(few_rows * inter));
        kernels::run(d, Op::MoeMatMul { x: &x, w: &w2, tiles: &few_tiles, input, out: &o2, k: h, n: inter }).unwrap();
        // A width that is not a multiple of 8: the scalar-load variant.
        let w60 = mat(dtype, experts * inter, 60);
        kernels::run(d, Op::MoeMatMul { x: &x, w: &w60, tiles: &tiles, input, out: &gu, k: 60, n: inter }).unwrap();
        let input = MoeInput::Slots;
        kernels::run(
            d,
            Op::MoeMatMul { x: &gu, w: &mat(dtype, experts * h, inter), tiles: &tiles, input, out: &y, k: inter, n: h },
        )
        .unwrap();
        kernels::run(d, Op::MoeBias { x: &y, bias: &f(experts * h), tiles: &tiles, width: h }).unwrap();
        kernels::run(
            d,
            Op::MoeCombine { y: &y, tiles: &tiles, weights: &ew, out: &f(40 * h), rows: 40, top_k, width: h },
        )
        .unwrap();
        // Ungrouped (decode): 3 tokens' pairs, with and without biases, all experts held or a share of them.
        for (bias, held) in
            [(false, HeldExperts { first: 0, count: experts }), (true, HeldExperts { first: 3, count: 4 })]
        {
            let (gate_up, down) = (mat(dtype, held.count * 2 * inter, h), mat(dtype, held.count * h, inter));
            let (gb, db) = (f(held.count * 2 * inter), f(held.count * h));
            let (act, out) = (f(6 * inter), f(3 * h));
            let (tokens, act_kind) = (3, Activation::Silu);
            kernels::run(
                d,
                Op::MoePairGateUp {
                    x: &x,
                    w: &gate_up,
                    bias: bias.then_some(&gb),
                    ids: &eids,
                    out: &act,
                    tokens,
                    top_k,
                    k: h,
                    width: inter,
                    held,
                    act: act_kind,
                },
            )
            .unwrap();
            kernels::run(
                d,
                Op::MoePairDown {
                    x: &act,
                    w: &down,
                    bias: bias.then_some(&db),
                    ids: &eids,
                    weights: &ew,
                    out: &out,
                    tokens,
                    top_k,
                    k: inter,
                    n: h,
                    held,
                },
            )
            .unwrap();
        }
        let w = mat(dtype, inter, h);
        let o = f(40 * inter);
        for m in [1, 4, 16, 17, 40] {
            let xm = if act.is_some() { act_buf(m * h) } else { f(m * h) };
            kernels::run(d, Op::MatMul { x: &xm, w: &w, bias: Some(&f(inter)), out: &o, m, k: h, n: inter }).unwrap();
        }
    }
    kernels::run(d, Op::RmsNorm { x: &x, weight: &norm, out: &out, rows: 40, hidden: h, eps: 1e-5 }).unwrap();
    kernels::run(d, Op::AddRmsNorm { x: &x, residual: &res, weight: &norm, out: &out, rows: 40, hidden: h, eps: 1e-5 })
        .unwrap();
    let q = f(40 * heads * hd);
    let (kc, vc) = (act_buf(64 * bs * kvh * hd), act_buf(64 * bs * kvh * hd));
    let (pos, slots) = (u((0..40).collect()), u((0..40).collect()));
    kernels::run(
        d,
        Op::RopeWriteKv {
            io: RopeIo {
                qkv: &f(40 * (heads + 2 * kvh) * hd),
                positions: &pos,
                inv_freq: &f(hd / 2),
                q_out: &q,
                k_cache: &kc,
                v_cache: &vc,
                slot_mapping: &slots,
            },
            qk_norm: Some(QkNorm { q_weight: &f(hd), k_weight: &f(hd), eps: 1e-6 }),
            num_tokens: 40,
            num_heads: heads,
            num_kv_heads: kvh,
            head_dim: hd,
            block_size: bs,
            mscale: 1.0,
        },
    )
    .unwrap();
    kernels::run(
        d,
        Op::GatedAct {
            gate_up: &f(40 * 2 * inter),
            out: &act_buf(40 * inter),
            rows: 40,
            width: inter,
            act: Activation::Silu,
        },
    )
    .unwrap();
    kernels::run(d, Op::SoftCap { x: &f(3 * vocab), rows: 3, width: vocab, cap: 30.0 }).unwrap();
    kernels::run(d, Op::GatherRows { x: &x, rows: &u(vec![3, 39]), out: &f(2 * h), num_rows: 2, width: h }).unwrap();
    // The encoder ops: LayerNorm with and without the residual, GELU, attention over two sequences.
    for residual in [Some(&res), None] {
        let (bias, out) = (f(h), f(40 * h));
        let op =
            Op::LayerNorm { x: &x, residual, weight: &norm, bias: &bias, out: &out, rows: 40, hidden: h, eps: 1e-12 };
        kernels::run(d, op).unwrap();
    }
    kernels::run(d, Op::Gelu { x: &x, out: &f(40 * h), len: 40 * h }).unwrap();
    let (qkv, starts, enc_out) = (f(40 * 3 * heads * hd), u(vec![0, 38, 40]), f(40 * heads * hd));
    let op = Op::EncoderAttention {
        qkv: &qkv,
        query_start: &starts,
        out: &enc_out,
        num_seqs: 2,
        num_tokens: 40,
        num_heads: heads,
        head_dim: hd,
        scale: 0.25,
    };
    kernels::run(d, op).unwrap();
    let feed = (u(vec![0; 4]), u(vec![7, 8]), u(vec![1, u32::MAX, 0, 5]));
    kernels::run(d, Op::FeedTokens { ids: &feed.0, prev: &feed.1, from: &feed.2, count: 4, prev_len: 2 }).unwrap();
    kernels::run(d, Op::MaskLogits { logits: &f(3 * 1000), mask: &u(vec![u32::MAX; 3 * 32]), rows: 3, vocab: 1000 })
        .unwrap();
    // The token choice: penalty edits, the draw, log-probs.
    let (logits, ids) = (f(3 * 1000), u(vec![0; 3]));
    let (edits, values) = (u(vec![0, 5, 2, 999]), f(4));
    kernels::run(
        d,
        Op::AdjustLogits { logits: &logits, edits: &edits, values: &values, count: 2, rows: 3, vocab: 1000 },
    )
    .unwrap();
    let params = u(vec![0; 3 * rserve_kernels::launch::SAMPLE_PARAM_WORDS]);
    kernels::run(d, Op::SampleRows { logits: &logits, params: &params, ids: &ids, rows: 3, vocab: 1000 }).unwrap();
    let top = rserve_kernels::launch::LOGPROBS_MAX_TOP;
    kernels::run(
        d,
        Op::RowLogprobs {
            logits: &logits,
            ids: &ids,
            want: &u(vec![5, u32::MAX, 0]),
            values: &f(3 * (1 + top)),
            top_ids: &u(vec![0; 3 * top]),
            rows: 3,
            vocab: 1000,
        },
    )
    .unwrap();
    // Attention: a 38-token prefill chunk, a decode at position 40, and one at 600 (several partitions); then 20
    // decode rows (above CUDA's latency and fused-reduce limits).
    let mixed = batch(vec![0, 38, 39, 40], vec![38, 41, 601], bs);
    let many = batch((0..=20).collect(), (0..20).map(|i| 300 + 7 * i).collect(), bs);
    for b in [&mixed, &many] {
        let meta = b.meta();
        kernels::run(d, attention([&q, &kc, &vc, &out], &meta, [heads, kvh, hd, bs])).unwrap();
    }
}

#[test]
fn every_launch_matches_its_kernel_signature() {
    let params = spirv_params();
    let mut seen: Vec<String> = Vec::new();
    // The XMX matmul's emulated form is the OpenCL tests' (a GPU-shaped tuning with `matmul = xmx-emulated`).
    let mut xmx_emulated = KernelTuning::opencl(false);
    xmx_emulated.set("matmul=xmx-emulated").unwrap();
    let runs = [
        (KernelTuning::level_zero(), None),
        (KernelTuning::level_zero_xmx(), None),
        (xmx_emulated, None),
        (KernelTuning::opencl(true), None),
        // 16-bit activations on the portable kernels (`_x16` entry points): GPU-shaped and CPU-shaped tunings.
        (KernelTuning::level_zero(), Some(WeightDType::BF16)),
        (KernelTuning::level_zero(), Some(WeightDType::F16)),
        (KernelTuning::opencl(true), Some(WeightDType::BF16)),
        (KernelTuning::opencl(true), Some(WeightDType::F16)),
        (KernelTuning::cuda((9, 0)), None),
        (KernelTuning::cuda((9, 0)), Some(WeightDType::BF16)),
        (KernelTuning::cuda((9, 0)), Some(WeightDType::F16)),
    ];
    for (tuning, act) in runs {
        let d = Fake::new(tuning);
        exercise(&d, act);
        for (kernel, nargs, global, local) in d.launches.borrow().iter() {
            if ["f32_to_bf16", "f32_to_f16", "add_bias"].contains(&kernel.as_str()) {
                continue; // CUDA's own glue, outside the SPIR-V modules
            }
            let want = params.get(kernel).unwrap_or_else(|| panic!("{kernel} is not an entry point of the SPIR-V"));
            assert_eq!(nargs, want, "{kernel}: arguments");
            assert!(*local > 0 && global[0] % local == 0, "{kernel}: grid {global:?} / group {local}");
            assert_eq!(*local, rserve_kernels::work_group(kernel), "{kernel}: work-group size");
            seen.push(kernel.clone());
        }
    }
    // Every kernel of rserve-kernels is launched by some op on some device.
    let missing: Vec<&str> = rserve_kernels::KERNELS
        .iter()
        .flat_map(|(_, names)| names.iter().copied())
        .filter(|n| !rserve_kernels::OUTSIDE_OPS.contains(n) && !seen.iter().any(|s| s == n))
        .collect();
    assert!(missing.is_empty(), "no op launched {missing:?}");
}

#[test]
fn a_decode_plan_is_built_once_per_batch_shape_not_once_per_step() {
    for tuning in [KernelTuning::level_zero(), KernelTuning::opencl(true), KernelTuning::cuda((9, 0))] {
        let d = Fake::new(tuning);
        let (q, kc, vc, out) = (f(4 * 4 * 16), f(64 * 16 * 2 * 16), f(64 * 16 * 2 * 16), f(4 * 4 * 16));
        let attend = |b: &Batch| {
            let meta = b.meta();
            kernels::run(&d, attention([&q, &kc, &vc, &out], &meta, [4, 2, 16, 16])).unwrap();
        };
        // Four sequences decoding one token a step, contexts growing from 3 to 12 (one partition throughout), three
        // layers a step.
        for step in 0..10u32 {
            let b = batch(vec![0, 1, 2, 3, 4], vec![3 + step, 5 + step, 7 + step, 9 + step], 16);
            (0..3).for_each(|_| attend(&b));
        }
        assert_eq!(d.plans().builds(), 1, "{tuning:?}");
        // A new batch shape builds a new plan.
        attend(&batch(vec![0, 1, 2, 3], vec![20, 21, 22], 16));
        assert_eq!(d.plans().builds(), 2, "{tuning:?}");
    }
}

#[test]
fn the_work_split_covers_every_row_once() {
    let group = 3;
    // Sequences: prefill 37 tokens, decode, prefill 2 tokens after 10 cached, decode at a long context.
    let qs = [0u32, 37, 38, 40, 41];
    let ctx = [37u32, 5, 12, 2000];
    let (entries, tiles, max_ctx) = split_work(&qs, &ctx, group, 64);
    let decode_rows: Vec<u32> = entries.chunks(2).map(|e| e[0]).collect();
    assert_eq!(decode_rows, vec![37, 40]);
    for e in entries.chunks(2) {
        let s = e[1] as usize;
        let t = e[0] - qs[s];
        // The kernels' rule for a row's visible keys, from the metadata on the device.
        let visible = ctx[s] + e[0] + 1 - qs[s + 1];
        assert_eq!(visible, ctx[s] - (qs[s + 1] - qs[s]) + t + 1, "visible keys of row {}", e[0]);
        assert!(qs[s] <= e[0] && e[0] < qs[s + 1], "row {} belongs to sequence {s}", e[0]);
    }
    assert_eq!(max_ctx, 2000);
    assert!(max_ctx.div_ceil(ATTN_MAX_PARTITION) > 1);
    // Prefill tiles: each sequence's (token, head) pairs in consecutive tiles of PREFILL_ROWS.
    for (s, qlen) in [(0usize, 37u32), (2, 2)] {
        let firsts: Vec<u32> = tiles.chunks(2).filter(|t| t[0] as usize == s).map(|t| t[1]).collect();
        let pairs = qlen as usize * group;
        assert_eq!(firsts, (0..pairs).step_by(PREFILL_ROWS).map(|p| p as u32).collect::<Vec<_>>());
    }
    // Heads too large for the tiled kernel: every row goes to the per-row kernel.
    let (entries, tiles, _) = split_work(&qs, &ctx, group, 512);
    assert!(tiles.is_empty());
    assert_eq!(entries.len() / 2, 41);
}

#[test]
fn indices_outside_their_buffers_are_refused() {
    let d = Fake::new(KernelTuning::level_zero());
    let table = mat(WeightDType::F32, 10, 8);
    let e = kernels::run(
        &d,
        Op::Embedding { table: &table, ids: &u(vec![3, 10]), out: &f(16), num_tokens: 2, hidden: 8, scale: 1.0 },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("token id 10") && e.contains("vocabulary of 10"), "{e}");
    let (pos, slots) = (u(vec![0]), u(vec![4]));
    let op = Op::RopeWriteKv {
        io: RopeIo {
            qkv: &f(24),
            positions: &pos,
            inv_freq: &f(4),
            q_out: &f(8),
            k_cache: &f(32),
            v_cache: &f(32),
            slot_mapping: &slots,
        },
        qk_norm: None,
        num_tokens: 1,
        num_heads: 1,
        num_kv_heads: 1,
        head_dim: 8,
        block_size: 4,
        mscale: 1.0,
    };
    let e = kernels::run(&d, op).unwrap_err().to_string();
    assert!(e.contains("slot 4 outside the cache"), "{e}");
    let e = kernels::run(&d, Op::GatherRows { x: &f(16), rows: &u(vec![2]), out: &f(8), num_rows: 1, width: 8 })
        .unwrap_err()
        .to_string();
    assert!(e.contains("row 2"), "{e}");
    let op = Op::EncoderAttention {
        qkv: &f(2 * 3 * 8),
        query_start: &u(vec![0, 3]),
        out: &f(16),
        num_seqs: 1,
        num_tokens: 2,
        num_heads: 1,
        head_dim: 8,
        scale: 1.0,
    };
    let e = kernels::run(&d, op).unwrap_err().to_string();
    assert!(e.contains("query start 3"), "{e}");
    assert!(d.launches.borrow().is_empty());
}

#[test]
fn encoder_attention_takes_a_work_group_per_row_and_head() {
    let d = Fake::new(KernelTuning::level_zero());
    let op = Op::EncoderAttention {
        qkv: &f(37 * 3 * 12 * 64),
        query_start: &u(vec![0, 1, 30, 37]),
        out: &f(37 * 12 * 64),
        num_seqs: 3,
        num_tokens: 37,
        num_heads: 12,
        head_dim: 64,
        scale: 0.125,
    };
    kernels::run(&d, op).unwrap();
    let wg = rserve_kernels::launch::ENC_ATTN_WG;
    assert_eq!(d.launches.borrow().as_slice(), [("encoder_attention".to_string(), 7, [37 * wg, 12, 1], wg)]);
}
