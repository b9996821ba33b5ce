//! The crate's metrics (feature `metrics`) exposed for Prometheus.
//!
//! ```text
//! cargo run --example metrics --features metrics                # a workload, then the scrape output
//! cargo run --example metrics --features metrics -- --serve 60  # and serve /metrics on 127.0.0.1:9898 for 60 s
//! ```
//!
//! It installs `metrics-exporter-prometheus` as the recorder, starts three
//! `redis-server` processes, runs a little contention on a `Lock` and a
//! `RedLock`, and prints what Prometheus would scrape.

use std::net::SocketAddr;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use multilock::{Client, Node};
use multilock_testkit::{RedisProcess, TestServer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let serve_for = std::env::args()
        .skip_while(|arg| arg != "--serve")
        .nth(1)
        .map(|secs| secs.parse().map(Duration::from_secs))
        .transpose()?;
    let listen: SocketAddr = "127.0.0.1:9898".parse()?;
    let prometheus = match serve_for {
        Some(_) => PrometheusBuilder::new()
            .with_http_listener(listen)
            .install_recorder()?,
        None => PrometheusBuilder::new().install_recorder()?,
    };

    let servers = RedisProcess::start_many(3).await?;
    let nodes = servers
        .iter()
        .map(|s| Node::new(&s.url()))
        .collect::<Result<Vec<_>, _>>()?;
    let client = Client::new();
    let single = client.lock(&nodes[0], "orders:42")?;
    let red = client.red_lock_on(&nodes, "orders:42")?;

    // Eight tasks contend for each lock, a few times each.
    let mut tasks: Vec<tokio::task::JoinHandle<multilock::Result<()>>> = Vec::new();
    for _ in 0..8 {
        let (single, red) = (single.clone(), red.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                let guard = single.lock().await?;
                tokio::time::sleep(Duration::from_millis(2)).await;
                guard.unlock().await?;
                let guard = red.lock_with_lease(Duration::from_secs(5)).await?;
                tokio::time::sleep(Duration::from_millis(2)).await;
                guard.unlock().await?;
            }
            Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }

    println!("{}", prometheus.render());
    if let Some(serve_for) = serve_for {
        println!("serving http://{listen}/metrics for {serve_for:?}");
        tokio::time::sleep(serve_for).await;
    }
    for server in servers {
        server.rm().await?;
    }
    Ok(())
}
