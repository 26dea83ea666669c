//! `tojson` for chat templates, byte-for-byte like Python's `json.dumps` as Hugging Face calls it
//! (`ensure_ascii=False`, `indent`, `separators`, `sort_keys`), because templates print tool schemas and arguments
//! with it and the model was trained on exactly that text. minijinja's own `tojson` is compact and HTML-escapes, so
//! it is replaced.

use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// The output options of one `tojson` call.
struct Options {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

/// The `tojson` filter: `x | tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False)`; the same
/// parameters may also be given by position, in that order.
pub(crate) fn tojson(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let pick = |pos: usize, name: &str| -> Result<Option<Value>, Error> {
        let named: Option<Value> = kwargs.get(name)?;
        Ok(named.or_else(|| args.get(pos).cloned()).filter(|v| !v.is_none() && !v.is_undefined()))
    };
    let ensure_ascii = pick(0, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let indent = match pick(1, "indent")? {
        None => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
        Some(v) => {
            let n = i64::try_from(v).map_err(|_| invalid("tojson: indent must be an integer or a string"))?;
            Some(" ".repeat(usize::try_from(n).unwrap_or(0)))
        }
    };
    let (item_sep, key_sep) = match pick(2, "separators")? {
        Some(v) => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] => (a.as_str().unwrap_or_default().to_owned(), b.as_str().unwrap_or_default().to_owned()),
                _ => return Err(invalid("tojson: separators must be a pair of strings")),
            }
        }
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    let sort_keys = pick(3, "sort_keys")?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let options = Options { ensure_ascii, indent, item_sep, key_sep, sort_keys };
    let mut out = String::new();
    write_value(&mut out, value, &options, 0)?;
    Ok(Value::from(out))
}

fn invalid(message: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, message.to_owned())
}

fn write_value(out: &mut String, value: &Value, options: &Options, depth: usize) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value),
        ValueKind::String => write_string(out, value.as_str().unwrap_or_default(), options.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, '[', ']', items.len(), options, depth, |out, i| {
                write_value(out, &items[i], options, depth + 1)
            })?;
        }
        ValueKind::Map | ValueKind::Plain => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((key_string(&key)?, item));
            }
            if options.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(out, '{', '}', entries.len(), options, depth, |out, i| {
                let (key, item) = &entries[i];
                write_string(out, key, options.ensure_ascii);
                out.push_str(&options.key_sep);
                write_value(out, item, options, depth + 1)
            })?;
        }
        ValueKind::Undefined => return Err(invalid("tojson: cannot serialize an undefined value")),
        _ => return Err(invalid(&format!("tojson: cannot serialize a value of kind {}", value.kind()))),
    }
    Ok(())
}

/// `[`/`{` + items + `]`/`}`, on one line or one item per line when an indent is set; empty ones stay `[]`/`{}`.
fn write_container(
    out: &mut String,
    open: char,
    close: char,
    len: usize,
    options: &Options,
    depth: usize,
    mut item: impl FnMut(&mut String, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(indent) = &options.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(indent);
            }
        }
    };
    for i in 0..len {
        if i > 0 {
            out.push_str(&options.item_sep);
        }
        newline(out, depth + 1);
        item(out, i)?;
    }
    newline(out, depth);
    out.push(close);
    Ok(())
}

/// Python turns non-string keys into strings: `True` -> "true", `None` -> "null", numbers as they print.
fn key_string(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_owned()),
        ValueKind::None => Ok("null".to_owned()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_owned()),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, key);
            Ok(s)
        }
        _ => Err(invalid("tojson: keys must be strings, numbers, booleans or None")),
    }
}

fn write_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        out.push_str(&value.to_string());
        return;
    }
    let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    out.push_str(&python_float_repr(f));
}

/// Python's `repr(float)` (what `json.dumps` prints): shortest round-trip digits, positional between 1e-4 and 1e16,
/// else `d.ddde+XX` with at least two exponent digits.
pub(crate) fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.to_owned();
    }
    // Rust's Debug output uses the same shortest digits and the same switch points, only a different exponent form.
    let s = format!("{f:?}");
    match s.split_once('e') {
        None => s,
        Some((mantissa, exp)) => {
            let (sign, digits) = match exp.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', exp),
            };
            format!("{mantissa}e{sign}{digits:0>2}")
        }
    }
}

fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}
