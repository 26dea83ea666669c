//! The wire format of one step broadcast from rank 0: the scheduler's sequences flattened into `u32`s (what a
//! forward step reads of them; the other ranks sample nothing).
//! Layout: `[num_seqs, then per sequence: n_tokens, start_position, n_blocks, tokens.., blocks.., slots..]`.

use rserve_scheduler::{BlockId, ScheduledSeq, TokenId};

use crate::error::{EngineError, Result};

pub fn encode(batch: &[ScheduledSeq]) -> Vec<u32> {
    let mut out = vec![batch.len() as u32];
    for s in batch {
        out.extend([s.token_ids.len() as u32, s.start_position as u32, s.block_table.len() as u32]);
        out.extend(s.token_ids.iter().map(|t| t.0));
        out.extend(s.block_table.iter().map(|b| b.0));
        out.extend(&s.slot_mapping);
    }
    out
}

pub fn decode(data: &[u32]) -> Result<Vec<ScheduledSeq>> {
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
        let h = take(3)?;
        let (n, start, nb) = (h[0] as usize, h[1] as usize, h[2] as usize);
        let token_ids = take(n)?.into_iter().map(TokenId).collect();
        let block_table = take(nb)?.into_iter().map(BlockId).collect();
        let slot_mapping = take(n)?;
        seqs.push(ScheduledSeq {
            token_ids,
            block_table,
            slot_mapping,
            ..ScheduledSeq::new(Vec::new(), start, Vec::new(), 1)
        });
    }
    Ok(seqs)
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
        assert_eq!(decode(&encode(&b)).unwrap(), b);
        assert!(decode(&encode(&b)[..5]).is_err());
        // The bytes on the wire are the bare ids, as before token ids were typed.
        assert_eq!(encode(&b[1..]), [1, 1, 17, 2, 9, 0, 2, 33]);
    }
}
