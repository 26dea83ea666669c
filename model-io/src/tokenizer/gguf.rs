//! Building a byte-level BPE `tokenizers::Tokenizer` from GGUF metadata (`tokenizer.ggml.*`).
//!
//! A GGUF file carries no `tokenizer.json`, only llama.cpp's description of one: the token list, the merges, a type per
//! token, the special-token ids, and a name for the pre-tokenizer (`tokenizer.ggml.pre`). This file turns that into
//! the same pipeline Hugging Face uses for the model: a BPE model over the token list and merges, the pre-tokenizer
//! the name stands for (mapped here, never defaulted: an unknown name is an error, because a wrong split gives wrong
//! ids without any sign of failure), control tokens as special added tokens, user-defined tokens as plain added
//! tokens, a byte-level decoder, and a post-processor that adds BOS/EOS only when the metadata asks for it.
//!
//! Boundary: only `tokenizer.ggml.model = "gpt2"` (byte-level BPE) is supported; sentencepiece (`llama`) vocabularies
//! need their `tokenizer.json` next to the GGUF.

use candle_core::quantized::gguf_file::{Content, Value};
use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::template::{SpecialToken, TemplateProcessing};
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use super::byte_level;
use crate::error::{ModelError, Result};

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// The split used by Llama 3 (and the other names mapped to it below), as its `tokenizer.json` spells it.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split: Llama 3's, but digits one at a time.
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How the text is split before BPE, chosen by `tokenizer.ggml.pre`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PreTokenizerKind {
    /// GPT-2's own regex inside the byte-level pre-tokenizer, no prefix space (SmolLM2's tokenizer.json).
    Gpt2,
    /// Llama 3's split regex, then byte-level mapping without a regex of its own.
    Llama3,
    /// Qwen2's split regex and an NFC normalizer, as Qwen2's tokenizer.json does.
    Qwen2,
}

impl PreTokenizerKind {
    pub(crate) fn from_gguf_name(name: Option<&str>) -> Result<Self> {
        match name {
            None | Some("default" | "gpt2" | "gpt-2" | "smollm") => Ok(Self::Gpt2),
            Some("llama3" | "llama-v3" | "llama-bpe" | "smaug-bpe" | "falcon3") => Ok(Self::Llama3),
            Some("qwen2" | "deepseek-r1-qwen") => Ok(Self::Qwen2),
            Some(other) => Err(ModelError::Tokenizer(format!(
                "GGUF pre-tokenizer '{other}' (tokenizer.ggml.pre) is not supported \
                 (supported: default, gpt2, smollm, llama3, llama-bpe, smaug-bpe, falcon3, qwen2); \
                 put the model's tokenizer.json next to the GGUF file"
            ))),
        }
    }

    fn pre_tokenizer(self) -> Result<PreTokenizerWrapper> {
        let split_then_bytes = |regex: &str| -> Result<PreTokenizerWrapper> {
            let split = Split::new(SplitPattern::Regex(regex.to_owned()), SplitDelimiterBehavior::Isolated, false)
                .map_err(|e| ModelError::Tokenizer(format!("pre-tokenizer regex: {e}")))?;
            Ok(Sequence::new(vec![split.into(), ByteLevel::new(false, true, false).into()]).into())
        };
        match self {
            Self::Gpt2 => Ok(ByteLevel::new(false, true, true).into()),
            Self::Llama3 => split_then_bytes(LLAMA3_SPLIT),
            Self::Qwen2 => split_then_bytes(QWEN2_SPLIT),
        }
    }
}

/// The special-token facts a GGUF gives, by id.
#[derive(Debug, Clone, Default)]
pub(crate) struct GgufSpecials {
    pub bos_id: Option<u32>,
    /// `eos_token_id` first, then `eot_token_id` / `eom_token_id` when present and different.
    pub eos_ids: Vec<u32>,
    pub pad_id: Option<u32>,
    pub add_bos: bool,
}

/// Builds the tokenizer described by `content`'s metadata.
pub(crate) fn build(content: &Content) -> Result<(tokenizers::Tokenizer, GgufSpecials, Vec<String>)> {
    let md = &content.metadata;
    let model = opt_string(md.get("tokenizer.ggml.model"), "tokenizer.ggml.model")?;
    match model.as_deref() {
        Some("gpt2") => {}
        Some(other) => {
            return Err(ModelError::Tokenizer(format!(
                "GGUF tokenizer model '{other}' is not supported (only 'gpt2' byte-level BPE); \
                 put the model's tokenizer.json next to the GGUF file"
            )))
        }
        None => return Err(ModelError::Tokenizer("GGUF file has no tokenizer (tokenizer.ggml.model)".into())),
    }
    let tokens = string_array(md.get("tokenizer.ggml.tokens"), "tokenizer.ggml.tokens")?;
    if tokens.is_empty() {
        return Err(ModelError::Tokenizer("GGUF tokenizer.ggml.tokens is empty".into()));
    }
    let merges = string_array(md.get("tokenizer.ggml.merges"), "tokenizer.ggml.merges")?;
    let token_types = match md.get("tokenizer.ggml.token_type") {
        Some(v) => int_array(v, "tokenizer.ggml.token_type")?,
        None => Vec::new(),
    };
    let pre_name = opt_string(md.get("tokenizer.ggml.pre"), "tokenizer.ggml.pre")?;
    let pre = PreTokenizerKind::from_gguf_name(pre_name.as_deref())?;

    let token_id = |key: &str| -> Result<Option<u32>> {
        let Some(v) = md.get(key) else { return Ok(None) };
        let id = int_value(v).ok_or_else(|| ModelError::Tokenizer(format!("GGUF {key} is not an integer")))?;
        match u32::try_from(id) {
            Ok(id) if (id as usize) < tokens.len() => Ok(Some(id)),
            // Some writers store -1 (or its u32 bit pattern) for "none": any out-of-range id counts as absent.
            _ => Ok(None),
        }
    };
    let bos_id = token_id("tokenizer.ggml.bos_token_id")?;
    let mut eos_ids = Vec::new();
    for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        if let Some(id) = token_id(key)? {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
    }
    let pad_id = token_id("tokenizer.ggml.padding_token_id")?;
    let add_bos = opt_bool(md.get("tokenizer.ggml.add_bos_token"), "tokenizer.ggml.add_bos_token")?.unwrap_or(false);
    let add_eos = opt_bool(md.get("tokenizer.ggml.add_eos_token"), "tokenizer.ggml.add_eos_token")?.unwrap_or(false);

    let type_of = |id: usize| token_types.get(id).copied().unwrap_or(1);

    // The BPE vocabulary. Ordinary tokens outside the byte-level alphabet are respelled into it (as Hugging Face
    // does); control and user-defined tokens keep their text so the added tokens below map onto their ids.
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(id, token)| {
            let keep = matches!(type_of(id), TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED)
                || byte_level::is_byte_level_spelled(token);
            let spelled = if keep { token.clone() } else { byte_level::spell(token) };
            (spelled, id as u32)
        })
        .collect();
    let merges = merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .ok_or_else(|| ModelError::Tokenizer(format!("GGUF merge '{m}' is not two tokens")))
        })
        .collect::<Result<Vec<_>>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| ModelError::Tokenizer(format!("GGUF BPE model: {e}")))?;

    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    if pre == PreTokenizerKind::Qwen2 {
        tokenizer.with_normalizer(Some(NFC)).map_err(|e| ModelError::Tokenizer(format!("GGUF tokenizer: {e}")))?;
    }
    tokenizer.with_pre_tokenizer(Some(pre.pre_tokenizer()?));
    tokenizer.with_decoder(Some(ByteLevel::default()));

    let added = |wanted: i64, special: bool| -> Vec<AddedToken> {
        tokens
            .iter()
            .enumerate()
            .filter(|&(id, _)| type_of(id) == wanted)
            .map(|(_, t)| AddedToken::from(t.clone(), special).normalized(false))
            .collect()
    };
    tokenizer
        .add_special_tokens(added(TOKEN_TYPE_CONTROL, true))
        .map_err(|e| ModelError::Tokenizer(format!("GGUF tokenizer: {e}")))?;
    tokenizer
        .add_tokens(added(TOKEN_TYPE_USER_DEFINED, false))
        .map_err(|e| ModelError::Tokenizer(format!("GGUF tokenizer: {e}")))?;

    let bos = bos_id.filter(|_| add_bos).map(|id| (id, tokens[id as usize].clone()));
    let eos = eos_ids.first().copied().filter(|_| add_eos).map(|id| (id, tokens[id as usize].clone()));
    if bos.is_some() || eos.is_some() {
        tokenizer.with_post_processor(Some(post_processor(bos, eos)?));
    }

    let specials = GgufSpecials { bos_id, eos_ids, pad_id, add_bos };
    Ok((tokenizer, specials, tokens))
}

/// `[BOS] $A [EOS]` (each optional) for one sequence, and the same around each of a pair.
fn post_processor(bos: Option<(u32, String)>, eos: Option<(u32, String)>) -> Result<TemplateProcessing> {
    // Template pieces are parsed from "name:type_id" strings, so the pieces get fixed names and the real token text
    // lives only in the SpecialToken entries.
    let mut specials = Vec::new();
    let (mut single, mut pair_a, mut pair_b) = (Vec::new(), Vec::new(), Vec::new());
    if let Some((id, text)) = bos {
        specials.push(special("BOS", id, text)?);
        single.push("BOS".to_owned());
        pair_a.push("BOS:0".to_owned());
        pair_b.push("BOS:1".to_owned());
    }
    single.push("$A".to_owned());
    pair_a.push("$A:0".to_owned());
    pair_b.push("$B:1".to_owned());
    if let Some((id, text)) = eos {
        specials.push(special("EOS", id, text)?);
        single.push("EOS".to_owned());
        pair_a.push("EOS:0".to_owned());
        pair_b.push("EOS:1".to_owned());
    }
    pair_a.extend(pair_b);
    TemplateProcessing::builder()
        .try_single(single)
        .and_then(|b| b.try_pair(pair_a))
        .map_err(|e| ModelError::Tokenizer(format!("post-processor template: {e}")))?
        .special_tokens(specials)
        .build()
        .map_err(|e| ModelError::Tokenizer(format!("post-processor: {e}")))
}

fn special(name: &str, id: u32, text: String) -> Result<SpecialToken> {
    SpecialToken::new(name.to_owned(), vec![id], vec![text])
        .map_err(|e| ModelError::Tokenizer(format!("special token {name}: {e}")))
}

fn string_array(value: Option<&Value>, key: &str) -> Result<Vec<String>> {
    let Some(value) = value else {
        return Err(ModelError::Tokenizer(format!("GGUF metadata has no {key}")));
    };
    let Value::Array(items) = value else {
        return Err(ModelError::Tokenizer(format!("GGUF {key} is not an array")));
    };
    items
        .iter()
        .map(|v| match v {
            Value::String(s) => Ok(s.clone()),
            _ => Err(ModelError::Tokenizer(format!("GGUF {key} holds a non-string"))),
        })
        .collect()
}

fn int_array(value: &Value, key: &str) -> Result<Vec<i64>> {
    let Value::Array(items) = value else {
        return Err(ModelError::Tokenizer(format!("GGUF {key} is not an array")));
    };
    items
        .iter()
        .map(|v| int_value(v).ok_or_else(|| ModelError::Tokenizer(format!("GGUF {key} holds a non-integer"))))
        .collect()
}

fn int_value(value: &Value) -> Option<i64> {
    match *value {
        Value::U8(v) => Some(v.into()),
        Value::I8(v) => Some(v.into()),
        Value::U16(v) => Some(v.into()),
        Value::I16(v) => Some(v.into()),
        Value::U32(v) => Some(v.into()),
        Value::I32(v) => Some(v.into()),
        Value::U64(v) => i64::try_from(v).ok(),
        Value::I64(v) => Some(v),
        _ => None,
    }
}

fn opt_string(value: Option<&Value>, key: &str) -> Result<Option<String>> {
    match value {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ModelError::Tokenizer(format!("GGUF {key} is not a string"))),
    }
}

fn opt_bool(value: Option<&Value>, key: &str) -> Result<Option<bool>> {
    match value {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ModelError::Tokenizer(format!("GGUF {key} is not a boolean"))),
    }
}
