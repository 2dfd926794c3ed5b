// Package ckpt is shardline's sharded checkpoint format: what a checkpoint
// directory holds, how it is committed, read back in any sharding, verified,
// listed (Newest: the newest that checks out, for --resume auto) and pruned.
// It knows nothing of plans or models: the trainer decides which pieces each
// rank writes and reads.
//
// # Layout
//
// A checkpoint is a directory step-NNNNNNNN under the checkpoint root:
//
//	rank-00000.bin ... one file per rank that owns state: its pieces, back to back
//	metadata.json      written last, by rank 0: the checkpoint exists once it does
//
// A piece is a run of one tensor's elements, [Start, Start+Count) of the tensor
// flattened in row-major order, holding every state kind (fp32 main weights, then
// the optimizer's first and second moments) one after the other, each Count
// little-endian float32 values with its own CRC-32C. metadata.json names, per
// tensor, its global shape and every piece with its file, byte offset and
// checksums, plus the step, the optimizer's step count, the recipe and plan
// fingerprints, the resolved recipe, the id of the run that wrote it, and a
// CRC-32C of all of these (the metadata's own checksum).
//
// # Guarantees
//
// Rank files and metadata.json are written through fileio.WriteAtomic (temporary
// name, fsync, rename); metadata.json is renamed into place only after every rank
// file is complete, so a process killed at any moment leaves the previous
// checkpoint whole and this one absent (List reports it incomplete). Reading a
// piece checks its checksum and refuses a changed or truncated file naming the
// file, tensor and byte offset. Open checks that the pieces of every tensor cover
// it exactly once, and the metadata's checksum, so no field a resume acts on
// can change unnoticed. A save never writes into a complete checkpoint
// (ErrCommitted). Prune removes only the checkpoints of the run that asks
// (their run id), never a symbolic link or what it points to.
//
// ckpt imports fileio only.
package ckpt
