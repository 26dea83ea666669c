//! The grammar engine on real vocabularies (SmolLM2's GGUF byte-level BPE, Llama 3's 128k tokenizer.json):
//! whatever allowed tokens are picked, one after another, the text is a sentence of the grammar, and the end is
//! allowed exactly when it is complete. Bad specs are errors; compiled grammars are cached per spec.

mod tokenizer_support;

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rserve_engine::sampling::masks::apply_bits;
use rserve_engine::structured::{apply_mask, Constraint, GrammarCompiler, GrammarSpec};
use rserve_engine::tokenizer::Tokenizer;
use rserve_engine::TokenId;
use serde_json::{json, Value};

/// Logit rows are this much wider than SmolLM2's vocabulary in these tests: the ids past the tokenizer's are
/// never allowed.
const PADDING: usize = 37;

fn compiler(tok: &Arc<Tokenizer>) -> (GrammarCompiler, Vec<TokenId>, usize) {
    let eos = tok.eos_token_ids();
    let vocab = tok.vocab_size() + PADDING;
    (GrammarCompiler::new(tok.clone(), vocab, &eos).expect("grammar engine"), eos, vocab)
}

/// Picks allowed tokens at random (preferring the end once it is allowed) until the end is picked; returns the
/// text, or `None` if the walk ran past `max_steps`.
fn random_walk(tok: &Tokenizer, c: &mut Constraint, eos: &[TokenId], vocab: usize, seed: u64) -> Option<String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut ids = Vec::new();
    for _ in 0..400 {
        let mask = c.next_mask().expect("mask");
        let mut logits = vec![0.0f32; vocab];
        apply_mask(&mut logits, &mask);
        let allowed: Vec<u32> = (0..vocab as u32).filter(|&i| logits[i as usize] == 0.0).collect();
        assert_eq!(allowed.len(), mask.count(), "the mask and the masked row agree");
        // The same mask as a row of a step's masks (what the runners apply, on the device or the host).
        let mut words = vec![0u32; vocab.div_ceil(32)];
        mask.write_words(&mut words);
        let mut row = vec![0.0f32; vocab];
        apply_bits(&mut row, &words);
        assert_eq!(row, logits, "the step mask's words allow exactly what the mask allows");
        assert!(allowed.iter().all(|&i| (i as usize) < tok.vocab_size()), "no padding id is ever allowed");
        let can_end = eos.iter().any(|e| mask.allows(*e));
        assert_eq!(can_end, c.is_complete(), "the end is allowed exactly when the output is complete");
        if can_end && (allowed.len() == 1 || rng.gen_bool(0.5)) {
            return Some(tok.decode(&ids, true).expect("decode"));
        }
        let pick = loop {
            let t = TokenId(allowed[rng.gen_range(0..allowed.len())]);
            if !eos.contains(&t) {
                break t;
            }
        };
        c.accept(pick).expect("an allowed token is accepted");
        ids.push(pick);
    }
    None
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "role": {"enum": ["admin", "user"]},
            "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
            "boss": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"id": {"type": "integer", "maximum": 999}},
                "required": ["id"], "additionalProperties": false}]}
        },
        "required": ["name", "age", "role", "tags", "boss"],
        "additionalProperties": false,
        "x-guidance": {"whitespace_flexible": false}
    })
}

fn check_person(v: &Value) {
    let o = v.as_object().expect("an object");
    assert_eq!(o.len(), 5, "exactly the five properties: {v}");
    assert!(o["name"].as_str().is_some_and(|s| s.chars().count() <= 6), "{v}");
    assert!(o["age"].as_i64().is_some_and(|a| (0..=120).contains(&a)), "{v}");
    assert!(matches!(o["role"].as_str(), Some("admin" | "user")), "{v}");
    assert!(o["tags"].as_array().is_some_and(|t| t.len() <= 2 && t.iter().all(Value::is_boolean)), "{v}");
    assert!(o["boss"].is_null() || o["boss"]["id"].is_i64(), "{v}");
}

#[test]
fn random_walks_through_a_json_schema_give_valid_json_on_both_vocabularies() {
    for tok in [tokenizer_support::smollm2(), tokenizer_support::llama3()] {
        let (compiler, eos, vocab) = compiler(&tok);
        let grammar = compiler.compile(&GrammarSpec::JsonSchema(person_schema())).expect("schema compiles");
        let mut finished = 0;
        for seed in 0..6 {
            let mut c = Constraint::new(&grammar);
            if let Some(text) = random_walk(&tok, &mut c, &eos, vocab, seed) {
                let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
                check_person(&v);
                finished += 1;
            }
        }
        assert!(finished >= 3, "most walks end within 400 tokens ({finished}/6)");
    }
}

#[test]
fn choices_regexes_and_grammars_hold() {
    let tok = tokenizer_support::smollm2();
    let (compiler, eos, vocab) = compiler(&tok);
    let choice =
        compiler.compile(&GrammarSpec::Choice(vec!["yes".into(), "no way".into(), "\"quoted\"".into()])).unwrap();
    let regex = compiler.compile(&GrammarSpec::Regex("[0-9]{3}-[a-c]{2,4}".into())).unwrap();
    let lark = compiler.compile(&GrammarSpec::Grammar("start: (\"ab\" | \"c\")+ \"!\"".into())).unwrap();
    let gbnf = compiler
        .compile(&GrammarSpec::Grammar("root ::= pair (\",\" pair){0,2}\npair ::= [xy] \"=\" [0-9]".into()))
        .unwrap();
    for seed in 0..8 {
        let text = random_walk(&tok, &mut Constraint::new(&choice), &eos, vocab, seed).expect("a choice ends");
        assert!(["yes", "no way", "\"quoted\""].contains(&text.as_str()), "{text:?}");
        let text = random_walk(&tok, &mut Constraint::new(&regex), &eos, vocab, seed).expect("the regex ends");
        let (digits, letters) = text.split_once('-').unwrap_or_else(|| panic!("{text:?}"));
        assert!(digits.len() == 3 && digits.bytes().all(|b| b.is_ascii_digit()), "{text:?}");
        assert!((2..=4).contains(&letters.len()) && letters.bytes().all(|b| (b'a'..=b'c').contains(&b)), "{text:?}");
        if let Some(text) = random_walk(&tok, &mut Constraint::new(&lark), &eos, vocab, seed) {
            let body = text.strip_suffix('!').unwrap_or_else(|| panic!("{text:?}"));
            assert!(!body.is_empty() && body.replace("ab", "").replace('c', "").is_empty(), "{text:?}");
        }
        let text = random_walk(&tok, &mut Constraint::new(&gbnf), &eos, vocab, seed).expect("the grammar ends");
        let pairs: Vec<&str> = text.split(',').collect();
        assert!((1..=3).contains(&pairs.len()), "{text:?}");
        for p in pairs {
            let b = p.as_bytes();
            assert!(
                b.len() == 3 && (b[0] == b'x' || b[0] == b'y') && b[1] == b'=' && b[2].is_ascii_digit(),
                "{text:?}"
            );
        }
    }
}

/// `\d` is an ASCII digit, as vLLM reads it (Rust regex syntax would allow every Unicode digit, reachable on a
/// byte-level vocabulary through byte tokens): in a regex and in a JSON schema's `pattern`, the first step allows
/// only tokens made of ASCII digits, and walks give ASCII digits only.
#[test]
fn a_digit_class_means_ascii_digits() {
    let tok = tokenizer_support::smollm2();
    let (compiler, eos, vocab) = compiler(&tok);
    let regex = compiler.compile(&GrammarSpec::Regex(r"\d{4}".into())).unwrap();
    let schema = json!({"type": "object", "properties": {"pin": {"type": "string", "pattern": r"^\d{4}$"}},
        "required": ["pin"], "additionalProperties": false});
    let schema = compiler.compile(&GrammarSpec::JsonSchema(schema)).unwrap();
    let mask = Constraint::new(&regex).next_mask().unwrap();
    let allowed: Vec<u32> = (0..tok.vocab_size() as u32).filter(|&i| mask.allows(TokenId(i))).collect();
    assert!(!allowed.is_empty());
    for id in allowed {
        let text = tok.decode(&[TokenId(id)], false).unwrap();
        assert!(!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()), "token {id} {text:?}");
    }
    for seed in 0..8 {
        let text = random_walk(&tok, &mut Constraint::new(&regex), &eos, vocab, seed).expect("the regex ends");
        assert!(text.len() == 4 && text.bytes().all(|b| b.is_ascii_digit()), "{text:?}");
        let text = random_walk(&tok, &mut Constraint::new(&schema), &eos, vocab, seed).expect("the schema ends");
        let pin = serde_json::from_str::<Value>(&text).unwrap()["pin"].as_str().unwrap().to_owned();
        assert!(pin.len() == 4 && pin.bytes().all(|b| b.is_ascii_digit()), "{text:?}");
    }
}

#[test]
fn bad_specs_are_errors_and_compiled_grammars_are_cached() {
    let tok = tokenizer_support::smollm2();
    let (compiler, _, _) = compiler(&tok);
    for bad in [
        GrammarSpec::Regex("[0-9".into()),
        GrammarSpec::Grammar("start: undefined_rule".into()),
        GrammarSpec::Grammar("root ::= \"a".into()),
        GrammarSpec::JsonSchema(json!({"type": "no-such-type"})),
        GrammarSpec::Choice(vec![]),
    ] {
        assert!(compiler.compile(&bad).is_err(), "{bad:?} must be refused");
    }
    let spec = GrammarSpec::JsonSchema(person_schema());
    let a = compiler.compile(&spec).unwrap();
    let b = compiler.compile(&spec).unwrap();
    assert_eq!(a, b);
    compiler.compile(&GrammarSpec::JsonObject).unwrap();
    assert_eq!(compiler.cached(), 2, "one entry per distinct spec");
}
