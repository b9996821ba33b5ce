//! A fenced store: the other half of fencing tokens, as a protected
//! resource would implement it.

use std::io;

use redis::Script;

/// Applies a write only if its token is at least the highest token seen.
///
/// KEYS[1] the value, KEYS[2] the highest token seen. ARGV[1] token,
/// ARGV[2] value. Reply: 1 when applied, 0 when rejected.
const FENCED_SET: &str = r"
local highest = tonumber(redis.call('get', KEYS[2]) or '0')
if tonumber(ARGV[1]) < highest then
    return 0
end
redis.call('set', KEYS[2], ARGV[1])
redis.call('set', KEYS[1], ARGV[2])
return 1
";

/// A value in Redis that accepts a write only when the writer's fencing token
/// is not lower than any token it has seen: a stale holder's late write is
/// rejected.
///
/// # Examples
///
/// ```no_run
/// use multilock_testkit::FencedStore;
///
/// # async fn demo() -> std::io::Result<()> {
/// let store = FencedStore::new("redis://127.0.0.1:6379", "doc");
/// assert!(store.write(7, "new").await?);
/// assert!(!store.write(6, "stale").await?, "an older token is rejected");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct FencedStore {
    url: String,
    key: String,
    /// Made on first use, shared by clones (writes pipeline on it).
    conn: std::sync::Arc<tokio::sync::OnceCell<redis::aio::MultiplexedConnection>>,
}

impl FencedStore {
    /// The value `key` on the server at `url`; the highest token seen is
    /// kept under `<key>:highest-token`.
    pub fn new(url: impl Into<String>, key: impl Into<String>) -> FencedStore {
        FencedStore {
            url: url.into(),
            key: key.into(),
            conn: Default::default(),
        }
    }

    /// Writes `value` with `token`; `false` when a higher token was seen.
    ///
    /// # Errors
    ///
    /// When the server cannot be reached or answers with an error.
    ///
    /// # Cancel safety
    ///
    /// One request: if dropped after sending, it may or may not be applied.
    pub async fn write(&self, token: u64, value: &str) -> io::Result<bool> {
        let mut conn = self.connection().await?;
        let applied: i64 = Script::new(FENCED_SET)
            .key(&self.key)
            .key(self.token_key())
            .arg(token)
            .arg(value)
            .invoke_async(&mut conn)
            .await
            .map_err(io::Error::other)?;
        Ok(applied == 1)
    }

    /// The value last written, if any.
    ///
    /// # Errors
    ///
    /// When the server cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: read only.
    pub async fn read(&self) -> io::Result<Option<String>> {
        let mut conn = self.connection().await?;
        redis::cmd("GET")
            .arg(&self.key)
            .query_async(&mut conn)
            .await
            .map_err(io::Error::other)
    }

    /// The highest token a write carried so far (0 before any).
    ///
    /// # Errors
    ///
    /// When the server cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: read only.
    pub async fn highest_token(&self) -> io::Result<u64> {
        let mut conn = self.connection().await?;
        let token: Option<u64> = redis::cmd("GET")
            .arg(self.token_key())
            .query_async(&mut conn)
            .await
            .map_err(io::Error::other)?;
        Ok(token.unwrap_or(0))
    }

    fn token_key(&self) -> String {
        format!("{}:highest-token", self.key)
    }

    async fn connection(&self) -> io::Result<redis::aio::MultiplexedConnection> {
        let conn = self
            .conn
            .get_or_try_init(|| async {
                redis::Client::open(self.url.as_str())
                    .map_err(io::Error::other)?
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(io::Error::other)
            })
            .await?;
        Ok(conn.clone())
    }
}
