package main

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSweepIsBoundedBeforeCompiling: --sweep compiled one plan per value with no
// limit (a generated list of a million values compiled a million plans). The
// count is checked before the first plan: at most 64.
func TestSweepIsBoundedBeforeCompiling(t *testing.T) {
	tiny := filepath.Join(recipesDir, "tiny.toml")
	var vals []string
	for i := 1; i <= 65; i++ {
		vals = append(vals, strconv.Itoa(i))
	}
	code, out, errs := shardline(t, nil, "plan", tiny, "--sweep", "train.steps="+strings.Join(vals, ","))
	require.Equal(t, 2, code, "%s%s", out, errs)
	require.Empty(t, out)
	require.Contains(t, errs, "--sweep train.steps: 65 values, over the 64 a sweep compares")

	code, _, errs = shardline(t, nil, "plan", tiny, "--sweep", "train.steps=1,,3")
	require.Equal(t, 2, code)
	require.Contains(t, errs, "an empty value")

	code, out, errs = shardline(t, nil, "plan", tiny, "--sweep", "train.steps="+strings.Join(vals[:64], ","))
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "sweep of train.steps")
}
