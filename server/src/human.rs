//! vLLM's human-readable integers on the command line (`4k`, `1.5m`, `2G`), shared by `serve` and `plan` flags.

/// vLLM's human-readable integers: plain digits, or a number with a suffix: k/m/g/t = 10^3/10^6/10^9/10^12 (decimals
/// allowed), K/M/G/T = 2^10/2^20/2^30/2^40 (whole numbers only).
pub fn parse_human_int(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let bad = || format!("invalid number '{s}' (examples: 4096, 4k, 1.5m, 2G)");
    let Some(last) = s.chars().last() else {
        return Err(bad());
    };
    let (decimal, binary) = match last {
        'k' => (Some(1e3), None),
        'm' => (Some(1e6), None),
        'g' => (Some(1e9), None),
        't' => (Some(1e12), None),
        'K' => (None, Some(1u64 << 10)),
        'M' => (None, Some(1u64 << 20)),
        'G' => (None, Some(1u64 << 30)),
        'T' => (None, Some(1u64 << 40)),
        _ => return s.parse::<u64>().map_err(|_| bad()),
    };
    let number = &s[..s.len() - 1];
    if number.is_empty() || !number.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(bad());
    }
    if let Some(mult) = decimal {
        let v: f64 = number.parse().map_err(|_| bad())?;
        let r = (v * mult).round();
        if !r.is_finite() || r > u64::MAX as f64 {
            return Err(bad());
        }
        return Ok(r as u64);
    }
    let v: u64 =
        number.parse().map_err(|_| format!("invalid number '{s}': decimals are not allowed with binary suffixes"))?;
    v.checked_mul(binary.unwrap_or(1)).ok_or_else(bad)
}
