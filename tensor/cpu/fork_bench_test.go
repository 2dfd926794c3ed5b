package cpu

import "testing"

type nopJob struct{ sink [64]int }

func (j *nopJob) rows(c, lo, hi int) { j.sink[c*8] += hi - lo }

// BenchmarkFork is the cost of one parallel region whose chunks do nothing: what
// every parallel kernel pays on top of its work.
func BenchmarkFork(b *testing.B) {
	j := &nopJob{}
	for i := 0; i < b.N; i++ {
		run(j, 2, 1)
	}
}
