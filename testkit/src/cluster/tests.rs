//! The kit's own checks of `RedisCluster`.

use super::*;

async fn set_get(url: &str, key: &str) -> io::Result<String> {
    ask::<()>(url, &["SET", key, "v"]).await?;
    ask(url, &["GET", key]).await
}

/// A key whose slot lies in `first..=last`.
fn key_in((first, last): (u16, u16)) -> String {
    let mut keys = (0..).map(|n| format!("key:{n}"));
    let fits = |key: &String| (first..=last).contains(&key_slot(key));
    keys.find(fits).unwrap()
}

/// Keys go to their primaries; then a `CLUSTER FAILOVER` swaps roles.
#[tokio::test]
async fn keys_route_to_their_primaries_and_cluster_failover_swaps_roles() {
    let started = Instant::now();
    let mut cluster = RedisCluster::start().await.unwrap();
    tracing::info!("cluster ready in {:?}", started.elapsed());
    let url = cluster.nodes()[0].url();
    // The empty key first.
    for key in " lock {user1000}.a a{}{b} a{{b}}c a{b x{} {a}{b}".split(' ') {
        let slot: u16 = ask(&url, &["CLUSTER", "KEYSLOT", key]).await.unwrap();
        assert_eq!(key_slot(key), slot, "{key}");
    }
    for (i, shard) in SHARDS.into_iter().enumerate() {
        let (key, url) = (key_in(shard), cluster.nodes()[i].url());
        assert_eq!(cluster.primary_for_key(&key).await.unwrap(), i);
        assert_eq!(cluster.nodes()[i].role().await.unwrap(), Role::Primary);
        assert_eq!(set_get(&url, &key).await.unwrap(), "v");
        let moved = set_get(&cluster.nodes()[(i + 1) % 3].url(), &key).await;
        let moved = moved.unwrap_err().to_string();
        let port = cluster.nodes()[i].port();
        assert!(moved.ends_with(&format!(" 127.0.0.1:{port}")), "{moved}");
        assert_eq!(cluster.replica_of(i).await.unwrap(), i + 3);
        assert_eq!(cluster.nodes()[i + 3].role().await.unwrap(), Role::Replica);
    }
    assert_eq!(cluster.seed_urls().len(), 6);

    let started = Instant::now();
    cluster.failover(3).await.unwrap();
    tracing::info!("CLUSTER FAILOVER done in {:?}", started.elapsed());
    assert_eq!(cluster.primary_for_slot(0).await.unwrap(), 3);
    cluster.wait_until_healthy().await.unwrap();
    tracing::info!("healthy again after {:?}", started.elapsed());
    assert_eq!(cluster.replica_of(3).await.unwrap(), 0);
    assert_eq!(cluster.nodes()[0].role().await.unwrap(), Role::Replica);
    let key = key_in(SHARDS[0]);
    assert_eq!(set_get(&cluster.nodes()[3].url(), &key).await.unwrap(), "v");
    // A short freeze of a replica changes nothing.
    cluster.pause(5).await.unwrap();
    cluster.unpause(5).await.unwrap();
    cluster.wait_until_healthy().await.unwrap();
}

/// A plain connection to `url`, which follows no redirection.
async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(url).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

/// GET `key` on `conn`: its value, or the error reply.
async fn get(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
) -> redis::RedisResult<String> {
    redis::cmd("GET").arg(key).query_async(conn).await
}

/// The code and address of a redirection (`ASK`, `MOVED`) of `slot`.
fn redirection(error: &redis::RedisError, slot: u16) -> (Option<&str>, Option<&str>) {
    let node = error.redirect_node();
    assert_eq!(node.map(|(_, s)| s), Some(slot), "{error}");
    (error.code(), node.map(|(address, _)| address))
}

/// The value the migration tests write to `key`.
fn value_of(key: &str) -> String {
    format!("value of {key}")
}

/// A slot held mid-migration: moved keys get ASK from the source and
/// are served by the target after ASKING; once finished, every node puts
/// the slot on the target, and the source answers MOVED.
#[tokio::test]
async fn a_slot_mid_migration_answers_ask_then_moves_to_the_target() {
    let cluster = RedisCluster::start().await.unwrap();
    let keys = ["{migrating}.a", "{migrating}.b", "{migrating}.c"];
    let slot = key_slot(keys[0]);
    assert!(keys.iter().all(|key| key_slot(key) == slot));
    let from = cluster.primary_for_slot(slot).await.unwrap();
    let to = (from + 1) % 3;
    let (source, target) = (&cluster.nodes()[from], &cluster.nodes()[to]);
    for key in keys {
        ask::<()>(&source.url(), &["SET", key, &value_of(key)])
            .await
            .unwrap();
    }

    let started = Instant::now();
    let migration = cluster.begin_slot_migration(slot, to).await.unwrap();
    assert_eq!(
        (migration.slot(), migration.from(), migration.to()),
        (slot, from, to)
    );
    let mut on_source = raw(&source.url()).await;
    // Nothing moved yet: the source serves its keys.
    assert_eq!(
        get(&mut on_source, keys[0]).await.unwrap(),
        value_of(keys[0])
    );
    // A command on held and absent keys of the slot (a lock and its
    // Pub/Sub channel name, say) waits the migration out.
    let absent = "{migrating}.absent";
    let mut mget = redis::cmd("MGET");
    mget.arg(keys[0]).arg(absent);
    let error = mget.query_async::<()>(&mut on_source).await.unwrap_err();
    assert_eq!(error.code(), Some("TRYAGAIN"), "{error}");
    assert_eq!(migration.move_keys(&cluster).await.unwrap(), 3);
    assert_eq!(migration.move_keys(&cluster).await.unwrap(), 0);
    let target_at = format!("127.0.0.1:{}", target.port());
    let source_at = format!("127.0.0.1:{}", source.port());
    let (ask, moved) = (Some("ASK"), Some("MOVED"));
    let (to_target, to_source) = (Some(target_at.as_str()), Some(source_at.as_str()));
    for key in keys {
        let error = get(&mut on_source, key).await.unwrap_err();
        assert_eq!(redirection(&error, slot), (ask, to_target));
    }
    // The target serves a moved key only after ASKING.
    let mut on_target = raw(&target.url()).await;
    let error = get(&mut on_target, keys[0]).await.unwrap_err();
    assert_eq!(redirection(&error, slot), (moved, to_source));
    let mut asking = redis::pipe();
    asking.cmd("ASKING").ignore().cmd("GET").arg(keys[1]);
    let (value,): (String,) = asking.query_async(&mut on_target).await.unwrap();
    assert_eq!(value, value_of(keys[1]));
    let mut asking = redis::pipe();
    asking
        .cmd("ASKING")
        .ignore()
        .cmd("MGET")
        .arg(keys[0])
        .arg(absent);
    let error = asking.query_async::<()>(&mut on_target).await.unwrap_err();
    assert_eq!(error.code(), Some("TRYAGAIN"), "{error}");

    migration.finish(&cluster).await.unwrap();
    tracing::info!("slot {slot} migrated in {:?}", started.elapsed());
    for (url, shards) in cluster.views().await.unwrap() {
        assert_eq!(owner_of(&shards, slot), Some(target.port()), "{url}");
    }
    assert_eq!(cluster.primary_for_slot(slot).await.unwrap(), to);
    for key in keys {
        assert_eq!(get(&mut on_target, key).await.unwrap(), value_of(key));
        let error = get(&mut on_source, key).await.unwrap_err();
        assert_eq!(redirection(&error, slot), (moved, to_target));
    }
    // The neighbouring slots stay where they were.
    let neighbours = [slot.checked_sub(1), Some(slot + 1).filter(|&s| s < SLOTS)];
    for neighbour in neighbours.into_iter().flatten() {
        let shard = SHARDS
            .iter()
            .position(|&(first, last)| (first..=last).contains(&neighbour));
        let owner = cluster.primary_for_slot(neighbour).await.unwrap();
        assert_eq!(Some(owner), shard, "slot {neighbour}");
    }
    cluster.wait_until_healthy().await.unwrap();
}

/// `migrate_slot` moves a slot with its keys there and back, and
/// refuses a replica, the current owner and a slot past 16383.
#[tokio::test]
async fn migrate_slot_moves_a_slot_there_and_back() {
    let cluster = RedisCluster::start().await.unwrap();
    let key = "{migrate}.key";
    let slot = key_slot(key);
    let from = cluster.primary_for_slot(slot).await.unwrap();
    let to = (from + 2) % 3;
    let invalid = |result: io::Result<()>| result.unwrap_err().kind();
    let to_replica = cluster.migrate_slot(slot, from + 3).await;
    assert_eq!(invalid(to_replica), io::ErrorKind::InvalidInput);
    let to_owner = cluster.migrate_slot(slot, from).await;
    assert_eq!(invalid(to_owner), io::ErrorKind::InvalidInput);
    assert_eq!(
        invalid(cluster.migrate_slot(SLOTS, to).await),
        io::ErrorKind::InvalidInput
    );

    ask::<()>(&cluster.nodes()[from].url(), &["SET", key, &value_of(key)])
        .await
        .unwrap();
    let started = Instant::now();
    cluster.migrate_slot(slot, to).await.unwrap();
    tracing::info!("slot {slot} migrated in {:?}", started.elapsed());
    assert_eq!(cluster.primary_for_key(key).await.unwrap(), to);
    let value: String = ask(&cluster.nodes()[to].url(), &["GET", key])
        .await
        .unwrap();
    assert_eq!(value, value_of(key));
    // The target's replica has the key too.
    let replica = cluster.replica_of(to).await.unwrap();
    let url = cluster.nodes()[replica].url();
    poll_ready(READY_LIMIT, "the replica did not get the key", || async {
        let mut conn = raw(&url).await;
        let mut readonly = redis::pipe();
        readonly.cmd("READONLY").ignore().cmd("GET").arg(key);
        let (value,): (Option<String>,) = readonly
            .query_async(&mut conn)
            .await
            .map_err(io::Error::other)?;
        value.ok_or_else(|| io::Error::other("no key yet"))
    })
    .await
    .unwrap();

    // An empty slot moves too.
    let empty = (slot + 1) % SLOTS;
    let empty_from = cluster.primary_for_slot(empty).await.unwrap();
    cluster
        .migrate_slot(empty, (empty_from + 1) % 3)
        .await
        .unwrap();
    cluster.migrate_slot(slot, from).await.unwrap();
    assert_eq!(cluster.primary_for_key(key).await.unwrap(), from);
    let value: String = ask(&cluster.nodes()[from].url(), &["GET", key])
        .await
        .unwrap();
    assert_eq!(value, value_of(key));
    cluster.wait_until_healthy().await.unwrap();
}

#[tokio::test]
async fn a_killed_primary_is_replaced_and_rejoins_as_a_replica() {
    let mut cluster = RedisCluster::start().await.unwrap();
    let key = key_in(SHARDS[1]);
    let started = Instant::now();
    cluster.kill(1).await.unwrap();
    assert_eq!(cluster.nodes()[1].pid(), None);
    cluster.wait_until_healthy().await.unwrap();
    tracing::info!("killed primary replaced in {:?}", started.elapsed());
    assert_eq!(cluster.primary_for_key(&key).await.unwrap(), 4);
    assert_eq!(set_get(&cluster.nodes()[4].url(), &key).await.unwrap(), "v");
    let started = Instant::now();
    cluster.restart(1).await.unwrap();
    cluster.wait_until_healthy().await.unwrap();
    tracing::info!("restarted node rejoined in {:?}", started.elapsed());
    assert_eq!(cluster.replica_of(4).await.unwrap(), 1);
    assert_eq!(cluster.nodes()[1].role().await.unwrap(), Role::Replica);
}
