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
	// Achievable is the fraction of PeakFLOPS large matmuls reach in practice, for
	// the model that times FLOPs against the peak.
	Achievable float64
	// FP32FLOPS is the fp32 (non-tensor-core) peak, which fp32 runs' matmuls
	// reach at most; SMs is the streaming multiprocessors (0: unknown), by which
	// the GPU time model charges products too small to fill the device.
	FP32FLOPS float64
	SMs       int
	// FP8FLOPS is the dense FP8 tensor-core peak (0: the device has no FP8
	// tensor cores), which an FP8 layer's products reach at most (the GPU
	// time model, gpucost.go).
	FP8FLOPS float64
	// HBMBandwidth is device memory bandwidth in bytes/s; memory-bound work (the
	// optimizer step) is timed against it.
	HBMBandwidth float64
	// IntraNodeBW and InterNodeBW are per-rank bus bandwidths in bytes/s for groups
	// inside one node and groups spanning nodes.
	IntraNodeBW float64
	InterNodeBW float64
}

// Profiles are the shipped device profiles: memory one rank may use, dense
// (not sparse) matmul peak in the compute dtype, device memory bandwidth, and
// per-direction bus bandwidth per rank inside a node and across nodes.
// Achievable (0.8: the 798 of 989 TFLOP/s measured for a large bf16 GEMM on
// our H100) serves only the model that times FLOPs at a fraction of the peak,
// which plans a CPU a recipe describes by its figures; GPUs are timed per
// operation by gpucost.go, whose measured efficiencies and assumptions say
// where each comes from. Sources:
//   - a100-80gb: NVIDIA A100 data sheet: 312 TFLOP/s bf16, 2.0 TB/s (80GB
//     SXM), NVLink3 600 GB/s (300 per direction); one 200 Gb/s HDR NIC per GPU.
//   - h100-80gb: NVIDIA H100 data sheet (SXM): 989 TFLOP/s bf16, 3.35 TB/s,
//     NVLink4 900 GB/s (450 per direction); one 400 Gb/s NDR NIC per GPU; memory
//     as nvidia-smi reports it on our H100 (81559 MiB).
//   - h200-141gb: NVIDIA H200 data sheet: the H100's compute, 4.8 TB/s, 141 GB
//     (143771 MiB, as nvidia-smi reports).
//   - h800-80gb: the H100 SXM with NVLink cut to 400 GB/s (200 per direction),
//     per NVIDIA's H800 product brief; memory and compute as the H100's.
//   - h20-96gb: no public NVIDIA data sheet; the figures reported for it
//     (e.g. willitrunai.com/gpus/h20-96gb, 2025): 148 TFLOP/s bf16, 96 GB HBM3
//     at 4.0 TB/s, NVLink4 900 GB/s; a 400 Gb/s NIC per GPU assumed.
//   - b200-180gb: HGX B200 at 1,000 W (glennklockwood.com/garden/processors/B200,
//     from NVIDIA's Blackwell data sheet): 2,250 TFLOP/s bf16 dense, 8 TB/s,
//     NVLink5 1.8 TB/s (900 per direction); 180 GB per GPU (HGX B200's 1.44 TB
//     over 8); one 400 Gb/s NIC per GPU.
//   - l40s-48gb: NVIDIA L40S data sheet: 362 TFLOP/s bf16 dense, 48 GB GDDR6 with
//     ECC at 864 GB/s (46068 MiB usable, as nvidia-smi reports), no NVLink: PCIe
//     Gen4 x16 64 GB/s (32 per direction); a 200 Gb/s NIC per GPU assumed.
//   - fp32 peaks and SM counts: the same data sheets (A100 19.5 TFLOP/s, 108
//     SMs; H100, H200 and H800 SXM 67, 132; L40S 91.6, 142); the H20's from the
//     same reports (44, 78); the B200's from the same page (HGX at 1,000 W: 80)
//     and public spec listings (148 SMs, hmc-tech.com/gpus/nvidia-b200-vs-nvidia-b100).
//   - dense FP8 peaks: the same data sheets, which give them with sparsity
//     (halved here, as they say: H100, H200 and H800 SXM 3,958 → 1,979
//     TFLOP/s; L40S 1,466 → 733; HGX B200 at 1,000 W 9,000 → 4,500); the
//     H20's reported 296 dense (twice its bf16, as on every FP8 part); the
//     A100 has no FP8 tensor cores (0: its FP8 products are timed at the
//     bf16 peak).
//   - cpu: this project's two-core machine, 24 GiB; its FLOP/s and in-process copy
//     bandwidth are nominal until the plan is calibrated by measurement.
var Profiles = map[string]DeviceProfile{
	"cpu":        {Name: "cpu", MemoryBytes: 24 * GiB, PeakFLOPS: 400e9, Achievable: 0.4, FP32FLOPS: 400e9, HBMBandwidth: 20e9, IntraNodeBW: 8e9, InterNodeBW: 1e9},
	"a100-80gb":  {Name: "a100-80gb", MemoryBytes: 80 * GiB, PeakFLOPS: 312e12, Achievable: 0.8, FP32FLOPS: 19.5e12, SMs: 108, HBMBandwidth: 2.0e12, IntraNodeBW: 300e9, InterNodeBW: 25e9},
	"h100-80gb":  {Name: "h100-80gb", MemoryBytes: 81559 << 20, PeakFLOPS: 989e12, Achievable: 0.8, FP32FLOPS: 67e12, FP8FLOPS: 1979e12, SMs: 132, HBMBandwidth: 3.35e12, IntraNodeBW: 450e9, InterNodeBW: 50e9},
	"h200-141gb": {Name: "h200-141gb", MemoryBytes: 143771 << 20, PeakFLOPS: 989e12, Achievable: 0.8, FP32FLOPS: 67e12, FP8FLOPS: 1979e12, SMs: 132, HBMBandwidth: 4.8e12, IntraNodeBW: 450e9, InterNodeBW: 50e9},
	"h800-80gb":  {Name: "h800-80gb", MemoryBytes: 81559 << 20, PeakFLOPS: 989e12, Achievable: 0.8, FP32FLOPS: 67e12, FP8FLOPS: 1979e12, SMs: 132, HBMBandwidth: 3.35e12, IntraNodeBW: 200e9, InterNodeBW: 50e9},
	"h20-96gb":   {Name: "h20-96gb", MemoryBytes: 96e9, PeakFLOPS: 148e12, Achievable: 0.8, FP32FLOPS: 44e12, FP8FLOPS: 296e12, SMs: 78, HBMBandwidth: 4.0e12, IntraNodeBW: 450e9, InterNodeBW: 50e9},
	"b200-180gb": {Name: "b200-180gb", MemoryBytes: 180e9, PeakFLOPS: 2250e12, Achievable: 0.8, FP32FLOPS: 80e12, FP8FLOPS: 4500e12, SMs: 148, HBMBandwidth: 8.0e12, IntraNodeBW: 900e9, InterNodeBW: 50e9},
	"l40s-48gb":  {Name: "l40s-48gb", MemoryBytes: 46068 << 20, PeakFLOPS: 362e12, Achievable: 0.8, FP32FLOPS: 91.6e12, FP8FLOPS: 733e12, SMs: 142, HBMBandwidth: 864e9, IntraNodeBW: 32e9, InterNodeBW: 25e9},
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
	// Calibration, when set, times the step operation by operation (stepModel)
	// from measurements of this device; nil times it from the profile's peak.
	Calibration *Calibration
}

// Nodes is the number of nodes the world spans.
func (t Topology) Nodes() int { return (t.WorldSize + t.GPUsPerNode - 1) / t.GPUsPerNode }

// TopologyOf reads the topology from the recipe's parallel section; a CPU
// device is timed from its table in cals (nil: the shipped ones), unless the
// recipe describes another device.
func TopologyOf(p config.Parallel, cals Calibrations) (Topology, error) {
	name := p.DeviceProfile
	if name == "auto" || name == "" {
		name = "cpu"
		if p.Device == "cuda" {
			name = "h100-80gb"
		}
	}
	prof, ok := Profiles[name]
	if name == "custom" {
		// Every figure from the recipe; large matmuls are assumed to reach the
		// fraction of peak measured on the H100 (see Profiles).
		prof, ok = DeviceProfile{Name: "custom", Achievable: 0.8}, true
		for _, k := range []struct {
			key string
			v   float64
		}{{"parallel.device_memory_gib", p.DeviceMemoryGiB}, {"parallel.device_peak_tflops", p.DevicePeakTFLOPS},
			{"parallel.device_memory_gbps", p.DeviceMemoryGBps}, {"parallel.device_intra_node_gbps", p.DeviceIntraNodeGBps},
			{"parallel.device_inter_node_gbps", p.DeviceInterNodeGBps}} {
			if k.v <= 0 {
				return Topology{}, config.KeyProblem("parallel.device_profile", fmt.Sprintf("device_profile = \"custom\" needs %s > 0 (a custom device is described by device_memory_gib, device_peak_tflops, device_memory_gbps, device_intra_node_gbps and device_inter_node_gbps)", k.key), "")
			}
		}
	}
	if !ok {
		return Topology{}, config.KeyProblem("parallel.device_profile", fmt.Sprintf("unknown device profile %q; known: %s", name, strings.Join(ProfileNames(), ", ")), "")
	}
	if p.DeviceMemoryGiB > 0 {
		prof.MemoryBytes = int64(p.DeviceMemoryGiB * GiB)
	}
	if p.DevicePeakTFLOPS > 0 {
		if prof.PeakFLOPS > 0 {
			prof.FP8FLOPS *= p.DevicePeakTFLOPS * 1e12 / prof.PeakFLOPS // the FP8 peak keeps its ratio to the bf16 one
		}
		prof.PeakFLOPS = p.DevicePeakTFLOPS * 1e12
	}
	if name == "custom" {
		prof.FP32FLOPS = prof.PeakFLOPS * 67 / 989  // the H100's ratio of fp32 to bf16 peak: assumed
		prof.FP8FLOPS = prof.PeakFLOPS * 1979 / 989 // and of FP8 to bf16: assumed
	}
	if p.DeviceMemoryGBps > 0 {
		prof.HBMBandwidth = p.DeviceMemoryGBps * 1e9
	}
	if p.DeviceIntraNodeGBps > 0 {
		prof.IntraNodeBW = p.DeviceIntraNodeGBps * 1e9
	}
	if p.DeviceInterNodeGBps > 0 {
		prof.InterNodeBW = p.DeviceInterNodeGBps * 1e9
	}
	g := p.GPUsPerNode
	if g <= 0 || g > p.WorldSize {
		g = p.WorldSize
	}
	topo := Topology{WorldSize: p.WorldSize, GPUsPerNode: g, Device: prof}
	described := p.DeviceMemoryGBps > 0 || p.DevicePeakTFLOPS > 0 || p.DeviceIntraNodeGBps > 0 || p.DeviceInterNodeGBps > 0
	if c := cals.For(name); c != nil && p.Device == "cpu" && !described {
		topo.Calibration = c // the measured engine, unless the recipe describes another device
	}
	return topo, nil
}
