package fileio

import (
	"bytes"
	"testing"
)

// FuzzUnseal: any bytes are unsealed or refused, never a panic; what unseals
// seals back to the same bytes.
func FuzzUnseal(f *testing.F) {
	f.Add(Seal([]byte("contents")))
	f.Add(Seal(nil))
	f.Add([]byte("SHLCRC32"))
	f.Fuzz(func(t *testing.T, b []byte) {
		body, err := Unseal("fuzz", b)
		if err != nil {
			return
		}
		if !bytes.Equal(Seal(append([]byte(nil), body...)), b) {
			t.Fatalf("unsealed %q does not seal back to the input", body)
		}
	})
}
