//! Addresses: a URL's connection settings (checked, RESP3, `TCP_NODELAY`),
//! a node's `host:port` name, a URL shown without its password, and a
//! client for an address. Beneath everything else in `node`, which all
//! name servers by these.

use redis::{ConnectionAddr, ConnectionInfo, ProtocolVersion};

use crate::error::{Error, Result};

/// The connection settings of a `redis://` or `rediss://` URL, for RESP3
/// with `TCP_NODELAY`; the error shows the URL without its password.
pub(crate) fn connection_info(url: &str) -> Result<ConnectionInfo> {
    let shown = redact_url(url);
    if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
        return Err(Error::invalid(format!(
            "Redis URL {shown:?} must start with redis:// or rediss://"
        )));
    }
    if url.starts_with("rediss://") && !cfg!(feature = "tls") {
        return Err(Error::invalid(format!(
            "Redis URL {shown:?} uses TLS: enable the `tls` feature of multilock"
        )));
    }
    let info = redis::IntoConnectionInfo::into_connection_info(url)
        .map_err(|_| Error::invalid(format!("Redis URL {shown:?} does not parse")))?;
    // RESP3: the subscription shares one connection with pushes, and
    // command connections report their own disconnection.
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    Ok(info
        .set_redis_settings(settings)
        .set_tcp_settings(tcp_settings(true)))
}

/// The socket settings of a node's connections: `TCP_NODELAY` unless
/// [`NodeBuilder::tcp_nodelay`](super::NodeBuilder::tcp_nodelay) turned it
/// off. With it, as Redisson (Netty) sets it, every request leaves at once;
/// with Nagle's algorithm a request written while an earlier one is
/// unacknowledged waits for that reply (one more round trip on a real
/// network), and many small requests leave in fewer packets.
pub(crate) fn tcp_settings(nodelay: bool) -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(nodelay)
}

/// A client for `info`, trusting `root_cert` (PEM) too when it is a TLS
/// address and one is given (feature `tls`).
pub(crate) fn open_client(
    info: ConnectionInfo,
    root_cert: Option<&[u8]>,
) -> redis::RedisResult<redis::Client> {
    #[cfg(feature = "tls")]
    if let (Some(pem), ConnectionAddr::TcpTls { .. }) = (root_cert, info.addr()) {
        let certs = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem.to_vec()),
        };
        return redis::Client::build_with_tls(info, certs);
    }
    let _ = root_cert;
    redis::Client::open(info)
}

/// `host:port` of a connection's address, as nodes are named.
pub(crate) fn addr_of(info: &ConnectionInfo) -> String {
    match info.addr() {
        ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
        ConnectionAddr::TcpTls { host, port, .. } => format!("{host}:{port}"),
        other => format!("{other}"),
    }
}

/// `url` without its `user:password@` part, as this crate writes URLs in
/// its errors and logs: for the messages an application writes itself.
///
/// The last `@` ends the credentials, wherever it is: a password may hold
/// `/`, `?`, `#` or `@`.
///
/// # Examples
///
/// ```
/// assert_eq!(multilock::redact_url("redis://app:s3cret@cache:6379/0"), "redis://***@cache:6379/0");
/// assert_eq!(multilock::redact_url("redis://cache:6379"), "redis://cache:6379");
/// ```
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(end) => url.split_at(end + 3),
        None => ("", url),
    };
    // The last `@` anywhere, not just in the authority: a password holding
    // `/`, `?` or `#` must not end the search early and leak.
    match rest.rfind('@') {
        Some(at) => format!("{scheme}***@{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}
