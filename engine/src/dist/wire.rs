//! The wire format of one step broadcast from rank 0: the scheduler's sequences flattened into `u32`s (what a
//! forward step reads of them; the other ranks sample nothing).
//! Layout: `[num_seqs, then per sequence: n_tokens, start_position, n_groups, n_blocks, tokens.., then per KV cache
//! group: blocks.., slots..; then n_prompt_rows, prompt rows..]` (every group's table has `n_blocks` entries; the
//! prompt rows are the batch rows whose logits the step returns after the sequences' last ones, for prompt
//! log-probs).

use rserve_scheduler::{BlockId, ScheduledSeq, TokenId};

use crate::error::{EngineError, Result};

pub fn encode(batch: &[ScheduledSeq], prompt_rows: &[u32]) -> Vec<u32> {
    let mut out = vec![batch.len() as u32];
    for s in batch {
        let n_blocks = s.block_table().len();
        out.extend([s.token_ids.len() as u32, s.start_position as u32, s.block_tables.len() as u32, n_blocks as u32]);
        out.extend(s.token_ids.iter().map(|t| t.0));
        for (table, slots) in s.block_tables.iter().zip(&s.slot_mappings) {
            // Groups share their length (the scheduler's invariant); pad or cut defensively so decode stays aligned.
            out.extend((0..n_blocks).map(|i| table.get(i).map_or(0, |b| b.0)));
            out.extend(slots);
        }
    }
    out.push(prompt_rows.len() as u32);
    out.extend_from_slice(prompt_rows);
    out
}

/// The sequences and prompt rows of an `encode`d step.
pub fn decode(data: &[u32]) -> Result<(Vec<ScheduledSeq>, Vec<u32>)> {
    let bad = || EngineError::Backend("malformed step message".into());
    let mut it = data.iter().copied();
    let mut take = |n: usize| -> Result<Vec<u32>> {
        let v: Vec<u32> = it.by_ref().take(n).collect();
        if v.len() == n {
            Ok(v)
        } else {
            Err(bad())
        }
    };
    let num = take(1)?[0] as usize;
    let mut seqs = Vec::with_capacity(num);
    for _ in 0..num {
        let h = take(4)?;
        let (n, start, groups, nb) = (h[0] as usize, h[1] as usize, h[2] as usize, h[3] as usize);
        let token_ids = take(n)?.into_iter().map(TokenId).collect();
        let mut block_tables = Vec::with_capacity(groups);
        let mut slot_mappings = Vec::with_capacity(groups);
        for _ in 0..groups {
            block_tables.push(take(nb)?.into_iter().map(BlockId).collect());
            slot_mappings.push(take(n)?);
        }
        seqs.push(ScheduledSeq {
            token_ids,
            num_blocks: nb,
            block_tables,
            slot_mappings,
            ..ScheduledSeq::new(Vec::new(), start, Vec::new(), 1)
        });
    }
    let n = take(1)?[0] as usize;
    let prompt_rows = take(n)?;
    Ok((seqs, prompt_rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let b = [
            ScheduledSeq::new(vec![TokenId(1), TokenId(2), TokenId(3)], 0, vec![BlockId(4)], 16),
            ScheduledSeq::new(vec![TokenId(9)], 17, vec![BlockId(0), BlockId(2)], 16),
        ];
        assert_eq!(decode(&encode(&b, &[])).unwrap(), (b.to_vec(), vec![]));
        assert!(decode(&encode(&b, &[])[..5]).is_err());
        assert_eq!(decode(&encode(&b, &[0, 1])).unwrap(), (b.to_vec(), vec![0, 1]));
        // Two KV cache groups (a sliding-window group with its first block freed).
        let g = [ScheduledSeq::with_groups(
            vec![TokenId(5)],
            20,
            vec![vec![BlockId(3), BlockId(4)], vec![BlockId(0), BlockId(6)]],
            16,
        )];
        assert_eq!(decode(&encode(&g, &[])).unwrap(), (g.to_vec(), vec![]));
        // The bytes on the wire are the bare ids: one sequence of 1 token at 17, 1 group of 2 blocks.
        assert_eq!(encode(&b[1..], &[]), [1, 1, 17, 1, 2, 9, 0, 2, 33, 0]);
    }
}
