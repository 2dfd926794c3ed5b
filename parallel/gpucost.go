package parallel

import (
	"math"

	"github.com/shardline/shardline/config"
)

// opCosts times the engine's operations on one device: a table measured on the
// host (Calibration, the CPU), or a GPU's per-operation roofline (gpuCosts).
type opCosts interface {
	gemmTimeOf(bf16 bool, m, k, n int, bwd bool) float64
	// fp8GEMMTime is a linear layer's product (forward, or backward's two)
	// on FP8 operands: an FP8 layer's (microShape.FP8Lo).
	fp8GEMMTime(m, k, n int, bwd bool) float64
	attentionTime(bh, t, hd int, bwd bool) float64
	attentionFullTime(bh, t, hd int, bwd bool) float64
	stream(kind string, n float64) float64
}

// The GPU time model's figures. Those marked measured were measured on the
// H100 this project's GPU work ran on (docs/cuda.md, 2026-11-23; shared with
// the GPU code's benchmarks); the others are assumptions, each saying why.
const (
	// gpuGEMMEfficiency is the fraction of the bf16 (or fp32) peak a large GEMM
	// reaches: 798 of 989 TFLOP/s, measured for a large bf16 GEMM on the H100
	// (cuBLASLt). Assumed the same on the other parts.
	gpuGEMMEfficiency = 798.0 / 989.0
	// gpuGEMMTileRows and gpuGEMMTileCols are the output tile one SM computes
	// at a time (128×128: the tile cuBLASLt's Hopper and Ampere kernels use
	// for bf16): a product of fewer tiles than the device has SMs leaves the
	// others idle. Partial last waves are not charged: cuBLASLt's stream-K and
	// split-K kernels spread them. Assumed.
	gpuGEMMTileRows, gpuGEMMTileCols = 128, 128
	// gpuGEMMDepth is the inner dimension at which a GEMM reaches half its
	// large-K efficiency (each tile's prologue and epilogue against its main
	// loop): a GEMM of inner dimension k runs at k/(k+gpuGEMMDepth) of it.
	// Fitted to the product measured in the 134M model's MLP on the H100: 704
	// TFLOP/s for forward and backward together at 16384×768→3072 (inner
	// dimensions 768, 3072 and 16384); assumed for other shapes.
	gpuGEMMDepth = 237
	// gpuAttnFwdEfficiency and gpuAttnBwdEfficiency are shardline's flash
	// attention kernel against the bf16 peak, measured on the H100 (B16
	// T1024, 12 heads of 64): 128 TFLOP/s forward, 99 forward and backward
	// together (backward 2.5 times the forward's FLOPs, so 90.8 alone).
	gpuAttnFwdEfficiency = 128.0 / 989.0
	gpuAttnBwdEfficiency = 90.8 / 989.0
	// gpuCopyEfficiency is the fraction of the memory bandwidth a device copy
	// reaches: 3.0 of 3.35 TB/s, measured on the H100. Memory-bound kernels
	// are timed at it.
	gpuCopyEfficiency = 3.0 / 3.35
	// gpuLaunchS is the device time one kernel costs beyond its work (the gap
	// between kernels issued back to back on one stream). Assumed: 3 µs,
	// between CUDA's documented launch latency of a few microseconds and a
	// fully overlapped launch queue.
	gpuLaunchS = 3e-6
	// NCCL's collectives: per ring step, a latency inside a node (NVLink) and
	// across nodes (InfiniBand), and the fraction of a link's bandwidth NCCL's
	// bus bandwidth reaches. Assumed (not measured here: the GPU machine has
	// one GPU): 2 µs and 8 µs, the order of NCCL's small-message all-reduce on
	// 8 GPUs over 14 ring steps and of one InfiniBand round trip; 0.8 of the
	// link, as nccl-tests bus bandwidths on NVLink and NDR systems report.
	ncclIntraStepS   = 2e-6
	ncclInterStepS   = 8e-6
	ncclLinkFraction = 0.8
)

// gpuStreamBytes is the bytes each memory-bound kernel moves per element it is
// timed over, in units of the storage size s (bf16 2, fp32 4) and fixed fp32
// bytes f: what the kernel reads and writes. rmsnorm reads x, writes out;
// its backward reads dout and x, writes dx (the weight gradient's partial sums
// are per row block, small); rope reads and writes x; swiglu reads gate and up,
// writes out; its backward reads dout, gate, up, writes dgate and dup;
// cross-entropy reads the fp32 logits once and writes each row's loss, its
// backward writes the gradient (s) after reading them again (f); AdamW reads
// the fp32 weight, gradient and both moments and writes three of them and the
// bf16 compute copy; a square sum reads fp32 gradients; an add reads two and
// writes one fp32 value (accumulation); dispatch, combine and their backward
// move a row each way; the bf16 stores convert fp32 to bf16 and back; an
// FP8 operand's amax reads it, and its quantisation reads it and writes a
// byte a value.
var gpuStreamBytes = map[string]struct{ s, f float64 }{
	StreamRMSNorm: {2, 0}, StreamRMSNormBwd: {3, 0},
	StreamRope: {2, 0}, StreamRopeBwd: {2, 0},
	StreamSwiGLU: {3, 0}, StreamSwiGLUBwd: {5, 0},
	StreamEmbedding: {2, 0}, StreamEmbeddingBwd: {1, 8},
	StreamCrossEntropy: {0, 4}, StreamCrossEntropyBw: {1, 4},
	StreamAdamW: {0, 7*4 + 2}, StreamSumSquares: {0, 4}, StreamAdd: {0, 12},
	StreamCopy: {2, 0}, StreamRouter: {0, 12}, StreamRouterBwd: {0, 16},
	StreamDispatch: {2, 0}, StreamDispatchBwd: {2, 0}, StreamCombine: {3, 0}, StreamCombineBwd: {4, 0},
	StreamAttnMerge: {4, 8}, StreamToBF16: {0, 6}, StreamFromBF16: {0, 6},
	StreamAmax: {1, 0}, StreamQuantize: {1, 1}, // read the tensor; Quantize writes its code byte
}

// gpuCosts is a GPU's per-operation roofline: a GEMM at the measured large-GEMM
// efficiency, less what its inner dimension and idle SMs waste, and never
// faster than its operands' traffic; attention at the measured flash
// attention efficiency; memory-bound kernels by the bytes they move over the
// measured copy bandwidth; every kernel its launch gap.
type gpuCosts struct {
	dev  DeviceProfile
	bf16 bool
	fp8  bool // the product at hand reads FP8 operands (fp8GEMMTime)
}

// peak is the matmul peak in the run's compute dtype, or on FP8 operands the
// device's dense FP8 peak (its bf16 peak on a device without FP8 tensor
// cores, FP8FLOPS 0: an FP8 product there gains nothing).
func (g gpuCosts) peak() float64 {
	if g.fp8 && g.dev.FP8FLOPS > 0 {
		return g.dev.FP8FLOPS
	}
	if g.bf16 || g.fp8 {
		return g.dev.PeakFLOPS
	}
	return g.dev.FP32FLOPS
}

func (g gpuCosts) storage() float64 {
	if g.fp8 {
		return 1 // the operands' codes
	}
	if g.bf16 {
		return 2
	}
	return 4
}

// product is one GEMM's time: C (m×n) from A (m×k) and B (k×n).
func (g gpuCosts) product(m, k, n int) float64 {
	if m <= 0 || k <= 0 || n <= 0 {
		return 0
	}
	eff := gpuGEMMEfficiency * float64(k) / float64(k+gpuGEMMDepth)
	if sms := g.dev.SMs; sms > 0 {
		tiles := ceilDiv(m, gpuGEMMTileRows) * ceilDiv(n, gpuGEMMTileCols)
		eff *= math.Min(1, float64(tiles)/float64(sms))
	}
	flops := 2 * float64(m) * float64(k) * float64(n)
	bytes := g.storage()*float64(m*k+k*n) + 4*float64(m*n)
	return math.Max(flops/(g.peak()*eff), bytes/(g.dev.HBMBandwidth*gpuCopyEfficiency)) + gpuLaunchS
}

// gemmTimeOf is a linear layer over m rows of k inputs and n outputs: the
// forward product, or the backward's two (the input's gradient, m×k over n,
// and the weight's, n×k over m).
func (g gpuCosts) gemmTimeOf(_ bool, m, k, n int, bwd bool) float64 {
	if bwd {
		return g.product(m, n, k) + g.product(n, m, k)
	}
	return g.product(m, k, n)
}

// fp8GEMMTime is gemmTimeOf on FP8 operands (cuBLASLt's FP8 GEMM, the inputs'
// codes a byte each): at the device's FP8 peak, at the same efficiency as
// bf16's (assumed: no FP8 GEMM has been measured on this project's H100).
func (g gpuCosts) fp8GEMMTime(m, k, n int, bwd bool) float64 {
	g.fp8 = true
	return g.gemmTimeOf(true, m, k, n, bwd)
}

// attentionTime is causal flash attention over bh (batch, head) pairs of t
// positions and head size hd: 2·bh·t²·hd FLOPs forward (two products over the
// causal half), 2.5 times that backward.
func (g gpuCosts) attentionTime(bh, t, hd int, bwd bool) float64 {
	if bh <= 0 || t <= 0 {
		return 0
	}
	flops, eff := 2*float64(bh)*float64(t)*float64(t)*float64(hd), gpuAttnFwdEfficiency
	if bwd {
		flops, eff = 2.5*flops, gpuAttnBwdEfficiency
	}
	return flops/(g.dev.PeakFLOPS*eff) + gpuLaunchS
}

// attentionFullTime is attentionTime without the causal mask: twice the work.
func (g gpuCosts) attentionFullTime(bh, t, hd int, bwd bool) float64 {
	return 2*g.attentionTime(bh, t, hd, bwd) - gpuLaunchS
}

func (g gpuCosts) stream(kind string, n float64) float64 {
	if n <= 0 {
		return 0
	}
	g.fp8 = false // a memory-bound kernel reads the run's storage dtype
	b := gpuStreamBytes[kind]
	return n*(b.s*g.storage()+b.f)/(g.dev.HBMBandwidth*gpuCopyEfficiency) + gpuLaunchS
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// ncclTime is one rank's time in a step's collective c over a group of size
// ranks on a link of bandwidth bw (inter: across nodes): the ring's steps at
// their latency, per call, and the bytes the rank sends at NCCL's fraction of
// the link.
func ncclTime(c Collective, size int, bw float64, inter bool) float64 {
	if size <= 1 {
		return 0
	}
	steps := float64(size - 1) // ring all-gather and reduce-scatter
	switch c.Kind {
	case AllReduce:
		steps *= 2
	case AllToAll, SendRecv:
		steps = 1 // every pair at once
	}
	lat := ncclIntraStepS
	if inter {
		lat = ncclInterStepS
	}
	return float64(c.Calls)*steps*lat + c.rankBytes(size)/(bw*ncclLinkFraction)
}

// gpuStepModel is one rank's step on a GPU by the per-operation model: the
// micro-batches' kernels (microCompute over gpuCosts), the once-a-step work
// (stepStreams), and the collectives by NCCL's latency
// and bandwidth. FSDP's gathers and reduce-scatters run on their own stream
// and hide behind compute unit by unit: each unit's communication behind one
// unit's compute, what exceeds it exposed, and one unit's (the first gather
// and the last reduce-scatter) exposed always. The other groups' collectives
// (tp, cp, ep) sit between the kernels that need them and are exposed.
func gpuStepModel(r *config.Recipe, p *Plan) StepBreakdown {
	m := p.Mesh
	c := gpuCosts{dev: p.Topology.Device, bf16: r.Precision.BF16}
	mt := microCompute(r.Model, microShapeOf(r, p, false), c)
	g, _ := mt.Products()
	a, s := mt.Attention, mt.Stream
	micro := float64(p.MicroBatches)
	b := StepBreakdown{GEMM: g * micro, Attention: a * micro, Stream: s * micro, HostShare: 1}
	stream, opt := stepStreams(r, p, c, true)
	b.Stream += stream
	b.Optimizer = opt
	var hidden, exposed float64
	for _, col := range p.Collectives {
		size := m.Size(col.Axis)
		inter := m.SpansNodes(col.Axis, p.Topology.GPUsPerNode)
		bw := p.Topology.Device.IntraNodeBW
		if inter {
			bw = p.Topology.Device.InterNodeBW
		}
		t := ncclTime(col, size, bw, inter)
		if col.Overlap {
			hidden += t
		} else {
			exposed += t
		}
	}
	if hidden > 0 {
		units := float64(max(len(p.Units), 1))
		perComm, perCompute := hidden/units, (b.GEMM+b.Attention+b.Stream)/units
		exposed += perComm + (units-1)*math.Max(0, perComm-perCompute)
	}
	b.Comm = exposed
	return b
}
