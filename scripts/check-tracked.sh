#!/usr/bin/env bash
# Fails when git tracks what a build makes: an executable binary (ELF, Mach-O, PE, a Go
# test binary), or any file over 4 MiB that is not data the tests read (listed below).
# .ci/run runs it first; run it yourself before a commit that adds large files.
set -euo pipefail
cd "$(dirname "$0")/.."
limit=$((4 << 20))
# Data files allowed past the limit, one path per line (none today: the largest, a
# Mooncake trace the simulator replays, is 1.4 MB).
allowed=""
bad=0
while IFS= read -r -d '' f; do
  [ -f "$f" ] || continue
  magic=$(head -c 4 "$f" | od -An -tx1 | tr -d ' \n')
  case $magic in
    7f454c46 | cffaedfe | cefaedfe | feedfacf | feedface | 4d5a*)
      echo "tracked build output: $f is an executable binary (remove it with git rm --cached, and ignore it)" >&2
      bad=1
      continue ;;
  esac
  size=$(stat -c %s "$f")
  if [ "$size" -gt "$limit" ] && ! grep -qxF "$f" <<<"$allowed"; then
    echo "tracked large file: $f is $size bytes (over 4 MiB): data the tests read belongs in scripts/check-tracked.sh's list; anything else out of git" >&2
    bad=1
  fi
done < <(git ls-files -z)
exit $bad
