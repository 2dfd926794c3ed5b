// Package memtest is the behaviour every tensor.Memory must have, as tests a
// backend runs on its own memory: the CPU's in the ordinary suite, the GPU's in
// the device tests. The engine's code is written against tensor.Memory, so a
// backend that passes here holds, converts, rounds, counts and refuses as the
// CPU memory the engine was proven on.
package memtest
