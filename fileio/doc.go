// Package fileio reads and writes the files shardline trusts: recipes, texts,
// token shards, tokenizers and weights.
//
// # Reading
//
// Every reader takes regular files only (a device such as /dev/zero, a FIFO or a
// directory is refused before a byte is read) and reads at most a stated limit, so
// no input can make a reader grow without bound.
//
// # Writing
//
// WriteAtomic writes to a temporary name in the same directory, fsyncs, and
// renames over the target: a reader sees the old file or the new one, never half.
//
// # Checksums
//
// Files the trainer writes and later reads end in a trailer carrying a CRC-32C
// of everything before it (Seal, Unseal): a flipped byte or a truncated file is
// refused naming the file and the byte range.
//
// fileio imports no shardline package.
package fileio
