//! What a request constrains its output to, in the forms vLLM's structured outputs take, and their translation to
//! llguidance's grammars (as vLLM's guidance backend translates them: JSON with flexible whitespace, `json_object`
//! as the schema `{"type": "object"}`, a choice as alternatives of literal strings).

use llguidance::api::TopLevelGrammar;
use serde_json::Value;

use super::compiler::GrammarError;
use super::gbnf;
use super::regex_classes::{ascii_classes, schema_ascii_classes};

/// One structured-output constraint.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// Output is JSON valid against this JSON schema.
    JsonSchema(Value),
    /// Output is any JSON object.
    JsonObject,
    /// Output matches this regular expression (Rust `regex` syntax, as llguidance reads it, with `\d` as `[0-9]`
    /// as vLLM reads it), whole.
    Regex(String),
    /// Output is exactly one of these strings.
    Choice(Vec<String>),
    /// Output is a sentence of this grammar: Lark syntax, or GBNF-style EBNF (`root ::= ...`) as llguidance's Lark
    /// reader also accepts.
    Grammar(String),
}

impl GrammarSpec {
    /// A key equal for equal specs (the compile cache's).
    pub(crate) fn cache_key(&self) -> String {
        match self {
            GrammarSpec::JsonSchema(v) => format!("json:{v}"),
            GrammarSpec::JsonObject => "json_object".to_owned(),
            GrammarSpec::Regex(r) => format!("regex:{r}"),
            GrammarSpec::Choice(c) => format!("choice:{}", Value::from(c.clone())),
            GrammarSpec::Grammar(g) => format!("grammar:{g}"),
        }
    }

    /// The llguidance grammar of this spec. Only a choice can fail here (an empty list); everything else is checked
    /// when the grammar is compiled.
    pub(crate) fn to_llguidance(&self) -> Result<TopLevelGrammar, GrammarError> {
        Ok(match self {
            GrammarSpec::JsonSchema(schema) => TopLevelGrammar::from_json_schema(schema_ascii_classes(schema)),
            GrammarSpec::JsonObject => TopLevelGrammar::from_json_schema(serde_json::json!({"type": "object"})),
            GrammarSpec::Regex(r) => TopLevelGrammar::from_regex(&ascii_classes(r)),
            GrammarSpec::Choice(choices) => {
                if choices.is_empty() {
                    return Err(GrammarError("a choice needs at least one string".to_owned()));
                }
                // Lark string literals take JSON's escapes.
                let alternatives: Vec<String> = choices.iter().map(|c| Value::from(c.as_str()).to_string()).collect();
                TopLevelGrammar::from_lark(format!("start: {}", alternatives.join(" | ")))
            }
            GrammarSpec::Grammar(g) if gbnf::is_gbnf(g) => {
                TopLevelGrammar::from_lark(gbnf::to_lark(g).map_err(GrammarError)?)
            }
            GrammarSpec::Grammar(g) => TopLevelGrammar::from_lark(g.clone()),
        })
    }
}
