//! Model resolution without network: the Hugging Face cache layout (refs, revisions, commit hashes, shards), local
//! folders and `.gguf` paths, environment precedence through `ResolveOptions::from_vars`, and the offline error that
//! names every path searched.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rserve_engine::source::{
    resolve_model, resolve_tokenizer, ModelOrigin, ResolveOptions, ResolvedModel, DEFAULT_ENDPOINT,
};
use rserve_model_io::ModelError;

const COMMIT_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const COMMIT_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    move |k| map.get(k).cloned()
}

fn offline(cache: &Path) -> ResolveOptions {
    ResolveOptions { offline: true, ..ResolveOptions::with_cache_dir(cache) }
}

/// Writes a snapshot the way huggingface_hub does: files are symlinks into `blobs/`.
fn write_snapshot(cache: &Path, repo: &str, commit: &str, files: &[(&str, &str)]) -> PathBuf {
    let repo_dir = cache.join(format!("models--{}", repo.replace('/', "--")));
    let snap = repo_dir.join("snapshots").join(commit);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo_dir.join("blobs")).unwrap();
    for (i, (name, body)) in files.iter().enumerate() {
        let blob = repo_dir.join("blobs").join(format!("{commit}-{i}"));
        std::fs::write(&blob, body).unwrap();
        std::os::unix::fs::symlink(&blob, snap.join(name)).unwrap();
    }
    snap
}

fn write_ref(cache: &Path, repo: &str, name: &str, commit: &str) {
    let refs = cache.join(format!("models--{}", repo.replace('/', "--"))).join("refs");
    std::fs::create_dir_all(&refs).unwrap();
    std::fs::write(refs.join(name), commit).unwrap();
}

const MODEL_FILES: &[(&str, &str)] = &[
    ("config.json", r#"{"architectures":["LlamaForCausalLM"]}"#),
    ("model.safetensors", "weights"),
    ("tokenizer.json", "{}"),
    ("tokenizer_config.json", "{}"),
    ("generation_config.json", "{}"),
];

#[test]
fn cache_layout_follows_refs_main_and_revisions() {
    let cache = tempfile::tempdir().unwrap();
    let snap_a = write_snapshot(cache.path(), "org/tiny", COMMIT_A, MODEL_FILES);
    let snap_b = write_snapshot(cache.path(), "org/tiny", COMMIT_B, &MODEL_FILES[..2]);
    write_ref(cache.path(), "org/tiny", "main", &format!("{COMMIT_A}\n"));
    write_ref(cache.path(), "org/tiny", "v2", COMMIT_B);

    let m = match resolve_model("org/tiny", &offline(cache.path())).unwrap() {
        ResolvedModel::Safetensors(m) => m,
        other => panic!("{other:?}"),
    };
    assert_eq!(m.dir, snap_a);
    assert_eq!(m.config, snap_a.join("config.json"));
    assert_eq!(m.safetensors, vec![snap_a.join("model.safetensors")]);
    assert_eq!(m.index, None);
    assert_eq!(m.files.tokenizer, Some(snap_a.join("tokenizer.json")));
    assert_eq!(m.files.tokenizer_config, Some(snap_a.join("tokenizer_config.json")));
    assert_eq!(m.files.generation_config, Some(snap_a.join("generation_config.json")));
    assert_eq!(m.files.chat_template, None);
    assert_eq!(
        m.origin,
        ModelOrigin::HfCache { repo: "org/tiny".into(), revision: "main".into(), commit: COMMIT_A.into() }
    );

    let opts = offline(cache.path()).revision(Some("v2".into()));
    let ResolvedModel::Safetensors(m) = resolve_model("org/tiny", &opts).unwrap() else { panic!() };
    assert_eq!(m.dir, snap_b);
    assert_eq!(m.files.tokenizer, None);

    // A commit hash needs no ref.
    let opts = offline(cache.path()).revision(Some(COMMIT_B.into()));
    let ResolvedModel::Safetensors(m) = resolve_model("org/tiny", &opts).unwrap() else { panic!() };
    assert_eq!(m.dir, snap_b);
}

#[test]
fn sharded_snapshot_needs_every_shard() {
    let cache = tempfile::tempdir().unwrap();
    let index = r#"{"metadata":{},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors","c":"model-00001-of-00002.safetensors"}}"#;
    let snap = write_snapshot(
        cache.path(),
        "org/sharded",
        COMMIT_A,
        &[
            ("config.json", "{}"),
            ("model.safetensors.index.json", index),
            ("model-00001-of-00002.safetensors", "1"),
            ("chat_template.jinja", "{{ x }}"),
        ],
    );
    write_ref(cache.path(), "org/sharded", "main", COMMIT_A);
    let missing = snap.join("model-00002-of-00002.safetensors");
    match resolve_model("org/sharded", &offline(cache.path())).unwrap_err() {
        ModelError::ModelNotFound { model, searched } => {
            assert!(model.contains("org/sharded"));
            assert!(searched.contains(&missing), "{searched:?}");
        }
        other => panic!("{other}"),
    }
    std::fs::write(&missing, "2").unwrap();
    let ResolvedModel::Safetensors(m) = resolve_model("org/sharded", &offline(cache.path())).unwrap() else { panic!() };
    assert_eq!(m.safetensors, vec![snap.join("model-00001-of-00002.safetensors"), missing]);
    assert_eq!(m.index, Some(snap.join("model.safetensors.index.json")));
    assert_eq!(m.files.chat_template, Some(snap.join("chat_template.jinja")));
}

#[test]
fn offline_miss_names_every_path_searched() {
    let cache = tempfile::tempdir().unwrap();
    let err = resolve_model("org/absent", &offline(cache.path())).unwrap_err();
    let ModelError::ModelNotFound { ref searched, .. } = err else { panic!("{err}") };
    let repo_dir = cache.path().join("models--org--absent");
    assert!(searched.contains(&std::path::absolute("org/absent").unwrap()), "{searched:?}");
    assert!(searched.contains(&repo_dir.join("refs/main")), "{searched:?}");
    let message = err.to_string();
    for p in searched {
        assert!(message.contains(&p.display().to_string()), "{message}");
    }

    // A ref whose snapshot is gone, and a revision that is a commit hash: both paths are listed.
    write_ref(cache.path(), "org/absent", "main", COMMIT_A);
    let opts = offline(cache.path()).revision(Some(COMMIT_B.into()));
    let ModelError::ModelNotFound { searched, .. } = resolve_model("org/absent", &opts).unwrap_err() else { panic!() };
    assert!(searched.contains(&repo_dir.join("refs").join(COMMIT_B)));
    assert!(searched.contains(&repo_dir.join("snapshots").join(COMMIT_B)));
    let ModelError::ModelNotFound { searched, .. } = resolve_model("org/absent", &offline(cache.path())).unwrap_err()
    else {
        panic!()
    };
    assert!(searched.contains(&repo_dir.join("snapshots").join(COMMIT_A)), "{searched:?}");
}

#[test]
fn local_folders_and_gguf_paths() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let opts = offline(&cache);
    let model_dir = dir.path().join("model");
    std::fs::create_dir_all(&model_dir).unwrap();
    std::fs::write(model_dir.join("config.json"), "{}").unwrap();
    let err = resolve_model(model_dir.to_str().unwrap(), &opts).unwrap_err();
    let ModelError::ModelNotFound { searched, .. } = err else { panic!("{err}") };
    assert!(searched.contains(&model_dir.join("model.safetensors")));
    std::fs::write(model_dir.join("model.safetensors"), "w").unwrap();
    let r = resolve_model(model_dir.to_str().unwrap(), &opts).unwrap();
    assert!(matches!(&r, ResolvedModel::Safetensors(m) if m.origin == ModelOrigin::Local && m.dir == model_dir));

    let gguf_dir = dir.path().join("gguf");
    std::fs::create_dir_all(&gguf_dir).unwrap();
    let gguf = gguf_dir.join("m.Q4_0.gguf");
    std::fs::write(&gguf, "GGUF").unwrap();
    let ResolvedModel::Gguf(g) = resolve_model(gguf.to_str().unwrap(), &opts).unwrap() else { panic!() };
    assert_eq!((g.file.as_path(), g.tokenizer_dir.as_ref()), (gguf.as_path(), None));
    std::fs::write(gguf_dir.join("tokenizer.json"), "{}").unwrap();
    // A folder with one .gguf resolves to it, with the tokenizer next to it.
    let ResolvedModel::Gguf(g) = resolve_model(gguf_dir.to_str().unwrap(), &opts).unwrap() else { panic!() };
    assert_eq!(g.file, gguf);
    assert_eq!(g.tokenizer_dir, Some(gguf_dir.clone()));
    assert_eq!(g.files.tokenizer, Some(gguf_dir.join("tokenizer.json")));
    std::fs::write(gguf_dir.join("other.gguf"), "GGUF").unwrap();
    assert!(matches!(resolve_model(gguf_dir.to_str().unwrap(), &opts), Err(ModelError::InvalidArgument(_))));

    let absent = dir.path().join("absent.gguf");
    let ModelError::ModelNotFound { searched, .. } = resolve_model(absent.to_str().unwrap(), &opts).unwrap_err() else {
        panic!()
    };
    assert_eq!(searched, vec![absent]);
    assert!(matches!(
        resolve_model(model_dir.join("config.json").to_str().unwrap(), &opts),
        Err(ModelError::InvalidArgument(_))
    ));
    // Not a path that exists and not a repo id: only the path was searched, the Hub is never asked.
    let online = ResolveOptions::with_cache_dir(&cache);
    let ModelError::ModelNotFound { searched, .. } = resolve_model("a/b/c", &online).unwrap_err() else { panic!() };
    assert_eq!(searched.len(), 1);
}

#[test]
fn environment_precedence() {
    let o = ResolveOptions::from_vars(vars(&[("HOME", "/home/u")]));
    assert_eq!(o.cache_dir, PathBuf::from("/home/u/.cache/huggingface/hub"));
    assert_eq!(o.endpoint, DEFAULT_ENDPOINT);
    assert!(!o.offline && o.token.is_none() && o.revision.is_none());

    let o = ResolveOptions::from_vars(vars(&[("HOME", "/home/u"), ("XDG_CACHE_HOME", "/xdg")]));
    assert_eq!(o.cache_dir, PathBuf::from("/xdg/huggingface/hub"));
    let o = ResolveOptions::from_vars(vars(&[("HOME", "/home/u"), ("XDG_CACHE_HOME", "/xdg"), ("HF_HOME", "/hf")]));
    assert_eq!(o.cache_dir, PathBuf::from("/hf/hub"));
    let o = ResolveOptions::from_vars(vars(&[("HF_HOME", "/hf"), ("HF_HUB_CACHE", "/hub-cache")]));
    assert_eq!(o.cache_dir, PathBuf::from("/hub-cache"));
    let o = ResolveOptions::from_vars(vars(&[("HOME", "/home/u"), ("HF_HOME", "~/hf"), ("HF_HUB_CACHE", "")]));
    assert_eq!(o.cache_dir, PathBuf::from("/home/u/hf/hub"), "empty values count as unset; ~ expands");

    for (value, expected) in
        [("1", true), ("ON", true), ("yes", true), ("True", true), ("0", false), ("false", false), ("", false)]
    {
        assert_eq!(ResolveOptions::from_vars(vars(&[("HF_HUB_OFFLINE", value)])).offline, expected, "{value:?}");
        assert_eq!(ResolveOptions::from_vars(vars(&[("TRANSFORMERS_OFFLINE", value)])).offline, expected, "{value:?}");
    }

    let o = ResolveOptions::from_vars(vars(&[("HF_ENDPOINT", "http://mirror.local:8080/"), ("HF_TOKEN", "hf_x")]));
    assert_eq!(o.endpoint, "http://mirror.local:8080");
    assert_eq!(o.token.as_deref(), Some("hf_x"));

    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("token"), "hf_from_file\n").unwrap();
    let hf_home = home.path().to_str().unwrap();
    let o = ResolveOptions::from_vars(vars(&[("HF_HOME", hf_home)]));
    assert_eq!(o.token.as_deref(), Some("hf_from_file"));
    let o = ResolveOptions::from_vars(vars(&[("HF_HOME", hf_home), ("HF_TOKEN", "hf_env")]));
    assert_eq!(o.token.as_deref(), Some("hf_env"));
}

/// `--tokenizer`: a folder as it is; a repo id from the cache when its snapshot has a tokenizer.json (no weights
/// needed); offline and missing, an error naming the paths searched.
#[test]
fn tokenizer_folders_and_cached_repos() {
    let cache = tempfile::tempdir().unwrap();
    let snap = write_snapshot(cache.path(), "org/tok", COMMIT_A, &[("tokenizer.json", "{}")]);
    write_ref(cache.path(), "org/tok", "main", COMMIT_A);
    assert_eq!(resolve_tokenizer("org/tok", &offline(cache.path())).unwrap(), snap);
    assert_eq!(resolve_tokenizer(snap.to_str().unwrap(), &offline(cache.path())).unwrap(), snap);
    let err = resolve_tokenizer("org/other", &offline(cache.path())).unwrap_err();
    assert!(matches!(&err, ModelError::ModelNotFound { model, .. } if model.contains("org/other")), "{err}");
    write_snapshot(cache.path(), "org/weights-only", COMMIT_B, &[("config.json", "{}")]);
    write_ref(cache.path(), "org/weights-only", "main", COMMIT_B);
    assert!(resolve_tokenizer("org/weights-only", &offline(cache.path())).is_err());
}
