#!/usr/bin/env bash
# Fuzz each target (package:Name) for FUZZTIME. A target fails on a finding: a
# failing input written to its testdata/fuzz directory, or any other error. One
# failure is not a finding: Go 1.26's fuzz coordinator can report "context
# deadline exceeded" as the -fuzztime window closes, with nothing found
# (go.dev/issue/75804, fixed in Go 1.27). Then no input was written; the script
# says so, replays the target's corpus to confirm, and goes on.
set -uo pipefail
fuzztime=$1
shift
go=${GO:-go}
for t in "$@"; do
	pkg=${t%%:*} name=${t##*:}
	dir="$pkg/testdata/fuzz/$name"
	before=$(ls "$dir" 2>/dev/null | sort)
	echo "fuzz $name in $pkg for $fuzztime"
	out=$($go test "$pkg" -run '^$' -fuzz "^$name\$" -fuzztime "$fuzztime" 2>&1)
	rc=$?
	echo "$out"
	[ $rc -eq 0 ] && continue
	after=$(ls "$dir" 2>/dev/null | sort)
	if [ "$before" = "$after" ] && grep -q '^    context deadline exceeded$' <<<"$out"; then
		echo "note: $name: Go's fuzz coordinator reported its own deadline (go.dev/issue/75804) and wrote no failing input; replaying the corpus"
		$go test "$pkg" -run "^$name\$" -count=1 || exit 1
		continue
	fi
	echo "fuzz $name failed: see the input written to $dir" >&2
	exit 1
done
