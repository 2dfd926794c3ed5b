package comm

import (
	"fmt"
	"net"
	"sync"
	"testing"
	"time"
)

// BenchmarkBusBandwidth measures all-gather and reduce-scatter in process, as
// nccl-tests does: S is the full buffer (all-gather output, reduce-scatter input),
// and bus bandwidth = S/t · (n−1)/n. memcpy of S bytes in the same run is the
// reference: ranks share memory, so a collective is copies (and adds).
func BenchmarkBusBandwidth(b *testing.B) {
	for _, mb := range []int{1, 16, 256} {
		S := mb << 20 / 4 // float32 elements
		b.Run(fmt.Sprintf("memcpy/%dMB", mb), func(b *testing.B) {
			src, dst := make([]float32, S), make([]float32, S)
			b.SetBytes(int64(S * 4))
			for i := 0; i < b.N; i++ {
				copy(dst, src)
			}
		})
		for _, n := range []int{2, 4} {
			for _, op := range []string{"all_gather", "reduce_scatter"} {
				b.Run(fmt.Sprintf("tcp_%s/%dranks/%dMB", op, n, mb), func(b *testing.B) {
					L := S / n
					addr := freeAddrB(b)
					var wg sync.WaitGroup
					var elapsed time.Duration
					for r := 0; r < n; r++ {
						wg.Add(1)
						go func() {
							defer wg.Done()
							c, err := DialTCP(TCPConfig{Rank: r, World: n, MasterAddr: addr, Token: "bench", Timeout: time.Minute})
							if err != nil {
								b.Error(err)
								return
							}
							defer c.Close()
							big, small := make([]float32, S), make([]float32, L)
							start := time.Now()
							for i := 0; i < b.N; i++ {
								if op == "all_gather" {
									_ = c.AllGather(big, small)
								} else {
									_ = c.ReduceScatter(small, big)
								}
							}
							if r == 0 {
								elapsed = time.Since(start)
							}
						}()
					}
					wg.Wait()
					sec := elapsed.Seconds() / float64(b.N)
					b.ReportMetric(float64(S*4)/sec*float64(n-1)/float64(n)/1e9, "busGB/s")
				})
			}
		}
		for _, n := range []int{2, 4, 8} {
			for _, op := range []string{"all_gather", "reduce_scatter"} {
				b.Run(fmt.Sprintf("%s/%dranks/%dMB", op, n, mb), func(b *testing.B) {
					w := NewWorld(n, time.Minute)
					L := S / n
					bufs := make([][2][]float32, n)
					for r := range bufs {
						bufs[r] = [2][]float32{make([]float32, S), make([]float32, L)}
					}
					b.ResetTimer()
					var wg sync.WaitGroup
					for r := 0; r < n; r++ {
						wg.Add(1)
						go func() {
							defer wg.Done()
							c := w.Rank(r)
							for i := 0; i < b.N; i++ {
								if op == "all_gather" {
									_ = c.AllGather(bufs[r][0], bufs[r][1])
								} else {
									_ = c.ReduceScatter(bufs[r][1], bufs[r][0])
								}
							}
						}()
					}
					wg.Wait()
					sec := b.Elapsed().Seconds() / float64(b.N)
					b.ReportMetric(float64(S*4)/sec*float64(n-1)/float64(n)/1e9, "busGB/s")
				})
			}
		}
	}
}

func freeAddrB(b *testing.B) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
