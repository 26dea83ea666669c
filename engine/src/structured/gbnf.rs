//! GBNF (llama.cpp's EBNF, `root ::= ...`, which vLLM's `grammar` also takes) rewritten as the Lark grammar that
//! llguidance reads: `::=` becomes `:`, dashed rule names get underscores, character classes become regex
//! terminals, each rule is one line, and `start` derives `root`. Strings, grouping, alternation and the `* + ?
//! {m,n}` repetitions mean the same in both.
//!
//! llguidance's Rust crate reads only Lark; its GBNF converter is Python.

/// Whether a grammar is GBNF rather than Lark: a rule is defined with `::=` outside a string or class.
pub fn is_gbnf(grammar: &str) -> bool {
    tokens(grammar).is_ok_and(|t| t.iter().any(|t| matches!(t, Tok::Define)))
}

/// The Lark grammar of a GBNF grammar.
pub fn to_lark(grammar: &str) -> Result<String, String> {
    let toks = tokens(grammar)?;
    let mut rules: Vec<(String, Vec<String>)> = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        match (&toks[i], toks.get(i + 1)) {
            (Tok::Name(n), Some(Tok::Define)) => {
                rules.push((lark_name(n), Vec::new()));
                i += 2;
                continue;
            }
            (t, _) => {
                let Some((_, body)) = rules.last_mut() else {
                    return Err(format!("the grammar must start with a rule definition (name ::= ...), found {t}"));
                };
                body.push(match t {
                    Tok::Name(n) => lark_name(n),
                    other => other.to_string(),
                });
            }
        }
        i += 1;
    }
    if rules.is_empty() {
        return Err("the grammar defines no rule".to_owned());
    }
    let mut out = String::new();
    if !rules.iter().any(|(n, _)| n == "start") {
        if !rules.iter().any(|(n, _)| n == "root") {
            return Err("the grammar has no 'root' rule".to_owned());
        }
        out.push_str("start: root\n");
    }
    for (name, body) in rules {
        if body.is_empty() {
            return Err(format!("rule '{name}' is empty"));
        }
        out.push_str(&name);
        out.push(':');
        for t in body {
            // Repetitions and a closing parenthesis stick to what they follow.
            if !matches!(t.chars().next(), Some('*' | '+' | '?' | '{' | ')')) {
                out.push(' ');
            }
            out.push_str(&t);
        }
        out.push('\n');
    }
    Ok(out)
}

fn lark_name(gbnf: &str) -> String {
    gbnf.replace('-', "_").to_lowercase()
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Name(String),
    Define,
    /// A string literal, kept with its quotes and escapes (GBNF's escapes are JSON's and Lark's too).
    Str(String),
    /// A character class, kept with its brackets.
    Class(String),
    /// `| ( ) * + ?` and `{m,n}`.
    Punct(String),
}

impl std::fmt::Display for Tok {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tok::Name(n) => f.write_str(n),
            Tok::Define => f.write_str("::="),
            Tok::Str(s) | Tok::Punct(s) => f.write_str(s),
            // A class as a regex terminal; a '/' inside must not end it.
            Tok::Class(c) => write!(f, "/{}/", c.replace('/', "\\/")),
        }
    }
}

fn tokens(src: &str) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() => i += 1,
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            ':' if chars[i..].starts_with(&[':', ':', '=']) => {
                out.push(Tok::Define);
                i += 3;
            }
            '"' | '[' => {
                let close = if c == '"' { '"' } else { ']' };
                let start = i;
                i += 1;
                while i < chars.len() && chars[i] != close {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
                if i >= chars.len() {
                    return Err(format!(
                        "unterminated {} starting at character {start}",
                        if c == '"' { "string" } else { "character class" }
                    ));
                }
                i += 1;
                let text: String = chars[start..i].iter().collect();
                out.push(if c == '"' { Tok::Str(text) } else { Tok::Class(text) });
            }
            '{' => {
                let start = i;
                while i < chars.len() && chars[i] != '}' {
                    i += 1;
                }
                if i >= chars.len() {
                    return Err(format!("unterminated repetition starting at character {start}"));
                }
                i += 1;
                out.push(Tok::Punct(chars[start..i].iter().filter(|c| !c.is_whitespace()).collect()));
            }
            '|' | '(' | ')' | '*' | '+' | '?' => {
                out.push(Tok::Punct(c.to_string()));
                i += 1;
            }
            c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                let start = i;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '-' || chars[i] == '_') {
                    i += 1;
                }
                out.push(Tok::Name(chars[start..i].iter().collect()));
            }
            other => return Err(format!("unexpected character '{other}' at character {i}")),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gbnf_rules_become_lark_rules() {
        let g = "root ::= greeting \" \" name # a comment\ngreeting ::= \"hi\" | \"hello\"\nname ::= [a-z]+ (\"-\" [a-z/]+)?\n";
        assert!(is_gbnf(g));
        assert_eq!(
            to_lark(g).unwrap(),
            "start: root\nroot: greeting \" \" name\ngreeting: \"hi\" | \"hello\"\nname: /[a-z]/+ ( \"-\" /[a-z\\/]/+)?\n"
        );
    }

    #[test]
    fn dashed_names_repetitions_and_multiline_rules() {
        let g = "root ::= digit-run\ndigit-run ::= [0-9]{2, 4}\n  | \"x\"";
        assert_eq!(to_lark(g).unwrap(), "start: root\nroot: digit_run\ndigit_run: /[0-9]/{2,4} | \"x\"\n");
    }

    #[test]
    fn lark_is_not_gbnf_and_strings_hide_the_define_sign() {
        assert!(!is_gbnf("start: \"a ::= b\" | /x::=y/"));
        assert!(!is_gbnf("start: \"::=\""));
    }

    #[test]
    fn broken_gbnf_is_an_error() {
        assert!(to_lark("root ::= \"a").unwrap_err().contains("unterminated string"));
        assert!(to_lark("\"a\" root ::= \"b\"").unwrap_err().contains("must start with a rule"));
        assert!(to_lark("other ::= \"a\"").unwrap_err().contains("no 'root' rule"));
        assert!(to_lark("root ::= \"a\" ; x").unwrap_err().contains("unexpected character ';'"));
    }
}
