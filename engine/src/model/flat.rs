//! A step's batch as the kernels read it. Runners take the scheduler's `ScheduledSeq`s as they are; `FlatBatch`
//! checks them against the cache and flattens them in one pass into the host vectors the kernels read (token ids,
//! positions, slots, query starts, context lengths, block tables, last rows; slots and tables once per KV cache
//! group), and `DeviceBatch` is the same on a backend. A step run op by op uploads a new one; on a backend that
//! records steps, the runner keeps one `DeviceBatch` per batch-size bucket and overwrites it in place, padding a
//! decode batch to its bucket with rows that only touch a reserved KV block; the bucket's host copy is kept too and
//! refilled from each step's deltas (`refill_decode`, `RowOwners`): a row still held by its request takes only the
//! block ids appended since the step before.
//!
//! The batch is checked here once a step: the ops of every layer then bound their indices in O(1).

use rserve_scheduler::{BlockId, BlockTables, RequestId, ScheduledSeq};

use crate::backend::{AttentionMeta, Backend};
use crate::error::{EngineError, Result};

/// Host side of one flattened step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FlatBatch {
    pub ids: Vec<u32>,
    pub positions: Vec<u32>,
    /// Per KV cache group: the cache slot of each token.
    pub slots: Vec<Vec<u32>>,
    /// `num_seqs + 1` entries: sequence `s` owns rows `query_start[s]..query_start[s + 1]`.
    pub query_start: Vec<u32>,
    pub context_lens: Vec<u32>,
    /// Per KV cache group: `num_seqs x max_blocks`, unused entries 0.
    pub tables: Vec<Vec<u32>>,
    pub max_blocks: usize,
    /// The rows whose logits the step returns: each sequence's last token's, in order, then the prompt rows a
    /// step scores for prompt log-probs (`with_prompt_rows`).
    pub last_rows: Vec<u32>,
}

impl FlatBatch {
    /// Checks `seqs` against a cache of `num_blocks` blocks of `block_size` tokens in `num_groups` KV cache groups
    /// (tokens to compute, one slot each per group, at the place the group's block table gives their position,
    /// tables long enough and inside the cache) and flattens them with block tables `max_blocks` wide (at least the
    /// longest table; 0: exactly that). Each sequence's whole tables come from `tables` (`BlockTables::of`: its
    /// own on a first schedule, else the ones kept from the scheduler's deltas, already applied).
    pub fn new(
        seqs: &[ScheduledSeq],
        tables: &BlockTables,
        block_size: usize,
        num_blocks: usize,
        num_groups: usize,
        max_blocks: usize,
    ) -> Result<Self> {
        let n = seqs.iter().map(|s| s.token_ids.len()).sum();
        let num_seqs = seqs.len();
        let longest = seqs.iter().flat_map(|s| tables.of(s).iter().map(Vec::len)).max().unwrap_or(0).max(1);
        let max_blocks = max_blocks.max(longest);
        let mut f = FlatBatch {
            ids: Vec::with_capacity(n),
            positions: Vec::with_capacity(n),
            slots: vec![Vec::with_capacity(n); num_groups],
            query_start: Vec::with_capacity(num_seqs + 1),
            context_lens: Vec::with_capacity(num_seqs),
            tables: vec![vec![0u32; num_seqs * max_blocks]; num_groups],
            max_blocks,
            last_rows: Vec::with_capacity(num_seqs),
        };
        f.query_start.push(0);
        for (i, s) in seqs.iter().enumerate() {
            let whole = tables.of(s);
            check_seq(s, whole, block_size, num_blocks, num_groups)
                .map_err(|m| EngineError::InvalidArgument(format!("batch sequence {i}: {m}")))?;
            f.ids.extend(s.token_ids.iter().map(|t| t.0));
            f.positions.extend((0..s.token_ids.len()).map(|t| (s.start_position + t) as u32));
            for (g, table) in whole.iter().enumerate() {
                f.slots[g].extend_from_slice(&s.slot_mappings[g]);
                let row = &mut f.tables[g][i * max_blocks..i * max_blocks + table.len()];
                row.iter_mut().zip(table).for_each(|(t, b)| *t = b.0);
            }
            f.query_start.push(f.ids.len() as u32);
            f.context_lens.push((s.start_position + s.token_ids.len()) as u32);
            f.last_rows.push(f.ids.len() as u32 - 1);
        }
        Ok(f)
    }

    /// Adds `rows` (rows of this batch) after the sequences' last rows, so the step returns their logits too.
    pub fn with_prompt_rows(&mut self, rows: &[u32]) -> Result<()> {
        if let Some(r) = rows.iter().find(|&&r| r as usize >= self.ids.len()) {
            return Err(EngineError::InvalidArgument(format!("prompt row {r} of a batch of {} rows", self.ids.len())));
        }
        self.last_rows.extend_from_slice(rows);
        Ok(())
    }

    /// Replaces the rows the step returns with `rows` (a pooling step's: the hidden states it pools).
    pub fn with_output_rows(&mut self, rows: Vec<u32>) -> Result<()> {
        if let Some(r) = rows.iter().find(|&&r| r as usize >= self.ids.len()) {
            return Err(EngineError::InvalidArgument(format!("output row {r} of a batch of {} rows", self.ids.len())));
        }
        self.last_rows = rows;
        Ok(())
    }

    pub fn num_groups(&self) -> usize {
        self.slots.len()
    }

    /// LongRoPE: sets bit 31 of the positions of every sequence whose context is longer than `long_after`, so
    /// `Op::RopeWriteKv` reads the long factors for its tokens (transformers switches to them once a sequence
    /// outgrows the original length).
    pub fn mark_long_rope(&mut self, long_after: usize) {
        for s in 0..self.num_seqs() {
            if self.context_lens[s] as usize > long_after {
                let rows = self.query_start[s] as usize..self.query_start[s + 1] as usize;
                self.positions[rows].iter_mut().for_each(|p| *p |= 1 << 31);
            }
        }
    }

    pub fn num_tokens(&self) -> usize {
        self.ids.len()
    }

    pub fn num_seqs(&self) -> usize {
        self.context_lens.len()
    }

    /// Appends one-token sequences until there are `seqs`: token 0 at position 0 in block `pad_block` (slot
    /// `pad_block * block_size`), attending to that one key. Their logits are computed and ignored; their K/V only
    /// ever land in `pad_block`, which the scheduler never hands out.
    pub fn pad_decode(&mut self, seqs: usize, pad_block: u32, block_size: usize) {
        while self.num_seqs() < seqs {
            let row = self.ids.len() as u32;
            self.ids.push(0);
            self.positions.push(0);
            self.query_start.push(row + 1);
            self.context_lens.push(1);
            for (slots, tables) in self.slots.iter_mut().zip(&mut self.tables) {
                slots.push(pad_block * block_size as u32);
                let at = tables.len();
                tables.resize(at + self.max_blocks, 0);
                tables[at] = pad_block;
            }
            self.last_rows.push(row);
        }
    }
}

/// Who holds each row of a bucket's decode batch kept from step to step (`FlatBatch::refill_decode`): the request
/// (None: a padding row) and, per KV cache group, how many table entries the row holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RowOwners {
    requests: Vec<Option<RequestId>>,
    /// `[group][row]`.
    lens: Vec<Vec<usize>>,
}

impl RowOwners {
    /// The owners of `f`, a batch `FlatBatch::new` flattened from `seqs` and `pad_decode` padded.
    pub fn of(f: &FlatBatch, seqs: &[ScheduledSeq], tables: &BlockTables) -> Self {
        let rows = f.num_seqs();
        let mut requests = vec![None; rows];
        let mut lens = vec![vec![1; rows]; f.num_groups()];
        for (i, s) in seqs.iter().enumerate() {
            requests[i] = Some(s.request_id);
            for (g, t) in tables.of(s).iter().enumerate() {
                lens[g][i] = t.len();
            }
        }
        Self { requests, lens }
    }
}

impl FlatBatch {
    /// Refills, in place, a decode batch (one token per sequence) padded to its bucket as `pad_decode` pads it, for
    /// this step's `seqs`: the persistent step inputs of a recorded bucket. The tokens, positions, slots and lengths
    /// are written anew (they change every step); a table row still held by the request it held last step takes only
    /// the block ids appended since (the scheduler's delta; kept tables never change their existing entries), and
    /// only those are checked; any other row is written and checked whole, and what is left of a longer row before
    /// it is cleared. The batch must have come from `FlatBatch::new` + `pad_decode` at this bucket and width, with
    /// `owners` from `RowOwners::of`; after an error it is no longer such a batch and must be flattened anew.
    #[allow(clippy::too_many_arguments)]
    pub fn refill_decode(
        &mut self,
        owners: &mut RowOwners,
        seqs: &[ScheduledSeq],
        tables: &BlockTables,
        block_size: usize,
        num_blocks: usize,
        pad_block: u32,
    ) -> Result<()> {
        let (rows, groups, width) = (self.num_seqs(), self.num_groups(), self.max_blocks);
        if seqs.len() > rows || owners.requests.len() != rows || owners.lens.len() != groups {
            return Err(EngineError::InvalidArgument(format!(
                "a decode batch of {} sequences refilled into {rows} rows",
                seqs.len()
            )));
        }
        self.ids.clear();
        self.positions.clear();
        self.slots.iter_mut().for_each(Vec::clear);
        self.query_start.truncate(1);
        self.context_lens.clear();
        self.last_rows.clear();
        for (i, s) in seqs.iter().enumerate() {
            let whole = tables.of(s);
            refill_row(self, owners, i, s, whole, block_size, num_blocks, width)
                .map_err(|m| EngineError::InvalidArgument(format!("batch sequence {i}: {m}")))?;
        }
        for i in seqs.len()..rows {
            let row = self.ids.len() as u32;
            self.ids.push(0);
            self.positions.push(0);
            self.query_start.push(row + 1);
            self.context_lens.push(1);
            self.last_rows.push(row);
            for g in 0..groups {
                self.slots[g].push(pad_block * block_size as u32);
                let held = std::mem::replace(&mut owners.lens[g][i], 1);
                let table = &mut self.tables[g][i * width..(i + 1) * width];
                table[..held.max(1)].fill(0);
                table[0] = pad_block;
            }
            owners.requests[i] = None;
        }
        Ok(())
    }
}

/// Row `i` of `refill_decode`: sequence `s` with its whole tables `whole`.
#[allow(clippy::too_many_arguments)]
fn refill_row(
    f: &mut FlatBatch,
    owners: &mut RowOwners,
    i: usize,
    s: &ScheduledSeq,
    whole: &[Vec<BlockId>],
    block_size: usize,
    num_blocks: usize,
    width: usize,
) -> std::result::Result<(), String> {
    if s.token_ids.len() != 1 {
        return Err(format!("{} tokens in a decode step", s.token_ids.len()));
    }
    if whole.len() != f.num_groups() || s.slot_mappings.len() != f.num_groups() {
        return Err(format!("{} block tables for {} KV cache groups", whole.len(), f.num_groups()));
    }
    let pos = s.start_position;
    let kept = owners.requests[i] == Some(s.request_id) && !s.is_first_schedule;
    for (g, table) in whole.iter().enumerate() {
        if table.len() > width || table.len() * block_size <= pos {
            return Err(format!("block table of {} blocks for position {pos} in rows of {width}", table.len()));
        }
        let held = owners.lens[g][i];
        let from = if kept && held <= table.len() { held } else { 0 };
        if let Some(b) = table[from..].iter().find(|b| b.index() >= num_blocks) {
            return Err(format!("{b} is outside the cache of {num_blocks} blocks"));
        }
        let row = &mut f.tables[g][i * width..(i + 1) * width];
        row.iter_mut().zip(table).skip(from).for_each(|(r, b)| *r = b.0);
        if held > table.len() {
            row[table.len()..held].fill(0);
        }
        owners.lens[g][i] = table.len();
        let slot = *s.slot_mappings[g].first().ok_or("no slot")?;
        let want = table[pos / block_size].index() * block_size + pos % block_size;
        if slot as usize != want {
            return Err(format!("slot {slot} of position {pos} disagrees with the block table ({want})"));
        }
        f.slots[g].push(slot);
    }
    owners.requests[i] = Some(s.request_id);
    let row = f.ids.len() as u32;
    f.ids.push(s.token_ids[0].0);
    f.positions.push(pos as u32);
    f.query_start.push(row + 1);
    f.context_lens.push(pos as u32 + 1);
    f.last_rows.push(row);
    Ok(())
}

/// A `FlatBatch` on a backend.
pub struct DeviceBatch<B: Backend> {
    pub ids: B::Buffer,
    pub positions: B::Buffer,
    /// Per KV cache group.
    pub slots: Vec<B::Buffer>,
    pub query_start: B::Buffer,
    pub context_lens: B::Buffer,
    /// Per KV cache group.
    pub block_tables: Vec<B::Buffer>,
    pub last_rows: B::Buffer,
}

impl<B: Backend> DeviceBatch<B> {
    pub fn upload(b: &B, f: &FlatBatch) -> Result<Self> {
        Ok(Self {
            ids: b.upload_u32(&f.ids)?,
            positions: b.upload_u32(&f.positions)?,
            slots: f.slots.iter().map(|s| b.upload_u32(s)).collect::<rserve_backend::Result<_>>()?,
            query_start: b.upload_u32(&f.query_start)?,
            context_lens: b.upload_u32(&f.context_lens)?,
            block_tables: f.tables.iter().map(|t| b.upload_u32(t)).collect::<rserve_backend::Result<_>>()?,
            last_rows: b.upload_u32(&f.last_rows)?,
        })
    }

    /// The attention metadata of this batch for each KV cache group (device buffers plus the host copies in `f`),
    /// built once a step.
    pub fn metas<'a>(&'a self, f: &'a FlatBatch, block_size: usize) -> Result<Vec<AttentionMeta<'a, B::Buffer>>> {
        self.block_tables
            .iter()
            .zip(&f.tables)
            .map(|(dev, host)| {
                AttentionMeta::new(
                    [&self.query_start, &self.context_lens, dev],
                    [&f.query_start, &f.context_lens, host],
                    f.max_blocks,
                    block_size,
                )
            })
            .collect::<rserve_backend::Result<_>>()
            .map_err(Into::into)
    }
}

/// The shapes the kernels rely on for one sequence: tokens to compute, one slot each where the block table puts its
/// position, a table that holds the context and lies inside the cache.
fn check_seq(
    s: &ScheduledSeq,
    tables: &[Vec<BlockId>],
    block_size: usize,
    num_blocks: usize,
    groups: usize,
) -> std::result::Result<(), String> {
    if s.token_ids.is_empty() {
        return Err("no tokens".into());
    }
    if tables.len() != groups || s.slot_mappings.len() != groups {
        return Err(format!(
            "{} block tables and {} slot mappings for {groups} KV cache groups",
            tables.len(),
            s.slot_mappings.len()
        ));
    }
    let ctx = s.start_position + s.token_ids.len();
    for (table, slots) in tables.iter().zip(&s.slot_mappings) {
        if slots.len() != s.token_ids.len() {
            return Err(format!("{} slots for {} tokens", slots.len(), s.token_ids.len()));
        }
        if table.len() * block_size < ctx {
            return Err(format!("block table of {} blocks cannot hold {ctx} tokens", table.len()));
        }
        if let Some(b) = table.iter().find(|b| b.index() >= num_blocks) {
            return Err(format!("{b} is outside the cache of {num_blocks} blocks"));
        }
        for (t, &slot) in slots.iter().enumerate() {
            let pos = s.start_position + t;
            let want = table[pos / block_size].index() * block_size + pos % block_size;
            if slot as usize != want {
                return Err(format!("slot {slot} of position {pos} disagrees with the block table ({want})"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rserve_scheduler::{BlockId, TokenId};

    fn seq(tokens: &[u32], start: usize, table: &[u32]) -> ScheduledSeq {
        ScheduledSeq::new(
            tokens.iter().copied().map(TokenId).collect(),
            start,
            table.iter().map(|&b| BlockId(b)).collect(),
            16,
        )
    }

    #[test]
    fn flattens_and_pads_a_decode_batch() {
        let batch = [seq(&[5, 6], 0, &[3]), seq(&[7], 20, &[1, 2])];
        let mut f = FlatBatch::new(&batch, &BlockTables::default(), 16, 10, 1, 4).unwrap();
        assert_eq!(f.ids, vec![5, 6, 7]);
        assert_eq!(f.positions, vec![0, 1, 20]);
        assert_eq!(f.slots, vec![vec![48, 49, 36]]);
        assert_eq!(f.query_start, vec![0, 2, 3]);
        assert_eq!(f.context_lens, vec![2, 21]);
        assert_eq!(f.tables, vec![vec![3, 0, 0, 0, 1, 2, 0, 0]]);
        assert_eq!(f.last_rows, vec![1, 2]);
        f.pad_decode(4, 9, 16);
        assert_eq!(f.num_seqs(), 4);
        assert_eq!(f.query_start, vec![0, 2, 3, 4, 5]);
        assert_eq!(f.slots[0][3..], [144, 144]);
        assert_eq!(f.context_lens[2..], [1, 1]);
        assert_eq!(f.tables[0][8..], [9, 0, 0, 0, 9, 0, 0, 0]);
        assert_eq!(f.last_rows, vec![1, 2, 3, 4]);
        // Tables are at least as wide as the longest one.
        assert_eq!(FlatBatch::new(&batch, &BlockTables::default(), 16, 10, 1, 0).unwrap().max_blocks, 2);
    }

    #[test]
    fn flattens_every_kv_cache_group() {
        // A global group and a sliding-window one whose first block was freed (the null block 0).
        let tables = vec![vec![BlockId(3), BlockId(4)], vec![BlockId(0), BlockId(5)]];
        let s = ScheduledSeq::with_groups(vec![TokenId(1)], 20, tables, 16);
        let f = FlatBatch::new(std::slice::from_ref(&s), &BlockTables::default(), 16, 10, 2, 0).unwrap();
        assert_eq!(f.slots, vec![vec![68], vec![84]]);
        assert_eq!(f.tables, vec![vec![3, 4], vec![0, 5]]);
        let err = FlatBatch::new(&[s], &BlockTables::default(), 16, 10, 1, 0).unwrap_err().to_string();
        assert!(err.contains("2 block tables and 2 slot mappings for 1 KV cache groups"), "{err}");
    }

    /// A decode step of request `id` at `pos` whose table (of `blocks`) was sent whole (`first`) or as the ids
    /// appended since `sent` entries.
    fn decode(id: u64, pos: usize, blocks: &[u32], first: bool, sent: usize) -> ScheduledSeq {
        let table: Vec<BlockId> = blocks.iter().map(|&b| BlockId(b)).collect();
        let mut s = ScheduledSeq::new(vec![TokenId(id as u32)], pos, table.clone(), 4);
        s.request_id = RequestId(id);
        s.is_first_schedule = first;
        if !first {
            s.block_tables = vec![table[sent..].to_vec()];
        }
        s
    }

    #[test]
    fn a_refilled_decode_batch_equals_one_flattened_anew() {
        // Steps of a bucket of 4 rows (block size 4, tables 6 wide, pad block 30): requests grow, cross blocks, end,
        // swap rows, are preempted and come back with new tables; every refill must equal a fresh flatten + pad.
        let mut lens: std::collections::HashMap<u64, (usize, Vec<u32>, usize)> = Default::default();
        let steps: Vec<Vec<(u64, bool)>> = vec![
            vec![(1, true), (2, true), (3, true)],
            vec![(1, false), (2, false), (3, false)],
            vec![(1, false), (3, false)],
            vec![(3, false), (1, false), (4, true)],
            vec![(3, false), (1, true), (4, false), (5, true)],
            vec![(3, false), (1, false), (4, false), (5, false)],
            vec![(5, false)],
            vec![(5, false), (4, false)],
        ];
        let (mut kept, mut flat, mut owners) = (BlockTables::default(), None::<FlatBatch>, RowOwners::default());
        for (step, reqs) in steps.iter().enumerate() {
            let mut seqs = Vec::new();
            for &(id, first) in reqs {
                let e = lens.entry(id).or_insert((id as usize * 3, Vec::new(), 0));
                if first {
                    // (Re)admitted: a new table (other block ids), sent whole.
                    e.1.clear();
                    e.2 = 0;
                }
                e.0 += 1;
                while e.1.len() * 4 <= e.0 {
                    e.1.push((id as u32 * 5 + e.1.len() as u32 + step as u32) % 29);
                }
                seqs.push(decode(id, e.0, &e.1, first, e.2));
                e.2 = e.1.len();
            }
            kept.apply(&seqs).unwrap();
            let mut want = FlatBatch::new(&seqs, &kept, 4, 30, 1, 6).unwrap();
            want.pad_decode(4, 30, 4);
            match flat.as_mut() {
                None => {
                    owners = RowOwners::of(&want, &seqs, &kept);
                    flat = Some(want);
                }
                Some(f) => {
                    f.refill_decode(&mut owners, &seqs, &kept, 4, 30, 30).unwrap();
                    assert_eq!(*f, want, "step {step}");
                }
            }
        }
    }

    #[test]
    fn a_refill_checks_what_it_writes() {
        let first = [decode(1, 5, &[2, 3], true, 0)];
        let mut kept = BlockTables::default();
        kept.apply(&first).unwrap();
        let mut f = FlatBatch::new(&first, &kept, 4, 10, 1, 4).unwrap();
        f.pad_decode(2, 10, 4);
        let mut owners = RowOwners::of(&f, &first, &kept);
        // The next block is outside the cache: refused, naming it.
        let next = [decode(1, 8, &[2, 3, 12], false, 2)];
        kept.apply(&next).unwrap();
        let err = f.refill_decode(&mut owners, &next, &kept, 4, 10, 10).unwrap_err().to_string();
        assert!(err.contains("block-12 is outside the cache of 10 blocks"), "{err}");
        // A failed refill leaves the batch to be flattened anew (the runner does so).
        let mut kept = BlockTables::default();
        kept.apply(&first).unwrap();
        let mut f = FlatBatch::new(&first, &kept, 4, 10, 1, 4).unwrap();
        f.pad_decode(2, 10, 4);
        let mut owners = RowOwners::of(&f, &first, &kept);
        let mut wrong = decode(1, 8, &[2, 3, 7], false, 2);
        wrong.slot_mappings[0][0] = 1;
        kept.apply(std::slice::from_ref(&wrong)).unwrap();
        let err = f.refill_decode(&mut owners, &[wrong], &kept, 4, 10, 10).unwrap_err().to_string();
        assert!(err.contains("disagrees with the block table"), "{err}");
    }

    #[test]
    fn refuses_a_batch_the_cache_cannot_hold() {
        let err =
            |seqs: &[ScheduledSeq]| FlatBatch::new(seqs, &BlockTables::default(), 16, 4, 1, 0).unwrap_err().to_string();
        assert!(err(&[seq(&[1], 0, &[4])]).contains("block-4 is outside the cache of 4 blocks"));
        assert!(err(&[seq(&[1], 0, &[0]), seq(&[], 3, &[1])]).contains("batch sequence 1: no tokens"));
        let mut short = seq(&[1; 3], 15, &[0, 1]);
        short.block_tables[0].pop();
        assert!(err(&[short]).contains("block table of 1 blocks cannot hold 18 tokens"));
        let mut s = seq(&[1, 2], 0, &[2]);
        s.slot_mappings[0][1] = 7;
        assert!(err(&[s.clone()]).contains("slot 7 of position 1 disagrees with the block table (33)"));
        s.slot_mappings[0].pop();
        assert!(err(&[s]).contains("1 slots for 2 tokens"));
    }
}
