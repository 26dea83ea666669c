//! `\d`, `\w` and `\s` as vLLM's structured outputs read them (xgrammar, its default backend): ASCII classes
//! (`[0-9]`, `[0-9A-Za-z_]`, `[ \t\n\r\f\v]`), not Unicode's (Rust's `regex` syntax, which llguidance follows, takes
//! them as Unicode classes, so a phone-number pattern could produce digits of other scripts and `\w+` letters of any
//! alphabet). Applied to regex constraints and to the `pattern`s of a JSON schema.

use serde_json::Value;

/// The ASCII members of `\d`, `\w` and `\s`, as written inside a class.
fn ascii_members(class: char) -> Option<&'static str> {
    match class {
        'd' => Some("0-9"),
        'w' => Some("0-9A-Za-z_"),
        's' => Some(" \\t\\n\\r\\f\\v"),
        _ => None,
    }
}

/// `re` with `\d`, `\w`, `\s` as their ASCII classes (inside a class: their members) and `\D`, `\W`, `\S` outside a
/// class as the negated classes; every other escape, and the negated ones inside a class, as written.
pub fn ascii_classes(re: &str) -> String {
    let mut out = String::with_capacity(re.len() + 8);
    let mut chars = re.chars().peekable();
    // Depth of `[...]` classes (nested classes are Rust regex syntax); a `]` right after `[` or `[^` is literal.
    let mut depth = 0usize;
    let mut class_start = false;
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e) if ascii_members(e).is_some() => {
                    let members = ascii_members(e).unwrap_or_default();
                    if depth == 0 {
                        out.push('[');
                        out.push_str(members);
                        out.push(']');
                    } else {
                        out.push_str(members);
                    }
                }
                Some(e) if depth == 0 && ascii_members(e.to_ascii_lowercase()).is_some() && e.is_ascii_uppercase() => {
                    out.push_str("[^");
                    out.push_str(ascii_members(e.to_ascii_lowercase()).unwrap_or_default());
                    out.push(']');
                }
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

/// `schema` with `ascii_classes` applied to every `pattern` keyword and every `patternProperties` key.
pub fn schema_ascii_classes(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = match (k.as_str(), v) {
                        ("pattern", Value::String(p)) => Value::String(ascii_classes(p)),
                        ("patternProperties", Value::Object(props)) => Value::Object(
                            props.iter().map(|(p, s)| (ascii_classes(p), schema_ascii_classes(s))).collect(),
                        ),
                        _ => schema_ascii_classes(v),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(schema_ascii_classes).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digit_classes_become_ascii_and_other_escapes_stay() {
        assert_eq!(ascii_classes(r"\d{3}-\d{4}"), "[0-9]{3}-[0-9]{4}");
        assert_eq!(ascii_classes(r"[\d_]+\D"), "[0-9_]+[^0-9]");
        assert_eq!(ascii_classes(r"\\d\.\q"), r"\\d\.\q");
        assert_eq!(ascii_classes(r"[]\d][^\d]"), "[]0-9][^0-9]");
        assert_eq!(ascii_classes(r"[\D]"), r"[\D]");
        assert_eq!(ascii_classes("trailing\\"), "trailing\\");
    }

    #[test]
    fn word_and_space_classes_become_ascii() {
        assert_eq!(ascii_classes(r"\w+\s\W\S"), r"[0-9A-Za-z_]+[ \t\n\r\f\v][^0-9A-Za-z_][^ \t\n\r\f\v]");
        assert_eq!(ascii_classes(r"[\w.-]+@"), r"[0-9A-Za-z_.-]+@");
        assert_eq!(ascii_classes(r"[\s,]"), r"[ \t\n\r\f\v,]");
        assert_eq!(ascii_classes(r"[\W]"), r"[\W]");
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
        assert_eq!(schema_ascii_classes(&s), want);
    }
}
