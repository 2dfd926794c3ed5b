//go:build !amd64 || purego

package cpu

import "testing"

// eachISA runs fn once: off amd64 (or with purego) the kernels are Go only.
func eachISA(t *testing.T, fn func(t *testing.T)) { t.Run("go", fn) }

// eachISABench is eachISA for benchmarks.
func eachISABench(b *testing.B, fn func(b *testing.B)) { b.Run("go", fn) }
