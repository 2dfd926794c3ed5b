package parallel

import (
	"runtime"
	"testing"
)

// BenchmarkCompile600B compiles a ~700B-parameter MoE (61 layers, 256 experts) for
// 2048 ranks. Budget: well under 200 ms and 200 MB. live-MB is the heap a compiled
// plan keeps; B/op is everything allocated while compiling.
func BenchmarkCompile600B(b *testing.B) {
	res := load(b, "testdata/moe-700b.toml")
	topo, err := TopologyOf(res.Recipe.Parallel, nil)
	if err != nil {
		b.Fatal(err)
	}
	var p *Plan
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if p, err = Compile(&res.Recipe, topo); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	runtime.GC()
	var before, after runtime.MemStats
	p = nil
	runtime.GC()
	runtime.ReadMemStats(&before)
	p, _ = Compile(&res.Recipe, topo)
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/1e6, "live-MB")
	runtime.KeepAlive(p)
}

// BenchmarkSweep8 compiles the same model at 8 expert-parallel degrees, as
// `shardline plan --sweep parallel.expert_parallel=1,...,128` does. Budget: 2 s.
func BenchmarkSweep8(b *testing.B) {
	res := load(b, "testdata/moe-700b.toml")
	topo, err := TopologyOf(res.Recipe.Parallel, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		for _, ep := range []int{1, 2, 4, 8, 16, 32, 64, 128} {
			r := res.Recipe
			r.Parallel.ExpertParallel = ep
			if _, err := Compile(&r, topo); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkCompileDeep compiles the deepest model a recipe may ask for (4096
// layers, the schema's bound) with a unit per layer: the layout is linear in the
// parameters (it once looped over every parameter for every unit: 15 s for 10,000
// layers).
func BenchmarkCompileDeep(b *testing.B) {
	res := load(b, "../recipes/tiny.toml", "model.layers=4096")
	topo, err := TopologyOf(res.Recipe.Parallel, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := Compile(&res.Recipe, topo); err != nil {
			b.Fatal(err)
		}
	}
}
