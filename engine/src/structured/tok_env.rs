//! The grammar engine's view of our tokenizer: every token id as the bytes it stands for (llguidance's token trie),
//! and byte strings back to token ids.
//!
//! Built from `Tokenizer` rather than through `toktrie_hf_tokenizers`: that crate pins another major version of
//! `tokenizers` and knows only `tokenizer.json`, while ours also reads GGUF vocabularies.

use std::sync::Arc;

use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};

use crate::tokenizer::Tokenizer;
use crate::TokenId;

/// `Tokenizer` as llguidance's `TokenizerEnv`.
pub(crate) struct GrammarTokenizer {
    tokenizer: Arc<Tokenizer>,
    trie: TokTrie,
}

impl GrammarTokenizer {
    /// A token environment over `vocab_size` logits (the model's output width, which may exceed the tokenizer's
    /// vocabulary: the extra ids are never allowed), with the model's EOS ids as the grammar's end tokens.
    pub(crate) fn env(tokenizer: Arc<Tokenizer>, vocab_size: usize, eos: &[TokenId]) -> TokEnv {
        let words: Vec<Vec<u8>> = (0..vocab_size).map(|id| token_word(&tokenizer, TokenId(id as u32))).collect();
        let eos_ids: Vec<u32> = eos.iter().map(|t| t.0).filter(|&t| (t as usize) < vocab_size).collect();
        let info = TokRxInfo::new(vocab_size as u32, eos_ids.first().copied().unwrap_or(0));
        let mut trie = TokTrie::from(&info, &words);
        if eos_ids.len() > 1 {
            trie = trie.with_eos_tokens(&eos_ids);
        }
        Arc::new(GrammarTokenizer { tokenizer, trie })
    }
}

/// The trie's word for a token: its bytes; a special token is its text behind the trie's special marker (the
/// grammar never emits it as text); an id the tokenizer lacks is a special placeholder, never allowed.
fn token_word(tokenizer: &Tokenizer, id: TokenId) -> Vec<u8> {
    let special = |name: &[u8]| {
        let mut w = Vec::with_capacity(name.len() + 1);
        w.push(TokTrie::SPECIAL_TOKEN_MARKER);
        w.extend_from_slice(name);
        w
    };
    if tokenizer.is_special_token(id) {
        return special(tokenizer.id_to_token(id).unwrap_or_default().as_bytes());
    }
    match tokenizer.grammar_bytes(id) {
        Some(bytes) if !bytes.is_empty() => bytes,
        _ => special(format!("<[{}]>", id.0).as_bytes()),
    }
}

impl TokenizerEnv for GrammarTokenizer {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            // The trie's greedy split is the fallback when the tokenizer fails: grammars only ask for hints here.
            self.tokenizer.encode(text, false).map(|ids| ids.into_iter().map(|t| t.0).collect()).unwrap_or_default()
        })
    }
}
