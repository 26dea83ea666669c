//! The byte-level BPE alphabet (GPT-2's byte-to-character table) and the raw bytes of a token.
//!
//! Byte-level vocabularies spell every byte as one printable character: bytes that already are printable Latin-1
//! characters stand for themselves, the other 68 are moved to U+0100 and up, in byte order. The tokenizer crate keeps
//! this table private, so it is rebuilt here for two uses: respelling GGUF tokens that are not in the alphabet, and
//! giving the exact bytes of one token (log-prob `bytes`), which a lossy UTF-8 decode of that token cannot give.

use std::collections::HashMap;
use std::sync::OnceLock;

/// True for the bytes that stand for themselves in the byte-level alphabet.
fn is_self_spelled(byte: u8) -> bool {
    matches!(byte, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// Byte -> character, for all 256 bytes.
pub(crate) fn byte_to_char() -> &'static [char; 256] {
    static TABLE: OnceLock<[char; 256]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = ['\0'; 256];
        let mut shifted = 0u32;
        for byte in 0..=255u8 {
            let code = if is_self_spelled(byte) {
                u32::from(byte)
            } else {
                shifted += 1;
                255 + shifted
            };
            // Every code here is below 0x200, a valid scalar value.
            table[usize::from(byte)] = char::from_u32(code).unwrap_or('\u{FFFD}');
        }
        table
    })
}

/// Character -> byte, the inverse of [`byte_to_char`].
pub(crate) fn char_to_byte() -> &'static HashMap<char, u8> {
    static TABLE: OnceLock<HashMap<char, u8>> = OnceLock::new();
    TABLE.get_or_init(|| byte_to_char().iter().enumerate().map(|(byte, &c)| (c, byte as u8)).collect())
}

/// True when every character of `token` belongs to the byte-level alphabet.
pub(crate) fn is_byte_level_spelled(token: &str) -> bool {
    let table = char_to_byte();
    token.chars().all(|c| table.contains_key(&c))
}

/// Spells arbitrary text in the byte-level alphabet (its UTF-8 bytes, one character each).
pub(crate) fn spell(text: &str) -> String {
    let table = byte_to_char();
    text.bytes().map(|b| table[usize::from(b)]).collect()
}

/// The bytes a byte-level token stands for, or `None` if it has a character outside the alphabet.
pub(crate) fn unspell(token: &str) -> Option<Vec<u8>> {
    let table = char_to_byte();
    token.chars().map(|c| table.get(&c).copied()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_a_bijection() {
        let table = byte_to_char();
        assert_eq!(char_to_byte().len(), 256);
        let all: Vec<u8> = (0..=255u8).collect();
        let spelled: String = all.iter().map(|&b| table[usize::from(b)]).collect();
        assert_eq!(unspell(&spelled), Some(all));
    }
}
