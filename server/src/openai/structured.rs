//! Structured-output request fields to one engine `GrammarSpec`: OpenAI's `response_format` (`json_object`,
//! `json_schema`), vLLM's `structured_outputs` object (`json`, `regex`, `choice`, `grammar`, `json_object` and the
//! JSON options `disable_any_whitespace`, `disable_additional_properties`, `whitespace_pattern`) and vLLM's older
//! `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar` (+ `guided_whitespace_pattern`) fields.
//!
//! A request may set one constraint in all (as vLLM: "only one kind of structured outputs constraint"). Shapes are
//! checked here; whether a schema, regex or grammar compiles is the grammar engine's answer, also a 400.

use rserve_engine::structured::GrammarSpec;
use serde_json::{Map, Value};

use super::types::SamplingFields;
use super::validate::ValidationError;

type Result<T> = std::result::Result<T, ValidationError>;

/// A constraint and the field that asked for it (the one a compile error names).
#[derive(Debug, Clone, PartialEq)]
pub struct Requested {
    pub field: &'static str,
    pub spec: GrammarSpec,
}

fn invalid(field: &str, message: impl Into<String>) -> ValidationError {
    ValidationError::StructuredOutput { field: field.to_owned(), message: message.into() }
}

/// The JSON-generation options vLLM takes next to a constraint.
#[derive(Debug, Default)]
struct JsonOptions {
    disable_any_whitespace: bool,
    disable_additional_properties: bool,
    whitespace_pattern: Option<String>,
}

/// The request's constraint, if it asks for one.
pub fn requested(f: &SamplingFields) -> Result<Option<Requested>> {
    let mut found: Vec<Requested> = Vec::new();
    let mut options = JsonOptions::default();
    if let Some(rf) = &f.response_format {
        if let Some(spec) = response_format(rf)? {
            found.push(Requested { field: "response_format", spec });
        }
    }
    if let Some(so) = f.structured_outputs.as_ref().filter(|v| !v.is_null()) {
        let (spec, opts) = structured_outputs(so)?;
        options = opts;
        found.push(Requested { field: "structured_outputs", spec });
    }
    if let Some(v) = f.guided_json.as_ref().filter(|v| !v.is_null()) {
        found.push(Requested { field: "guided_json", spec: GrammarSpec::JsonSchema(json_schema("guided_json", v)?) });
    }
    if let Some(v) = f.guided_regex.as_ref().filter(|v| !v.is_null()) {
        found.push(Requested { field: "guided_regex", spec: GrammarSpec::Regex(string("guided_regex", v)?) });
    }
    if let Some(v) = f.guided_choice.as_ref().filter(|v| !v.is_null()) {
        found.push(Requested { field: "guided_choice", spec: GrammarSpec::Choice(choice("guided_choice", v)?) });
    }
    if let Some(v) = f.guided_grammar.as_ref().filter(|v| !v.is_null()) {
        found.push(Requested { field: "guided_grammar", spec: GrammarSpec::Grammar(string("guided_grammar", v)?) });
    }
    if let Some(v) = f.guided_whitespace_pattern.as_ref().filter(|v| !v.is_null()) {
        options.whitespace_pattern = Some(string("guided_whitespace_pattern", v)?);
    }
    if found.len() > 1 {
        return Err(invalid(
            found[1].field,
            format!(
                "only one kind of structured outputs constraint may be used, but {} and {} are both set",
                found[0].field, found[1].field
            ),
        ));
    }
    Ok(found.pop().map(|mut r| {
        r.spec = with_json_options(r.spec, &options);
        r
    }))
}

/// `response_format`: `text` asks for nothing; `json_object` and `json_schema` for JSON.
fn response_format(rf: &Value) -> Result<Option<GrammarSpec>> {
    const F: &str = "response_format";
    let obj = rf.as_object().ok_or_else(|| invalid(F, "must be an object with a 'type'"))?;
    match obj.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(GrammarSpec::JsonObject)),
        Some("json_schema") => {
            let js = obj
                .get("json_schema")
                .and_then(Value::as_object)
                .ok_or_else(|| invalid(F, "type 'json_schema' needs a 'json_schema' object"))?;
            let schema = js
                .get("schema")
                .filter(|s| !s.is_null())
                .ok_or_else(|| invalid(F, "json_schema needs a 'schema' (the JSON schema of the output)"))?;
            Ok(Some(GrammarSpec::JsonSchema(json_schema("response_format.json_schema.schema", schema)?)))
        }
        Some("structural_tag") => Err(invalid(F, "type 'structural_tag' is not supported by this server")),
        Some(other) => {
            Err(invalid(F, format!("unknown type '{other}' (expected 'text', 'json_object' or 'json_schema')")))
        }
        None => Err(invalid(F, "must have a string 'type'")),
    }
}

/// vLLM's `structured_outputs` object: exactly one constraint, and the JSON options.
fn structured_outputs(v: &Value) -> Result<(GrammarSpec, JsonOptions)> {
    const F: &str = "structured_outputs";
    let obj = v.as_object().ok_or_else(|| invalid(F, "must be an object"))?;
    let set = |k: &str| obj.get(k).filter(|v| !v.is_null());
    let kinds = ["json", "regex", "choice", "grammar", "json_object", "structural_tag"];
    let present: Vec<&str> = kinds.iter().copied().filter(|k| set(k).is_some()).collect();
    let kind = match present.as_slice() {
        [one] => *one,
        [] => return Err(invalid(F, format!("must set one constraint of {}", kinds.join(", ")))),
        many => {
            return Err(invalid(
                F,
                format!("only one kind of structured outputs constraint may be used, got {}", many.join(", ")),
            ))
        }
    };
    let value = set(kind).unwrap_or(&Value::Null);
    let field = |k: &str| format!("{F}.{k}");
    let spec = match kind {
        "json" => GrammarSpec::JsonSchema(json_schema(&field("json"), value)?),
        "regex" => GrammarSpec::Regex(string(&field("regex"), value)?),
        "choice" => GrammarSpec::Choice(choice(&field("choice"), value)?),
        "grammar" => GrammarSpec::Grammar(string(&field("grammar"), value)?),
        "json_object" => match value {
            Value::Bool(true) => GrammarSpec::JsonObject,
            _ => return Err(invalid(&field("json_object"), "must be true")),
        },
        _ => return Err(invalid(&field("structural_tag"), "structural tags are not supported by this server")),
    };
    let flag = |k: &str| -> Result<bool> {
        match set(k) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(invalid(&field(k), "must be a boolean")),
        }
    };
    let options = JsonOptions {
        disable_any_whitespace: flag("disable_any_whitespace")?,
        disable_additional_properties: flag("disable_additional_properties")?,
        whitespace_pattern: set("whitespace_pattern").map(|v| string(&field("whitespace_pattern"), v)).transpose()?,
    };
    Ok((spec, options))
}

/// A JSON schema given as an object (or a boolean schema), or as JSON text.
fn json_schema(field: &str, v: &Value) -> Result<Value> {
    match v {
        Value::Object(_) | Value::Bool(_) => Ok(v.clone()),
        Value::String(s) => {
            let parsed: Value =
                serde_json::from_str(s).map_err(|e| invalid(field, format!("is not valid JSON: {e}")))?;
            json_schema(field, &parsed)
        }
        _ => Err(invalid(field, "must be a JSON schema (an object)")),
    }
}

fn string(field: &str, v: &Value) -> Result<String> {
    match v {
        Value::String(s) if !s.is_empty() => Ok(s.clone()),
        Value::String(_) => Err(invalid(field, "must not be empty")),
        _ => Err(invalid(field, "must be a string")),
    }
}

fn choice(field: &str, v: &Value) -> Result<Vec<String>> {
    let items = v.as_array().ok_or_else(|| invalid(field, "must be a list of strings"))?;
    if items.is_empty() {
        return Err(invalid(field, "must hold at least one string"));
    }
    items
        .iter()
        .map(|i| i.as_str().map(str::to_owned).ok_or_else(|| invalid(field, "must be a list of strings")))
        .collect()
}

/// Applies vLLM's JSON options to a JSON constraint (other kinds ignore them, as vLLM does): whitespace and
/// additional properties through llguidance's `x-guidance` schema options.
fn with_json_options(spec: GrammarSpec, o: &JsonOptions) -> GrammarSpec {
    if !o.disable_any_whitespace && !o.disable_additional_properties && o.whitespace_pattern.is_none() {
        return spec;
    }
    let mut schema = match spec {
        GrammarSpec::JsonSchema(s) => s,
        GrammarSpec::JsonObject => serde_json::json!({"type": "object"}),
        other => return other,
    };
    if o.disable_additional_properties {
        close_objects(&mut schema);
    }
    if let Value::Object(m) = &mut schema {
        let mut guidance = Map::new();
        if o.disable_any_whitespace {
            guidance.insert("whitespace_flexible".into(), Value::Bool(false));
        }
        if let Some(p) = &o.whitespace_pattern {
            guidance.insert("whitespace_pattern".into(), Value::String(p.clone()));
        }
        if !guidance.is_empty() {
            m.insert("x-guidance".into(), Value::Object(guidance));
        }
    }
    GrammarSpec::JsonSchema(schema)
}

/// `additionalProperties: false` on every object schema with `properties` that does not say otherwise (vLLM's
/// `disable_additional_properties`), through every subschema.
fn close_objects(v: &mut Value) {
    match v {
        Value::Object(m) => {
            if m.get("properties").is_some_and(Value::is_object) && !m.contains_key("additionalProperties") {
                m.insert("additionalProperties".into(), Value::Bool(false));
            }
            for (_, child) in m.iter_mut() {
                close_objects(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(close_objects),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn fields(body: Value) -> SamplingFields {
        let req: super::super::types::CompletionRequest = serde_json::from_value(
            json!({"prompt": "x"})
                .as_object()
                .unwrap()
                .clone()
                .into_iter()
                .chain(body.as_object().unwrap().clone())
                .collect::<Map<String, Value>>()
                .into(),
        )
        .expect("request");
        req.sampling
    }

    fn spec(body: Value) -> Result<Option<Requested>> {
        requested(&fields(body))
    }

    fn err_field(body: Value) -> String {
        let e = spec(body.clone()).expect_err(&body.to_string());
        assert!(matches!(e, ValidationError::StructuredOutput { .. }), "{e:?}");
        e.param().unwrap()
    }

    #[test]
    fn each_form_gives_its_spec() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let cases = [
            (json!({"response_format": {"type": "json_object"}}), "response_format", GrammarSpec::JsonObject),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": true}}}),
                "response_format",
                GrammarSpec::JsonSchema(schema.clone()),
            ),
            (
                json!({"structured_outputs": {"json": schema.to_string()}}),
                "structured_outputs",
                GrammarSpec::JsonSchema(schema.clone()),
            ),
            (json!({"structured_outputs": {"regex": "a+"}}), "structured_outputs", GrammarSpec::Regex("a+".into())),
            (
                json!({"structured_outputs": {"choice": ["x", "y"]}}),
                "structured_outputs",
                GrammarSpec::Choice(vec!["x".into(), "y".into()]),
            ),
            (
                json!({"structured_outputs": {"grammar": "start: \"a\""}}),
                "structured_outputs",
                GrammarSpec::Grammar("start: \"a\"".into()),
            ),
            (json!({"structured_outputs": {"json_object": true}}), "structured_outputs", GrammarSpec::JsonObject),
            (json!({"guided_json": schema}), "guided_json", GrammarSpec::JsonSchema(schema.clone())),
            (json!({"guided_regex": "b"}), "guided_regex", GrammarSpec::Regex("b".into())),
            (json!({"guided_choice": ["z"]}), "guided_choice", GrammarSpec::Choice(vec!["z".into()])),
            (
                json!({"guided_grammar": "root ::= \"a\""}),
                "guided_grammar",
                GrammarSpec::Grammar("root ::= \"a\"".into()),
            ),
        ];
        for (body, field, want) in cases {
            assert_eq!(spec(body.clone()).unwrap(), Some(Requested { field, spec: want }), "{body}");
        }
        for none in [json!({}), json!({"response_format": {"type": "text"}}), json!({"guided_json": null})] {
            assert_eq!(spec(none).unwrap(), None);
        }
    }

    #[test]
    fn json_options_become_schema_options() {
        let got = spec(json!({"structured_outputs": {"json": {"type": "object", "properties": {"a": {"type": "object",
            "properties": {}}}}, "disable_any_whitespace": true, "disable_additional_properties": true}}))
        .unwrap()
        .unwrap();
        assert_eq!(
            got.spec,
            GrammarSpec::JsonSchema(json!({"type": "object", "additionalProperties": false,
                "properties": {"a": {"type": "object", "properties": {}, "additionalProperties": false}},
                "x-guidance": {"whitespace_flexible": false}}))
        );
        let got = spec(json!({"guided_json": {"type": "object"}, "guided_whitespace_pattern": " ?"})).unwrap().unwrap();
        assert_eq!(
            got.spec,
            GrammarSpec::JsonSchema(json!({"type": "object", "x-guidance": {"whitespace_pattern": " ?"}}))
        );
    }

    #[test]
    fn bad_shapes_name_their_field() {
        assert_eq!(err_field(json!({"response_format": {"type": "xml"}})), "response_format");
        assert_eq!(err_field(json!({"response_format": {"type": "json_schema"}})), "response_format");
        assert_eq!(
            err_field(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}})),
            "response_format"
        );
        assert_eq!(err_field(json!({"structured_outputs": {}})), "structured_outputs");
        assert_eq!(err_field(json!({"structured_outputs": {"regex": "a", "choice": ["b"]}})), "structured_outputs");
        assert_eq!(err_field(json!({"structured_outputs": {"choice": "a"}})), "structured_outputs.choice");
        assert_eq!(err_field(json!({"structured_outputs": {"json": "{not json"}})), "structured_outputs.json");
        assert_eq!(err_field(json!({"structured_outputs": {"json_object": false}})), "structured_outputs.json_object");
        assert_eq!(err_field(json!({"guided_choice": []})), "guided_choice");
        assert_eq!(err_field(json!({"guided_regex": 5})), "guided_regex");
        // Two constraints at once: the second one named.
        assert_eq!(err_field(json!({"response_format": {"type": "json_object"}, "guided_regex": "a"})), "guided_regex");
    }
}
