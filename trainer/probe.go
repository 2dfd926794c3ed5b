package trainer

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/shardline/shardline/fileio"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor"
)

// probeMinTime is how long ProbeSpeed times each kernel at least (at least
// three calls after a warm-up): the whole probe takes about 0.15 s on this
// project's development host when it is quiet.
const probeMinTime = 20 * time.Millisecond

// driftShapes are the fp32 matmuls Calibrate times again after its in-step
// passes (gemmDrift) and ProbeSpeed times against a table: the middle of the
// row and width axes, the most rows at the middle width, and the middle rows
// at the next width up (1024×256×256, 8192×256×256 and 1024×512×512 on the
// default grid: the widths of the small models a CPU trains; the widest,
// 1024×2048×2048, which the drift check timed before 2026-11-27, took half a
// second alone, forward and backward). rows and dims are a grid's sorted row
// counts and widths.
func driftShapes(rows, dims []int) [][3]int {
	if len(rows) == 0 || len(dims) == 0 {
		return nil
	}
	mid, next := dims[len(dims)/2], dims[min(len(dims)/2+1, len(dims)-1)]
	r := rows[len(rows)/2]
	return [][3]int{{r, mid, mid}, {rows[len(rows)-1], mid, mid}, {r, next, next}}
}

// ProbeSpeed measures this machine against c's tables in well under a second:
// the drift check's matmuls (driftShapes over c's grid; forward and
// backward) and one memory-bound kernel (parallel.ProbeStreamKind), each
// timed by the median of repeated calls on be, over the table's time for it.
// The result scales c to this machine (Calibration.Scaled); version is the
// shardline that probed.
func ProbeSpeed(be tensor.Backend, c *parallel.Calibration, version string) (parallel.Probe, error) {
	start := time.Now()
	p, err := probeOf(c, func(sh [3]int) (fwd, bwd float64, err error) {
		mem := be.NewMemory()
		op := newGEMMOperands(mem, sh[0], sh[1], sh[2])
		s := tensor.MatmulShape{BT: sh[0], C: sh[1], OC: sh[2]}
		fwd = medianTime(func() { be.Matmul(op.out, op.inp, op.w, s, false) }, probeMinTime)
		bwd = medianTime(func() { be.MatmulBackward(op.dinp, op.dw, op.out, op.inp, op.w, s, false) }, probeMinTime)
		return fwd, bwd, mem.Err()
	}, func() (float64, error) {
		// AddInto, as calibrate times parallel.StreamAdd (streamKernel), over
		// zeros: filling the operands took longer than the timing. Both are
		// written first, so that their pages are the process's own (a page
		// never written reads as the kernel's one zero page, from cache).
		// Over streamAllocs allocations, the median, as calibrate times
		// it: a VM places one allocation's pages well, the next badly.
		var ts []float64
		for range streamAllocs {
			mem, n := be.NewMemory(), parallel.ProbeStreamElements
			a, o := mem.Alloc(tensor.Float32, n), mem.Alloc(tensor.Float32, n)
			be.AddInto(a, o, n)
			ts = append(ts, medianTime(func() { be.AddInto(o, a, n) }, probeMinTime))
			if err := mem.Err(); err != nil {
				return 0, err
			}
		}
		return parallel.Median(ts), nil
	})
	if err != nil {
		return parallel.Probe{}, err
	}
	p.Host, p.Threads, p.Version = CalibrationHost(be), runtime.GOMAXPROCS(0), version
	p.Date = time.Now().UTC().Format(time.RFC3339)
	p.Seconds = time.Since(start).Seconds()
	return p, nil
}

// probeOf is ProbeSpeed with the kernels' timings given: gemm times one
// matmul shape forward and backward, stream the memory-bound kernel
// (parallel.ProbeStreamKind over parallel.ProbeStreamElements). It fills the
// factors and the table's digest.
func probeOf(c *parallel.Calibration, gemm func(shape [3]int) (fwd, bwd float64, err error), stream func() (float64, error)) (parallel.Probe, error) {
	rows, dims := gridAxis(c.GEMM, func(p parallel.GEMMPoint) int { return p.M }), gridAxis(c.GEMM, func(p parallel.GEMMPoint) int { return p.K })
	shapes := driftShapes(rows, dims)
	if len(shapes) == 0 {
		return parallel.Probe{}, fmt.Errorf("probe: the calibration (%s, %s) has no matmuls to compare with; measure it again with shardline calibrate", c.Host, c.Date)
	}
	var ratios []float64
	for _, sh := range shapes {
		i := slices.IndexFunc(c.GEMM, func(p parallel.GEMMPoint) bool { return [3]int{p.M, p.K, p.N} == sh })
		if i < 0 {
			return parallel.Probe{}, fmt.Errorf("probe: matmul %d×%d×%d is not in the calibration's grid (%s, %s); measure it again with shardline calibrate", sh[0], sh[1], sh[2], c.Host, c.Date)
		}
		fwd, bwd, err := gemm(sh)
		if err != nil {
			return parallel.Probe{}, fmt.Errorf("probe: matmul %d×%d×%d: %w", sh[0], sh[1], sh[2], err)
		}
		ratios = append(ratios, fwd/c.GEMM[i].Fwd, bwd/c.GEMM[i].Bwd)
	}
	st, err := stream()
	if err != nil {
		return parallel.Probe{}, fmt.Errorf("probe: %s: %w", parallel.ProbeStreamKind, err)
	}
	p := parallel.Probe{Table: c.Digest(), GEMM: parallel.Median(ratios),
		Stream: st / c.Stream[parallel.ProbeStreamKind].Time(parallel.ProbeStreamElements)}
	if err := p.Check(c); err != nil {
		return parallel.Probe{}, fmt.Errorf("probe: %w; the machine may have stalled while it was probed: plan again", err)
	}
	return p, nil
}

// gridAxis is the sorted distinct values of one coordinate of a matmul grid.
func gridAxis(pts []parallel.GEMMPoint, f func(parallel.GEMMPoint) int) []int {
	var out []int
	for _, p := range pts {
		if v := f(p); !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	sort.Ints(out)
	return out
}

// MachineKey names this machine more closely than CalibrationHost does: its
// CPU model, CPU count and kernels, GOMAXPROCS, host name and
// /etc/machine-id, hashed. Two machines whose CPUs name themselves alike
// (and run at different speeds) have different keys; a calibration records
// the key of the machine that measured it (Calibration.Machine), and the CLI
// keys its cached probes by it.
func MachineKey(be tensor.Backend) string {
	m := thisMachine()
	id, _ := fileio.ReadRegular("/etc/machine-id", 4096)
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s\x00%d\x00%s\x00%s", CalibrationHost(be), runtime.GOMAXPROCS(0), m.Host, strings.TrimSpace(string(id)))))
	return hex.EncodeToString(sum[:8])
}
