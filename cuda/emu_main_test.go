//go:build cudaemu

package cuda

import (
	"fmt"
	"os"
	"testing"
)

// The device tests that run on the host emulator (go test -tags cudaemu
// ./cuda, which make test runs): the engine's kernel set and memory through
// the same code as on a GPU. The tests of cuBLASLt, NCCL and the tensor-core
// kernels run on a GPU only (bin/cuda.test).

var dev *Device

func TestMain(m *testing.M) {
	d, err := Open(0)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Fprintln(os.Stderr, "device:", d.Info())
	dev = d
	code := m.Run()
	d.Close()
	os.Exit(code)
}
