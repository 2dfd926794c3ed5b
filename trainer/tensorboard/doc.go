// Package tensorboard writes TensorBoard event files: the files `tensorboard
// --logdir` reads and `wandb sync` uploads, written here from their published
// formats with the standard library and protowire, without TensorFlow.
//
// # Records
//
// An event file is a sequence of TFRecords, each
//
//	uint64 length (little-endian)
//	uint32 masked CRC-32C of those 8 bytes
//	length bytes of data
//	uint32 masked CRC-32C of the data
//
// where the mask of a CRC c is ((c >> 15) | (c << 17)) + 0xa282ead8
// (tensorflow/core/lib/hash/crc32c.h), every integer little-endian.
//
// # Events
//
// Each record holds one Event message (tensorflow/core/util/event.proto): the
// first says which format the file is (file_version "brain.Event:2"), every
// other holds a Summary of scalars for one step:
//
//	Event          wall_time = 1 (double, seconds since the Unix epoch),
//	               step = 2 (int64), file_version = 3 (string), summary = 5
//	Summary        value = 1 (repeated Summary.Value)
//	Summary.Value  tag = 1 (string), simple_value = 2 (float)
//
// A scalar is a float32 on the wire, as TensorBoard's own writers make it.
// Writer writes each step's event in one write, so that a TensorBoard reading
// the file while it grows sees whole records.
//
// tensorboard imports no shardline package.
package tensorboard
