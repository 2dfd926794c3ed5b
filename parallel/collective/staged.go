package collective

import (
	"fmt"
	"unsafe"

	"github.com/shardline/shardline/parallel/comm"
	"github.com/shardline/shardline/tensor"
)

// Staged returns c's collectives on buffers of any memory, through host copies:
// a collective reads its operands back (Memory.Read, counted as read-backs),
// runs c on host slices and writes the result back (Memory.Write). It serves
// where a device's own collectives cannot run, such as several ranks sharing
// one GPU (NCCL refuses two ranks on one device), and any backend without
// collectives of its own. The host slices are kept and grown, so collectives
// of sizes seen before allocate nothing on the host. A buffer that is not one
// of mem's, or not of a dtype the collective takes, fails the collective with
// mem's error and sends nothing.
func Staged(c comm.Communicator, mem tensor.Memory) Group {
	return &staged{c: c, mem: mem}
}

type staged struct {
	c   comm.Communicator
	mem tensor.Memory
	// Two host slots (a collective's source and destination) per dtype, and
	// each slot's views by length as interfaces, the form Memory.Read and
	// Write take: made once per length, so that converting a slice to an
	// interface allocates only for a length not seen before.
	f32  [2][]float32
	bf16 [2][]tensor.BF16
	as   [2]map[stagedKey]any
	// FP8 codes of an all-gather (source and destination), read and written
	// as E4M3 codes whatever the format (Memory.Read and Write copy codes of a
	// buffer's own format unchanged, and both formats' codes are bytes), and
	// their views as interfaces, by length.
	f8   [2][]tensor.F8E4M3
	f8as [2]map[int]any
}

type stagedKey struct {
	bf16 bool
	n    int
}

func (g *staged) Rank() int { return g.c.Rank() }
func (g *staged) Size() int { return g.c.Size() }

func (g *staged) AllToAllHost(dst, src []float32, send, recv []int) error {
	return g.c.AllToAll(dst, src, send, recv)
}

// host is slot i's first n values in dtype t (f32 or bf16 bits) and the same
// values as the interface Memory.Read and Write take.
func (g *staged) host(i int, t tensor.DType, n int) (f []float32, h []uint16, a any) {
	bf := t == tensor.BFloat16
	if bf && cap(g.bf16[i]) < n {
		g.bf16[i] = make([]tensor.BF16, n)
		clear(g.as[i])
	}
	if !bf && cap(g.f32[i]) < n {
		g.f32[i] = make([]float32, n)
		clear(g.as[i])
	}
	if g.as[i] == nil {
		g.as[i] = map[stagedKey]any{}
	}
	k := stagedKey{bf, n}
	a, ok := g.as[i][k]
	if bf {
		v := g.bf16[i][:n]
		if !ok {
			a = v
			g.as[i][k] = a
		}
		return nil, bf16Bits(v), a
	}
	f = g.f32[i][:n]
	if !ok {
		a = f
		g.as[i][k] = a
	}
	return f, nil, a
}

// stage checks a collective's operands (f32, or bf16 where bf16OK, all of one
// dtype: refused before anything is read or sent), reads src into slot 0 and
// returns slot 1 sized for dst.
func (g *staged) stage(op string, bf16OK bool, dst, src tensor.Buffer) (d, s []float32, dh, sh []uint16, err error) {
	t := src.DType()
	if dst.DType() != t || (t != tensor.Float32 && !(bf16OK && t == tensor.BFloat16)) {
		takes := "f32"
		if bf16OK {
			takes = "f32 or bf16"
		}
		return nil, nil, nil, nil, fmt.Errorf("%s on buffers: %s into %s (it takes %s buffers of one dtype)", op, t, dst.DType(), takes)
	}
	s, sh, a := g.host(0, t, src.Len())
	g.mem.Read(a, src)
	if err := g.mem.Err(); err != nil {
		return nil, nil, nil, nil, fmt.Errorf("%s on buffers: %w", op, err)
	}
	d, dh, _ = g.host(1, t, dst.Len())
	return d, s, dh, sh, nil
}

// finish writes slot 1 into dst once the collective ran.
func (g *staged) finish(op string, err error, dst tensor.Buffer) error {
	if err != nil {
		return err
	}
	_, _, a := g.host(1, dst.DType(), dst.Len())
	g.mem.Write(dst, a)
	if err := g.mem.Err(); err != nil {
		return fmt.Errorf("%s on buffers: %w", op, err)
	}
	return nil
}

// codes is FP8 slot i's first n codes, as uint16 pairs (n even) and as the
// interface Memory.Read and Write take.
func (g *staged) codes(i, n int) ([]uint16, any) {
	if cap(g.f8[i]) < n {
		g.f8[i] = make([]tensor.F8E4M3, n)
		clear(g.f8as[i])
	}
	if g.f8as[i] == nil {
		g.f8as[i] = map[int]any{}
	}
	v := g.f8[i][:n]
	a, ok := g.f8as[i][n]
	if !ok {
		a = v
		g.f8as[i][n] = a
	}
	return bytePairs(unsafe.Slice((*uint8)(unsafe.Pointer(unsafe.SliceData(v))), n)), a
}

// allGatherFP8 is AllGather of FP8 codes: read back, gathered as uint16
// pairs, written.
func (g *staged) allGatherFP8(dst, src tensor.Buffer) error {
	if err := fp8Pairs(dst, src); err != nil {
		return err
	}
	s, a := g.codes(0, src.Len())
	g.mem.Read(g.as8(a, src), src)
	if err := g.mem.Err(); err != nil {
		return fmt.Errorf("all-gather on buffers: %w", err)
	}
	d, b := g.codes(1, dst.Len())
	if err := g.c.AllGatherBF16(d, s); err != nil {
		return err
	}
	g.mem.Write(dst, g.as8(b, dst))
	if err := g.mem.Err(); err != nil {
		return fmt.Errorf("all-gather on buffers: %w", err)
	}
	return nil
}

// as8 is the host codes a in x's format: E4M3 codes as they are, or the same
// bytes as E5M2 codes for an E5M2 buffer (Memory.Read and Write take a
// buffer's own format's codes without converting them).
func (g *staged) as8(a any, x tensor.Buffer) any {
	if x.DType() == tensor.Float8E5M2 {
		v := a.([]tensor.F8E4M3)
		return unsafe.Slice((*tensor.F8E5M2)(unsafe.Pointer(unsafe.SliceData(v))), len(v))
	}
	return a
}

func (g *staged) AllGather(dst, src tensor.Buffer) error {
	if _, ok := dst.DType().FP8(); ok {
		return g.allGatherFP8(dst, src)
	}
	d, s, dh, sh, err := g.stage("all-gather", true, dst, src)
	if err != nil {
		return err
	}
	if dst.DType() == tensor.BFloat16 {
		err = g.c.AllGatherBF16(dh, sh)
	} else {
		err = g.c.AllGather(d, s)
	}
	return g.finish("all-gather", err, dst)
}

func (g *staged) ReduceScatter(dst, src tensor.Buffer) error {
	d, s, dh, sh, err := g.stage("reduce-scatter", true, dst, src)
	if err != nil {
		return err
	}
	if dst.DType() == tensor.BFloat16 {
		err = g.c.ReduceScatterBF16(dh, sh)
	} else {
		err = g.c.ReduceScatter(d, s)
	}
	return g.finish("reduce-scatter", err, dst)
}

func (g *staged) AllToAll(dst, src tensor.Buffer, send, recv []int) error {
	d, s, _, _, err := g.stage("all-to-all", false, dst, src)
	if err != nil {
		return err
	}
	return g.finish("all-to-all", g.c.AllToAll(d, s, send, recv), dst)
}

func (g *staged) SendRecv(dst, src tensor.Buffer, to, from int) error {
	d, s, _, _, err := g.stage("send/recv", false, dst, src)
	if err != nil {
		return err
	}
	return g.finish("send/recv", g.c.SendRecv(d, s, to, from), dst)
}

// AllReduce reads buf into slot 0, sums it there and writes slot 0 back.
func (g *staged) AllReduce(buf tensor.Buffer) error {
	if buf.DType() != tensor.Float32 {
		return fmt.Errorf("all-reduce on buffers: a %s buffer (it takes f32)", buf.DType())
	}
	b, _, a := g.host(0, tensor.Float32, buf.Len())
	g.mem.Read(a, buf)
	if err := g.mem.Err(); err != nil {
		return fmt.Errorf("all-reduce on buffers: %w", err)
	}
	if err := g.c.AllReduce(b); err != nil {
		return err
	}
	g.mem.Write(buf, a)
	if err := g.mem.Err(); err != nil {
		return fmt.Errorf("all-reduce on buffers: %w", err)
	}
	return nil
}
