package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/tensor"
)

// gpuRunner is the executable built with -tags cuda (make cuda): the same CLI with
// the GPU engine linked in. The shardline everyone runs has no GPU code (the CUDA
// driver bindings end the process at start-up where there is no GPU), so it hands
// cuda runs to this one.
const gpuRunner = "shardline-cuda"

// gpuCount is the number of GPUs this process sees; nil in a build without
// -tags cuda. A cuda run checks it before anything is written.
var gpuCount func() (int, error)

// rankGPUs gives each rank of a run (in this process, or one process of a
// job, whose node index is localRank; -1 for none) the kernel set of its GPU;
// nil in a build without -tags cuda.
var rankGPUs func(localRank int) func(rank int) (tensor.Backend, func(), error)

// findGPURunner looks for shardline-cuda next to this executable, then on PATH.
func (a *app) findGPURunner() (string, []string) {
	var looked []string
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), gpuRunner)
		looked = append(looked, filepath.Dir(self))
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, looked
		}
	}
	for _, dir := range filepath.SplitList(config.EnvMap(a.env)["PATH"]) {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, gpuRunner)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, looked
		}
	}
	return "", append(looked, "PATH")
}

// libcudaDirs are where the NVIDIA driver's libcuda.so.1 is usually installed,
// after LD_LIBRARY_PATH.
var libcudaDirs = []string{"/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/aarch64-linux-gnu",
	"/usr/local/nvidia/lib64", "/usr/local/cuda/lib64", "/usr/local/cuda/compat"}

// gpuMissing says what a GPU run lacks on this machine (no NVIDIA driver device,
// or no libcuda.so.1), or "" when both are there. shardline-cuda cannot say it
// itself: the CUDA bindings end the process before main where either is missing.
func (a *app) gpuMissing() string {
	if _, err := os.Stat("/dev/nvidiactl"); err != nil {
		return "no NVIDIA GPU driver is loaded (/dev/nvidiactl is missing): run on a machine with an NVIDIA GPU and its driver"
	}
	dirs := append(filepath.SplitList(config.EnvMap(a.env)["LD_LIBRARY_PATH"]), libcudaDirs...)
	for _, dir := range dirs {
		if dir == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, "libcuda.so.1")); err == nil {
			return ""
		}
	}
	return fmt.Sprintf("the NVIDIA driver's libcuda.so.1 was not found (looked in LD_LIBRARY_PATH and %s): install the driver, or add its library directory to LD_LIBRARY_PATH",
		strings.Join(libcudaDirs, ", "))
}

// execGPURunner replaces this process with shardline-cuda given the same
// arguments, or says how to get one and what the machine lacks.
func (a *app) execGPURunner(res *config.Resolved) error {
	loc := res.Origin("parallel.device").Location()
	if why := a.gpuMissing(); why != "" {
		return &exitError{code: exitFindings, err: fmt.Errorf(`%s: parallel.device = "cuda": %s; or set device = "cpu"`, loc, why)}
	}
	path, looked := a.findGPURunner()
	if path == "" {
		return &exitError{code: exitFindings, err: fmt.Errorf(`%s: parallel.device = "cuda": this shardline has no GPU engine, and no %s was found (looked in %s); build it with make cuda on a machine with the CUDA headers (docs/cuda.md) and put it next to shardline, or set device = "cpu"`,
			loc, gpuRunner, strings.Join(looked, ", "))}
	}
	if _, err := exec.LookPath(path); err != nil {
		return &exitError{code: exitFindings, err: fmt.Errorf("%s: %s: %v", loc, path, err)}
	}
	fmt.Fprintf(a.stderr, "parallel.device = \"cuda\": running %s\n", path)
	return syscall.Exec(path, append([]string{path}, a.args...), a.env)
}
