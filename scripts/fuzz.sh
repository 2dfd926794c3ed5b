#!/usr/bin/env bash
# Fuzz each target (package:Name) for FUZZTIME. A target fails on a finding: a
# failing input written to its testdata/fuzz directory, or any other error. One
# failure is not a finding: Go 1.26's fuzz coordinator can report "context
# deadline exceeded" as the -fuzztime window closes, with nothing found
# (go.dev/issue/75804, fixed in Go 1.27). Then no input was written; the script
# says so, replays the target's corpus to confirm, and goes on.
#
# Inputs are not minimized (-fuzzminimizetime FUZZMINIMIZE, default 0): Go spends
# up to 60 s shrinking each new input, with both workers idle meanwhile, so an
# 8-second CI window mostly minimized. FuzzText in 15 s ran 56k inputs with
# minimizing and 437k without (FuzzLoadWeights 35k and 61k in 20 s). A failing
# input is written whole; FUZZMINIMIZE=60s shrinks it while reproducing.
set -uo pipefail
fuzztime=$1
shift
go=${GO:-go}
for t in "$@"; do
	pkg=${t%%:*} name=${t##*:}
	dir="$pkg/testdata/fuzz/$name"
	before=$(ls "$dir" 2>/dev/null | sort)
	echo "fuzz $name in $pkg for $fuzztime"
	out=$($go test "$pkg" -run '^$' -fuzz "^$name\$" -fuzztime "$fuzztime" -fuzzminimizetime "${FUZZMINIMIZE:-0}" 2>&1)
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
