//go:build !race

package allocs

const raceEnabled = false
