//! `\d` as vLLM's structured outputs read it: the ASCII digits `[0-9]`, not every Unicode digit (Rust's `regex`
//! syntax, which llguidance follows, takes `\d` as Unicode's `Nd` class, so a phone-number pattern could produce
//! digits of other scripts). Applied to regex constraints and to the `pattern`s of a JSON schema.

use serde_json::Value;

/// `re` with `\d` as `[0-9]` (inside a class: `0-9`) and `\D` outside a class as `[^0-9]`; every other escape, and
/// `\D` inside a class, as written.
pub fn ascii_digits(re: &str) -> String {
    let mut out = String::with_capacity(re.len() + 8);
    let mut chars = re.chars().peekable();
    // Depth of `[...]` classes (nested classes are Rust regex syntax); a `]` right after `[` or `[^` is literal.
    let mut depth = 0usize;
    let mut class_start = false;
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('d') if depth == 0 => out.push_str("[0-9]"),
                Some('d') => out.push_str("0-9"),
                Some('D') if depth == 0 => out.push_str("[^0-9]"),
                Some(e) => {
                    out.push('\\');
                    out.push(e);
                }
                None => out.push('\\'),
            },
            '[' => {
                depth += 1;
                out.push('[');
                if chars.peek() == Some(&'^') {
                    out.push(chars.next().unwrap_or('^'));
                }
                class_start = true;
                continue;
            }
            ']' if depth > 0 && !class_start => {
                depth -= 1;
                out.push(']');
            }
            _ => out.push(c),
        }
        class_start = false;
    }
    out
}

/// `schema` with `ascii_digits` applied to every `pattern` keyword and every `patternProperties` key.
pub fn schema_ascii_digits(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = match (k.as_str(), v) {
                        ("pattern", Value::String(p)) => Value::String(ascii_digits(p)),
                        ("patternProperties", Value::Object(props)) => Value::Object(
                            props.iter().map(|(p, s)| (ascii_digits(p), schema_ascii_digits(s))).collect(),
                        ),
                        _ => schema_ascii_digits(v),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(schema_ascii_digits).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digit_classes_become_ascii_and_other_escapes_stay() {
        assert_eq!(ascii_digits(r"\d{3}-\d{4}"), "[0-9]{3}-[0-9]{4}");
        assert_eq!(ascii_digits(r"[\d_]+\D"), "[0-9_]+[^0-9]");
        assert_eq!(ascii_digits(r"\\d\.\w"), r"\\d\.\w");
        assert_eq!(ascii_digits(r"[]\d][^\d]"), "[]0-9][^0-9]");
        assert_eq!(ascii_digits(r"[\D]"), r"[\D]");
        assert_eq!(ascii_digits("trailing\\"), "trailing\\");
    }

    #[test]
    fn schema_patterns_are_rewritten_everywhere_and_nothing_else() {
        let s = serde_json::json!({
            "type": "object",
            "properties": {"phone": {"type": "string", "pattern": r"^\d+$"}, "pattern": {"type": "string"}},
            "patternProperties": {r"^x\d$": {"pattern": r"\d"}},
            "description": r"\d stays in prose"
        });
        let want = serde_json::json!({
            "type": "object",
            "properties": {"phone": {"type": "string", "pattern": "^[0-9]+$"}, "pattern": {"type": "string"}},
            "patternProperties": {"^x[0-9]$": {"pattern": "[0-9]"}},
            "description": r"\d stays in prose"
        });
        assert_eq!(schema_ascii_digits(&s), want);
    }
}
