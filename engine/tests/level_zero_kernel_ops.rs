//! The device-neutral op -> kernel mapping (`backend::level_zero::kernel_ops`) against the kernels themselves: every
//! launch passes exactly as many arguments as its entry point declares in the SPIR-V module, uses a work-group size
//! that divides its grid, and the attention work split covers every query row (decode) or (token, head) pair
//! (prefill) exactly once; indices outside their buffers are refused on the host.

use std::cell::RefCell;
use std::collections::HashMap;

use rserve_engine::backend::level_zero::kernel_ops::{self, split_work, AttnPlan, KernelDevice, Launch, View};
use rserve_engine::backend::{AttentionMeta, Op, WeightDType};
use rserve_kernels::launch::{ATTN_MAX_PARTITION, PREFILL_ROWS};

/// A buffer of the fake device: only its description.
enum FakeBuf {
    F32(usize),
    U32(Vec<u32>),
    Matrix(WeightDType, usize, usize),
}

/// (kernel, number of arguments, grid, work-group size) of one recorded launch.
type Recorded = (String, usize, [usize; 3], usize);

#[derive(Default)]
struct Fake {
    launches: RefCell<Vec<Recorded>>,
    plan: RefCell<Option<AttnPlan<FakeBuf>>>,
}

impl KernelDevice for Fake {
    type Buf = FakeBuf;
    fn view<'b>(&self, b: &'b FakeBuf) -> View<'b> {
        match b {
            FakeBuf::F32(len) => View::F32 { len: *len },
            FakeBuf::U32(host) => View::U32 { host },
            FakeBuf::Matrix(dtype, rows, cols) => View::Matrix { dtype: *dtype, rows: *rows, cols: *cols },
        }
    }
    fn scratch_f32(&self, len: usize) -> rserve_engine::Result<FakeBuf> {
        Ok(FakeBuf::F32(len))
    }
    fn upload_u32(&self, data: &[u32]) -> rserve_engine::Result<FakeBuf> {
        Ok(FakeBuf::U32(data.to_vec()))
    }
    fn launch(&self, l: &Launch<'_, FakeBuf>) -> rserve_engine::Result<()> {
        self.launches.borrow_mut().push((l.kernel.to_string(), l.args.len(), l.global, l.local));
        Ok(())
    }
    fn attention_plan(&self) -> &RefCell<Option<AttnPlan<FakeBuf>>> {
        &self.plan
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

fn f(len: usize) -> FakeBuf {
    FakeBuf::F32(len)
}

#[test]
fn every_launch_matches_its_kernel_signature() {
    let params = spirv_params();
    let d = Fake::default();
    let (h, hd, heads, kvh, bs, vocab, inter) = (64usize, 16usize, 4usize, 2usize, 16usize, 100usize, 96usize);
    let (x, res, out) = (f(40 * h), f(40 * h), f(40 * h));
    let norm = f(h);
    let ids = FakeBuf::U32((0..40).collect());
    for dtype in [WeightDType::F32, WeightDType::BF16, WeightDType::F16] {
        let table = FakeBuf::Matrix(dtype, vocab, h);
        kernel_ops::run(&d, Op::Embedding { table: &table, ids: &ids, out: &out, num_tokens: 40, hidden: h }).unwrap();
        let w = FakeBuf::Matrix(dtype, inter, h);
        let o = f(40 * inter);
        for m in [1, 16, 17, 40] {
            kernel_ops::run(&d, Op::MatMul { x: &x, w: &w, bias: Some(&f(inter)), out: &o, m, k: h, n: inter }).unwrap();
        }
    }
    kernel_ops::run(&d, Op::RmsNorm { x: &x, weight: &norm, out: &out, rows: 40, hidden: h, eps: 1e-5 }).unwrap();
    kernel_ops::run(&d, Op::AddRmsNorm { x: &x, residual: &res, weight: &norm, out: &out, rows: 40, hidden: h, eps: 1e-5 }).unwrap();
    let pos = FakeBuf::U32((0..40).collect());
    let q = f(40 * heads * hd);
    let (kc, vc) = (f(64 * bs * kvh * hd), f(64 * bs * kvh * hd));
    let qkv = f(40 * (heads + 2 * kvh) * hd);
    let slots = FakeBuf::U32((0..40).collect());
    kernel_ops::run(&d, Op::RopeWriteKv {
        qkv: &qkv,
        positions: &pos,
        inv_freq: &f(hd / 2),
        q_out: &q,
        k_cache: &kc,
        v_cache: &vc,
        slot_mapping: &slots,
        num_tokens: 40,
        num_heads: heads,
        num_kv_heads: kvh,
        head_dim: hd,
        block_size: bs,
    })
    .unwrap();
    kernel_ops::run(&d, Op::SiluMul { gate_up: &f(40 * 2 * inter), out: &f(40 * inter), rows: 40, width: inter }).unwrap();
    kernel_ops::run(&d, Op::GatherRows { x: &x, rows: &FakeBuf::U32(vec![3, 39]), out: &out, num_rows: 2, width: h }).unwrap();
    // Attention: a 38-token prefill chunk, a decode at position 40, and one at 600 (two partitions).
    let qs = vec![0u32, 38, 39, 40];
    let ctx = vec![38u32, 41, 601];
    let max_blocks = 601usize.div_ceil(bs);
    let mut tables = vec![0u32; 3 * max_blocks];
    for (i, t) in tables.iter_mut().enumerate() {
        *t = (i % 60) as u32;
    }
    let (qsb, ctxb, tb) = (FakeBuf::U32(qs.clone()), FakeBuf::U32(ctx.clone()), FakeBuf::U32(tables.clone()));
    let meta = AttentionMeta {
        num_seqs: 3,
        query_start: &qsb,
        context_lens: &ctxb,
        block_tables: &tb,
        max_blocks_per_seq: max_blocks,
        host_query_start: &qs,
        host_context_lens: &ctx,
        host_block_tables: &tables,
    };
    let attn = |d: &Fake| {
        kernel_ops::run(d, Op::PagedAttention { q: &q, k_cache: &kc, v_cache: &vc, out: &q, meta: &meta, num_heads: heads, num_kv_heads: kvh, head_dim: hd, block_size: bs, scale: 0.25 })
    };
    attn(&d).unwrap();

    let launches = d.launches.borrow();
    let mut seen: Vec<&str> = Vec::new();
    for (kernel, nargs, global, local) in launches.iter() {
        let want = params.get(kernel).unwrap_or_else(|| panic!("{kernel} is not an entry point of the SPIR-V"));
        assert_eq!(nargs, want, "{kernel}: arguments");
        assert!(*local > 0 && global[0] % local == 0, "{kernel}: grid {global:?} / group {local}");
        seen.push(kernel);
    }
    // Every kernel of rserve-kernels was launched by some op (except those only CPU OpenCL devices run).
    for (_, names) in rserve_kernels::KERNELS {
        for n in names.iter().filter(|n| !rserve_kernels::CPU_DEVICE_ONLY.contains(n) && !rserve_kernels::OUTSIDE_OPS.contains(n)) {
            assert!(seen.contains(n), "no op launched {n}");
        }
    }
    // The plan is reused by the next layer: attention adds launches but no new work lists.
    drop(launches);
    let before = d.launches.borrow().len();
    attn(&d).unwrap();
    assert_eq!(d.launches.borrow().len(), before + 3);
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
    let d = Fake::default();
    let table = FakeBuf::Matrix(WeightDType::F32, 10, 8);
    let e = kernel_ops::run(&d, Op::Embedding { table: &table, ids: &FakeBuf::U32(vec![3, 10]), out: &f(16), num_tokens: 2, hidden: 8 })
        .unwrap_err()
        .to_string();
    assert!(e.contains("token id 10") && e.contains("vocabulary of 10"), "{e}");
    let (pos, slots) = (FakeBuf::U32(vec![0]), FakeBuf::U32(vec![4]));
    let op = Op::RopeWriteKv {
        qkv: &f(24),
        positions: &pos,
        inv_freq: &f(4),
        q_out: &f(8),
        k_cache: &f(32),
        v_cache: &f(32),
        slot_mapping: &slots,
        num_tokens: 1,
        num_heads: 1,
        num_kv_heads: 1,
        head_dim: 8,
        block_size: 4,
    };
    let e = kernel_ops::run(&d, op)
        .unwrap_err()
        .to_string();
    assert!(e.contains("slot 4 outside the cache"), "{e}");
    let e = kernel_ops::run(&d, Op::GatherRows { x: &f(16), rows: &FakeBuf::U32(vec![2]), out: &f(8), num_rows: 1, width: 8 })
        .unwrap_err()
        .to_string();
    assert!(e.contains("row 2"), "{e}");
    assert!(d.launches.borrow().is_empty());
}
