//! HTTPS, as uvicorn serves it for vLLM: `--ssl-keyfile` / `--ssl-certfile` (PEM) into a rustls server config, client
//! certificates checked against `--ssl-ca-certs` when `--ssl-cert-reqs` asks for them, and `TlsListener`, the
//! listener `axum::serve` takes for HTTPS (so graceful shutdown and the connection info are the same as for HTTP).
//! Handshakes run in their own tasks: a slow client never holds up the others. With `--enable-ssl-refresh` a task
//! watches the files' modification times and swaps in a new config when they change (new handshakes use it; open
//! connections keep theirs); a change that does not load keeps the old config and logs why.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// How long a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Finished handshakes waiting for `axum::serve` to take them.
const ACCEPT_QUEUE: usize = 256;
/// How often `--enable-ssl-refresh` looks at the files.
const REFRESH_POLL: Duration = Duration::from_secs(2);

/// The TLS flags (`--ssl-*`), as given.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    pub keyfile: PathBuf,
    pub certfile: PathBuf,
    pub ca_certs: Option<PathBuf>,
    /// Python's `ssl.CERT_NONE` (0), `CERT_OPTIONAL` (1), `CERT_REQUIRED` (2).
    pub cert_reqs: u8,
}

/// A TLS setting that cannot be used; the message names the flag and the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {flag} {path}: {source}")]
    Read { flag: &'static str, path: PathBuf, source: rustls::pki_types::pem::Error },
    #[error("{flag} {path} holds no {what} (PEM expected)")]
    Empty { flag: &'static str, path: PathBuf, what: &'static str },
    #[error("--ssl-ca-certs {path}: {message}")]
    Ca { path: PathBuf, message: String },
    #[error("--ssl-keyfile / --ssl-certfile do not make a usable server identity: {0}")]
    Config(String),
}

fn read_err<'a>(flag: &'static str, path: &'a Path) -> impl FnOnce(rustls::pki_types::pem::Error) -> TlsError + 'a {
    move |source| TlsError::Read { flag, path: path.to_owned(), source }
}

fn certificates(flag: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(read_err(flag, path))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read_err(flag, path))?;
    if certs.is_empty() {
        return Err(TlsError::Empty { flag, path: path.to_owned(), what: "certificate" });
    }
    Ok(certs)
}

impl TlsFiles {
    /// Reads the files into a rustls server config (HTTP/1.1; TLS 1.2 and 1.3 with ring's cipher suites).
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let certs = certificates("--ssl-certfile", &self.certfile)?;
        let key = PrivateKeyDer::from_pem_file(&self.keyfile).map_err(|e| match e {
            rustls::pki_types::pem::Error::NoItemsFound => {
                TlsError::Empty { flag: "--ssl-keyfile", path: self.keyfile.clone(), what: "private key" }
            }
            other => TlsError::Read { flag: "--ssl-keyfile", path: self.keyfile.clone(), source: other },
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let builder = match (&self.ca_certs, self.cert_reqs) {
            (Some(ca), reqs @ (1 | 2)) => {
                let mut roots = RootCertStore::empty();
                for cert in certificates("--ssl-ca-certs", ca)? {
                    roots.add(cert).map_err(|e| TlsError::Ca { path: ca.clone(), message: e.to_string() })?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
                let verifier = if reqs == 1 { verifier.allow_unauthenticated() } else { verifier };
                let verifier =
                    verifier.build().map_err(|e| TlsError::Ca { path: ca.clone(), message: e.to_string() })?;
                builder.with_client_cert_verifier(verifier)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(certs, key).map_err(|e| TlsError::Config(e.to_string()))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// The files' modification times (None for one that cannot be read): a change means "reload".
    pub fn stamp(&self) -> Vec<Option<SystemTime>> {
        let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        let mut stamp = vec![mtime(&self.keyfile), mtime(&self.certfile)];
        stamp.extend(self.ca_certs.as_deref().map(mtime));
        stamp
    }
}

/// The config new handshakes use; `--enable-ssl-refresh` replaces it.
type SharedConfig = Arc<RwLock<Arc<ServerConfig>>>;

/// Polls the files and swaps in a new config when they change, until aborted.
async fn refresh(files: TlsFiles, shared: SharedConfig) {
    let mut seen = files.stamp();
    loop {
        tokio::time::sleep(REFRESH_POLL).await;
        let now = files.stamp();
        if now == seen {
            continue;
        }
        seen = now;
        match files.server_config() {
            Ok(config) => {
                if let Ok(mut current) = shared.write() {
                    *current = config;
                }
                tracing::info!("SSL certificate files changed: reloaded the TLS configuration");
            }
            Err(e) => tracing::warn!("SSL certificate files changed but do not load (keeping the old ones): {e}"),
        }
    }
}

/// A TCP listener that hands `axum::serve` connections whose TLS handshake has finished.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    acceptor_task: JoinHandle<()>,
    refresh_task: Option<JoinHandle<()>>,
}

impl TlsListener {
    /// Accepts on `tcp` from now on, each handshake in its own task; with `refresh_from`, reloads the config when
    /// those files change (`--enable-ssl-refresh`).
    pub fn new(tcp: TcpListener, config: Arc<ServerConfig>, refresh_from: Option<TlsFiles>) -> io::Result<Self> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(ACCEPT_QUEUE);
        let shared: SharedConfig = Arc::new(RwLock::new(config));
        let refresh_task = refresh_from.map(|files| tokio::spawn(refresh(files, shared.clone())));
        let acceptor_task = tokio::spawn(async move {
            loop {
                let (stream, peer) = match tcp.accept().await {
                    Ok(conn) => conn,
                    Err(e) => {
                        // Out of file descriptors and the like: wait instead of spinning (as axum::serve does).
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let config = match shared.read() {
                    Ok(c) => c.clone(),
                    Err(poisoned) => poisoned.into_inner().clone(),
                };
                let (acceptor, tx) = (TlsAcceptor::from(config), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!("TLS handshake with {peer} failed: {e}"),
                        Err(_) => tracing::debug!("TLS handshake with {peer} timed out"),
                    }
                });
            }
        });
        Ok(Self { ready, local, acceptor_task, refresh_task })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor_task.abort();
        if let Some(task) = &self.refresh_task {
            task.abort();
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accepting task is gone (it never ends on its own): nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}
