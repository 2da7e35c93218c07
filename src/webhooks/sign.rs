//! Webhook secrets and signatures, per the Standard Webhooks specification (v1).
//!
//! A secret is shown once as `whsec_` + base64 of its 32 bytes; a message is signed with
//! HMAC-SHA256 over `"<webhook-id>.<webhook-timestamp>.<body>"`, keyed with the secret's
//! bytes, and sent as `webhook-signature: v1,<base64 of the tag>`. Receivers verify it with
//! the specification's own libraries.

use actors::webhook::WebhookSecret;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

/// The prefix of a secret as shown.
pub const SECRET_PREFIX: &str = "whsec_";

/// A new random secret.
pub fn generate_secret() -> WebhookSecret {
    let mut bytes = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut bytes);
    WebhookSecret(bytes)
}

/// The secret as shown to its creator (once).
pub fn show_secret(secret: &WebhookSecret) -> String {
    format!("{SECRET_PREFIX}{}", STANDARD.encode(secret.0))
}

/// The `webhook-signature` header of a message.
pub fn signature(secret: &WebhookSecret, message_id: &str, timestamp: i64, body: &[u8]) -> String {
    sign_with(&secret.0, message_id, timestamp, body)
}

fn sign_with(key: &[u8], message_id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(message_id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_matches_the_specifications_example() {
        // The example of the Standard Webhooks specification ("Verifying webhook
        // authenticity"): secret `whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw`, id
        // `msg_p5jXN8AQM9LWM0D4loKWxJek`, timestamp 1614265330, body `{"test": 2432232314}`.
        // The example's secret is 24 bytes; the service's are 32, and HMAC takes either.
        let bytes = STANDARD.decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            sign_with(&bytes, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(b"abcdefgh");
        let secret = WebhookSecret(key);
        let one = signature(&secret, "msg_1_1", 10, b"{}");
        assert_ne!(one, signature(&secret, "msg_1_1", 11, b"{}"), "the time is signed");
        assert_ne!(one, signature(&secret, "msg_1_1", 10, b"{ }"), "the body is signed");
        assert!(show_secret(&generate_secret()).starts_with("whsec_"));
        assert_eq!(STANDARD.decode(&show_secret(&secret)[6..]).unwrap(), key);
    }
}
