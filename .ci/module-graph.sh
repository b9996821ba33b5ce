#!/usr/bin/env bash
# The import graph between the FILES of src/, and its circles.
#
# Nodes: the .rs files of src/ but lib.rs and test-only files (a
# `#[cfg(test...)] mod x;` target and everything beneath it, such as
# tests.rs and fencing/model/).
# Edges: every `crate::a::b::c`, `super::...` and `self::...` path in a
# file's code before a column-0 `#[cfg(test)] mod ... {` (unit tests may
# reach anywhere), `use` groups expanded (`crate::{a::b, c::{d, e}}`, over
# several lines), comments left out. A path goes to the deepest module that
# has a file (src/a/b.rs or src/a/b/mod.rs, a `#[path]` module where one is
# declared), else to its parent's; `crate::Name` re-exported by lib.rs, and
# `a::Name` re-exported by module a (`pub`, `pub(crate)`, `pub(in ...)`),
# go to the file the name comes from.
# Not counted: a module using what it declares beneath it (`child::Item`; a
# parent is its children's facade), and what needs name resolution: a
# private `use child::X` reached as `super::X`, glob re-exports, a module
# reached through an alias.
#
# Prints the edges; fails on any circle (strongly connected component) of
# more than 2 files, on a 2-file circle not allowed below, and on an allowed
# pair that is no longer a circle.
set -euo pipefail
cd "$(dirname "$0")/../src"

# The allowed 2-file circles: "a.rs b.rs  reason" (paths under src/, in
# either order). A pair is allowed only where the two files are one concern.
allowed='
fencing/book/mod.rs fencing/repair.rs  the counters awaiting repair: the book is their ledger and starts the tasks, repair.rs the tasks that work it off and write back
'

find . -name '*.rs' | sed 's#^\./##' | sort |
  awk -v allowed="$allowed" '
function modpath_of(f,   m) {
  if (f in pathmod) return pathmod[f]
  m = f; sub(/\.rs$/, "", m); sub(/\/mod$/, "", m); if (m == "lib") m = ""
  return m
}
function parent(m) { if (m !~ /\//) return ""; sub(/\/[^\/]*$/, "", m); return m }
function dir_of(f) { if (f !~ /\//) return ""; sub(/\/[^\/]*$/, "", f); return f "/" }
function test_only(m,   p) {
  for (p = m; p != ""; p = parent(p)) if (p in testmod) return 1
  return 0
}
# Appends every path in the use tree s (no whitespace) to the global paths.
function expand(s,   p, head, body, i, c, depth, start, item) {
  p = index(s, "{")
  if (p == 0) { sub(/::self$/, "", s); paths = paths s "\n"; return }
  head = substr(s, 1, p - 1); body = substr(s, p + 1, length(s) - p - 1)
  depth = 0; start = 1
  for (i = 1; i <= length(body) + 1; i++) {
    c = (i <= length(body)) ? substr(body, i, 1) : ","
    if (c == "{") depth++
    else if (c == "}") depth--
    else if (c == "," && depth == 0) {
      item = substr(body, start, i - start); start = i + 1
      if (item == "self") { s = head; sub(/::$/, "", s); paths = paths s "\n" }
      else if (item != "") expand(head item)
    }
  }
}
# Appends every crate::/super:: path in text (one line) to the global paths.
function scan(text,   rest, tok, i, c, depth, group) {
  gsub(/pub\(in [^)]*\)/, "pub", text)
  rest = text
  while (match(rest, /(crate|super)(::[A-Za-z_0-9*]+)*::([A-Za-z_0-9*]+|[{])/)) {
    if (RSTART > 1 && substr(rest, RSTART - 1, 1) ~ /[A-Za-z_0-9]/) {
      rest = substr(rest, RSTART + RLENGTH); continue
    }
    tok = substr(rest, RSTART, RLENGTH); rest = substr(rest, RSTART + RLENGTH)
    if (tok !~ /[{]$/) { paths = paths tok "\n"; continue }
    depth = 1
    for (i = 1; i <= length(rest) && depth > 0; i++) {
      c = substr(rest, i, 1)
      if (c == "{") depth++; else if (c == "}") depth--
    }
    group = tok substr(rest, 1, i - 1); rest = substr(rest, i)
    gsub(/[ \t]+as[ \t]+[A-Za-z_0-9]+/, "", group); gsub(/[ \t]/, "", group)
    expand(group)
  }
}
# The file a path of module m goes to ("" for none).
function resolve(m, path,   n, seg, i, base, k, c, j) {
  n = split(path, seg, "::")
  if (seg[1] == "crate") { base = ""; i = 2 }
  else if (seg[1] == "self") { base = m; i = 2 }
  else { base = m; i = 1; while (i <= n && seg[i] == "super") { base = parent(base); i++ } }
  for (k = n; k >= i - 1; k--) {
    c = base
    for (j = i; j <= k; j++) c = (c == "" ? seg[j] : c "/" seg[j])
    if (c in reexp) return reexp[c]
    if (c != "" && (c in modfile)) return modfile[c]
    if (c == "" && (seg[i] in rootitem)) return rootitem[seg[i]]
  }
  return ""
}
function read_code(f,   line, text, skip_mod) {
  text = ""
  while ((getline line < f) > 0) {
    if (line == "#[cfg(test)]") {
      if ((getline line < f) <= 0) break
      if (line ~ /^(pub(\([a-z]+\))? )?mod [a-z_0-9]+;/) continue
      if (line ~ /^(pub(\([a-z]+\))? )?mod [a-z_0-9]+ *[{]/) break
    }
    if (line ~ /^[ \t]*\/\//) continue
    if (line !~ /"/) sub(/\/\/.*$/, "", line)
    text = text " " line
  }
  close(f)
  return text
}
{ files[++nfiles] = $0 }
END {
  # Modules: a #[path] declaration moves one; a #[cfg(test...)] one is
  # test-only with all beneath it.
  for (n = 1; n <= nfiles; n++) {
    f = files[n]; attr = ""
    while ((getline line < f) > 0) {
      if (line ~ /^[ \t]*#\[/) { attr = attr line; continue }
      if (line ~ /^[ \t]*(pub(\([a-z]+\))? )?mod [a-z_0-9]+;/) {
        name = line; sub(/^.*mod /, "", name); sub(/;.*$/, "", name)
        child = modpath_of(f); child = (child == "" ? name : child "/" name)
        if (attr ~ /cfg\((all\()?test/) testmod[child] = 1
        if (match(attr, /#\[path = "[^"]*"\]/)) {
          p = substr(attr, RSTART + 10, RLENGTH - 12)
          pathmod[dir_of(f) p] = child
        }
      }
      if (line !~ /^[ \t]*$/) attr = ""
    }
    close(f)
  }
  for (n = 1; n <= nfiles; n++) {
    f = files[n]; m = modpath_of(f)
    if (f == "lib.rs" || test_only(m)) continue
    modfile[m] = f; node[f] = 1
  }
  # lib.rs re-exports: crate::Name is the file Name comes from.
  paths = ""; text = read_code("lib.rs")
  while (match(text, /pub use [^;]*;/)) {
    stmt = substr(text, RSTART + 8, RLENGTH - 9); text = substr(text, RSTART + RLENGTH)
    gsub(/[ \t]/, "", stmt); expand("crate::" stmt)
  }
  np = split(paths, list, "\n")
  for (i = 1; i <= np; i++) {
    if (list[i] == "") continue
    k = split(list[i], seg, "::"); t = resolve("", list[i])
    if (t != "") rootitem[seg[k]] = t
  }
  # The re-exports of every other module (`pub(crate) use child::Name;`):
  # a path to m::Name goes to the file Name comes from. Twice, for a
  # re-export of a re-export.
  for (pass = 1; pass <= 2; pass++) for (n = 1; n <= nfiles; n++) {
    f = files[n]
    if (!(f in node)) continue
    m = modpath_of(f); paths = ""; text = read_code(f)
    while (match(text, /pub(\((crate|super|self|in [^)]*)\))? use [^;]*;/)) {
      stmt = substr(text, RSTART, RLENGTH - 1); text = substr(text, RSTART + RLENGTH)
      sub(/^pub(\((crate|super|self|in [^)]*)\))? use /, "", stmt)
      gsub(/[ \t]+as[ \t]+[A-Za-z_0-9]+/, "", stmt); gsub(/[ \t]/, "", stmt)
      expand(stmt)
    }
    np = split(paths, list, "\n")
    for (i = 1; i <= np; i++) {
      if (list[i] == "" || list[i] ~ /\*$/) continue
      k = split(list[i], seg, "::"); t = resolve(m, list[i])
      if (t != "" && t != f) reexp[m "/" seg[k]] = t
    }
  }
  # The edges.
  for (n = 1; n <= nfiles; n++) {
    f = files[n]
    if (!(f in node)) continue
    m = modpath_of(f); paths = ""; scan(read_code(f))
    np = split(paths, list, "\n")
    for (i = 1; i <= np; i++) {
      if (list[i] == "") continue
      t = resolve(m, list[i])
      if (t != "" && t != f && (t in node)) edge[f, t] = 1
    }
  }
  nn = 0
  for (n = 1; n <= nfiles; n++) if (files[n] in node) name_of[++nn] = files[n]
  for (a = 1; a <= nn; a++) for (b = 1; b <= nn; b++)
    if ((name_of[a], name_of[b]) in edge) { print name_of[a] " -> " name_of[b]; reach[a, b] = 1 }
  for (k = 1; k <= nn; k++) for (a = 1; a <= nn; a++) if ((a, k) in reach)
    for (b = 1; b <= nn; b++) if ((k, b) in reach) reach[a, b] = 1
  # The allowed pairs.
  na = split(allowed, rows, "\n")
  for (i = 1; i <= na; i++) {
    if (split(rows[i], w, " ") < 2) continue
    key = (w[1] < w[2]) ? w[1] " " w[2] : w[2] " " w[1]
    allow[key] = 1
  }
  status = 0
  print "--- circles:"
  for (a = 1; a <= nn; a++) {
    if (a in seen) continue
    comp = name_of[a]; size = 1
    for (b = a + 1; b <= nn; b++)
      if (((a, b) in reach) && ((b, a) in reach)) { comp = comp " " name_of[b]; size++; seen[b] = 1 }
    if (size == 1) continue
    if (size == 2 && (comp in allow)) { print comp " (allowed)"; found[comp] = 1; continue }
    print comp
    if (size > 2) print "error: a circle over " size " files: " comp > "/dev/stderr"
    else print "error: a 2-file circle not allowed in .ci/module-graph.sh: " comp > "/dev/stderr"
    status = 1
  }
  for (key in allow) if (!(key in found)) {
    print "error: allowed pair no longer a circle (drop it from the list): " key > "/dev/stderr"
    status = 1
  }
  exit status
}'
