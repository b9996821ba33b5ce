#!/usr/bin/env bash
# Build a local Redis image from the host's `redis-server` binary, for machines
# that cannot pull `redis:7` (offline / no registry access).
#
# The image is `FROM scratch` and contains only:
#   /usr/local/bin/redis-server   (the host binary, copied with `cp -L`)
#   /usr/local/bin/redis-cli      (if present on the host; handy for healthchecks)
#   every shared library `ldd` reports, plus the dynamic loader, at their host paths
#   /etc/nsswitch.conf, /tmp, /data
#
# It accepts the same command form as the official `redis:7` image:
#   docker run IMG                                   # default CMD
#   docker run IMG redis-server --port 7000 ...      # explicit command
# (there is no ENTRYPOINT; `redis-server` is found through PATH=/usr/local/bin).
# Unlike redis:7 it does NOT accept bare flags (`docker run IMG --port 7000`),
# because scratch has no shell to implement docker-entrypoint.sh.
#
# Usage: docker/build-local-image.sh
# Env:
#   MULTILOCK_LOCAL_IMAGE   image tag to build (default: multilock-redis:local).
#                           Not MULTILOCK_REDIS_IMAGE: that one names the image the
#                           tests and compose files *use* (it may be redis:7), and
#                           building must never overwrite it.
#                           A tag that exists without this script's label is refused.
#   REDIS_SERVER_BIN        redis-server to package (default: $MULTILOCK_REDIS_SERVER,
#                           the test kit's binary, else `command -v redis-server`)
#   MULTILOCK_FORCE_BUILD=1 rebuild even if the image is up to date
#   MULTILOCK_SKIP_VERIFY=1 skip the post-build smoke test
#
# Re-running is idempotent and fast: the image carries a label with a checksum of
# its inputs; when it matches, the build is skipped.
#
# The test kit (testkit/src/containers/recipe.rs) builds the same image through
# the Docker API when redis:7 cannot be pulled: same files, same Dockerfile, same
# labels and fingerprint, so either one finds the other's image up to date.
# Change the recipe here and there together.
set -euo pipefail

IMAGE="${MULTILOCK_LOCAL_IMAGE:-multilock-redis:local}"

log() { printf '[build-local-image] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

command -v docker >/dev/null 2>&1 || die "docker is not installed"

# --- locate (or install) redis-server ----------------------------------------
find_redis() {
    if [[ -n "${REDIS_SERVER_BIN:-}" ]]; then
        printf '%s\n' "$REDIS_SERVER_BIN"
        return
    fi
    if [[ -n "${MULTILOCK_REDIS_SERVER:-}" ]]; then
        command -v "$MULTILOCK_REDIS_SERVER" 2>/dev/null || printf '%s\n' "$MULTILOCK_REDIS_SERVER"
        return
    fi
    command -v redis-server 2>/dev/null \
        || { [[ -x /usr/bin/redis-server ]] && echo /usr/bin/redis-server; } \
        || { [[ -x /usr/sbin/redis-server ]] && echo /usr/sbin/redis-server; } \
        || true
}

REDIS_BIN="$(find_redis)"
if [[ -n "${REDIS_SERVER_BIN:-}" && ! -x "$REDIS_BIN" ]]; then
    die "REDIS_SERVER_BIN=$REDIS_SERVER_BIN is not an executable file"
elif [[ -n "${MULTILOCK_REDIS_SERVER:-}" && ! -x "$REDIS_BIN" ]]; then
    die "MULTILOCK_REDIS_SERVER=$MULTILOCK_REDIS_SERVER is not an executable file"
fi
if [[ -z "$REDIS_BIN" ]]; then
    if [[ "$(id -u)" -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        log "redis-server not found; installing it with apt-get"
        apt-get update
        DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server
        REDIS_BIN="$(find_redis)"
    fi
fi
[[ -n "$REDIS_BIN" && -x "$REDIS_BIN" ]] \
    || die "redis-server not found (install it, e.g. 'apt-get install redis-server', or set REDIS_SERVER_BIN)"
command -v ldd >/dev/null 2>&1 || die "ldd is required"

REDIS_CLI="$(command -v redis-cli 2>/dev/null || true)"

# Shared libraries (absolute paths) needed by the given binaries, including the
# dynamic loader. linux-vdso is virtual and skipped.
libs_of() {
    local b
    for b in "$@"; do ldd "$b"; done 2>/dev/null | awk '
        /=>/ { if ($3 ~ /^\//) print $3; next }
        $1 ~ /^\// { print $1 }
    ' | sort -u
}

BINS=("$REDIS_BIN")
[[ -n "$REDIS_CLI" && -x "$REDIS_CLI" ]] && BINS+=("$REDIS_CLI")
mapfile -t LIBS < <(libs_of "${BINS[@]}")
[[ ${#LIBS[@]} -gt 0 ]] || die "ldd reported no libraries for $REDIS_BIN (is it static? then this script is not needed)"

# --- build context ------------------------------------------------------------
CTX="$(mktemp -d "${TMPDIR:-/tmp}/multilock-redis-ctx.XXXXXX")"
trap 'rm -rf "$CTX"' EXIT
ROOT="$CTX/rootfs"
mkdir -p "$ROOT/usr/local/bin" "$ROOT/etc" "$ROOT/tmp" "$ROOT/data"
chmod 1777 "$ROOT/tmp"
chmod 0755 "$ROOT/data"

# The file MUST be called redis-server: on Debian it is a symlink to
# redis-check-rdb and Redis chooses its mode from argv[0].
cp -L "$REDIS_BIN" "$ROOT/usr/local/bin/redis-server"
[[ ${#BINS[@]} -gt 1 ]] && cp -L "$REDIS_CLI" "$ROOT/usr/local/bin/redis-cli"

for lib in "${LIBS[@]}"; do
    mkdir -p "$ROOT$(dirname "$lib")"
    cp -L "$lib" "$ROOT$lib"
done

# Resolve hostnames (e.g. `--replicaof primary 6379` in compose) via /etc/hosts
# and DNS; Docker bind-mounts /etc/hosts and /etc/resolv.conf at run time.
printf 'hosts: files dns\n' > "$ROOT/etc/nsswitch.conf"

cat > "$CTX/Dockerfile" <<'EOF'
FROM scratch
COPY rootfs/ /
ENV PATH=/usr/local/bin
EXPOSE 6379
WORKDIR /data
# No ENTRYPOINT: like redis:7, the command is `redis-server [flags...]`.
CMD ["redis-server","--bind","0.0.0.0","--protected-mode","no","--save","","--appendonly","no"]
EOF

# Fingerprint of everything that goes into the image (contents + paths).
FINGERPRINT="$(
    cd "$CTX" && find . -type f -print0 | LC_ALL=C sort -z \
        | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
)"

CURRENT="$(docker image inspect --format '{{ index .Config.Labels "org.multilock.redis.fingerprint" }}' "$IMAGE" 2>/dev/null || true)"
# An image of that tag that this script did not build (redis:7, the user's own):
# never overwrite it.
if [[ -z "$CURRENT" || "$CURRENT" == "<no value>" ]] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
    die "$IMAGE exists and was not built by this script; set MULTILOCK_LOCAL_IMAGE to another tag"
fi

if [[ "$CURRENT" == "$FINGERPRINT" && "${MULTILOCK_FORCE_BUILD:-0}" != "1" ]]; then
    log "$IMAGE is up to date ($("$REDIS_BIN" --version | awk '{print $3}'))"
else
    log "building $IMAGE from $REDIS_BIN ($(readlink -f "$REDIS_BIN"))"
    # Without the buildx plugin, DOCKER_BUILDKIT=1 makes `docker build` fail;
    # the legacy builder handles this FROM-scratch Dockerfile fine.
    if ! docker buildx version >/dev/null 2>&1; then
        export DOCKER_BUILDKIT=0
    fi
    docker build --quiet \
        --label "org.multilock.redis.fingerprint=$FINGERPRINT" \
        --label "org.multilock.redis.source=$(readlink -f "$REDIS_BIN")" \
        -t "$IMAGE" "$CTX" >/dev/null
fi

# --- smoke test ---------------------------------------------------------------
if [[ "${MULTILOCK_SKIP_VERIFY:-0}" != "1" ]]; then
    # 1. explicit command form: `IMG redis-server ...`
    docker run --rm --network none "$IMAGE" redis-server --version >/dev/null \
        || die "'docker run $IMAGE redis-server --version' failed"

    # 2. default CMD: the server starts and answers PING.
    cid="$(docker run -d --network none "$IMAGE")"
    ok=0
    for _ in $(seq 1 50); do
        if [[ ${#BINS[@]} -gt 1 ]]; then
            if [[ "$(docker exec "$cid" redis-cli ping 2>/dev/null || true)" == "PONG" ]]; then ok=1; break; fi
        elif docker logs "$cid" 2>&1 | grep -q 'Ready to accept connections'; then
            ok=1; break
        fi
        sleep 0.1
    done
    if [[ $ok -ne 1 ]]; then
        docker logs "$cid" >&2 || true
        docker rm -f "$cid" >/dev/null 2>&1 || true
        die "container from $IMAGE did not become ready"
    fi
    docker rm -f "$cid" >/dev/null
    log "smoke test passed"
fi

echo "$IMAGE"
