package collective

import (
	"github.com/shardline/shardline/parallel/comm"
	"github.com/shardline/shardline/tensor"
)

// Counting is g with what its collectives send added to c, by c's accounting
// (comm.Counted: the ring algorithms'), for a group whose collectives bypass
// c (a GPU's NCCL over c's members), so that the bytes a model-parallel group
// sends are reported whichever runs them.
func Counting(g Group, c *comm.Counted) Group { return counting{g, c} }

type counting struct {
	Group
	c *comm.Counted
}

func (g counting) AllGather(dst, src tensor.Buffer) error {
	g.c.CountRing(dst.Len(), dst.DType().Size(), 1)
	return g.Group.AllGather(dst, src)
}

func (g counting) ReduceScatter(dst, src tensor.Buffer) error {
	g.c.CountRing(src.Len(), src.DType().Size(), 1)
	return g.Group.ReduceScatter(dst, src)
}

func (g counting) AllReduce(buf tensor.Buffer) error {
	g.c.CountRing(buf.Len(), buf.DType().Size(), 2)
	return g.Group.AllReduce(buf)
}

func (g counting) AllToAll(dst, src tensor.Buffer, send, recv []int) error {
	g.c.CountSent(int64(src.DType().Size()) * int64(others(send, g.Rank())))
	return g.Group.AllToAll(dst, src, send, recv)
}

func (g counting) SendRecv(dst, src tensor.Buffer, to, from int) error {
	if to != g.Rank() {
		g.c.CountSent(int64(src.DType().Size()) * int64(src.Len()))
	}
	return g.Group.SendRecv(dst, src, to, from)
}

func (g counting) AllToAllHost(dst, src []float32, send, recv []int) error {
	g.c.CountSent(4 * int64(others(send, g.Rank())))
	return g.Group.AllToAllHost(dst, src, send, recv)
}

// others is what counts send to members other than rank.
func others(send []int, rank int) int {
	var n int
	for j, k := range send {
		if j != rank {
			n += k
		}
	}
	return n
}
