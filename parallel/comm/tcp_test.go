package comm

import (
	"errors"
	"fmt"
	"math"
	"math/rand"
	"net"
	"sync"
	"testing"
	"time"

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

// tcpRanks joins n ranks over loopback and runs f on each.
func tcpRanks(t *testing.T, n int, timeout time.Duration, f func(c *TCP) error) []error {
	t.Helper()
	addr := freeAddr(t)
	return concurrently(n, func(r int) error {
		c, err := DialTCP(TCPConfig{Rank: r, World: n, MasterAddr: addr, Token: "job-1", Timeout: timeout})
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
