//! How `{{ value }}` prints in a chat template: as Python's `str()` would, since Hugging Face renders templates with
//! Jinja2 on Python values. `True`/`False`/`None` instead of minijinja's `true`/`false`/`none`, floats as Python
//! repr, lists and dicts as `['a', 1]` / `{'k': None}` with Python string quoting. Strings print as they are.
//!
//! Boundary: which non-ASCII characters Python counts as unprintable (escaped inside a quoted string) is
//! approximated by the common format, separator and private-use characters; assigned-ness is not checked.

use std::fmt::Write;

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind, Output, State};

use super::pyjson::python_float_repr;

/// The environment's formatter.
pub(crate) fn format(out: &mut Output, state: &State, value: &Value) -> Result<(), Error> {
    match value.kind() {
        ValueKind::String | ValueKind::Undefined => minijinja::escape_formatter(out, state, value),
        _ => {
            let mut text = String::new();
            write_str_of(&mut text, value)?;
            out.write_str(&text).map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string()))
        }
    }
}

/// Python's `str(value)`: like `repr` except that a top-level string is itself.
fn write_str_of(out: &mut String, value: &Value) -> Result<(), Error> {
    match value.kind() {
        ValueKind::String => out.push_str(value.as_str().unwrap_or_default()),
        _ => write_repr(out, value)?,
    }
    Ok(())
}

fn write_repr(out: &mut String, value: &Value) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number if value.is_integer() => out.push_str(&value.to_string()),
        ValueKind::Number => out.push_str(&python_float_repr(f64::try_from(value.clone()).unwrap_or(f64::NAN))),
        ValueKind::String => write_quoted(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq => {
            out.push('[');
            for (i, item) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &item)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &key)?;
                out.push_str(": ");
                write_repr(out, &value.get_item(&key)?)?;
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
    Ok(())
}

/// Python's `repr(str)`: single quotes unless the text has a `'` and no `"`.
fn write_quoted(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if is_unprintable(c) => {
                let code = c as u32;
                let _ = match code {
                    0..=0xFF => write!(out, "\\x{code:02x}"),
                    0x100..=0xFFFF => write!(out, "\\u{code:04x}"),
                    _ => write!(out, "\\U{code:08x}"),
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

fn is_unprintable(c: char) -> bool {
    matches!(c as u32,
        0x00..=0x1F | 0x7F..=0xA0 | 0xAD
        | 0x600..=0x605 | 0x61C | 0x6DD | 0x70F | 0x1680 | 0x180E
        | 0x2000..=0x200F | 0x2028..=0x202F | 0x205F..=0x2064 | 0x2066..=0x206F
        | 0x3000 | 0xD800..=0xF8FF | 0xFEFF | 0xFFF9..=0xFFFB
        | 0xF0000..=0x10FFFF)
}
