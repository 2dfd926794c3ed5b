package comm

import (
	"errors"
	"fmt"
	"math"
	"math/rand"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardline/shardline/internal/allocs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

// tcpRanks joins n ranks over loopback and runs f on each. Rank 0 hosts the
// rendezvous on a socket bound here (as shardline launch passes one down), so no
// other process can take the port in between.
func tcpRanks(t *testing.T, n int, timeout time.Duration, f func(c *TCP) error) []error {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return tcpRanksOn(ln, n, timeout, f)
}

// tcpRanksOn is tcpRanks with rank 0 hosting on ln.
func tcpRanksOn(ln net.Listener, n int, timeout time.Duration, f func(c *TCP) error) []error {
	addr := ln.Addr().String()
	return concurrently(n, func(r int) error {
		cfg := TCPConfig{Rank: r, World: n, MasterAddr: addr, Token: "job-1", Timeout: timeout}
		if r == 0 {
			cfg.Listener = ln
		}
		c, err := DialTCP(cfg)
		if err != nil {
			return err
		}
		defer c.Close()
		return f(c)
	})
}

// TestTCPCollectives: over loopback, gathers and all-to-all are exact and sums
// equal the serial sum to fp32 rounding (the ring sums in another order: 1e-6
// relative on sums of a few unit normals); two runs agree bit for bit.
func TestTCPCollectives(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			const L = 33
			rng := rand.New(rand.NewSource(int64(n)))
			in := make([][]float32, n)
			for r := range in {
				in[r] = values(rng, n*L)
			}
			sum := make([]float64, n*L)
			for _, x := range in {
				for j, v := range x {
					sum[j] += float64(v)
				}
			}
			run := func() ([][]float32, [][]float32) {
				gathered, reduced := make([][]float32, n), make([][]float32, n)
				errs := tcpRanks(t, n, 10*time.Second, func(c *TCP) error {
					r := c.Rank()
					gathered[r] = make([]float32, n*L)
					if err := c.AllGather(gathered[r], in[r][:L]); err != nil {
						return err
					}
					part := make([]float32, L)
					if err := c.ReduceScatter(part, in[r]); err != nil {
						return err
					}
					reduced[r] = append([]float32(nil), in[r]...)
					if err := c.AllReduce(reduced[r]); err != nil {
						return err
					}
					for j := range part { // the reduce-scatter's chunk agrees with the all-reduce
						if math.Abs(float64(part[j]-reduced[r][r*L+j])) > 1e-5 {
							return fmt.Errorf("rank %d: reduce-scatter %v, all-reduce %v", r, part[j], reduced[r][r*L+j])
						}
					}
					b := append([]float32(nil), in[r][:L]...)
					if err := c.Broadcast(b, 0); err != nil {
						return err
					}
					if b[3] != in[0][3] {
						return errors.New("broadcast did not arrive")
					}
					send, recv := make([]int, n), make([]int, n)
					for j := range send {
						send[j], recv[j] = (r+j)%3, (j+r)%3
					}
					dst := make([]float32, sum2(recv))
					return c.AllToAll(dst, in[r][:sum2(send)], send, recv)
				})
				for _, err := range errs {
					require.NoError(t, err)
				}
				return gathered, reduced
			}
			g1, r1 := run()
			_, r2 := run()
			for r := 0; r < n; r++ {
				for i := 0; i < n; i++ {
					assert.Equal(t, in[i][:L], g1[r][i*L:(i+1)*L])
				}
				for j := range sum {
					require.InDelta(t, sum[j], float64(r1[r][j]), 1e-6*(1+math.Abs(sum[j])), "rank %d element %d", r, j)
				}
				assert.Equal(t, r1[r], r2[r], "bit-identical across runs")
				assert.Equal(t, r1[0], r1[r], "every rank holds the same sum")
			}
		})
	}
}

func sum2(xs []int) int { return sum(xs) }

// TestTCPBF16: the bf16 reduce-scatter and all-gather carry 2 bytes a value on the
// wire (one frame per peer here) and give what the in-process communicator gives,
// bit for bit: the chunks summed in fp32 in rank order, rounded once.
func TestTCPBF16(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			const L = 37
			rng := rand.New(rand.NewSource(int64(n)))
			in := make([][]uint16, n)
			for r := range in {
				in[r] = make([]uint16, n*L)
				for i, v := range values(rng, n*L) {
					in[r][i] = f32ToBF16(v)
				}
			}
			want, wantG := make([][]uint16, n), make([][]uint16, n)
			for r, err := range onRanks(n, 10*time.Second, func(c Communicator) error {
				r := c.Rank()
				want[r], wantG[r] = make([]uint16, L), make([]uint16, n*L)
				if err := c.ReduceScatterBF16(want[r], in[r]); err != nil {
					return err
				}
				return c.AllGatherBF16(wantG[r], in[r][:L])
			}) {
				require.NoError(t, err, "in process, rank %d", r)
			}
			got, gotG, wire := make([][]uint16, n), make([][]uint16, n), make([]int64, n)
			for _, err := range tcpRanks(t, n, 10*time.Second, func(c *TCP) error {
				r := c.Rank()
				got[r], gotG[r] = make([]uint16, L), make([]uint16, n*L)
				before := c.WireBytes()
				if err := c.ReduceScatterBF16(got[r], in[r]); err != nil {
					return err
				}
				wire[r] = c.WireBytes() - before
				return c.AllGatherBF16(gotG[r], in[r][:L])
			}) {
				require.NoError(t, err)
			}
			for r := 0; r < n; r++ {
				assert.Equal(t, want[r], got[r], "rank %d: reduce-scatter", r)
				assert.Equal(t, wantG[r], gotG[r], "rank %d: all-gather", r)
				assert.Equal(t, int64((n-1)*(2*L+20)), wire[r], "rank %d: bytes on the wire, a 20-byte header per frame", r)
			}
		})
	}
}

func TestTCPWrongTokenRefused(t *testing.T) {
	addr := freeAddr(t)
	var wg sync.WaitGroup
	var host, intruder error
	wg.Add(2)
	go func() {
		defer wg.Done()
		c, err := DialTCP(TCPConfig{Rank: 0, World: 2, MasterAddr: addr, Token: "right", Timeout: time.Second})
		if c != nil {
			c.Close()
		}
		host = err
	}()
	go func() {
		defer wg.Done()
		_, intruder = DialTCP(TCPConfig{Rank: 1, World: 2, MasterAddr: addr, Token: "wrong", Timeout: time.Second})
	}()
	wg.Wait()
	assert.ErrorIs(t, intruder, ErrRefused)
	assert.ErrorContains(t, intruder, "wrong job token")
	var re *RankError
	require.ErrorAs(t, host, &re, "rank 0 times out waiting for a real rank 1")
	assert.Equal(t, []int{1}, re.Missing)
}

// TestTCPLostRankIsNamed: rank 2 of 3 leaves after joining; the others' next
// collective fails quickly with an error naming it.
func TestTCPLostRankIsNamed(t *testing.T) {
	start := time.Now()
	errs := tcpRanks(t, 3, 2*time.Second, func(c *TCP) error {
		if c.Rank() == 2 {
			return c.Close()
		}
		return c.AllReduce(make([]float32, 10))
	})
	assert.Less(t, time.Since(start), 10*time.Second)
	named := false
	for r := 0; r < 2; r++ {
		var re *RankError
		require.ErrorAs(t, errs[r], &re, "rank %d", r)
		for _, m := range re.Missing {
			named = named || m == 2
		}
	}
	assert.True(t, named, "some rank names rank 2 as lost: %v", errs)
}

// TestTCPLargeTransferIsFramed: a gather of 3 MiB per rank crosses several frames.
func TestTCPLargeTransferIsFramed(t *testing.T) {
	const L = 3 << 18 // 3 MiB of float32 per rank: three frames
	errs := tcpRanks(t, 2, 10*time.Second, func(c *TCP) error {
		src := make([]float32, L)
		for i := range src {
			src[i] = float32(c.Rank()*L + i)
		}
		dst := make([]float32, 2*L)
		if err := c.AllGather(dst, src); err != nil {
			return err
		}
		for i, v := range dst {
			if v != float32(i) {
				return fmt.Errorf("element %d is %v", i, v)
			}
		}
		return nil
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
}

// TestTCPGroups: four ranks build two splittings of the world (pairs {0,1},{2,3}
// tagged "ep", and {0,2},{1,3}), in opposite orders on even and odd ranks, then
// run collectives on both at once from two goroutines (as the trainer's expert
// exchanges run beside the FSDP stream). Each group's results are its members'
// alone, exact for gathers and two-term sums.
func TestTCPGroups(t *testing.T) {
	errs := tcpRanks(t, 4, 10*time.Second, func(c *TCP) error {
		r := c.Rank()
		pair := []int{r &^ 1, r | 1}    // {0,1} or {2,3}
		stride := []int{r & 1, r&1 + 2} // {0,2} or {1,3}
		var ep, dp Communicator
		var err error
		if r%2 == 0 {
			if ep, err = c.Group(pair, "ep"); err == nil {
				dp, err = c.Group(stride, "")
			}
		} else {
			if dp, err = c.Group(stride, ""); err == nil {
				ep, err = c.Group(pair, "ep")
			}
		}
		if err != nil {
			return err
		}
		if again, err := c.Group(pair, "ep"); err != nil || again != ep {
			return fmt.Errorf("asking again gave another communicator (%v)", err)
		}
		if w, err := c.Group([]int{0, 1, 2, 3}, ""); err != nil || w != Communicator(c) {
			return fmt.Errorf("the whole world with no tag is not the world communicator (%v)", err)
		}
		if ep.Rank() != r&1 || dp.Rank() != r/2 || ep.Size() != 2 {
			return fmt.Errorf("group ranks %d,%d", ep.Rank(), dp.Rank())
		}
		const L = 1 << 16 // several collectives, long enough to overlap
		errc := make(chan error, 1)
		go func() {
			for i := 0; i < 20; i++ {
				dst := make([]float32, 2*L)
				if err := ep.AllGather(dst, constant(L, float32(r))); err != nil {
					errc <- err
					return
				}
				if dst[0] != float32(pair[0]) || dst[L] != float32(pair[1]) {
					errc <- fmt.Errorf("ep gather %v %v", dst[0], dst[L])
					return
				}
			}
			errc <- nil
		}()
		for i := 0; i < 20; i++ {
			buf := constant(L, float32(r))
			if err := dp.AllReduce(buf); err != nil {
				return err
			}
			if want := float32(stride[0] + stride[1]); buf[0] != want || buf[L-1] != want {
				return fmt.Errorf("dp sum %v, want %v", buf[0], want)
			}
		}
		if err := <-errc; err != nil {
			return err
		}
		return c.Barrier() // the world still works beside its groups
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}

func constant(n int, v float32) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = v
	}
	return x
}

// TestTCPGroupMissingMemberIsNamed: rank 1 never builds group {0,1}; rank 0's
// attempt times out naming it, and a group that leaves this rank out is refused.
func TestTCPGroupMissingMemberIsNamed(t *testing.T) {
	errs := tcpRanks(t, 2, time.Second, func(c *TCP) error {
		if c.Rank() == 1 {
			time.Sleep(1500 * time.Millisecond)
			return nil
		}
		if _, err := c.Group([]int{1}, ""); err == nil || !strings.Contains(err.Error(), "cannot join group [1]") {
			return fmt.Errorf("a group without this rank: %v", err)
		}
		_, err := c.Group([]int{0, 1}, "ep")
		return err
	})
	var re *RankError
	require.ErrorAs(t, errs[0], &re)
	assert.Equal(t, []int{1}, re.Missing)
	assert.ErrorIs(t, errs[0], ErrTimeout)
	assert.NoError(t, errs[1])
}

// dialSilently opens a connection to addr (retrying until it listens) and says
// nothing on it.
func dialSilently(t *testing.T, addr string) net.Conn {
	t.Helper()
	for i := 0; ; i++ {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			t.Cleanup(func() { c.Close() })
			return c
		}
		require.Less(t, i, 200, "rendezvous never listened: %v", err)
		time.Sleep(10 * time.Millisecond)
	}
}

// Connections that reach the rendezvous first and say nothing delay no one: the
// real ranks join at once. (Hellos were read one at a time, each up to the whole
// timeout: two silent connections made this job fail.)
func TestTCPSilentPeersDelayNoOne(t *testing.T) {
	addr := freeAddr(t)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	join := func(r int) {
		defer wg.Done()
		c, err := DialTCP(TCPConfig{Rank: r, World: 3, MasterAddr: addr, Token: "job", Timeout: 4 * time.Second})
		if err == nil {
			err = c.AllReduce(make([]float32, 4))
			c.Close()
		}
		errs[r] = err
	}
	wg.Add(1)
	go join(0)
	dialSilently(t, addr)
	dialSilently(t, addr)
	wg.Add(2)
	go join(1)
	go join(2)
	wg.Wait()
	for r, err := range errs {
		assert.NoError(t, err, "rank %d", r)
	}
}

// A rendezvous that times out says what it saw: the ranks missing and the
// connections it turned away.
func TestTCPRendezvousTimeoutSaysWhatHappened(t *testing.T) {
	addr := freeAddr(t)
	done := make(chan error, 1)
	go func() {
		_, err := DialTCP(TCPConfig{Rank: 0, World: 2, MasterAddr: addr, Token: "job", Timeout: 2 * time.Second})
		done <- err
	}()
	dialSilently(t, addr)
	err := <-done
	var re *RankError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, []int{1}, re.Missing)
	assert.ErrorIs(t, err, ErrTimeout)
	assert.ErrorContains(t, err, "1 connection(s) turned away")
	assert.ErrorContains(t, err, "sent no valid hello")
}

// The timeout bounds a whole collective: a peer that sends each frame well within
// the timeout, but the collective's frames together past it, fails the collective
// naming that peer. (The deadline used to restart with every frame.)
func TestTCPTimeoutBoundsWholeCollective(t *testing.T) {
	addr := freeAddr(t)
	const L = 3 << 18 // 3 MiB of float32: three frames
	cs := make([]*TCP, 2)
	errs := concurrently(2, func(r int) error {
		c, err := DialTCP(TCPConfig{Rank: r, World: 2, MasterAddr: addr, Token: "job", Timeout: time.Second})
		cs[r] = c
		return err
	})
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	defer cs[0].Close()
	defer cs[1].Close()
	slow := cs[1]
	go func() {
		p := slow.peers[0]
		slow.deadline = time.Now().Add(time.Minute)
		go slow.recvFrames(p, 0, make([]byte, 4*L)) // take rank 0's frames
		payload := make([]byte, 4*L)
		for off := 0; off < len(payload); off += maxFrame {
			time.Sleep(600 * time.Millisecond)
			if slow.send(p, 0, payload[off:off+maxFrame]) != nil {
				return
			}
		}
	}()
	err := cs[0].AllGather(make([]float32, 2*L), make([]float32, L))
	var re *RankError
	require.ErrorAs(t, err, &re)
	assert.ErrorIs(t, err, ErrTimeout)
	assert.Equal(t, []int{1}, re.Missing)
	// The job is broken: every later collective of this process, on any group,
	// fails at once with the same error instead of waiting out a timeout of its own.
	g, gerr := cs[0].Group([]int{0, 1}, "other")
	if gerr == nil {
		assert.Same(t, re, errorOf(g.AllReduce(make([]float32, 4))))
	}
	assert.Same(t, re, errorOf(cs[0].AllReduce(make([]float32, 4))))
}

// errorOf is err's *RankError, or nil.
func errorOf(err error) *RankError {
	var re *RankError
	errors.As(err, &re)
	return re
}

// TestRendezvousOnInheritedListener: rank 0 hosts on the socket it is given (the
// port stays bound throughout, so binding it again would fail with "address already
// in use"), and closes it when the rendezvous is done.
func TestRendezvousOnInheritedListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	errs := tcpRanksOn(ln, 3, 10*time.Second, func(c *TCP) error {
		return c.AllReduce([]float32{float32(c.Rank())})
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
	_, err = ln.Accept()
	require.Error(t, err, "the rendezvous closed the listener it was given")
}

// TestTCPSendRecvRing: the ring shift of TestSendRecvRing over loopback, at 1 to 4
// processes' worth of ranks; a length the sender does not send is an error.
func TestTCPSendRecvRing(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4} {
		for r, err := range tcpRanks(t, n, 10*time.Second, func(c *TCP) error { return ringShift(c) }) {
			require.NoError(t, err, "n=%d rank %d", n, r)
		}
	}
	errs := tcpRanks(t, 2, 5*time.Second, func(c *TCP) error {
		return c.SendRecv(make([]float32, 2), make([]float32, 2+c.Rank()), 1-c.Rank(), 1-c.Rank())
	})
	assert.Error(t, errs[0])
	assert.ErrorIs(t, errs[0], ErrMismatch)
}

// TestTCPCollectivesAllocateNothing: over loopback, rounds of every collective
// (ring all-gather, reduce-scatter and all-reduce; all-to-all; send/recv; the
// bf16 reduce-scatter and all-gather; a barrier) allocate nothing once their
// buffers exist: each peer's sender goroutine is started once and reused. Three
// ranks, each a goroutine stepping on a signal.
func TestTCPCollectivesAllocateNothing(t *testing.T) {
	const n, L = 3, 64
	start, done := make([]chan struct{}, n), make(chan error, n)
	for r := range start {
		start[r] = make(chan struct{})
	}
	finished := make(chan []error, 1)
	go func() {
		finished <- tcpRanks(t, n, 30*time.Second, func(c *TCP) error {
			r := c.Rank()
			gathered, full, part := make([]float32, n*L), constant(n*L, 1), make([]float32, L)
			h, hg := make([]uint16, n*L), make([]uint16, n*L)
			send, recv := []int{L, L, L}, []int{L, L, L}
			a2a := make([]float32, n*L)
			for range start[r] {
				err := c.AllGather(gathered, full[:L])
				if err == nil {
					err = c.ReduceScatter(part, full)
				}
				if err == nil {
					err = c.AllReduce(full)
				}
				if err == nil {
					err = c.AllToAll(a2a, full, send, recv)
				}
				if err == nil {
					err = c.SendRecv(part, full[:L], (r+1)%n, (r+n-1)%n)
				}
				if err == nil {
					err = c.ReduceScatterBF16(h[:L], hg)
				}
				if err == nil {
					err = c.AllGatherBF16(hg, h[:L])
				}
				if err == nil {
					err = c.Barrier()
				}
				clear(full)
				done <- err
			}
			return nil
		})
	}()
	step := func() {
		for _, c := range start {
			c <- struct{}{}
		}
		for range n {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
	}
	allocs.AssertSteady(t, step)
	for _, c := range start {
		close(c)
	}
	for _, err := range <-finished {
		require.NoError(t, err)
	}
}

// TestBroadcastBytes: an opaque 128-byte blob (an NCCL unique id's size, every
// byte value and NaN bit patterns among them) reaches every rank exactly, in
// process and over TCP; an odd length pads and trims; ranks that disagree on
// the length all fail with a mismatch instead of reading a blob cut short.
func TestBroadcastBytes(t *testing.T) {
	blob := make([]byte, 128)
	for i := range blob {
		blob[i] = byte(255 - 2*i)
	}
	copy(blob[8:], []byte{0xff, 0xff, 0xff, 0xff, 0x01, 0x00, 0xc0, 0x7f}) // a quiet and a signalling NaN
	check := func(c Communicator, root, n int) error {
		buf := make([]byte, n)
		if c.Rank() == root {
			copy(buf, blob)
		}
		if err := BroadcastBytes(c, buf, root); err != nil {
			return err
		}
		if string(buf) != string(blob[:n]) {
			return fmt.Errorf("rank %d got %x", c.Rank(), buf)
		}
		return nil
	}
	for _, n := range []int{128, 37} {
		for _, err := range onRanks(3, 5*time.Second, func(c Communicator) error { return check(c, 1, n) }) {
			assert.NoError(t, err, "in process, %d bytes", n)
		}
		for _, err := range tcpRanks(t, 3, 5*time.Second, func(c *TCP) error { return check(c, 0, n) }) {
			assert.NoError(t, err, "tcp, %d bytes", n)
		}
	}
	errs := onRanks(2, 5*time.Second, func(c Communicator) error {
		return BroadcastBytes(c, make([]byte, 16+c.Rank()), 0)
	})
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		assert.ErrorIs(t, err, ErrMismatch)
	}
	assert.Contains(t, errs[0].Error(), "rank 1 passes 17 bytes, rank 0 16")
	assert.Contains(t, errs[1].Error(), "rank 0 passes 16 bytes, rank 1 17")
}
