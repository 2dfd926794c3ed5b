package data

// splitmix64 mixes a counter into a uniform 64-bit value.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// Batch fills tokens and targets (B·T each) with sequences first..first+B−1 of a
// step's global batch: sequence i starts at a position drawn from (seed, step, i),
// and targets are the tokens shifted by one. It is a pure function of its
// arguments, and keyed by the global sequence index, so any split of the global
// batch over ranks and micro-batches sees the same sequences. It reads only
// the tokens it copies (a memory-mapped split is touched a page at a time).
func Batch(tokens, targets []int32, split *Tokens, seed int64, step, first, B, T int) {
	n := split.Len() - T - 1
	for b := 0; b < B; b++ {
		h := splitmix64(uint64(seed))
		for _, v := range []int{step, first + b} {
			h = splitmix64(h ^ uint64(v))
		}
		start := 0
		if n > 0 {
			start = int(h % uint64(n+1))
		}
		split.Copy(tokens[b*T:(b+1)*T], start)
		split.Copy(targets[b*T:(b+1)*T], start+1)
	}
}
