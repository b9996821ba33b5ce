//! The container half of a [`ReplicatedPair`](crate::ReplicatedPair):
//! two servers on two networks, replication over side B.

use std::io;
use std::sync::Arc;

use super::container::{REDIS_PORT, RedisContainer};
use super::docker::connect;
use super::image::resolved;
use super::network::{Network, Side};
use crate::ReplicaBackend;
use crate::replicated::PRIMARY_FLAGS;

impl ReplicaBackend for RedisContainer {
    /// Starts both servers on two networks of their own: side A for
    /// clients, side B for replication (`--replicaof <primary's side B
    /// address> 6379`).
    async fn start_pair() -> io::Result<(RedisContainer, RedisContainer)> {
        let docker = connect().await?;
        let image = resolved(&docker).await?;
        let clients = Arc::new(Network::create(&docker).await?);
        let replication = Arc::new(Network::create(&docker).await?);
        let networks = vec![clients, replication];
        let primary_flags = PRIMARY_FLAGS.iter().map(|f| (*f).to_owned()).collect();
        let primary = RedisContainer::launch(
            docker.clone(),
            image.name(),
            networks.clone(),
            primary_flags,
        )
        .await?;
        let flags = vec![
            "--replicaof".to_owned(),
            primary.sides[Side::B.index()].ip.to_string(),
            REDIS_PORT.to_string(),
        ];
        let replica = RedisContainer::launch(docker, image.name(), networks, flags).await?;
        Ok((primary, replica))
    }

    /// The replica leaves the replication network (side B).
    async fn cut_link(_primary: &RedisContainer, replica: &mut RedisContainer) -> io::Result<()> {
        replica.partition_side(Side::B).await
    }

    /// The replica rejoins the replication network (side B).
    async fn restore_link(
        _primary: &RedisContainer,
        replica: &mut RedisContainer,
    ) -> io::Result<()> {
        replica.heal_side(Side::B).await
    }
}
