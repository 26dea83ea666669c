//! CORS, configured as vLLM configures Starlette's `CORSMiddleware` from `--allowed-origins`, `--allowed-methods`,
//! `--allowed-headers` and `--allow-credentials`: "*" methods are Starlette's list of all methods, "*" headers
//! answer a preflight with the headers the browser asked for, an explicit header list also allows the CORS-safelisted
//! ones, "*" origins with credentials echo the request's origin (a browser refuses "*" with credentials), and a
//! preflight may be cached for 600 s.

use axum::http::{HeaderName, HeaderValue, Method};
use tower_http::cors::{AllowHeaders, AllowMethods, AllowOrigin, CorsLayer};

/// Starlette's `ALL_METHODS`.
const ALL_METHODS: &[&str] = &["DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "QUERY"];
/// Starlette's `SAFELISTED_HEADERS`, always allowed.
const SAFELISTED_HEADERS: &[&str] = &["accept", "accept-language", "content-language", "content-type"];
/// Starlette's default `max_age`.
const MAX_AGE_SECS: u64 = 600;

/// The CORS flags as given.
#[derive(Debug, Clone, Default)]
pub struct CorsSettings {
    pub allowed_origins: Vec<String>,
    pub allowed_methods: Vec<String>,
    pub allowed_headers: Vec<String>,
    pub allow_credentials: bool,
}

/// A CORS flag value that is not a valid origin, method or header name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--{flag}: {value:?} is not a valid {what}")]
pub struct CorsError {
    flag: &'static str,
    value: String,
    what: &'static str,
}

impl CorsSettings {
    /// The layer these settings describe.
    pub fn layer(&self) -> Result<CorsLayer, CorsError> {
        let wildcard = |list: &[String]| list.iter().any(|v| v == "*");
        let origins = if wildcard(&self.allowed_origins) {
            if self.allow_credentials {
                AllowOrigin::mirror_request()
            } else {
                AllowOrigin::any()
            }
        } else {
            let values = self.allowed_origins.iter().map(|o| {
                HeaderValue::from_str(o).map_err(|_| CorsError {
                    flag: "allowed-origins",
                    value: o.clone(),
                    what: "origin",
                })
            });
            AllowOrigin::list(values.collect::<Result<Vec<_>, _>>()?)
        };
        let methods: Vec<&str> = if wildcard(&self.allowed_methods) {
            ALL_METHODS.to_vec()
        } else {
            self.allowed_methods.iter().map(String::as_str).collect()
        };
        let methods = methods.into_iter().map(|m| {
            Method::from_bytes(m.as_bytes()).map_err(|_| CorsError {
                flag: "allowed-methods",
                value: m.to_owned(),
                what: "method",
            })
        });
        let methods = AllowMethods::list(methods.collect::<Result<Vec<_>, _>>()?);
        let headers = if wildcard(&self.allowed_headers) {
            AllowHeaders::mirror_request()
        } else {
            let mut names: Vec<String> = SAFELISTED_HEADERS.iter().map(|h| (*h).to_owned()).collect();
            names.extend(self.allowed_headers.iter().map(|h| h.to_ascii_lowercase()));
            names.sort();
            names.dedup();
            let names = names.into_iter().map(|h| {
                HeaderName::from_bytes(h.as_bytes()).map_err(|_| CorsError {
                    flag: "allowed-headers",
                    value: h.clone(),
                    what: "header name",
                })
            });
            AllowHeaders::list(names.collect::<Result<Vec<_>, _>>()?)
        };
        Ok(CorsLayer::new()
            .allow_origin(origins)
            .allow_methods(methods)
            .allow_headers(headers)
            .allow_credentials(self.allow_credentials)
            .max_age(std::time::Duration::from_secs(MAX_AGE_SECS)))
    }
}
