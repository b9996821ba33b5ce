//! The Docker client: connecting with a negotiated API version, the image,
//! bounded calls, and cleanup from `Drop`.

use std::fmt;
use std::io;
use std::time::Duration;

use futures::StreamExt;
use testcontainers::bollard::Docker;
use testcontainers::bollard::errors::Error as DockerError;
use testcontainers::bollard::query_parameters::{
    CreateImageOptionsBuilder, RemoveContainerOptionsBuilder,
};

/// Environment variable naming the Redis image to run.
pub const IMAGE_ENV: &str = "MULTILOCK_REDIS_IMAGE";
/// The image used when [`IMAGE_ENV`] is unset.
pub const DEFAULT_IMAGE: &str = "redis:7";
/// Environment variable that, set to `1`, keeps containers and networks
/// after the test for debugging.
pub const KEEP_ENV: &str = "MULTILOCK_KEEP_CONTAINERS";

/// Label put on every container and network the kit creates, so leftovers
/// can be found: `docker ps -a --filter label=org.multilock.testkit`.
pub(super) const LABEL: &str = "org.multilock.testkit";
/// Bound on any single Docker API call.
pub(super) const DOCKER_CALL_LIMIT: Duration = Duration::from_secs(60);
/// Bound on pulling a missing image.
const PULL_LIMIT: Duration = Duration::from_secs(300);

/// The image to run: `$MULTILOCK_REDIS_IMAGE`, else [`DEFAULT_IMAGE`].
pub fn image() -> String {
    std::env::var(IMAGE_ENV)
        .ok()
        .filter(|image| !image.is_empty())
        .unwrap_or_else(|| DEFAULT_IMAGE.to_owned())
}

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

fn is_not_found(err: &DockerError) -> bool {
    matches!(
        err,
        DockerError::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

/// Makes sure `image` is present locally, pulling it when it is not.
pub(super) async fn ensure_image(docker: &Docker, image: &str) -> io::Result<()> {
    match docker.inspect_image(image).await {
        Ok(_) => return Ok(()),
        Err(err) if is_not_found(&err) => {}
        Err(err) => return Err(docker_error(format!("inspecting image {image}"))(err)),
    }
    let options = CreateImageOptionsBuilder::new().from_image(image).build();
    let pull = async {
        let mut progress = docker.create_image(Some(options), None, None);
        while let Some(step) = progress.next().await {
            step?;
        }
        Ok::<_, DockerError>(())
    };
    let failure = match tokio::time::timeout(PULL_LIMIT, pull).await {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(err)) => err.to_string(),
        Err(_) => format!("no progress within {PULL_LIMIT:?}"),
    };
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "the Redis image {image:?} is not available locally and could not be pulled \
             ({failure}). Without registry access, build one from the host's redis-server \
             with `bash docker/build-local-image.sh` and run the tests with \
             {IMAGE_ENV}=multilock-redis:local"
        ),
    ))
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
