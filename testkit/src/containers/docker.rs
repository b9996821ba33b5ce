//! The Docker client: connecting with a negotiated API version, bounded
//! calls, and cleanup from `Drop`.

use std::fmt;
use std::io;
use std::time::Duration;

use testcontainers::bollard::Docker;
use testcontainers::bollard::errors::Error as DockerError;
use testcontainers::bollard::query_parameters::RemoveContainerOptionsBuilder;

/// Environment variable that, set to `1`, keeps containers and networks
/// after the test for debugging.
pub const KEEP_ENV: &str = "MULTILOCK_KEEP_CONTAINERS";

/// Label put on every container and network the kit creates, so leftovers
/// can be found: `docker ps -a --filter label=org.multilock.testkit`.
pub(super) const LABEL: &str = "org.multilock.testkit";
/// Bound on any single Docker API call.
pub(super) const DOCKER_CALL_LIMIT: Duration = Duration::from_secs(60);

/// True when [`KEEP_ENV`] asks to keep containers.
pub(super) fn keep_containers() -> bool {
    matches!(std::env::var(KEEP_ENV).as_deref(), Ok("1" | "true" | "yes"))
}

pub(super) fn docker_error(what: impl fmt::Display) -> impl FnOnce(DockerError) -> io::Error {
    move |err| io::Error::other(format!("docker: {what}: {err}"))
}

/// Bounds a Docker API call, so a hung daemon fails the test instead of
/// hanging it.
pub(super) async fn bounded<T>(
    what: impl fmt::Display,
    call: impl Future<Output = Result<T, DockerError>>,
) -> io::Result<T> {
    match tokio::time::timeout(DOCKER_CALL_LIMIT, call).await {
        Ok(result) => result.map_err(docker_error(what)),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("docker: {what}: no answer within {DOCKER_CALL_LIMIT:?}"),
        )),
    }
}

/// A Docker client speaking the daemon's API version.
pub(super) async fn connect() -> io::Result<Docker> {
    let docker = Docker::connect_with_local_defaults().map_err(|err| {
        io::Error::other(format!(
            "cannot reach the Docker daemon ({err}); the container test kit needs Docker"
        ))
    })?;
    bounded(
        "negotiating the API version (is the Docker daemon running?)",
        docker.negotiate_version(),
    )
    .await
}

/// Runs a Docker job to completion on a thread and runtime of its own, with
/// a client of its own: for `Drop`, which cannot await, and may run on a
/// runtime that is shutting down or on a single-threaded one it must not
/// block on.
pub(super) fn run_detached<F, Fut>(job: F)
where
    F: FnOnce(Docker) -> Fut + Send + 'static,
    Fut: Future<Output = io::Result<()>>,
{
    let worker = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async move { job(connect().await?).await })
    });
    match worker.join() {
        Ok(Ok(())) => {}
        Ok(Err(err)) => tracing::warn!(error = %err, "test kit cleanup failed"),
        Err(_) => tracing::warn!("test kit cleanup panicked"),
    }
}

/// Removes a container, running or not, with its anonymous volumes. The
/// kit's one container removal: for `rm`, for a restart, and from `Drop`
/// (through [`run_detached`], on a client of its own).
pub(super) async fn remove_container(docker: &Docker, id: &str, name: &str) -> io::Result<()> {
    let options = RemoveContainerOptionsBuilder::new()
        .force(true)
        .v(true)
        .build();
    bounded(
        format!("removing container {name}"),
        docker.remove_container(id, Some(options)),
    )
    .await
}

/// Removes a network: for `rm` and from `Drop`.
pub(super) async fn remove_network(docker: &Docker, name: &str) -> io::Result<()> {
    bounded(
        format!("removing network {name}"),
        docker.remove_network(name),
    )
    .await
}
