//! Content codings: compressed responses and compressed request bodies
//! (docs/spec/extensions.md X7).
//!
//! # Responses
//!
//! A response body over [`MIN_COMPRESSED_BYTES`] is sent with `zstd`, `br` or `gzip` when the
//! request's `Accept-Encoding` allows one, preferring them in that order when the client rates
//! several equally; 204 and 304 never are. The encoding itself is actix-web's
//! [`Compress`](actix_web::middleware::Compress); two small layers around it hold the policy
//! Compress does not have:
//!
//! 1. [`negotiate`] (outside Compress) picks the coding and rewrites the request's
//!    `Accept-Encoding` to exactly that one, or removes it. Compress ranks `br` above `zstd`,
//!    also offers `deflate`, and answers a plain-text 406 when nothing listed is acceptable;
//!    none of that is the contract (RFC 9110 lets a server fall back to no coding, which is
//!    what this does). On the way out it adds `Vary: Accept-Encoding` to every response that
//!    can have a body (Compress adds it only to those it compressed, yet whether a response is
//!    compressed depends on the header either way), including 304, as RFC 9110 asks of a 304.
//! 2. [`keep_small_plain`] (inside Compress) marks a body of at most 1 KiB with
//!    `Content-Encoding: identity`, the one signal that makes Compress leave a body alone
//!    (it has no size threshold: it would compress a 60-byte `GET /me`, to a larger size).
//!    `negotiate` removes the marker before the response leaves, since RFC 9110 reserves
//!    `identity` for `Accept-Encoding`.
//!
//! Both listeners use the same layers: the admin API's event pages and key lists grow as large
//! as a public page, and one HTTP behaviour for both keeps clients and proxies simple.
//!
//! # Request bodies
//!
//! [`BodyDecoder`] inflates a body sent with `Content-Encoding: gzip` or `zstd` as its chunks
//! arrive, into a buffer that refuses to grow past the body limit: decoding stops at the first
//! byte over it, so a small compressed body that inflates to gigabytes costs at most the limit
//! in memory. actix-web's own payload decoder is not used for this: it inflates each network
//! chunk whole before anyone can count the output (one 64 KiB zstd chunk can hold gigabytes).
//! The compressed size counts against the limit too, so a stream of empty deflate blocks
//! cannot keep a worker reading forever. [`crate::input::read_body`] is the one reader that
//! drives it.

use std::io::{self, Write};

use actix_web::body::{BodySize, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{
    self, AcceptEncoding, ContentEncoding, Encoding, HeaderValue, Preference, Quality,
};
use actix_web::http::StatusCode;
use actix_web::middleware::Next;
use actix_web::{web, HttpMessage, HttpRequest};
use serde_json::json;

use crate::error::ApiError;

/// The largest response body sent uncompressed: bodies "over 1 KiB" are compressed.
pub const MIN_COMPRESSED_BYTES: u64 = 1024;

/// The response codings offered, best first.
const OFFERED: [ContentEncoding; 3] =
    [ContentEncoding::Zstd, ContentEncoding::Brotli, ContentEncoding::Gzip];

/// The request body codings accepted.
const ACCEPTED_BODY_CODINGS: &str = "`gzip`, `zstd` or `identity`";

/// The coding for a response to a request that sent `accept`: the offered coding with the
/// highest quality (its own entry, else `*`'s), the earlier in [`OFFERED`] on a tie; none when
/// every offered coding has quality 0.
fn choose(accept: &AcceptEncoding) -> Option<ContentEncoding> {
    let quality = |enc: ContentEncoding| {
        let named = accept.iter().find(
            |item| matches!(&item.item, Preference::Specific(Encoding::Known(e)) if *e == enc),
        );
        let any = || accept.iter().find(|item| matches!(item.item, Preference::Any));
        named.or_else(any).map_or(Quality::ZERO, |item| item.quality)
    };
    let mut best: Option<(Quality, ContentEncoding)> = None;
    for enc in OFFERED {
        let q = quality(enc);
        if q > Quality::ZERO && best.is_none_or(|(top, _)| q > top) {
            best = Some((q, enc));
        }
    }
    best.map(|(_, enc)| enc)
}

/// The outer layer (module docs, step 1): choose the coding for Compress, then drop the
/// small-body marker and add `Vary`.
pub async fn negotiate(
    mut req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let chosen = req.get_header::<AcceptEncoding>().as_ref().and_then(choose);
    match chosen {
        Some(enc) => {
            req.headers_mut().insert(header::ACCEPT_ENCODING, enc.to_header_value());
        }
        None => {
            req.headers_mut().remove(header::ACCEPT_ENCODING);
        }
    }
    let mut res = next.call(req).await?;
    let no_body = res.status() == StatusCode::NO_CONTENT;
    let headers = res.headers_mut();
    if headers.get(header::CONTENT_ENCODING).is_some_and(|v| v == "identity") {
        headers.remove(header::CONTENT_ENCODING);
    }
    let varies = headers.get_all(header::VARY).any(|v| {
        v.to_str()
            .is_ok_and(|v| v.split(',').any(|f| f.trim().eq_ignore_ascii_case("accept-encoding")))
    });
    if !no_body && !varies {
        headers.append(header::VARY, HeaderValue::from_static("accept-encoding"));
    }
    Ok(res)
}

/// The inner layer (module docs, step 2): keep a body of at most 1 KiB uncompressed.
pub async fn keep_small_plain(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let mut res = next.call(req).await?;
    let small = match res.response().body().size() {
        BodySize::None => true,
        BodySize::Sized(n) => n <= MIN_COMPRESSED_BYTES,
        BodySize::Stream => false,
    };
    if small && !res.headers().contains_key(header::CONTENT_ENCODING) {
        res.headers_mut().insert(header::CONTENT_ENCODING, HeaderValue::from_static("identity"));
    }
    Ok(res)
}

/// Why a body could not be decoded.
#[derive(Debug)]
pub enum DecodeError {
    /// The body (compressed or decompressed) passed the limit.
    TooLarge,
    /// The body is not valid data of its declared coding.
    Corrupt(String),
}

/// A buffer that refuses to grow past `limit` bytes.
struct Bounded {
    buf: web::BytesMut,
    limit: usize,
    /// Set when a write was refused, to tell "too large" from damaged data.
    overflowed: bool,
}

impl Write for Bounded {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() + data.len() > self.limit {
            self.overflowed = true;
            return Err(io::Error::other("body over the limit"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The decoder of the coding a body was sent with.
enum Coding {
    Identity(Bounded),
    Gzip(Box<flate2::write::MultiGzDecoder<Bounded>>),
    Zstd(Box<zstd::stream::write::Decoder<'static, Bounded>>),
}

/// The streaming, bounded decoder of one request body (module docs).
pub struct BodyDecoder {
    coding: Coding,
    /// Compressed bytes taken so far.
    taken: usize,
    limit: usize,
}

/// The most a plain body's buffer is sized for up front, whatever its announced length.
const PRESIZE_MAX: usize = 16 << 20;

/// The largest zstd window accepted, as a power of two: 8 MiB, what zstd's own levels up to
/// 19 use. The decoder allocates the window a frame declares, so without this cap a 20-byte
/// frame could make it allocate 128 MiB.
const ZSTD_WINDOW_LOG_MAX: u32 = 23;

impl BodyDecoder {
    /// The decoder for `req`'s `Content-Encoding`, its output capped at `limit` bytes. An
    /// unknown or stacked coding is a 422 at `["header", "Content-Encoding"]` (415 is not
    /// among the contract's codes).
    pub fn for_request(req: &HttpRequest, limit: usize) -> Result<Self, ApiError> {
        let sink = || Bounded { buf: web::BytesMut::new(), limit, overflowed: false };
        let sent = req.headers().get(header::CONTENT_ENCODING);
        // A plain body's length is announced: one buffer of that size takes it without the
        // copies of growing (a 2000-row bulk body is about 700 KB). The announcement is only
        // trusted up to PRESIZE_MAX bytes; past that the buffer grows as the bytes come.
        let announced = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
            .map_or(0, |n| n.min(limit).min(PRESIZE_MAX));
        let plain =
            || Bounded { buf: web::BytesMut::with_capacity(announced), limit, overflowed: false };
        let name = sent.map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_ascii_lowercase());
        let coding = match name.as_deref() {
            None | Some("identity") => Coding::Identity(plain()),
            Some("gzip" | "x-gzip") => {
                Coding::Gzip(Box::new(flate2::write::MultiGzDecoder::new(sink())))
            }
            Some("zstd") => {
                let mut raw = zstd::stream::raw::Decoder::new().map_err(zstd_setup)?;
                raw.set_parameter(zstd::stream::raw::DParameter::WindowLogMax(ZSTD_WINDOW_LOG_MAX))
                    .map_err(zstd_setup)?;
                Coding::Zstd(Box::new(zstd::stream::write::Decoder::with_decoder(sink(), raw)))
            }
            Some(other) => {
                return Err(ApiError::validation(
                    vec![json!("header"), json!("Content-Encoding")],
                    format!("a body must be sent with Content-Encoding {ACCEPTED_BODY_CODINGS}, got `{other}`"),
                    "value_error",
                ))
            }
        };
        Ok(BodyDecoder { coding, taken: 0, limit })
    }

    /// Decode the next chunk of the body as sent.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), DecodeError> {
        self.taken += chunk.len();
        if self.taken > self.limit {
            return Err(DecodeError::TooLarge);
        }
        let written = match &mut self.coding {
            Coding::Identity(sink) => sink.write_all(chunk),
            Coding::Gzip(dec) => dec.write_all(chunk),
            Coding::Zstd(dec) => dec.write_all(chunk),
        };
        written.map_err(|e| self.failure(e))
    }

    /// The whole decoded body, once the last chunk was pushed.
    pub fn finish(mut self) -> Result<web::Bytes, DecodeError> {
        let done = match &mut self.coding {
            Coding::Identity(_) => Ok(()),
            Coding::Gzip(dec) => dec.try_finish(),
            Coding::Zstd(dec) => dec.do_finish(),
        };
        done.map_err(|e| self.failure(e))?;
        Ok(match self.coding {
            Coding::Identity(sink) => sink.buf,
            Coding::Gzip(dec) => dec.finish().map_err(|e| DecodeError::Corrupt(e.to_string()))?.buf,
            Coding::Zstd(dec) => dec.into_inner().buf,
        }
        .freeze())
    }

    fn sink(&self) -> &Bounded {
        match &self.coding {
            Coding::Identity(sink) => sink,
            Coding::Gzip(dec) => dec.get_ref(),
            Coding::Zstd(dec) => dec.get_ref(),
        }
    }

    fn failure(&self, e: io::Error) -> DecodeError {
        if self.sink().overflowed {
            DecodeError::TooLarge
        } else {
            DecodeError::Corrupt(e.to_string())
        }
    }
}

fn zstd_setup(e: io::Error) -> ApiError {
    ApiError::internal(format!("cannot set up a zstd decoder: {e}"))
}

#[cfg(test)]
mod tests {
    use actix_web::test::TestRequest;

    use super::*;

    fn accept(value: &str) -> Option<ContentEncoding> {
        let req =
            TestRequest::default().insert_header(("accept-encoding", value)).to_http_request();
        req.get_header::<AcceptEncoding>().as_ref().and_then(choose)
    }

    #[test]
    fn zstd_then_br_then_gzip_unless_the_client_rates_them_otherwise() {
        use ContentEncoding::*;
        assert_eq!(accept("gzip, deflate, br, zstd"), Some(Zstd));
        assert_eq!(accept("br, gzip"), Some(Brotli));
        assert_eq!(accept("gzip"), Some(Gzip));
        assert_eq!(accept("*"), Some(Zstd));
        assert_eq!(accept("zstd;q=0.5, gzip"), Some(Gzip));
        assert_eq!(accept("*;q=0.1, br;q=0.5"), Some(Brotli));
        assert_eq!(accept("*, zstd;q=0"), Some(Brotli));
        assert_eq!(accept("deflate"), None);
        assert_eq!(accept("identity"), None);
        assert_eq!(accept("gzip;q=0, *;q=0"), None);
    }

    fn decode(req: &HttpRequest, body: &[u8], limit: usize) -> Result<web::Bytes, DecodeError> {
        let mut dec =
            BodyDecoder::for_request(req, limit).map_err(|e| DecodeError::Corrupt(e.message))?;
        for chunk in body.chunks(1000) {
            dec.push(chunk)?;
        }
        dec.finish()
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(data).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn bodies_inflate_up_to_the_limit_and_no_further() {
        let gz =
            TestRequest::default().insert_header(("content-encoding", "gzip")).to_http_request();
        let zs =
            TestRequest::default().insert_header(("content-encoding", "zstd")).to_http_request();
        let data = vec![b'x'; 100_000];
        assert_eq!(decode(&gz, &gzip(&data), 100_000).unwrap(), data);
        assert!(matches!(decode(&gz, &gzip(&data), 99_999), Err(DecodeError::TooLarge)));
        let z = zstd::encode_all(&data[..], 3).unwrap();
        assert_eq!(decode(&zs, &z, 100_000).unwrap(), data);
        assert!(matches!(decode(&zs, &z, 99_999), Err(DecodeError::TooLarge)));
        assert!(matches!(decode(&gz, b"not gzip at all", 100), Err(DecodeError::Corrupt(_))));
        let cut = gzip(&data);
        assert!(matches!(
            decode(&gz, &cut[..cut.len() - 4], 1 << 20),
            Err(DecodeError::Corrupt(_))
        ));
        assert!(matches!(decode(&zs, &z[..z.len() - 4], 1 << 20), Err(DecodeError::Corrupt(_))));
    }

    #[test]
    fn a_plain_body_is_read_whole_whatever_length_it_announces() {
        let data: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
        for announced in ["0", "10", "50000", "49999", "50001", "99999999999", "junk"] {
            let req = TestRequest::default()
                .insert_header(("content-length", announced))
                .to_http_request();
            assert_eq!(decode(&req, &data, 50_000).unwrap(), data, "announced {announced}");
            assert!(matches!(decode(&req, &data, 49_999), Err(DecodeError::TooLarge)));
        }
    }

    #[test]
    fn an_unknown_coding_is_named() {
        let br = TestRequest::default().insert_header(("content-encoding", "br")).to_http_request();
        let err = BodyDecoder::for_request(&br, 10).err().unwrap();
        assert_eq!(err.detail[0]["loc"], json!(["header", "Content-Encoding"]));
    }
}
