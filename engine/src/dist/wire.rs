//! The wire format of one step broadcast from rank 0: a `BatchInput` flattened into `u32`s.
//! Layout: `[num_seqs, then per sequence: n_tokens, start_position, n_blocks, tokens.., blocks.., slots..]`.

use crate::error::{EngineError, Result};
use crate::model::{BatchInput, SeqInput};

pub fn encode(batch: &BatchInput) -> Vec<u32> {
    let mut out = vec![batch.seqs.len() as u32];
    for s in &batch.seqs {
        out.extend([s.token_ids.len() as u32, s.start_position as u32, s.block_table.len() as u32]);
        out.extend(&s.token_ids);
        out.extend(&s.block_table);
        out.extend(&s.slot_mapping);
    }
    out
}

pub fn decode(data: &[u32]) -> Result<BatchInput> {
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
        seqs.push(SeqInput {
            token_ids: take(n)?,
            start_position: start,
            block_table: take(nb)?,
            slot_mapping: take(n)?,
        });
    }
    Ok(BatchInput { seqs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let b = BatchInput {
            seqs: vec![
                SeqInput {
                    token_ids: vec![1, 2, 3],
                    start_position: 0,
                    block_table: vec![4],
                    slot_mapping: vec![64, 65, 66],
                },
                SeqInput { token_ids: vec![9], start_position: 17, block_table: vec![0, 2], slot_mapping: vec![33] },
            ],
        };
        assert_eq!(decode(&encode(&b)).unwrap(), b);
        assert!(decode(&encode(&b)[..5]).is_err());
    }
}
