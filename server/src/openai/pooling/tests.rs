//! Unit tests of the pooling rules and renderings: `dimensions`, truncation and the length limits, the score
//! pairings, base64 vectors, labels, cosine similarity and rerank ordering.

use base64::Engine as _;
use rserve_engine::api::PoolingTask;

use super::error::{Api, PoolingError};
use super::render;
use super::score;
use super::types::{EncodeRequest, RerankDocument, Vector};
use super::validate::{self, EncodingFormat, Limits};
use crate::testing::{self, ids};

#[test]
fn dimensions_follow_the_models_matryoshka_support() {
    let any = testing::embedder(8, Some(Vec::new()));
    assert_eq!(validate::dimensions(None, &any, "m"), Ok(None));
    assert_eq!(validate::dimensions(Some(3), &any, "m"), Ok(Some(3)));
    assert_eq!(validate::dimensions(Some(8), &any, "m"), Ok(Some(8)));
    assert_eq!(validate::dimensions(Some(9), &any, "m"), Err(PoolingError::DimensionsOutOfRange { value: 9, max: 8 }));
    assert_eq!(validate::dimensions(Some(0), &any, "m"), Err(PoolingError::DimensionsOutOfRange { value: 0, max: 8 }));
    let listed = testing::embedder(8, Some(vec![4, 8]));
    assert_eq!(validate::dimensions(Some(4), &listed, "m"), Ok(Some(4)));
    assert!(matches!(validate::dimensions(Some(3), &listed, "m"), Err(PoolingError::DimensionsNotAllowed { .. })));
    let fixed = testing::embedder(8, None);
    let e = validate::dimensions(Some(4), &fixed, "bge").unwrap_err();
    assert!(e.to_string().contains("does not support matryoshka representation"), "{e}");
    assert_eq!(e.param().as_deref(), Some("dimensions"));
}

#[test]
fn encoding_formats() {
    assert_eq!(validate::encoding_format(None), Ok(EncodingFormat::Float));
    assert_eq!(validate::encoding_format(Some("float")), Ok(EncodingFormat::Float));
    assert_eq!(validate::encoding_format(Some("base64")), Ok(EncodingFormat::Base64));
    let e = validate::encoding_format(Some("binary")).unwrap_err();
    assert_eq!(e.param().as_deref(), Some("encoding_format"));
}

#[test]
fn output_options_vllm_acts_on_pass_only_with_the_values_served() {
    let served = EncodeRequest {
        embed_dtype: Some("float32".into()),
        endianness: Some("little".into()),
        truncation_side: Some("left".into()),
        ..EncodeRequest::default()
    };
    assert!(validate::served_options(&served).is_ok());
    assert!(validate::served_options(&EncodeRequest::default()).is_ok());
    for (field, req) in [
        ("embed_dtype", EncodeRequest { embed_dtype: Some("float16".into()), ..EncodeRequest::default() }),
        ("endianness", EncodeRequest { endianness: Some("big".into()), ..EncodeRequest::default() }),
        ("truncation_side", EncodeRequest { truncation_side: Some("right".into()), ..EncodeRequest::default() }),
    ] {
        let e = validate::served_options(&req).unwrap_err();
        assert_eq!(e.param().as_deref(), Some(field), "{e}");
    }
}

#[test]
fn truncation_keeps_the_last_tokens_and_cuts_segments_alike() {
    let mut info = testing::info(16);
    info.pooling = Some(testing::embedder(4, None));
    let limits = Limits::new(&info, Some(3), "embedding generation").expect("valid");
    let (kept, types) = limits.fit("input", ids(&[1, 2, 3, 4, 5]), Some(vec![0, 0, 1, 1, 1])).expect("fits");
    assert_eq!(kept, ids(&[3, 4, 5]));
    assert_eq!(types, Some(vec![1, 1, 1]));
    let all = Limits::new(&info, Some(-1), "x").expect("valid");
    assert_eq!(all.truncate, Some(16), "-1 is the context length");
    assert_eq!(Limits::new(&info, Some(0), "x").unwrap_err(), PoolingError::Truncation(0));
    assert_eq!(Limits::new(&info, Some(-2), "x").unwrap_err(), PoolingError::Truncation(-2));
    let e = Limits::new(&info, Some(17), "x").unwrap_err();
    assert_eq!(e, PoolingError::TruncationTooLarge { value: 17, max_model_len: 16 });
    assert_eq!(e.param().as_deref(), Some("truncate_prompt_tokens"));
}

#[test]
fn inputs_longer_than_the_context_or_one_step_are_refused() {
    let mut info = testing::info(8);
    info.max_num_batched_tokens = 6;
    info.pooling = Some(testing::embedder(4, None));
    let limits = Limits::new(&info, None, "embedding generation").expect("valid");
    let e = limits.fit("input", ids(&[1; 9]), None).unwrap_err();
    assert!(matches!(e, PoolingError::TooLong { tokens: 9, max_model_len: 8, .. }), "{e:?}");
    assert!(e.to_string().contains("truncate_prompt_tokens"), "{e}");
    let e = limits.fit("input", ids(&[1; 7]), None).unwrap_err();
    assert!(matches!(e, PoolingError::OverStepBudget { tokens: 7, limit: 6, .. }), "{e:?}");
    assert!(e.to_string().contains("--max-num-batched-tokens"), "{e}");
    assert!(limits.fit("input", ids(&[1; 6]), None).is_ok());
    assert_eq!(limits.fit("input", Vec::new(), None).unwrap_err(), PoolingError::Empty("input"));
    // A causal model's prompt may be split across steps: only the context length bounds it.
    info.pooling.as_mut().expect("pooling").bidirectional = false;
    let limits = Limits::new(&info, None, "x").expect("valid");
    assert!(limits.fit("input", ids(&[1; 8]), None).is_ok());
}

#[test]
fn the_task_must_be_the_models() {
    let mut info = testing::info(8);
    assert_eq!(
        validate::pooling_info(&info, PoolingTask::Embed, Api::Embeddings).unwrap_err().to_string(),
        "The model does not support Embeddings API"
    );
    assert!(validate::refuse_on_pooling_model(&info, Api::Completions).is_ok());
    info.pooling = Some(testing::classifier(&["neg", "pos"]));
    assert!(validate::pooling_info(&info, PoolingTask::Classify, Api::Classification).is_ok());
    assert!(validate::pooling_info(&info, PoolingTask::Embed, Api::Embeddings).is_err());
    assert_eq!(
        validate::refuse_on_pooling_model(&info, Api::ChatCompletions).unwrap_err().to_string(),
        "The model does not support Chat Completions API"
    );
}

#[test]
fn score_sides_pair_one_to_one_one_to_n_and_n_to_n() {
    assert_eq!(score::pairs("text_1", 1, "text_2", 1), Ok(vec![(0, 0)]));
    assert_eq!(score::pairs("text_1", 1, "text_2", 3), Ok(vec![(0, 0), (0, 1), (0, 2)]));
    assert_eq!(score::pairs("text_1", 2, "text_2", 2), Ok(vec![(0, 0), (1, 1)]));
    let e = score::pairs("text_1", 2, "text_2", 3).unwrap_err();
    assert_eq!(e.param().as_deref(), Some("text_2"));
    let e = score::pairs("text_1", 3, "text_2", 1).unwrap_err();
    assert!(matches!(e, PoolingError::ScoreLengths { first: 3, second: 1, .. }), "N:1 is not a form vLLM takes");
    assert_eq!(score::pairs("query", 1, "documents", 0), Err(PoolingError::Empty("documents")));
    assert_eq!(score::pairs("text_1", 0, "text_2", 2), Err(PoolingError::Empty("text_1")));
}

#[test]
fn base64_vectors_are_little_endian_f32_bytes() {
    let v = vec![1.0f32, -0.5, 3.25e-3];
    let Vector::Base64(s) = render::vector(v.clone(), EncodingFormat::Base64) else { panic!("base64 asked") };
    let bytes = base64::engine::general_purpose::STANDARD.decode(s).expect("base64");
    let back: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    assert_eq!(back, v);
    assert_eq!(render::vector(v.clone(), EncodingFormat::Float), Vector::Floats(v));
}

#[test]
fn labels_cosine_and_rerank_order() {
    let labels = vec!["neg".to_owned(), "pos".to_owned()];
    assert_eq!(render::label(&[0.2, 0.8], &labels), "pos");
    assert_eq!(render::label(&[0.5, 0.5], &labels), "neg", "a tie goes to the first label");
    assert_eq!(render::label(&[0.1, 0.2, 0.7], &labels), "LABEL_2");
    assert!((render::cosine(&[1.0, 0.0], &[1.0, 0.0]) - 1.0).abs() < 1e-6);
    assert!(render::cosine(&[1.0, 0.0], &[0.0, 2.0]).abs() < 1e-6);
    assert!((render::cosine(&[1.0, 1.0], &[-2.0, -2.0]) + 1.0).abs() < 1e-6);
    assert_eq!(render::cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
    let docs = || vec!["a".to_owned(), "b".to_owned(), "c".to_owned()];
    let r = render::rerank(&[0.1, 0.9, 0.5], docs(), 0, true);
    assert_eq!(r.iter().map(|r| r.index).collect::<Vec<_>>(), vec![1, 2, 0]);
    assert_eq!(r[0].document, Some(RerankDocument { text: "b".into() }));
    let r = render::rerank(&[0.1, 0.9, 0.5], docs(), 2, false);
    assert_eq!(r.iter().map(|r| r.index).collect::<Vec<_>>(), vec![1, 2]);
    assert!(r.iter().all(|r| r.document.is_none()));
    assert_eq!(render::rerank(&[0.1, 0.9, 0.5], docs(), 10, true).len(), 3, "top_n past the end keeps all");
}
