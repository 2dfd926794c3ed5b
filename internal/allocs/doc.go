// Package allocs holds the tests' check that a training step allocates nothing
// in its steady state (AssertSteady). It is a leaf: it imports no shardline
// package, and only tests import it.
package allocs
