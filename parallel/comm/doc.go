// Package comm is shardline's collective communication: the Communicator interface
// (all-gather, reduce-scatter, all-reduce, all-to-all with uneven splits,
// broadcast, barrier, and send/recv ring steps) over float32 buffers and bf16
// buffers (reduced in fp32), and its implementations. Counted wraps any of them
// and adds up the bytes a member sends.
//
// # In-process
//
// NewWorld(n) makes n communicators whose ranks are goroutines sharing memory: each
// collective publishes every rank's buffer, waits until all ranks have arrived, and
// each rank reads the others' buffers directly. Sums are taken in rank order 0..n-1,
// so results are bit-identical from run to run and equal on every rank. Every
// operation has a timeout; a rank that does not arrive is named in the error.
// Group(ranks) makes a communicator over a subset (a tp, dp or edp group).
//
// # TCP
//
// DialTCP joins ranks in separate processes (or machines): rank 0 hosts a
// rendezvous that refuses peers without the job token, every pair of ranks
// connects (every connection opens with a fixed-size preamble proving the
// token, read under a short deadline, at most maxHandshakes at a time per
// listener, before anything sized by the other side is read), and collectives run as rings (all-gather, reduce-scatter; all-reduce
// is both) or pairwise exchanges (all-to-all, send/recv, and the bf16 collectives,
// which carry 2 bytes a value and sum a bf16 reduce-scatter's chunks in rank order
// like the in-process one), with a fixed order, so results repeat bit for bit. Frames carry a sequence number and a length checked before
// anything is allocated; every operation has a deadline, and a lost peer is named
// in the error. Group(ranks, tag) builds a communicator over a subset: a mesh of
// connections of its own (peers' connections are filed by group as they arrive,
// so members may build their groups in any order), independent of the world's and
// of other groups', so two goroutines can run collectives on two groups at once.
//
// BroadcastBytes carries an opaque blob (an NCCL unique id) over any of them.
// Agree proves that every member holds the same facts (a job's resolved recipe
// and data fingerprint) or fails every member alike, naming each fact that
// differs and which ranks hold which value.
//
// It imports nothing from shardline.
package comm
