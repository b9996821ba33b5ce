#!/usr/bin/env bash
# Prints the crate's import graph between top-level modules (src/<module>.rs
# or src/<module>/), from every `crate::<module>` path in non-test code, and
# the cycles in it. The design allows one: single <-> guard.
set -euo pipefail
cd "$(dirname "$0")/../src"
edges=$(
  for file in $(find . -name '*.rs' ! -path './lib.rs' ! -path './testkit/*'); do
    from=$(echo "$file" | sed -E 's#^\./##; s#/.*##; s#\.rs$##')
    # Code before the first #[cfg(test)] only: unit tests may reach anywhere.
    awk '/^#\[cfg\(test\)\]/ { exit } { print }' "$file" |
      grep -oE 'crate::[a-z_]+' | sed 's/crate:://' |
      while read -r to; do
        [ -e "$to.rs" ] || [ -d "$to" ] || continue
        [ "$to" != "$from" ] && echo "$from $to"
      done
  done | sort -u
)
echo "$edges"
echo "--- pairs that import each other:"
pairs=$(echo "$edges" | while read -r a b; do
  if echo "$edges" | grep -qx "$b $a" && [[ "$a" < "$b" ]]; then echo "$a <-> $b"; fi
done)
echo "$pairs"
if [ "$pairs" != "guard <-> single" ]; then
  echo "error: the only allowed cycle is guard <-> single" >&2
  exit 1
fi
echo "--- any other cycle (tsort without the allowed pair):"
if ! echo "$edges" | grep -vE '^(single guard|guard single)$' | tsort >/dev/null; then
  echo "error: a cycle besides guard <-> single" >&2
  exit 1
fi
echo none
