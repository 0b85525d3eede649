#!/usr/bin/env bash
# Shows that a change did not move what the model computes: runs `hugelab run --json` on every
# workload in scenarios/, scenarios/model-only/ and workloads/ with the binary of a base revision and
# with the work tree's, and compares the two outputs file by file (the "workload" path aside).
#
#   scripts/model-outputs.sh [BASE]      BASE: a git revision, default HEAD~1
#   BASE_BIN=path/to/hugelab scripts/model-outputs.sh   use an already built base binary
#
# A workload the base binary cannot parse (new language) is listed and skipped, not compared.
# Exits 0 when every file's output is the same, 1 when one differs (listing the first counters that
# differ), 2 on a build or run failure.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-HEAD~1}
tmp=$(mktemp -d)
trap 'git worktree remove --force "$tmp/base" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT

if [ -z "${BASE_BIN:-}" ]; then
  git worktree add --detach "$tmp/base" "$base" >/dev/null
  (cd "$tmp/base" && cargo build --release --quiet -p hugelab) || exit 2
  BASE_BIN="$tmp/base/target/release/hugelab"
fi
cargo build --release --quiet -p hugelab || exit 2
NEW_BIN=target/release/hugelab

# One document per file, whatever shape a version prints for a single file (an object, or an array of one).
normalize() { jq -S 'if type == "array" then .[0] else . end | del(.workload)'; }

files=(scenarios/*.hlw scenarios/model-only/*.hlw workloads/*.hlw)
differ=0
newer=0
for f in "${files[@]}"; do
  # Exit 1 is a failed expectation, a workload's own business; both binaries must agree on it too.
  set +e
  "$BASE_BIN" run --json "$f" >"$tmp/a.json" 2>"$tmp/a.err"; a=$?
  "$NEW_BIN" run --json "$f" >"$tmp/b.json" 2>"$tmp/b.err"; b=$?
  set -e
  # A workload written in language the base does not know yet (exit 2 on its parse) is new, not a difference.
  if [ "$a" -eq 2 ] && [ "$b" -le 1 ] && grep -q "^hugelab: $f:[0-9]*:[0-9]*: " "$tmp/a.err"; then
    newer=$((newer + 1))
    echo "$f: new language, the base cannot parse it: $(head -n 1 "$tmp/a.err")"
    continue
  fi
  if [ "$a" -gt 1 ] || [ "$b" -gt 1 ]; then
    echo "$f: run failed (base exit $a, new exit $b)"; cat "$tmp/a.err" "$tmp/b.err"; exit 2
  fi
  if [ "$a" != "$b" ] || ! cmp -s <(normalize <"$tmp/a.json") <(normalize <"$tmp/b.json"); then
    differ=$((differ + 1))
    echo "$f: differs (exit $a vs $b)"
    diff <(normalize <"$tmp/a.json") <(normalize <"$tmp/b.json") | head -n 12 || true
  fi
done
echo "$((${#files[@]} - newer)) workloads compared, $differ differ ($newer new that the base cannot parse)"
[ "$differ" -eq 0 ]
