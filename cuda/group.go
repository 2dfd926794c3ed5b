//go:build cuda || cudaemu

package cuda

import (
	"fmt"

	"github.com/shardline/shardline/tensor"
)

// Group is an NCCL communicator's collectives on the tensor.Buffers of a
// device memory: the method set of parallel/collective's Group, which the
// engine's model and FSDP runtime call, so that NCCL takes the host
// communicators' place behind it. Its methods run on the device's goroutine
// (at once when called there, through Device.Do otherwise). A buffer
// that is not the memory's fails the collective with the memory's error before
// anything is issued.
type Group struct {
	m *Memory
	c *Comm
	// hostStage is the device buffer AllToAllHost moves host values through,
	// grown to the largest exchange seen.
	hostStage [2]Buffer
}

// Group runs c's collectives on m's buffers (c must be of m's device).
func (m *Memory) Group(c *Comm) (*Group, error) {
	if c.d != m.d {
		return nil, fmt.Errorf("cuda: an NCCL communicator of device %d for a memory of device %d", c.d.Ordinal, m.d.Ordinal)
	}
	return &Group{m: m, c: c}, nil
}

func (g *Group) Rank() int { return g.c.rank }
func (g *Group) Size() int { return g.c.size }

// operands are the device buffers x views, or the memory's error.
func (g *Group) operands(op string, xs ...tensor.Buffer) ([]Buffer, error) {
	out := make([]Buffer, len(xs))
	for i, x := range xs {
		b, ok := g.m.Device(op, x)
		if !ok {
			return nil, fmt.Errorf("%s on buffers: %w", op, g.m.err)
		}
		out[i] = b
	}
	return out, nil
}

func (g *Group) f32Only(op string, xs ...tensor.Buffer) error {
	for _, x := range xs {
		if x.DType() != F32 {
			return fmt.Errorf("%s on buffers: a %s buffer (it takes f32)", op, x.DType())
		}
	}
	return nil
}

// AllGather sets dst (Size·len(src)) to every rank's src in rank order: f32,
// bf16 or FP8 buffers of one dtype (FP8 codes move as bytes, ncclUint8).
func (g *Group) AllGather(dst, src tensor.Buffer) (err error) {
	g.m.d.run(func() { err = g.allGather(dst, src) })
	return err
}

func (g *Group) allGather(dst, src tensor.Buffer) error {
	b, err := g.operands("all-gather", dst, src)
	if err != nil {
		return err
	}
	return g.c.AllGather(b[0], b[1])
}

// ReduceScatter sums src (Size·len(dst)) over the ranks into chunk Rank in
// dst. bf16 is summed by NCCL, rounding at each hop (Comm.ReduceScatter).
func (g *Group) ReduceScatter(dst, src tensor.Buffer) (err error) {
	g.m.d.run(func() { err = g.reduceScatter(dst, src) })
	return err
}

func (g *Group) reduceScatter(dst, src tensor.Buffer) error {
	b, err := g.operands("reduce-scatter", dst, src)
	if err != nil {
		return err
	}
	return g.c.ReduceScatter(b[0], b[1])
}

// AllReduce sums an f32 buffer over the ranks, in place.
func (g *Group) AllReduce(buf tensor.Buffer) (err error) {
	g.m.d.run(func() { err = g.allReduce(buf) })
	return err
}

func (g *Group) allReduce(buf tensor.Buffer) error {
	if err := g.f32Only("all-reduce", buf); err != nil {
		return err
	}
	b, err := g.operands("all-reduce", buf)
	if err != nil {
		return err
	}
	return g.c.AllReduce(b[0])
}

// AllToAll is the uneven all-to-all on f32 buffers (Comm.AllToAll).
func (g *Group) AllToAll(dst, src tensor.Buffer, send, recv []int) (err error) {
	g.m.d.run(func() { err = g.allToAll(dst, src, send, recv) })
	return err
}

func (g *Group) allToAll(dst, src tensor.Buffer, send, recv []int) error {
	if err := g.f32Only("all-to-all", dst, src); err != nil {
		return err
	}
	b, err := g.operands("all-to-all", dst, src)
	if err != nil {
		return err
	}
	return g.c.AllToAll(b[0], b[1], send, recv)
}

// SendRecv is one ring step on f32 buffers.
func (g *Group) SendRecv(dst, src tensor.Buffer, to, from int) (err error) {
	g.m.d.run(func() { err = g.sendRecv(dst, src, to, from) })
	return err
}

func (g *Group) sendRecv(dst, src tensor.Buffer, to, from int) error {
	if err := g.f32Only("send/recv", dst, src); err != nil {
		return err
	}
	b, err := g.operands("send/recv", dst, src)
	if err != nil {
		return err
	}
	return g.c.SendRecv(b[0], b[1], to, from)
}

// AllToAllHost is AllToAll on host values (the dropless exchange's split
// sizes): they go up to the device, through NCCL, and back, a read-back the
// host takes by design.
func (g *Group) AllToAllHost(dst, src []float32, send, recv []int) (err error) {
	g.m.d.run(func() { err = g.allToAllHost(dst, src, send, recv) })
	return err
}

func (g *Group) allToAllHost(dst, src []float32, send, recv []int) error {
	if !g.m.ok() {
		return fmt.Errorf("all-to-all of host values: %w", g.m.err)
	}
	for i, n := range []int{len(src), len(dst)} {
		if g.hostStage[i].N < n {
			if g.hostStage[i].N > 0 {
				g.m.d.Free(g.hostStage[i])
			}
			b, err := g.m.d.Alloc(F32, n)
			if err != nil {
				return fmt.Errorf("all-to-all of host values: %w", err)
			}
			g.hostStage[i] = b
		}
	}
	s, d := g.hostStage[0].Slice(0, len(src)), g.hostStage[1].Slice(0, len(dst))
	g.m.d.Upload(s, src)
	if err := g.c.AllToAll(d, s, send, recv); err != nil {
		return err
	}
	g.m.d.Download(dst, d)
	if !g.m.ok() {
		return fmt.Errorf("all-to-all of host values: %w", g.m.err)
	}
	return nil
}

// AsyncErr is the communicator's failure, if NCCL met one on its own
// (collective.Abortable). It may be called from any goroutine.
func (g *Group) AsyncErr() error { return g.c.AsyncErr() }

// Abort gives the communicator up from any goroutine: collectives waiting on
// a lost rank end, and the device's stream with them.
func (g *Group) Abort() { g.c.Abort() }

// Close frees the group's staging (not the communicator).
func (g *Group) Close() { g.m.d.run(g.close) }

func (g *Group) close() {
	for i := range g.hostStage {
		if g.hostStage[i].N > 0 {
			g.m.d.Free(g.hostStage[i])
			g.hostStage[i] = Buffer{}
		}
	}
}
