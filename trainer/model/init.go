package model

import (
	"hash/fnv"
	"math"
	"strings"

	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor"
)

// splitmix64 is a bijective 64-bit mixer (Steele, Lea, Flood 2014): consecutive
// inputs give statistically independent outputs, which makes it a counter-based
// generator.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// paramKey derives a parameter's stream from the run seed and its name.
func paramKey(seed int64, name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return splitmix64(uint64(seed) ^ splitmix64(h.Sum64()))
}

// normal returns the index-th standard normal of a stream (Box–Muller on two
// 53-bit uniforms drawn at counters 2·index and 2·index+1).
func normal(key uint64, index int64) float64 {
	u1 := (float64(splitmix64(key+2*uint64(index))>>11) + 1) / (1 << 53) // (0, 1]
	u2 := float64(splitmix64(key+2*uint64(index)+1)>>11) / (1 << 53)     // [0, 1)
	return math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2)
}

// InitStd is the standard deviation a parameter is drawn with: 0 for norm gains
// (which start at 1), std for matrices, std/sqrt(2·layers) for the projections that
// write into the residual stream (attention output, MLP down projection), as in
// GPT-2, so the residual's variance does not grow with depth.
func InitStd(p *parallel.Param, std float64, layers int) float64 {
	switch {
	case len(p.Shape) == 1:
		return 0
	case strings.HasSuffix(p.Name, ".wo") || strings.HasSuffix(p.Name, ".w2"):
		return std / math.Sqrt(2*float64(layers))
	default:
		return std
	}
}

// InitParam fills dst with elements [start, start+len(dst)) of parameter p, in the
// row-major order of its local shape, for a table without tensor parallelism (or
// tensor-parallel rank 0). Elements are a pure function of (seed, name, index), so
// shards initialise independently. Values are rounded to F (and to bf16 by the
// caller when it computes in bf16).
func InitParam[F tensor.Float](dst []F, p *parallel.Param, start int64, seed int64, std float64, layers int) {
	InitParamTP(dst, p, start, 0, seed, std, layers)
}

// InitParamTP is InitParam for the slice tensor-parallel rank tpRank holds: each
// element takes the value of its place in the whole parameter
// (parallel.Param.GlobalIndex), so a tensor-parallel run starts from the weights
// one rank starts from.
func InitParamTP[F tensor.Float](dst []F, p *parallel.Param, start int64, tpRank int, seed int64, std float64, layers int) {
	s := InitStd(p, std, layers)
	if p.Balance {
		for i := range dst {
			dst[i] = 0 // an expert bias starts at zero
		}
		return
	}
	if s == 0 {
		for i := range dst {
			dst[i] = 1
		}
		return
	}
	key := paramKey(seed, p.Name)
	for i := range dst {
		dst[i] = F(s * normal(key, p.GlobalIndex(start+int64(i), tpRank)))
	}
}
