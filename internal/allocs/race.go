//go:build race

package allocs

// raceEnabled: the race detector allocates on its own, so AssertSteady skips.
const raceEnabled = true
