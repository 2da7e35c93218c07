//! Where a webhook may post: the checks of its URL, and the one resolver every delivery
//! connects through.
//!
//! A webhook's URL is the caller's, but the connection is the server's: without these checks a
//! key could make the server post to its own loopback, the private network behind it or a
//! cloud metadata endpoint. So a URL must be `http` or `https`, at most 2,048 characters,
//! without credentials, and (unless the operator allows private receivers) its host must
//! resolve to public addresses only. The host is resolved again at every connection and the
//! connection goes to an address that passed the check ([`resolve`]), so a DNS answer that
//! changes after creation cannot turn a webhook inward.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use url::{Host, Url};

/// The longest URL taken.
pub const MAX_URL_LEN: usize = 2048;

/// How long a resolution may take before it counts as failed.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(3);

/// Why a URL or an address was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// Not a URL this service posts to (scheme, length, credentials, no host).
    #[error("{0}")]
    Malformed(String),
    /// The host is, or resolves to, an address that is not public.
    #[error("{0}")]
    NotPublic(String),
    /// The host did not resolve (in time).
    #[error("{0}")]
    Unresolved(String),
}

/// The URL's shape: scheme, length, credentials and host; the address is checked apart
/// ([`resolve`]).
///
/// # Errors
/// [`AddressError::Malformed`], with a sentence saying what is wrong.
pub fn parse(text: &str) -> Result<Url, AddressError> {
    let bad = |why: &str| AddressError::Malformed(why.to_owned());
    if text.chars().count() > MAX_URL_LEN {
        return Err(bad("the URL is longer than 2048 characters"));
    }
    let url = Url::parse(text).map_err(|e| AddressError::Malformed(format!("not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad("the URL's scheme must be `http` or `https`"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad("the URL must not carry credentials"));
    }
    if url.host().is_none() || url.port_or_known_default().is_none() {
        return Err(bad("the URL must name a host"));
    }
    Ok(url)
}

/// Whether `ip` is a public address: not loopback, private, link-local, multicast,
/// unspecified, or any other range that never leaves a host or its network (shared CGNAT
/// space, documentation and benchmarking ranges, reserved, broadcast); an IPv6 address that
/// embeds an IPv4 one (mapped, compatible, NAT64, 6to4) is judged by that one.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local() // 169.254/16: the metadata endpoint of most clouds
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_documentation()
        || a == 0 // "this network"
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (18..20).contains(&b)) // benchmarking
        || a >= 240) // reserved
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    // IPv4-compatible (::a.b.c.d, deprecated, still routed by some stacks) and NAT64.
    if s[..6] == [0; 6] && !(s[6] == 0 && s[7] <= 1) {
        return is_public_v4(Ipv4Addr::new(
            (s[6] >> 8) as u8,
            s[6] as u8,
            (s[7] >> 8) as u8,
            s[7] as u8,
        ));
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return is_public_v4(Ipv4Addr::new(
            (s[6] >> 8) as u8,
            s[6] as u8,
            (s[7] >> 8) as u8,
            s[7] as u8,
        ));
    }
    if s[0] == 0x2002 {
        return is_public_v4(Ipv4Addr::new(
            (s[1] >> 8) as u8,
            s[1] as u8,
            (s[2] >> 8) as u8,
            s[2] as u8,
        ));
    }
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (s[0] & 0xfe00) == 0xfc00 // unique local fc00::/7
        || (s[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
        || (s[0] & 0xffc0) == 0xfec0 // site-local fec0::/10 (deprecated)
        || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
        || s[0] == 0x0100 && s[1..4] == [0, 0, 0]) // discard-only 100::/64
}

/// Resolves `url`'s host to the addresses a connection may use: every address the host
/// resolves to must be public unless `allow_private` (one inward address refuses the host:
/// a connection must not depend on which address is tried first).
///
/// # Errors
/// [`AddressError::NotPublic`] for an address that is not public, [`AddressError::Unresolved`]
/// when the host resolves to nothing (or not within [`RESOLVE_TIMEOUT`]).
pub async fn resolve(url: &Url, allow_private: bool) -> Result<Vec<SocketAddr>, AddressError> {
    let port = url.port_or_known_default().unwrap_or(80);
    let addrs: Vec<SocketAddr> = match url.host() {
        Some(Host::Ipv4(ip)) => vec![SocketAddr::new(IpAddr::V4(ip), port)],
        Some(Host::Ipv6(ip)) => vec![SocketAddr::new(IpAddr::V6(ip), port)],
        Some(Host::Domain(name)) => {
            let lookup = tokio::net::lookup_host((name.to_owned(), port));
            match tokio::time::timeout(RESOLVE_TIMEOUT, lookup).await {
                Ok(Ok(found)) => found.collect(),
                Ok(Err(e)) => {
                    return Err(AddressError::Unresolved(format!("`{name}` does not resolve: {e}")))
                }
                Err(_) => {
                    return Err(AddressError::Unresolved(format!(
                        "`{name}` did not resolve within {RESOLVE_TIMEOUT:?}"
                    )))
                }
            }
        }
        None => return Err(AddressError::Malformed("the URL must name a host".into())),
    };
    if addrs.is_empty() {
        return Err(AddressError::Unresolved("the host resolves to no address".into()));
    }
    if !allow_private {
        if let Some(inward) = addrs.iter().find(|a| !is_public(a.ip())) {
            return Err(AddressError::NotPublic(format!(
                "the host resolves to {}, which is not a public address (loopback, private, \
                 link-local, multicast or unspecified)",
                inward.ip()
            )));
        }
    }
    Ok(addrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn public(text: &str) -> bool {
        is_public(text.parse().unwrap())
    }

    #[test]
    fn every_inward_class_is_refused_and_public_addresses_pass() {
        for inward in [
            "127.0.0.1",
            "127.8.9.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "224.0.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "100.64.0.1",
            "::1",
            "::",
            "fe80::1",
            "fc00::1",
            "fd12:3456::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:10.0.0.1",
            "64:ff9b::a00:1",
            "2002:c0a8:101::1",
            "::127.0.0.1",
        ] {
            assert!(!public(inward), "{inward} must be refused");
        }
        for outward in ["93.184.216.34", "8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8"] {
            assert!(public(outward), "{outward} is public");
        }
    }

    #[test]
    fn the_url_shape_is_checked_before_any_address() {
        assert!(parse("https://example.com/hook?x=1").is_ok());
        for bad in [
            "ftp://example.com/",
            "https://user:pw@example.com/",
            "https://user@example.com/",
            "not a url",
            "file:///etc/passwd",
            "http://",
        ] {
            assert!(matches!(parse(bad), Err(AddressError::Malformed(_))), "{bad}");
        }
        let long = format!("https://example.com/{}", "a".repeat(MAX_URL_LEN));
        assert!(matches!(parse(&long), Err(AddressError::Malformed(_))));
    }

    #[actix_rt::test]
    async fn literal_and_odd_spellings_of_inward_hosts_are_refused() {
        for url in [
            "http://127.0.0.1:9/",
            "http://0x7f.1/",
            "http://2130706433/",
            "http://[::1]/",
            "http://[::ffff:7f00:1]/",
            "http://169.254.169.254/latest/meta-data",
        ] {
            let parsed = parse(url).unwrap();
            assert!(
                matches!(resolve(&parsed, false).await, Err(AddressError::NotPublic(_))),
                "{url}"
            );
            assert!(resolve(&parsed, true).await.is_ok(), "{url} with private allowed");
        }
    }
}
