//! The image the containers run, and making sure it is here: pulled when
//! missing, or, when the default `redis:7` cannot be pulled (no registry),
//! built from the host's `redis-server` with the recipe of
//! `docker/build-local-image.sh`. Decided once per process.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use testcontainers::bollard::Docker;
use testcontainers::bollard::body_full;
use testcontainers::bollard::errors::Error as DockerError;
use testcontainers::bollard::query_parameters::{
    BuildImageOptionsBuilder, BuilderVersion, CreateImageOptionsBuilder, RemoveImageOptionsBuilder,
    TagImageOptionsBuilder,
};
use tokio::sync::OnceCell;

use super::docker::{DOCKER_CALL_LIMIT, bounded, connect, docker_error};
use super::recipe::{FINGERPRINT_LABEL, Recipe, SOURCE_LABEL};

/// Environment variable naming the Redis image to run. When it is set, the
/// kit runs that image or fails: it never falls back to another one.
pub const IMAGE_ENV: &str = "MULTILOCK_REDIS_IMAGE";
/// The image used when [`IMAGE_ENV`] is unset.
pub const DEFAULT_IMAGE: &str = "redis:7";
/// Environment variable naming the tag of the image built from the host's
/// `redis-server` (the build script's variable too).
pub const LOCAL_IMAGE_ENV: &str = "MULTILOCK_LOCAL_IMAGE";
/// The tag of the local image when [`LOCAL_IMAGE_ENV`] is unset.
pub const DEFAULT_LOCAL_IMAGE: &str = "multilock-redis:local";

/// Bound on a pull that makes no progress (a registry that does not
/// answer, a DNS lookup that hangs).
const PULL_STALL: Duration = Duration::from_secs(30);
/// Bound on a whole pull.
const PULL_LIMIT: Duration = Duration::from_secs(300);
/// Bound on building the local image (some 20 MB of context).
const BUILD_LIMIT: Duration = Duration::from_secs(180);

/// The image configured to run: `$MULTILOCK_REDIS_IMAGE`, else
/// [`DEFAULT_IMAGE`]. What runs may differ: see [`redis_image`].
pub fn image() -> String {
    env_or(IMAGE_ENV, DEFAULT_IMAGE)
}

/// The tag the kit (and `docker/build-local-image.sh`) builds from the
/// host's `redis-server`: `$MULTILOCK_LOCAL_IMAGE`, else
/// [`DEFAULT_LOCAL_IMAGE`].
pub fn local_image() -> String {
    env_or(LOCAL_IMAGE_ENV, DEFAULT_LOCAL_IMAGE)
}

fn env_or(variable: &str, default: &str) -> String {
    std::env::var(variable)
        .ok()
        .filter(|value| !value.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

/// The image the containers run, and how it came to be here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisImage {
    name: String,
    origin: ImageOrigin,
}

/// How the image the containers run came to be here.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ImageOrigin {
    /// It was here already.
    Present,
    /// It was pulled from its registry by this process.
    Pulled,
    /// The local image, built from the host's `redis-server`.
    Local {
        /// The `redis-server` it holds.
        source: PathBuf,
        /// Its version (`7.0.15`), when `redis-server --version` says.
        version: Option<String>,
        /// Built by this process (else it was here and up to date).
        built: bool,
        /// Why not the configured image (it could not be pulled, and
        /// why); `None` when the local image is the configured one.
        instead_of: Option<String>,
    },
}

impl RedisImage {
    /// The image's name, as containers are created from it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How it came to be here.
    pub fn origin(&self) -> &ImageOrigin {
        &self.origin
    }

    /// Whether it is the local image, built from the host's `redis-server`.
    pub fn is_local(&self) -> bool {
        matches!(self.origin, ImageOrigin::Local { .. })
    }

    /// Whether it runs instead of the configured image, which could not be
    /// pulled.
    pub fn is_fallback(&self) -> bool {
        matches!(
            self.origin,
            ImageOrigin::Local {
                instead_of: Some(_),
                ..
            }
        )
    }
}

impl fmt::Display for RedisImage {
    /// `redis:7`, `redis:7 (pulled)`, or `multilock-redis:local (built from
    /// /usr/bin/redis-server 7.0.15; redis:7 could not be pulled: ...)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        match &self.origin {
            ImageOrigin::Present => Ok(()),
            ImageOrigin::Pulled => f.write_str(" (pulled)"),
            ImageOrigin::Local {
                source,
                version,
                built,
                instead_of,
            } => {
                let when = if *built { "built just now" } else { "built" };
                write!(f, " ({when} from {}", source.display())?;
                if let Some(version) = version {
                    write!(f, " {version}")?;
                }
                if let Some(why) = instead_of {
                    write!(f, "; {why}")?;
                }
                f.write_str(")")
            }
        }
    }
}

/// The image the containers run, made sure to be here. Decided once per
/// process (later calls return the first answer, or its error):
///
/// - `$MULTILOCK_REDIS_IMAGE` set: that image, pulled if missing; no
///   fallback (a missing image that cannot be pulled is an error), except
///   that the local image's own tag is built when missing or out of date.
/// - unset: `redis:7`, pulled if missing; when it cannot be pulled, the
///   local image ([`local_image`]), built from the host's `redis-server`
///   when missing or out of date (a warning says so, once).
///
/// The local image is built through the Docker API with the recipe of
/// `docker/build-local-image.sh`, and labelled as the script labels it: the
/// script and the kit agree on when it is up to date, and neither
/// overwrites a tag that does not carry the label. Concurrent builds (two
/// test processes) both succeed: each builds under a temporary tag and
/// moves the tag only if the other has not already.
///
/// # Errors
///
/// When Docker cannot be reached; when the configured image is missing and
/// cannot be pulled and no local image can be built (no `redis-server`
/// here, the tag is taken by an image the kit did not build, or the build
/// fails). The message says what to do.
///
/// # Cancel safety
///
/// Dropping the future leaves the decision to the next caller; a build
/// under way may leave its temporary tag behind
/// (`docker images multilock-redis`).
pub async fn redis_image() -> io::Result<RedisImage> {
    resolved(&connect().await?).await
}

/// [`redis_image`] on a client the caller has.
pub(super) async fn resolved(docker: &Docker) -> io::Result<RedisImage> {
    static RESOLVED: OnceCell<Result<RedisImage, (io::ErrorKind, String)>> = OnceCell::const_new();
    let outcome = RESOLVED
        .get_or_init(|| async {
            let outcome = Plan::from_env().ensure(docker).await;
            match &outcome {
                Ok(image) if image.is_fallback() => {
                    tracing::warn!(image = %image, "the container test kit runs the local Redis image");
                }
                Ok(image) => tracing::info!(image = %image, "the container test kit's Redis image"),
                Err(err) => tracing::warn!(error = %err, "no Redis image for the container test kit"),
            }
            outcome.map_err(|err| (err.kind(), err.to_string()))
        })
        .await;
    outcome
        .clone()
        .map_err(|(kind, message)| io::Error::new(kind, message))
}

/// What to run and what to fall back to.
#[derive(Debug, Clone)]
pub(super) struct Plan {
    /// The image to run.
    pub(super) image: String,
    /// Named by the user ([`IMAGE_ENV`]): no fallback.
    pub(super) explicit: bool,
    /// The tag to build from the host's `redis-server`.
    pub(super) local: String,
}

impl Plan {
    fn from_env() -> Plan {
        Plan {
            image: image(),
            explicit: std::env::var(IMAGE_ENV).is_ok_and(|value| !value.is_empty()),
            local: local_image(),
        }
    }

    /// Makes sure an image is here and says which.
    pub(super) async fn ensure(&self, docker: &Docker) -> io::Result<RedisImage> {
        if self.image == self.local {
            return ensure_local(docker, &self.local, None).await;
        }
        if inspect(docker, &self.image).await?.is_some() {
            return Ok(RedisImage {
                name: self.image.clone(),
                origin: ImageOrigin::Present,
            });
        }
        let failure = match pull(docker, &self.image).await {
            Ok(()) => {
                return Ok(RedisImage {
                    name: self.image.clone(),
                    origin: ImageOrigin::Pulled,
                });
            }
            Err(failure) => failure,
        };
        if self.explicit {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{IMAGE_ENV}={}: the image is not here and could not be pulled ({failure}); \
                     unset {IMAGE_ENV} to run {}, which the kit builds from the host's \
                     redis-server",
                    self.image, self.local
                ),
            ));
        }
        let instead_of = format!("{} could not be pulled: {failure}", self.image);
        ensure_local(docker, &self.local, Some(instead_of))
            .await
            .map_err(|err| {
                io::Error::new(
                    err.kind(),
                    format!(
                        "the Redis image {} is not here and could not be pulled ({failure}), \
                         and the local image {} could not be built from the host's \
                         redis-server: {err}",
                        self.image, self.local
                    ),
                )
            })
    }
}

/// The image's id and label, or `None` when there is no such image.
async fn inspect(docker: &Docker, image: &str) -> io::Result<Option<Inspected>> {
    let what = format!("inspecting image {image}");
    match tokio::time::timeout(DOCKER_CALL_LIMIT, docker.inspect_image(image)).await {
        Ok(Ok(found)) => Ok(Some(Inspected {
            id: found.id.unwrap_or_default(),
            fingerprint: found
                .config
                .and_then(|config| config.labels)
                .and_then(|mut labels| labels.remove(FINGERPRINT_LABEL)),
        })),
        Ok(Err(DockerError::DockerResponseServerError {
            status_code: 404, ..
        })) => Ok(None),
        Ok(Err(err)) => Err(docker_error(what)(err)),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("docker: {what}: no answer within {DOCKER_CALL_LIMIT:?}"),
        )),
    }
}

/// What the kit needs to know of an image.
struct Inspected {
    id: String,
    /// The local image's label: `None` on an image the kit did not build.
    fingerprint: Option<String>,
}

/// Pulls `image`; on failure, why (for the message).
async fn pull(docker: &Docker, image: &str) -> Result<(), String> {
    let options = CreateImageOptionsBuilder::new().from_image(image).build();
    let pull = async {
        let mut progress = docker.create_image(Some(options), None, None);
        loop {
            match tokio::time::timeout(PULL_STALL, progress.next()).await {
                Ok(None) => return Ok(()),
                Ok(Some(Ok(_))) => {}
                Ok(Some(Err(err))) => return Err(err.to_string()),
                Err(_) => return Err(format!("no progress within {PULL_STALL:?}")),
            }
        }
    };
    match tokio::time::timeout(PULL_LIMIT, pull).await {
        Ok(outcome) => outcome,
        Err(_) => Err(format!("not done within {PULL_LIMIT:?}")),
    }
}

/// Makes sure `tag` holds the local image built from this host's
/// `redis-server`: builds it when missing or out of date, refuses a tag
/// that carries no fingerprint label (an image the kit did not build).
pub(super) async fn ensure_local(
    docker: &Docker,
    tag: &str,
    instead_of: Option<String>,
) -> io::Result<RedisImage> {
    let (recipe, fingerprint) = tokio::task::spawn_blocking(|| {
        let recipe = Recipe::read()?;
        let fingerprint = recipe.fingerprint()?;
        Ok::<_, io::Error>((recipe, fingerprint))
    })
    .await
    .map_err(io::Error::other)??;
    let built = match inspect(docker, tag).await? {
        Some(found) => match found.fingerprint {
            Some(label) if label == fingerprint => false,
            Some(_) => {
                build(docker, tag, &recipe, &fingerprint).await?;
                true
            }
            None => return Err(not_ours(tag)),
        },
        None => {
            build(docker, tag, &recipe, &fingerprint).await?;
            true
        }
    };
    let version = tokio::task::spawn_blocking({
        // As found: Debian's redis-server is a link to redis-check-rdb,
        // which acts as redis-server only under that name.
        let binary = recipe.binary.clone();
        move || super::recipe::version_of(&binary)
    })
    .await
    .ok()
    .flatten();
    Ok(RedisImage {
        name: tag.to_owned(),
        origin: ImageOrigin::Local {
            source: recipe.binary.clone(),
            version,
            built,
            instead_of,
        },
    })
}

fn not_ours(tag: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!(
            "{tag} exists and was not built from the host's redis-server (it has no \
             {FINGERPRINT_LABEL} label), so the kit leaves it alone; set \
             {LOCAL_IMAGE_ENV} to another tag"
        ),
    )
}

/// Builds the image under a temporary tag, then moves `tag` to it unless
/// another process got there first; the image `tag` held before, when the
/// kit built it, is removed if nothing uses it.
async fn build(docker: &Docker, tag: &str, recipe: &Recipe, fingerprint: &str) -> io::Result<()> {
    let (repo, tag_name) = split_tag(tag);
    let temporary = format!(
        "{repo}:build-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    );
    tracing::info!(image = tag, from = %recipe.binary.display(), "building the local Redis image");
    let labels = HashMap::from([
        (FINGERPRINT_LABEL, fingerprint.to_owned()),
        (SOURCE_LABEL, recipe.source.display().to_string()),
    ]);
    let options = BuildImageOptionsBuilder::new()
        .t(&temporary)
        .labels(&labels)
        .q(true)
        .rm(true)
        .forcerm(true)
        .version(BuilderVersion::BuilderV1)
        .build();
    let context = body_full(recipe.tar()?.into());
    let run = async {
        let mut steps = docker.build_image(options, None, Some(context));
        while let Some(step) = steps.next().await {
            let step = step.map_err(docker_error(format!("building {tag}")))?;
            if let Some(detail) = step.error_detail {
                return Err(io::Error::other(format!(
                    "docker: building {tag}: {}",
                    detail.message.unwrap_or_default()
                )));
            }
        }
        Ok(())
    };
    match tokio::time::timeout(BUILD_LIMIT, run).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => {
            untag(docker, &temporary).await;
            return Err(err);
        }
        Err(_) => {
            untag(docker, &temporary).await;
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("docker: building {tag}: not done within {BUILD_LIMIT:?}"),
            ));
        }
    }
    // Another process may have built or taken the tag meanwhile.
    let before = inspect(docker, tag).await?;
    match &before {
        Some(found) if found.fingerprint.as_deref() == Some(fingerprint) => {
            untag(docker, &temporary).await;
            return Ok(());
        }
        Some(found) if found.fingerprint.is_none() => {
            untag(docker, &temporary).await;
            return Err(not_ours(tag));
        }
        _ => {}
    }
    let options = TagImageOptionsBuilder::new()
        .repo(repo)
        .tag(tag_name)
        .build();
    let tagged = bounded(
        format!("tagging {temporary} as {tag}"),
        docker.tag_image(&temporary, Some(options)),
    )
    .await;
    untag(docker, &temporary).await;
    tagged?;
    if let Some(stale) = before {
        // Out of date and no longer tagged: remove it unless a container
        // (or another tag) still uses it.
        untag(docker, &stale.id).await;
    }
    Ok(())
}

/// Removes a tag (the image too, if that was its last tag and no container
/// uses it), best effort.
pub(super) async fn untag(docker: &Docker, name: &str) {
    let options = RemoveImageOptionsBuilder::new().build();
    if let Err(err) = bounded(
        format!("removing image {name}"),
        docker.remove_image(name, Some(options), None),
    )
    .await
    {
        tracing::debug!(image = name, error = %err, "image left in place");
    }
}

/// `repo:tag` into its parts (`latest` when there is no tag; a `:` before
/// the last `/` is a registry's port).
fn split_tag(image: &str) -> (&str, &str) {
    match image.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => (repo, tag),
        _ => (image, "latest"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestServer;
    use crate::containers::RedisContainer;
    use crate::containers::docker::run_detached;

    #[test]
    fn tags_split_into_repository_and_tag() {
        assert_eq!(
            split_tag("multilock-redis:local"),
            ("multilock-redis", "local")
        );
        assert_eq!(split_tag("redis"), ("redis", "latest"));
        assert_eq!(split_tag("host:5000/redis"), ("host:5000/redis", "latest"));
        assert_eq!(split_tag("host:5000/redis:7"), ("host:5000/redis", "7"));
    }

    /// A tag of this test's own, removed before and after (also when the
    /// test fails): other runs' images are never touched (removing a tag
    /// that shares its image with `multilock-redis:local` only untags it).
    struct TestTag(String);

    impl TestTag {
        async fn new(docker: &Docker, what: &str) -> TestTag {
            let tag = format!("multilock-redis:test-{what}-{}", std::process::id());
            untag(docker, &tag).await;
            TestTag(tag)
        }
    }

    impl Drop for TestTag {
        fn drop(&mut self) {
            let tag = self.0.clone();
            run_detached(move |docker| async move {
                untag(&docker, &tag).await;
                Ok(())
            });
        }
    }

    /// An image that cannot be pulled anywhere (`.invalid` never resolves).
    const UNPULLABLE: &str = "multilock.invalid/redis:none";

    /// The fallback end to end: the default image cannot be pulled, so the
    /// kit builds the local one (two callers at once, as two processes
    /// would), which then runs; a second call finds it up to date.
    #[tokio::test]
    async fn an_unpullable_default_image_falls_back_to_a_local_build() {
        let docker = connect().await.unwrap();
        let test_tag = TestTag::new(&docker, "fallback").await;
        let tag = test_tag.0.clone();
        let plan = Plan {
            image: UNPULLABLE.to_owned(),
            explicit: false,
            local: tag.clone(),
        };
        let (first, second) = tokio::join!(plan.ensure(&docker), plan.ensure(&docker));
        let mut builds = 0;
        for image in [first.unwrap(), second.unwrap()] {
            assert_eq!(image.name(), tag);
            let ImageOrigin::Local {
                built, instead_of, ..
            } = image.origin()
            else {
                panic!("not the local image: {image}");
            };
            builds += usize::from(*built);
            assert!(instead_of.as_deref().unwrap().contains(UNPULLABLE));
        }
        // One built it; the other built it too, or found it built.
        assert!(builds >= 1);
        let found = inspect(&docker, &tag).await.unwrap().expect("built");
        let fingerprint =
            tokio::task::spawn_blocking(|| Recipe::read().unwrap().fingerprint().unwrap())
                .await
                .unwrap();
        assert_eq!(found.fingerprint.as_deref(), Some(fingerprint.as_str()));
        // No temporary tag is left behind.
        let leftovers: Vec<String> = docker
            .list_images(None::<testcontainers::bollard::query_parameters::ListImagesOptions>)
            .await
            .unwrap()
            .into_iter()
            .flat_map(|image| image.repo_tags)
            .filter(|name| name.contains(&format!("build-{}-", std::process::id())))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");

        let again = plan.ensure(&docker).await.unwrap();
        assert!(matches!(
            again.origin(),
            ImageOrigin::Local { built: false, .. }
        ));

        let server = RedisContainer::start_image(&tag).await.unwrap();
        crate::command::wait_until_ready(&server.url(), Duration::from_secs(10))
            .await
            .unwrap();
        server.rm().await.unwrap();
        let options = RemoveImageOptionsBuilder::new().build();
        docker
            .remove_image(&tag, Some(options), None)
            .await
            .unwrap();
        assert!(inspect(&docker, &tag).await.unwrap().is_none());
    }

    /// An image the user named is run or refused, never replaced.
    #[tokio::test]
    async fn an_explicit_image_has_no_fallback() {
        let docker = connect().await.unwrap();
        let test_tag = TestTag::new(&docker, "explicit").await;
        let tag = test_tag.0.clone();
        let plan = Plan {
            image: UNPULLABLE.to_owned(),
            explicit: true,
            local: tag.clone(),
        };
        let err = plan.ensure(&docker).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains(IMAGE_ENV), "{err}");
        assert!(inspect(&docker, &tag).await.unwrap().is_none());
    }

    /// A tag that holds an image the kit did not build is left alone.
    #[tokio::test]
    async fn a_tag_the_kit_did_not_build_is_never_overwritten() {
        let docker = connect().await.unwrap();
        let test_tag = TestTag::new(&docker, "foreign").await;
        let tag = test_tag.0.clone();
        // A tiny image without the label.
        let mut tar = Vec::new();
        super::super::recipe::append_file(
            &mut tar,
            "Dockerfile",
            b"FROM scratch\nLABEL org.example=1\nCMD [\"none\"]\n",
        )
        .unwrap();
        tar.extend_from_slice(&[0; 1024]);
        let options = BuildImageOptionsBuilder::new()
            .t(&tag)
            .rm(true)
            .version(BuilderVersion::BuilderV1)
            .build();
        let mut steps = docker.build_image(options, None, Some(body_full(tar.into())));
        while let Some(step) = steps.next().await {
            step.unwrap();
        }
        let before = inspect(&docker, &tag).await.unwrap().expect("built").id;
        let err = ensure_local(&docker, &tag, None).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        let after = inspect(&docker, &tag)
            .await
            .unwrap()
            .expect("still there")
            .id;
        assert_eq!(before, after);
    }
}
