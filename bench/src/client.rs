//! The HTTP side of the load tester: one `awc` client per virtual user (one keep-alive
//! connection, one request in flight), and the control calls (setup, probes, read-back).
//!
//! A measured request never fails the run by itself: every answer, including a transport
//! error, becomes an [`Answer`] that the statistics classify. Control calls are different:
//! the run cannot go on without them, so they return errors, and they wait out a 429 (the
//! `Retry-After` it names) rather than fail, because a rate-limited key is a condition the
//! run reports, not a broken setup.

use std::time::Duration;

use anyhow::{bail, Context};
use awc::http::Method;
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

/// Longest answer read; a page of 500 wide rows is far below it.
const BODY_LIMIT: usize = 256 * 1024 * 1024;
/// A request that takes longer counts as a transport error.
const TIMEOUT: Duration = Duration::from_secs(60);
/// How long control calls wait out 429s in total before giving up.
const CONTROL_RETRY_BUDGET: Duration = Duration::from_secs(130);

/// A client for one base URL and bearer key.
pub struct Http {
    client: awc::Client,
    base: String,
    auth: String,
    /// Headers every request carries besides the key.
    headers: Vec<(String, String)>,
}

/// One request's answer.
#[derive(Debug)]
pub struct Answer {
    /// HTTP status; 0 for a transport error (connect, timeout, broken body).
    pub status: u16,
    /// The body (empty for a transport error).
    pub body: Bytes,
    /// `Retry-After` seconds, when given.
    pub retry_after: Option<u64>,
    /// What went wrong in transport.
    pub transport_error: Option<String>,
}

impl Answer {
    /// A 2xx answer.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The `errorCode` of an error envelope.
    pub fn error_code(&self) -> Option<String> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Envelope {
            error_code: String,
        }
        serde_json::from_slice::<Envelope>(&self.body).ok().map(|e| e.error_code)
    }

    /// The body as `T`.
    pub fn parse<T: DeserializeOwned>(&self) -> anyhow::Result<T> {
        serde_json::from_slice(&self.body).with_context(|| {
            format!(
                "unexpected answer (HTTP {}): {}",
                self.status,
                String::from_utf8_lossy(&self.body[..self.body.len().min(300)])
            )
        })
    }
}

impl Http {
    /// A client for `base` (`http://host:port/api/v1` or an admin base) with a bearer token.
    pub fn new(base: &str, token: &str) -> Self {
        let client = awc::Client::builder().timeout(TIMEOUT).disable_redirects().finish();
        Http {
            client,
            base: base.trim_end_matches('/').to_owned(),
            auth: format!("Bearer {token}"),
            headers: Vec::new(),
        }
    }

    /// This client, sending `headers` with every request too.
    pub fn with_headers(mut self, headers: &[(String, String)]) -> Self {
        self.headers = headers.to_vec();
        self
    }

    /// The base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Send one request to `base + path`; `body` is JSON.
    pub async fn send(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> Answer {
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.base))
            .insert_header(("Authorization", self.auth.as_str()));
        for (name, value) in &self.headers {
            req = req.insert_header((name.as_str(), value.as_str()));
        }
        let sent = match body {
            Some(b) => req.insert_header(("Content-Type", "application/json")).send_body(b).await,
            None => req.send().await,
        };
        let transport = |e: String| Answer {
            status: 0,
            body: Bytes::new(),
            retry_after: None,
            transport_error: Some(e),
        };
        let mut res = match sent {
            Ok(res) => res,
            Err(e) => return transport(e.to_string()),
        };
        let retry_after = res
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        match res.body().limit(BODY_LIMIT).await {
            Ok(body) => {
                Answer { status: res.status().as_u16(), body, retry_after, transport_error: None }
            }
            Err(e) => transport(format!("reading the body: {e}")),
        }
    }

    /// A control call: the answer's JSON on 2xx, waiting out 429s; an error otherwise.
    pub async fn control(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<Answer> {
        let bytes = body.map(|b| serde_json::to_vec(b).expect("JSON"));
        let started = std::time::Instant::now();
        loop {
            let answer = self.send(method.clone(), path, bytes.clone()).await;
            if let Some(e) = &answer.transport_error {
                bail!("{method} {}{path}: {e}", self.base);
            }
            if answer.status == 429 {
                let wait = Duration::from_secs(answer.retry_after.unwrap_or(1).max(1));
                if started.elapsed() + wait < CONTROL_RETRY_BUDGET {
                    actix_rt::time::sleep(wait).await;
                    continue;
                }
            }
            if !answer.is_success() {
                bail!(
                    "{method} {}{path} answered HTTP {}: {}",
                    self.base,
                    answer.status,
                    String::from_utf8_lossy(&answer.body[..answer.body.len().min(300)])
                );
            }
            return Ok(answer);
        }
    }

    /// A control GET parsed as `T`.
    pub async fn get_json<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.control(Method::GET, path, None).await?.parse()
    }
}
