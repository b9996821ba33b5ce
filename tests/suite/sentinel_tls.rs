//! A node that is a Sentinel group's primary reached over TLS
//! (`Node::sentinel(..).tls(true)`): the sentinels (asked over plain TCP)
//! name the primary's TLS port, and the node's connections to the data
//! nodes speak TLS.
//!
//! The group: a primary and 2 replicas, each on a plain port (the kit's,
//! which the test uses to look at it) and a TLS port (replication is TLS,
//! replicas announce their TLS ports), and 3 sentinels with a plain port
//! (the node's sentinel URLs) and a TLS port, `tls-replication yes`, so
//! they monitor the primary by its TLS port and talk TLS to the data nodes
//! and to each other. The certificate is for `127.0.0.1`, signed by a CA
//! the test makes.
//!
//! The node trusts that CA through `NodeBuilder::tls_root_cert`; so does
//! a URL node to the same primary, checked first (the URL node with
//! `#insecure` shows the group and the checks work on their own).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use multilock::{Client, Node};
use multilock_testkit::RedisProcess;

use crate::common::*;

/// The node's connect and reply timeouts.
const NODE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the group may take to start.
const READY: Duration = Duration::from_secs(30);

/// The name the sentinels monitor the primary under.
const MASTER: &str = "mymaster";

/// A test CA, and a server certificate it signs for `127.0.0.1` (CN and IP
/// SAN: what the sentinels name), not a CA itself: a certificate a client
/// that trusts the CA accepts.
struct Certificates {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

/// Runs `openssl` with `args`; panics with its stderr when it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let made = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl runs");
    assert!(
        made.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&made.stderr)
    );
}

/// Makes the [`Certificates`] in `dir`.
fn make_certificates(dir: &Path) -> Certificates {
    let new_key = ["-newkey", "rsa:2048", "-nodes"];
    openssl(
        dir,
        &[&["req", "-x509", "-days", "1"], &new_key[..]]
            .concat()
            .into_iter()
            .chain([
                "-subj",
                "/CN=multilock test CA",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
            ])
            .collect::<Vec<_>>(),
    );
    openssl(
        dir,
        &[&["req"], &new_key[..]]
            .concat()
            .into_iter()
            .chain([
                "-subj",
                "/CN=127.0.0.1",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
            ])
            .collect::<Vec<_>>(),
    );
    std::fs::write(
        dir.join("server.ext"),
        "basicConstraints=critical,CA:FALSE\nsubjectAltName=IP:127.0.0.1\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-days",
            "1",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-extfile",
            "server.ext",
            "-out",
            "server.crt",
        ],
    );
    Certificates {
        ca: dir.join("ca.crt"),
        cert: dir.join("server.crt"),
        key: dir.join("server.key"),
    }
}

/// A data node: its process (on its plain port) and its TLS port.
struct DataNode {
    process: RedisProcess,
    tls_port: u16,
}

impl DataNode {
    fn plain_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.process.port())
    }
}

/// Starts a data node on a plain port (the kit's) with TLS on a second
/// free port; a replica of the TLS port `primary`, over TLS, if given.
async fn start_data_node(certs: &Certificates, primary: Option<u16>) -> DataNode {
    let path = |p: &PathBuf| p.display().to_string();
    let (ca, cert, key) = (path(&certs.ca), path(&certs.cert), path(&certs.key));
    // The TLS port of the last attempt: the closure runs again for each port.
    let chosen = Mutex::new(0u16);
    let process = RedisProcess::start_with_args(|port| {
        let tls_port = std::iter::repeat_with(free_port)
            .find(|&p| p != port)
            .unwrap();
        *chosen.lock().unwrap() = tls_port;
        let (port, tls_port) = (port.to_string(), tls_port.to_string());
        let mut args = vec![
            "--port",
            &port,
            "--tls-port",
            &tls_port,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            "no",
            "--tls-replication",
            "yes",
            "--repl-diskless-sync-delay",
            "0",
        ];
        let primary = primary.map(|p| p.to_string());
        if let Some(primary) = &primary {
            args.extend(["--replicaof", "127.0.0.1", primary]);
        }
        args.into_iter().map(str::to_owned).collect()
    })
    .await
    .unwrap_or_else(|err| panic!("cannot start a TLS data node: {err}"));
    let tls_port = *chosen.lock().unwrap();
    DataNode { process, tls_port }
}

/// A sentinel: `redis-server <config> --sentinel` on a plain and a TLS
/// port, its config (which it rewrites) in a directory of its own, killed
/// when dropped.
struct Sentinel {
    port: u16,
    dir: PathBuf,
    child: Child,
}

impl Sentinel {
    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts a sentinel monitoring the primary at TLS port `primary`, and
    /// waits until it answers as itself (`INFO` names its pid); another
    /// port pair when one was taken.
    async fn start(certs: &Certificates, primary: u16) -> Sentinel {
        for _ in 0..5 {
            let (port, tls_port) = (free_port(), free_port());
            if port == tls_port {
                continue;
            }
            let name = format!("multilock-sentinel-tls-{port}-{}", std::process::id());
            let dir = std::env::temp_dir().join(name);
            std::fs::create_dir_all(&dir).unwrap();
            let config = [
                format!("port {port}"),
                "bind 127.0.0.1".to_owned(),
                format!("dir \"{}\"", dir.display()),
                format!("tls-port {tls_port}"),
                format!("tls-cert-file \"{}\"", certs.cert.display()),
                format!("tls-key-file \"{}\"", certs.key.display()),
                format!("tls-ca-cert-file \"{}\"", certs.ca.display()),
                "tls-auth-clients no".to_owned(),
                // TLS to the monitored instances and to the other sentinels.
                "tls-replication yes".to_owned(),
                "sentinel resolve-hostnames no".to_owned(),
                format!("sentinel monitor {MASTER} 127.0.0.1 {primary} 2"),
                format!("sentinel down-after-milliseconds {MASTER} 1000"),
                format!("sentinel failover-timeout {MASTER} 5000\n"),
            ];
            std::fs::write(dir.join("sentinel.conf"), config.join("\n")).unwrap();
            let binary = std::env::var("MULTILOCK_REDIS_SERVER")
                .unwrap_or_else(|_| "redis-server".to_owned());
            let child = Command::new(&binary)
                .arg(dir.join("sentinel.conf"))
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|err| panic!("cannot run {binary}: {err}"));
            let mut sentinel = Sentinel { port, dir, child };
            if sentinel.wait_until_up().await {
                return sentinel;
            }
        }
        panic!("no sentinel started in 5 attempts");
    }

    /// Whether it answers as itself within 10 s; false when it exited
    /// (its port taken).
    async fn wait_until_up(&mut self) -> bool {
        let (url, pid) = (self.url(), self.child.id().to_string());
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if self.child.try_wait().unwrap().is_some() {
                return false;
            }
            let info = run::<String>(&url, redis::cmd("INFO").arg("server")).await;
            if info.is_ok_and(|i| i.contains(&format!("process_id:{pid}\r\n"))) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("sentinel {url} did not answer within 10 s");
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Sentinel group over TLS; the certificate's directory is removed when
/// dropped, after the processes.
struct TlsGroup {
    sentinels: Vec<Sentinel>,
    data: Vec<DataNode>,
    dir: PathBuf,
    /// The test CA's certificate (PEM).
    ca: Vec<u8>,
}

impl Drop for TlsGroup {
    fn drop(&mut self) {
        self.sentinels.clear();
        self.data.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl TlsGroup {
    /// Starts the data nodes, then (once both replicas are online over
    /// TLS) the sentinels, and waits until every sentinel names the
    /// primary's TLS port, up, with 2 replicas and 3 sentinels.
    async fn start() -> TlsGroup {
        init_tracing();
        let dir =
            std::env::temp_dir().join(format!("multilock-sentinel-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let certs = make_certificates(&dir);
        let primary = start_data_node(&certs, None).await;
        let replica = || start_data_node(&certs, Some(primary.tls_port));
        let (a, b) = tokio::join!(replica(), replica());
        let mut group = TlsGroup {
            sentinels: Vec::new(),
            data: vec![primary, a, b],
            dir,
            ca: std::fs::read(&certs.ca).unwrap(),
        };
        let primary_url = group.data[0].plain_url();
        eventually(
            READY,
            |seen: &String| format!("the replicas did not sync over TLS: {seen}"),
            || async {
                let info: String = run(&primary_url, redis::cmd("INFO").arg("replication"))
                    .await
                    .map_err(|e| e.to_string())?;
                // Replicas over TLS announce their TLS ports.
                let online = group.data[1..]
                    .iter()
                    .filter(|r| info.contains(&format!("port={},state=online", r.tls_port)))
                    .count();
                match online {
                    2 => Ok(()),
                    _ => Err(info),
                }
            },
        )
        .await;
        let primary_tls = group.data[0].tls_port;
        let sentinels = (0..3).map(|_| Sentinel::start(&certs, primary_tls));
        group.sentinels = futures::future::join_all(sentinels).await;
        let want = format!("status=ok,address=127.0.0.1:{primary_tls},slaves=2,sentinels=3");
        eventually(
            READY,
            |seen: &String| format!("the TLS Sentinel group did not become ready: {seen}"),
            || async {
                for sentinel in &group.sentinels {
                    let url = sentinel.url();
                    let info: String = run(&url, redis::cmd("INFO").arg("sentinel"))
                        .await
                        .map_err(|e| format!("{url}: {e}"))?;
                    if !info.contains(&want) {
                        return Err(format!("{url}: {info}"));
                    }
                }
                Ok(())
            },
        )
        .await;
        group
    }

    fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(Sentinel::url).collect()
    }

    /// The TLS port each sentinel names for the primary.
    async fn named_ports(&self) -> Vec<u16> {
        let mut ports = Vec::new();
        for url in self.sentinel_urls() {
            let cmd = redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(MASTER)
                .clone();
            let (host, port): (String, u16) = run(&url, &cmd).await.unwrap();
            assert_eq!(host, "127.0.0.1");
            ports.push(port);
        }
        ports
    }
}

/// A node following the group's primary over TLS.
fn tls_sentinel_node(group: &TlsGroup) -> Node {
    Node::sentinel(MASTER, group.sentinel_urls())
        .tls(true)
        .tls_root_cert(group.ca.clone())
        .connect_timeout(NODE_TIMEOUT)
        .response_timeout(NODE_TIMEOUT)
        .build()
        .unwrap()
}

/// The id the next client of the server at `url` exceeds.
async fn client_id(url: &str) -> u64 {
    run(url, redis::cmd("CLIENT").arg("ID")).await.unwrap()
}

/// The lines of `CLIENT LIST` at `url` of the clients that connected after
/// the one with id `since`, but the sentinels' and the replicas' (which
/// connect over TLS too).
async fn clients_since(url: &str, since: u64) -> Vec<String> {
    let clients: String = run(url, redis::cmd("CLIENT").arg("LIST")).await.unwrap();
    let field = |c: &str, name: &str| {
        let prefix = format!("{name}=");
        c.split(' ')
            .find_map(|f| f.strip_prefix(prefix.as_str()).map(str::to_owned))
            .unwrap_or_default()
    };
    clients
        .lines()
        .filter(|c| field(c, "id").parse::<u64>().is_ok_and(|id| id > since))
        .filter(|c| !field(c, "name").starts_with("sentinel-"))
        .filter(|c| !field(c, "flags").contains('S'))
        .map(str::to_owned)
        .collect()
}

/// On `node`, whose primary has its plain port at `plain_url` and TLS on
/// `tls_port`: lock `name` with [`LONG_LEASE`], the key is on the primary,
/// a rival waiter (another owner) is woken by the unlock within
/// [`PATIENCE`] (long before the lease would free it), and every lock
/// request and subscription of the node arrived on the TLS port. `what`
/// names the node in the panic when it cannot lock.
async fn lock_and_hand_off(node: &Node, plain_url: &str, tls_port: u16, name: &str, what: &str) {
    let since = client_id(plain_url).await;
    let lock = long_lease_client().lock(node, name).unwrap();
    let attempt = tokio::time::timeout(PATIENCE, lock.lock_with_lease(LONG_LEASE)).await;
    let guard = match attempt {
        Ok(Ok(guard)) => guard,
        Ok(Err(err)) => panic!("{what} cannot reach its TLS primary: {err} ({err:?})"),
        Err(_) => panic!("{what} cannot reach its TLS primary: no lock in {PATIENCE:?}"),
    };
    assert!(exists(plain_url, name).await, "{name} on the primary");

    let rival = Client::new().lock(node, name).unwrap();
    let waiter = tokio::spawn(async move { rival.lock_with_lease(LONG_LEASE).await });
    wait_for_listeners(plain_url, name, 1).await;

    // The node's lock requests and the waiter's subscription arrive on
    // the TLS port; on the plain port only the test's own looks.
    let tls_addr = format!(" laddr=127.0.0.1:{tls_port} ");
    let clients = clients_since(plain_url, since).await;
    let (over_tls, plain): (Vec<&String>, Vec<&String>) =
        clients.iter().partition(|c| c.contains(&tls_addr));
    let locked = |c: &&String| c.contains(" cmd=evalsha ") || c.contains(" cmd=eval ");
    let subscribed = |c: &&String| c.contains(" sub=1 ");
    assert!(
        over_tls.iter().any(subscribed),
        "the waiter's subscription is not on the TLS port: {clients:#?}"
    );
    assert!(
        over_tls.iter().any(locked),
        "no lock request on the TLS port: {clients:#?}"
    );
    assert!(
        !plain.iter().any(|c| locked(c) || subscribed(c)),
        "the node used the plain port: {clients:#?}"
    );

    let released = Instant::now();
    guard.unlock().await.unwrap();
    let rival_guard = tokio::time::timeout(PATIENCE, waiter)
        .await
        .expect("the waiter is woken by the release, not by the 60 s lease")
        .unwrap()
        .unwrap();
    let handoff = released.elapsed();
    assert!(handoff < Duration::from_secs(3), "handoff took {handoff:?}");
    assert!(exists(plain_url, name).await, "{name} held by the rival");
    rival_guard.unlock().await.unwrap();
    assert!(!exists(plain_url, name).await, "{name} released");
}

/// The sentinels name the primary by its TLS port; a Sentinel node with
/// `.tls(true)` locks there over TLS ([`lock_and_hand_off`]). First the
/// same on a URL node of the primary's TLS port without certificate
/// checks (`#insecure`): the group and the checks work.
///
/// The Sentinel node, trusting the test's CA, locks and hands off on the
/// primary over TLS; so does a URL node trusting it (no `#insecure`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_node_locks_on_the_primary_over_tls() {
    let group = TlsGroup::start().await;
    let primary = &group.data[0];
    let (plain_url, tls_port) = (primary.plain_url(), primary.tls_port);
    assert_eq!(
        group.named_ports().await,
        vec![tls_port; 3],
        "the sentinels name the primary's TLS port"
    );
    let direct = node_at(
        &format!("rediss://127.0.0.1:{tls_port}/#insecure"),
        NODE_TIMEOUT,
    );
    let what = "the URL node";
    lock_and_hand_off(&direct, &plain_url, tls_port, "st-direct", what).await;
    drop(direct);
    let trusting = Node::builder(format!("rediss://127.0.0.1:{tls_port}"))
        .tls_root_cert(group.ca.clone())
        .connect_timeout(NODE_TIMEOUT)
        .response_timeout(NODE_TIMEOUT)
        .build()
        .unwrap();
    let what = "the URL node trusting the CA";
    lock_and_hand_off(&trusting, &plain_url, tls_port, "st-trusting", what).await;
    drop(trusting);

    let node = tls_sentinel_node(&group);
    let what = "the Sentinel node";
    lock_and_hand_off(&node, &plain_url, tls_port, "st-orders", what).await;
}

/// A root certificate that is not PEM is refused when the node is built.
#[test]
fn a_root_certificate_that_is_not_pem_is_refused() {
    let err = Node::builder("rediss://127.0.0.1:6380")
        .tls_root_cert(b"not a certificate".to_vec())
        .build()
        .unwrap_err();
    assert!(matches!(err, multilock::Error::InvalidArgument(_)), "{err}");
}
