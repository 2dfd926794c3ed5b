package parallel

import (
	"fmt"
	"sort"
	"strings"

	"github.com/shardline/shardline/config"
)

// GiB is 2^30 bytes.
const GiB = 1 << 30

// DeviceProfile is what the cost model knows of one device and its links.
type DeviceProfile struct {
	Name string
	// MemoryBytes is the memory one rank may use.
	MemoryBytes int64
	// PeakFLOPS is the dense matmul peak in the compute dtype used for MFU (bf16 on
	// GPUs, fp32 on CPU), in FLOP/s.
	PeakFLOPS float64
	// Achievable is the fraction of PeakFLOPS large matmuls reach in practice.
	Achievable float64
	// HBMBandwidth is device memory bandwidth in bytes/s; memory-bound work (the
	// optimizer step) is timed against it.
	HBMBandwidth float64
	// IntraNodeBW and InterNodeBW are per-rank bus bandwidths in bytes/s for groups
	// inside one node and groups spanning nodes.
	IntraNodeBW float64
	InterNodeBW float64
}

// Profiles are the shipped device profiles. Sources: NVIDIA data sheets for dense
// bf16 peak and memory; NVLink per-direction bandwidth per GPU (A100 NVLink3 300 GB/s,
// H100/H200 NVLink4 450 GB/s); HBM 2.0 TB/s (A100 80GB), 3.35 TB/s (H100 SXM), 4.8 TB/s
// (H200); one 200 Gb/s (A100, HDR) or 400 Gb/s (H100/H200, NDR)
// NIC per GPU across nodes. Achievable fractions: 0.8 is the 798 of 989 TFLOP/s
// measured for a large bf16 GEMM on our H100 (shared/GPU.md); the A100 and H200 use
// the same fraction. The CPU profile is this project's two-core machine, 24 GiB; its
// FLOP/s and in-process copy bandwidth are nominal until the trainer measures them.
var Profiles = map[string]DeviceProfile{
	"cpu":        {Name: "cpu", MemoryBytes: 24 * GiB, PeakFLOPS: 400e9, Achievable: 0.4, HBMBandwidth: 20e9, IntraNodeBW: 8e9, InterNodeBW: 1e9},
	"a100-80gb":  {Name: "a100-80gb", MemoryBytes: 80 * GiB, PeakFLOPS: 312e12, Achievable: 0.8, HBMBandwidth: 2.0e12, IntraNodeBW: 300e9, InterNodeBW: 25e9},
	"h100-80gb":  {Name: "h100-80gb", MemoryBytes: 81559 << 20, PeakFLOPS: 989e12, Achievable: 0.8, HBMBandwidth: 3.35e12, IntraNodeBW: 450e9, InterNodeBW: 50e9},
	"h200-141gb": {Name: "h200-141gb", MemoryBytes: 143771 << 20, PeakFLOPS: 989e12, Achievable: 0.8, HBMBandwidth: 4.8e12, IntraNodeBW: 450e9, InterNodeBW: 50e9},
}

// ProfileNames lists the profiles, sorted.
func ProfileNames() []string {
	var out []string
	for k := range Profiles {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Topology is the machine a plan is for.
type Topology struct {
	WorldSize   int
	GPUsPerNode int // ranks per node; ≥ 1
	Device      DeviceProfile
}

// Nodes is the number of nodes the world spans.
func (t Topology) Nodes() int { return (t.WorldSize + t.GPUsPerNode - 1) / t.GPUsPerNode }

// TopologyOf reads the topology from the recipe's parallel section.
func TopologyOf(p config.Parallel) (Topology, error) {
	name := p.DeviceProfile
	if name == "auto" || name == "" {
		name = "cpu"
		if p.Device == "cuda" {
			name = "h100-80gb"
		}
	}
	prof, ok := Profiles[name]
	if !ok {
		return Topology{}, &KeyError{Key: "parallel.device_profile", Msg: fmt.Sprintf("unknown device profile %q; known: %s", name, strings.Join(ProfileNames(), ", "))}
	}
	if p.DeviceMemoryGiB > 0 {
		prof.MemoryBytes = int64(p.DeviceMemoryGiB * GiB)
	}
	g := p.GPUsPerNode
	if g <= 0 || g > p.WorldSize {
		g = p.WorldSize
	}
	return Topology{WorldSize: p.WorldSize, GPUsPerNode: g, Device: prof}, nil
}

// KeyError is a compile error caused by one recipe key, so lint can position it.
type KeyError struct {
	Key string
	Msg string
}

func (e *KeyError) Error() string { return e.Key + ": " + e.Msg }
