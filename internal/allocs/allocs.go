package allocs

import (
	"runtime"
	"runtime/debug"
	"testing"
)

// AssertSteady runs step twice (which sizes every buffer, the second time for
// buffers sized by another shape's first pass) and then counts heap allocations in
// the whole process over rounds of steps, with the garbage collector off so that
// it cannot allocate in the count: some round must allocate nothing.
//
// The runtime itself may allocate beside the step for a while (a new OS thread,
// when a goroutine yields and no idle thread is left to run another; a
// goroutine's wait record, a sudog, when one blocks in a collective and its
// processor's cache of them is empty). Wait records are taken from the cache of
// the processor a goroutine blocks on and returned to the one it wakes on, so
// between ranks that block and wake on different processors the caches refill
// by a random walk, over tens of steps; every garbage collection empties them.
// So the collector is off from before the warm-up, and the check passes when one
// of up to 50 rounds allocates nothing: a runtime refill stops, while anything a
// step allocates on every call fails every round. Under the race detector, which
// allocates on its own, it skips.
func AssertSteady(t testing.TB, step func()) {
	t.Helper()
	if raceEnabled {
		t.Skip("the race detector allocates on its own; this check runs in the plain suite")
	}
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	step()
	step()
	const rounds, steps = 50, 3
	var counts []uint64
	for range rounds {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range steps {
			step()
		}
		runtime.ReadMemStats(&after)
		n := after.Mallocs - before.Mallocs
		if n == 0 {
			return
		}
		counts = append(counts, n)
	}
	t.Fatalf("every round of %d steps allocated: %v objects; want a round with 0", steps, counts)
}
