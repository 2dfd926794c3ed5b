//go:build cuda || cudaemu

package cuda

import (
	"fmt"
	"os"
	"testing"
)

// The device tests open device 0 once for the package. Under -tags cuda they
// need an NVIDIA GPU (bin/cuda.test, carried to the GPU machine); under -tags
// cudaemu (make test) the engine's kernel set and memory run on the host
// emulator through the same code, while the tests of cuBLASLt, NCCL and the
// tensor-core kernels stay GPU-only.

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
