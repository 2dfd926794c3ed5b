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
// No writer follows a symbolic link: a link where an output goes is refused,
// naming it (ErrLink), and so is a file appended to (OpenAppend) or truncated
// (Create) that has other hard links.
//
// # Output directories
//
// A command that writes a set of files into a directory it was given (an
// export, prepared data) claims it first (ClaimDir): an empty or new directory,
// or one whose manifest (.shardline-outputs.json) says the same command wrote
// it. The manifest lists the files written; what the directory holds besides
// is left alone, and a non-empty directory without the manifest is refused
// unless the user passes --overwrite.
//
// # Checksums
//
// Files the trainer writes and later reads end in a trailer carrying a CRC-32C
// of everything before it (Seal, Unseal): a flipped byte or a truncated file is
// refused naming the file and the byte range.
//
// fileio imports no shardline package.
package fileio
