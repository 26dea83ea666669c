//! One sparse edit of a row's logits: how penalties and logit bias reach `Op::AdjustLogits` (the engine builds the
//! edits from requests; every backend applies them with this rule).

/// `x = mul != 1 ? (x > 0 ? x / mul : x * mul) : x; x += add` on `logits[row, token]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Edit {
    pub row: u32,
    pub token: u32,
    pub mul: f32,
    pub add: f32,
}

impl Edit {
    pub fn apply(&self, x: f32) -> f32 {
        let x = if self.mul != 1.0 {
            if x > 0.0 {
                x / self.mul
            } else {
                x * self.mul
            }
        } else {
            x
        };
        x + self.add
    }
}
