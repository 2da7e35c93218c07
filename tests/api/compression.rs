//! Compressed responses and compressed request bodies (docs/spec/extensions.md X7).

use std::io::{Read, Write};
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::*;

/// A response as sent: `(status, headers, body bytes)`, nothing decoded.
async fn raw_get(
    url: &str,
    key: &str,
    accept_encoding: Option<&str>,
) -> (u16, awc::http::header::HeaderMap, Vec<u8>) {
    raw_request("GET", url, key, accept_encoding).await
}

async fn raw_request(
    method: &str,
    url: &str,
    key: &str,
    accept_encoding: Option<&str>,
) -> (u16, awc::http::header::HeaderMap, Vec<u8>) {
    let client = awc::Client::builder().timeout(Duration::from_secs(60)).finish();
    let mut req = client
        .request(method.parse().unwrap(), url)
        .insert_header(("Authorization", format!("Bearer {key}")));
    if let Some(ae) = accept_encoding {
        req = req.insert_header(("Accept-Encoding", ae));
    }
    let mut res = req.send().await.expect("request sent");
    let body = res.body().limit(64 * 1024 * 1024).await.expect("body read").to_vec();
    (res.status().as_u16(), res.headers().clone(), body)
}

fn header<'a>(h: &'a awc::http::header::HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

fn varies_on_accept_encoding(h: &awc::http::header::HeaderMap) -> bool {
    h.get_all("vary").any(|v| v.to_str().unwrap().to_ascii_lowercase().contains("accept-encoding"))
}

fn decode(coding: &str, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match coding {
        "gzip" => {
            flate2::read::GzDecoder::new(bytes).read_to_end(&mut out).unwrap();
        }
        "br" => {
            brotli::Decompressor::new(bytes, 4096).read_to_end(&mut out).unwrap();
        }
        "zstd" => out = zstd::decode_all(bytes).unwrap(),
        other => panic!("unexpected coding {other}"),
    }
    out
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

/// Sheet 11 with 40 more rows: a listRows page of several KiB.
async fn big_sheet() -> TestServer {
    let s = TestServer::start().await;
    let rows: Vec<Value> = (0..40)
        .map(|i| json!({"cells": {"110": format!("stock item number {i}"), "111": "Open", "112": i}}))
        .collect();
    let (status, body, _) =
        s.post("/sheets/11/rows:bulkAdd", ADA_WRITE, &json!({"rows": rows})).await;
    assert_eq!((status, body["succeededCount"].as_u64()), (200, Some(40)));
    s
}

#[actix_rt::test]
async fn responses_over_1_kib_decompress_to_the_same_json_with_each_coding() {
    let s = big_sheet().await;
    let url = format!("{}/sheets/11/rows?limit=500", s.base);
    let (status, headers, plain) = raw_get(&url, ADA_READ, None).await;
    assert_eq!(status, 200);
    assert!(plain.len() > 1024, "the page is {} bytes", plain.len());
    assert_eq!(header(&headers, "content-encoding"), None);
    assert!(varies_on_accept_encoding(&headers), "Vary even when the client asked for nothing");
    let plain: Value = serde_json::from_slice(&plain).unwrap();
    for coding in ["zstd", "br", "gzip"] {
        let (status, headers, bytes) = raw_get(&url, ADA_READ, Some(coding)).await;
        assert_eq!(status, 200);
        assert_eq!(header(&headers, "content-encoding"), Some(coding));
        assert!(varies_on_accept_encoding(&headers), "{coding}");
        assert_eq!(headers.get_all("vary").count(), 1, "one Vary, not one per layer");
        let decoded: Value = serde_json::from_slice(&decode(coding, &bytes)).unwrap();
        assert_eq!(without_request_id(decoded), without_request_id(plain.clone()), "{coding}");
    }
    // Errors are responses like any other: an error over 1 KiB would be compressed as well;
    // a short one is not, and still varies.
    let (status, headers, _) =
        raw_get(&format!("{}/sheets/99/rows", s.base), ADA_READ, Some("gzip")).await;
    assert_eq!(status, 404);
    assert_eq!(header(&headers, "content-encoding"), None);
    assert!(varies_on_accept_encoding(&headers));
}

#[actix_rt::test]
async fn zstd_is_preferred_then_br_then_gzip_unless_the_client_weighs_them() {
    let s = big_sheet().await;
    let url = format!("{}/sheets/11/rows?limit=500", s.base);
    for (accept, expected) in [
        ("gzip, deflate, br, zstd", Some("zstd")),
        ("gzip, br", Some("br")),
        ("br;q=0.8, gzip", Some("gzip")),
        ("*", Some("zstd")),
        ("*;q=0.5, zstd;q=0, br;q=0", Some("gzip")),
        ("deflate", None),
        ("identity", None),
        // Nothing acceptable: the body is sent without a coding, not refused with a 406.
        ("identity;q=0, *;q=0", None),
    ] {
        let (status, headers, bytes) = raw_get(&url, ADA_READ, Some(accept)).await;
        assert_eq!(status, 200, "{accept}");
        assert_eq!(header(&headers, "content-encoding"), expected, "{accept}");
        if expected.is_none() {
            serde_json::from_slice::<Value>(&bytes).expect("an uncompressed JSON body");
        }
    }
}

#[actix_rt::test]
async fn small_bodies_and_204_are_never_compressed() {
    let s = TestServer::start().await;
    let (status, headers, bytes) =
        raw_get(&format!("{}/me", s.base), ADA_WRITE, Some("zstd, br, gzip")).await;
    assert_eq!(status, 200);
    assert!(bytes.len() <= 1024);
    assert_eq!(header(&headers, "content-encoding"), None);
    assert!(varies_on_accept_encoding(&headers));
    serde_json::from_slice::<Value>(&bytes).expect("plain JSON");
    let (status, headers, bytes) =
        raw_request("DELETE", &format!("{}/sheets/10/rows/1003", s.base), ADA_WRITE, Some("gzip"))
            .await;
    assert_eq!(status, 204);
    assert!(bytes.is_empty());
    assert_eq!(header(&headers, "content-encoding"), None);
    assert!(!varies_on_accept_encoding(&headers), "a 204 has no body to vary");
    // The admin listener follows the same rules.
    let events = format!("{}/events?limit=500", s.admin);
    let (status, headers, _) = raw_get(&events, ADMIN_TOKEN, Some("gzip")).await;
    assert_eq!(status, 200);
    assert!(varies_on_accept_encoding(&headers));
}

#[actix_rt::test]
async fn gzip_and_zstd_request_bodies_are_accepted() {
    let s = TestServer::start().await;
    let url = format!("{}/sheets/11/rows:bulkAdd", s.base);
    let body = json!({"rows": [{"cells": {"110": "packed", "112": 2}}, {"cells": {"112": "bad"}}]});
    let text = body.to_string().into_bytes();
    for (coding, bytes) in
        [("gzip", gzip(&text)), ("zstd", zstd::encode_all(&text[..], 3).unwrap())]
    {
        let r =
            send("POST", &url, Some(ADA_WRITE), &[("Content-Encoding", coding)], Some(bytes)).await;
        assert_eq!(r.0, 200, "{coding}: {}", r.1);
        assert_eq!(r.1["succeededCount"], 1, "{coding}");
        assert_eq!(r.1["results"][0]["row"]["cells"]["110"], "packed");
        assert_eq!(r.1["results"][1]["error"]["errorCode"], "validation_failed");
    }
    // A coding the server does not take, and data that is not what it claims.
    let r = send("POST", &url, Some(ADA_WRITE), &[("Content-Encoding", "br")], Some(text.clone()))
        .await;
    assert_error(&r, 422, "validation_failed");
    assert_eq!(r.1["detail"][0]["loc"], json!(["header", "Content-Encoding"]));
    let r = send("POST", &url, Some(ADA_WRITE), &[("Content-Encoding", "gzip")], Some(text)).await;
    assert_error(&r, 422, "validation_failed");
    assert_eq!(r.1["detail"][0]["loc"], json!(["body"]));
}

#[actix_rt::test]
async fn the_body_limit_counts_decompressed_bytes() {
    let s = TestServer::start_with(fixture(), |a| a.max_body_bytes = 1024 * 1024).await;
    let url = format!("{}/sheets/11/rows:bulkAdd", s.base);
    // 64 MiB of JSON whitespace around a valid body: about 64 KiB on the wire.
    let mut text = b"{\"rows\": [{\"cells\": {\"110\": \"x\"}}]".to_vec();
    text.resize(text.len() + 64 * 1024 * 1024, b' ');
    text.push(b'}');
    let bomb = gzip(&text);
    assert!(bomb.len() < 1024 * 1024, "the compressed body alone is under the limit");
    let r = send("POST", &url, Some(ADA_WRITE), &[("Content-Encoding", "gzip")], Some(bomb)).await;
    assert_error(&r, 413, "payload_too_large");
    assert_eq!(r.1["detail"]["maxBytes"], 1024 * 1024);
    let bomb = zstd::encode_all(&text[..], 3).unwrap();
    let r = send("POST", &url, Some(ADA_WRITE), &[("Content-Encoding", "zstd")], Some(bomb)).await;
    assert_error(&r, 413, "payload_too_large");
    // Nothing was written, and the same body inflating to just under the limit goes through.
    let (_, sheet, _) = s.get("/sheets/11", ADA_READ).await;
    assert_eq!(sheet["rowCount"], 1);
    let mut text = b"{\"rows\": [{\"cells\": {\"110\": \"x\"}}]".to_vec();
    text.resize(1024 * 1024 - 1, b' ');
    text.push(b'}');
    let r = send("POST", &url, Some(ADA_WRITE), &[("Content-Encoding", "gzip")], Some(gzip(&text)))
        .await;
    assert_eq!(r.0, 200, "{}", r.1);
    assert_eq!(r.1["succeededCount"], 1);
}
