package config

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWrittenFingerprint: the fingerprint of a resolved recipe's text as
// written is its recipe's; an edit of the text changes it, and a text
// without the header has none.
func TestWrittenFingerprint(t *testing.T) {
	res, diags := Load(filepath.Join("..", "recipes", "tiny.toml"), Options{})
	require.False(t, diags.HasErrors(), "%v", diags)
	text, fp, err := ResolvedTOML(&res.Recipe)
	require.NoError(t, err)
	got, ok := WrittenFingerprint(text)
	require.True(t, ok)
	require.Equal(t, fp, got)
	edited := bytes.Replace(text, []byte("seed = "), []byte("seed =  "), 1)
	got, ok = WrittenFingerprint(edited)
	require.True(t, ok)
	require.NotEqual(t, fp, got)
	_, ok = WrittenFingerprint(text[1:])
	require.False(t, ok)
}
