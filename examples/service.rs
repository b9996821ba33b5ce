//! How a service uses multilock, with nothing but the library: the lock
//! type chosen from configuration ([`AnyLock`]), a bounded wait
//! (`run_locked_for`), the fencing token passed to the write it guards,
//! and which errors to retry ([`Error::is_permanent`]).
//!
//! It needs running Redis servers: one URL for a single-node lock, several
//! for a RedLock.
//!
//! ```text
//! cargo run --example service -- redis://127.0.0.1:6379
//! cargo run --example service -- redis://h1:6379 redis://h2:6379 redis://h3:6379
//! ```

use std::time::Duration;

use multilock::redis::{self, AsyncCommands};
use multilock::{AnyLock, Client, DistributedLock, Error, Node};

/// How long a request waits for the lock before it reports "busy".
const WAIT: Duration = Duration::from_secs(2);
const ATTEMPTS: u32 = 5;

/// The write the lock guards, fenced: the store keeps the highest token it
/// has seen and refuses a write that carries a lower one (a holder that
/// paused past its lease and woke up after another took over).
const FENCED_WRITE: &str = r"
local seen = tonumber(redis.call('HGET', KEYS[1], 'token') or '0')
if tonumber(ARGV[1]) <= seen then return 0 end
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'total', ARGV[2])
return 1";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let urls: Vec<String> = std::env::args().skip(1).collect();
    if urls.is_empty() {
        return Err("usage: service REDIS_URL [REDIS_URL ...]".into());
    }
    let nodes = urls
        .iter()
        .map(|url| Node::new(url))
        .collect::<Result<Vec<_>, _>>()?;
    let client = Client::new();
    // One node, or a RedLock over several: the rest of the code is the same.
    let lock: AnyLock = match nodes.as_slice() {
        [one] => client.lock(one, "orders:42")?.with_fencing().into(),
        many => client.red_lock_on(many, "orders:42")?.with_fencing().into(),
    };
    // The store the work writes to (here a hash on the first server).
    let store = redis::Client::open(urls[0].as_str())?;
    let store = store.get_multiplexed_async_connection().await?;
    let write = redis::Script::new(FENCED_WRITE);

    for attempt in 1..=ATTEMPTS {
        let outcome = lock
            .run_locked_for(WAIT, None, |token| {
                let (mut store, write) = (store.clone(), write.clone());
                async move {
                    let token = token.expect("a fenced lock hands out a token");
                    let total: u64 = store.hincr("orders:42:lines", "count", 1).await?;
                    let written: bool = write
                        .key("orders:42:store")
                        .arg(token)
                        .arg(total)
                        .invoke_async(&mut store)
                        .await?;
                    Ok::<_, redis::RedisError>((token, written))
                }
            })
            .await;
        match outcome {
            Ok(Some(Ok((token, true)))) => {
                println!("attempt {attempt}: written under token {token}");
                return Ok(());
            }
            Ok(Some(Ok((token, false)))) => {
                // A later holder wrote first: this one's turn had passed.
                println!("attempt {attempt}: token {token} refused by the store");
                return Ok(());
            }
            Ok(Some(Err(err))) => return Err(err.into()), // the store's own failure
            Ok(None) => println!("attempt {attempt}: busy for {WAIT:?}, trying again"),
            // A wrong password, an ACL refusal, bad input: no retry mends it.
            Err(err) if err.is_permanent() => return Err(err.into()),
            // The work was stopped because the lock could not be proven held.
            Err(Error::LockLost { lock }) => println!("attempt {attempt}: {lock} lost, retrying"),
            // Nodes down, no quorum: worth another try after a pause.
            Err(err) => println!("attempt {attempt}: {err}, retrying"),
        }
        tokio::time::sleep(Duration::from_millis(200) * attempt).await;
    }
    Err(format!("not done after {ATTEMPTS} attempts").into())
}
