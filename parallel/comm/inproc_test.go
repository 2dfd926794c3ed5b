package comm

import (
	"errors"
	"fmt"
	"math"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// onRanks runs f on every rank of a fresh world of n and returns the errors.
func onRanks(n int, timeout time.Duration, f func(c Communicator) error) []error {
	w := NewWorld(n, timeout)
	return concurrently(n, func(r int) error { return f(w.Rank(r)) })
}

// concurrently runs f(r) for r in [0, n) each on its own goroutine and
// returns the errors indexed by r.
func concurrently(n int, f func(r int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = f(r)
		}()
	}
	wg.Wait()
	return errs
}

func values(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

// TestCollectivesMatchSerial: every collective at 1, 2, 3, 4 and 8 ranks equals a
// serial computation exactly (the serial sums run in the same rank order), and all
// ranks agree bit for bit.
func TestCollectivesMatchSerial(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 8} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			const L = 37
			rng := rand.New(rand.NewSource(int64(n)))
			in := make([][]float32, n)
			for r := range in {
				in[r] = values(rng, n*L)
			}
			sum := make([]float32, n*L) // rank-order sum, as the collectives take it
			copy(sum, in[0])
			for _, x := range in[1:] {
				for j, v := range x {
					sum[j] += v
				}
			}
			gathered, scattered, reduced := make([][]float32, n), make([][]float32, n), make([][]float32, n)
			bcast := make([][]float32, n)
			errs := onRanks(n, 5*time.Second, func(c Communicator) error {
				r := c.Rank()
				gathered[r] = make([]float32, n*L)
				if err := c.AllGather(gathered[r], in[r][:L]); err != nil {
					return err
				}
				scattered[r] = make([]float32, L)
				if err := c.ReduceScatter(scattered[r], in[r]); err != nil {
					return err
				}
				reduced[r] = append([]float32(nil), in[r]...)
				if err := c.AllReduce(reduced[r]); err != nil {
					return err
				}
				bcast[r] = append([]float32(nil), in[r][:L]...)
				return c.Broadcast(bcast[r], n-1)
			})
			for _, err := range errs {
				require.NoError(t, err)
			}
			for r := 0; r < n; r++ {
				for i := 0; i < n; i++ {
					assert.Equal(t, in[i][:L], gathered[r][i*L:(i+1)*L])
				}
				assert.Equal(t, sum[r*L:(r+1)*L], scattered[r])
				assert.Equal(t, sum, reduced[r])
				assert.Equal(t, in[n-1][:L], bcast[r])
			}
		})
	}
}

// TestAllToAllUneven: rank i sends (i + j) % 3 values to rank j.
func TestAllToAllUneven(t *testing.T) {
	n := 4
	counts := func(i, j int) int { return (i + j) % 3 }
	got := make([][]float32, n)
	errs := onRanks(n, 5*time.Second, func(c Communicator) error {
		r := c.Rank()
		send, recv := make([]int, n), make([]int, n)
		var src []float32
		for j := 0; j < n; j++ {
			send[j], recv[j] = counts(r, j), counts(j, r)
			for k := 0; k < send[j]; k++ {
				src = append(src, float32(100*r+10*j+k))
			}
		}
		got[r] = make([]float32, sum(recv))
		return c.AllToAll(got[r], src, send, recv)
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
	for r := 0; r < n; r++ {
		var want []float32
		for i := 0; i < n; i++ {
			for k := 0; k < counts(i, r); k++ {
				want = append(want, float32(100*i+10*r+k))
			}
		}
		assert.Equal(t, want, got[r], "rank %d", r)
	}
}

// TestTimeoutNamesMissingRank: rank 2 never calls; the others fail within the
// timeout with an error naming it.
func TestTimeoutNamesMissingRank(t *testing.T) {
	start := time.Now()
	errs := onRanks(4, 100*time.Millisecond, func(c Communicator) error {
		if c.Rank() == 2 {
			return nil
		}
		return c.AllReduce(make([]float32, 8))
	})
	assert.Less(t, time.Since(start), 2*time.Second)
	for r, err := range errs {
		if r == 2 {
			continue
		}
		var re *RankError
		require.ErrorAs(t, err, &re)
		assert.Equal(t, []int{2}, re.Missing)
		assert.ErrorIs(t, err, ErrTimeout)
		assert.Contains(t, err.Error(), "rank(s) [2] did not arrive")
	}
}

func TestMismatchIsAnError(t *testing.T) {
	errs := onRanks(3, time.Second, func(c Communicator) error {
		return c.AllGather(make([]float32, 3*(c.Rank()+1)), make([]float32, c.Rank()+1))
	})
	for _, err := range errs {
		assert.ErrorIs(t, err, ErrMismatch)
	}
	errs = onRanks(2, time.Second, func(c Communicator) error {
		if c.Rank() == 0 {
			return c.Barrier()
		}
		return c.AllReduce(make([]float32, 2))
	})
	for _, err := range errs {
		assert.ErrorIs(t, err, ErrMismatch)
	}
}

// TestGroups: two data-parallel groups {0,2} and {1,3} reduce independently.
func TestGroups(t *testing.T) {
	w := NewWorld(4, time.Second)
	out := make([][]float32, 4)
	var wg sync.WaitGroup
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := w.Group(r, []int{r % 2, r%2 + 2})
			require.NoError(t, err)
			out[r] = []float32{float32(r)}
			require.NoError(t, c.AllReduce(out[r]))
		}()
	}
	wg.Wait()
	assert.Equal(t, [][]float32{{2}, {4}, {2}, {4}}, out)
	_, err := w.Group(1, []int{0, 2})
	assert.Error(t, err)
}

// TestBF16ReduceAccumulatesInFP32: rank 0 holds 1 and ranks 1..7 hold 1/256 each.
// Summed in bf16 each 1 + 1/256 is a tie that rounds back to 1, so the total would
// stay 1; summed in fp32 it is 1 + 7/256, which rounds once to the nearest bf16:
// 1 + 4/128 = 1.03125 (3.5/128 is a tie, to even).
func TestBF16ReduceAccumulatesInFP32(t *testing.T) {
	n := 8
	out := make([][]uint16, n)
	errs := onRanks(n, time.Second, func(c Communicator) error {
		v := float32(1.0 / 256)
		if c.Rank() == 0 {
			v = 1
		}
		src := make([]uint16, n)
		for i := range src {
			src[i] = f32ToBF16(v)
		}
		out[c.Rank()] = make([]uint16, 1)
		return c.ReduceScatterBF16(out[c.Rank()], src)
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
	for r := range out {
		assert.Equal(t, float32(1.03125), bf16ToF32(out[r][0]), "rank %d", r)
	}
	assert.Equal(t, float32(1), bf16ToF32(f32ToBF16(1+1.0/512)), "a single small term is lost in bf16")
	assert.True(t, math.IsNaN(float64(bf16ToF32(f32ToBF16(float32(math.NaN()))))))
}

// TestStreamKeepsOrder: operations queued on a stream run in order on every rank,
// so overlapped collectives cannot cross; a handle runs again once waited on.
func TestStreamKeepsOrder(t *testing.T) {
	errs := onRanks(3, time.Second, func(c Communicator) error {
		s := NewStream(c)
		defer s.Close()
		a, b := allReduceOp{1}, allReduceOp{10}
		h1, h2 := NewHandle(a), NewHandle(b)
		s.Start(h1)
		s.Start(h2)
		if err := errors.Join(h2.Wait(), h1.Wait()); err != nil {
			return err
		}
		if a[0] != 3 || b[0] != 30 {
			return fmt.Errorf("got %v %v", a, b)
		}
		s.Start(h1)
		if err := h1.Wait(); err != nil {
			return err
		}
		if a[0] != 9 {
			return fmt.Errorf("the handle's second run: got %v, want 9", a[0])
		}
		return nil
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
}

// allReduceOp all-reduces its values in place.
type allReduceOp []float32

func (o allReduceOp) Run(c Communicator) error { return c.AllReduce(o) }

func TestAbortEndsWaiting(t *testing.T) {
	w := NewWorld(2, time.Minute)
	done := make(chan error)
	go func() { done <- w.Rank(0).Barrier() }()
	time.Sleep(10 * time.Millisecond)
	w.Abort(errors.New("rank 1 exited"))
	select {
	case err := <-done:
		assert.ErrorContains(t, err, "rank 1 exited")
	case <-time.After(5 * time.Second):
		t.Fatal("abort did not end the wait")
	}
}

// TestAllGatherInPlace: each rank's source is its own chunk of the destination, as
// when the distributed optimizer gathers updated shards; run with -race.
func TestAllGatherInPlace(t *testing.T) {
	n, L := 4, 16
	bufs := make([][]float32, n)
	errs := onRanks(n, time.Second, func(c Communicator) error {
		r := c.Rank()
		bufs[r] = make([]float32, n*L)
		for j := 0; j < L; j++ {
			bufs[r][r*L+j] = float32(r*100 + j)
		}
		return c.AllGather(bufs[r], bufs[r][r*L:(r+1)*L])
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
	for r := range bufs {
		for i := 0; i < n; i++ {
			assert.Equal(t, float32(i*100+3), bufs[r][i*L+3])
		}
	}
}

// TestReduceScatterInPlace: a reduce-scatter whose destination is each
// rank's own chunk of its source (the distributed optimizer's gradient shard
// inside its full gradients) leaves the same bits as one into a separate
// buffer, in process and over TCP, at chunk lengths below, at and across the
// in-process sum's block; run with -race.
func TestReduceScatterInPlace(t *testing.T) {
	for _, L := range []int{5, 256, 700} {
		for _, n := range []int{2, 3, 4} {
			for _, how := range []string{"inproc", "tcp"} {
				t.Run(fmt.Sprintf("%s/n=%d/L=%d", how, n, L), func(t *testing.T) {
					in := make([][]float32, n)
					rng := rand.New(rand.NewSource(int64(n*1000 + L)))
					for r := range in {
						in[r] = values(rng, n*L)
					}
					apart, inPlace := make([][]float32, n), make([][]float32, n)
					run := func(c Communicator) error {
						r := c.Rank()
						apart[r] = make([]float32, L)
						if err := c.ReduceScatter(apart[r], in[r]); err != nil {
							return err
						}
						inPlace[r] = append([]float32(nil), in[r]...)
						return c.ReduceScatter(inPlace[r][r*L:(r+1)*L], inPlace[r])
					}
					var errs []error
					if how == "inproc" {
						errs = onRanks(n, 5*time.Second, run)
					} else {
						errs = tcpRanks(t, n, 5*time.Second, func(c *TCP) error { return run(c) })
					}
					for _, err := range errs {
						require.NoError(t, err)
					}
					for r := range apart {
						for j, v := range apart[r] {
							if got := inPlace[r][r*L+j]; math.Float32bits(got) != math.Float32bits(v) {
								t.Fatalf("rank %d element %d: in place %v, apart %v", r, j, got, v)
							}
						}
					}
				})
			}
		}
	}
}

// TestAllGatherBF16InPlace: the bf16 all-gather with each rank's source its own
// chunk of the destination (a bf16 run's shard inside its full weights), in
// process and over TCP; run with -race.
func TestAllGatherBF16InPlace(t *testing.T) {
	n, L := 3, 16
	check := func(bufs [][]uint16) {
		for r := range bufs {
			for i := 0; i < n; i++ {
				assert.Equal(t, uint16(i*100+3), bufs[r][i*L+3], "rank %d, chunk %d", r, i)
			}
		}
	}
	fill := func(bufs [][]uint16, r int) []uint16 {
		bufs[r] = make([]uint16, n*L)
		for j := 0; j < L; j++ {
			bufs[r][r*L+j] = uint16(r*100 + j)
		}
		return bufs[r][r*L : (r+1)*L]
	}
	bufs := make([][]uint16, n)
	for _, err := range onRanks(n, time.Second, func(c Communicator) error {
		return c.AllGatherBF16(bufs[c.Rank()], fill(bufs, c.Rank()))
	}) {
		require.NoError(t, err)
	}
	check(bufs)
	tb := make([][]uint16, n)
	for _, err := range tcpRanks(t, n, 10*time.Second, func(c *TCP) error {
		return c.AllGatherBF16(tb[c.Rank()], fill(tb, c.Rank()))
	}) {
		require.NoError(t, err)
	}
	check(tb)
}

// ringShift passes every member's block one step around the ring, twice (so a
// second step follows the first in order), and checks each member ends with the
// block of the member two behind it.
func ringShift(c Communicator) error {
	n, r := c.Size(), c.Rank()
	block := func(owner int) []float32 {
		b := make([]float32, 5+owner%2) // lengths differ by owner: a mismatch would show
		for i := range b {
			b[i] = float32(100*owner + i)
		}
		return b
	}
	cur := block(r)
	for s := 1; s <= 2; s++ {
		from := (r - s + 2*n) % n
		next := make([]float32, len(block(from)))
		if err := c.SendRecv(next, cur, (r+1)%n, (r-1+n)%n); err != nil {
			return err
		}
		if want := block(from); fmt.Sprint(next) != fmt.Sprint(want) {
			return fmt.Errorf("rank %d step %d: got %v, want %v", r, s, next, want)
		}
		cur = next
	}
	return nil
}

// TestSendRecvRing: a ring shift at 1 to 4 members delivers each block to the
// next member; a member that receives from the wrong peer, or a length the
// sender does not send, is refused on every member.
func TestSendRecvRing(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4} {
		for r, err := range onRanks(n, 5*time.Second, ringShift) {
			require.NoError(t, err, "n=%d rank %d", n, r)
		}
	}
	errs := onRanks(3, time.Second, func(c Communicator) error {
		return c.SendRecv(make([]float32, 2), make([]float32, 2), (c.Rank()+1)%3, (c.Rank()+1)%3)
	})
	for _, err := range errs {
		assert.ErrorIs(t, err, ErrMismatch)
	}
	errs = onRanks(2, time.Second, func(c Communicator) error {
		return c.SendRecv(make([]float32, 2), make([]float32, 2+c.Rank()), 1-c.Rank(), 1-c.Rank())
	})
	for _, err := range errs {
		assert.ErrorIs(t, err, ErrMismatch)
	}
}

// TestCountedBytes: a counted member adds up what the ring algorithms send: an
// all-gather of 8 elements over 4 members sends 6, an all-reduce 12, a send/recv
// its whole buffer, an all-to-all what goes to the others.
func TestCountedBytes(t *testing.T) {
	sent := make([]int64, 4)
	errs := onRanks(4, 5*time.Second, func(raw Communicator) error {
		c := NewCounted(raw)
		r := c.Rank()
		if err := c.AllGather(make([]float32, 8), make([]float32, 2)); err != nil {
			return err
		}
		if err := c.AllReduce(make([]float32, 8)); err != nil {
			return err
		}
		if err := c.SendRecv(make([]float32, 3), make([]float32, 3), (r+1)%4, (r+3)%4); err != nil {
			return err
		}
		counts := []int{1, 1, 1, 1}
		if err := c.AllToAll(make([]float32, 4), make([]float32, 4), counts, counts); err != nil {
			return err
		}
		sent[r] = c.Sent()
		return nil
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
	for r := range sent {
		assert.Equal(t, int64(4*(6+12+3+3)), sent[r], "rank %d", r)
	}
}
