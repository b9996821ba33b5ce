//! The local image's recipe, as `docker/build-local-image.sh` writes it: a
//! `FROM scratch` image holding the host's `redis-server` (and `redis-cli`
//! when there is one), every shared library `ldd` lists, the dynamic
//! loader, `/etc/nsswitch.conf`, `/tmp` and `/data`.
//!
//! The build context is assembled in memory ([`Recipe::read`]), identified
//! by the script's fingerprint ([`Recipe::fingerprint`]: the SHA-256 of
//! `sha256sum`'s listing of every file, sorted by path, computed with
//! `sha256sum` as the script does) and sent to Docker as a tar archive
//! ([`Recipe::tar`]). The kit and the script therefore agree on when an
//! image is up to date: change one, change the other.

use std::ffi::OsString;
use std::io::{self, Write as _};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Label holding the fingerprint of the image's inputs.
pub(super) const FINGERPRINT_LABEL: &str = "org.multilock.redis.fingerprint";
/// Label holding the host binary the image was built from.
pub(super) const SOURCE_LABEL: &str = "org.multilock.redis.source";

/// The script's Dockerfile, byte for byte (it is part of the fingerprint).
const DOCKERFILE: &str = r#"FROM scratch
COPY rootfs/ /
ENV PATH=/usr/local/bin
EXPOSE 6379
WORKDIR /data
# No ENTRYPOINT: like redis:7, the command is `redis-server [flags...]`.
CMD ["redis-server","--bind","0.0.0.0","--protected-mode","no","--save","","--appendonly","no"]
"#;

/// Resolves hostnames through `/etc/hosts` and DNS (Docker mounts both).
const NSSWITCH: &str = "hosts: files dns\n";

/// One file of the build context.
struct File {
    /// Relative to the context, without `./`: `rootfs/usr/local/bin/redis-server`.
    path: String,
    mode: u32,
    contents: Vec<u8>,
}

/// The build context of the local image, read from the host.
pub(super) struct Recipe {
    /// The `redis-server` packaged, as found (`/usr/bin/redis-server`).
    pub(super) binary: PathBuf,
    /// The same with symlinks resolved, for the image's source label.
    pub(super) source: PathBuf,
    /// Sorted by path, as the fingerprint lists them.
    files: Vec<File>,
}

impl Recipe {
    /// Reads the host's `redis-server`, `redis-cli` and their libraries.
    /// Blocking: it runs `ldd` and reads some 20 MB.
    ///
    /// The binary: `$REDIS_SERVER_BIN` (the script's variable), else
    /// `$MULTILOCK_REDIS_SERVER` (the process backend's), else
    /// `redis-server` from `PATH`, `/usr/bin` or `/usr/sbin`.
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::NotFound`] when there is no `redis-server` (the
    /// message says how to install one); when `ldd` cannot run or lists no
    /// library; when a file cannot be read.
    pub(super) fn read() -> io::Result<Recipe> {
        let server = redis_server()?;
        let source = std::fs::canonicalize(&server)?;
        let mut binaries = vec![("redis-server", server.clone())];
        if let Some(cli) = find_in_path("redis-cli") {
            binaries.push(("redis-cli", cli));
        }
        let paths: Vec<&Path> = binaries.iter().map(|(_, path)| path.as_path()).collect();
        let libraries = libraries_of(&paths)?;
        let mut files = vec![
            File {
                path: "Dockerfile".to_owned(),
                mode: 0o644,
                contents: DOCKERFILE.as_bytes().to_vec(),
            },
            File {
                path: "rootfs/etc/nsswitch.conf".to_owned(),
                mode: 0o644,
                contents: NSSWITCH.as_bytes().to_vec(),
            },
        ];
        // The file must be called redis-server: on Debian it is a symlink
        // to redis-check-rdb, and Redis picks its mode from argv[0].
        for (name, path) in &binaries {
            files.push(File {
                path: format!("rootfs/usr/local/bin/{name}"),
                mode: 0o755,
                contents: read(path)?,
            });
        }
        for library in &libraries {
            files.push(File {
                path: format!("rootfs{}", library.display()),
                mode: std::fs::metadata(library)?.permissions().mode() & 0o755,
                contents: read(library)?,
            });
        }
        // `LC_ALL=C sort`: bytewise, with the `./` every path shares.
        files.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
        Ok(Recipe {
            binary: server,
            source,
            files,
        })
    }

    /// The script's fingerprint of the context: `find . -type f | LC_ALL=C
    /// sort | xargs sha256sum | sha256sum`. Blocking: runs `sha256sum`.
    ///
    /// # Errors
    ///
    /// When `sha256sum` (coreutils) cannot run.
    pub(super) fn fingerprint(&self) -> io::Result<String> {
        let mut listing = String::new();
        for file in &self.files {
            listing.push_str(&format!(
                "{}  ./{}\n",
                sha256sum(&file.contents)?,
                file.path
            ));
        }
        sha256sum(listing.as_bytes())
    }

    /// The context as a tar archive: the files and every directory above
    /// them, plus the empty `/tmp` (mode 1777) and `/data`.
    pub(super) fn tar(&self) -> io::Result<Vec<u8>> {
        let mut dirs: Vec<(String, u32)> = vec![
            ("rootfs/tmp".to_owned(), 0o1777),
            ("rootfs/data".to_owned(), 0o755),
        ];
        for file in &self.files {
            let mut parent = Path::new(&file.path).parent();
            while let Some(dir) = parent.filter(|dir| !dir.as_os_str().is_empty()) {
                dirs.push((dir.to_string_lossy().into_owned(), 0o755));
                parent = dir.parent();
            }
        }
        // Parents before children; one entry per directory.
        dirs.sort();
        dirs.dedup_by(|a, b| a.0 == b.0);
        let mut tar = Vec::with_capacity(self.files.iter().map(|f| f.contents.len() + 1024).sum());
        for (dir, mode) in &dirs {
            append(&mut tar, &format!("{dir}/"), *mode, Entry::Dir)?;
        }
        for file in &self.files {
            append(&mut tar, &file.path, file.mode, Entry::File(&file.contents))?;
        }
        tar.extend_from_slice(&[0; 1024]);
        Ok(tar)
    }
}

/// The version `redis-server --version` reports (`7.0.15`), for logs.
/// Blocking.
pub(super) fn version_of(binary: &Path) -> Option<String> {
    let output = Command::new(binary).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let version = text.split_whitespace().find_map(|w| w.strip_prefix("v="))?;
    Some(version.to_owned())
}

/// The SHA-256 of `data` as `sha256sum` prints it (64 hex digits): the
/// script's tool, so that both compute the same fingerprint.
fn sha256sum(data: &[u8]) -> io::Result<String> {
    let failed = |err: io::Error| {
        io::Error::new(
            err.kind(),
            format!("running sha256sum (needed for the local Redis image): {err}"),
        )
    };
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(failed)?;
    // sha256sum answers after the end of its input: no deadlock.
    let written = child.stdin.take().expect("piped").write_all(data);
    let output = child.wait_with_output().map_err(failed)?;
    written.map_err(failed)?;
    let text = String::from_utf8_lossy(&output.stdout);
    match text.split_whitespace().next() {
        Some(digest) if output.status.success() && digest.len() == 64 => Ok(digest.to_owned()),
        _ => Err(io::Error::other(format!(
            "sha256sum failed ({}): {text}",
            output.status
        ))),
    }
}

fn read(path: &Path) -> io::Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|err| io::Error::new(err.kind(), format!("reading {}: {err}", path.display())))
}

/// The `redis-server` to package (see [`Recipe::read`]).
fn redis_server() -> io::Result<PathBuf> {
    for variable in ["REDIS_SERVER_BIN", "MULTILOCK_REDIS_SERVER"] {
        if let Some(named) = std::env::var_os(variable).filter(|v| !v.is_empty()) {
            return resolve(&named).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{variable}={} is not an executable file", named.display()),
                )
            });
        }
    }
    find_in_path("redis-server")
        .or_else(|| {
            ["/usr/bin/redis-server", "/usr/sbin/redis-server"]
                .map(PathBuf::from)
                .into_iter()
                .find(|path| is_executable(path))
        })
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "no redis-server on this host to build the local Redis image from \
                 (install it, e.g. `apt-get install redis-server`, or set REDIS_SERVER_BIN)",
            )
        })
}

/// A path, or a bare name looked up in `PATH`.
fn resolve(named: &OsString) -> Option<PathBuf> {
    let path = PathBuf::from(named);
    if path.components().count() > 1 {
        is_executable(&path).then_some(path)
    } else {
        find_in_path(&named.to_string_lossy())
    }
}

/// `command -v name`.
fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Every shared library `ldd` lists for the binaries, with the dynamic
/// loader (`linux-vdso` is virtual and skipped), sorted and unique.
fn libraries_of(binaries: &[&Path]) -> io::Result<Vec<PathBuf>> {
    let mut libraries = Vec::new();
    for binary in binaries {
        let output = Command::new("ldd").arg(binary).output().map_err(|err| {
            io::Error::new(
                err.kind(),
                format!("running ldd (needed to build the local Redis image): {err}"),
            )
        })?;
        libraries.extend(parse_ldd(&String::from_utf8_lossy(&output.stdout)));
    }
    libraries.sort();
    libraries.dedup();
    if libraries.is_empty() {
        return Err(io::Error::other(format!(
            "ldd lists no library for {}: a static redis-server needs no local image; \
             point MULTILOCK_REDIS_IMAGE at an image that has one",
            binaries[0].display()
        )));
    }
    Ok(libraries)
}

/// The script's `awk`: `name => /path (addr)` gives the path, a line
/// starting with a path (the loader) gives it.
fn parse_ldd(output: &str) -> Vec<PathBuf> {
    output
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let path = if line.contains("=>") {
                fields.get(2)?
            } else {
                fields.first()?
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// Appends one file (mode 0644) to a tar archive: for the kit's tests.
#[cfg(test)]
pub(super) fn append_file(tar: &mut Vec<u8>, path: &str, contents: &[u8]) -> io::Result<()> {
    append(tar, path, 0o644, Entry::File(contents))
}

enum Entry<'a> {
    Dir,
    File(&'a [u8]),
}

/// Appends one ustar entry (owned by root, dated the epoch, so that equal
/// contents make equal archives).
fn append(tar: &mut Vec<u8>, path: &str, mode: u32, entry: Entry<'_>) -> io::Result<()> {
    let (kind, data): (u8, &[u8]) = match entry {
        Entry::Dir => (b'5', &[]),
        Entry::File(data) => (b'0', data),
    };
    let (prefix, name) = split_path(path)?;
    let mut header = [0u8; 512];
    header[..name.len()].copy_from_slice(name.as_bytes());
    octal(&mut header[100..108], mode.into());
    octal(&mut header[108..116], 0);
    octal(&mut header[116..124], 0);
    octal(&mut header[124..136], data.len() as u64);
    octal(&mut header[136..148], 0);
    header[156] = kind;
    header[257..263].copy_from_slice(b"ustar\0");
    header[263..265].copy_from_slice(b"00");
    header[345..345 + prefix.len()].copy_from_slice(prefix.as_bytes());
    // The checksum is taken with its own field as spaces.
    header[148..156].copy_from_slice(b"        ");
    let sum: u64 = header.iter().map(|&b| u64::from(b)).sum();
    octal(&mut header[148..155], sum);
    tar.extend_from_slice(&header);
    tar.extend_from_slice(data);
    tar.resize(tar.len().next_multiple_of(512), 0);
    Ok(())
}

/// Splits a path into ustar's prefix (≤ 155 bytes) and name (≤ 100).
fn split_path(path: &str) -> io::Result<(&str, &str)> {
    if path.len() <= 100 {
        return Ok(("", path));
    }
    // Split at a `/` that leaves both parts short enough (a directory's
    // trailing `/` stays with the name).
    path.trim_end_matches('/')
        .match_indices('/')
        .map(|(at, _)| (&path[..at], &path[at + 1..]))
        .find(|(prefix, name)| prefix.len() <= 155 && name.len() <= 100)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("path too long for a tar archive: {path}"),
            )
        })
}

/// Writes `value` in octal, zero-padded, NUL-terminated, filling `field`.
fn octal(field: &mut [u8], value: u64) {
    let digits = field.len() - 1;
    let text = format!("{value:0digits$o}");
    field[..digits].copy_from_slice(&text.as_bytes()[text.len() - digits..]);
    field[digits] = 0;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_libraries_and_the_loader() {
        let output = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                      \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f22)\n\
                      \tlibfoo.so => not found\n\
                      \t/lib64/ld-linux-x86-64.so.2 (0x00007f22)\n";
        assert_eq!(
            parse_ldd(output),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
    }

    #[test]
    fn long_paths_split_into_prefix_and_name() {
        let long = format!("rootfs/{}/lib.so", "d".repeat(120));
        let (prefix, name) = split_path(&long).unwrap();
        assert_eq!((prefix.len(), name), (127, "lib.so"));
        assert!(split_path(&"x".repeat(300)).is_err());
    }

    /// The recipe read from this host: the fingerprint is the one the
    /// build script computes over the same files, and the archive is one
    /// `tar` reads back to those files.
    #[test]
    fn the_recipe_agrees_with_the_build_script() {
        let Ok(recipe) = Recipe::read() else {
            panic!("no redis-server here: the test kit needs one");
        };
        let dir = std::env::temp_dir().join(format!("multilock-recipe-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("context.tar"), recipe.tar().unwrap()).unwrap();
        let ctx = dir.join("ctx");
        std::fs::create_dir_all(&ctx).unwrap();
        let unpacked = Command::new("tar")
            .arg("-xf")
            .arg(dir.join("context.tar"))
            .arg("-C")
            .arg(&ctx)
            .status()
            .unwrap();
        assert!(unpacked.success());
        // The script's own fingerprint command, over the unpacked archive.
        let script = Command::new("bash")
            .arg("-c")
            .arg(
                "set -euo pipefail; find . -type f -print0 | LC_ALL=C sort -z \
                 | xargs -0 sha256sum | sha256sum | cut -d' ' -f1",
            )
            .current_dir(&ctx)
            .output()
            .unwrap();
        assert!(script.status.success());
        let expected = String::from_utf8(script.stdout).unwrap();
        assert_eq!(recipe.fingerprint().unwrap(), expected.trim());
        let tmp = std::fs::metadata(ctx.join("rootfs/tmp")).unwrap();
        assert_eq!(tmp.permissions().mode() & 0o7777, 0o1777);
        assert!(is_executable(
            &ctx.join("rootfs/usr/local/bin/redis-server")
        ));
        assert_eq!(
            std::fs::read(ctx.join("rootfs/usr/local/bin/redis-server")).unwrap(),
            std::fs::read(&recipe.source).unwrap()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
