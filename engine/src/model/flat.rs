//! A step's batch as the kernels read it: `FlatBatch` (host vectors: token ids, positions, slots, query starts,
//! context lengths, block tables, last rows) and `DeviceBatch` (the same on a backend). `forward_stage` flattens and
//! uploads each step; the CUDA graph runner keeps one `DeviceBatch` per batch-size bucket and overwrites it in place,
//! padding a decode batch to its bucket with rows that only touch a reserved KV block.

use crate::backend::{AttentionMeta, Backend};
use crate::model::batch::BatchInput;

/// Host side of one flattened step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FlatBatch {
    pub ids: Vec<u32>,
    pub positions: Vec<u32>,
    pub slots: Vec<u32>,
    /// `num_seqs + 1` entries: sequence `s` owns rows `query_start[s]..query_start[s + 1]`.
    pub query_start: Vec<u32>,
    pub context_lens: Vec<u32>,
    /// `num_seqs x max_blocks`, unused entries 0.
    pub tables: Vec<u32>,
    pub max_blocks: usize,
    /// The row of each sequence's last token (whose logits the step returns).
    pub last_rows: Vec<u32>,
}

impl FlatBatch {
    /// Flattens `batch` with block tables `max_blocks` wide (at least the longest table; 0: exactly that).
    pub fn new(batch: &BatchInput, max_blocks: usize) -> Self {
        let n = batch.num_tokens();
        let num_seqs = batch.seqs.len();
        let longest = batch.seqs.iter().map(|s| s.block_table.len()).max().unwrap_or(0).max(1);
        let max_blocks = max_blocks.max(longest);
        let mut f = FlatBatch {
            ids: Vec::with_capacity(n),
            positions: Vec::with_capacity(n),
            slots: Vec::with_capacity(n),
            query_start: Vec::with_capacity(num_seqs + 1),
            context_lens: Vec::with_capacity(num_seqs),
            tables: vec![0u32; num_seqs * max_blocks],
            max_blocks,
            last_rows: Vec::with_capacity(num_seqs),
        };
        f.query_start.push(0);
        for (i, s) in batch.seqs.iter().enumerate() {
            f.ids.extend_from_slice(&s.token_ids);
            f.positions.extend((0..s.token_ids.len()).map(|t| (s.start_position + t) as u32));
            f.slots.extend_from_slice(&s.slot_mapping);
            f.query_start.push(f.ids.len() as u32);
            f.context_lens.push((s.start_position + s.token_ids.len()) as u32);
            f.tables[i * max_blocks..i * max_blocks + s.block_table.len()].copy_from_slice(&s.block_table);
            f.last_rows.push(f.ids.len() as u32 - 1);
        }
        f
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
            self.slots.push(pad_block * block_size as u32);
            self.query_start.push(row + 1);
            self.context_lens.push(1);
            let at = self.tables.len();
            self.tables.resize(at + self.max_blocks, 0);
            self.tables[at] = pad_block;
            self.last_rows.push(row);
        }
    }
}

/// A `FlatBatch` on a backend.
pub struct DeviceBatch<B: Backend> {
    pub ids: B::Buffer,
    pub positions: B::Buffer,
    pub slots: B::Buffer,
    pub query_start: B::Buffer,
    pub context_lens: B::Buffer,
    pub block_tables: B::Buffer,
    pub last_rows: B::Buffer,
}

impl<B: Backend> DeviceBatch<B> {
    pub fn upload(b: &B, f: &FlatBatch) -> crate::error::Result<Self> {
        Ok(Self {
            ids: b.upload_u32(&f.ids)?,
            positions: b.upload_u32(&f.positions)?,
            slots: b.upload_u32(&f.slots)?,
            query_start: b.upload_u32(&f.query_start)?,
            context_lens: b.upload_u32(&f.context_lens)?,
            block_tables: b.upload_u32(&f.tables)?,
            last_rows: b.upload_u32(&f.last_rows)?,
        })
    }

    /// The attention metadata of this batch (device buffers plus the host copies in `f`).
    pub fn meta<'a>(&'a self, f: &'a FlatBatch) -> AttentionMeta<'a, B::Buffer> {
        AttentionMeta {
            num_seqs: f.num_seqs(),
            query_start: &self.query_start,
            context_lens: &self.context_lens,
            block_tables: &self.block_tables,
            max_blocks_per_seq: f.max_blocks,
            host_query_start: &f.query_start,
            host_context_lens: &f.context_lens,
            host_block_tables: &f.tables,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::batch::SeqInput;

    #[test]
    fn flattens_and_pads_a_decode_batch() {
        let batch = BatchInput {
            seqs: vec![
                SeqInput { token_ids: vec![5, 6], start_position: 0, block_table: vec![3], slot_mapping: vec![48, 49] },
                SeqInput { token_ids: vec![7], start_position: 20, block_table: vec![1, 2], slot_mapping: vec![36] },
            ],
        };
        let mut f = FlatBatch::new(&batch, 4);
        assert_eq!(f.ids, vec![5, 6, 7]);
        assert_eq!(f.positions, vec![0, 1, 20]);
        assert_eq!(f.query_start, vec![0, 2, 3]);
        assert_eq!(f.context_lens, vec![2, 21]);
        assert_eq!(f.tables, vec![3, 0, 0, 0, 1, 2, 0, 0]);
        assert_eq!(f.last_rows, vec![1, 2]);
        f.pad_decode(4, 9, 16);
        assert_eq!(f.num_seqs(), 4);
        assert_eq!(f.query_start, vec![0, 2, 3, 4, 5]);
        assert_eq!(f.slots[3..], [144, 144]);
        assert_eq!(f.context_lens[2..], [1, 1]);
        assert_eq!(f.tables[8..], [9, 0, 0, 0, 9, 0, 0, 0]);
        assert_eq!(f.last_rows, vec![1, 2, 3, 4]);
        // Tables are at least as wide as the longest one.
        assert_eq!(FlatBatch::new(&batch, 0).max_blocks, 2);
    }
}
