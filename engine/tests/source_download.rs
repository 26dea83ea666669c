//! Downloads through hf-hub against a local server that answers like the Hub's `/{repo}/resolve/{rev}/{file}`
//! URLs (etag, x-repo-commit, range requests with Content-Range, 404 for absent files, 401 without a token). Checks
//! that the files land in the cache layout, that a second resolve works offline, that revisions and tokens travel,
//! and that failures are reported.
//!
//! Note: ureq sends every request through `HTTP(S)_PROXY` / `ALL_PROXY` when set (it does not read NO_PROXY), so run
//! these tests without proxy variables.

#[path = "weights_support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use candle_core::{DType, Tensor};
use rserve_engine::config::Architecture;
use rserve_engine::source::{resolve_model, resolve_tokenizer, ModelOrigin, ResolveOptions, ResolvedModel};
use rserve_engine::weights;
use rserve_model_io::ModelError;
use support::*;

const COMMIT_MAIN: &str = "1111111111111111111111111111111111111111";
const COMMIT_V2: &str = "2222222222222222222222222222222222222222";

/// One request as the server saw it.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    authorization: Option<String>,
    range: Option<String>,
}

/// A repo revision: its commit and files.
struct Revision {
    commit: String,
    files: HashMap<String, Vec<u8>>,
}

struct Hub {
    base: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

fn etag(body: &[u8]) -> String {
    // FNV-1a: any stable content hash works as a blob name.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in body {
        h = (h ^ *b as u64).wrapping_mul(0x100000001b3);
    }
    format!("{h:016x}{:08x}", body.len())
}

fn respond(mut stream: TcpStream, status: &str, headers: &[(String, String)], body: &[u8]) {
    let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body);
    let _ = stream.flush();
}

fn handle(
    stream: TcpStream,
    repos: &HashMap<(String, String), Revision>,
    token: &Option<String>,
    seen: &Mutex<Vec<Seen>>,
) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let (mut authorization, mut range) = (None, None);
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            match k.trim().to_ascii_lowercase().as_str() {
                "authorization" => authorization = Some(v.trim().to_string()),
                "range" => range = Some(v.trim().to_string()),
                _ => {}
            }
        }
    }
    seen.lock().unwrap().push(Seen { path: path.clone(), authorization: authorization.clone(), range: range.clone() });
    if let Some(t) = token {
        if authorization.as_deref() != Some(&format!("Bearer {t}")) {
            return respond(stream, "401 Unauthorized", &[("x-error-code".into(), "GatedRepo".into())], b"gated");
        }
    }
    // /{org}/{name}/resolve/{rev}/{file}
    let parts: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
    let found = match parts.as_slice() {
        [org, name, "resolve", rev, file] => {
            let rev = rev.replace("%2F", "/");
            repos.get(&(format!("{org}/{name}"), rev)).and_then(|r| r.files.get(*file).map(|b| (r, b)))
        }
        _ => None,
    };
    let Some((revision, body)) = found else {
        return respond(
            stream,
            "404 Not Found",
            &[("x-error-code".into(), "EntryNotFound".into())],
            b"Entry not found",
        );
    };
    let mut headers = vec![
        ("etag".to_string(), format!("\"{}\"", etag(body))),
        ("x-repo-commit".to_string(), revision.commit.clone()),
    ];
    let size = body.len();
    match range.as_deref().and_then(|r| r.strip_prefix("bytes=")) {
        Some(spec) => {
            let (start, end) = spec.split_once('-').unwrap();
            let start: usize = start.parse().unwrap();
            let end: usize = if end.is_empty() { size - 1 } else { end.parse::<usize>().unwrap().min(size - 1) };
            headers.push(("Content-Range".into(), format!("bytes {start}-{end}/{size}")));
            respond(stream, "206 Partial Content", &headers, &body[start..=end]);
        }
        None => respond(stream, "200 OK", &headers, body),
    }
}

fn serve(repos: HashMap<(String, String), Revision>, token: Option<String>) -> Hub {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            match stream {
                Ok(s) => handle(s, &repos, &token, &seen2),
                Err(_) => break,
            }
        }
    });
    Hub { base, seen }
}

fn file_bytes(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

/// A tiny sharded bf16 model: (files, the f32 tensors it holds).
fn tiny_repo_files(eos: u32) -> (HashMap<String, Vec<u8>>, HashMap<String, Tensor>) {
    let mut params = tiny_params(Architecture::Llama, false);
    params.eos_token_ids = vec![eos];
    let hf = random_hf_tensors(&params);
    let tmp = tempfile::tempdir().unwrap();
    let mut names: Vec<&String> = hf.keys().collect();
    names.sort();
    let mut files = HashMap::new();
    let mut weight_map = serde_json::Map::new();
    for (i, part) in names.chunks(names.len().div_ceil(2)).enumerate() {
        let shard = format!("model-0000{}-of-00002.safetensors", i + 1);
        let subset: HashMap<String, Tensor> =
            part.iter().map(|n| ((*n).clone(), hf[*n].to_dtype(DType::BF16).unwrap())).collect();
        candle_core::safetensors::save(&subset, tmp.path().join(&shard)).unwrap();
        files.insert(shard.clone(), file_bytes(&tmp.path().join(&shard)));
        for n in part {
            weight_map.insert((*n).clone(), shard.clone().into());
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    files.insert("model.safetensors.index.json".into(), index.to_string().into_bytes());
    let config = rserve_engine::convert::config_json(&params, DType::BF16).unwrap();
    files.insert("config.json".into(), config.to_string().into_bytes());
    files.insert("generation_config.json".into(), br#"{"eos_token_id": 2}"#.to_vec());
    files.insert("tokenizer.json".into(), b"{}".to_vec());
    files.insert("tokenizer_config.json".into(), b"{}".to_vec());
    // No chat_template.jinja: the server answers 404 and the download goes on.
    (files, hf)
}

fn options(cache: &Path, endpoint: &str) -> ResolveOptions {
    ResolveOptions { endpoint: endpoint.to_string(), progress: false, ..ResolveOptions::with_cache_dir(cache) }
}

#[test]
fn download_lands_in_cache_and_resolves_offline_after() {
    let (files, tensors) = tiny_repo_files(2);
    let (files_v2, _) = tiny_repo_files(5);
    let mut repos = HashMap::new();
    repos.insert(
        ("org/tiny".to_string(), "main".to_string()),
        Revision { commit: COMMIT_MAIN.into(), files: files.clone() },
    );
    repos.insert(("org/tiny".to_string(), "v2".to_string()), Revision { commit: COMMIT_V2.into(), files: files_v2 });
    let hub = serve(repos, Some("hf_secret".into()));
    let cache = tempfile::tempdir().unwrap();
    let opts = ResolveOptions { token: Some("hf_secret".into()), ..options(cache.path(), &hub.base) };

    let resolved = resolve_model("org/tiny", &opts).unwrap();
    let ResolvedModel::Safetensors(m) = &resolved else { panic!("{resolved:?}") };
    let snapshot = cache.path().join("models--org--tiny/snapshots").join(COMMIT_MAIN);
    assert_eq!(m.dir, snapshot);
    assert_eq!(m.origin, ModelOrigin::Downloaded { repo: "org/tiny".into(), revision: "main".into() });
    assert_eq!(m.safetensors.len(), 2);
    assert_eq!(m.files.chat_template, None);
    assert!(m.files.tokenizer.is_some() && m.files.generation_config.is_some());
    assert_eq!(std::fs::read_to_string(cache.path().join("models--org--tiny/refs/main")).unwrap().trim(), COMMIT_MAIN);
    for (name, body) in &files {
        assert_eq!(&file_bytes(&snapshot.join(name)), body, "{name}");
        let blob = cache.path().join("models--org--tiny/blobs").join(etag(body));
        assert!(blob.is_file(), "blob of {name} is missing");
    }
    {
        let seen = hub.seen.lock().unwrap();
        assert!(seen.iter().all(|s| s.authorization.as_deref() == Some("Bearer hf_secret")), "{seen:?}");
        assert!(seen.iter().any(|s| s.path == "/org/tiny/resolve/main/chat_template.jinja"));
        assert!(seen.iter().any(|s| s.range.as_deref() == Some("bytes=0-0")), "metadata requests use a range");
        assert!(seen.iter().any(|s| s.path.ends_with("model-00002-of-00002.safetensors")));
    }
    let params = resolved.load_params().unwrap();
    let w = weights::load(&resolved, &params, DType::F32).unwrap();
    for (name, t) in &tensors {
        let want = t.to_dtype(DType::BF16).unwrap().to_dtype(DType::F32).unwrap();
        assert_eq!(max_abs_diff(w.get(name).unwrap(), &want), 0.0, "{name}");
    }

    // Offline, with a dead endpoint: served from the cache, no request made.
    let before = hub.seen.lock().unwrap().len();
    let offline = ResolveOptions { offline: true, ..options(cache.path(), "http://127.0.0.1:9") };
    let again = resolve_model("org/tiny", &offline).unwrap();
    let ResolvedModel::Safetensors(m2) = &again else { panic!() };
    assert_eq!(m2.dir, snapshot);
    assert_eq!(
        m2.origin,
        ModelOrigin::HfCache { repo: "org/tiny".into(), revision: "main".into(), commit: COMMIT_MAIN.into() }
    );
    // Online again: a complete snapshot is used without asking the Hub.
    resolve_model("org/tiny", &opts).unwrap();
    assert_eq!(hub.seen.lock().unwrap().len(), before);

    // Another revision goes to its own URL and snapshot (this time through the progress-bar path).
    let with_bar = ResolveOptions { progress: true, ..opts.clone() };
    let v2 = resolve_model("org/tiny", &with_bar.revision(Some("v2".into()))).unwrap();
    assert_eq!(v2.path(), cache.path().join("models--org--tiny/snapshots").join(COMMIT_V2));
    assert_eq!(v2.load_params().unwrap().eos_token_ids, vec![5]);
    assert!(hub.seen.lock().unwrap().iter().any(|s| s.path == "/org/tiny/resolve/v2/config.json"));
    let offline_v2 = offline.clone().revision(Some("v2".into()));
    assert_eq!(resolve_model("org/tiny", &offline_v2).unwrap().path(), v2.path());
}

#[test]
fn download_failures_are_reported() {
    let (files, _) = tiny_repo_files(2);
    let mut repos = HashMap::new();
    repos.insert(
        ("org/tiny".to_string(), "main".to_string()),
        Revision { commit: COMMIT_MAIN.into(), files: files.clone() },
    );
    let mut no_weights = files.clone();
    no_weights.retain(|k, _| !k.ends_with(".safetensors") && !k.ends_with("index.json"));
    repos.insert(
        ("org/noweights".to_string(), "main".to_string()),
        Revision { commit: COMMIT_MAIN.into(), files: no_weights },
    );
    let hub = serve(repos, Some("hf_secret".into()));
    let cache = tempfile::tempdir().unwrap();

    // No token for a gated repo.
    match resolve_model("org/tiny", &options(cache.path(), &hub.base)).unwrap_err() {
        ModelError::Download { model, message } => {
            assert_eq!(model, "org/tiny");
            assert!(message.contains("401") && message.contains("HF_TOKEN"), "{message}");
        }
        other => panic!("{other}"),
    }
    let opts = ResolveOptions { token: Some("hf_secret".into()), ..options(cache.path(), &hub.base) };
    // A repo that does not exist (the config is 404).
    match resolve_model("org/missing", &opts).unwrap_err() {
        ModelError::Download { message, .. } => {
            assert!(message.contains("config.json"), "{message}")
        }
        other => panic!("{other}"),
    }
    // A repo without safetensors weights.
    match resolve_model("org/noweights", &opts).unwrap_err() {
        ModelError::Download { message, .. } => {
            assert!(message.contains("model.safetensors"), "{message}")
        }
        other => panic!("{other}"),
    }
    // Nothing listening.
    let dead = ResolveOptions { token: Some("x".into()), ..options(cache.path(), "http://127.0.0.1:9") };
    assert!(matches!(resolve_model("org/other", &dead), Err(ModelError::Download { .. })));
    // Offline never touches the network.
    let before = hub.seen.lock().unwrap().len();
    let offline = ResolveOptions { offline: true, ..opts };
    assert!(matches!(resolve_model("org/never", &offline), Err(ModelError::ModelNotFound { .. })));
    assert_eq!(hub.seen.lock().unwrap().len(), before);
}

/// `--tokenizer REPO`: only the tokenizer files are fetched (no config, no weights), into the same cache.
#[test]
fn tokenizer_repo_downloads_only_tokenizer_files() {
    let (files, _) = tiny_repo_files(2);
    let mut repos = HashMap::new();
    repos.insert(("org/tok".to_string(), "main".to_string()), Revision { commit: COMMIT_MAIN.into(), files });
    let hub = serve(repos, None);
    let cache = tempfile::tempdir().unwrap();
    let dir = resolve_tokenizer("org/tok", &options(cache.path(), &hub.base)).unwrap();
    assert_eq!(dir, cache.path().join("models--org--tok/snapshots").join(COMMIT_MAIN));
    assert!(dir.join("tokenizer.json").is_file());
    let seen = hub.seen.lock().unwrap();
    assert!(
        !seen.iter().any(|s| s.path.ends_with(".safetensors")
            || s.path.ends_with("config.json") && !s.path.ends_with("tokenizer_config.json")),
        "{seen:?}"
    );
}
